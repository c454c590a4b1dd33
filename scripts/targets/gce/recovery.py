"""A spot run survives preemption: the `--stack` session relaunches the same run after GCE takes a
node back.

When a job fails, the Compute API is asked whether a node was preempted — a
`compute.instances.preempted` operation since the attempt began, or (within the VMs' lifetime) the
instance STOPPING/TERMINATED or gone. If so: the other nodes' torchrun is stopped, the preempted VMs
are re-created (`refresh` + `up`, same zone first, then the failover order), their new host keys
pinned, the GPUs verified, and the SAME run id relaunched: its checkpoints live under
gs://<bucket>/runs/<run-id>/checkpoints/, where the trainer's `--resume auto` finds them. A plain
crash is still a crash: it fails at once with its root cause.
"""

from __future__ import annotations

import datetime
import functools
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from infra.base.errors import GputrainError
from infra.base.records import Fleet
from infra.gcp.compute import ComputeApi, ComputeApiError
from scripts import ui
from scripts.guard import Interrupted, SignalGuard
from scripts.job.download import write_job_record
from scripts.job.follow import say_line
from scripts.job.progress import StepWatch
from scripts.job.records import (
    CHECKPOINT_URI_ENV,
    WATCH_PREEMPTION_ENV,
    Job,
    JobResult,
    Recovery,
    TrainingError,
)
from scripts.settings import Settings

if TYPE_CHECKING:
    from scripts.verify.fabric import FabricCheck
from infra.outputs import StackOutputs
from scripts.targets.session import FleetSession

GONE_STATES = ("STOPPING", "TERMINATED")
STOPPED_WITH_CHECKPOINT = re.compile(r"stopped at step \d+ with a checkpoint")
TTL_MARGIN_S = 120.0  # a VM this close to maxRunDuration that vanishes was deleted by its TTL
Recreate = Callable[[str], tuple[Fleet, StackOutputs]]  # (zone to try first) -> the new cluster


class RecoveryError(GputrainError):
    """A preempted run could not be recovered (none left, or the re-creation failed)."""


@dataclass(frozen=True)
class NodeCloudState:
    """What the Compute API says about one node."""

    name: str
    status: str | None  # None: the instance is gone
    preempted_at: str | None  # insertTime of a preemption operation during this attempt

    @property
    def evidence(self) -> str:
        if self.preempted_at:
            return f"compute.instances.preempted at {self.preempted_at}"
        return "instance deleted" if self.status is None else f"instance {self.status}"


def preempted_nodes(
    states: Sequence[NodeCloudState], *, ttl_over: bool
) -> dict[str, NodeCloudState]:
    """The nodes GCE took back: a preemption operation, or (before the TTL could have done it)
    an instance stopping, stopped or deleted. Pure."""
    return {
        s.name: s
        for s in states
        if s.preempted_at or (not ttl_over and (s.status is None or s.status in GONE_STATES))
    }


def looks_stopped(error: TrainingError) -> bool:
    """The node that failed first was killed, lost, or stopped early with a checkpoint (SIGTERM
    or the preemption notice): what a preemption looks like from the node, worth waiting for the
    Compute API to catch up. (Nodes we stopped after it are collateral, not evidence.)"""
    return error.failure.kind in ("killed", "lost") or any(
        STOPPED_WITH_CHECKPOINT.search(line) for line in error.failure.root_cause
    )


def unix_time(rfc3339: str | None, default: float) -> float:
    if not rfc3339:
        return default
    try:
        return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def checkpoint_uri(bucket: str | None, run_id: str) -> str | None:
    """Where a run's checkpoints go under the stack's `gs://<bucket>/<prefix>` (the layout Vertex's
    AIP_CHECKPOINT_DIR has too). Pure."""
    return f"{bucket}runs/{run_id}/checkpoints/" if bucket else None


