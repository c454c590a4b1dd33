"""GPU fabric plans: the extra VPCs, subnets and NICs that give multi-node jobs full bandwidth.

Pure: `plan_fabric` turns a machine type, a node count, `gpuDirect` and one IPv4 range into
frozen records the Pulumi component turns into resources, the preflight counts and
`verify --fabric` checks on the nodes. No I/O, no Pulumi.

Facts (shared/reference/gpudirect-and-capacity.md, checked against Google's docs and Cluster
Toolkit's a3ultra-vm / a4high-vm / a3mega blueprints and gpu-rdma-vpc / multivpc modules):
- A3 Ultra, A4: GPUDirect RDMA. nic0 + nic1 gVNIC in two VPCs, nic2-9 MRDMA in ONE VPC with the
  zonal network profile `<zone>-vpc-roce` and 8 subnets; MTU 8896; no firewall rules on the
  RoCE VPC (the profile refuses them).
- A3 Mega: GPUDirect-TCPXO. 1 + 8 gVNIC, each in its own VPC with one subnet, MTU 8244.
- A3 High 8g / Edge: GPUDirect-TCPX needs Container-Optimized OS or a private-PPA kernel that
  our Deep Learning VM nodes do not have: one NIC, and the plan says what that costs.
- Subnet ranges of one VM's NICs must not overlap (every anchor keeps them disjoint).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from infra import catalog
from infra.keys import choice
from infra.schema import SpecError, StackSettings

GpuDirect = Literal["auto", "off"]
GPU_DIRECT_CHOICES: tuple[GpuDirect, ...] = ("auto", "off")
FabricKind = Literal["none", "rdma", "tcpxo"]

#: The one range every subnet of a stack is carved from; its first /20 is today's primary
#: subnet (10.42.0.0/20), so stacks without a fabric keep exactly the network they had.
DEFAULT_SUBNET_RANGE = "10.42.0.0/16"
LARGEST_SUBNET_PREFIX = 20  # no subnet is carved bigger than a /20
SMALLEST_SUBNET_PREFIX = 29  # the smallest IPv4 subnet GCE accepts
GCE_RESERVED_ADDRESSES = 4  # network, gateway, second-to-last and broadcast
#: Ranges a VPC subnet may not use (VPC docs, "prohibited IPv4 subnet ranges").
PROHIBITED_RANGES = ("0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4")

RDMA_MTU = 8896
TCPXO_MTU = 8244
RDMA_NICS = 8  # MRDMA NICs (ConnectX-7) per A3 Ultra / A4 VM
TCPXO_GPU_NICS = 8  # GPU gVNICs per A3 Mega VM
FIREWALL_PROTOCOLS = ("tcp", "udp", "icmp")  # between the cluster's own addresses only

_RDMA_TYPES = frozenset({"a3-ultragpu-8g", "a4-highgpu-8g"})
_TCPXO_TYPES = frozenset({"a3-megagpu-8g"})
_TCPX_TYPES = frozenset({"a3-highgpu-8g", "a3-edgegpu-8g"})


class FabricError(ValueError):
    """One line naming the setting, the bad value and what is allowed."""


@dataclass(frozen=True)
class Fabric:
    """One GPUDirect stack: what it is, its bandwidth, and the published 2-node bus bandwidth
    the verify floor starts from (half of it; GB/s, NCCL busbw)."""

    kind: FabricKind
    technology: str
    gpu_gbps: int  # GPU-to-GPU network bandwidth per VM
    published_busbw_gbs: float
    published_source: str
    nccl_plugin: str  # the network name NCCL logs: "Using network <name>"
    collective: str = "all_gather"  # what the published figure measured; verify measures it too
    published_bytes: int = 8 * 2**30  # at this size (nccl-tests' 8 GB): the probe goes as far

    @property
    def busbw_floor_gbs(self) -> float:
        return self.published_busbw_gbs / 2


FABRICS: dict[str, Fabric] = {
    "a3-megagpu-8g": Fabric(
        "tcpxo",
        "GPUDirect-TCPXO",
        1600,
        188.0,
        "2-node all_gather at 8 GB, Cluster Toolkit examples/gke-a3-megagpu README",
        "FasTrak",
    ),
    "a3-ultragpu-8g": Fabric(
        "rdma",
        "GPUDirect RDMA (gIB over RoCE)",
        3200,
        325.0,
        "2-node all_gather at 8 GB, Cluster Toolkit dws-flex-start README",
        "gIB",
    ),
    "a4-highgpu-8g": Fabric(
        "rdma",
        "GPUDirect RDMA (gIB over RoCE)",
        3200,
        683.0,
        "2-node all_reduce at 8 GB, dstack docs gcp.md",
        "gIB",
        "all_reduce",
    ),
}


@dataclass(frozen=True)
class Subnet:
    """One subnet; its resource name is `<stack>-<suffix>`."""

    suffix: str
    cidr: str


@dataclass(frozen=True)
class FabricNetwork:
    """One extra VPC: resource name `<stack>-<suffix>`, its subnets in the stack's region."""

    suffix: str
    purpose: str
    mtu: int
    nic_type: str  # GVNIC | MRDMA: what the VMs' NICs on it are
    subnets: tuple[Subnet, ...]
    network_profile: str | None = None  # projects/P/global/networkProfiles/<zone>-vpc-roce
    firewall_source_ranges: tuple[str, ...] = ()  # empty: no firewall rule at all

    @property
    def firewall(self) -> bool:
        return bool(self.firewall_source_ranges)


