"""The stack outputs: the contract between the Pulumi program that writes them (infra/components/)
and the controller that reads them (scripts/targets/). Every output name is spelled once, here;
each reader gets a checked, typed record (like SkyPilot's `sky/provision/common.py` records).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra import catalog
from infra.base.errors import GputrainError
from infra.base.records import Fleet, GpuExpectation, Node

if TYPE_CHECKING:
    from infra.spec import ClusterSpec


class Key:
    """The output names, camelCase as `pulumi stack output` shows them."""

    # Every backend (infra/components/cluster.py: shape_exports)
    STACK = "stack"
    PROJECT = "project"
    REGION = "region"
    MACHINE_TYPE = "machineType"
    ACCELERATOR = "accelerator"  # e.g. "nvidia-l4"
    GPUS_PER_NODE = "gpusPerNode"
    SPOT = "spot"
    MAX_RUN_DURATION = "maxRunDuration"  # as the stack file says it, e.g. "6h"
    MAX_RUN_DURATION_S = "maxRunDurationSeconds"  # the VM TTL / the job's timeout
    NODE_COUNT = "nodeCount"
    GPUS_TOTAL = "gpusTotal"
    GPUS_REQUEST = "gpusRequest"  # "" when the stack names its machineType
    HOURLY_PRICE_PER_NODE = "hourlyPricePerNodeUsd"  # one node's VM, as the price table has it
    # the whole cluster as the caps, the budget and the cost record count it (disk_prices:
    # cluster_hourly: the VMs with their disks, Vertex's every pool); null: a price is unknown
    HOURLY_PRICE = "hourlyPriceUsd"
    PRICE_AS_OF = "priceAsOf"
    BUCKET = "bucket"
    BUCKET_PREFIX = "bucketPrefix"
    BUCKET_OWNED = "bucketOwned"  # false: the user's `bucket`, never emptied or deleted
    # GCE (GpuCluster)
    ZONE = "zone"
    GPU_MODEL = "gpuModel"  # as nvidia-smi prints it, e.g. "NVIDIA L4"
    GPU_MEMORY_GB = "gpuMemoryGb"
    SSH_USER = "sshUser"
    IMAGE = "image"  # the pinned boot image self-link
    HEAD_ADDRESS = "headAddress"
    NODES = "nodes"  # a list of NodeKey objects, the head first
    BOOT_DISK_TYPE = "bootDiskType"  # each node's, e.g. "pd-balanced"
    BOOT_DISK_GB = "bootDiskGb"
    LOCAL_SSD_COUNT = "localSsdCount"  # the Local SSDs gputrain adds; 0: none, or bundled
    LOCAL_SSD_GIB = "localSsdGib"  # a node's Local SSD, bundled too; null: bundled, size unknown
    # Vertex AI (VertexStack)
    BACKEND = "backend"  # "vertex"
    SERVICE_ACCOUNT = "serviceAccount"
    REPLICAS = "replicas"
    EXECUTOR_IMAGE = "executorImage"


class NodeKey:
    """The fields of one entry of the `nodes` output."""

    NAME = "name"  # instance name, e.g. "dev-node-0"
    ZONE = "zone"
    INTERNAL_IP = "internalIp"
    EXTERNAL_IP = "externalIp"  # null: reached through the head
    ROLE = "role"  # "head" (exactly one, first) or "worker"
    ID = "id"  # GCE instance id, when known: host-key pins are never reused across ids


class StackOutputError(GputrainError):
    """The outputs do not have the shape this gputrain writes (an older or newer program)."""


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """ "stack output nodes[1].role is 'boss'; expected head or worker" unless ok."""
    if not ok:
        raise StackOutputError(f"stack output {key} is {value!r}; {allowed}")


def _typed(key: str, value: Any, kind: type | tuple[type, ...], allowed: str) -> Any:
    """`value` is a `kind` (a bool is never a number) and not empty."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    is_bool = isinstance(value, bool) and bool not in kinds
    empty = value == "" or (isinstance(value, list | Mapping) and not value)
    _check(isinstance(value, kind) and not is_bool and not empty, key, value, allowed)
    return value


_IN_SYNC = "(is the stack program in sync with this gputrain?)"


@dataclass(frozen=True)
class BucketOutputs:
    """The stack's bucket: its own (created and deleted with the stack) or the user's."""

    name: str
    prefix: str  # "" or "path/" under which the stack writes
    owned: bool

    @property
    def uri(self) -> str:
        return f"gs://{self.name}/{self.prefix}"


@dataclass(frozen=True)
class StackDisks:
    """Each node's disks as `up` made them: what the spending caps price beside the VM
    (infra/disk_prices.py)."""

    boot_disk_type: str
    boot_disk_gb: int
    local_ssd_count: int  # the Local SSDs gputrain adds (localSsdCount); 0: none, or bundled
    local_ssd_gib: int | None  # a node's Local SSD, bundled too; None: bundled, size unknown


