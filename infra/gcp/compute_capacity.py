"""The Compute API reads the capacity and fabric preflight needs: a specific reservation
(`reservations.get`) and a network profile (`networkProfiles.get`). Thin, like infra/gcp/compute.py,
whose clients and error mapping it shares; the rules that judge them live in
infra/preflight_fabric.py."""

from __future__ import annotations

from dataclasses import dataclass

from infra.gcp.compute import ComputeApi


@dataclass(frozen=True)
class ReservationInfo:
    """What preflight needs of a reservation: its machine type and how many VMs are free."""

    name: str
    zone: str
    machine_type: str
    count: int
    in_use: int
    status: str  # CREATING, READY, UPDATING, DELETING, INVALID
    specific_required: bool  # only VMs that name it may consume it

    @property
    def free(self) -> int:
        return max(0, self.count - self.in_use)


def split_reservation(project: str, reservation: str) -> tuple[str, str]:
    """(owner project, name): a shared reservation is projects/OWNER/reservations/NAME."""
    parts = reservation.split("/")
    if len(parts) == 4 and parts[0] == "projects" and parts[2] == "reservations":
        return parts[1], parts[3]
    return project, reservation


def get_reservation(
    api: ComputeApi, project: str, zone: str, reservation: str
) -> ReservationInfo | None:
    """The reservation in `zone`, or None when it does not exist there."""
    owner, name = split_reservation(project, reservation)
    res = api._call(
        f"reservations.get {zone}/{name}",
        lambda: api._client("ReservationsClient").get(project=owner, zone=zone, reservation=name),
        not_found=None,
    )
    if res is None:
        return None
    sku = res.specific_reservation
    return ReservationInfo(
        name=res.name,
        zone=res.zone.rsplit("/", 1)[-1],
        machine_type=sku.instance_properties.machine_type.rsplit("/", 1)[-1],
        count=int(sku.count),
        in_use=int(sku.in_use_count),
        status=res.status,
        specific_required=bool(res.specific_reservation_required),
    )


def network_profile_exists(api: ComputeApi, project: str, name: str) -> bool:
    """Whether the project can use this network profile (e.g. us-central1-b-vpc-roce)."""
    found = api._call(
        f"networkProfiles.get {name}",
        lambda: api._client("NetworkProfilesClient").get(project=project, network_profile=name),
        not_found=None,
    )
    return found is not None