@dataclass(frozen=True)
class Nic:
    """One network interface of every VM, in API order (nic0 first)."""

    index: int
    network: str  # "primary" or a FabricNetwork suffix
    subnet: str  # "primary" or a Subnet suffix
    nic_type: str | None  # GVNIC | MRDMA; None: the provider's default (VIRTIO_NET)
    external_ip: bool  # may carry an access config: nic0 only


@dataclass(frozen=True)
class FabricExpectation:
    """What `verify --fabric` must find on every node."""

    nics: int
    mtu: int | None  # on every NIC (the primary only when the stack owns its VPC)
    check_primary_mtu: bool
    rdma_devices: int  # `ibv_devices` entries (0: not checked)
    rxdm: bool  # the TCPXO receive-datapath-manager must report ready
    nccl_network: str | None  # "Using network <name>" in the NCCL log
    busbw_floor_gbs: float | None  # on GPUs only
    collective: str = "all_reduce"  # the probe's collective (the published figure's)
    probe_bytes: int = 2**30  # the probe's largest size on GPU


@dataclass(frozen=True)
class FabricPlan:
    """Everything the component, the preflight and `verify --fabric` need about the fabric."""

    kind: FabricKind
    machine_type: str
    nodes: int
    subnet_range: str
    primary_cidr: str
    primary_mtu: int | None  # set on the stack's own primary VPC; None: provider default
    own_primary: bool  # False: the user's `network` is the primary VPC
    networks: tuple[FabricNetwork, ...]
    nics: tuple[Nic, ...]
    note: str  # what `plan` prints about the fabric ("" when there is nothing to say)

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    @property
    def networks_needed(self) -> int:
        """VPCs the stack creates (NETWORKS quota): 3 for RDMA, 9 for TCPXO, 1 or 0 without."""
        return len(self.networks) + (1 if self.own_primary else 0)

    @property
    def subnetworks_needed(self) -> int:
        return sum(len(n.subnets) for n in self.networks) + (1 if self.own_primary else 0)

    @property
    def network_profile(self) -> str | None:
        return next((n.network_profile for n in self.networks if n.network_profile), None)

    def expectation(self) -> FabricExpectation:
        fabric = FABRICS.get(self.machine_type) if self.enabled else None
        mtu = self.networks[0].mtu if self.networks else None
        return FabricExpectation(
            nics=len(self.nics),
            mtu=mtu,
            check_primary_mtu=self.own_primary and mtu is not None,
            rdma_devices=RDMA_NICS if self.kind == "rdma" else 0,
            rxdm=self.kind == "tcpxo",
            nccl_network=fabric.nccl_plugin if fabric else None,
            busbw_floor_gbs=fabric.busbw_floor_gbs if fabric else None,
            collective=fabric.collective if fabric else "all_reduce",
            probe_bytes=fabric.published_bytes if fabric else 2**30,
        )


def roce_profile_name(zone: str) -> str:
    """The zonal RDMA network profile A3 Ultra / A4 RoCE VPCs use (not `-vpc-falcon`: H4D)."""
    return f"{zone}-vpc-roce"


