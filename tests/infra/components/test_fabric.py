"""The GPU fabric under Pulumi SDK mocks (issue 16): the VPCs, subnets, firewalls and NICs a
multi-node A3 Mega / A3 Ultra / A4 stack declares, its capacity's scheduling, and that every
other stack keeps its one NIC."""

from __future__ import annotations

import ipaddress
from typing import Any

import pulumi
import pytest

from infra.spec import ClusterSpec, parse_spec
from tests.support.pulumi_mocks import (
    FIREWALL,
    NETWORK,
    SUBNET,
    TEST_PROJECT,
    GcpMocks,
    deployable_config,
)


def _spec(**overrides: str) -> ClusterSpec:
    return parse_spec(deployable_config("dev", **overrides), "dev")


def _declare(spec: ClusterSpec, check: Any) -> Any:
    from infra.components.cluster import GpuCluster

    cluster = GpuCluster(spec.stack, spec)
    return pulumi.Output.all(**cluster.exports()).apply(check)


def _disjoint(m: GcpMocks) -> None:
    nets = [ipaddress.ip_network(s.inputs["ipCidrRange"]) for s in m.of_type(SUBNET)]
    assert all(not a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1 :]), nets


RDMA_CASES = [
    (mt, cap)
    for mt in ("a4-highgpu-8g", "a3-ultragpu-8g")
    for cap in ({"capacity": "reservation", "reservation": "gpu-res-1"}, {"capacity": "spot"})
]


@pytest.mark.parametrize(
    ("machine", "capacity"),
    RDMA_CASES,
    ids=[f"{mt}-{c['capacity']}" for mt, c in RDMA_CASES],
)
@pulumi.runtime.test
def test_rdma_stack_declares_three_vpcs_a_roce_profile_and_ten_nics(
    mocks: GcpMocks, machine: str, capacity: dict[str, str]
) -> Any:
    spec = _spec(machineType=machine, nodes="2", bootDiskType="", **capacity)

    def check(_: Any) -> None:
        nets = {n.name: n.inputs for n in mocks.of_type(NETWORK)}
        assert set(nets) == {"dev-net", "dev-gvnic-1", "dev-roce"}
        assert {n["mtu"] for n in nets.values()} == {8896}
        profile = f"projects/{TEST_PROJECT}/global/networkProfiles/{spec.zone}-vpc-roce"
        assert nets["dev-roce"]["networkProfile"] == profile
        assert all("networkProfile" not in nets[n] for n in ("dev-net", "dev-gvnic-1"))
        roce = [s for s in mocks.of_type(SUBNET) if s.inputs["network"] == "dev-roce-id"]
        assert sorted(s.name for s in roce) == [f"dev-roce-{i}" for i in range(8)]
        assert all(s.inputs["region"] == spec.region for s in roce)
        fw_nets = {f.inputs["network"] for f in mocks.of_type(FIREWALL)}
        assert "dev-roce-id" not in fw_nets  # the RoCE profile refuses firewall rules
        gv = next(f for f in mocks.of_type(FIREWALL) if f.name == "dev-gvnic-1-internal")
        assert gv.inputs["sourceRanges"] == [spec.fabric.networks[0].subnets[0].cidr]  # type: ignore[union-attr]
        _disjoint(mocks)
        for vm in mocks.instances():
            nics = vm.inputs["networkInterfaces"]
            got = [(n.get("nicType"), n["subnetwork"]) for n in nics]
            want = [("GVNIC", "dev-subnet-id"), ("GVNIC", "dev-gvnic-1-subnet-id")]
            want += [("MRDMA", f"dev-roce-{i}-id") for i in range(8)]
            assert got == want, vm.name
            assert not any(n.get("accessConfigs") for n in nics[1:])
            s = vm.inputs["scheduling"]
            affinity = vm.inputs.get("reservationAffinity")
            if capacity["capacity"] == "reservation":
                assert s["provisioningModel"] == "RESERVATION_BOUND"
                assert affinity == {
                    "type": "SPECIFIC_RESERVATION",
                    "specificReservation": {
                        "key": "compute.googleapis.com/reservation-name",
                        "values": ["gpu-res-1"],
                    },
                }
            else:
                assert s["provisioningModel"] == "SPOT" and s["preemptible"] is True
                assert affinity is None
            assert "resourcePolicies" not in vm.inputs or capacity["capacity"] == "spot"

    return _declare(spec, check)


