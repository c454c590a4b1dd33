"""Fabric plans per series: VPCs, subnets, NIC order and types, MTUs, disjoint ranges, errors."""

from __future__ import annotations

import ipaddress
import itertools

import pytest

from infra import catalog, fabric
from infra.fabric import FabricError, carve_subnets, plan_fabric

ZONE = "us-central1-b"


def all_cidrs(plan: fabric.FabricPlan) -> list[str]:
    return [plan.primary_cidr] + [s.cidr for n in plan.networks for s in n.subnets]


def assert_disjoint(cidrs: list[str], within: str) -> None:
    nets = [ipaddress.ip_network(c) for c in cidrs]
    outer = ipaddress.ip_network(within)
    assert all(n.subnet_of(outer) for n in nets)  # type: ignore[arg-type]
    for a, b in itertools.combinations(nets, 2):
        assert not a.overlaps(b), (a, b)


@pytest.mark.parametrize("machine_type", ["a4-highgpu-8g", "a3-ultragpu-8g"])
def test_rdma_plan_three_vpcs_roce_profile_eight_subnets_no_firewall(machine_type: str) -> None:
    plan = plan_fabric(machine_type, 2, zone=ZONE, project="proj-1234")
    assert plan.kind == "rdma" and plan.enabled
    assert plan.networks_needed == 3 and plan.subnetworks_needed == 10
    gvnic, roce = plan.networks
    assert (gvnic.suffix, gvnic.nic_type, gvnic.mtu, len(gvnic.subnets)) == (
        "gvnic-1",
        "GVNIC",
        8896,
        1,
    )
    assert (
        gvnic.firewall_source_ranges == (gvnic.subnets[0].cidr,) and gvnic.network_profile is None
    )
    assert (roce.suffix, roce.nic_type, roce.mtu, len(roce.subnets)) == ("roce", "MRDMA", 8896, 8)
    assert (
        roce.network_profile == "projects/proj-1234/global/networkProfiles/us-central1-b-vpc-roce"
    )
    assert plan.network_profile == roce.network_profile
    assert roce.firewall is False and roce.firewall_source_ranges == ()  # the profile refuses them
    assert plan.primary_mtu == 8896
    assert_disjoint(all_cidrs(plan), fabric.DEFAULT_SUBNET_RANGE)


def test_rdma_nic_order_nic0_gvnic_nic1_gvnic_then_eight_mrdma() -> None:
    plan = plan_fabric("a4-highgpu-8g", 4, zone=ZONE, project="proj-1234")
    assert [n.index for n in plan.nics] == list(range(10))
    assert [n.nic_type for n in plan.nics] == ["GVNIC", "GVNIC"] + ["MRDMA"] * 8
    assert [n.network for n in plan.nics] == ["primary", "gvnic-1"] + ["roce"] * 8
    assert [n.subnet for n in plan.nics[2:]] == [f"roce-{i}" for i in range(8)]
    assert [n.external_ip for n in plan.nics] == [True] + [False] * 9  # only nic0


def test_tcpxo_plan_nine_vpcs_mtu_8244_firewalled_to_own_subnet() -> None:
    plan = plan_fabric("a3-megagpu-8g", 2, zone=ZONE, project="proj-1234")
    assert plan.kind == "tcpxo"
    assert plan.networks_needed == 9 and plan.subnetworks_needed == 9
    assert plan.primary_mtu == 8244
    assert [n.suffix for n in plan.networks] == [f"gpu-{i}" for i in range(8)]
    for net in plan.networks:
        assert (net.mtu, net.nic_type, len(net.subnets), net.network_profile) == (
            8244,
            "GVNIC",
            1,
            None,
        )
        assert net.firewall_source_ranges == (net.subnets[0].cidr,)
    assert [n.nic_type for n in plan.nics] == ["GVNIC"] * 9
    assert [n.network for n in plan.nics] == ["primary"] + [f"gpu-{i}" for i in range(8)]
    assert [n.external_ip for n in plan.nics] == [True] + [False] * 8
    assert plan.network_profile is None
    assert_disjoint(all_cidrs(plan), fabric.DEFAULT_SUBNET_RANGE)


