"""Preflight wiring for the GCE target: the Compute API calls zone by zone, judged by the pure
checks of infra/preflight.py, and the one table the user reads before anything is created; the
places `up` walks: those that pass it, and the `gpus` candidates within the spending caps."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from infra import catalog
from infra.base.errors import GputrainError, UserError
from infra.catalog import GLOBAL_GPU_QUOTA_METRIC
from infra.gcp.compute import ComputeApi, ComputeApiError
from infra.gcp.compute_capacity import get_reservation, network_profile_exists, split_reservation
from infra.offer_tables import MAX_ROWS, Check
from infra.offers import Candidate
from infra.preflight import (
    GLOBAL,
    PROJECT,
    TABLE_HEADERS,
    CheckResult,
    PreflightReport,
    PreflightRequest,
    api_error_row,
    check_accelerator_type,
    check_gpu_quota,
    check_image,
    check_machine_type,
    check_network_profile,
    check_network_quota,
    check_quota,
    check_reservation,
    request_for,
    reservation_quota_row,
    shared_reservation_denied,
)
from infra.spec import ClusterSpec
from scripts import ui
from scripts.targets.stack.clients import StackRunner

if TYPE_CHECKING:
    from scripts.targets.gce.clients import GceClients
    from scripts.targets.stack.target import StackContext

    GceContext = StackContext[GceClients]


def candidate_request(spec: ClusterSpec, c: Candidate) -> PreflightRequest:
    """The preflight request of a `gpus` candidate: the spec's settings with its shape and zone."""
    mt = catalog.MACHINE_TYPES[c.machine_type]
    acc = c.shape.accelerator
    return dataclasses.replace(
        request_for(spec),
        zone=c.zone,
        machine_type=c.machine_type,
        accelerator=acc,
        gpus_per_node=c.gpus_per_node,
        nodes=c.nodes,
        vcpus_per_node=mt.vcpus,
        gpu_quota_metric=catalog.quota_metric(acc, spec.spot),
        cpu_quota_metric=catalog.cpu_quota_metric(mt.series, spec.spot),
        is_n1=c.shape.attached,
    )


def check_candidates(
    spec: ClusterSpec, api: ComputeApi, *, at_least: int = MAX_ROWS, at_most: int = 50
) -> dict[Candidate, Check]:
    """Preflight verdicts for the best-ranked candidates: the first `at_least`, then on until one
    passes (at most `at_most`). Each failure names its reason (the zone lacks the GPU, quota is
    short, ...). Candidates of one shape share their regional and project calls."""
    ranked = spec.candidates[:at_most]
    checks: dict[Candidate, Check] = {}
    start = 0
    while start < len(ranked) and (start < at_least or not any(v.ok for v in checks.values())):
        batch = ranked[start : start + at_least]
        start += len(batch)
        shapes: dict[tuple[str, int, str], list[Candidate]] = {}
        for c in batch:
            shapes.setdefault((c.machine_type, c.nodes, c.shape.accelerator), []).append(c)
        for group in shapes.values():
            req = candidate_request(spec, group[0])
            report = preflight(req, [c.zone for c in group], api=api)
            for c in group:
                scopes = {c.zone, c.region, GLOBAL, PROJECT}
                failed = [r for r in report.failures if r.scope in scopes]
                checks[c] = Check(not failed, failed[0].detail if failed else "")
    return checks


def pin_reservation_bound(
    spec: ClusterSpec, runner: StackRunner, api: ComputeApi, zone: str
) -> ClusterSpec:
    """A dense or calendar-mode reservation takes only RESERVATION_BOUND VMs: read it and write
    `reservationBound` for the program (as `up` writes the zone); the spec with it."""
    from infra.stackfile import NS

    binds = reservation_binds(spec, api, zone)
    runner.set_config(NS + "reservationBound", "true" if binds else "false")
    if binds:
        ui.say(
            f"up: reservation {spec.reservation} is dense or calendar-mode: its VMs are "
            "RESERVATION_BOUND (reservationBound: true)"
        )
    return dataclasses.replace(spec, reservation_bound=binds)


