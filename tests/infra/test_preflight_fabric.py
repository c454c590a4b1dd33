"""Preflight for capacity and the GPU fabric (issue 16) against the fake Compute API's real REST
shapes: reservations.get, networkProfiles.get and the project's NETWORKS / SUBNETWORKS quota."""

from __future__ import annotations

from infra.gcp.compute import ComputeApi
from infra.gcp.compute_capacity import get_reservation, split_reservation
from infra.preflight import GLOBAL, PreflightReport, request_for
from infra.spec import ClusterSpec, parse_spec
from scripts.targets.gce.preflight import preflight
from tests.support.fake_compute import FakeCompute
from tests.support.pulumi_mocks import deployable_config


def _spec(fake: FakeCompute, stack: str, **overrides: str) -> ClusterSpec:
    return parse_spec({**deployable_config(stack, **overrides), "gcp:project": fake.project}, stack)


def _rows(report: PreflightReport, check: str) -> list[tuple[str, str, str]]:
    return [(r.scope, r.status, r.detail) for r in report.rows if r.check == check]


def test_reservation_is_read_with_its_free_vms(fake: FakeCompute, api: ComputeApi) -> None:
    fake.add_reservation("us-central1-b", "my-a4-reservation", "a4-highgpu-8g", 4, in_use=1)
    info = get_reservation(api, fake.project, "us-central1-b", "my-a4-reservation")
    assert info is not None
    assert (info.machine_type, info.count, info.in_use, info.free) == ("a4-highgpu-8g", 4, 1, 3)
    assert info.status == "READY" and info.specific_required and info.zone == "us-central1-b"
    assert get_reservation(api, fake.project, "us-central1-a", "my-a4-reservation") is None
    assert split_reservation("p", "projects/owner-1/reservations/r") == ("owner-1", "r")


def test_shipped_a4_stack_passes_with_its_reservation_and_skips_gpu_quota(
    fake: FakeCompute, api: ComputeApi
) -> None:
    fake.add_reservation("us-central1-b", "my-a4-reservation", "a4-highgpu-8g", 2)
    fake.set_region_quota("us-central1", "NVIDIA_B200_GPUS", 0)  # unused by reserved VMs
    fake.set_region_quota("us-central1", "PREEMPTIBLE_NVIDIA_B200_GPUS", 0)
    spec = _spec(fake, "a4")
    report = preflight(request_for(spec), spec.zones, api=api)
    assert report.ok, report.failures
    [(_, status, detail)] = _rows(report, "reservation")
    assert status == "ok" and "2 of 2 × a4-highgpu-8g free, need 2" in detail
    assert _rows(report, "RoCE profile") == [
        ("us-central1-b", "ok", "network profile us-central1-b-vpc-roce")
    ]
    [gpu] = _rows(report, "GPU quota")  # neither the regional nor GPUS_ALL_REGIONS
    assert gpu[1] == "ok" and "reservation my-a4-reservation holds the GPUs" in gpu[2]
    quota = {d.split(":")[0]: s for _, s, d in _rows(report, "network quota")}
    assert quota == {"NETWORKS": "ok", "SUBNETWORKS": "ok"}


def test_a_missing_full_or_wrong_reservation_fails_in_one_row(
    fake: FakeCompute, api: ComputeApi
) -> None:
    spec = _spec(fake, "a4")
    report = preflight(request_for(spec), spec.zones, api=api)
    [row] = report.failures
    assert row.check == "reservation" and "does not exist in us-central1-b" in row.detail
    fake.add_reservation("us-central1-b", "my-a4-reservation", "a4-highgpu-8g", 2, in_use=1)
    [row] = preflight(request_for(spec), spec.zones, api=api).failures
    assert "1 of 2 VMs free, the stack needs 2" in row.detail and "nodes ≤ 1" in row.fix
    fake.add_reservation("us-central1-b", "my-a4-reservation", "a3-ultragpu-8g", 2)
    [row] = preflight(request_for(spec), spec.zones, api=api).failures
    assert "holds a3-ultragpu-8g, not a4-highgpu-8g" in row.detail


def test_a_zone_without_the_roce_profile_fails_and_failover_skips_it(
    fake: FakeCompute, api: ComputeApi
) -> None:
    spec = _spec(fake, "a4", capacity="spot", reservation="")
    assert preflight(request_for(spec), spec.zones, api=api).ok
    fake.remove_network_profile("us-central1-b-vpc-roce")
    report = preflight(request_for(spec), spec.zones, api=api)
    [row] = report.failures
    assert (row.check, row.scope) == ("RoCE profile", "us-central1-b")
    assert "gpuDirect off" in row.fix
    assert report.ok_zones(spec.zones) == []


def test_network_quota_for_nine_vpcs(fake: FakeCompute, api: ComputeApi) -> None:
    spec = _spec(fake, "a3mega")
    req = request_for(spec)
    assert (req.networks, req.subnetworks, req.roce) == (9, 9, False)
    fake.set_project_quota("NETWORKS", 15, usage=10)
    report = preflight(req, spec.zones, api=api)
    [row] = report.failures
    assert (row.check, row.scope) == ("network quota", GLOBAL)
    assert "NETWORKS: need 9, free 5" in row.detail and "NETWORKS ≥ 19" in row.fix
    fake.remove_project_quota("SUBNETWORKS")
    rows = _rows(preflight(req, spec.zones, api=api), "network quota")
    assert [s for _, s, d in rows if d.startswith("SUBNETWORKS")] == ["warn"]


def test_one_nic_stacks_ask_for_no_network_quota_or_profile(
    fake: FakeCompute, api: ComputeApi
) -> None:
    for spec in (_spec(fake, "h100"), _spec(fake, "a3mega", gpuDirect="off")):
        req = request_for(spec)
        assert (req.networks, req.roce, req.reservation) == (0, False, None)
        report = preflight(req, spec.zones, api=api)
        assert not _rows(report, "network quota") and not _rows(report, "RoCE profile")
