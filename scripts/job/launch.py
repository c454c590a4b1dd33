"""Run one job on a connected fleet: upload the code, start torchrun detached on every node, follow
it to the end, bring the results home. Returns a JobResult or raises TrainingError naming the node
that failed first and how (job/records.py), so a caller (a spot recovery) can decide what to do.
"""

from __future__ import annotations

import dataclasses
import shlex
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from infra.base.records import Fleet
from scripts import ui
from scripts.job.download import download_results, write_job_record
from scripts.job.follow import LineSink, follow_job, say_line
from scripts.job.node_scripts import (
    STORAGE_PACKAGES,
    Requirement,
    build_install_command,
    build_node_command,
    build_start_command,
    build_stop_command,
)
from scripts.job.records import CHECKPOINT_URI_ENV, Job, JobResult, TrainingError, validate_job
from scripts.job.sync import check_size, collect_sources, sync_code
from scripts.parallel import parallel
from scripts.transport.base import Transport, TransportError

TRAINER_DIR = Path(__file__).resolve().parent.parent.parent / "trainer"


def launch_torchrun(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    job: Job,
    results_dir: Path,
    *,
    on_line: LineSink = say_line,
    reconnect_deadline_s: float = 120.0,
    stop_grace_s: float = 10.0,
    settle_s: float = 2.0,
) -> JobResult:
    """Upload, start detached on every node, stream prefixed logs until all end; on the first
    failure stop the others and raise TrainingError (results are still downloaded)."""
    validate_job(job)
    start = time.monotonic()
    upload_code(fleet, transports, job)
    if job.env.get(CHECKPOINT_URI_ENV, "").startswith("gs://"):
        ensure_packages(fleet, transports, STORAGE_PACKAGES, "the trainer's gs:// checkpoints")
    start_job(fleet, transports, job, stop_grace_s=stop_grace_s)

    stopped: dict[str, str] = {}  # node -> how its stop went ("error: ..." when it failed)
    stoppers: list[threading.Thread] = []

    def stop(names: list[str]) -> None:
        t = threading.Thread(
            target=_stop_quietly,
            args=(transports, job.run_id, names, stop_grace_s, stopped),
            daemon=True,
        )
        t.start()
        stoppers.append(t)

    outcome = follow_job(
        transports,
        job,
        stop,
        on_line=on_line,
        reconnect_deadline_s=reconnect_deadline_s,
        settle_s=settle_s,
    )
    for t in stoppers:  # a stop of an unreachable node ends with its own timeout
        t.join(timeout=stop_grace_s + 30)
    duration = time.monotonic() - start
    names = [n.name for n in fleet.nodes]
    exit_codes = {n: outcome.states[n].exit_code for n in names}
    failure = outcome.failure
    download_results(transports, job.run_id, results_dir)
    ok = failure is None and all(c == 0 for c in exit_codes.values())
    result = JobResult(
        job.run_id,
        ok,
        exit_codes,
        duration,
        results_dir,
        failure.node if failure else None,
        failure.root_cause if failure else (),
    )
    write_job_record(result)
    if failure is not None:
        raise TrainingError(
            f"run {job.run_id} failed on node {failure.node} (exit code {failure.code_text}); "
            f"{_stop_summary(stopped, failure.node, exit_codes)}. Root cause:\n"
            + "\n".join(f"  {ln}" for ln in failure.root_cause)
            + f"\nlogs and results: {results_dir}",
            failure=failure,
            result=result,
        )
    if not ok:
        bad = {n: c for n, c in exit_codes.items() if c != 0}
        node = next(iter(bad))
        raise TrainingError(
            f"run {job.run_id} did not complete ({', '.join(f'{n}={c}' for n, c in bad.items())}); "
            f"results: {results_dir}",
            failure=outcome.states[node].failure(),
            result=result,
        )
    ui.say(
        f"run {job.run_id} completed on {len(names)} node(s) in {duration:.1f} s; "
        f"results in {results_dir}"
    )
    return result


def upload_code(fleet: Fleet, transports: Mapping[str, Transport], job: Job) -> None:
    """Collect the code once, check its size, sync it to every node in parallel."""
    packages = {"trainer": TRAINER_DIR} if job.include_trainer else {}
    if job.workdir is None:
        files = {}
        for name, pkg in packages.items():
            files.update({f"{name}/{k}": v for k, v in collect_sources(pkg).items()})
        base = TRAINER_DIR
    else:
        files = collect_sources(job.workdir, packages)
        base = job.workdir
    total = check_size(files, job.max_upload_mib, base)
    start = time.monotonic()

    def one(name: str) -> str:
        with tempfile.TemporaryDirectory(prefix="gputrain-upload-") as tmp:
            plan = sync_code(transports[name], files, remote_dir=job.code_dir, staging=Path(tmp))
        return f"{len(plan.send)} changed, {len(plan.delete)} removed"

    names = [n.name for n in fleet.nodes]
    results, errors = parallel(names, one)
    if errors:
        raise TransportError(
            "upload failed:\n" + "\n".join(f"  {n}: {e}" for n, e in errors.items())
        )
    summary = ", ".join(f"{n}: {results[n]}" for n in names)
    ui.say(
        f"uploaded {len(files)} file(s), {total / 1048576:.1f} MiB, to {len(names)} node(s) in "
        f"{time.monotonic() - start:.1f} s ({summary})"
    )


