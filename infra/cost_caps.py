"""Spending caps checked before anything is created: `maxHourlyCost` (the cluster's dearest rate,
over every capacity-list rung, must not exceed it) and `budget` (what one run may cost: the
cluster's rate times maxRunDuration, the server-side bound on every VM and Vertex job, must not
exceed it, so the cap holds with the laptop closed). Pure."""

from __future__ import annotations

from infra.base.errors import UserError
from infra.billing import parse_usd as parse_usd
from infra.keys import format_duration
from infra.spec import ClusterSpec

BUDGET_INTERVAL_ENV = "GPUTRAIN_BUDGET_INTERVAL_S"
BUDGET_INTERVAL_S = 120.0  # the budget rule looks this far ahead: a checkpoint, results, teardown


def budget_interval_s(raw: str | None) -> float:
    """How far ahead the head's budget rule looks: GPUTRAIN_BUDGET_INTERVAL_S's value (`raw`),
    else BUDGET_INTERVAL_S; one line for a value that is not seconds. Pure."""
    if raw is None or not raw.strip():
        return BUDGET_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise UserError(f"{BUDGET_INTERVAL_ENV} {raw!r}: allowed: seconds from 0 to 86400")
    return value


def worst_hourly(spec: ClusterSpec) -> float | None:
    """USD per hour of the whole cluster at the dearest capacity it may get (every rung of a
    capacity list; flex-start and reservation at most on-demand); None: a price is unknown."""
    if spec.price is None:
        return None
    rungs = spec.capacity_ladder or (spec.capacity,)
    rates = [spec.price.hourly(mode == "spot") for mode in rungs]
    if any(r is None for r in rates):
        return None
    return max(r for r in rates if r is not None) * spec.nodes


def check_caps(spec: ClusterSpec, *, budget: float | None, budget_setting: str) -> None:
    """Refuse, with one line, a cluster dearer per hour than maxHourlyCost, or a run whose worst
    case (rate x maxRunDuration) exceeds its budget. Nothing is created before this."""
    from infra.stackfile import NS

    cap = spec.max_hourly_cost
    if cap is None and budget is None:
        return
    rate = worst_hourly(spec)
    shape = (
        f"{spec.nodes} x {spec.machine_type} ({'/'.join(spec.capacity_ladder or (spec.capacity,))})"
    )
    if rate is None:
        raise UserError(
            f"{NS}maxHourlyCost/{budget_setting}: the price of {shape} in {spec.zone} is unknown, "
            "so the cap cannot be checked; allowed: a machine type and zone the price table knows"
        )
    if cap is not None and rate > cap:
        priced = [c for c in spec.candidates if c.hourly is not None]
        cheapest = min(priced, key=lambda c: c.hourly or 0.0) if priced else None
        if cheapest is not None and (cheapest.hourly or 0.0) > cap:
            raise UserError(
                f"{NS}maxHourlyCost {cap:g}: below the cheapest candidate, {cheapest.nodes} x "
                f"{cheapest.machine_type} in {cheapest.zone} at ${cheapest.hourly:.2f}/h; allowed: "
                f"at least {cheapest.hourly:.2f}"
            )
        fits = (
            f"; {cheapest.nodes} x {cheapest.machine_type} in {cheapest.zone} costs "
            f"${cheapest.hourly:.2f}/h (pin it with {NS}candidate)"
            if cheapest is not None
            else ""
        )
        raise UserError(
            f"{NS}maxHourlyCost {cap:g}: {shape} costs up to ${rate:.2f}/h; allowed: at least "
            f"{rate:.2f}, or a cheaper machine, capacity or node count{fits}"
        )
    if budget is not None:
        worst = rate * spec.max_run_duration_s / 3600
        if worst > budget:
            fits_s = int(budget / rate * 3600) // 60 * 60
            hint = (
                f"set {NS}maxRunDuration to at most {format_duration(fits_s)}"
                if fits_s >= 600
                else "a cheaper cluster"
            )
            raise UserError(
                f"{budget_setting} {budget:g}: {shape} at ${rate:.2f}/h for maxRunDuration "
                f"{spec.max_run_duration} may cost ${worst:.2f}; allowed: a budget of at least "
                f"{worst:.2f}, or {hint} (the server-side bound that holds the budget)"
            )


def caps_line(spec: ClusterSpec) -> str:
    """`plan`'s line: the budget and the hourly cap next to the worst case they were checked
    against (check_caps passed). Pure."""
    rate = worst_hourly(spec) or 0.0
    worst = rate * spec.max_run_duration_s / 3600
    parts = []
    if spec.max_hourly_cost is not None:
        parts.append(
            f"maxHourlyCost ${spec.max_hourly_cost:,.2f}/h >= ${rate:,.2f}/h (dearest rate)"
        )
    if spec.budget is not None:
        parts.append(
            f"budget ${spec.budget:,.2f} per run >= worst case ${worst:,.2f} ({spec.max_run_duration} "
            "at the dearest rate; maxRunDuration is the server-side bound that holds it); the "
            "head's watchdog stops a run with a checkpoint before it passes the budget"
        )
    return "Caps: " + "; ".join(parts) + "."


def check_spending_caps(spec: ClusterSpec, given_budget: float | None) -> None:
    """maxHourlyCost and the run's budget (--budget, else the stack's), before anything bills."""
    from infra.stackfile import NS

    given = given_budget is not None
    check_caps(
        spec,
        budget=given_budget if given else spec.budget,
        budget_setting="--budget" if given else f"{NS}budget",
    )