def roce_profile_path(project: str, zone: str) -> str:
    return f"projects/{project}/global/networkProfiles/{roce_profile_name(zone)}"


def fabric_kind(machine_type: str, nodes: int, gpu_direct: GpuDirect = "auto") -> FabricKind:
    """The fabric a stack gets: only for 2+ nodes of A3 Mega, A3 Ultra or A4, unless off."""
    if gpu_direct == "off" or nodes < 2:
        return "none"
    if machine_type in _RDMA_TYPES:
        return "rdma"
    if machine_type in _TCPXO_TYPES:
        return "tcpxo"
    return "none"


def _err(key: str, value: str, why: str) -> FabricError:
    return FabricError(f"gputrain:{key} = {value!r}: {why}")


def carve_subnets(
    subnet_range: str, count: int, nodes: int, avoid: Mapping[str, str] | None = None
) -> list[str]:
    """`count` disjoint, equal subnets from the start of `subnet_range`, each no bigger than a
    /20 and with room for `nodes` VMs; FabricError (naming subnetRange) when it cannot be."""
    try:
        net = ipaddress.ip_network(subnet_range.strip(), strict=True)
    except ValueError:
        raise _err("subnetRange", subnet_range, "allowed: an IPv4 CIDR like 10.42.0.0/16") from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise _err("subnetRange", subnet_range, "allowed: an IPv4 CIDR (GPU NICs are IPv4)")
    for bad in PROHIBITED_RANGES:
        if net.overlaps(ipaddress.IPv4Network(bad)):
            raise _err(
                "subnetRange", subnet_range, f"overlaps {bad}, which VPC subnets may not use"
            )
    for cidr, what in (avoid or {}).items():
        if net.overlaps(ipaddress.ip_network(cidr, strict=False)):
            raise _err("subnetRange", subnet_range, f"overlaps {cidr} ({what}); pick a free range")
    split_bits = math.ceil(math.log2(count)) if count > 1 else 0
    prefix = max(net.prefixlen + split_bits, LARGEST_SUBNET_PREFIX)
    host_bits = max(
        32 - SMALLEST_SUBNET_PREFIX, math.ceil(math.log2(nodes + GCE_RESERVED_ADDRESSES))
    )
    if prefix > 32 - host_bits:
        needed = 32 - host_bits - split_bits
        raise _err(
            "subnetRange",
            subnet_range,
            f"too small for the {count} subnet(s) this stack needs with room for {nodes} "
            f"node(s) each; use a /{needed} or larger",
        )
    subnets = net.subnets(new_prefix=prefix)
    return [str(next(subnets)) for _ in range(count)]


def plan_fabric(
    machine_type: str,
    nodes: int,
    *,
    zone: str,
    project: str | None = None,
    gpu_direct: str = "auto",
    subnet_range: str = DEFAULT_SUBNET_RANGE,
    own_primary: bool = True,
    avoid: Mapping[str, str] | None = None,
) -> FabricPlan:
    """The fabric of a stack. `own_primary` is False when the user's `network` is the primary
    VPC; `avoid` maps CIDRs already in use (that network's subnets) to what uses them."""
    mt = catalog.machine_type(machine_type)
    if mt is None:
        raise _err("machineType", machine_type, "not a known machine type")
    if gpu_direct not in GPU_DIRECT_CHOICES:
        raise _err("gpuDirect", gpu_direct, f"allowed: {', '.join(GPU_DIRECT_CHOICES)}")
    kind = fabric_kind(machine_type, nodes, "off" if gpu_direct == "off" else "auto")
    mtu = {"rdma": RDMA_MTU, "tcpxo": TCPXO_MTU}.get(kind)
    networks: tuple[FabricNetwork, ...] = ()
    if kind == "rdma":
        primary, gvnic, *roce = carve_subnets(subnet_range, 2 + RDMA_NICS, nodes, avoid)
        networks = (
            FabricNetwork(
                "gvnic-1",
                "second gVNIC (nic1)",
                RDMA_MTU,
                "GVNIC",
                (Subnet("gvnic-1-subnet", gvnic),),
                firewall_source_ranges=(gvnic,),
            ),
            FabricNetwork(
                "roce",
                f"GPUDirect RDMA, {RDMA_NICS} MRDMA NICs (nic2-{RDMA_NICS + 1})",
                RDMA_MTU,
                "MRDMA",
                tuple(Subnet(f"roce-{i}", cidr) for i, cidr in enumerate(roce)),
                network_profile=roce_profile_path(project or "PROJECT", zone),
            ),
        )
    elif kind == "tcpxo":
        primary, *gpu = carve_subnets(subnet_range, 1 + TCPXO_GPU_NICS, nodes, avoid)
        networks = tuple(
            FabricNetwork(
                f"gpu-{i}",
                f"GPUDirect-TCPXO GPU NIC {i} (nic{i + 1})",
                TCPXO_MTU,
                "GVNIC",
                (Subnet(f"gpu-{i}-subnet", cidr),),
                firewall_source_ranges=(cidr,),
            )
            for i, cidr in enumerate(gpu)
        )
    else:
        (primary,) = carve_subnets(subnet_range, 1, nodes, avoid)
    nics = [Nic(0, "primary", "primary", "GVNIC" if mt.gvnic else None, external_ip=True)]
    for net in networks:
        for sub in net.subnets:
            nics.append(Nic(len(nics), net.suffix, sub.suffix, net.nic_type, external_ip=False))
    return FabricPlan(
        kind=kind,
        machine_type=machine_type,
        nodes=nodes,
        subnet_range=subnet_range.strip(),
        primary_cidr=primary,
        primary_mtu=mtu if own_primary else None,
        own_primary=own_primary,
        networks=networks,
        nics=tuple(nics),
        note=fabric_note(machine_type, nodes, kind, gpu_direct),
    )


