"""Preflight for capacity and the GPU fabric (issue 16) against the fake Compute API's real REST
shapes: reservations.get, networkProfiles.get and the project's NETWORKS / SUBNETWORKS quota."""

from __future__ import annotations

import pytest

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


def test_dense_and_calendar_reservations_require_reservation_bound_vms(
    fake: FakeCompute, api: ComputeApi
) -> None:
    """slurm-gcp resume.py: RESERVATION_BOUND when deploymentType == DENSE or reservationMode ==
    CALENDAR; both read from reservations.get of the compute beta API (reservationMode is not in
    the v1 Reservation, which the fake, like Google, answers without it)."""
    zone = "us-central1-a"
    fake.add_reservation(zone, "dense", "a3-highgpu-8g", 2, deployment_type="DENSE")
    fake.add_reservation(zone, "calendar", "a3-highgpu-8g", 2, reservation_mode="CALENDAR")
    fake.add_reservation(zone, "plain", "a3-highgpu-8g", 2, reservation_mode="DEFAULT")
    found = {n: get_reservation(api, fake.project, zone, n) for n in ("dense", "calendar", "plain")}
    assert {n: i.requires_bound for n, i in found.items() if i} == {
        "dense": True,
        "calendar": True,
        "plain": False,
    }
    assert fake.requests_matching("/compute/beta/projects/.*/reservations/calendar")
    spec = _spec(fake, "dev", machineType="a3-highgpu-8g", capacity="reservation",
                 reservation="calendar", zones="us-central1-a", spot="")  # fmt: skip
    report = preflight(request_for(spec), spec.zones, api=api)
    [(_, status, detail)] = _rows(report, "reservation")
    assert status == "ok" and detail.endswith("CALENDAR: its VMs are RESERVATION_BOUND")
    from scripts.targets.gce.preflight import reservation_binds

    assert reservation_binds(spec, api, zone)
    plain = parse_spec(
        {**deployable_config("dev", machineType="a3-highgpu-8g", capacity="reservation",
                             reservation="plain", zones="us-central1-a", spot=""),
         "gcp:project": fake.project},
        "dev",
    )  # fmt: skip
    assert not reservation_binds(plain, api, zone)


def test_a_reservation_without_reservation_mode_is_unknown_not_plain(
    fake: FakeCompute, api: ComputeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """No reservationMode in the answer: the mode is unknown; `up` says so once and keeps the
    stack's own reservationBound (false unless the user set it)."""
    from scripts.targets.gce.preflight import reservation_binds

    zone = "us-central1-a"
    fake.add_reservation(zone, "quiet", "a3-highgpu-8g", 2)
    info = get_reservation(api, fake.project, zone, "quiet")
    assert info is not None and info.reservation_mode is None and info.bound_unknown

    def spec(**kw: str) -> ClusterSpec:
        cfg = deployable_config("dev", machineType="a3-highgpu-8g", capacity="reservation",
                                reservation="quiet", zones=zone, spot="", **kw)  # fmt: skip
        return parse_spec({**cfg, "gcp:project": fake.project}, "dev")

    assert not reservation_binds(spec(), api, zone)
    err = capsys.readouterr().err
    assert "has no reservationMode, so whether it is calendar-mode is unknown" in err
    assert "gputrain:reservationBound: true makes them so" in err
    assert reservation_binds(spec(reservationBound="true"), api, zone)
    report = preflight(request_for(spec()), [zone], api=api)
    [(_, status, detail)] = _rows(report, "reservation")
    assert status == "ok" and "reservationMode unknown" in detail


def test_reservation_bound_setting_picks_the_provisioning_model() -> None:
    """What `up` writes (reservationBound) decides RESERVATION_BOUND for any series; A3 Ultra and
    A4 reservations always bind; unset (None) = not yet decided by `up`."""

    def model(**kw: str) -> str:
        cfg = deployable_config("dev", capacity="reservation", reservation="r", spot="", **kw)
        return parse_spec(cfg, "dev").instance_capacity.provisioning_model

    assert model(machineType="a3-highgpu-8g", reservationBound="true") == "RESERVATION_BOUND"
    assert model(machineType="a3-highgpu-8g", reservationBound="false") == "STANDARD"
    assert model(machineType="a3-highgpu-8g") == "STANDARD"
    assert model(machineType="a4-highgpu-8g", nodes="2", reservationBound="false") == (
        "RESERVATION_BOUND"
    )


def test_a_403_on_a_shared_reservation_names_its_owner_project(
    fake: FakeCompute, api: ComputeApi
) -> None:
    zone = "us-central1-a"
    fake.add_reservation(zone, "team-res", "a3-highgpu-8g", 2, owner="owner-proj")
    shared = "projects/owner-proj/reservations/team-res"
    spec = _spec(fake, "dev", machineType="a3-highgpu-8g", capacity="reservation",
                 reservation=shared, zones="us-central1-a", spot="")  # fmt: skip
    report = preflight(request_for(spec), spec.zones, api=api)
    [row] = [r for r in report.failures if r.check == "reservation"]
    assert "compute.reservations.get" in row.detail and "owner-proj" in row.detail
    assert row.fix.startswith("ask the owner of project owner-proj to grant")
    assert "Compute API" not in [r.check for r in report.failures]  # not about the user's project
    fake.readable_projects.add("owner-proj")  # the owner granted it: the read now passes
    info = get_reservation(api, fake.project, zone, shared)
    assert (
        info is not None and info.owner == "owner-proj" and info.share_type == "SPECIFIC_PROJECTS"
    )


def test_up_pins_reservation_bound_for_the_program(
    fake: FakeCompute, api: ComputeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `up` writes before `pulumi up`: reservationBound true for a dense reservation (the
    program then declares RESERVATION_BOUND VMs), false for a plain one."""
    from scripts.targets.gce.preflight import pin_reservation_bound
    from tests.support.fake_stack import FakeStackRunner

    zone = "us-central1-a"
    fake.add_reservation(zone, "dense", "a3-megagpu-8g", 2, deployment_type="DENSE")
    fake.add_reservation(zone, "plain", "a3-megagpu-8g", 2)
    runner = FakeStackRunner("dev", compute=fake, project=fake.project)
    for name, bound in (("dense", True), ("plain", False)):
        spec = _spec(fake, "dev", machineType="a3-megagpu-8g", capacity="reservation",
                     reservation=name, zones=zone, spot="")  # fmt: skip
        pinned = pin_reservation_bound(spec, runner, api, zone)
        assert runner.config["gputrain:reservationBound"] == str(bound).lower()
        expected = "RESERVATION_BOUND" if bound else "STANDARD"
        assert pinned.instance_capacity.provisioning_model == expected
    assert capsys.readouterr().out.count("is dense or calendar-mode") == 1