def ensure_packages(
    fleet: Fleet, transports: Mapping[str, Transport], needs: Sequence[Requirement], why: str
) -> None:
    """Install on every node what `fleet.python` cannot import yet (a no-op probe where all is
    there); a node where that fails is named with pip's last lines."""
    cmd = build_install_command(fleet.python, needs)
    wanted = ", ".join(req for _, req in needs)

    def one(name: str) -> str:
        r = transports[name].run(cmd, 1800)  # torch's CUDA wheels are large
        if not r.ok:
            raise TransportError(
                f"node {name}: {fleet.python} cannot import {wanted} and pip could not install "
                f"it ({why}): " + " | ".join((r.stdout + r.stderr).strip().splitlines()[-3:])
            )
        return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "present"

    names = [n.name for n in fleet.nodes]
    results, errors = parallel(names, one)
    if errors:
        raise TransportError("\n".join(str(e) for e in errors.values()))
    for name in names:
        if results[name].startswith("installed"):
            ui.say(
                f"{name}: installed{results[name][len('installed') :]} for {fleet.python} ({why})"
            )


def start_job(
    fleet: Fleet, transports: Mapping[str, Transport], job: Job, *, stop_grace_s: float = 10.0
) -> None:
    """The same run.sh on every node (c10d assigns ranks), started detached; if any node fails
    to start, the others are stopped again."""
    names = [n.name for n in fleet.nodes]
    if job.rdzv_port is None:  # every run its own c10d store, also beside another run
        job = dataclasses.replace(
            job, rdzv_port=free_port(transports[fleet.head.name], fleet.python)
        )
    nproc = job.nproc_per_node or (1 if fleet.expect.is_cpu else fleet.expect.count)
    script = build_node_command(
        job,
        nnodes=len(names),
        nproc_per_node=nproc,
        head_address=fleet.head.internal_address,
        python=fleet.python,
    )

    def start_one(name: str) -> str:
        start = build_start_command(job.run_id, job.code_dir)
        r = transports[name].run(start, 60, stdin=script.encode())
        if not r.ok or not r.stdout.strip().isdigit():
            raise TransportError(f"node {name}: could not start: {r.stderr.strip() or r.stdout}")
        return r.stdout.strip()

    pgids, errors = parallel(names, start_one)
    if errors:
        stop_job(transports, job.run_id, grace_s=stop_grace_s)
        raise TransportError("\n".join(str(e) for e in errors.values()))
    ui.say(
        f"run {job.run_id} started on {len(names)} node(s), rendezvous on port {job.rdzv_port} "
        f"({', '.join(f'{n}: pgid {pgids[n]}' for n in names)})"
    )


def free_port(head: Transport, python: str) -> int:
    """A TCP port nothing listens on now, asked of the head (where the c10d store will listen)."""
    code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    r = head.run(f"{shlex.quote(python)} -c {shlex.quote(code)}", timeout=30)
    port = r.stdout.strip()
    if not r.ok or not port.isdigit():
        raise TransportError(f"node {head.name}: could not pick a free port: {r.stderr.strip()}")
    return int(port)


def stop_job(
    transports: Mapping[str, Transport],
    run_id: str,
    *,
    grace_s: float = 10.0,
    only: list[str] | None = None,
) -> dict[str, str]:
    """Stop the run on every node (or `only` these): TERM, then SIGKILL after grace_s."""
    names = only if only is not None else list(transports)
    if not names:
        return {}
    cmd = build_stop_command(run_id, grace_s)

    def one(name: str) -> str:
        r = transports[name].run(cmd, timeout=grace_s + 15)
        return r.stdout.strip() or f"exit {r.exit_code}"

    results, errors = parallel(names, one)
    out = {**results, **{n: f"error: {e}" for n, e in errors.items()}}
    ui.say(f"stop {run_id}: " + ", ".join(f"{n} {out[n]}" for n in names))
    return out


def _stop_quietly(
    transports: Mapping[str, Transport],
    run_id: str,
    names: list[str],
    grace_s: float,
    outcomes: dict[str, str],
) -> None:
    try:
        outcomes.update(stop_job(transports, run_id, grace_s=grace_s, only=names))
    except Exception as e:
        outcomes.update({n: f"error: {e}" for n in names})
        ui.warn(f"stopping run {run_id}: {e}")


def _stop_summary(
    outcomes: Mapping[str, str], failed: str, exit_codes: Mapping[str, int | None] | None = None
) -> str:
    """What the stop did, never more: which nodes stopped, which could not be stopped, and which
    had ended by themselves before any stop (with their exit codes)."""
    bad = {n: o.removeprefix("error: ") for n, o in outcomes.items() if o.startswith("error:")}
    done = [n for n, o in outcomes.items() if not o.startswith("error:") and n != failed]
    ended = {n: c for n, c in (exit_codes or {}).items() if n != failed and n not in outcomes}
    parts = [f"stopped {', '.join(done)}"] if done else []
    if ended:
        codes = ", ".join(f"{n} exit code {'none' if c is None else c}" for n, c in ended.items())
        parts.append(f"the other node(s) had ended already ({codes})")
    parts += [
        f"could NOT stop the job on {n} ({why}): it may still be running there"
        for n, why in bad.items()
    ]
    return "; ".join(parts) or "no other node to stop"
