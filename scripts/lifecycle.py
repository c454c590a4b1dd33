"""The lifecycle of a job, on any target: [create ->] verify -> run -> collect [-> destroy], then the
summary. It talks to targets only through the `Target`/`Session` protocol (targets/base.py); every
step after the first resource exists runs under a teardown no failure or signal can skip.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.base.errors import GputrainError, UserError
from infra.datasets import merge_datasets
from scripts import ui
from scripts.guard import SignalGuard, signal_guard
from scripts.job.entry_check import check_entry
from scripts.job.records import DEFAULT_ENTRY, Job, JobResult, Recovery, TrainingError
from scripts.settings import Settings, new_run_id
from scripts.targets.base import RunOptions, Session, Target
from scripts.watch.report import report_after_run
from scripts.watch.settings import watch_settings

if TYPE_CHECKING:
    from scripts.job.container import ImageRef
    from scripts.job.environment import Environment, EnvironmentSettings


def run(target: Target, opts: RunOptions, settings: Settings, *, create: bool) -> JobResult | None:
    """`run` (create: the target exists only for this job, unless --keep) and `train`/
    `healthcheck` (on what exists): verify, run the job, collect; then the summary. With
    `opts.detach` it returns once the job trains (None), leaving it and its machines running.
    Each event goes to the `notify` webhooks (scripts/notify.py), never holding the run up."""
    from scripts.job.data import check_prefixes
    from scripts.notify import notifier_for, summary_fields

    started = time.monotonic()
    spec = getattr(target, "spec", None)
    if opts.detach and spec is not None and spec().on_vertex:  # before anything is created
        raise UserError("--detach: a Vertex AI stack's jobs are followed, not detached (yet)")
    healthcheck = tuple(opts.entry[:2]) == ("-m", "trainer.healthcheck")  # reads no data
    datasets = () if healthcheck else merge_datasets(target.datasets(), opts.data)
    check_prefixes(datasets)  # before anything is created: a typo costs nothing
    environment, secrets, image = job_environment(target, opts)  # bad input: before anything
    check_entry(opts.entry or DEFAULT_ENTRY, Path.cwd())  # before anything is created
    notifier = notifier_for(target, opts)
    try:
        with signal_guard() as guard:
            session_of = target.provisioned(opts, guard) if create else target.attached(opts)
            with session_of as session:
                session.verify(fabric=True)  # a multi-node GPUDirect stack proves its network
                refuse_if_busy(session, opts, target.name)
                if opts.resume is not None:
                    require_run(session, opts.resume, opts.selector or target.name)
                built = getattr(target, "built_image", None)
                if image is None and built is not None:  # `build`: made before any GPU
                    image = built(opts)
                entry = tuple(opts.entry or DEFAULT_ENTRY)
                resuming = opts.resume is not None  # started as a relaunch is: --resume-args on
                job = Job(
                    run_id=opts.resume or new_run_id(),
                    entry=(*entry, *opts.resume_args) if resuming else entry,
                    env=opts.env,
                    max_restarts=opts.max_restarts,
                    workdir=Path.cwd(),
                    datasets=datasets,
                    resume_args=() if resuming else opts.resume_args,
                    environment=environment,
                    secrets=secrets.values,
                    secret_refs=secrets.refs,
                    image=image,
                    watch=watch_settings(opts.stall_timeout_s),
                )
                results_dir = settings.results_dir(target.name, job.run_id)
                fleet = getattr(session, "fleet", None)
                notifier.base |= {"run_id": job.run_id, "nodes": fleet and len(fleet.nodes)}
                if hasattr(session, "notifier"):
                    session.notifier = notifier  # preempted / recovered
                notifier.send("started")
                if opts.detach:
                    detach(session, job, guard, opts.selector or target.name)
                    return None
                try:
                    result = session.run_job(job, results_dir, guard)
                finally:  # runs/<target>/<run-id>/report.html, also for a failed run
                    report_after_run(results_dir, session.hourly_usd, time.monotonic() - started)
        cost = summarize(result, hourly_usd=session.hourly_usd, started=started)
        found = _find_summary(result.results_dir) or {}
        notifier.send("finished", **summary_fields(found, cost))
        return result
    except GputrainError as e:
        notifier.send("failed", root_cause=root_cause_line(e))
        raise
    finally:
        notifier.close()


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
    """`--resume RUN`: one line when nothing of that run is where its checkpoints would be."""
    known = getattr(session, "has_run", None)
    if known is None or not known(run_id):
        raise UserError(
            f"--resume {run_id}: no such run on {selector} (neither its checkpoints in the "
            f"stack's bucket nor its directory on the nodes); `gputrain logs {selector}` names "
            "the last run"
        )


def detach(session: Session, job: Job, guard: SignalGuard, selector: str) -> None:
    """Start the job, return once it trains; the machines stay (autodown ends a stack's)."""
    start = getattr(session, "run_detached", None)
    if start is None:
        raise UserError(f"--detach: {session.name} cannot leave a job running on its own")
    start(job, guard)
    session.keep = True
    lines = [f"  reattach:  gputrain logs {selector} --run {job.run_id}"]
    if selector.startswith("--stack"):
        from infra.autodown import describe

        plan = getattr(getattr(session, "watchdogs", None), "plan", None)
        seconds = getattr(plan, "autodown_s", None)
        lines += [
            f"  state:     gputrain status {selector}",
            f"  end it:    gputrain down {selector}  (results home from the bucket, then teardown)",
            f"  autodown:  the VMs are deleted {describe(int(seconds))} after the job ends"
            if seconds
            else "  autodown:  off: the VMs run until `down` or their TTL",
        ]
    else:
        lines.append(f"  results:   on the machines, in .gputrain/runs/{job.run_id}/out/")
    ui.say(f"run {job.run_id} detached: it trains on without this command.\n" + "\n".join(lines))


@dataclass(frozen=True)
class JobSecrets:
    values: dict[str, str] = field(default_factory=dict, repr=False)  # sent to SSH nodes
    refs: dict[str, str] = field(default_factory=dict)  # resolved by a Vertex job itself


def job_environment(
    target: Target, opts: RunOptions
) -> tuple[Environment | None, JobSecrets, ImageRef | None]:
    """The environment the nodes prepare, the secrets' values and the image (at its digest): the
    target file's `setup`, `secrets` and `image` with the command line's; every bad input is a
    UserError here, before any resource."""
    from infra.base.errors import UserError
    from scripts.job.environment import EnvironmentSettings, plan_environment
    from scripts.job.secrets import parse_secrets, resolve_secrets, secret_references

    read = getattr(target, "environment_settings", None)
    declared: EnvironmentSettings = read() if read is not None else EnvironmentSettings()
    setup = declared.setup if opts.setup is None else opts.setup
    refs = parse_secrets(declared.secrets, f"{declared.source}secrets") + parse_secrets(
        opts.secrets, "--secret"
    )
    image_text = opts.image or declared.image  # on Vertex: containerSpec.imageUri
    build = opts.build or declared.build  # the stack target builds it (built_image)
    if build and image_text:
        from scripts.job.image_build import image_conflict

        build_key = "--build" if opts.build else f"{declared.source}build"
        raise image_conflict(build_key, "--image" if opts.image else f"{declared.source}image")
    if build and getattr(target, "built_image", None) is None:
        raise UserError(
            f"--build {build}: only for --stack targets (the image goes to the stack's "
            "Artifact Registry repository); build and push it yourself and pass --image"
        )
    # with an image: built inside it, on every node; on Vertex by the entry on every replica
    environment = plan_environment(
        Path.cwd(),
        requirements=opts.requirements,
        setup=setup,
        setup_timeout_s=opts.setup_timeout_s,
        force=opts.force_setup,
    )
    secrets: dict[str, str] = {}
    if declared.backend_without_ssh:  # the job resolves them itself: references only
        secret_refs = secret_references(refs, declared.project)
    else:
        secret_refs, secrets = {}, resolve_secrets(refs, project=declared.project)
    return environment, JobSecrets(secrets, secret_refs), declared_image(declared, opts)


def declared_image(declared: EnvironmentSettings, opts: RunOptions) -> ImageRef | None:
    """The image the target's file or --image names, at its digest (UserError for a bad
    reference, a missing image or a registry that refuses us); None without one."""
    image_text = opts.image or declared.image
    if not image_text:
        return None
    from scripts.job.container import parse_image, resolve_image

    setting = "--image" if opts.image else f"{declared.source}image"
    image = resolve_image(parse_image(image_text, setting))
    ui.say(f"image {image.repository}:{image.tag} is {image.digest}")
    return image


def verify(target: Target, opts: RunOptions) -> None:
    """The GPUs (and with --fabric the GPU network); with an image, every node can run it and
    nvidia-smi inside it sees the node's GPUs."""
    from scripts.job.environment import EnvironmentSettings

    read = getattr(target, "environment_settings", None)
    declared: EnvironmentSettings = read() if read is not None else EnvironmentSettings()
    image = None if declared.backend_without_ssh else declared_image(declared, opts)
    with target.attached(opts) as session:
        session.verify(fabric=opts.fabric)
        check = getattr(session, "verify_image", None)
        if image is not None and check is not None:
            check(image)


def logs(target: Target, run_id: str | None, opts: RunOptions, settings: Settings) -> None:
    """Follow a run's logs (default: the target's last run); reattaches to a running job."""
    with target.attached(opts) as session:
        if run_id is None and not settings.has_last_run(target.name):
            latest = getattr(session, "latest_run", None)  # another machine: ask the head
            run_id = latest() if latest is not None else None
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


def summarize(result: JobResult, *, hourly_usd: float | None, started: float) -> float | None:
    """The closing lines of a run: loss vs floor, throughput, recoveries, where results are, and
    the cost of the whole run (recoveries' lost time included), which it returns."""
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
    cost = None
    if hourly_usd is not None:
        cost = hourly_usd * elapsed / 3600
        lost = sum(r.downtime_s for r in result.recoveries)
        note = f", {lost:.0f} s of it recovering" if result.recoveries else ""
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
