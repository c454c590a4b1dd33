"""What Cloud Billing charged for gputrain's runs: the Cloud Billing export to BigQuery (standard
usage cost table), read with the real google-cloud-bigquery client. Schema: Google's "Structure of
Standard data export" (cloud.google.com/billing/docs/how-to/export-data-bigquery-tables/
standard-usage): `labels` (REPEATED RECORD key/value: the resource's labels), `cost`, `credits`
(REPEATED RECORD, `amount` negative), `currency`, `usage_start_time`, `usage_end_time`,
`export_time`.

Attribution: a Vertex AI job carries its run's label (`gputrain-run`), so its rows are that
run's. A stack's VMs, disks and bucket carry the stack's label only (they outlive runs: `up`,
`train`, `train`, `down`); their rows are shared among the stack's runs by how much of each row's
usage interval a run's start..end covers; the rest is the stack's time between runs."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from infra.stackfile import STACK_LABEL
from scripts.cost.ledger import LedgerRecord

RUN_LABEL = "gputrain-run"  # as scripts/targets/vertex/session.py labels every job
ENDPOINT_ENV = "GPUTRAIN_BIGQUERY_ENDPOINT"  # a private endpoint; the tests' fake
#: How long BigQuery's calls are retried (the library's defaults: 10 min per call, 40 min per job):
#: an unreachable Google, or credentials it never accepts, end in one line, not a silent hang.
QUERY_RETRY_S = 60.0


@dataclass(frozen=True)
class UsageRow:
    """One row of the export, as much as attribution needs."""

    labels: dict[str, str]
    start: float  # usage_start_time, unix
    end: float  # usage_end_time
    cost: float  # cost plus its credits (credits are negative)
    currency: str


@dataclass
class Billed:
    """Per run what Cloud Billing charged, what of each stack fell between runs, and how far
    the export goes ("billing data up to T")."""

    by_run: dict[str, float] = field(default_factory=dict)
    between_runs: dict[str, float] = field(default_factory=dict)  # stack -> cost
    up_to: float | None = None
    currencies: set[str] = field(default_factory=set)

    def note(self) -> str:
        when = (
            datetime.fromtimestamp(self.up_to, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            if self.up_to is not None
            else "never (no rows exported yet)"
        )
        text = f"billed: the Cloud Billing export, billing data up to {when}"
        text += " (the export lags usage, with no latency guarantee: later usage is not in it yet)"
        other = sorted(self.currencies - {"USD"})
        if other:
            text += f"; billed in {', '.join(other)}, not USD"
        idle = {s: round(c, 2) for s, c in self.between_runs.items() if abs(c) >= 0.005}
        if idle:
            text += "; between runs (stack up, no run): " + ", ".join(
                f"{s} {c:.2f}" for s, c in sorted(idle.items())
            )
        return text


def attribute(rows: Sequence[UsageRow], records: Sequence[LedgerRecord]) -> Billed:
    """Each row's cost to the run it belongs to: by its run label, else shared by overlap of
    its usage interval with the stack's runs; the rest is the stack's time between runs. Pure."""
    billed = Billed()
    runs = {r.run_id: r for r in records}
    labelled = {_run_label(r.run_id): r.run_id for r in records}
    by_stack: dict[str, list[LedgerRecord]] = {}
    for r in records:
        if r.stack:
            by_stack.setdefault(r.stack, []).append(r)
    for row in rows:
        billed.currencies.add(row.currency)
        run = labelled.get(row.labels.get(RUN_LABEL, ""))
        if run is not None and run in runs:
            billed.by_run[run] = billed.by_run.get(run, 0.0) + row.cost
            continue
        stack = row.labels.get(STACK_LABEL)
        if stack is None:
            continue
        span = max(row.end - row.start, 1e-9)
        left = row.cost
        for r in by_stack.get(stack, []):
            overlap = max(0.0, min(row.end, r.end) - max(row.start, r.start)) / span
            if overlap > 0:
                share = row.cost * min(overlap, 1.0)
                billed.by_run[r.run_id] = billed.by_run.get(r.run_id, 0.0) + share
                left -= share
        billed.between_runs[stack] = billed.between_runs.get(stack, 0.0) + left
    return billed


def _run_label(run_id: str) -> str:
    """A run id as the label value Vertex jobs carry (scripts/targets/vertex/session.py)."""
    return re.sub(r"[^a-z0-9_-]", "_", run_id.lower())[:63]


USAGE_SQL = """SELECT labels, usage_start_time, usage_end_time, cost, credits, currency
FROM `{table}`
WHERE usage_end_time >= @since
  AND EXISTS (SELECT 1 FROM UNNEST(labels) AS l WHERE l.key = @stack_label AND l.value IN UNNEST(@stacks))"""
EXPORTED_SQL = "SELECT MAX(export_time) AS up_to FROM `{table}`"


class BillingExport:
    """The export table, read with google-cloud-bigquery (jobs.query, then getQueryResults while
    the job runs); the query runs in the table's project (bigquery.jobs.create there)."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.project = table.rsplit(".", 2)[0]

    def client(self) -> Any:
        from google.cloud import bigquery

        from infra.gcp.api import build_client

        return build_client(
            bigquery.Client, "BigQuery", os.environ.get(ENDPOINT_ENV), project=self.project
        )

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        from google.cloud import bigquery
        from google.cloud.bigquery.retry import DEFAULT_JOB_RETRY, DEFAULT_RETRY

        from infra.gcp.api import call

        client = self.client()
        config = bigquery.QueryJobConfig(query_parameters=list(params))
        return call(
            f"BigQuery {self.table}",
            lambda: list(
                client.query_and_wait(
                    sql,
                    job_config=config,
                    api_timeout=QUERY_RETRY_S / 2,  # one HTTP request
                    wait_timeout=120,
                    retry=DEFAULT_RETRY.with_timeout(QUERY_RETRY_S),
                    job_retry=DEFAULT_JOB_RETRY.with_timeout(2 * QUERY_RETRY_S),
                )
            ),
        )

    def readable(self) -> float | None:
        """The export's newest export_time (None: an empty table); GoogleApiError if unreadable."""
        rows = self._query(EXPORTED_SQL.format(table=self.table))
        up_to = rows[0]["up_to"] if rows else None
        return up_to.timestamp() if up_to is not None else None

    def billed(self, records: Sequence[LedgerRecord]) -> Billed:
        """What the export charged for these runs' stacks since the first of them began."""
        from google.cloud import bigquery

        stacks = sorted({r.stack for r in records if r.stack})
        if not stacks:
            return Billed(up_to=self.readable())
        since = datetime.fromtimestamp(min(r.start for r in records), timezone.utc)
        rows = self._query(
            USAGE_SQL.format(table=self.table),
            [
                bigquery.ScalarQueryParameter("since", "TIMESTAMP", since),
                bigquery.ScalarQueryParameter("stack_label", "STRING", STACK_LABEL),
                bigquery.ArrayQueryParameter("stacks", "STRING", stacks),
            ],
        )
        usage = [
            UsageRow(
                labels={lb["key"]: lb["value"] for lb in row["labels"] or []},
                start=row["usage_start_time"].timestamp(),
                end=row["usage_end_time"].timestamp(),
                cost=float(row["cost"] or 0)
                + sum(float(c["amount"] or 0) for c in row["credits"] or []),
                currency=str(row["currency"] or "USD"),
            )
            for row in rows
        ]
        billed = attribute(usage, records)
        billed.up_to = self.readable()
        return billed


def billing_row(table: str) -> Any:
    """`doctor`'s row for billingExport: the table answers a query (and how far it goes)."""
    from infra.gcp.api import GoogleApiError
    from scripts.doctor.row import Row

    try:
        up_to = BillingExport(table).readable()
    except GoogleApiError as e:
        if e.code is None and not e.credentials:  # never answered: nothing said about access
            return Row("billing export", "unknown", str(e), "check the network, then run again")
        fix = (
            "grant yourself roles/bigquery.dataViewer on the dataset and roles/bigquery.jobUser "
            f"on project {table.split('.')[0]}, or fix gputrain:billingExport"
        )
        return Row("billing export", "fail", str(e), fix)
    when = (
        "no rows yet"
        if up_to is None
        else "billing data up to "
        + datetime.fromtimestamp(up_to, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    )
    return Row("billing export", "ok", f"{table} is readable ({when})")
