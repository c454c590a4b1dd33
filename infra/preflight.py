"""Preflight: prove a cluster request can be created before `pulumi up` spends money.

Pure `check_*` functions judge what the Compute API returned, one table row each (the GCE target
makes the calls zone by zone, so failover can skip zones that fail). A quota metric the API does
not report is unknown, not zero: it warns, it never fails.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from infra.catalog import quota_console_url, region_of

if TYPE_CHECKING:
    from infra.spec import ClusterSpec

from infra.gcp.api import KEY_FILE_FIX, key_file_problem
from infra.gcp.compute import (
    AcceleratorTypeInfo,
    ComputeApiError,
    ImageInfo,
    MachineTypeInfo,
    Quota,
)
from infra.gcp.compute_capacity import ReservationInfo

Status = Literal["ok", "warn", "fail"]
GLOBAL = "global"
PROJECT = "project"  # a row about the caller or the project (credentials, the API off): every zone


@dataclass(frozen=True)
class PreflightRequest:
    """Exactly what preflight needs (built from the ClusterSpec by the GCE target)."""

    project: str
    zone: str
    machine_type: str
    accelerator: str  # e.g. "nvidia-l4"
    gpus_per_node: int
    nodes: int
    spot: bool  # draws on the preemptible quotas (Spot and Flex-start)
    vcpus_per_node: int
    gpu_quota_metric: str  # already PREEMPTIBLE_-prefixed for spot (catalog.quota_metric)
    cpu_quota_metric: str  # likewise (catalog.cpu_quota_metric)
    image_project: str
    image_family: str
    boot_disk_gb: int
    is_n1: bool  # N1 attaches its GPUs (acceleratorTypes check); A/G series bring them
    max_run_duration_s: int | None = None  # the VMs' TTL (always with DELETE)
    reservation: str | None = None  # capacity reservation: no GPU quota, the reservation instead
    networks: int = 0  # VPCs / subnets a GPU fabric stack creates (NETWORKS / SUBNETWORKS quota)
    subnetworks: int = 0
    roce: bool = False  # the fabric needs the zone's <zone>-vpc-roce network profile

    @functools.cached_property  # asked for every regional check of the zone
    def region(self) -> str:
        return region_of(self.zone)

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class CheckResult:
    """One row of the preflight table. `scope` is a zone, a region or "global"."""

    check: str
    scope: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class PreflightReport:
    rows: tuple[CheckResult, ...]

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.rows if r.status == "fail")

    @property
    def ok(self) -> bool:
        return not self.failures

    def zone_ok(self, zone: str) -> bool:
        """No failing row applies to this zone (its own, its region's, a global or project one)."""
        scopes = {zone, region_of(zone), GLOBAL, PROJECT}
        return not any(r.status == "fail" and r.scope in scopes for r in self.rows)

    def ok_zones(self, zones: Iterable[str]) -> list[str]:
        return [z for z in zones if self.zone_ok(z)]

    def table_rows(self) -> list[tuple[str, str, str, str, str]]:
        """For scripts.ui.table(headers=TABLE_HEADERS)."""
        return [(r.check, r.scope, r.status, r.detail, r.fix) for r in self.rows]


TABLE_HEADERS = ("check", "zone", "status", "detail", "fix")


# ---- pure checks -------------------------------------------------------------------------------


def api_error_row(check: str, scope: str, error: ComputeApiError, project: str) -> CheckResult:
    """The row for a Compute API call that failed. A 400/404 is about what was asked for (a zone,
    a region) and stays in its scope; anything else is about the caller, the project or the service
    — the same in every zone — so it is a "Compute API" row for the project, fixed by its cause."""
    detail = f"could not check: {error}"
    if error.credentials and key_file_problem():  # the variable wins over a login
        fix = KEY_FILE_FIX
    elif error.credentials or error.code == 401:
        fix = (
            "set up Application Default Credentials: gcloud auth application-default login "
            "(or GOOGLE_APPLICATION_CREDENTIALS=key.json); `gputrain doctor` checks them"
        )
    elif error.api_disabled:
        fix = f"enable the API: gcloud services enable compute.googleapis.com --project {project}"
    elif error.code == 403:
        fix = (
            f"grant your account roles/compute.viewer on {project} (docs/getting-started.md "
            "lists every role gputrain needs)"
        )
    elif error.code == 404 and scope == GLOBAL:
        fix = f"check gcp:project: {project} does not exist or you cannot see it (gcloud projects list)"
    elif error.code in (400, 404):
        return CheckResult(check, scope, "fail", detail, f"check the zone names ({scope})")
    else:
        fix = "the Compute API failed, not the config: retry in a minute"
    return CheckResult("Compute API", PROJECT, "fail", detail, fix)


def check_machine_type(
    req: PreflightRequest,
    info: MachineTypeInfo | None,
    offered: Sequence[AcceleratorTypeInfo] = (),
) -> CheckResult:
    """The machine type exists in the zone and brings (A/G) or takes (N1) the expected GPUs."""
    name, zone = req.machine_type, req.zone
    if info is None:
        offered_names = ", ".join(a.name for a in offered) or "none"
        return CheckResult(
            "machine type",
            zone,
            "fail",
            f"{name} is not offered in {zone} (GPUs offered there: {offered_names})",
            f"pick another zone: gcloud compute machine-types list --filter=name={name} "
            f"--format='value(zone)' --project {req.project}",
        )
    if req.is_n1:
        if info.accelerators:
            return CheckResult(
                "machine type",
                zone,
                "fail",
                f"{name} brings its own GPUs; it is not an N1 type with attachable GPUs",
                "use an n1-* machine type for attached GPUs, or drop the attached accelerator",
            )
        return CheckResult("machine type", zone, "ok", f"{name}: {info.guest_cpus} vCPUs")
    if not info.accelerators:
        return CheckResult(
            "machine type",
            zone,
            "fail",
            f"{name} has no built-in GPUs",
            "use an A2/A3/A4/G2 machine type, or an n1-* type with an attached accelerator",
        )
    brought, count = info.accelerators[0]
    if count != req.gpus_per_node:
        return CheckResult(
            "machine type",
            zone,
            "fail",
            f"{name} brings {count} × {brought}, the config expects {req.gpus_per_node} per node",
            f"set GPUs per node to {count}, or pick the {brought} machine type with "
            f"{req.gpus_per_node} GPUs",
        )
    if brought != req.accelerator:
        # Google renames accelerators (nvidia-tesla-a100 vs nvidia-a100-40gb): the machine type
        # still works, but the quota metric the catalog chose may be the wrong one.
        return CheckResult(
            "machine type",
            zone,
            "warn",
            f"{name} brings {count} × {brought}; the catalog calls it {req.accelerator}",
            f"check that quota metric {req.gpu_quota_metric} covers {brought}",
        )
    return CheckResult(
        "machine type", zone, "ok", f"{name}: {count} × {brought}, {info.guest_cpus} vCPUs"
    )


def check_accelerator_type(
    req: PreflightRequest, offered: Sequence[AcceleratorTypeInfo]
) -> CheckResult:
    """(N1) the zone offers the accelerator with enough cards per VM."""
    zone, accel = req.zone, req.accelerator
    found = next((a for a in offered if a.name == accel), None)
    if found is None:
        return CheckResult(
            "accelerator type",
            zone,
            "fail",
            f"{accel} is not offered in {zone} "
            f"(offered: {', '.join(a.name for a in offered) or 'none'})",
            f"pick a zone that offers it: gcloud compute accelerator-types list "
            f"--filter=name={accel} --project {req.project}",
        )
    if found.deprecated_state in ("OBSOLETE", "DELETED"):
        return CheckResult(
            "accelerator type",
            zone,
            "fail",
            f"{accel} is {found.deprecated_state} in {zone}",
            "pick a current accelerator type",
        )
    if req.gpus_per_node > found.maximum_cards_per_instance:
        return CheckResult(
            "accelerator type",
            zone,
            "fail",
            f"{zone} allows at most {found.maximum_cards_per_instance} × {accel} per VM, "
            f"the config asks {req.gpus_per_node}",
            f"set GPUs per node ≤ {found.maximum_cards_per_instance} and add nodes instead",
        )
    status: Status = "warn" if found.deprecated_state else "ok"
    note = f" ({found.deprecated_state})" if found.deprecated_state else ""
    return CheckResult(
        "accelerator type",
        zone,
        status,
        f"{accel}: up to {found.maximum_cards_per_instance} per VM{note}",
    )


def check_quota(
    check: str,
    scope: str,
    metric: str,
    need: float,
    quotas: Mapping[str, Quota] | None,
    *,
    project: str,
    per_node: float,
    soft: bool = False,
) -> CheckResult:
    """`need` units of `metric` are free in `quotas` (matched case-insensitively).

    A metric not reported is unknown (warn). `soft` turns a shortfall into a warning, for
    quotas whose applicability is not confirmed (GPUS_ALL_REGIONS with Spot)."""
    where = "globally" if scope == GLOBAL else f"in {scope}"
    quota = (quotas or {}).get(metric.upper())
    if quota is None:
        return CheckResult(
            check,
            scope,
            "warn",
            f"{metric} is not reported {where}: unknown, not zero (need {need:g})",
            f"if `up` fails on quota, request {metric} ≥ {need:g} {where}: "
            f"{quota_console_url(project)}",
        )
    if quota.available >= need:
        return CheckResult(
            check,
            scope,
            "ok",
            f"{metric}: need {need:g}, free {quota.available:g} of {quota.limit:g}",
        )
    max_nodes = int(quota.available // per_node) if per_node > 0 else 0
    nearest = f", or use {max_nodes} node(s)" if max_nodes >= 1 else ""
    return CheckResult(
        check,
        scope,
        "warn" if soft else "fail",
        f"{metric}: need {need:g}, free {quota.available:g} "
        f"(limit {quota.limit:g}, in use {quota.usage:g}) {where}",
        f"request {metric} ≥ {quota.usage + need:g} {where} at {quota_console_url(project)}"
        f"{nearest}",
    )


#: On-demand GPU VMs with maxRunDuration ≤ 7 days and termination action DELETE "can consume
#: either preemptible or standard allocation quotas" (limit-VM-runtime docs, 2024-06-18 note).
EITHER_POOL_MAX_TTL_S = 7 * 86400


def check_gpu_quota(req: PreflightRequest, quotas: Mapping[str, Quota] | None) -> CheckResult:
    """The regional GPU quota; an on-demand request with a TTL ≤ 7 days passes on either pool,
    and the row says which one covers it."""
    scope, need = req.region, req.total_gpus

    def pool(metric: str) -> CheckResult:
        return check_quota(
            "GPU quota",
            scope,
            metric,
            need,
            quotas,
            project=req.project,
            per_node=req.gpus_per_node,
        )

    standard = pool(req.gpu_quota_metric)
    either = (
        not req.spot
        and req.max_run_duration_s is not None
        and req.max_run_duration_s <= EITHER_POOL_MAX_TTL_S
    )
    if not either or standard.status == "ok":
        return standard
    preemptible = pool(f"PREEMPTIBLE_{req.gpu_quota_metric}")
    why = "on-demand with a TTL ≤ 7 days and DELETE may use either pool"
    if preemptible.status == "ok":
        return CheckResult(
            "GPU quota", scope, "ok", f"{preemptible.detail} ({why}; {standard.detail})"
        )
    return CheckResult(
        "GPU quota",
        scope,
        "fail" if "fail" == standard.status == preemptible.status else "warn",
        f"neither pool covers it ({why}): {standard.detail}; {preemptible.detail}",
        f"{standard.fix}; or {preemptible.fix}",
    )


def check_image(req: PreflightRequest, image: ImageInfo | None) -> list[CheckResult]:
    """The image family resolves, is not deprecated, and fits in the boot disk."""
    family = f"{req.image_project}/{req.image_family}"
    listing = (
        f"gcloud compute images list --project {req.image_project} --show-deprecated "
        f"--filter='family~{req.image_family.split('-')[0]}'"
    )
    if image is None:
        return [
            CheckResult(
                "image",
                GLOBAL,
                "fail",
                f"image family {family} does not resolve (past its end of patch, or misspelt)",
                f"set a current family; list them: {listing}",
            )
        ]
    rows = []
    if image.deprecated_state:
        repl = image.replacement.rsplit("/", 1)[-1] if image.replacement else None
        rows.append(
            CheckResult(
                "image",
                GLOBAL,
                "fail",
                f"{family} resolves to {image.name}, which is {image.deprecated_state}",
                f"use image {repl}" if repl else f"set a current family; list them: {listing}",
            )
        )
    else:
        rows.append(CheckResult("image", GLOBAL, "ok", f"{family} -> {image.name}"))
    if req.boot_disk_gb < image.disk_size_gb:
        rows.append(
            CheckResult(
                "boot disk",
                GLOBAL,
                "fail",
                f"boot disk {req.boot_disk_gb} GB is smaller than the image ({image.disk_size_gb} GB)",
                f"set the boot disk size to at least {image.disk_size_gb} GB",
            )
        )
    else:
        rows.append(
            CheckResult(
                "boot disk",
                GLOBAL,
                "ok",
                f"{req.boot_disk_gb} GB ≥ image {image.disk_size_gb} GB",
            )
        )
    return rows


def request_for(spec: ClusterSpec) -> PreflightRequest:
    """What preflight asks the Compute API about a stack (GCE, or Vertex AI's region). Pure."""
    assert spec.project is not None  # require_deployable ran first
    fabric = spec.fabric if spec.fabric is not None and spec.fabric.enabled else None
    return PreflightRequest(
        project=spec.project,
        zone=spec.zone,
        machine_type=spec.machine_type,
        accelerator=spec.accelerator,
        gpus_per_node=spec.gpus_per_node,
        nodes=spec.nodes,
        spot=spec.preemptible_quota,
        vcpus_per_node=spec.vcpus,
        gpu_quota_metric=spec.gpu_quota_metric,
        cpu_quota_metric=spec.cpu_quota_metric,
        image_project=spec.image_project,
        image_family=spec.image_family,
        boot_disk_gb=spec.boot_disk_gb,
        is_n1=spec.attach_gpus,
        max_run_duration_s=spec.max_run_duration_s,
        reservation=spec.reservation,
        networks=fabric.networks_needed if fabric else 0,
        subnetworks=fabric.subnetworks_needed if fabric else 0,
        roce=fabric is not None and fabric.kind == "rdma",
    )


# ---- capacity and the GPU fabric (issue 16): the reservation exists in the zone with enough free
# VMs of the machine type, the zone has the RoCE network profile, and the project has NETWORKS /
# SUBNETWORKS quota for the VPCs the stack creates (what infra/gcp/compute_capacity.py returned).
def check_reservation(req: PreflightRequest, info: ReservationInfo | None) -> CheckResult:
    """The named reservation is in the zone, READY, for this machine type, with `nodes` free."""
    zone, name = req.zone, req.reservation
    listing = f"gcloud compute reservations list --project {req.project}"
    if info is None:
        return CheckResult(
            "reservation",
            zone,
            "fail",
            f"reservation {name} does not exist in {zone}",
            f"set gputrain:reservation to one in {zone} ({listing}), or its zone in zones",
        )
    if info.machine_type != req.machine_type:
        return CheckResult(
            "reservation",
            zone,
            "fail",
            f"reservation {name} holds {info.machine_type}, not {req.machine_type}",
            f"set machineType {info.machine_type}, or name a reservation of {req.machine_type}",
        )
    if info.status != "READY":
        return CheckResult(
            "reservation",
            zone,
            "fail",
            f"reservation {name} is {info.status}, not READY",
            "wait until it is READY (a future reservation becomes so at its start time)",
        )
    if info.free < req.nodes:
        return CheckResult(
            "reservation",
            zone,
            "fail",
            f"reservation {name}: {info.free} of {info.count} VMs free, the stack needs "
            f"{req.nodes}",
            f"set nodes ≤ {info.free}, or free VMs in it ({listing})",
        )
    bound = (
        f"; {info.deployment_type or info.reservation_mode}: its VMs are RESERVATION_BOUND"
        if info.requires_bound
        else "; reservationMode unknown (not in the API's answer): calendar-mode ones need "
        "reservationBound: true"
        if info.bound_unknown
        else ""
    )
    return CheckResult(
        "reservation",
        zone,
        "ok",
        f"{name}: {info.free} of {info.count} × {info.machine_type} free, need {req.nodes}{bound}",
    )


def shared_reservation_denied(req: PreflightRequest, owner: str, error: str) -> CheckResult:
    """A 403 reading a shared reservation is about its owner project, not the user's."""
    return CheckResult(
        "reservation",
        req.zone,
        "fail",
        f"could not read reservation {req.reservation}: {error}",
        f"ask the owner of project {owner} to grant your account compute.reservations.get on "
        f"it (roles/compute.viewer on {owner}), and to share the reservation with {req.project}",
    )


def reservation_quota_row(req: PreflightRequest) -> CheckResult:
    """Reserved VMs use the reservation's resources, not the GPU quota."""
    return CheckResult(
        "GPU quota", req.region, "ok", f"not used: the reservation {req.reservation} holds the GPUs"
    )


def check_network_profile(req: PreflightRequest, found: bool) -> CheckResult:
    """A3 Ultra / A4 fabrics need the zone's `<zone>-vpc-roce` profile."""
    name = f"{req.zone}-vpc-roce"
    if found:
        return CheckResult("RoCE profile", req.zone, "ok", f"network profile {name}")
    return CheckResult(
        "RoCE profile",
        req.zone,
        "fail",
        f"{req.zone} has no network profile {name}: GPUDirect RDMA VPCs cannot be made there",
        f"pick a zone that has one (gcloud compute network-profiles list --project "
        f"{req.project}), or set gpuDirect off",
    )


def check_network_quota(
    req: PreflightRequest, quotas: Mapping[str, Quota] | None
) -> list[CheckResult]:
    """NETWORKS and SUBNETWORKS (project-wide) for the VPCs and subnets the stack creates."""
    return [
        check_quota(
            "network quota",
            GLOBAL,
            metric,
            need,
            quotas,
            project=req.project,
            per_node=0,
        )
        for metric, need in (("NETWORKS", req.networks), ("SUBNETWORKS", req.subnetworks))
        if need
    ]
