"""The Compute API reads the capacity and fabric preflight needs: a specific reservation
(`reservations.get`) and a network profile (`networkProfiles.get`). Thin, like infra/gcp/compute.py,
whose clients and error mapping it shares; the rules that judge them live in
infra/preflight.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.gcp.api import authorized_session
from infra.gcp.compute import ComputeApi

COMPUTE_API = "https://compute.googleapis.com"


@dataclass(frozen=True)
class ReservationInfo:
    """What preflight needs of a reservation: its machine type, how many VMs are free, and
    whether VMs consuming it must be RESERVATION_BOUND."""

    name: str
    zone: str
    machine_type: str
    count: int
    in_use: int
    status: str  # CREATING, READY, UPDATING, DELETING, INVALID
    specific_required: bool  # only VMs that name it may consume it
    deployment_type: str = ""  # DENSE (A3/A4 future reservations) or ""
    # CALENDAR (calendar-mode future reservation), DEFAULT, ...; None: the answer had no
    # reservationMode, so whether it is calendar-mode is unknown
    reservation_mode: str | None = None
    share_type: str = ""  # LOCAL, SPECIFIC_PROJECTS, ORGANIZATION or ""
    owner: str = ""  # the project that owns it

    @property
    def free(self) -> int:
        return max(0, self.count - self.in_use)

    @property
    def requires_bound(self) -> bool:
        """Google's reservation-bound page: calendar-mode reservations "must specify the
        reservation-bound provisioning model"; slurm-gcp `resume.py` sets RESERVATION_BOUND
        when `deploymentType == DENSE` or `reservationMode == CALENDAR`."""
        return self.deployment_type == "DENSE" or self.reservation_mode == "CALENDAR"

    @property
    def bound_unknown(self) -> bool:
        """Not dense, and its reservationMode was not in the answer: it may be calendar-mode."""
        return not self.requires_bound and self.reservation_mode is None


def split_reservation(project: str, reservation: str) -> tuple[str, str]:
    """(owner project, name): a shared reservation is projects/OWNER/reservations/NAME."""
    parts = reservation.split("/")
    if len(parts) == 4 and parts[0] == "projects" and parts[2] == "reservations":
        return parts[1], parts[3]
    return project, reservation


def get_reservation(
    api: ComputeApi, project: str, zone: str, reservation: str
) -> ReservationInfo | None:
    """The reservation in `zone`, or None when it does not exist there. Read as JSON from the
    compute **beta** API: `reservationMode` is a field of the beta Reservation only (the v1
    resource and google-cloud-compute, a v1 client, have none; slurm-gcp reads it through a beta
    client too)."""
    owner, name = split_reservation(project, reservation)
    path = f"/compute/beta/projects/{owner}/zones/{zone}/reservations/{name}"
    res = api._call(
        f"reservations.get {zone}/{name} (project {owner})",
        lambda: _get_json(api, path),
        not_found=None,
    )
    return None if res is None else reservation_info(res, owner)


def reservation_info(res: dict[str, Any], owner: str) -> ReservationInfo:
    """The fields preflight reads from a `reservations.get` body. Pure."""
    sku = res.get("specificReservation") or {}
    props = sku.get("instanceProperties") or {}
    return ReservationInfo(
        name=res.get("name", ""),
        zone=str(res.get("zone", "")).rsplit("/", 1)[-1],
        machine_type=str(props.get("machineType", "")).rsplit("/", 1)[-1],
        count=int(sku.get("count") or 0),
        in_use=int(sku.get("inUseCount") or 0),
        status=res.get("status", ""),
        specific_required=bool(res.get("specificReservationRequired")),
        deployment_type=res.get("deploymentType", ""),
        reservation_mode=res.get("reservationMode"),
        share_type=(res.get("shareSettings") or {}).get("shareType", ""),
        owner=owner,
    )


def _get_json(api: ComputeApi, path: str) -> dict[str, Any]:
    """GET one Compute API resource as JSON: anonymous against a test server (`api_endpoint`),
    else with Application Default Credentials. HTTP errors raise google.api_core's exceptions,
    as the generated clients do, so `call` maps them the same way."""
    from google.api_core import exceptions

    with authorized_session("Compute Engine", api.api_endpoint) as session:
        resp = session.get((api.api_endpoint or COMPUTE_API) + path, timeout=60)
    if resp.status_code >= 400:
        raise exceptions.from_http_response(resp)
    body: dict[str, Any] = resp.json()
    return body


def network_profile_exists(api: ComputeApi, project: str, name: str) -> bool:
    """Whether the project can use this network profile (e.g. us-central1-b-vpc-roce)."""
    found = api._call(
        f"networkProfiles.get {name}",
        lambda: api._client("NetworkProfilesClient").get(project=project, network_profile=name),
        not_found=None,
    )
    return found is not None
