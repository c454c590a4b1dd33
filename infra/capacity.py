"""Capacity modes: how a stack's VMs get their GPUs (on demand, Spot, Flex-start, a reservation).

Pure: which modes each machine type is offered in, what each mode sets on an instance, and one
validator whose errors are single lines naming the setting. No I/O, no Pulumi.

Sources (checked against Google's docs, 2026): "Choose a consumption option" (AI Hypercomputer:
A3 Ultra/A4 via reservations, Flex-start or Spot, no on-demand; Flex-start and reservations are
dense, Spot is standard allocation with an optional compact policy), "About Flex-start VMs"
(accelerator-optimized types only, up to 7 days, preemptible quota), "About reservation-bound VMs"
(VM must target the reservation specifically), gcp-gpu-facts.md §3.2 (A3 High 1/2/4g: Spot or
Flex-start only), pulumi-gcp 10.2 `InstanceSchedulingArgs` docstring (FLEX_START: no automatic
restart, DELETE, max_run_duration) and Cluster Toolkit's slurm-gcp `resume.py` (Flex-start VMs
set NO_RESERVATION; RESERVATION_BOUND for dense or calendar-mode reservations).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Literal, cast

from infra import catalog
from infra.keys import parse_duration
from infra.schema import NS, SpecError, StackSettings, config_string, first_repeat

Capacity = Literal["on-demand", "spot", "flex-start", "reservation"]
CAPACITIES: tuple[Capacity, ...] = ("on-demand", "spot", "flex-start", "reservation")
#: Used when neither `capacity` nor its alias `spot` is set (what `spot: true` meant before).
DEFAULT_CAPACITY: Capacity = "spot"

FLEX_START_MAX_RUN_S = 7 * 24 * 3600  # "requests over 7 days are rejected"
#: Why a Flex-start create does not queue. Compute's instance-lifecycle page (2026-04): a
#: Flex-start VM waits in PENDING only when `instances.insert` carries
#: `params.requestValidForDuration` (>= 90 s); without it GCE "only allocates resources if they
#: are immediately available". pulumi-gcp 10.2 `gcp.compute.Instance` (the Terraform provider)
#: cannot send that field. Its queued path is `gcp.compute.ResizeRequest` (with
#: `requested_run_duration`) on a managed instance group: VMs named by the group, not by the
#: program, so no per-node outputs, host keys or re-creation of one node; not used here. So
#: a stock-out fails the create at once and `--wait-for-capacity` retries it.
FLEX_START_NO_QUEUE = (
    "Flex-start does not queue here: pulumi-gcp cannot send requestValidForDuration, so GCE "
    "allocates only capacity that is free now and a stock-out fails at once"
)
RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"

#: Sold only through future reservations (reservation-bound), Flex-start or Spot; their
#: reservations are dense future reservations, so VMs must be RESERVATION_BOUND.
_RESERVATION_BOUND_TYPES = frozenset({"a3-ultragpu-8g", "a4-highgpu-8g"})

_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
#: A reservation in this project, or a shared one: projects/OTHER/reservations/NAME.
_RESERVATION_RE = re.compile(
    rf"^(?:{_NAME}|projects/[a-z][-a-z0-9]{{4,28}}[a-z0-9]/reservations/{_NAME})$"
)


class CapacityError(SpecError, ValueError):
    """One line naming the setting, the bad value and what is allowed (a user error: exit 2)."""


@dataclass(frozen=True)
class CapacityMode:
    """What a capacity mode means for the user: shown by `plan` and the manual (docs/)."""

    name: Capacity
    provisioning_model: str
    quota: str  # which quota it consumes
    placement: str  # how the VMs are placed relative to each other
    billing: str


MODES: dict[Capacity, CapacityMode] = {
    m.name: m
    for m in (
        CapacityMode(
            "on-demand",
            "STANDARD",
            "standard GPU quota",
            "compact placement policy for multi-node stacks (placement: auto)",
            "on-demand price while running",
        ),
        CapacityMode(
            "spot",
            "SPOT",
            "preemptible GPU quota",
            "standard allocation; compact placement policy for multi-node stacks",
            "Spot price (60-91 % off, changes daily); may be preempted at any time",
        ),
        CapacityMode(
            "flex-start",
            "FLEX_START",
            "preemptible GPU quota",
            "dense allocation by the Dynamic Workload Scheduler; no placement policy added "
            "unless placement: compact",
            "Flex-start price (discounted on A2/A3/A4, on-demand on G2); capacity free now or a "
            "stock-out (no queueing here), then runs up to 7 days",
        ),
        CapacityMode(
            "reservation",
            "STANDARD or RESERVATION_BOUND",
            "none beyond the reservation's",
            "decided by the reservation (dense for A3 Ultra/A4); no placement policy added",
            "billed by the reservation, used or not; the VMs add nothing for reserved resources",
        ),
    )
}


@dataclass(frozen=True)
class ReservationAffinity:
    """pulumi-gcp `InstanceReservationAffinityArgs` (+ `...SpecificReservationArgs`)."""

    type: str  # SPECIFIC_RESERVATION | NO_RESERVATION
    key: str | None = None
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class InstanceCapacity:
    """What the chosen capacity sets on every instance (pulumi-gcp 10.x argument names)."""

    capacity: Capacity
    provisioning_model: str  # STANDARD | SPOT | FLEX_START | RESERVATION_BOUND
    preemptible: bool
    automatic_restart: bool  # the component still turns it off under compact placement
    instance_termination_action: str
    max_run_duration_s: int
    reservation_affinity: ReservationAffinity | None
    placement_policy: bool  # whether gputrain may add its own compact placement policy
    preemptible_quota: bool | None  # None: no GPU quota check (the reservation holds it)
    on_host_maintenance: str = "TERMINATE"  # GPUs cannot live-migrate

    def scheduling_args(self) -> dict[str, object]:
        """Keyword arguments for `gcp.compute.InstanceSchedulingArgs` (max_run_duration as
        seconds: the component wraps it in `InstanceSchedulingMaxRunDurationArgs`)."""
        return {
            "provisioning_model": self.provisioning_model,
            "preemptible": self.preemptible,
            "automatic_restart": self.automatic_restart,
            "on_host_maintenance": self.on_host_maintenance,
            "instance_termination_action": self.instance_termination_action,
            "max_run_duration": self.max_run_duration_s,
        }


def offered(mt: catalog.MachineType) -> tuple[Capacity, ...]:
    """The capacity modes Google offers this machine type in, in CAPACITIES order."""
    if mt.spot_only:  # A3 High 1/2/4g: "you must create instances by using Spot or Flex-start"
        return ("spot", "flex-start")
    if mt.name in _RESERVATION_BOUND_TYPES:  # no on-demand column for A3 Ultra / A4
        return ("spot", "flex-start", "reservation")
    if mt.series == "n1":  # Flex-start: accelerator-optimized machine types only
        return ("on-demand", "spot", "reservation")
    return CAPACITIES


#: Flex-start is discounted for A4, A3 and A2, not G2 (Compute's Flex-start pricing, 2026).
_FLEX_START_DISCOUNTED_SERIES = frozenset({"a2", "a3", "a4"})


def flex_start_discounted(mt: catalog.MachineType) -> bool:
    return mt.series in _FLEX_START_DISCOUNTED_SERIES


def reservation_bound(mt: catalog.MachineType, *, dense_reservation: bool = False) -> bool:
    """Whether VMs consuming a reservation must be RESERVATION_BOUND: always for A3 Ultra/A4,
    otherwise when the reservation is a dense or calendar-mode one (the preflight knows)."""
    return mt.name in _RESERVATION_BOUND_TYPES or dense_reservation


def _err(key: str, value: str, why: str) -> str:
    return f"gputrain:{key} = {value!r}: {why}"


def _days(seconds: int) -> str:
    return f"{seconds / 86400:g}d"


def capacity_errors(
    machine_type: str,
    *,
    capacity: str = "",
    spot: str = "",
    reservation: str = "",
    max_run_duration_s: int,
    max_run_duration_text: str | None = None,
) -> list[str]:
    """Every problem with these settings, each one line (empty: fine). Empty strings mean
    "not set": Pulumi shows Pulumi.yaml defaults as if set, so neither key has a default."""
    mt = catalog.machine_type(machine_type)
    if mt is None:
        return [_err("machineType", machine_type, "not a known machine type")]
    errors: list[str] = []
    cap, spot_raw, res = capacity.strip(), spot.strip().lower(), reservation.strip()
    if cap and cap not in CAPACITIES:
        return [_unknown_mode("capacity", cap)]
    if spot_raw and spot_raw not in ("true", "false"):
        return [_bad_spot(spot)]
    if cap and spot_raw and (spot_raw == "true") != (cap == "spot"):
        why = f"contradicts gputrain:capacity = {cap!r}; remove spot (capacity replaces it)"
        errors.append(_err("spot", spot_raw, why))
    chosen = resolved_capacity(cap, spot_raw)
    allowed = offered(mt)
    if chosen not in allowed:
        key, value = ("capacity", chosen) if cap or not spot_raw else ("spot", spot_raw)
        why = f"{mt.name} is not offered as {chosen}; allowed capacity: {', '.join(allowed)}"
        errors.append(_err(key, value, why))
    if chosen == "reservation":
        if not res:
            why = (
                "capacity reservation needs the name of a specific reservation in the stack's "
                "zone (gcloud compute reservations list)"
            )
            errors.append(_err("reservation", "", why))
        elif not _RESERVATION_RE.match(res):
            why = (
                "allowed: a reservation name (a-z 0-9 -) or projects/PROJECT/reservations/NAME "
                "for a shared one"
            )
            errors.append(_err("reservation", res, why))
    elif res:
        errors.append(
            _err("reservation", res, f"only used with capacity reservation (capacity is {chosen})")
        )
    if chosen == "flex-start" and max_run_duration_s > FLEX_START_MAX_RUN_S:
        shown = max_run_duration_text or _days(max_run_duration_s)
        errors.append(
            _err("maxRunDuration", shown, "Flex-start VMs run at most 7 days; allowed: up to 7d")
        )
    return errors


def _unknown_mode(key: str, value: str) -> str:
    near = difflib.get_close_matches(value, CAPACITIES, n=1)
    hint = f"; did you mean {near[0]}?" if near else ""
    return _err(key, value, f"allowed: {', '.join(CAPACITIES)}{hint}")


def _bad_spot(value: str) -> str:
    return _err("spot", value, "allowed: true or false (or leave it unset and set capacity)")


def resolved_capacity(capacity: str, spot: str) -> Capacity:
    """The mode meant by `capacity` and its alias `spot`; DEFAULT_CAPACITY only when neither is
    set: text that names no mode is one line (CapacityError), never read as the default."""
    if capacity in CAPACITIES:
        return cast(Capacity, capacity)
    if capacity.strip():
        raise CapacityError(_unknown_mode("capacity", capacity.strip()))
    spot_raw = spot.strip().lower()
    if spot_raw in ("true", "false"):
        return "spot" if spot_raw == "true" else "on-demand"
    if spot_raw:
        raise CapacityError(_bad_spot(spot))
    return DEFAULT_CAPACITY


def instance_capacity(
    capacity: Capacity,
    machine_type: str,
    *,
    max_run_duration_s: int,
    reservation: str | None = None,
    dense_reservation: bool = False,
) -> InstanceCapacity:
    """The scheduling and reservation settings for every VM of a validated stack."""
    mt = catalog.MACHINE_TYPES[machine_type]
    if capacity == "reservation":
        if not reservation:
            raise CapacityError(_err("reservation", "", "capacity reservation needs a name"))
        bound = reservation_bound(mt, dense_reservation=dense_reservation)
        return InstanceCapacity(
            capacity,
            "RESERVATION_BOUND" if bound else "STANDARD",
            preemptible=False,
            automatic_restart=True,
            instance_termination_action="DELETE",
            max_run_duration_s=max_run_duration_s,
            reservation_affinity=ReservationAffinity(
                "SPECIFIC_RESERVATION", RESERVATION_NAME_KEY, (reservation,)
            ),
            placement_policy=False,  # the reservation places the VMs
            preemptible_quota=None,
        )
    if capacity == "flex-start":
        if max_run_duration_s > FLEX_START_MAX_RUN_S:
            why = "Flex-start VMs run at most 7 days; allowed: up to 7d"
            raise CapacityError(_err("maxRunDuration", _days(max_run_duration_s), why))
        return InstanceCapacity(
            capacity,
            "FLEX_START",
            preemptible=False,
            automatic_restart=False,
            instance_termination_action="DELETE",
            max_run_duration_s=max_run_duration_s,
            reservation_affinity=ReservationAffinity("NO_RESERVATION"),
            # DWS allocates densely; Google's Flex-start create samples allow an optional compact
            # policy on standalone VMs, so `placement: compact` may add one, auto does not
            placement_policy=False,
            preemptible_quota=True,
        )
    spot = capacity == "spot"
    return InstanceCapacity(
        capacity,
        "SPOT" if spot else "STANDARD",
        preemptible=spot,
        automatic_restart=not spot,
        instance_termination_action="DELETE",
        max_run_duration_s=max_run_duration_s,
        reservation_affinity=None,
        placement_policy=True,
        preemptible_quota=spot,
    )


# ---- the stack keys that say how it gets its GPUs: `capacity` (+ its alias `spot`, + `reservation`,
# `reservationBound`, `capacityInUse`, `waitForCapacity`); each bad value is one SpecError line ----


@dataclass(frozen=True)
class CapacityChoice:
    """The validated capacity of a stack: the mode in use and, for `reservation`, its name; the
    whole ladder when `capacity` is a list; how long `up` waits for capacity."""

    capacity: Capacity
    reservation: str | None
    ladder: tuple[Capacity, ...] = ()
    reservation_bound: bool | None = None  # None: `up` decides from the reservation
    wait_for_capacity_s: int = 0


#: The longest --wait-for-capacity / waitForCapacity (a Flex-start run's own limit).
MAX_WAIT_FOR_CAPACITY_S = FLEX_START_MAX_RUN_S


def capacity_ladder(cfg: StackSettings) -> list[str]:
    """`capacity` as written: one mode, or a list ([spot, on-demand]) tried in order."""
    value = cfg.capacity
    if isinstance(value, str) and "," not in value:
        return [value.strip()]
    ladder = [v.strip() for v in (value if isinstance(value, list) else value.split(","))]
    if not any(ladder):  # else the first rung's absence is blamed on capacityInUse or spot
        raise SpecError(
            f"gputrain:capacity = {config_string(value)!r}: an empty list; allowed: a capacity mode or a list of "
            "them tried in order (on-demand, spot, flex-start, reservation), or leave it unset"
        )
    if "" in ladder:  # never dropped: the list would mean less than written
        raise SpecError(
            f"gputrain:capacity = {config_string(value)!r}: an empty entry; allowed: a list of "
            "capacity modes tried in order (on-demand, spot, flex-start, reservation), each named"
        )
    return ladder


def capacity_listed(cfg: StackSettings) -> bool:
    """Whether `capacity` is a list of modes tried in order (`[spot]` too), not one mode."""
    return isinstance(cfg.capacity, list) or len(capacity_ladder(cfg)) > 1


def allowed_modes(cfg: StackSettings) -> tuple[Capacity, ...]:
    """The modes the stack may run in: `capacity`'s list, or the one mode `capacity` (or its
    alias `spot`) names; a name that is no mode is one line naming `capacity` or `spot`."""
    ladder = capacity_ladder(cfg)
    if capacity_listed(cfg):
        return tuple(resolved_capacity(mode, "") for mode in ladder)
    return (resolved_capacity(ladder[0] if ladder else "", spot_text(cfg)),)


def capacity_in_use(cfg: StackSettings) -> Capacity:
    """The mode `pulumi up` uses: `capacityInUse` (which `up` writes while it steps down a
    capacity list) or the first allowed mode. capacityInUse must be one of the allowed modes:
    it never overrides `capacity` or `spot` (one line otherwise)."""
    allowed, written = allowed_modes(cfg), cfg.capacityInUse
    if written and written not in allowed:
        raise SpecError(
            f"{NS}capacityInUse = {written!r}: not in capacity; allowed: "
            f"{', '.join(allowed)} or empty (`up` writes it while it steps down a capacity list)"
        )
    return cast(Capacity, written) if written else allowed[0]


def spot_text(cfg: StackSettings) -> str:
    """`spot` as the capacity rules read it: "" (unset), "true" or "false"."""
    return "" if cfg.spot is None else ("true" if cfg.spot else "false")


def read_wait(key: str, raw: str) -> int:
    """A wait for capacity (waitForCapacity, --wait-for-capacity): 0 = do not wait."""
    if not raw:
        return 0
    try:
        seconds = parse_duration(raw)
    except ValueError:
        raise SpecError(
            f"{key} = {raw!r}: allowed: a duration like 30m, 2h, 1h30m (at most 7d)"
        ) from None
    if not 60 <= seconds <= MAX_WAIT_FOR_CAPACITY_S:
        raise SpecError(f"{key} = {raw!r}: allowed: 1m to 7d")
    return seconds


def read_capacity(
    cfg: StackSettings, mt: catalog.MachineType, ttl_s: int, ttl_text: str, backend: str
) -> CapacityChoice:
    """`capacity` (one mode or a list), `spot`, `reservation`, `reservationBound`,
    `capacityInUse` and `waitForCapacity` together; the first problem as one line."""
    ladder, raw_spot, is_list = capacity_ladder(cfg), spot_text(cfg), capacity_listed(cfg)
    if is_list:
        twice = first_repeat(ladder)
        if twice is not None:
            raise SpecError(
                f"{NS}capacity = {config_string(cfg.capacity)!r}: {twice} is listed twice; "
                "list each mode once, in the order to try them"
            )
        if raw_spot:
            raise SpecError(f"{NS}spot = {raw_spot!r}: not with a capacity list; remove spot")
    for mode in ladder or [""]:
        errors = capacity_errors(
            mt.name,
            capacity=mode,
            spot="" if is_list else raw_spot,
            reservation=cfg.reservation if mode == "reservation" or not is_list else "",
            max_run_duration_s=ttl_s,
            max_run_duration_text=ttl_text,
        )
        if errors:
            raise SpecError(errors[0])
    if is_list and cfg.reservation and "reservation" not in ladder:
        raise SpecError(
            f"{NS}reservation = {cfg.reservation!r}: only used with capacity reservation"
        )
    if backend == "vertex" and len(ladder) > 1:  # only GCE's `up` steps down a list
        raise SpecError(
            f"{NS}capacity = {config_string(cfg.capacity)!r}: a list is not tried in order with "
            "backend vertex (the job is submitted in one mode); allowed: one of on-demand, "
            "spot, flex-start"
        )
    chosen = capacity_in_use(cfg)
    if backend == "vertex" and chosen not in ("on-demand", "spot", "flex-start"):
        raise SpecError(
            f"{NS}capacity = {chosen!r}: not supported with backend vertex; "
            "allowed: on-demand, spot, flex-start"
        )
    bound = cfg.reservationBound.lower()
    if bound not in ("", "true", "false"):
        raise SpecError(
            f"{NS}reservationBound = {cfg.reservationBound!r}: allowed: true, false or empty"
        )
    return CapacityChoice(
        chosen,
        cfg.reservation or None if chosen == "reservation" else None,
        tuple(cast(Capacity, m) for m in ladder) if is_list else (),
        reservation_bound=None if not bound else bound == "true",
        wait_for_capacity_s=read_wait(NS + "waitForCapacity", cfg.waitForCapacity),
    )
