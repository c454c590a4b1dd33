"""The lifecycle of a job, on any target: plan -> provision -> verify -> run -> summary. The plan
(run_plan.py) checks every input before anything exists; the lifecycle talks to targets only
through the `Target`/`Session` protocol (targets/base.py), and every step after the first resource
exists runs under a teardown no failure or signal can skip.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from infra.base.errors import GputrainError, UserError
from scripts import ui
from scripts.cost.ledger import record_run, record_unstarted
from scripts.job.download import keep_previous_attempt
from scripts.job.records import BudgetReached, Job, JobResult, Recovery, TrainingError
from scripts.notify import Notifier
from scripts.run_plan import RunPlan, declared_image, plan_run, warn_unrelaunchable
from scripts.settings import Settings
from scripts.targets.base import Feature, RunOptions, Session, SignalGuard, Target, signal_guard
from scripts.watch.report import report_after_run
from scripts.watch.telemetry import log_progress


def run(target: Target, opts: RunOptions, settings: Settings, *, create: bool) -> JobResult | None:
    """`run` (create: the target exists only for this job, unless --keep) and `train`/
    `healthcheck` (on what exists): plan -> provision -> verify -> run -> summary. With
    `opts.detach` it returns once the job trains (None), leaving it and its machines running.
    Each event goes to the `notify` webhooks (scripts/notify.py), never holding the run up."""
    started = time.monotonic()  # the command's own wall clock; cost counts from billed_since
    plan = plan_run(target, opts, settings, create=create)  # every check before anything exists
    notifier = Notifier(plan.notify, {"stack": plan.label})
    try:
        with signal_guard() as guard, provisioned(plan, guard) as session:
            try:
                job = verified_job(plan, session, settings, notifier)
                if opts.detach:
                    detach(plan, session, job, guard, settings)
                    return None
            except BaseException:  # the machines' time is in the ledger, as a failed run's
                record_unstarted(plan.spec, session, plan.run_id, settings.runs_home)
                raise
            result = run_job(plan, session, job, guard)
        summary(plan, result, session, started, notifier)
        return result
    except BudgetReached as e:
        fields = {"spent_usd": e.spent_usd, "budget_usd": e.budget_usd}
        line = f"stopped at {e.what}: ${e.spent_usd:.2f} of ${e.budget_usd:.2f}"
        notifier.send("budget", detail=line, **fields)
        raise
    except GputrainError as e:
        notifier.send("failed", root_cause=root_cause_line(e))
        raise
    finally:
        notifier.close()


def provisioned(plan: RunPlan, guard: SignalGuard) -> AbstractContextManager[Session]:
    """The target's session: made for this run (torn down after it unless kept) or attached."""
    if plan.create:
        return plan.target.provisioned(plan.opts, guard)
    return plan.target.attached(plan.opts, for_run=True)


def verified_job(plan: RunPlan, session: Session, settings: Settings, notifier: Notifier) -> Job:
    """What must hold on the machines before the job starts (proven, not busy, the run to
    resume there), the job in its image, its results dir (recorded as the target's last run:
    `logs` reattaches to it) and the `started` event."""
    session.verify(fabric=True)  # a multi-node GPUDirect stack proves its network
    refuse_if_busy(session, plan.opts, plan.selector)
    if plan.opts.resume is not None:
        require_run(session, plan.opts.resume, plan.selector)
        keep_previous_attempt(session.transports, plan.opts.resume, plan.results_dir)
    image = plan.image  # `build`: made before any GPU (on a stack that is up: now)
    if plan.build is not None:
        image = plan.target.built_image(plan.opts)
    settings.results_dir(plan.target.name, plan.run_id)
    notifier.base |= {"run_id": plan.run_id, "nodes": session.node_count}
    session.notifier = notifier  # preempted / recovered
    notifier.send("started")
    return plan.job(image)


def run_job(plan: RunPlan, session: Session, job: Job, guard: SignalGuard) -> JobResult:
    """Launch, follow, collect into runs/<target>/<run-id>/; its report, also for a failed run."""
    try:
        return session.run_job(job, plan.results_dir, guard)
    finally:
        record_run(plan.spec, session, plan.run_id, plan.results_dir)  # the ledger
        report_after_run(plan.results_dir, session.hourly_usd, billed_s(session))


def billed_s(session: Session) -> float:
    """How long the session's machines have billed for this run (Session.billed_since): not
    the plan, the prompt, an image build or a wait for capacity before they were made."""
    since = session.billed_since
    return 0.0 if since is None else max(0.0, time.time() - since)