@pulumi.runtime.test
def test_a3_mega_declares_nine_vpcs_at_mtu_8244_and_nine_gvnics(mocks: GcpMocks) -> Any:
    spec = _spec(machineType="a3-megagpu-8g", nodes="2", bootDiskType="pd-ssd")

    def check(_: Any) -> None:
        nets = {n.name: n.inputs for n in mocks.of_type(NETWORK)}
        assert set(nets) == {"dev-net", *(f"dev-gpu-{i}" for i in range(8))}
        assert {n["mtu"] for n in nets.values()} == {8244}
        subnets = {s.name: s.inputs for s in mocks.of_type(SUBNET)}
        assert len(subnets) == 9
        fws = {f.name: f.inputs for f in mocks.of_type(FIREWALL)}
        for i in range(8):  # each GPU VPC open only to its own subnet
            fw = fws[f"dev-gpu-{i}-internal"]
            assert fw["network"] == f"dev-gpu-{i}-id"
            assert fw["sourceRanges"] == [subnets[f"dev-gpu-{i}-subnet"]["ipCidrRange"]]
        _disjoint(mocks)
        for vm in mocks.instances():
            nics = vm.inputs["networkInterfaces"]
            assert [n.get("nicType") for n in nics] == ["GVNIC"] * 9
            assert [n["network"] for n in nics[1:]] == [f"dev-gpu-{i}-id" for i in range(8)]

    return _declare(spec, check)


ONE_NIC = [
    {"machineType": "a4-highgpu-8g", "nodes": "2", "gpuDirect": "off"},
    {"machineType": "a3-megagpu-8g", "nodes": "1"},
    {"machineType": "a2-highgpu-8g", "nodes": "2", "capacity": "on-demand"},
    {"machineType": "g2-standard-24", "nodes": "2"},
    {"machineType": "n1-standard-8", "nodes": "2", "gpuType": "nvidia-tesla-t4", "gpuCount": "1"},
    {"machineType": "a3-highgpu-8g", "nodes": "2"},  # TCPX is not for DLVM nodes
]


@pytest.mark.parametrize("overrides", ONE_NIC, ids=[o["machineType"] for o in ONE_NIC])
@pulumi.runtime.test
def test_other_stacks_and_gpu_direct_off_keep_one_nic_and_one_vpc(
    mocks: GcpMocks, overrides: dict[str, str]
) -> Any:
    spec = _spec(bootDiskType="", **overrides)

    def check(_: Any) -> None:
        [net] = mocks.of_type(NETWORK)
        assert "mtu" not in net.inputs and "networkProfile" not in net.inputs
        [sub] = mocks.of_type(SUBNET)
        assert sub.inputs["ipCidrRange"] == "10.42.0.0/20"  # the subnet every stack had
        assert {f.name for f in mocks.of_type(FIREWALL)} == {"dev-internal", "dev-ssh"}
        assert all(len(vm.inputs["networkInterfaces"]) == 1 for vm in mocks.instances())
        assert all("reservationAffinity" not in vm.inputs for vm in mocks.instances())
        assert not any(r.typ == "gputrain:infra:GpuFabric" for r in mocks.resources)

    return _declare(spec, check)


@pulumi.runtime.test
def test_subnet_range_moves_every_subnet(mocks: GcpMocks) -> Any:
    spec = _spec(
        machineType="a4-highgpu-8g", nodes="2", bootDiskType="", subnetRange="172.20.0.0/16"
    )

    def check(_: Any) -> None:
        cidrs = [ipaddress.ip_network(s.inputs["ipCidrRange"]) for s in mocks.of_type(SUBNET)]
        assert len(cidrs) == 10
        assert all(c.subnet_of(ipaddress.ip_network("172.20.0.0/16")) for c in cidrs)  # type: ignore[arg-type]
        _disjoint(mocks)

    return _declare(spec, check)


@pytest.mark.parametrize(("capacity", "timeout"), [("flex-start", "2h"), ("spot", "20m")])
@pulumi.runtime.test
def test_flex_start_vms_may_wait_for_capacity_in_their_create_call(
    mocks: GcpMocks, capacity: str, timeout: str
) -> Any:
    """pulumi-gcp has no requestValidForDuration: the VMs' create timeout bounds the queue."""
    seen: dict[str, Any] = {}

    def record(args: pulumi.ResourceTransformationArgs) -> None:
        if args.type_ == "gcp:compute/instance:Instance":
            seen[args.name] = args.opts.custom_timeouts

    pulumi.runtime.register_stack_transformation(record)
    spec = _spec(machineType="a3-megagpu-8g", nodes="2", bootDiskType="", capacity=capacity)

    def check(_: Any) -> None:
        assert set(seen) == {"dev-node-0", "dev-node-1"}
        assert all(t.create == timeout and t.delete == "20m" for t in seen.values())
        placement = [
            r for r in mocks.resources if r.typ == "gcp:compute/resourcePolicy:ResourcePolicy"
        ]
        assert bool(placement) == (capacity == "spot")  # DWS places Flex-start VMs itself

    return _declare(spec, check)