@dataclass(frozen=True)
class StackNode:
    name: str
    zone: str
    internal_ip: str
    external_ip: str | None
    role: str
    instance_id: str | None = None


@dataclass(frozen=True)
class StackOutputs:
    """A GCE stack: where it is, its nodes, the shape of every node."""

    project: str
    region: str
    zone: str
    nodes: tuple[StackNode, ...]
    ssh_user: str
    accelerator: str
    gpus_per_node: int
    gpu_model: str
    gpu_memory_gb: float
    max_run_duration_s: int
    hourly_price: float | None
    image_self_link: str | None = None
    bucket: BucketOutputs | None = None
    # None: an `up` by an older gputrain, which did not record them; the stack file's are assumed
    disks: StackDisks | None = None

    @property
    def head(self) -> StackNode:
        return next(n for n in self.nodes if n.role == "head")

    def to_fleet(
        self,
        target: str,
        host_keys: Mapping[str, tuple[str, ...]],
        *,
        identity_file: Path | None,
        python: str = "python3",
    ) -> Fleet:
        """The Fleet to verify and train on; every node must come with pinned host keys, and
        every GPU must have the catalog's memory floor for its accelerator."""
        missing = [n.name for n in self.nodes if not host_keys.get(n.name)]
        if missing:
            raise GputrainError(
                f"no pinned SSH host keys for {', '.join(missing)}: refusing to connect"
            )
        return Fleet(
            target=target,
            nodes=tuple(
                Node(
                    name=n.name,
                    role="head" if n.role == "head" else "worker",
                    internal_address=n.internal_ip,
                    address=n.external_ip,
                    user=self.ssh_user,
                    host_keys=tuple(host_keys[n.name]),
                )
                for n in self.nodes
            ),
            expect=GpuExpectation(
                model=self.gpu_model,
                count=self.gpus_per_node,
                min_memory_mib=catalog.ACCELERATORS[
                    str(catalog.canonical_accelerator(self.accelerator))
                ].min_memory_mib,
            ),
            identity_file=identity_file,
            python=python,
        )


@dataclass(frozen=True)
class VertexOutputs:
    """A Vertex AI stack: where its jobs run, as whom, and the bucket they write to."""

    project: str
    region: str
    bucket: str
    bucket_prefix: str
    service_account: str


def _need(
    outputs: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str = ""
) -> Any:
    names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
    return _typed(where + key, outputs.get(key), kind, f"expected {names} {_IN_SYNC}")


def _whole(outputs: Mapping[str, Any], key: str) -> int:
    value = _need(outputs, key, (int, float))
    _check(float(value) == int(value), key, value, "expected a whole number")
    return int(value)


def parse_bucket(outputs: Mapping[str, Any]) -> BucketOutputs | None:
    """The stack's bucket; None for a stack from before there was one. Pure."""
    if not outputs.get(Key.BUCKET):
        return None
    return BucketOutputs(
        name=str(outputs[Key.BUCKET]),
        prefix=str(outputs.get(Key.BUCKET_PREFIX) or ""),
        owned=bool(outputs.get(Key.BUCKET_OWNED)),
    )


def parse_disks(outputs: Mapping[str, Any]) -> StackDisks | None:
    """Each node's disks; None for a stack whose `up` did not record them (an older gputrain).
    Pure."""
    if Key.BOOT_DISK_TYPE not in outputs:
        return None
    local_gib = outputs.get(Key.LOCAL_SSD_GIB)
    _check(
        local_gib is None or _whole(outputs, Key.LOCAL_SSD_GIB) >= 0,
        Key.LOCAL_SSD_GIB,
        local_gib,
        "expected a whole number of GiB or null",
    )
    return StackDisks(
        boot_disk_type=_need(outputs, Key.BOOT_DISK_TYPE, str),
        boot_disk_gb=_whole(outputs, Key.BOOT_DISK_GB),
        local_ssd_count=_whole(outputs, Key.LOCAL_SSD_COUNT),
        local_ssd_gib=None if local_gib is None else int(local_gib),
    )


def _parse_node(raw: Any, i: int) -> StackNode:
    where = f"{Key.NODES}[{i}]."
    _typed(f"{Key.NODES}[{i}]", raw, Mapping, "expected an object")
    ext = raw.get(NodeKey.EXTERNAL_IP)
    _check(
        ext is None or (isinstance(ext, str) and ext != ""),
        where + NodeKey.EXTERNAL_IP,
        ext,
        "expected a string or null",
    )
    role = _need(raw, NodeKey.ROLE, str, where)
    _check(role in ("head", "worker"), where + NodeKey.ROLE, role, "expected head or worker")
    return StackNode(
        name=_need(raw, NodeKey.NAME, str, where),
        zone=_need(raw, NodeKey.ZONE, str, where),
        internal_ip=_need(raw, NodeKey.INTERNAL_IP, str, where),
        external_ip=ext,
        role=role,
        instance_id=str(raw[NodeKey.ID]) if raw.get(NodeKey.ID) is not None else None,
    )