def summary(
    plan: RunPlan, result: JobResult, session: Session, started: float, notifier: Notifier
) -> None:
    """The closing table, and `finished` with its figures."""
    from scripts.notify import summary_fields

    cost = summarize(
        result,
        hourly_usd=session.hourly_usd,
        started=started,
        billed_s=billed_s(session),
        partial_usd=session.partial_usd,
    )
    found = _find_summary(result.results_dir) or {}
    notifier.send("finished", **summary_fields(found, cost))


def root_cause_line(error: GputrainError) -> str:
    """The one line a `failed` notification carries: the failing rank's exception (the rule of
    scripts/job/diagnosis.py), else the root cause's or the error's last line. Pure."""
    from scripts.job.diagnosis import exception_line

    failure = error.failure if isinstance(error, TrainingError) else None
    lines = list(failure.root_cause) if failure and failure.root_cause else str(error).splitlines()
    found = exception_line(lines) if failure else None
    if found:
        return found[:500]
    return next((ln.strip()[:500] for ln in reversed(lines) if ln.strip()), type(error).__name__)


def require_run(session: Session, run_id: str, selector: str) -> None:
    """`--resume RUN`: one line when nothing of that run is where its checkpoints would be (a
    stack's bucket or its nodes; machines that exist: their run directories)."""
    if not session.has_run(run_id):
        raise UserError(
            f"--resume {run_id}: no such run on {selector} (nothing of it where the target keeps "
            f"a run's checkpoints); `gputrain logs {selector}` names the last run"
        )


def detach(
    plan: RunPlan, session: Session, job: Job, guard: SignalGuard, settings: Settings
) -> None:
    """Start the job, return once it trains; the machines stay (autodown ends a stack's)."""
    session.run_detached(job, guard)
    session.keep = True
    selector = plan.selector
    lines = [f"  reattach:  gputrain logs {selector} --run {job.run_id}"]
    if Feature.AUTODOWN in plan.target.capabilities:
        from infra.autodown import describe

        seconds = plan.autodown_s
        lines += [
            f"  state:     gputrain status {selector}",
            f"  end it:    gputrain down {selector}  (results home from the bucket, then teardown)",
            f"  autodown:  the VMs are deleted {describe(int(seconds))} after the job ends"
            if seconds
            else "  autodown:  off: the VMs run until `down` or their TTL",
        ]
    elif Feature.SSH not in plan.target.capabilities:  # a managed job (Vertex AI): no machines
        lines += [
            f"  state:     gputrain status {selector}",
            "  results:   the reattached `logs` brings them home once the job ends",
            f"  cancel:    gputrain stop {selector} {job.run_id}  (`gputrain down {selector}`: "
            "cancels it, results home, then teardown)",
        ]
    elif plan.target.name == "local":  # the node is this machine: its real out dir
        from scripts.node_layout import run_dir

        out = settings.local_node_root / run_dir(job.run_id) / "out"
        lines.append(
            f"  results:   in {out}/; `gputrain results {selector} {job.run_id}` brings them home"
        )
    else:
        lines.append(f"  results:   on the machines, in .gputrain/runs/{job.run_id}/out/")
    ui.say(f"run {job.run_id} detached: it trains on without this command.\n" + "\n".join(lines))