def reservation_binds(spec: ClusterSpec, api: ComputeApi, zone: str) -> bool:
    """Whether the stack's reservation (in `zone`) needs RESERVATION_BOUND VMs: a dense or
    calendar-mode one (reservations.get). False when it cannot be read (preflight says why);
    the stack's own `reservationBound` when its mode is unknown (said once)."""
    assert spec.project is not None and spec.reservation is not None
    try:
        info = get_reservation(api, spec.project, zone, spec.reservation)
    except ComputeApiError as e:
        ui.warn(
            f"reservation {spec.reservation}: {e}; its VMs stay {spec.instance_capacity.provisioning_model}"
        )
        return False
    if info is not None and info.bound_unknown:
        from infra.stackfile import NS

        ui.warn(
            f"reservation {spec.reservation}: the Compute API's answer has no reservationMode, so "
            "whether it is calendar-mode is unknown; its VMs are "
            f"{'RESERVATION_BOUND' if spec.reservation_bound else 'not RESERVATION_BOUND'}"
            f" ({NS}reservationBound: true makes them so, as calendar-mode reservations need)"
        )
        return bool(spec.reservation_bound)
    return info is not None and info.requires_bound


def preflight_zones(spec: ClusterSpec, api: ComputeApi) -> list[str]:
    """Run the checks in every zone; print one table; return the zones that pass."""
    report = preflight(request_for(spec), spec.zones, api=api)
    ui.table("preflight", TABLE_HEADERS, report.table_rows())
    ok_zones = report.ok_zones(spec.zones)
    if not ok_zones:
        where = (
            "for the project"
            if any(r.scope in (PROJECT, GLOBAL) for r in report.failures)
            else "in every zone"
        )
        raise GputrainError(
            f"preflight failed {where} (see the fixes in the table above); nothing was created"
        )
    skipped = [z for z in spec.zones if z not in ok_zones]
    if skipped:
        ui.warn(f"preflight: skipping zone(s) {', '.join(skipped)}")
    return ok_zones


def _zone_checks(api: ComputeApi, req: PreflightRequest) -> tuple[list[CheckResult], int]:
    """Machine type (+ accelerator type on N1) rows, and the vCPUs per node for the CPU quota.
    The zone's accelerator list is read only where a row needs it: an N1 type's attached GPU, or
    the GPUs a zone offers instead of a machine type it lacks."""
    try:
        machine = api.machine_type(req.project, req.zone, req.machine_type)
        need_offered = req.is_n1 or machine is None
        offered = api.accelerator_types(req.project, req.zone) if need_offered else []
    except ComputeApiError as e:
        return [api_error_row("machine type", req.zone, e, req.project)], req.vcpus_per_node
    rows = [check_machine_type(req, machine, offered)]
    if req.is_n1:
        rows.append(check_accelerator_type(req, offered))
    return rows + _capacity_checks(api, req), machine.guest_cpus if machine else req.vcpus_per_node


def _capacity_checks(api: ComputeApi, req: PreflightRequest) -> list[CheckResult]:
    """The reservation (capacity reservation) and the RoCE profile (RDMA fabric) in this zone."""
    rows = []
    try:
        if req.reservation:
            owner = split_reservation(req.project, req.reservation)[0]
            try:
                info = get_reservation(api, req.project, req.zone, req.reservation)
            except ComputeApiError as e:
                if e.code != 403 or owner == req.project:
                    raise
                rows.append(shared_reservation_denied(req, owner, str(e)))
            else:
                rows.append(check_reservation(req, info))
        if req.roce:
            name = f"{req.zone}-vpc-roce"
            rows.append(check_network_profile(req, network_profile_exists(api, req.project, name)))
    except ComputeApiError as e:
        rows.append(api_error_row("reservation", req.zone, e, req.project))
    return rows


def _region_checks(api: ComputeApi, req: PreflightRequest, cpus: int) -> list[CheckResult]:
    try:
        quotas = api.region_quotas(req.project, req.region)
    except ComputeApiError as e:
        return [api_error_row("quota", req.region, e, req.project)]
    if quotas is None:
        return [
            CheckResult(
                "region",
                req.region,
                "fail",
                f"region {req.region} (of zone {req.zone}) does not exist",
                "check the zone names",
            )
        ]
    if req.reservation:  # reserved VMs use the reservation's resources, not quota
        return [reservation_quota_row(req)]
    return [
        check_gpu_quota(req, quotas),
        check_quota(
            "CPU quota",
            req.region,
            req.cpu_quota_metric,
            req.nodes * cpus,
            quotas,
            project=req.project,
            per_node=cpus,
        ),
    ]


