"""GpuCluster: a validated ClusterSpec as GCE resources — network, identity and nodes — and the
stack outputs the controller reads.

Everything comes from the ClusterSpec (infra/spec.py is the only reader of stack config); nothing
here reads files or generates keys, so `pulumi up` is repeatable.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import pulumi

from infra.autodown import instance_condition
from infra.components import cluster_labels
from infra.components.bucket import StackBucket, StackBucketArgs
from infra.components.budget_guard import BudgetGuard
from infra.components.fabric import GpuFabric, GpuFabricArgs
from infra.components.identity import NODE_ROLES, NodeIdentity, NodeIdentityArgs
from infra.components.network import SUBNET_CIDR, ClusterNetwork, ClusterNetworkArgs
from infra.components.nodes import GpuNodes, GpuNodesArgs, resolve_image
from infra.components.reconciler import (
    ReconcileSource,
    StackReconciler,
    StackReconcilerArgs,
)
from infra.components.registry import ImageRegistry
from infra.datasets import data_buckets
from infra.disk_prices import cluster_hourly
from infra.offers import price_table
from infra.outputs import Key, NodeKey
from infra.reconciler import wanted
from infra.scratch import startup_script
from infra.spec import ClusterSpec
from infra.stackfile import SpecError, service_account_id
from infra.ttl import Recreation

COMPONENT_TYPE = "gputrain:infra:GpuCluster"


def stack_identity(
    spec: ClusterSpec,
    display_name: str,
    opts: pulumi.ResourceOptions,
    roles: tuple[str, ...] = NODE_ROLES,
    delete_vms_condition: str | None = None,
) -> NodeIdentity:
    """The stack's service account (`gputrain-<stack>`) with its project roles."""
    return NodeIdentity(
        f"{spec.stack}-identity",
        NodeIdentityArgs(
            account_id=service_account_id(spec.stack),
            project=spec.project,
            display_name=display_name,
            roles=roles,
            delete_vms_condition=delete_vms_condition,
        ),
        opts,
    )


def stack_bucket(
    spec: ClusterSpec, identity: NodeIdentity, opts: pulumi.ResourceOptions
) -> StackBucket:
    """The stack's run bucket (its own, or the user's), usable by `identity` and no one else."""
    assert spec.bucket_name is not None  # gcp:project is set: require_deployable ran
    return StackBucket(
        f"{spec.stack}-bucket",
        StackBucketArgs(
            name=spec.bucket_name,
            project=spec.project,
            location=spec.region,
            member=identity.email.apply(lambda email: f"serviceAccount:{email}"),
            existing=spec.existing_bucket is not None,
            retention_days=spec.bucket_retention_days,
            labels=cluster_labels(spec, pulumi.get_project()),
            data_buckets=tuple(b for b in data_buckets(spec.datasets) if b != spec.bucket_name),
        ),
        opts,
    )


