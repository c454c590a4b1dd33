"""Pulumi program: stack config -> validated ClusterSpec -> its backend's resources -> stack outputs:
GPU VMs on Compute Engine (GpuCluster), or what Vertex AI jobs need (VertexStack)."""

import pulumi

from infra.spec import parse_spec, require_deployable
from infra.stackfile import stack_config_from_pulumi

spec = parse_spec(stack_config_from_pulumi(), pulumi.get_stack())
require_deployable(spec)
if spec.on_vertex:
    from infra.components.vertex import VertexStack

    cluster = VertexStack(spec.stack, spec)
else:
    from infra.components.cluster import GpuCluster

    cluster = GpuCluster(spec.stack, spec)
for key, value in cluster.exports().items():
    pulumi.export(key, value)
