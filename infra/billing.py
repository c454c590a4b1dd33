"""Money settings, checked before anything is asked or created: the Cloud Billing export table
(PROJECT.DATASET.TABLE) `gputrain cost` reads billed figures from, and amounts in US dollars
(`budget`, `maxHourlyCost`). Pure."""

from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal

from infra.base.errors import UserError
from infra.stackfile import STACK_LABEL, SpecError

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


#: A decimal number as people write one: ASCII digits and one point. float() also takes other
#: scripts' digits ('١٠٠'), underscores ('1_000'), exponents and 'inf'.
DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
#: An amount of money: a decimal, or one with an exponent (1e3), as YAML writes a number. A stack
#: file's `budget: 1e3` reaches the program as "1000" (schema.scalar_text), so `--budget 1e3` and
#: `budget: '1e3'` mean the same: one rule wherever an amount is written.
AMOUNT = re.compile(rf"(?:{DECIMAL.pattern})(?:[eE][+-]?[0-9]+)?")


def parse_usd(text: str, setting: str, *, unset: bool = True) -> float | None:
    """A positive amount of US dollars; "" is unset (a key's default) where `unset` allows it.
    Blank text, or anything else, is one line naming the setting: never "no budget" by accident."""
    if text == "" and unset:
        return None
    amount = text.strip().removeprefix("$")
    value = float(amount) if AMOUNT.fullmatch(amount) else math.nan
    if not math.isfinite(value) or value <= 0:
        raise UserError(
            f"{setting} {text!r}: not an amount; allowed: US dollars above 0, e.g. 300 or 2.5"
        )
    return value


def usd_text(amount: float) -> str:
    """An amount as the user may type it back, in plain decimals: 0.0000001 (never 1e-07),
    1000, 2.1. Pure."""
    text = format(Decimal(repr(amount)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


#: `billingBudget`'s keys: the Cloud Billing account (its ID, 012345-6789AB-CDEF01) and the amount.
BILLING_ACCOUNT = re.compile(r"^[0-9A-F]{6}-[0-9A-F]{6}-[0-9A-F]{6}$", re.IGNORECASE)
#: What creating the budget needs on the billing account (not testable on the project): Billing
#: Account Costs Manager or Administrator (docs/guides/cost.md cites Google's page).
BUDGET_PERMISSIONS = (
    "billing.budgets.create",
    "billing.budgets.get",
    "billing.budgets.update",
    "billing.budgets.delete",
    "billing.budgets.list",  # the sweep finds a leftover budget by its display name
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
