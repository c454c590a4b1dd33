"""A launch under watch: the job runs as before (scripts/job/launch.py) while a RunMonitor looks
at it. A stall stops the job and relaunches it from its last checkpoint (the same run id: the
trainer's --resume auto finds it) while --max-restarts allows, else fails naming the node and
rank; a GPU fault fails with GpuFaultError (a stack session replaces the node instead)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from infra.base.records import Fleet
from scripts import ui
from scripts.job.follow import LineSink, say_line
from scripts.job.records import Job, JobResult, TrainingError
from scripts.transport.base import Transport
from scripts.watch.monitor import RunMonitor, record_event
from scripts.watch.settings import WatchSettings
from scripts.watch.stall import StallError
from scripts.watch.telemetry import GpuFault


class GpuFaultError(TrainingError):
    """A new Xid or uncorrectable ECC error on a node's GPU during the run."""

    def __init__(self, fault: GpuFault, cause: TrainingError) -> None:
        super().__init__(
            f"run {cause.result.run_id}: {fault} during training; the job was stopped "
            f"(the node's GPU needs replacing). Results: {cause.result.results_dir}",
            failure=dataclasses.replace(cause.failure, node=fault.node),
            result=cause.result,
        )
        self.fault = fault


class ApplicationXidError(TrainingError):
    """The job failed after its own GPU code caused an Xid (NVIDIA's catalogue: 13, 31, 43,
    45): the job's error, reported as such; the node stays, no recovery replaces it."""

    def __init__(self, xids: list[GpuFault], cause: TrainingError) -> None:
        super().__init__(
            f"{cause}\nThe GPU reported {'; '.join(x.explain() for x in xids)}: an error of "
            "the job's own GPU code (an illegal address, an out-of-range index, a killed "
            "process), not of the GPU; fix the job (CUDA_LAUNCH_BLOCKING=1 shows the failing "
            "kernel). No node was replaced.",
            failure=cause.failure,
            result=cause.result,
        )
        self.xids = xids


def watched_launch(
    fleet: Fleet,
    transports: dict[str, Transport],
    job: Job,
    results_dir: Path,
    *,
    on_line: LineSink = say_line,
) -> JobResult:
    from scripts.job.launch import launch_torchrun, stop_job

    settings = job.watch or WatchSettings()
    restarts = 0
    while True:
        set_aside_watch_dirs(results_dir)

        def stop(grace_s: float, run_id: str = job.run_id) -> None:
            stop_job(transports, run_id, grace_s=grace_s)

        monitor = RunMonitor(transports, job, settings, results_dir, stop, python=fleet.python)
        try:
            with monitor:
                return launch_torchrun(
                    fleet, transports, job, results_dir, on_line=monitor.wrap(on_line)
                )
        except TrainingError as e:
            if monitor.fault is not None:
                raise GpuFaultError(monitor.fault, e) from e
            if monitor.job_xids and monitor.stall is None:
                raise ApplicationXidError(monitor.job_xids, e) from e
            if monitor.stall is None:
                raise
            stall = monitor.stall
            if job.max_restarts < 1:
                raise StallError(
                    f"run {job.run_id} stalled and --max-restarts allows no restart "
                    f"({restarts} used): {stall.describe()}"
                ) from e
            restarts += 1
            job = dataclasses.replace(job, max_restarts=job.max_restarts - 1)
            keep_attempt_files(results_dir, f"stall{restarts}")
            record_event(results_dir, "restart", reason="stall", number=restarts)
            ui.say(
                f"run {job.run_id}: relaunching from its last checkpoint after the stall "
                f"(restart {restarts}; {job.max_restarts} left)"
            )


def keep_attempt_files(results_dir: Path, tag: str) -> None:
    """The relaunch's download would overwrite these: torchrun.log -> torchrun.<tag>.log, ..."""
    for node_dir in [p for p in results_dir.glob("*") if p.is_dir() and p.name != "stalls"]:
        for name in ("torchrun.log", "exitcode", "torchrun-logs"):
            if (node_dir / name).exists():
                stem, dot, ext = name.partition(".")
                shutil.move(node_dir / name, node_dir / f"{stem}.{tag}{dot}{ext}")


def with_stall_default(job: Job, stall_timeout_s: float | None) -> Job:
    """The target's stall timeout (the stack's stallTimeout) where the command line gave none."""
    watch = job.watch or WatchSettings()
    if watch.stall_timeout_s is not None or stall_timeout_s is None:
        return job
    return dataclasses.replace(
        job, watch=dataclasses.replace(watch, stall_timeout_s=stall_timeout_s)
    )


def set_aside_watch_dirs(results_dir: Path) -> None:
    """A relaunch downloads each node's watch/ again (a surviving node's telemetry.csv holds the
    earlier rows too, a replaced node's does not): the earlier copy becomes watch.prev<N>."""
    for old in results_dir.glob("*/watch"):
        n = len(list(old.parent.glob("watch.prev*"))) + 1
        old.rename(old.parent / f"watch.prev{n}")
