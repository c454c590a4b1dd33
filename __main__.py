"""Pulumi program: stack config -> validated ClusterSpec -> its backend's resources -> stack outputs:
GPU VMs on Compute Engine (GpuCluster), or what Vertex AI jobs need (VertexStack)."""

import os
from pathlib import Path

import pulumi

from infra.spec import parse_spec, require_deployable
from infra.stackfile import stack_config_from_pulumi, stack_file_keys
from infra.ttl import Recreation

stack = pulumi.get_stack()  # what the stack file sets, as `plan` reads it (autodown: 10m)
spec = parse_spec(stack_config_from_pulumi(), stack, given=stack_file_keys(Path.cwd(), stack))
require_deployable(spec)
recreation = Recreation.from_env(os.environ)  # a recovery's `up`: deadline, zone, image
reconcile = None
if not spec.on_vertex:  # laptop-closed recovery: its job's image and stack file
    from infra.components.reconciler import program_source

    spec, reconcile = program_source(spec, Path.cwd(), os.environ)
registry = None
if spec.build or reconcile:  # a top-level component: `up` creates it alone first, to push to
    from infra.components.registry import stack_registry

    registry = stack_registry(spec)
if spec.on_vertex:
    from infra.components.vertex import VertexStack

    cluster = VertexStack(spec.stack, spec, registry=registry)
else:
    from infra.components.cluster import GpuCluster

    cluster = GpuCluster(
        spec.stack, spec, registry=registry, reconcile=reconcile, recreation=recreation
    )
for key, value in cluster.exports().items():
    pulumi.export(key, value)
