"""Pulumi program: stack config -> validated ClusterSpec -> GpuCluster -> stack outputs."""

import pulumi

from infra.components.cluster import GpuCluster
from infra.spec import parse_spec, require_deployable
from infra.stackfile import stack_config_from_pulumi

spec = parse_spec(stack_config_from_pulumi(), pulumi.get_stack())
require_deployable(spec)
cluster = GpuCluster(spec.stack, spec)
for key, value in cluster.exports().items():
    pulumi.export(key, value)