class StackNodes:
    """The Compute API's view of a stack's VMs, and the way back after a preemption."""

    def __init__(
        self,
        api: ComputeApi,
        outputs: StackOutputs,
        *,
        spot: bool,
        ttl_s: int,
        recreate: Recreate,
        bucket: str | None = None,  # gs://<bucket>/<prefix>, where runs/<run-id>/ go
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api, self.outputs, self.spot, self.ttl_s = api, outputs, spot, ttl_s
        self.bucket = bucket
        self._recreate, self.clock, self.sleep = recreate, clock, sleep
        self.created_at = clock()  # the TTL runs from here (the survivors' start, conservatively)

    def job_env(self, run_id: str) -> dict[str, str]:
        env = {}
        uri = checkpoint_uri(self.bucket, run_id)
        if uri:
            env[CHECKPOINT_URI_ENV] = uri
        if self.spot:
            env[WATCH_PREEMPTION_ENV] = "1"
        return env

    def states(self, since: float) -> list[NodeCloudState]:
        project = self.outputs.project
        ops = {}
        for zone in sorted({n.zone for n in self.outputs.nodes}):
            for p in self.api.preemptions(project, zone):
                if unix_time(p.at, 0.0) >= since - 5:
                    ops[p.instance] = p.at
        return [
            NodeCloudState(
                n.name, self.api.instance_status(project, n.zone, n.name), ops.get(n.name)
            )
            for n in self.outputs.nodes
        ]

    def preempted(
        self, since: float, *, wait_s: float, poll_s: float = 2.0
    ) -> dict[str, NodeCloudState]:
        """The preempted nodes; asks again for up to `wait_s` while there are none yet."""
        end = self.clock() + wait_s
        while True:
            ttl_over = self.clock() - self.created_at >= self.ttl_s - TTL_MARGIN_S
            found = preempted_nodes(self.states(since), ttl_over=ttl_over)
            if found or self.clock() >= end:
                return found
            self.sleep(poll_s)

    def recreate(self, names: Sequence[str], *, gone_deadline_s: float = 300.0) -> Fleet:
        """Wait until GCE has deleted the preempted VMs (an `up` would keep a STOPPING one), then
        re-create the cluster; `outputs` are the new cluster's."""
        project, end = self.outputs.project, self.clock() + gone_deadline_s
        for node in [n for n in self.outputs.nodes if n.name in names]:
            while self.api.instance_status(project, node.zone, node.name) is not None:
                if self.clock() > end:
                    raise RecoveryError(
                        f"{node.name} is still there {gone_deadline_s:.0f} s after its preemption "
                        "(GCE deletes preempted spot VMs of this stack): not re-creating it"
                    )
                self.sleep(1.0)
        fleet, self.outputs = self._recreate(self.outputs.zone)
        return fleet


@dataclass
class _Pending:
    """A recovery whose relaunch has not trained a step yet; finished (and its one line said)
    at the relaunch's first step, or when that attempt ends."""

    number: int
    limit: int
    nodes: tuple[str, ...]
    at: float  # when GCE preempted (its operation), else when it was noticed
    reached: int | None  # the last step seen before
    zone: str = ""
    record: Recovery | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def finish(self, watch: StepWatch) -> Recovery:
        with self._lock:
            if self.record is None:
                end = watch.first_step_at or watch.clock()
                start = watch.start_step
                repeated = (
                    max(0, self.reached - start)
                    if self.reached is not None and start is not None
                    else None
                )
                self.record = Recovery(
                    self.nodes, self.at, end - self.at, self.zone, start, repeated
                )
                ui.say(recovery_line(self.record, self.number, self.limit))
            return self.record


def recovery_line(r: Recovery, number: int, limit: int) -> str:
    """The one line a recovery prints. Pure."""
    when = time.strftime("%H:%M:%S", time.localtime(r.preempted_at))
    step = "an unknown step" if r.resumed_from is None else f"step {r.resumed_from}"
    again = "" if r.steps_repeated is None else f" ({r.steps_repeated} step(s) trained again)"
    return (
        f"recovery {number}/{limit}: {', '.join(r.nodes)} preempted at {when}; training again "
        f"{r.downtime_s:.0f} s later in {r.zone}, resumed from {step}{again}"
    )


def keep_attempt_logs(results_dir: Path, attempt: int) -> None:
    """The next attempt's download would overwrite (or trip over) these: torchrun.log ->
    torchrun.attempt1.log, exitcode -> exitcode.attempt1, torchrun-logs -> torchrun-logs.attempt1."""
    for node_dir in [p for p in results_dir.glob("*") if p.is_dir()]:
        for name in ("torchrun.log", "exitcode", "torchrun-logs"):
            if (node_dir / name).exists():
                stem, dot, ext = name.partition(".")
                shutil.move(node_dir / name, node_dir / f"{stem}.attempt{attempt}{dot}{ext}")


class RecoveringSession(FleetSession):
    """The session of a `--stack` target: FleetSession plus the bucket's env for the job and, on
    spot, recovery from up to `max_recoveries` preemptions."""

    def __init__(
        self,
        fleet: Fleet,
        settings: Settings,
        nodes: StackNodes,
        *,
        max_recoveries: int,
        hourly_usd: float | None = None,
        keep: bool = False,
        confirm_s: float = 60.0,
        connect_deadline_s: float | None = None,
        fabric: FabricCheck | None = None,
    ) -> None:
        super().__init__(
            fleet,
            settings,
            hourly_usd=hourly_usd,
            keep=keep,
            connect_deadline_s=connect_deadline_s,
            fabric=fabric,
        )
        self.nodes, self.max_recoveries, self.confirm_s = nodes, max_recoveries, confirm_s

    def run_job(self, job: Job, results_dir: Path, guard: SignalGuard) -> JobResult:
        from scripts.job.launch import launch_torchrun

        job = replace(job, env={**self.nodes.job_env(job.run_id), **job.env})
        watch = StepWatch()
        done: list[Recovery] = []
        pending: _Pending | None = None

        def line(node: str, text: str) -> None:
            say_line(node, text)
            watch.line(node, text)

        try:
            while True:
                started = time.time()
                try:
                    result = launch_torchrun(
                        self.fleet, self.transports, job, results_dir, on_line=line
                    )
                    if pending is not None:
                        done.append(pending.finish(watch))
                    if done:
                        result = replace(result, recoveries=tuple(done))
                        write_job_record(result)
                    return result
                except TrainingError as e:
                    if pending is not None:
                        done.append(pending.finish(watch))
                        pending = None
                        write_job_record(replace(e.result, recoveries=tuple(done)))
                    preempted = self._preempted(e, started)
                    if not preempted:
                        raise
                    if len(done) >= self.max_recoveries:
                        raise self._exhausted(job, preempted, len(done)) from e
                    now = time.time()
                    at = min(unix_time(s.preempted_at, now) for s in preempted.values())
                    pending = _Pending(
                        len(done) + 1, self.max_recoveries, tuple(preempted), at, watch.reached
                    )
                    watch.new_attempt(functools.partial(pending.finish, watch))
                    pending.zone = self._recover(preempted, job, results_dir, len(done) + 1)
        except BaseException:
            self._stop(guard, job.run_id)
            raise

    def _preempted(self, error: TrainingError, since: float) -> dict[str, NodeCloudState]:
        """The nodes GCE took back during this attempt (asking only about spot VMs)."""
        if not self.nodes.spot:
            return {}
        try:
            return self.nodes.preempted(since, wait_s=self.confirm_s if looks_stopped(error) else 0)
        except ComputeApiError as e:
            ui.warn(f"could not ask the Compute API whether a node was preempted: {e}")
            return {}

    def _exhausted(
        self, job: Job, preempted: Mapping[str, NodeCloudState], done: int
    ) -> RecoveryError:
        what = ", ".join(f"{n} ({s.evidence})" for n, s in preempted.items())
        return RecoveryError(
            f"run {job.run_id}: GCE preempted {what} and --max-recoveries "
            f"{self.max_recoveries} allows no more recoveries ({done} done). Its newest checkpoint is in "
            f"{job.env.get(CHECKPOINT_URI_ENV) or 'the nodes out dirs'} and comes home "
            "with the results"
        )

    def _recover(
        self, preempted: Mapping[str, NodeCloudState], job: Job, results_dir: Path, number: int
    ) -> str:
        """Stop the survivors, re-create the cluster, pin, verify; the zone it is in now."""
        from scripts.job.launch import stop_job

        names = list(preempted)
        ui.say(
            f"{', '.join(names)} preempted ({'; '.join(s.evidence for s in preempted.values())}): recovering "
            f"({number}/{self.max_recoveries}), the other node(s) stop, the VMs are re-created"
        )
        survivors = [n for n in (self._transports or {}) if n not in preempted]
        if self._transports and survivors:
            stop_job(self._transports, job.run_id, only=survivors)
        self.close()
        keep_attempt_logs(results_dir, number)
        try:
            self.fleet = self.nodes.recreate(names)
            # fresh VMs boot: the long wait, also when this session attached to running ones
            self.connect_deadline_s = max(self.connect_deadline_s, self.settings.connect_deadline_s)
            self.verify(fabric=True)  # fresh VMs: their GPU network is set up again
        except Interrupted:
            raise
        except GputrainError as e:
            raise RecoveryError(
                f"recovery {number}/{self.max_recoveries} of run {job.run_id} failed: {e}"
            ) from e
        return self.nodes.outputs.zone

    def _stop(self, guard: SignalGuard, run_id: str) -> None:
        """Failed or interrupted: nothing may keep running on machines that stay up (only the
        connections open now: a re-creation in progress is not waited for)."""
        from scripts.job.launch import stop_job

        if self._transports:
            with guard.teardown():
                stop_job(self._transports, run_id)
