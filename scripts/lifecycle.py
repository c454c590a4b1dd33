"""The lifecycle of a job, on any target: [create ->] verify -> run -> collect [-> destroy], then the
summary. It talks to targets only through the `Target`/`Session` protocol (targets/base.py); every
step after the first resource exists runs under a teardown no failure or signal can skip.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infra.base.errors import UserError
from scripts import ui
from scripts.guard import signal_guard
from scripts.job.entry_check import check_entry
from scripts.job.records import DEFAULT_ENTRY, Job, JobResult, Recovery
from scripts.settings import Settings, new_run_id
from scripts.targets.base import RunOptions, Session, Target


def run(target: Target, opts: RunOptions, settings: Settings, *, create: bool) -> JobResult:
    """`run` (create: the target exists only for this job, unless --keep) and `train`/
    `healthcheck` (on what exists): verify, run the job, collect; then the summary."""
    started = time.monotonic()
    check_entry(opts.entry or DEFAULT_ENTRY, Path.cwd())  # before anything is created
    with signal_guard() as guard:
        session_of = target.provisioned(opts, guard) if create else target.attached(opts)
        with session_of as session:
            session.verify(fabric=True)  # a multi-node GPUDirect stack proves its network first
            refuse_if_busy(session, opts, target.name)
            job = Job(
                run_id=new_run_id(),
                entry=opts.entry or DEFAULT_ENTRY,
                env=opts.env,
                max_restarts=opts.max_restarts,
                workdir=Path.cwd(),
            )
            result = session.run_job(job, settings.results_dir(target.name, job.run_id), guard)
    summarize(result, hourly_usd=session.hourly_usd, started=started)
    return result


def verify(target: Target, opts: RunOptions) -> None:
    with target.attached(opts) as session:
        session.verify(fabric=opts.fabric)


def logs(target: Target, run_id: str | None, opts: RunOptions, settings: Settings) -> None:
    """Follow a run's logs (default: the target's last run); reattaches to a running job."""
    with target.attached(opts) as session:
        session.logs(run_id or settings.last_run(target.name))


def refuse_if_busy(session: Session, opts: RunOptions, target: str) -> None:
    """Two jobs on the same GPUs slow both and may run either out of memory: a run where another
    gputrain run is still training is refused (a warning with --force)."""
    busy = session.running()
    if not busy:
        return
    where = "; ".join(f"{node}: run {', '.join(ids)}" for node, ids in busy.items())
    if opts.force:
        ui.warn(f"another gputrain run is still training ({where}); starting beside it (--force)")
        return
    first = next(iter(busy.values()))[0]
    raise UserError(
        f"another gputrain run is still training on {target} ({where}); stop it with "
        f"`gputrain stop {first}`, follow it with `gputrain logs --run {first}`, or pass --force "
        "to start beside it"
    )


def results(target: Target, run_id: str | None, opts: RunOptions, settings: Settings) -> None:
    """A run's results home, e.g. after the controller was killed (the job ran on, detached)."""
    chosen = run_id or settings.last_run(target.name)
    with target.attached(opts) as session:
        still = [n for n, ids in session.running().items() if chosen in ids]
        results_dir = session.results(chosen)
    state = f"still running on {', '.join(still)}: results so far" if still else "results"
    ui.say(f"run {chosen}: {state} in {results_dir}")


def stop(target: Target, run_id: str | None, opts: RunOptions, settings: Settings) -> None:
    """Stop a run (default: the target's last) on every node, then bring its results home."""
    chosen = run_id or settings.last_run(target.name)
    with target.attached(opts) as session:
        session.stop(chosen)
        results_dir = session.results(chosen)
    ui.say(f"run {chosen}: stopped; results in {results_dir}")


def ssh(target: Target, node: str, command: Sequence[str], opts: RunOptions) -> int:
    with target.attached(opts) as session:
        return session.ssh(node, command)


def summarize(result: JobResult, *, hourly_usd: float | None, started: float) -> None:
    """The closing lines of a run: loss vs floor, throughput, recoveries, where results are, and
    the cost of the whole run (recoveries' lost time included)."""
    elapsed = time.monotonic() - started
    summary: dict[str, Any] = _find_summary(result.results_dir) or {}
    rows: list[list[object]] = []
    for key, label, fmt in (
        ("final_loss", "final loss", "{:.4f}"),
        ("loss_floor", "loss floor (synthetic data)", "{:.4f}"),
        ("tokens_per_s", "tokens/s (steady)", "{:,.0f}"),
        ("mfu", "MFU (steady)", "{:.1%}"),
        ("wall_tokens_per_s", "tokens/s (wall clock)", "{:,.0f}"),
        ("wall_mfu", "MFU (wall clock)", "{:.1%}"),
    ):
        if isinstance(summary.get(key), int | float):
            rows.append([label, fmt.format(summary[key])])
    rows += recovery_rows(result.recoveries)
    rows += [["results", str(result.results_dir)], ["elapsed", f"{elapsed:.0f} s"]]
    if hourly_usd is not None:
        cost = hourly_usd * elapsed / 3600
        lost = sum(r.downtime_s for r in result.recoveries)
        note = f", {lost:.0f} s of it recovering" if result.recoveries else ""
        rows.append(["estimated cost", f"${cost:.2f} at ${hourly_usd:.2f}/h{note}"])
    ui.table("run summary", ["", ""], rows)


def recovery_rows(recoveries: Sequence[Recovery]) -> list[list[object]]:
    """Recoveries, downtime and steps trained twice (nothing when there were none). Pure."""
    if not recoveries:
        return []
    repeated = [r.steps_repeated for r in recoveries]
    return [
        ["recoveries", f"{len(recoveries)} ({', '.join(n for r in recoveries for n in r.nodes)})"],
        ["downtime", f"{sum(r.downtime_s for r in recoveries):.0f} s"],
        [
            "steps repeated",
            "unknown" if None in repeated else str(sum(n or 0 for n in repeated)),
        ],
    ]


def _find_summary(results_dir: Path) -> dict[str, Any] | None:
    for p in sorted(results_dir.rglob("summary.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None
