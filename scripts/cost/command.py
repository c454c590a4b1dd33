"""`gputrain cost`: the ledger's runs as a table with totals, grouped by run, stack or day, since a
time; `--json` for scripts; `--billing TABLE` adds what Cloud Billing charged (billing.py)."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from infra.base.errors import UserError
from scripts import ui
from scripts.cost.ledger import LedgerRecord
from scripts.settings import Settings

GROUPINGS = ("run", "stack", "day")
SINCE = re.compile(r"^([0-9]+)([mhdw])$")
UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float) -> float:
    """--since: 30m, 12h, 7d, 2w back from now, or a date YYYY-MM-DD (UTC); the unix time. Pure."""
    m = SINCE.match(text.strip())
    if m and int(m.group(1)) > 0:
        return now - int(m.group(1)) * UNIT_S[m.group(2)]
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise UserError(
            f"--since {text!r}: not a time; allowed: a count and a unit (30m, 12h, 7d, 2w) or a "
            "date YYYY-MM-DD (UTC)"
        ) from None


def day(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")


def group_key(record: LedgerRecord, by: str) -> str:
    """What a row of `--by` groups on. Pure."""
    if by == "stack":
        return record.stack or record.target
    if by == "day":
        return day(record.start)
    return f"{record.target}/{record.run_id}"


@dataclass
class Group:
    """The sum of some runs' records (a resumed run has one per segment, each counted; it is one
    run); `estimated_usd` None only when none of them was priced."""

    key: str
    runs: int = 0
    gpu_hours: float = 0.0
    elapsed_s: float = 0.0
    recoveries: int = 0
    downtime_s: float = 0.0
    estimated_usd: float | None = None
    unpriced: int = 0  # runs on machines gputrain does not bill (local, hosts) or unknown prices
    billed_usd: float | None = None
    seen: set[tuple[str, str]] = field(default_factory=set)  # (target, run id) counted

    def add(self, r: LedgerRecord, billed: dict[str, float] | None = None) -> None:
        """`billed`: run id -> USD, the whole run's (added with its first record)."""
        first = (r.target, r.run_id) not in self.seen
        self.seen.add((r.target, r.run_id))
        self.runs = len(self.seen)
        self.gpu_hours += r.gpu_hours
        self.elapsed_s += r.elapsed_s
        self.recoveries += r.recoveries
        self.downtime_s += r.downtime_s
        cost = r.estimated_usd
        if cost is None:
            self.unpriced += 1
        else:
            self.estimated_usd = (self.estimated_usd or 0.0) + cost
        if first and billed is not None and r.run_id in billed:
            self.billed_usd = (self.billed_usd or 0.0) + billed[r.run_id]

    def to_json(self) -> dict[str, Any]:
        def money(v: float | None) -> float | None:
            return None if v is None else round(v, 4)

        return {
            "key": self.key,
            "runs": self.runs,
            "gpu_hours": round(self.gpu_hours, 4),
            "elapsed_s": round(self.elapsed_s, 1),
            "recoveries": self.recoveries,
            "downtime_s": round(self.downtime_s, 1),
            "estimated_usd": money(self.estimated_usd),
            "unpriced_runs": self.unpriced,
            "billed_usd": money(self.billed_usd),
        }


def select(
    records: Sequence[LedgerRecord], *, target: str | None, since: float | None
) -> list[LedgerRecord]:
    """The records of one target (None: all) that ended at or after `since`. Pure."""
    return [
        r
        for r in records
        if (target is None or r.target == target) and (since is None or r.end >= since)
    ]


def group(
    records: Sequence[LedgerRecord], by: str, billed: dict[str, float] | None = None
) -> tuple[list[Group], Group]:
    """The rows of `--by` in time order and the total. `billed`: run id -> USD. Pure."""
    rows: dict[str, Group] = {}
    total = Group("total")
    for r in records:
        rows.setdefault(group_key(r, by), Group(group_key(r, by))).add(r, billed)
        total.add(r, billed)
    return list(rows.values()), total


def usd(v: float | None) -> str:
    return "-" if v is None else f"${v:,.2f}"


