"""Money, checked before anything is asked or created: the Cloud Billing export table
(PROJECT.DATASET.TABLE) `gputrain cost` reads billed figures from, amounts in US dollars
(`budget`, `maxHourlyCost`), the Cloud Billing budget guard (`billingBudget`) and the spending
caps the cluster's price is held to. Pure."""

from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.base.errors import UserError
from infra.schema import format_duration
from infra.stackfile import STACK_LABEL, SpecError

if TYPE_CHECKING:  # spec.py reads the money keys with this module's parsers
    from infra.spec import ClusterSpec


# a project id (6-30: a-z, 0-9, '-', a letter first; optionally domain-scoped "example.com:p"),
# a dataset (letters, digits, '_'), a table (letters, digits, '_', '-', '$')
TABLE = re.compile(
    r"^((?:[a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9])\.([A-Za-z0-9_]{1,1024})\.([\w$-]{1,1024})$"
)


def parse_table(text: str, setting: str) -> str:
    """`project.dataset.table`, else one line naming the setting and what is allowed."""
    if not TABLE.match(text.strip()):
        raise UserError(
            f"{setting} {text!r}: not a BigQuery table; allowed: PROJECT.DATASET.TABLE, e.g. "
            "my-project.billing.gcp_billing_export_v1_012345_6789AB_CDEF01 (the Cloud Billing "
            "standard usage cost export)"
        )
    return text.strip()


def parse_usd(text: str, setting: str) -> float | None:
    """A positive amount of US dollars ("" = unset), else one line naming the setting."""
    if not text.strip():
        return None
    try:
        value = float(text.strip().removeprefix("$"))
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{setting} {text!r}: not an amount; allowed: US dollars above 0, e.g. 300")
    return value


#: `billingBudget`'s keys: the Cloud Billing account (its ID, 012345-6789AB-CDEF01) and the amount.
BILLING_ACCOUNT = re.compile(r"^[0-9A-F]{6}-[0-9A-F]{6}-[0-9A-F]{6}$", re.IGNORECASE)
#: What creating the budget needs on the billing account (not testable on the project): Billing
#: Account Costs Manager or Administrator (docs/guides/cost.md cites Google's page).
BUDGET_PERMISSIONS = (
    "billing.budgets.create",
    "billing.budgets.get",
    "billing.budgets.update",
    "billing.budgets.delete",
)


@dataclass(frozen=True)
class BillingBudget:
    """`billingBudget`: a Cloud Billing budget on the stack's label whose Pub/Sub notifications
    the head's watchdog reads, ending the stack's run once the cost reaches the amount."""

    account: str  # billing account ID
    usd: float


def guard_name(stack: str) -> str:
    """The guard's Pub/Sub topic and subscription id (both the same): `gputrain-<stack>-budget`."""
    return f"gputrain-{stack}-budget"


def parse_billing_budget(raw: object, setting: str) -> BillingBudget | None:
    """`{account: 012345-6789AB-CDEF01, usd: N}` (the typed settings' map, or JSON as the CLI
    hands maps over); None when unset; else one line (a SpecError) naming the setting, the bad
    value and what is allowed."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    value = raw
    if isinstance(raw, str):
        with contextlib.suppress(ValueError):
            value = json.loads(raw)
    allowed = "allowed: a map {account: BILLING_ACCOUNT_ID, usd: AMOUNT}"
    if not isinstance(value, dict):
        raise SpecError(f"{setting} = {raw!r}: {allowed}")
    unknown = sorted(set(value) - {"account", "usd"})
    if unknown:
        raise SpecError(f"{setting}.{unknown[0]}: not a setting; allowed: account, usd")
    account = str(value.get("account") or "").strip()
    if not BILLING_ACCOUNT.match(account):
        raise SpecError(
            f"{setting}.account {account!r}: not a billing account ID; allowed: "
            "three groups of six hex digits, e.g. 012345-6789AB-CDEF01 "
            "(`gcloud billing accounts list`)"
        )
    try:
        usd = parse_usd(str(value.get("usd", "")), f"{setting}.usd")
    except UserError as e:  # the Pulumi program's kind of error: one line, nothing declared
        raise SpecError(str(e)) from None
    if usd is None:
        raise SpecError(f"{setting}.usd is not set; allowed: US dollars above 0, e.g. 300")
    return BillingBudget(account.upper(), usd)


def guard_setting(raw: object) -> BillingBudget | None:
    """The stack's `billingBudget` (gputrain:billingBudget)."""
    return parse_billing_budget(raw, "gputrain:billingBudget")


def guard_line(budget: BillingBudget, stack: str) -> str:
    """`plan`'s line about the guard: what it does and what `up` needs for it. Pure."""
    return (
        f"Billing budget guard: ${budget.usd:,.2f} on billing account {budget.account} for the "
        f"label {STACK_LABEL}={stack}, notifying Pub/Sub topic {guard_name(stack)}; the head's "
        "watchdog ends a run with a checkpoint once Cloud Billing says the cost reached it "
        "(notifications come a few times a day and lag the usage: a coarse bound). `up` needs "
        "Billing Account Costs Manager or Administrator on that account "
        f"({', '.join(BUDGET_PERMISSIONS)}: `doctor` cannot check them) and roles/pubsub.admin "
        "on the project (`doctor` checks)."
    )


# ---- spending caps checked before anything is created: `maxHourlyCost` (the cluster's dearest rate,
# over every capacity-list rung, must not exceed it) and `budget` (what one run may cost: the
# cluster's rate times maxRunDuration, the server-side bound on every VM and Vertex job, must not
# exceed it, so the cap holds with the laptop closed) ----------------------------------------------
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
