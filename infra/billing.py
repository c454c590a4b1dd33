"""The Cloud Billing export table a stack's or `gputrain cost`'s billed figures come from:
PROJECT.DATASET.TABLE, checked before anything asks BigQuery. Pure."""

from __future__ import annotations

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
