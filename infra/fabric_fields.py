"""Readers for the keys that say how a stack gets its GPUs and how its nodes talk to each other:
`capacity` (+ its alias `spot`, + `reservation`), `gpuDirect` and `subnetRange`. Each bad value
is one SpecError line naming the key; infra/capacity.py and infra/fabric.py hold the rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from infra import capacity, catalog
from infra.capacity import Capacity
from infra.fabric import GPU_DIRECT_CHOICES, FabricError, FabricPlan, plan_fabric
from infra.schema import StackSettings, choice, config_string, parse_duration
from infra.stackfile import NS, SpecError


@dataclass(frozen=True)
class CapacityChoice:
    """The validated capacity of a stack: the mode in use and, for `reservation`, its name; the
    whole ladder when `capacity` is a list; how long `up` waits for capacity."""

    capacity: capacity.Capacity
    reservation: str | None
    ladder: tuple[Capacity, ...] = ()
    reservation_bound: bool | None = None  # None: `up` decides from the reservation
    wait_for_capacity_s: int = 0


#: The longest --wait-for-capacity / waitForCapacity (a Flex-start run's own limit).
MAX_WAIT_FOR_CAPACITY_S = capacity.FLEX_START_MAX_RUN_S


def capacity_ladder(cfg: StackSettings) -> list[str]:
    """`capacity` as written: one mode, or a list ([spot, on-demand]) tried in order."""
    value, raw = cfg.capacity, config_string(cfg.capacity)
    if isinstance(value, str) and "," not in value:
        return [value]
    ladder = value if isinstance(value, list) else [v.strip() for v in value.split(",")]
    ladder = [v for v in ladder if v]
    if not ladder:  # else the first rung's absence is blamed on capacityInUse or spot
        raise SpecError(
            f"gputrain:capacity = {raw!r}: an empty list; allowed: a capacity mode or a list of "
            "them tried in order (on-demand, spot, flex-start, reservation), or leave it unset"
        )
    return ladder


def capacity_in_use(cfg: StackSettings) -> str:
    """The mode `pulumi up` uses: `capacityInUse` (written by `up`) or the list's first."""
    ladder = capacity_ladder(cfg)
    return cfg.capacityInUse or (ladder[0] if ladder else "")


def spot_text(cfg: StackSettings) -> str:
    """`spot` as the capacity rules read it: "" (unset), "true" or "false"."""
    return "" if cfg.spot is None else config_string(cfg.spot)


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
    ladder, raw_spot = capacity_ladder(cfg), spot_text(cfg)
    listed = len(ladder) > 1 or isinstance(cfg.capacity, list)
    if listed:
        twice = next((m for i, m in enumerate(ladder) if m in ladder[:i]), None)
        if twice is not None:
            raise SpecError(
                f"{NS}capacity = {config_string(cfg.capacity)!r}: {twice} is listed twice; "
                "list each mode once, in the order to try them"
            )
        if raw_spot:
            raise SpecError(f"{NS}spot = {raw_spot!r}: not with a capacity list; remove spot")
    for mode in ladder or [""]:
        errors = capacity.capacity_errors(
            mt.name,
            capacity=mode,
            spot="" if listed else raw_spot,
            reservation=cfg.reservation if mode == "reservation" or not listed else "",
            max_run_duration_s=ttl_s,
            max_run_duration_text=ttl_text,
        )
        if errors:
            raise SpecError(errors[0])
    if listed and cfg.reservation and "reservation" not in ladder:
        raise SpecError(
            f"{NS}reservation = {cfg.reservation!r}: only used with capacity reservation"
        )
    chosen = capacity.resolved_capacity(capacity_in_use(cfg), raw_spot)
    if listed and chosen not in ladder:
        raise SpecError(
            f"{NS}capacityInUse = {chosen!r}: not in capacity; allowed: {', '.join(ladder)}"
        )
    if backend == "vertex" and chosen not in ("on-demand", "spot", "flex-start"):
        raise SpecError(
            f"{NS}capacity = {chosen!r}: not supported with backend vertex; "
            "allowed: on-demand, spot, flex-start"
        )
    bound = cfg.reservationBound.lower()
    if bound not in ("", "true", "false"):
        raise SpecError(f"{NS}reservationBound = {bound!r}: allowed: true, false or empty")
    return CapacityChoice(
        chosen,
        cfg.reservation or None if chosen == "reservation" else None,
        tuple(cast(Capacity, m) for m in ladder) if listed else (),
        reservation_bound=None if not bound else bound == "true",
        wait_for_capacity_s=read_wait(NS + "waitForCapacity", cfg.waitForCapacity),
    )


def read_fabric(
    cfg: StackSettings,
    mt: catalog.MachineType,
    nodes: int,
    *,
    zone: str,
    project: str | None,
    existing_network: str | None,
) -> FabricPlan:
    """`gpuDirect` and `subnetRange` -> the stack's fabric plan (its ranges checked here)."""
    gpu_direct = choice("gpuDirect", cfg.gpuDirect, GPU_DIRECT_CHOICES)
    try:
        return plan_fabric(
            mt.name,
            nodes,
            zone=zone,
            project=project,
            gpu_direct=gpu_direct,
            subnet_range=cfg.subnetRange,
            own_primary=existing_network is None,
        )
    except FabricError as exc:
        raise SpecError(str(exc)) from None
