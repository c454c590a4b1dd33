"""The controller's watch over one attempt of a run: a thread that reads every node's GPU samples
and heartbeats, feeds the log lines' steps in, prints a summary every few minutes, warns about an
idle node, and on a GPU fault or a stall records it and stops the job (the caller decides what
then: relaunch, replace the node, or fail). A launch under watch: the job runs as before
(scripts/job/launch.py) under a RunMonitor; a stall relaunches it from its last checkpoint (the same
run id) while --max-restarts allows, else fails naming the node and rank; a GPU fault fails with
GpuFaultError (a stack session replaces the node instead)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from infra.base.records import Fleet
from scripts import ui
from scripts.job.download import keep_attempt_files
from scripts.job.follow import LineSink, say_line
from scripts.job.records import Job, JobResult, TrainingError
from scripts.parallel import parallel
from scripts.transport.base import Transport
from scripts.watch.node import build_dump_command, build_poll_command, parse_poll
from scripts.watch.telemetry import (
    GpuFault,
    IdleWatch,
    LogProgress,
    NodeTelemetry,
    RankState,
    Stall,
    StallClock,
    StallError,
    WatchSettings,
    parse_samples,
    rank_heartbeats,
    stuck_rank,
    summary_line,
)
from scripts.watch.xid import XidClass

FAULT_GRACE_S = 10.0  # a trainer may save a checkpoint on SIGTERM (the healthy nodes can)
STALL_GRACE_S = 3.0  # a hung job will not save: SIGKILL soon


class RunMonitor:
    """Use as a context around one launch; `wrap(on_line)` feeds it the log lines."""

    def __init__(
        self,
        transports: Mapping[str, Transport],
        job: Job,
        settings: WatchSettings,
        results_dir: Path,
        stop: Callable[[float], object],  # stop the job on every node, SIGKILL after a grace
        *,
        python: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transports, self.job, self.settings = transports, job, settings
        self.results_dir, self._stop, self.python, self.clock = results_dir, stop, python, clock
        self.nodes = {
            n: NodeTelemetry(n, keep_s=max(900.0, settings.idle_window_s)) for n in transports
        }
        self.progress = LogProgress()
        self.stall_clock = StallClock(settings.stall_timeout_s)
        self.idle = IdleWatch(settings.idle_window_s, settings.idle_below_pct)
        self.stall: Stall | None = None
        self.fault: GpuFault | None = None  # a hardware fault: the job was stopped
        self.job_xids: list[GpuFault] = []  # Xids the application caused
        self._offsets = dict.fromkeys(transports, 0)
        self._beats: dict[str, dict[str, float]] = {}
        self._node_now: dict[str, float | None] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="run-monitor")
        self._last_summary = clock()

    def __enter__(self) -> RunMonitor:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join(timeout=60)

    def wrap(self, sink: LineSink) -> LineSink:
        def line(node: str, text: str) -> None:
            sink(node, text)
            with self._lock:
                if self.progress.line(text):
                    self.stall_clock.progress(self.clock())

        return line

    # -- the loop --------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._done.wait(self.settings.poll_s):
            try:
                self.tick()
            except Exception as e:  # the watch never takes the run down
                ui.warn(f"watch: {e}")
            if self.stall is not None or self.fault is not None:
                return

    def tick(self) -> None:
        """One look at every node: samples, faults, idle nodes, heartbeats, the summary, a stall."""
        polled, _ = parallel(list(self.transports), self._poll)
        now = self.clock()
        for node, (node_now, samples, beats) in polled.items():
            faults = self.nodes[node].add(samples)
            for f in [f for f in faults if f.kind is not XidClass.HARDWARE]:
                self._note_xid(f)
            faults = [f for f in faults if f.kind is XidClass.HARDWARE]
            if faults and self.fault is None:
                self.fault = faults[0]
                ui.warn(f"GPU fault during the run: {self.fault}; stopping the job")
                self._event("gpu_fault", node=node, gpu=self.fault.gpu, what=self.fault.what)
                self._stop(FAULT_GRACE_S)
                return
            idle = self.idle.update(node, samples)
            if idle:
                ui.warn(idle)
                self._event("idle", node=node, message=idle)
            with self._lock:  # a heartbeat file new or touched since the last look (not the first)
                old = self._beats.get(node)
                if old is not None and any(v != old.get(k) for k, v in beats.items()):
                    self.stall_clock.progress(now)
            self._beats[node], self._node_now[node] = beats, node_now
        if now - self._last_summary >= self.settings.summary_every_s:
            self._last_summary = now
            with self._lock:
                ui.say(summary_line(self.nodes, self.progress))
        with self._lock:
            quiet = self.stall_clock.overdue(now)
            timeout = self.stall_clock.timeout_s
        if quiet is not None:
            self.stall = self._diagnose(quiet, timeout)
            ui.warn(f"run {self.job.run_id} stalled: {self.stall.describe()}; stopping the job")
            self._stop(STALL_GRACE_S)

    def _note_xid(self, fault: GpuFault) -> None:
        """An Xid that does not need a new node: the application's own (kept, to explain the
        job's failure), or one NVIDIA says to restart the application for or just records."""
        if fault.kind is XidClass.APPLICATION:
            self.job_xids.append(fault)
            what = "caused by the job's own GPU code, not by the GPU (no node is replaced)"
        elif fault.kind is XidClass.INFORMATIONAL:
            what = "informational, the job goes on"
        else:
            what = "NVIDIA's advice is to restart the application; the node is kept"
        ui.warn(f"{fault.explain()}: {what}")
        self._event(
            "gpu_xid", node=fault.node, gpu=fault.gpu, what=fault.what, xid_class=fault.kind.value
        )

    def _poll(self, node: str) -> tuple[float | None, list, dict[str, float]]:
        r = self.transports[node].run(build_poll_command(self.job.run_id, self._offsets[node]), 30)
        node_now, size, chunk, beats = parse_poll(r.stdout)
        complete = chunk[: chunk.rfind("\n") + 1]
        if size < self._offsets[node]:  # a new file (nothing of ours truncates it): start over
            self._offsets[node], complete = 0, ""
        else:
            self._offsets[node] += len(complete.encode())
        return node_now, parse_samples(complete), beats

    # -- a stall ---------------------------------------------------------------------------------

    def _diagnose(self, quiet: float, timeout: float) -> Stall:
        """Every rank's stack (saved under results/stalls/<n>/), and the rank that holds the rest."""
        cmd = build_dump_command(self.job.run_id, self.python, self.settings.dump_wait_s)
        dumps, errors = parallel(
            list(self.transports),
            lambda n: self.transports[n].run(cmd, self.settings.dump_wait_s + 60),
        )
        stalls_dir = self.results_dir / "stalls"
        number = len(list(stalls_dir.glob("*"))) + 1 if stalls_dir.exists() else 1
        out = stalls_dir / str(number)
        out.mkdir(parents=True, exist_ok=True)
        ranks: list[RankState] = []
        for node in self.transports:
            r = dumps.get(node)
            if r is None or not r.ok:
                why = errors.get(node) or (r.stderr.strip() if r else "") or "no answer"
                (out / f"{node}.error.txt").write_text(f"could not dump stacks: {why}\n")
                continue
            ages = rank_heartbeats(self._beats.get(node, {}), self._node_now.get(node))
            for p in json.loads(r.stdout or "[]"):
                rank = int(p["rank"])
                state = RankState(
                    node, rank, int(p["pid"]), str(p["state"]), str(p.get("stack", "")),
                    str(p.get("how", "")), ages.get(rank),
                )  # fmt: skip
                ranks.append(state)
                (out / f"{node}-rank{rank}.txt").write_text(
                    f"node {node} rank {rank} pid {state.pid} state {state.state} "
                    f"(stack by {state.how})\n\n{state.stack}"
                )
        found = stuck_rank(ranks)
        stall = Stall(
            quiet, timeout, tuple(ranks), found[0] if found else None,
            found[1] if found else "", str(out),
        )  # fmt: skip
        self._event(
            "stall",
            node=stall.stuck.node if stall.stuck else None,
            rank=stall.stuck.rank if stall.stuck else None,
            message=stall.describe(),
        )
        return stall

    def _event(self, kind: str, **fields: object) -> None:
        record_event(self.results_dir, kind, **fields)


def record_event(results_dir: Path, kind: str, **fields: object) -> None:
    """Append to results/watch-events.jsonl (the report marks them on its time axis)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    with open(results_dir / "watch-events.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "kind": kind, **fields}) + "\n")


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