@pytest.mark.parametrize(
    ("machine_type", "nodes", "gpu_direct"),
    [
        ("a2-highgpu-8g", 4, "auto"),
        ("g2-standard-48", 2, "auto"),
        ("n1-standard-8", 2, "auto"),
        ("a3-highgpu-8g", 2, "auto"),
        ("a4-highgpu-8g", 2, "off"),
        ("a3-megagpu-8g", 3, "off"),
        ("a4-highgpu-8g", 1, "auto"),  # one node: the GPU NICs carry nothing
        ("a3-megagpu-8g", 1, "auto"),
    ],
)
def test_no_fabric_one_nic_and_todays_primary_subnet(
    machine_type: str, nodes: int, gpu_direct: str
) -> None:
    plan = plan_fabric(machine_type, nodes, zone=ZONE, gpu_direct=gpu_direct)
    assert plan.kind == "none" and not plan.enabled
    assert plan.networks == () and len(plan.nics) == 1
    assert plan.primary_cidr == "10.42.0.0/20"  # infra/components/network.py's SUBNET_CIDR
    assert plan.primary_mtu is None  # the provider default, as today
    assert plan.networks_needed == 1 and plan.subnetworks_needed == 1
    assert plan.nics[0].nic_type == ("GVNIC" if catalog.MACHINE_TYPES[machine_type].gvnic else None)
    assert plan.expectation().nics == 1 and plan.expectation().nccl_network is None


def test_plan_notes() -> None:
    assert "gIB" in plan_fabric("a4-highgpu-8g", 2, zone=ZONE).note
    assert "FasTrak" in plan_fabric("a3-megagpu-8g", 2, zone=ZONE).note
    high = plan_fabric("a3-highgpu-8g", 2, zone=ZONE).note
    assert "Container-Optimized OS" in high and "~20 GB/s" in high and "a3-megagpu-8g" in high
    off = plan_fabric("a4-highgpu-8g", 2, zone=ZONE, gpu_direct="off").note
    assert off.startswith("gpuDirect off:") and "3,200 Gbps" in off
    assert plan_fabric("g2-standard-4", 2, zone=ZONE).note == ""
    assert plan_fabric("a3-highgpu-8g", 1, zone=ZONE).note == ""


def test_users_network_as_primary_changes_counts_and_leaves_its_mtu() -> None:
    plan = plan_fabric(
        "a3-megagpu-8g",
        2,
        zone=ZONE,
        own_primary=False,
        avoid={"10.128.0.0/20": "subnet default of network default"},
    )
    assert plan.networks_needed == 8 and plan.subnetworks_needed == 8
    assert plan.primary_mtu is None
    exp = plan.expectation()
    assert (exp.nics, exp.mtu, exp.check_primary_mtu, exp.rxdm) == (9, 8244, False, True)


def test_expectations_per_fabric() -> None:
    rdma = plan_fabric("a3-ultragpu-8g", 2, zone=ZONE).expectation()
    assert (rdma.nics, rdma.mtu, rdma.rdma_devices, rdma.rxdm, rdma.nccl_network) == (
        10,
        8896,
        8,
        False,
        "gIB",
    )
    assert rdma.busbw_floor_gbs == pytest.approx(162.5)  # half of the published 325 GB/s
    mega = plan_fabric("a3-megagpu-8g", 2, zone=ZONE).expectation()
    assert (mega.rdma_devices, mega.rxdm, mega.nccl_network, mega.busbw_floor_gbs) == (
        0,
        True,
        "FasTrak",
        94.0,
    )
    assert plan_fabric(
        "a4-highgpu-8g", 2, zone=ZONE
    ).expectation().busbw_floor_gbs == pytest.approx(341.5)


