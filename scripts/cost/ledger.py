"""runs/ledger.jsonl: one JSON record per run, appended when the run ends (success or failure), on
every target; a run resumed (`train --resume`) adds one per segment. A stack's run also writes
its record into the stack's bucket (`runs/<run-id>/ledger-<start ms>.json`, one per segment), so
`down` brings it home with the run's other small files and `gputrain cost` counts it even when
another machine ran it."""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputrain_node.contract import LEDGER_RECORD, LEDGER_RECORD_SINGLE
from scripts import ui

if TYPE_CHECKING:
    from infra.spec import ClusterSpec
    from scripts.targets.base import Session

LEDGER = "ledger.jsonl"  # under runs/
VERSION = 1
#: Compute Engine charges a VM's vCPUs, GPUs and memory for at least a minute, then by the second
#: (https://cloud.google.com/compute/vm-instance-pricing, "Billing model")
GCE_MINIMUM_S = 60.0


@dataclass(frozen=True)
class LedgerRecord:
    """One run (or segment of a resumed one): where, who, when, on what, at which price, and
    what it cost (an estimate: the price table's rate times the time from when its machines were
    up for it to its end, recoveries' downtime included, plus what its `up`'s partial creates
    billed before). A field added since is optional: an older record reads as before."""

    target: str  # runs/<target>/: "local", "hosts-<name>", "stack-<name>"
    run_id: str
    user: str
    start: float  # unix time
    end: float
    ok: bool | None  # None: the run left no job.json (interrupted before its results came home)
    nodes: int
    machine: str  # a machine type, else "local" / "hosts"
    gpus_per_node: int
    stack: str | None = None
    backend: str | None = None  # "gce", "vertex"; None off a stack
    capacity: str | None = None  # spot, on-demand, flex-start, reservation
    hourly_usd: float | None = None  # None: machines gputrain does not bill
    price_source: str | None = None
    recoveries: int = 0
    downtime_s: float = 0.0
    zones: tuple[str, ...] = ()  # where a stack's cluster ran, in order (a recovery may move it)
    partial_usd: float | None = 0.0  # VMs `up`'s partial creates made, destroyed; None: unpriced
    v: int = VERSION

    @property
    def segment(self) -> tuple[str, str, float]:
        """What tells one record from another: a resumed run is a record per segment, and the
        copies of a segment (this machine's line, the file `down` brought home) are one."""
        return self.target, self.run_id, self.start

    @property
    def elapsed_s(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def gpu_hours(self) -> float:
        return self.nodes * self.gpus_per_node * self.elapsed_s / 3600

    @property
    def billed_s(self) -> float:
        """The time its machines are charged for: on Compute Engine never under a minute."""
        return max(self.elapsed_s, GCE_MINIMUM_S) if self.backend == "gce" else self.elapsed_s

    @property
    def estimated_usd(self) -> float | None:
        """The rate over the billed time, and what the partial creates before it billed."""
        if self.hourly_usd is None:
            return None
        return self.hourly_usd * self.billed_s / 3600 + (self.partial_usd or 0.0)

    def to_json(self) -> dict[str, Any]:
        """The record as written: its fields plus the derived figures scripts read."""
        cost = self.estimated_usd
        return asdict(self) | {
            "zones": list(self.zones),  # as JSON has it
            "elapsed_s": round(self.elapsed_s, 1),
            "gpu_hours": round(self.gpu_hours, 4),
            "estimated_usd": None if cost is None else round(cost, 4),
        }

    @classmethod
    def from_json(cls, data: Any) -> LedgerRecord | None:
        """A record, or None for a line that is not one of ours (never a crash): every field of
        its type, counts and times in a range the table's arithmetic and dates can hold. Pure."""
        if not isinstance(data, dict):
            return None
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if isinstance(fields.get("zones"), list):  # JSON's array
            fields["zones"] = tuple(fields["zones"])
        try:
            record = cls(**fields)
        except TypeError:
            return None
        return record if _well_formed(record) else None


#: the latest unix time a date can show (9999-12-31 UTC); a ledger's times lie in [0, this]
LATEST_TIME = 253_402_214_400.0
#: more nodes, GPUs or recoveries than any run has: a record past it is not one of ours
MOST_COUNT = 1_000_000


def _number(v: object, most: float) -> bool:
    """A finite int or float (never a bool) in [0, most]."""
    return isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= most


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MOST_COUNT


def _well_formed(r: LedgerRecord) -> bool:
    """Every field of the type the dataclass declares, in range. Pure."""
    texts = (r.target, r.run_id, r.user, r.machine)
    optional_texts = (r.stack, r.backend, r.capacity, r.price_source)
    return (
        all(isinstance(t, str) for t in texts)
        and all(t is None or isinstance(t, str) for t in optional_texts)
        and (r.ok is None or isinstance(r.ok, bool))
        and _number(r.start, LATEST_TIME)
        and _number(r.end, LATEST_TIME)
        and _number(r.downtime_s, LATEST_TIME)
        and (r.hourly_usd is None or _number(r.hourly_usd, 1e9))
        and (r.partial_usd is None or _number(r.partial_usd, 1e9))
        and isinstance(r.zones, tuple)
        and all(isinstance(z, str) for z in r.zones)
        and all(_count(n) for n in (r.nodes, r.gpus_per_node, r.recoveries, r.v))
    )


def append(runs_dir: Path, record: LedgerRecord) -> Path:
    """One line onto runs/ledger.jsonl: one write of the whole line under an exclusive lock with
    O_APPEND, so two runs ending at once never interleave or lose a record."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    path = runs_dir / LEDGER
    line = (json.dumps(record.to_json(), sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line)
    finally:
        os.close(fd)  # releases the lock
    return path


@dataclass(frozen=True)
class Ledger:
    """What `read` found: the records, and per file how many of its lines were no record (a
    line cut short, garbage, a field of the wrong type) or why it could not be read at all."""

    records: list[LedgerRecord]
    skipped: dict[Path, int]
    unreadable: dict[Path, str]

    def problems(self) -> str | None:
        """One line on what was left out, naming each file; None when nothing was. Pure."""
        parts = [f"{n} unreadable line(s) in {p}" for p, n in self.skipped.items()]
        parts += [f"{p} ({why})" for p, why in self.unreadable.items()]
        return ("skipped " + "; ".join(parts)) if parts else None


def record_name(start: float) -> str:
    """The file of a segment's record in the bucket and the results dir (LEDGER_RECORD), named as
    the head's watchdog names it. Pure."""
    return LEDGER_RECORD.format(start_ms=round(start * 1000))


def record_files(where: Path, under: str = "") -> list[Path]:
    """The record files of a results dir (`under` "*/*/": of every results dir under runs/):
    one per segment, and the single one of an earlier gputrain."""
    names = (LEDGER_RECORD.format(start_ms="*"), LEDGER_RECORD_SINGLE)
    return sorted(p for name in names for p in where.glob(under + name))


def read(runs_dir: Path) -> Ledger:
    """Every run's records: runs/ledger.jsonl, plus the records `down` (or `results`) brought
    home from a stack's bucket that this machine's ledger lacks (runs/<target>/<run-id>/). One
    record per segment (LedgerRecord.segment): each segment of a resumed run counts."""
    found: dict[tuple[str, str, float], LedgerRecord] = {}
    skipped: dict[Path, int] = {}
    unreadable: dict[Path, str] = {}

    def records_of(path: Path, one_document: bool = False) -> list[LedgerRecord]:
        """The file's records (a run's record file: one JSON document), counting the rest."""
        try:
            text = path.read_text(errors="replace")
        except OSError as e:
            unreadable[path] = e.strerror or type(e).__name__
            return []
        lines = [t for t in ([text] if one_document else text.splitlines()) if t.strip()]
        records = list(_parse(lines))
        if len(lines) > len(records):
            skipped[path] = len(lines) - len(records)
        return records

    path = runs_dir / LEDGER
    for record in records_of(path) if path.is_file() else []:
        found[record.segment] = record
    for p in record_files(runs_dir, "*/*/"):
        for record in records_of(p, one_document=True):
            found.setdefault(record.segment, record)
    return Ledger(sorted(found.values(), key=lambda r: r.start), skipped, unreadable)


def _parse(lines: Iterable[str]) -> Iterable[LedgerRecord]:
    for line in lines:
        try:
            record = LedgerRecord.from_json(json.loads(line))
        except (ValueError, RecursionError):
            continue
        if record is not None:
            yield record


def _job_outcome(results_dir: Path) -> tuple[bool | None, int, float]:
    """(ok, recoveries, their downtime) from the run's job.json; (None, 0, 0) without one."""
    try:
        job = json.loads((results_dir / "job.json").read_text())
    except (OSError, ValueError):
        return None, 0, 0.0
    if not isinstance(job, dict):
        return None, 0, 0.0
    found = job.get("recoveries")
    recoveries = [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []
    downtime = sum(
        float(r["downtime_s"]) for r in recoveries if isinstance(r.get("downtime_s"), int | float)
    )
    ok = job.get("ok")
    return ok if isinstance(ok, bool) else None, len(recoveries), downtime


def record_of(
    spec: ClusterSpec | None,
    session: Session,
    run_id: str,
    results_dir: Path | None,
) -> LedgerRecord:
    """The run's record from the stack's spec (the machine, its capacity and price: the
    session's, of the cluster `up` made, else the run plan's) or what the session occupies
    (machines that exist), where it ran, and the job.json it left (no results dir: its job never
    started, a failure). It starts when the session's machines began to bill for the run
    (Session.billed_since), not when the command did."""
    end = time.time()
    ok, recoveries, downtime = _job_outcome(results_dir) if results_dir else (False, 0, 0.0)
    hourly, since = session.hourly_usd, session.billed_since
    spec = session.spec if session.spec is not None else spec
    used = session.footprint()
    common = dict(
        target=session.name,
        run_id=run_id,
        user=_user(),
        start=round(end if since is None else min(since, end), 3),
        end=round(end, 3),
        ok=ok,
        hourly_usd=hourly,
        recoveries=recoveries,
        downtime_s=round(downtime, 1),
        zones=used.zones,
        partial_usd=session.partial_usd,
    )
    if spec is not None:
        return LedgerRecord(**common, **_stack_fields(spec, hourly))  # type: ignore[arg-type]
    return LedgerRecord(
        **common,  # type: ignore[arg-type]
        nodes=used.nodes,
        machine=used.machine,
        gpus_per_node=used.gpus_per_node,
    )


def _stack_fields(spec: Any, hourly: float | None) -> dict[str, Any]:
    """What a stack's record says of its cluster and its price (a ClusterSpec)."""
    from infra.offers import price_table
    from infra.plan import price_basis

    source = price_table().source.split(",")[0]
    return dict(
        nodes=spec.nodes,
        machine=spec.machine_type,
        gpus_per_node=spec.gpus_per_node,  # built into G2/A2/A3 or attached (N1)
        stack=spec.stack,
        backend=spec.backend,
        capacity=spec.capacity,
        price_source=f"{source}; {price_basis(spec)}" if hourly is not None else None,
    )


def launch_record(
    target: str, spec: Any, start: float, zone: str, partial_usd: float | None = 0.0
) -> dict[str, Any]:
    """A stack run's record as its launch knows it (no run id, end or outcome yet): the head's
    watchdog completes it and puts it in the bucket (record_name) when it sees the end of a run
    no controller is there to record (a detached one); `down` brings it home. Its cluster in
    `zone` for now (with_zone: a recovery may move it), at the rate its budget counts."""
    from infra.disk_prices import cluster_hourly

    hourly = cluster_hourly(spec)
    record = LedgerRecord(
        target=target,
        run_id="",
        user=_user(),
        start=round(start, 3),
        end=round(start, 3),
        ok=None,
        hourly_usd=hourly,
        zones=(zone,),
        partial_usd=partial_usd,
        **_stack_fields(spec, hourly),
    )
    return record.to_json()


def with_zone(record: dict[str, Any], zone: str) -> dict[str, Any]:
    """A launch record (launch_record) whose cluster is in `zone` now: added to its zones
    unless it is the last of them already. Pure."""
    zones = list(record.get("zones") or ())
    return record | {"zones": zones if zones[-1:] == [zone] else [*zones, zone]}


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def record_run(spec: ClusterSpec | None, session: Session, run_id: str, results_dir: Path) -> None:
    """The lifecycle's one call when a run ends, success or failure: the record onto
    runs/ledger.jsonl, beside the results and, for a stack, into its bucket, as a file of its
    own (an earlier segment's stays). A failure here is a warning, never the run's."""
    try:
        record = record_of(spec, session, run_id, results_dir)
        append(results_dir.parent.parent, record)
        results_dir.mkdir(parents=True, exist_ok=True)
        path = results_dir / record_name(record.start)
        path.write_text(json.dumps(record.to_json(), sort_keys=True) + "\n")
        where = session.ledger_bucket()
        if where is not None:
            storage, bucket, prefix = where
            storage.upload(bucket, f"{prefix}runs/{run_id}/{path.name}", path)
    except Exception as e:
        ui.warn(f"could not add run {run_id} to the cost ledger: {e}")


def record_unstarted(
    spec: ClusterSpec | None, session: Session, run_id: str, runs_home: Callable[[], Path]
) -> None:
    """A run whose machines were up but whose job never started (verification failed, the
    machines were busy, Ctrl-C): its time on them, `ok: false`, onto runs/ledger.jsonl only (it
    has no results dir). A failure here is a warning, never the run's."""
    try:
        append(runs_home(), record_of(spec, session, run_id, None))
    except Exception as e:
        ui.warn(f"could not add run {run_id} to the cost ledger: {e}")
