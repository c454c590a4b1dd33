"""The Pulumi components of a cluster: `ClusterNetwork`, `NodeIdentity`, `StackBucket` and
`GpuNodes`, composed by `GpuCluster`. Each takes a narrow frozen args dataclass and parents its
resources to itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi

from infra.stackfile import PROJECT_LABEL, STACK_LABEL

if TYPE_CHECKING:
    from infra.spec import ClusterSpec


def cluster_labels(spec: ClusterSpec, pulumi_project: str) -> dict[str, str]:
    """Labels for every labelable resource: ours (for sweeps and billing) + the user's."""
    return {STACK_LABEL: spec.stack, PROJECT_LABEL: pulumi_project, **spec.labels}


def child_options(
    component: pulumi.ComponentResource,
    opts: pulumi.ResourceOptions | None,
    *,
    depends_on: list[pulumi.Resource] | None = None,
    custom_timeouts: pulumi.CustomTimeouts | None = None,
) -> pulumi.ResourceOptions:
    """Options for a component's own resources. They were once children of the enclosing
    component directly, so an alias keeps their URNs: stacks created before the split update
    in place instead of replacing their VMs."""
    aliases = [pulumi.Alias(parent=opts.parent)] if opts is not None and opts.parent else None
    return pulumi.ResourceOptions(
        parent=component, aliases=aliases, depends_on=depends_on, custom_timeouts=custom_timeouts
    )