def fabric_note(machine_type: str, nodes: int, kind: FabricKind, gpu_direct: str) -> str:
    """What `plan` says about the fabric: what gputrain sets up, or what going without costs."""
    fabric = FABRICS.get(machine_type)
    if kind == "rdma" and fabric:
        return (
            f"{fabric.technology}: per VM 2 gVNIC + {RDMA_NICS} MRDMA NICs, {fabric.gpu_gbps:,} "
            f"Gbps GPU-to-GPU; 3 VPCs at MTU {RDMA_MTU} (primary, gvnic-1, roce on the zone's "
            "vpc-roce profile with 8 subnets and no firewall rules); nodes get Google's NCCL gIB "
            "plugin"
        )
    if kind == "tcpxo" and fabric:
        return (
            f"{fabric.technology}: per VM 1 + {TCPXO_GPU_NICS} gVNIC, {fabric.gpu_gbps:,} Gbps "
            f"GPU-to-GPU; 9 VPCs at MTU {TCPXO_MTU}, each firewalled to its own subnet; nodes "
            "get the dmabuf import helper, the receive-datapath-manager and the FasTrak NCCL "
            "plugin"
        )
    if nodes < 2:
        return ""
    if machine_type in _TCPX_TYPES:
        return (
            f"{machine_type}: GPUDirect-TCPX needs Container-Optimized OS or a private-PPA "
            "kernel, which Deep Learning VM nodes do not have; all inter-node NCCL traffic uses "
            "the one 200 Gbps gVNIC (~20 GB/s all-reduce bus bandwidth; ~66 GB/s with TCPX). "
            "For multi-node H100 pick a3-megagpu-8g (GPUDirect-TCPXO, 1,800 Gbps); "
            "a3-ultragpu-8g (H200) and a4-highgpu-8g (B200) get 3,200 Gbps RDMA"
        )
    if fabric and gpu_direct == "off":
        return (
            f"gpuDirect off: inter-node NCCL traffic uses the primary gVNIC only (up to 200 "
            f"Gbps) instead of {fabric.technology} ({fabric.gpu_gbps:,} Gbps)"
        )
    return ""


def read_fabric(
    cfg: StackSettings,
    mt: catalog.MachineType,
    nodes: int,
    *,
    zone: str,
    project: str | None,
    existing_network: str | None,
) -> FabricPlan:
    """`gpuDirect` and `subnetRange` -> the stack's fabric plan (its ranges checked here)."""
    gpu_direct = choice("gpuDirect", cfg.gpuDirect, GPU_DIRECT_CHOICES)
    try:
        return plan_fabric(
            mt.name,
            nodes,
            zone=zone,
            project=project,
            gpu_direct=gpu_direct,
            subnet_range=cfg.subnetRange,
            own_primary=existing_network is None,
        )
    except FabricError as exc:
        raise SpecError(str(exc)) from None