class GpuCluster(pulumi.ComponentResource):
    """Network and firewalls, a service account, the run bucket, optional compact placement, one
    VM per node."""

    def __init__(
        self,
        name: str,
        spec: ClusterSpec,
        opts: pulumi.ResourceOptions | None = None,
        *,
        registry: ImageRegistry | None = None,  # `build`: the nodes pull the stack's image
        reconcile: ReconcileSource | None = None,  # the reconcile job's image and stack file
        recreation: Recreation | None = None,  # a recovery's `up`: the run's TTL left, its image
    ) -> None:
        # The image is an invoke that can fail on the user's input: before any resource exists.
        # A recovery keeps the image the cluster runs: the provider replaces a VM whose image
        # changes, so the family's newer one would replace every survivor.
        recorded = recreation.image if recreation is not None else None
        image_self_link = recorded or resolve_image(spec)
        if spec.bucket_name is None:
            raise SpecError("gcp:project is not set: it names the stack's bucket")
        super().__init__(COMPONENT_TYPE, name, None, opts)
        self.spec = spec
        self.image_self_link = image_self_link
        child = pulumi.ResourceOptions(parent=self)
        tag = f"gputrain-{spec.stack}"
        fabric = spec.fabric
        self.network = ClusterNetwork(
            f"{spec.stack}-network",
            ClusterNetworkArgs(
                stack=spec.stack,
                project=spec.project,
                region=spec.region,
                tag=tag,
                ssh_source_ranges=spec.ssh_source_ranges,
                existing_network=spec.network,
                subnet_cidr=fabric.primary_cidr if fabric else SUBNET_CIDR,
                mtu=fabric.primary_mtu if fabric else None,
            ),
            child,
        )
        self.fabric: GpuFabric | None = None
        if fabric is not None and fabric.enabled:
            self.fabric = GpuFabric(
                f"{spec.stack}-fabric",
                GpuFabricArgs(spec.stack, spec.project, spec.region, tag, fabric),
                child,
            )
        # No artifactregistry.reader: the TCPXO images and apt repository live in Google's own
        # gce-ai-infra project (gIB comes from packages.cloud.google.com), where a role on the
        # user's project grants nothing.
        roles = NODE_ROLES
        autodown = (
            instance_condition(str(spec.project), spec.stack)
            if spec.autodown_s is not None
            else None
        )
        self.identity = stack_identity(
            spec, f"gputrain nodes of stack {spec.stack}", child, roles, autodown
        )
        labels = cluster_labels(spec, pulumi.get_project())
        self.bucket = stack_bucket(spec, self.identity, child)
        self.registry_reader = (
            registry.grant_reader(self.identity.member, child)
            if registry is not None and spec.build
            else None
        )
        # Cloud Build (`build:` without a local docker) runs as this account and pushes
        self.registry_builder = (
            registry.grant_writer(self.identity.member, child) if registry is not None else None
        )
        self.nodes = GpuNodes(
            f"{spec.stack}-nodes",
            GpuNodesArgs(
                names=spec.node_names,
                project=spec.project,
                region=spec.region,
                zone=spec.zone,
                machine_type=spec.machine_type,
                accelerator=spec.accelerator,
                gpus_per_node=spec.gpus_per_node,
                attach_gpus=spec.attach_gpus,
                gvnic=spec.gvnic,
                capacity=spec.instance_capacity,
                image=image_self_link,
                boot_disk_gb=spec.boot_disk_gb,
                boot_disk_type=spec.boot_disk_type,
                ssh_user=spec.ssh_user,
                ssh_public_key=spec.ssh_public_key,
                public_ip=spec.public_ip,
                compact_placement=spec.placement == "compact",
                automatic_restart=spec.automatic_restart,
                placement_name=f"{spec.stack}-compact",
                labels=labels,
                tag=tag,
                network=self.network.network_ref,
                subnetwork=self.network.subnetwork_ref,
                service_account_email=self.identity.email,
                fabric_nics=self.fabric.nics if self.fabric else (),
                local_ssd_disks=spec.scratch.declared_disks,
                startup_script=startup_script() if spec.scratch.present else None,
                after=(
                    *(self.fabric.resources if self.fabric else ()),
                    self.network.internal_firewall,
                    self.network.ssh_firewall,
                    *self.identity.role_bindings,
                    self.bucket.node_access,
                    *([self.registry_reader] if self.registry_reader is not None else []),
                ),
                recreation=recreation,
            ),
            child,
        )
        self.instances = self.nodes.instances
        self.budget_guard = (
            BudgetGuard(
                spec.stack, str(spec.project), spec.billing_budget, self.identity.member, child
            )
            if spec.billing_budget is not None
            else None
        )
        self.reconciler = self._reconciler(
            spec, tag, fabric.primary_cidr if fabric else SUBNET_CIDR, reconcile, registry
        )
        self._exports = self._build_exports()
        self.register_outputs(self._exports)

    def _reconciler(
        self,
        spec: ClusterSpec,
        tag: str,
        cidr: str,
        source: ReconcileSource | None,
        registry: ImageRegistry | None,
    ) -> StackReconciler | None:
        """Laptop-closed recovery (infra/reconciler.py): only where the stack asks for it."""
        if not wanted(spec.recover, spec.capacity, spec.job_reach):
            return None
        if spec.network:
            raise SpecError(
                f"gputrain:recover {spec.recover!r} with gputrain:network {spec.network!r}: the "
                "reconcile job needs the stack's own subnet for its VPC egress; allowed: "
                "recover: never with an existing network"
            )
        assert spec.project is not None and self.bucket is not None
        if source is None:
            raise SpecError(
                f"gputrain:recover {spec.recover!r}: the reconcile job's image and stack file "
                "were not given to the program (infra/components/reconciler.py program_source)"
            )
        reach = spec.job_reach
        return StackReconciler(
            f"{spec.stack}-reconciler",
            StackReconcilerArgs(
                stack=spec.stack,
                project=spec.project,
                region=spec.region,
                image=source.image,
                every_s=spec.reconcile_every_s,
                network=self.network.network_ref,
                subnetwork=self.network.subnetwork_ref,
                subnet_cidr=cidr,
                tag=tag,
                bucket=self.bucket.name,
                node_account_id=self.identity.account.name,
                instance_condition=instance_condition(str(spec.project), spec.stack),
                labels=cluster_labels(spec, pulumi.get_project()),
                environment=source.environment(reach),
                state_bucket=reach.state_bucket if reach else None,
                kms_key=reach.kms_key if reach else None,
                repository=registry.repository.repository_id if registry else None,
                secret_access=spec.secret_access,
            ),
            pulumi.ResourceOptions(parent=self, depends_on=self.instances),
        )

    def exports(self) -> dict[str, Any]:
        """The stack outputs the controller reads (never the private key): infra/outputs.py."""
        return dict(self._exports)

    def _build_exports(self) -> dict[str, Any]:
        spec = self.spec
        nodes = [
            pulumi.Output.all(vm.name, vm.zone, vm.network_interfaces).apply(
                functools.partial(_node_export, index=i)
            )
            for i, vm in enumerate(self.instances)
        ]
        head = nodes[0].apply(lambda n: n[NodeKey.EXTERNAL_IP] or n[NodeKey.INTERNAL_IP])
        return {
            **shape_exports(spec, self.bucket),
            Key.ZONE: spec.zone,
            Key.GPU_MODEL: spec.gpu_model,
            Key.GPU_MEMORY_GB: spec.gpu_memory_gb,
            Key.SSH_USER: spec.ssh_user,
            Key.IMAGE: self.image_self_link,
            # what the spending caps price beside the VMs: `train` refuses a file edited since
            Key.BOOT_DISK_TYPE: spec.boot_disk_type,
            Key.BOOT_DISK_GB: spec.boot_disk_gb,
            Key.LOCAL_SSD_COUNT: spec.scratch.declared_disks,
            Key.LOCAL_SSD_GIB: spec.scratch.node_gib,
            Key.HEAD_ADDRESS: head,
            Key.NODES: pulumi.Output.all(*nodes),
        }