def cost_command(
    records: Sequence[LedgerRecord],
    *,
    target: str | None,
    since: str | None,
    by: str,
    as_json: bool,
    billing: str | None = None,
    source: str = "runs/ledger.jsonl",
) -> None:
    """Print the table and totals (or the JSON) of the ledger's runs; with `billing` (the
    export table) what Cloud Billing charged next to the estimate. `source`: where the records
    came from, for the line that says there are none."""
    from infra.billing import parse_table

    start = parse_since(since, time.time()) if since else None
    table_name = parse_table(billing, "--billing") if billing else None
    chosen = select(records, target=target, since=start)
    billed: dict[str, float] | None = None
    billing_note = None
    if table_name is not None:
        from scripts.cost.billing import BillingExport

        found = BillingExport(table_name).billed(chosen)
        billed, billing_note = found.by_run, found.note()
    rows, total = group(chosen, by, billed)
    if as_json:
        doc: dict[str, Any] = {
            "by": by,
            "runs": [r.to_json() | {"billed_usd": (billed or {}).get(r.run_id)} for r in chosen],
            "groups": [g.to_json() for g in rows],
            "total": total.to_json(),
        }
        if billing_note is not None:
            doc["billing"] = billing_note
        print(json.dumps(doc, indent=2))
        return
    if not chosen:
        ui.say("cost: no runs in the ledger" + (f" for {target}" if target else "") +
               (f" since {since}" if since else "") + f" ({source})")  # fmt: skip
        return
    header = [by, "when (UTC)" if by == "run" else "runs", "nodes x machine", "GPU-h",
              "recoveries", "estimated"] + (["billed"] if billed is not None else [])  # fmt: skip
    by_key: dict[str, LedgerRecord] = {}  # a run's first record: when it started
    for r in chosen:
        by_key.setdefault(group_key(r, by), r)

    def row(g: Group, first: str, shape: str) -> list[object]:
        recovered = f"{g.recoveries} ({g.downtime_s:.0f} s)" if g.recoveries else "0"
        cells: list[object] = [g.key, first, shape, f"{g.gpu_hours:.2f}", recovered]
        cells.append(usd(g.estimated_usd))
        return cells + ([usd(g.billed_usd)] if billed is not None else [])

    table: list[list[object]] = []
    for g in rows:
        r = by_key[g.key]
        if by == "run":
            when = datetime.fromtimestamp(r.start, timezone.utc).strftime("%Y-%m-%d %H:%M")
            shape = f"{r.nodes} x {r.machine}" + (f" ({r.capacity})" if r.capacity else "")
            table.append(row(g, when, shape))
        else:
            table.append(row(g, str(g.runs), ""))
    table.append(row(total, str(total.runs), ""))
    ui.table("cost" + (f" since {since}" if since else ""), header, table)
    notes = ["estimated: the price table's rate x the machines' time (recoveries included)"]
    if total.unpriced:
        notes.append(f"{total.unpriced} run(s) on machines gputrain does not bill: no estimate")
    if billing_note:
        notes.append(billing_note)
    ui.say("; ".join(notes))


def add_arguments(c: argparse.ArgumentParser) -> None:
    """`cost`'s options (the target's --stack/--hosts/--local: the parser's own)."""
    c.add_argument(
        "--since",
        metavar="WHEN",
        help="only runs that ended since: 30m, 12h, 7d, 2w back, or a date YYYY-MM-DD (UTC)",
    )
    c.add_argument(
        "--by",
        choices=GROUPINGS,
        default="run",
        help="one row per run (default), per stack (or target) or per day",
    )
    c.add_argument("--json", action="store_true", help="the records and totals as JSON")
    c.add_argument(
        "--billing",
        metavar="PROJECT.DATASET.TABLE",
        help="also what Cloud Billing charged, per run, from its BigQuery export (the standard "
        "usage cost table; default with --stack: its billingExport)",
    )


def cost_from_args(args: argparse.Namespace, settings: Settings, target: Callable[[], Any]) -> None:
    """`gputrain cost`: the runs of the target given (--stack, --hosts, --local; else all),
    billed from --billing or the stack's billingExport. `target` opens the target (only for
    --hosts, or a --stack whose file is here: a stack that is gone still has its runs)."""
    from scripts.cost.ledger import LEDGER, read
    from scripts.settings import RUNS_DIR_ENV

    hosts = getattr(args, "hosts", None)
    name = (
        f"stack-{args.stack}"
        if args.stack
        else "local"
        if getattr(args, "local", False)
        else target().name
        if hosts
        else None
    )
    billing = args.billing
    stack_file = settings.root / f"Pulumi.{args.stack}.yaml" if args.stack else None
    if billing is None and stack_file is not None and stack_file.is_file():
        spec = target().declared().spec  # the stack file's billingExport
        billing = spec.billing_export if spec is not None else None
    runs = settings.runs_dir
    if runs.exists() and not runs.is_dir():
        raise UserError(
            f"results directory {runs}: not a directory; allowed: the directory runs went to "
            f"(--runs-dir, {RUNS_DIR_ENV})"
        )
    ledger = read(runs)
    if problems := ledger.problems():
        ui.warn(f"cost: {problems}: not counted")
    source = str(runs / LEDGER) if runs.is_dir() else f"{runs} does not exist"
    cost_command(
        ledger.records, target=name, since=args.since, by=args.by, as_json=args.json,
        billing=billing, source=source,
    )  # fmt: skip