def parse_stack_outputs(outputs: Mapping[str, Any]) -> StackOutputs:
    """Checked StackOutputs from a GCE stack's raw outputs; StackOutputError if malformed."""
    raw_nodes = _typed(Key.NODES, outputs.get(Key.NODES), list, "expected a non-empty list")
    nodes = [_parse_node(raw, i) for i, raw in enumerate(raw_nodes)]
    if [n.role for n in nodes].count("head") != 1 or nodes[0].role != "head":
        raise StackOutputError("stack output nodes must list exactly one head, first")
    accelerator = _need(outputs, Key.ACCELERATOR, str)
    _check(
        catalog.canonical_accelerator(accelerator) is not None,
        Key.ACCELERATOR,
        accelerator,
        f"expected one of {', '.join(catalog.ACCELERATORS)} {_IN_SYNC}",
    )
    return StackOutputs(
        project=_need(outputs, Key.PROJECT, str),
        region=_need(outputs, Key.REGION, str),
        zone=_need(outputs, Key.ZONE, str),
        nodes=tuple(nodes),
        ssh_user=_need(outputs, Key.SSH_USER, str),
        accelerator=accelerator,
        gpus_per_node=_whole(outputs, Key.GPUS_PER_NODE),
        gpu_model=_need(outputs, Key.GPU_MODEL, str),
        gpu_memory_gb=float(_need(outputs, Key.GPU_MEMORY_GB, (int, float))),
        max_run_duration_s=_whole(outputs, Key.MAX_RUN_DURATION_S),
        # null: the price is unknown
        hourly_price=_need(outputs, Key.HOURLY_PRICE, (int, float, type(None))),
        image_self_link=outputs.get(Key.IMAGE) or None,
        bucket=parse_bucket(outputs),
        disks=parse_disks(outputs),
    )


def parse_vertex_outputs(outputs: Mapping[str, Any]) -> VertexOutputs:
    """Checked VertexOutputs; StackOutputError if the stack is not a Vertex one or is malformed."""
    backend = outputs.get(Key.BACKEND)
    _check(backend == "vertex", Key.BACKEND, backend, f"expected vertex {_IN_SYNC}")
    need = {
        k: _typed(k, outputs.get(k), str, f"expected a string {_IN_SYNC}")
        for k in (Key.PROJECT, Key.REGION, Key.BUCKET, Key.SERVICE_ACCOUNT)
    }
    return VertexOutputs(
        project=need[Key.PROJECT],
        region=need[Key.REGION],
        bucket=need[Key.BUCKET],
        bucket_prefix=str(outputs.get(Key.BUCKET_PREFIX) or ""),
        service_account=need[Key.SERVICE_ACCOUNT],
    )


def drift(spec: ClusterSpec, outputs: Mapping[str, Any]) -> list[str]:
    """Where the stack file (`spec`) no longer describes the cluster `up` made (its outputs): the
    nodes, machine type, GPUs per node, Spot or not, maxRunDuration, each node's disks, as "WHAT:
    X up, Y in the file"; [] when they agree. An output an older program did not write is not
    compared (the file's value is assumed). Pure."""
    from infra.keys import format_duration

    def mode(spot: bool) -> str:
        return "spot" if spot else "not spot"

    ttl = outputs.get(Key.MAX_RUN_DURATION_S)
    spot = outputs.get(Key.SPOT)
    pairs = [
        ("nodes", outputs.get(Key.NODE_COUNT, len(outputs.get(Key.NODES) or [])), spec.nodes),
        ("machineType", outputs.get(Key.MACHINE_TYPE), spec.machine_type),
        ("GPUs per node", outputs.get(Key.GPUS_PER_NODE), spec.gpus_per_node),
        ("capacity", None if spot is None else mode(bool(spot)), mode(spec.spot)),
        (
            "maxRunDuration",
            format_duration(int(ttl)) if isinstance(ttl, int | float) else None,
            spec.max_run_duration,
        ),
    ]
    disks = parse_disks(outputs)
    if disks is not None:
        pairs += [
            ("bootDiskType", disks.boot_disk_type, spec.boot_disk_type),
            ("bootDiskGb", disks.boot_disk_gb, spec.boot_disk_gb),
            ("localSsdCount", disks.local_ssd_count, spec.scratch.declared_disks),
        ]
    return [
        f"{what}: {up} up, {declared} in the file"
        for what, up, declared in pairs
        if up is not None and up != declared
    ]