def shape_exports(spec: ClusterSpec, bucket: StackBucket) -> dict[str, Any]:
    """The outputs every backend exports: where, what shape, its price and TTL, the bucket."""
    return {
        Key.STACK: spec.stack,
        Key.PROJECT: spec.project,
        Key.REGION: spec.region,
        Key.MACHINE_TYPE: spec.machine_type,
        Key.ACCELERATOR: spec.accelerator,
        Key.GPUS_PER_NODE: spec.gpus_per_node,
        Key.SPOT: spec.spot,
        Key.MAX_RUN_DURATION: spec.max_run_duration,
        Key.MAX_RUN_DURATION_S: spec.max_run_duration_s,
        Key.NODE_COUNT: spec.nodes,
        Key.GPUS_TOTAL: spec.gpus_per_node * spec.nodes,
        Key.GPUS_REQUEST: spec.gpus_request,  # "" when the stack names its machineType
        Key.HOURLY_PRICE_PER_NODE: _rounded(spec.hourly_price_per_node),
        Key.HOURLY_PRICE: _rounded(cluster_hourly(spec)),  # the run's rate: VMs and disks
        Key.PRICE_AS_OF: price_table().date,
        Key.BUCKET: bucket.name,
        Key.BUCKET_PREFIX: spec.bucket_prefix,
        Key.BUCKET_OWNED: spec.existing_bucket is None,
    }


def _node_export(values: list[Any], index: int) -> dict[str, Any]:
    """One node as the controller sees it; interfaces arrive as dicts or typed classes."""
    name, zone, interfaces = values
    nic = interfaces[0] if interfaces else {}
    internal = _field(nic, "network_ip")
    configs = _field(nic, "access_configs") or []
    external = _field(configs[0], "nat_ip") if configs else None
    return {
        NodeKey.NAME: name,
        NodeKey.ZONE: zone,
        NodeKey.INTERNAL_IP: internal,
        NodeKey.EXTERNAL_IP: external or None,
        NodeKey.ROLE: "head" if index == 0 else "worker",
    }


def _field(obj: Any, snake: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(snake)
    return getattr(obj, snake, None)


def _rounded(per_node: float | None, nodes: int = 1) -> float | None:
    """USD per hour to 4 places; None (exported as null) when the price is unknown, never 0."""
    return None if per_node is None else round(per_node * nodes, 4)
