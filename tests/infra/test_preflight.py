"""infra/preflight.py: the pure checks directly, then the whole preflight (the GCE target's wiring)
against the fake Compute API seeded from the facts sheet."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.gcp.compute import AcceleratorTypeInfo, ComputeApi, ImageInfo, MachineTypeInfo, Quota
from infra.gcp.compute_capacity import get_reservation, split_reservation
from infra.preflight import (
    GLOBAL,
    PROJECT,
    CheckResult,
    PreflightReport,
    PreflightRequest,
    check_accelerator_type,
    check_image,
    check_machine_type,
    check_quota,
)
from infra.preflight import request_for as spec_request
from infra.spec import ClusterSpec, parse_spec
from scripts.targets.gce.preflight import preflight
from tests.support.fake_compute import (
    DLVM_FAMILIES,
    DLVM_PROJECT,
    GPU_QUOTA_METRICS,
    MACHINE_TYPES,
    FakeCompute,
)
from tests.support.pulumi_mocks import deployable_config

CURRENT_FAMILY = "pytorch-2-9-cu129-ubuntu-2204-nvidia-580"
DEPRECATED_FAMILY = "pytorch-2-7-cu128-ubuntu-2204-nvidia-570"


def request_for(
    machine_type: str,
    *,
    nodes: int = 1,
    spot: bool = False,
    zone: str = "us-central1-a",
    accelerator: str | None = None,
    gpus: int | None = None,
    family: str = CURRENT_FAMILY,
    boot_disk_gb: int = 100,
    ttl_s: int | None = None,
) -> PreflightRequest:
    """A request as the CLI builds it, with GPUs, vCPUs and quota metrics from the facts tables."""
    cpus, _, builtin, count = MACHINE_TYPES[machine_type]
    accel = accelerator or builtin
    assert accel is not None
    prefix = "PREEMPTIBLE_" if spot else ""
    series = machine_type.split("-")[0].upper()
    return PreflightRequest(
        project="gputrain-test",
        zone=zone,
        machine_type=machine_type,
        accelerator=accel,
        gpus_per_node=gpus if gpus is not None else count,
        nodes=nodes,
        spot=spot,
        vcpus_per_node=cpus,
        gpu_quota_metric=prefix + GPU_QUOTA_METRICS[accel],
        cpu_quota_metric=prefix + ("CPUS" if series == "N1" else f"{series}_CPUS"),
        image_project=DLVM_PROJECT,
        image_family=family,
        boot_disk_gb=boot_disk_gb,
        is_n1=series == "N1",
        max_run_duration_s=ttl_s,
    )


def machine(name: str) -> MachineTypeInfo:
    cpus, mem, accel, count = MACHINE_TYPES[name]
    return MachineTypeInfo(name, cpus, int(mem * 1024), ((accel, count),) if accel else ())


def statuses(report: PreflightReport) -> dict[tuple[str, str], str]:
    return {(r.check, r.scope): r.status for r in report.rows}


# ---- pure checks ---------------------------------------------------------------------------------


def test_machine_type_ok_and_missing() -> None:
    req = request_for("g2-standard-8")
    ok = check_machine_type(req, machine("g2-standard-8"))
    assert ok.status == "ok" and "1 × nvidia-l4" in ok.detail
    offered = [AcceleratorTypeInfo("nvidia-tesla-t4", 4)]
    missing = check_machine_type(req, None, offered)
    assert missing.status == "fail"
    assert "g2-standard-8 is not offered in us-central1-a" in missing.detail
    assert "nvidia-tesla-t4" in missing.detail
    assert "gcloud compute machine-types list --filter=name=g2-standard-8" in missing.fix


def test_machine_type_gpu_count_must_match_the_type() -> None:
    # g2-standard-24 brings 2 GPUs (facts §1.3): a config expecting 1 is wrong, and the fix says 2.
    row = check_machine_type(request_for("g2-standard-24", gpus=1), machine("g2-standard-24"))
    assert row.status == "fail"
    assert "brings 2 × nvidia-l4, the config expects 1" in row.detail
    assert "set GPUs per node to 2" in row.fix


def test_machine_type_renamed_accelerator_warns() -> None:
    req = request_for("a2-highgpu-1g")
    renamed = MachineTypeInfo("a2-highgpu-1g", 12, 87040, (("nvidia-a100-40gb", 1),))
    row = check_machine_type(req, renamed)
    assert row.status == "warn" and "NVIDIA_A100_GPUS" in row.fix


@pytest.mark.parametrize(
    ("req_type", "actual", "detail"),
    [
        ("n1-standard-8", "g2-standard-8", "brings its own GPUs"),
        ("g2-standard-8", "n1-standard-8", "has no built-in GPUs"),
    ],
)
def test_machine_type_series_mismatch(req_type: str, actual: str, detail: str) -> None:
    accel = "nvidia-tesla-t4" if req_type.startswith("n1") else None
    row = check_machine_type(request_for(req_type, accelerator=accel, gpus=1), machine(actual))
    assert row.status == "fail" and detail in row.detail


def test_n1_accelerator_type_rules() -> None:
    req = request_for("n1-standard-8", accelerator="nvidia-tesla-t4", gpus=8)
    t4 = AcceleratorTypeInfo("nvidia-tesla-t4", 4)
    too_many = check_accelerator_type(req, [t4])
    assert too_many.status == "fail"
    assert "at most 4 × nvidia-tesla-t4 per VM, the config asks 8" in too_many.detail
    assert "≤ 4" in too_many.fix
    absent = check_accelerator_type(req, [AcceleratorTypeInfo("nvidia-l4", 8)])
    assert absent.status == "fail" and "offered: nvidia-l4" in absent.detail
    req2 = request_for("n1-standard-8", accelerator="nvidia-tesla-t4", gpus=2)
    assert check_accelerator_type(req2, [t4]).status == "ok"
    old = AcceleratorTypeInfo("nvidia-tesla-t4", 4, "DEPRECATED")
    assert check_accelerator_type(req2, [old]).status == "warn"
    gone = AcceleratorTypeInfo("nvidia-tesla-t4", 4, "OBSOLETE")
    assert check_accelerator_type(req2, [gone]).status == "fail"


@pytest.mark.parametrize(
    ("quotas", "need", "soft", "status", "in_detail", "in_fix"),
    [
        ({"NVIDIA_L4_GPUS": Quota("NVIDIA_L4_GPUS", 8, 2)}, 4, False, "ok", "free 6 of 8", ""),
        ({"NVIDIA_L4_GPUS": Quota("nvidia_l4_gpus", 8, 2)}, 6, False, "ok", "need 6", ""),
        (
            {"NVIDIA_L4_GPUS": Quota("NVIDIA_L4_GPUS", 8, 5)},
            4,
            False,
            "fail",
            "need 4, free 3 (limit 8, in use 5) in us-central1",
            "request NVIDIA_L4_GPUS ≥ 9 in us-central1 at https://console.cloud.google.com/"
            "iam-admin/quotas?project=p, or use 1 node(s)",
        ),
        ({"NVIDIA_L4_GPUS": Quota("NVIDIA_L4_GPUS", 0, 0)}, 2, False, "fail", "free 0", "≥ 2"),
        ({"NVIDIA_L4_GPUS": Quota("NVIDIA_L4_GPUS", 1, 0)}, 2, True, "warn", "free 1", ""),
        ({}, 2, False, "warn", "not reported in us-central1: unknown, not zero", "≥ 2"),
        (None, 2, False, "warn", "unknown, not zero", ""),
    ],
)
def test_quota_rules(
    quotas: dict[str, Quota] | None,
    need: int,
    soft: bool,
    status: str,
    in_detail: str,
    in_fix: str,
) -> None:
    row = check_quota(
        "GPU quota",
        "us-central1",
        "NVIDIA_L4_GPUS" if need != 6 else "nvidia_l4_gpus",  # matched case-insensitively
        need,
        quotas,
        project="p",
        per_node=2,
        soft=soft,
    )
    assert row.status == status
    assert in_detail in row.detail
    assert in_fix in row.fix


def test_image_rules() -> None:
    req = request_for("g2-standard-8", boot_disk_gb=40)
    (gone,) = check_image(req, None)
    assert gone.status == "fail" and "does not resolve" in gone.detail
    assert "--show-deprecated" in gone.fix
    img = ImageInfo(
        "img-v1", "https://x/img-v1", 50, "DEPRECATED", "https://x/global/images/img-v2"
    )
    deprecated, disk = check_image(req, img)
    assert deprecated.status == "fail" and "DEPRECATED" in deprecated.detail
    assert deprecated.fix == "use image img-v2"
    assert disk.status == "fail" and disk.fix == "set the boot disk size to at least 50 GB"
    fine = check_image(request_for("g2-standard-8", boot_disk_gb=50), ImageInfo("i", "l", 50))
    assert [r.status for r in fine] == ["ok", "ok"]


def test_report_zone_ok_applies_region_and_global_failures() -> None:
    report = PreflightReport(
        (
            CheckResult("machine type", "us-central1-a", "fail", "x"),
            CheckResult("GPU quota", "us-east1", "fail", "x"),
            CheckResult("GPU quota", GLOBAL, "warn", "x"),
        )
    )
    assert report.ok_zones(["us-central1-a", "us-central1-b", "us-east1-b"]) == ["us-central1-b"]
    assert not report.ok
    failing_global = PreflightReport((CheckResult("image", GLOBAL, "fail", "x"),))
    assert failing_global.ok_zones(["us-central1-b"]) == []


# ---- against the fake server ---------------------------------------------------------------------


def test_happy_path_every_check_ok(api: ComputeApi) -> None:
    report = preflight(request_for("g2-standard-8", nodes=2), api=api)
    assert report.ok, report.rows
    assert statuses(report) == {
        ("machine type", "us-central1-a"): "ok",
        ("GPU quota", "us-central1"): "ok",
        ("CPU quota", "us-central1"): "ok",
        ("GPU quota", GLOBAL): "ok",
        ("image", GLOBAL): "ok",
        ("boot disk", GLOBAL): "ok",
    }
    assert all(len(row) == 5 for row in report.table_rows())


def test_zones_are_judged_one_by_one_and_regions_fetched_once(
    fake: FakeCompute, api: ComputeApi
) -> None:
    zones = ["us-central1-a", "us-central1-b", "asia-southeast1-a", "us-east1-b"]
    report = preflight(request_for("g2-standard-8"), zones, api=api)
    # asia-southeast1-a has A100s but no L4 (facts §9): only that zone fails.
    assert report.ok_zones(zones) == ["us-central1-a", "us-central1-b", "us-east1-b"]
    bad = [r for r in report.failures]
    assert [(r.check, r.scope) for r in bad] == [("machine type", "asia-southeast1-a")]
    assert "nvidia-tesla-a100" in bad[0].detail  # what the zone offers instead
    # the GPUs a zone offers are read only for that message (or an N1 type's attached GPU)
    assert [r[1].split("/")[-2] for r in fake.requests_matching("/acceleratorTypes$")] == [
        "asia-southeast1-a"
    ]
    assert len(fake.requests_matching("/regions/us-central1$")) == 1
    assert len(fake.requests_matching("/compute/v1/projects/gputrain-test$")) == 1


def test_spot_checks_the_preemptible_pool(fake: FakeCompute, api: ComputeApi) -> None:
    fake.set_region_quota("us-central1", "PREEMPTIBLE_NVIDIA_L4_GPUS", 4, usage=3)
    spot = preflight(request_for("g2-standard-24", nodes=2, spot=True), api=api)
    row = next(r for r in spot.failures if r.check == "GPU quota")
    assert "PREEMPTIBLE_NVIDIA_L4_GPUS: need 4, free 1" in row.detail
    assert not spot.zone_ok("us-central1-a")
    on_demand = preflight(request_for("g2-standard-24", nodes=2), api=api)
    assert on_demand.ok


def test_on_demand_with_a_ttl_of_7_days_or_less_may_use_either_pool(
    fake: FakeCompute, api: ComputeApi
) -> None:
    fake.set_region_quota("us-central1", "NVIDIA_L4_GPUS", 0)
    fake.set_region_quota("us-central1", "PREEMPTIBLE_NVIDIA_L4_GPUS", 8, usage=2)
    week = 7 * 86400
    ok = preflight(request_for("g2-standard-24", nodes=2, ttl_s=week), api=api)
    row = next(r for r in ok.rows if r.check == "GPU quota" and r.scope == "us-central1")
    assert ok.ok and row.status == "ok"
    # the table says which pool covers it
    assert row.detail.startswith("PREEMPTIBLE_NVIDIA_L4_GPUS: need 4, free 6 of 8")
    assert "may use either pool" in row.detail and "NVIDIA_L4_GPUS: need 4, free 0" in row.detail
    # longer than 7 days (or no TTL): only the standard pool counts
    for ttl in (week + 1, None):
        report = preflight(request_for("g2-standard-24", nodes=2, ttl_s=ttl), api=api)
        [fail] = report.failures
        assert fail.detail.startswith("NVIDIA_L4_GPUS: need 4, free 0")
    # neither pool: one failing row naming both, with both fixes
    fake.set_region_quota("us-central1", "PREEMPTIBLE_NVIDIA_L4_GPUS", 2)
    [both] = preflight(request_for("g2-standard-24", nodes=2, ttl_s=3600), api=api).failures
    assert "neither pool covers it" in both.detail and "PREEMPTIBLE_NVIDIA_L4_GPUS" in both.fix
    # a pool the API does not report is unknown: a warning, never a failure
    fake.remove_region_quota("us-central1", "PREEMPTIBLE_NVIDIA_L4_GPUS")
    unknown = preflight(request_for("g2-standard-24", nodes=2, ttl_s=3600), api=api)
    assert unknown.ok and statuses(unknown)[("GPU quota", "us-central1")] == "warn"


def test_the_gce_target_passes_the_stacks_ttl_to_preflight(
    fake: FakeCompute, api: ComputeApi
) -> None:
    from infra.preflight import request_for as gce_request
    from infra.spec import parse_spec
    from tests.support.pulumi_mocks import deployable_config

    fake.set_region_quota("us-central1", "NVIDIA_L4_GPUS", 0)
    cfg = deployable_config("dev", capacity="on-demand", zones='["us-central1-a"]')
    spec = parse_spec({**cfg, "gcp:project": fake.project}, "dev")
    assert spec.max_run_duration_s == 3 * 3600
    assert preflight(gce_request(spec), api=api).ok  # the preemptible pool covers it
    long = parse_spec({**cfg, "gcp:project": fake.project, "gputrain:maxRunDuration": "8d"}, "dev")
    assert not preflight(gce_request(long), api=api).ok


def test_global_gpu_quota_missing_is_unknown_and_short_is_fatal(
    fake: FakeCompute, api: ComputeApi
) -> None:
    fake.remove_project_quota("GPUS_ALL_REGIONS")
    report = preflight(request_for("a2-highgpu-8g", nodes=2), api=api)
    assert report.ok
    assert statuses(report)[("GPU quota", GLOBAL)] == "warn"
    fake.set_project_quota("GPUS_ALL_REGIONS", 8, usage=0)
    report = preflight(request_for("a2-highgpu-8g", nodes=2), api=api)
    row = next(r for r in report.failures if r.scope == GLOBAL)
    assert "GPUS_ALL_REGIONS: need 16, free 8" in row.detail and "1 node(s)" in row.fix
    assert report.ok_zones(["us-central1-a", "us-central1-b"]) == []


def test_cpu_quota_uses_the_machine_types_real_vcpus(fake: FakeCompute, api: ComputeApi) -> None:
    fake.set_region_quota("us-central1", "A3_CPUS", 300)
    report = preflight(request_for("a3-highgpu-8g", nodes=2), api=api)  # 2 × 208 vCPUs
    row = next(r for r in report.failures if r.check == "CPU quota")
    assert "A3_CPUS: need 416, free 300" in row.detail and "use 1 node(s)" in row.fix


def test_deprecated_family_and_small_disk_fail(api: ComputeApi) -> None:
    report = preflight(
        request_for("g2-standard-8", family=DEPRECATED_FAMILY, boot_disk_gb=30), api=api
    )
    fails = {r.check: r for r in report.failures}
    assert DLVM_FAMILIES[DEPRECATED_FAMILY][0] in fails["image"].detail
    assert "DEPRECATED" in fails["image"].detail
    assert "at least 50 GB" in fails["boot disk"].fix


def test_unknown_family_fails(api: ComputeApi) -> None:
    report = preflight(request_for("g2-standard-8", family="pytorch-latest-gpu"), api=api)
    (row,) = [r for r in report.failures]
    assert row.check == "image" and "does not resolve" in row.detail


def test_n1_attached_gpus(fake: FakeCompute, api: ComputeApi) -> None:
    req = request_for("n1-standard-8", accelerator="nvidia-tesla-t4", gpus=2)
    # asia-east1-a offers L4 only (facts §9), us-central1-f offers T4.
    report = preflight(req, ["asia-east1-a", "us-central1-f"], api=api)
    assert report.ok_zones(["asia-east1-a", "us-central1-f"]) == ["us-central1-f"]
    assert statuses(report)[("accelerator type", "us-central1-f")] == "ok"
    fake.add_accelerator_type("us-central1-f", "nvidia-tesla-t4", 1)
    report = preflight(req, ["us-central1-f"], api=api)
    assert statuses(report)[("accelerator type", "us-central1-f")] == "fail"


ZONES3 = ["us-central1-a", "us-central1-b", "us-central1-c"]


@pytest.mark.parametrize(
    ("status", "reason", "detail", "fix"),
    [
        (403, "accessNotConfigured", "403", "gcloud services enable compute.googleapis.com"),
        (403, "forbidden", "403", "grant your account roles/compute.viewer on gputrain-test"),
        (401, "authError", "the credentials were refused", "application-default login"),
        (500, "backendError", "500", "retry in a minute"),  # 503s are retried by the client
    ],
)
def test_an_error_not_about_a_zone_is_one_row_with_its_own_fix(
    fake: FakeCompute, api: ComputeApi, status: int, reason: str, detail: str, fix: str
) -> None:
    """Every call fails the same way: one row (scope "project"), not one per zone and call."""
    fake.inject_error(r"/compute/v1/", status, f"{reason} says the API", reason, times=100)
    report = preflight(request_for("g2-standard-8"), ZONES3, api=api)
    (row,) = report.rows
    assert (row.check, row.scope, row.status) == ("Compute API", PROJECT, "fail")
    call = "Compute API machineTypes.get us-central1-a/g2-standard-8"
    assert f"could not check: {call}: {detail}" in row.detail
    assert fix in row.fix
    assert report.ok_zones(ZONES3) == []


def test_missing_credentials_are_one_row_and_asked_for_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import google.auth

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    asked: list[object] = []
    real_default = google.auth.default
    monkeypatch.setattr(
        google.auth, "default", lambda *a, **k: asked.append(1) or real_default(*a, **k)
    )
    report = preflight(request_for("g2-standard-8"), ZONES3, api=ComputeApi())
    (row,) = report.rows
    assert row.scope == PROJECT and "no-such-key.json is missing" in row.detail
    assert row.fix == "fix the file, or unset GOOGLE_APPLICATION_CREDENTIALS"
    assert len(asked) == 1


def test_an_error_about_one_zone_stays_in_its_row(api: ComputeApi) -> None:
    zones = ["us-central1-a", "us-central1-q"]  # no such zone: the API answers 400 for it
    report = preflight(request_for("g2-standard-8"), zones, api=api)
    (row,) = report.failures
    assert (row.check, row.scope) == ("machine type", "us-central1-q")
    assert "400" in row.detail and "check the zone names" in row.fix
    assert report.ok_zones(zones) == ["us-central1-a"]


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
    report = preflight(spec_request(spec), spec.zones, api=api)
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
    report = preflight(spec_request(spec), spec.zones, api=api)
    [row] = report.failures
    assert row.check == "reservation" and "does not exist in us-central1-b" in row.detail
    fake.add_reservation("us-central1-b", "my-a4-reservation", "a4-highgpu-8g", 2, in_use=1)
    [row] = preflight(spec_request(spec), spec.zones, api=api).failures
    assert "1 of 2 VMs free, the stack needs 2" in row.detail and "nodes ≤ 1" in row.fix
    fake.add_reservation("us-central1-b", "my-a4-reservation", "a3-ultragpu-8g", 2)
    [row] = preflight(spec_request(spec), spec.zones, api=api).failures
    assert "holds a3-ultragpu-8g, not a4-highgpu-8g" in row.detail


def test_a_zone_without_the_roce_profile_fails_and_failover_skips_it(
    fake: FakeCompute, api: ComputeApi
) -> None:
    spec = _spec(fake, "a4", capacity="spot", reservation="")
    assert preflight(spec_request(spec), spec.zones, api=api).ok
    fake.remove_network_profile("us-central1-b-vpc-roce")
    report = preflight(spec_request(spec), spec.zones, api=api)
    [row] = report.failures
    assert (row.check, row.scope) == ("RoCE profile", "us-central1-b")
    assert "gpuDirect off" in row.fix
    assert report.ok_zones(spec.zones) == []


def test_network_quota_for_nine_vpcs(fake: FakeCompute, api: ComputeApi) -> None:
    spec = _spec(fake, "a3mega")
    req = spec_request(spec)
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
        req = spec_request(spec)
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
    report = preflight(spec_request(spec), spec.zones, api=api)
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
    report = preflight(spec_request(spec()), [zone], api=api)
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
    report = preflight(spec_request(spec), spec.zones, api=api)
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
