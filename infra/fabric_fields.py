"""Readers for the keys that say how a stack gets its GPUs and how its nodes talk to each other:
`capacity` (+ its alias `spot`, + `reservation`), `gpuDirect` and `subnetRange`. Each bad value
is one SpecError line naming the key; infra/capacity.py and infra/fabric.py hold the rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra import capacity, catalog
from infra.fabric import GPU_DIRECT_CHOICES, FabricError, FabricPlan, plan_fabric
from infra.fields import ConfigReader
from infra.stackfile import NS, SpecError


@dataclass(frozen=True)
class CapacityChoice:
    """The validated capacity of a stack: the mode and, for `reservation`, its name."""

    capacity: capacity.Capacity
    reservation: str | None


def read_capacity(
    cfg: ConfigReader, mt: catalog.MachineType, ttl_s: int, ttl_text: str, backend: str
) -> CapacityChoice:
    """`capacity`, `spot` and `reservation` together; the first problem as one line."""
    raw_cap, raw_spot = cfg.text("capacity"), cfg.text("spot")
    errors = capacity.capacity_errors(
        mt.name,
        capacity=raw_cap,
        spot=raw_spot,
        reservation=cfg.text("reservation"),
        max_run_duration_s=ttl_s,
        max_run_duration_text=ttl_text,
    )
    if errors:
        raise SpecError(errors[0])
    chosen = capacity.resolved_capacity(raw_cap, raw_spot)
    if backend == "vertex" and chosen not in ("on-demand", "spot"):
        raise SpecError(
            f"{NS}capacity = {chosen!r}: not supported with backend vertex; "
            "allowed: on-demand, spot"
        )
    return CapacityChoice(chosen, cfg.text("reservation") or None)


def read_fabric(
    cfg: ConfigReader,
    mt: catalog.MachineType,
    nodes: int,
    *,
    zone: str,
    project: str | None,
    existing_network: str | None,
) -> FabricPlan:
    """`gpuDirect` and `subnetRange` -> the stack's fabric plan (its ranges checked here)."""
    gpu_direct = cfg.choice("gpuDirect", GPU_DIRECT_CHOICES)
    try:
        return plan_fabric(
            mt.name,
            nodes,
            zone=zone,
            project=project,
            gpu_direct=gpu_direct,
            subnet_range=cfg.text("subnetRange"),
            own_primary=existing_network is None,
        )
    except FabricError as exc:
        raise SpecError(str(exc)) from None
