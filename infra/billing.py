"""Money settings, checked before anything is asked or created: the Cloud Billing export table
(PROJECT.DATASET.TABLE) `gputrain cost` reads billed figures from, and amounts in US dollars
(`budget`, `maxHourlyCost`). Pure."""

from __future__ import annotations

import math
import re

from infra.base.errors import UserError

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