def plan(
    target: Target, opts: RunOptions, *, export: str | None = None, force: bool = False
) -> None:
    """`plan`: what `run` refuses about the target file's `secrets` and `image` is refused here
    too (names, references, a NAME unset here, an image reference's form; neither Secret
    Manager nor the registry is asked), then the target's own plan; with `export`, the job the
    next run submits, as a file (Feature.EXPORT_JOB: a Vertex job spec for gcloud)."""
    from scripts.job.container import parse_image
    from scripts.job.environment import parse_secrets, resolve_secrets
    from scripts.run_plan import refuse_unused_with_job_file

    if export is None and force:  # both only shape the exported file
        raise UserError(
            "plan --force: only with --export FILE (it replaces an existing FILE); "
            "add --export FILE or remove --force"
        )
    if export is None and opts.entry:
        raise UserError(
            f"plan -- {' '.join(opts.entry)}: ENTRY is only used with --export FILE (the "
            "exported Vertex job's entry); add --export FILE or remove the ENTRY"
        )
    if export is not None:
        target.capabilities.require(Feature.EXPORT_JOB, f"--export {export}")
        if not export.strip() or os.path.isdir(export):  # else: 'exists', or ignored when ''
            why = "a directory" if export.strip() else "empty"
            raise UserError(f"--export {export!r}: {why}; allowed: the name of the file to write")
        if os.path.exists(export) and not force:  # a name too long: writing it says why
            raise UserError(f"--export {export}: the file exists; add --force to replace it")
    declared = target.declared()
    env = declared.environment
    refuse_unused_with_job_file(declared, opts)
    if env.image:
        parse_image(env.image, f"{env.source}image")
    refs = parse_secrets(env.secrets, f"{env.source}secrets")
    if not env.backend_without_ssh:  # a Vertex job reads its secrets itself
        resolve_secrets([r for r in refs if r.sm_secret is None], project=env.project)
        refs += parse_secrets(opts.secrets, "--secret")
        in_sm = [r.name for r in refs if r.sm_secret is not None]
        warn_unrelaunchable(target.capabilities, [r.name for r in refs], in_sm)
    target.plan()
    if export is None:
        return
    from scripts.job.records import DEFAULT_ENTRY
    from scripts.run_plan import job_environment
    from scripts.settings import new_run_id

    environment, secrets = job_environment(env, opts)
    job = Job(
        run_id=new_run_id(),
        entry=opts.entry or DEFAULT_ENTRY,
        workdir=Path.cwd(),
        datasets=declared.datasets,
        environment=environment,
        secret_refs=secrets.refs,
        image=declared_image(env, opts),
    )
    target.export_job(job, Path(export), force=force)  # type: ignore[attr-defined]


def verify(target: Target, opts: RunOptions) -> None:
    """The GPUs (and with --fabric the GPU network); with an image, every node can run it and
    nvidia-smi inside it sees the node's GPUs."""
    env = target.declared().environment
    image = declared_image(env, opts) if Feature.SSH in target.capabilities else None
    with target.attached(opts) as session:
        session.verify(fabric=opts.fabric)
        if image is not None:
            session.verify_image(image)


def logs(target: Target, run_id: str | None, opts: RunOptions, settings: Settings) -> None:
    """Follow a run's logs (default: the target's last run); reattaches to a running job."""
    with target.attached(opts) as session:
        if run_id is None and not settings.has_last_run(target.name):
            run_id = session.latest_run()  # another machine: ask the head
        session.logs(run_id or settings.last_run(target.name))


def refuse_if_busy(session: Session, opts: RunOptions, selector: str) -> None:
    """Two jobs on the same GPUs slow both and may run either out of memory: a run where another
    gputrain run is still training is refused (a warning with --force), naming the commands
    with the target as the user gave it (`--stack dev`), so they can be pasted."""
    busy = session.running()
    if not busy:
        return
    where = "; ".join(f"{node}: run {', '.join(ids)}" for node, ids in busy.items())
    if opts.force:
        ui.warn(f"another gputrain run is still training ({where}); starting beside it (--force)")
        return
    first = next(iter(busy.values()))[0]
    raise UserError(
        f"another gputrain run is still training on {selector} ({where}); stop it with "
        f"`gputrain stop {selector} {first}`, follow it with `gputrain logs {selector} --run "
        f"{first}`, or pass --force to start beside it"
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


def summarize(
    result: JobResult,
    *,
    hourly_usd: float | None,
    started: float,
    billed_s: float | None = None,
    partial_usd: float | None = 0.0,
) -> float | None:
    """The closing lines of a run: loss vs floor, throughput, recoveries, where results are, the
    command's wall clock (`started`, monotonic) and the cost of the machines' time for the run
    (`billed_s`; None: the wall clock), recoveries' lost time included, with what `up`'s partial
    creates billed for it before (`partial_usd`), which it returns."""
    elapsed = time.monotonic() - started
    billed = elapsed if billed_s is None else billed_s
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
    if not rows:  # not our trainer's summary: what its log shows
        rows += [list(r) for r in log_progress(result.results_dir, result.exit_codes)]
    rows += recovery_rows(result.recoveries)
    rows += [["results", str(result.results_dir)], ["elapsed (the command)", f"{elapsed:.0f} s"]]
    cost = None
    if hourly_usd is not None:
        cost = hourly_usd * billed / 3600 + (partial_usd or 0.0)
        lost = sum(r.downtime_s for r in result.recoveries)
        note = f", {lost:.0f} s of it recovering" if result.recoveries else ""
        if partial_usd:
            note += f"; ${partial_usd:.2f} more for what `up`'s partial creates billed"
        rows.append(["billed time (the machines)", f"{billed:.0f} s"])
        rows.append(["estimated cost", f"${cost:.2f} at ${hourly_usd:.2f}/h{note}"])
    ui.table("run summary", ["", ""], rows)
    return cost


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
