"""Preflight rows for capacity and the GPU fabric (issue 16): the reservation exists in the zone
with enough free VMs of the machine type, the zone has the RoCE network profile, and the project
has NETWORKS / SUBNETWORKS quota for the VPCs the stack creates. Pure: each judges what the
Compute API returned (infra/gcp/compute_capacity.py)."""

from __future__ import annotations

from collections.abc import Mapping

from infra.gcp.compute import Quota
from infra.gcp.compute_capacity import ReservationInfo
from infra.preflight import GLOBAL, CheckResult, PreflightRequest, check_quota


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