def _global_checks(api: ComputeApi, req: PreflightRequest) -> list[CheckResult]:
    rows: list[CheckResult] = []
    try:
        project_quotas = api.project_quotas(req.project)
        rows += check_network_quota(req, project_quotas)
    except ComputeApiError as e:
        rows.append(api_error_row("GPU quota", GLOBAL, e, req.project))
        project_quotas = None
    if req.reservation is None and project_quotas is not None:
        rows.append(
            check_quota(
                "GPU quota",
                GLOBAL,
                GLOBAL_GPU_QUOTA_METRIC,
                req.total_gpus,
                project_quotas,
                project=req.project,
                per_node=req.gpus_per_node,
                soft=req.spot,  # the facts sheet lists no GPUS_ALL_REGIONS pool for Spot
            )
        )
    try:
        rows += check_image(req, api.image_from_family(req.image_project, req.image_family))
    except ComputeApiError as e:
        rows.append(api_error_row("image", GLOBAL, e, req.project))
    return rows


def preflight(
    request: PreflightRequest,
    zones: Sequence[str] | None = None,
    *,
    api: ComputeApi,
) -> PreflightReport:
    """All checks for `request.zone`, or for each of `zones` (project-wide and image checks run
    once, regional quota once per region). Returns the report; never raises on a failed check."""
    rows: list[CheckResult] = []
    regions_done: set[str] = set()
    for zone in list(zones) if zones else [request.zone]:
        req = dataclasses.replace(request, zone=zone)
        zone_rows, cpus = _zone_checks(api, req)
        rows += zone_rows
        if req.region not in regions_done:
            regions_done.add(req.region)
            rows += _region_checks(api, req, cpus)
    rows += _global_checks(api, request)
    return PreflightReport(tuple(_once(rows)))


def _once(rows: list[CheckResult]) -> list[CheckResult]:
    """A failure about the project (credentials, the API off, a permission) is the same in every
    zone and every call: one row per fix, not one per zone."""
    seen: set[str] = set()
    out = []
    for r in rows:
        if r.scope == PROJECT:
            if r.fix in seen:
                continue
            seen.add(r.fix)
        out.append(r)
    return out


def passing_places(ctx: GceContext, spec: ClusterSpec, *, skip: bool) -> list[Any]:
    """The ranked candidates (a `gpus` stack) or zones that pass preflight, in order."""
    if spec.candidates:
        return list(passing_candidates(ctx, spec, skip=skip))
    return list(spec.zones) if skip else preflight_zones(spec, ctx.clients.compute())


def passing_candidates(ctx: GceContext, spec: ClusterSpec, *, skip: bool) -> list[Candidate]:
    """The ranked candidates that pass preflight (all of them with --skip-preflight), after
    printing the candidate table; a one-line error when none passes."""
    if skip:
        return within_caps(ctx, spec, list(spec.candidates))
    from infra.offer_tables import candidate_table

    checks = check_candidates(spec, ctx.clients.compute())
    shown = candidate_table(spec.candidates, spec.max_run_duration_s, checks)
    ui.table(f"candidates for gpus = {spec.gpus_request}", shown.headers, shown.rows)
    passing = [c for c in spec.candidates if c in checks and checks[c].ok]
    if not passing:
        raise GputrainError(
            f"preflight failed for every candidate checked ({len(checks)}; see the reasons "
            "above); nothing was created"
        )
    return within_caps(ctx, spec, passing)


def within_caps(ctx: GceContext, spec: ClusterSpec, ranked: list[Candidate]) -> list[Candidate]:
    """The candidates `up` may fall back to without breaking maxHourlyCost or the run's budget
    (the plan checked the first; a stock-out must not buy a dearer one); the others said once."""
    from scripts.run_plan import check_spending_caps, worst_hourly
    from scripts.targets.stack.target import pin

    if spec.max_hourly_cost is None and ctx.opts.budget is None and spec.budget is None:
        return ranked
    kept: list[Candidate] = []
    over: list[str] = []
    unknown: list[str] = []
    for c in ranked:
        pinned = pin(spec, ctx.stack_file.config, candidate=c)
        try:
            check_spending_caps(pinned, ctx.opts.budget)
        except UserError:
            shape = f"{c.nodes} x {c.machine_type} in {c.zone}"
            (unknown if worst_hourly(pinned) is None else over).append(shape)
        else:
            kept.append(c)
    if over:
        ui.say(f"up: not falling back to {', '.join(over)}: over maxHourlyCost or the budget")
    if unknown:
        ui.say(
            f"up: not falling back to {', '.join(unknown)}: its price is unknown, so "
            "maxHourlyCost and the budget cannot be checked"
        )
    if not kept:
        raise GputrainError(
            "every candidate that passed preflight is over maxHourlyCost or the run's budget, or "
            "of an unknown price; nothing was created"
        )
    return kept