def test_one_configurable_range_is_split_and_stays_disjoint() -> None:
    plan = plan_fabric("a4-highgpu-8g", 2, zone=ZONE, subnet_range="172.20.0.0/22")
    cidrs = all_cidrs(plan)
    assert len(cidrs) == 10 and {ipaddress.ip_network(c).prefixlen for c in cidrs} == {26}
    assert_disjoint(cidrs, "172.20.0.0/22")
    assert carve_subnets("10.0.0.0/8", 9, 2)[-1] == "10.0.128.0/20"  # never bigger than /20


@pytest.mark.parametrize(
    ("subnet_range", "nodes", "message"),
    [
        ("10.0.0.0/26", 2, "gputrain:subnetRange = '10.0.0.0/26': too small for the 10 subnet(s) "
         "this stack needs with room for 2 node(s) each; use a /25 or larger"),
        ("10.0.0.0/22", 64, "use a /21 or larger"),
        ("10.42.0.1/16", 2, "gputrain:subnetRange = '10.42.0.1/16': allowed: an IPv4 CIDR like 10.42.0.0/16"),
        ("fd00::/48", 2, "allowed: an IPv4 CIDR (GPU NICs are IPv4)"),
        ("169.254.0.0/16", 2, "overlaps 169.254.0.0/16, which VPC subnets may not use"),
        ("nonsense", 2, "allowed: an IPv4 CIDR like 10.42.0.0/16"),
    ],
)  # fmt: skip
def test_bad_ranges_fail_with_one_line(subnet_range: str, nodes: int, message: str) -> None:
    with pytest.raises(FabricError) as err:
        plan_fabric("a4-highgpu-8g", nodes, zone=ZONE, subnet_range=subnet_range)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_range_overlapping_a_used_range_fails() -> None:
    with pytest.raises(FabricError, match=r"overlaps 10\.42\.8\.0/24 \(subnet of network shared\)"):
        plan_fabric(
            "a3-megagpu-8g", 2, zone=ZONE, avoid={"10.42.8.0/24": "subnet of network shared"}
        )


def test_bad_gpu_direct_and_machine_type() -> None:
    with pytest.raises(FabricError, match=r"^gputrain:gpuDirect = 'on': allowed: auto, off$"):
        plan_fabric("a4-highgpu-8g", 2, zone=ZONE, gpu_direct="on")
    with pytest.raises(FabricError, match="gputrain:machineType = 'x1'"):
        plan_fabric("x1", 2, zone=ZONE)


def test_the_smallest_working_range_fits_exactly() -> None:
    # 10 subnets of 2 nodes -> /29 each (8 addresses, 4 reserved), 16 slots -> a /25.
    plan = plan_fabric("a4-highgpu-8g", 2, zone=ZONE, subnet_range="10.9.0.0/25")
    assert {ipaddress.ip_network(c).prefixlen for c in all_cidrs(plan)} == {29}


def test_roce_profile_helpers() -> None:
    assert fabric.roce_profile_name("europe-west4-a") == "europe-west4-a-vpc-roce"
    assert fabric.roce_profile_path("p-123456", "us-east4-b") == (
        "projects/p-123456/global/networkProfiles/us-east4-b-vpc-roce"
    )


def test_plan_records_map_onto_pulumi_gcp_arguments() -> None:
    """Network(mtu, network_profile), Subnetwork(ip_cidr_range), NIC(nic_type) exist in 10.x."""
    import inspect

    import pulumi_gcp as gcp

    net_args = inspect.signature(gcp.compute.NetworkArgs.__init__).parameters
    assert {"mtu", "network_profile"} <= set(net_args)
    assert "ip_cidr_range" in inspect.signature(gcp.compute.SubnetworkArgs.__init__).parameters
    plan = plan_fabric("a4-highgpu-8g", 2, zone=ZONE, project="proj-1234")
    nic = plan.nics[5]
    args = gcp.compute.InstanceNetworkInterfaceArgs(subnetwork=nic.subnet, nic_type=nic.nic_type)
    assert args.nic_type == "MRDMA"
