"""A run survives GCE taking a node away: the `--stack` session relaunches the same run after a
spot preemption, or a host error or host maintenance that terminated a VM of any capacity.

When a job fails, the Compute API is asked whether GCE ended a node — a
`compute.instances.preempted`, `...hostError` or `...terminateOnHostMaintenance` operation since
the attempt began, or (spot VMs within their lifetime) the instance STOPPING/TERMINATED or gone.
If so: the other nodes' torchrun is stopped, the preempted VMs
are re-created (`refresh` + `up`, same zone first, then the failover order), their new host keys
pinned, the GPUs verified, and the SAME run id relaunched: its checkpoints live under
gs://<bucket>/runs/<run-id>/checkpoints/, where the trainer's `--resume auto` finds them. A plain
crash is still a crash: it fails at once with its root cause.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.base.errors import GputrainError
from infra.base.records import Fleet
from infra.gcp.compute import (
    HOST_ERROR,
    HOST_MAINTENANCE,
    PREEMPTED,
    ComputeApi,
    ComputeApiError,
    unix_time,
)
from scripts import ui
from scripts.job.autodown import Autodown, RunBudget, Watchdogs, budget_reached
from scripts.job.data_io import checkpoint_uri, output_env
from scripts.job.download import keep_attempt_files, results_missing, write_job_record
from scripts.job.follow import say_line
from scripts.job.records import (
    CHECKPOINT_URI_ENV,
    TENSORBOARD_DIR_ENV,
    WATCH_MAINTENANCE_ENV,
    WATCH_PREEMPTION_ENV,
    BudgetReached,
    Job,
    JobResult,
    Recovery,
    TrainingError,
)
from scripts.settings import Settings
from scripts.targets.base import Footprint, Interrupted, SignalGuard
from scripts.watch.telemetry import StepWatch

if TYPE_CHECKING:
    from infra.spec import ClusterSpec
    from scripts.targets.gce.manifest import ControllerHold
    from scripts.verify.nodes import FabricCheck
from infra.outputs import StackOutputs
from scripts.targets.session import FleetSession

GONE_STATES = ("STOPPING", "TERMINATED")
STOPPED_WITH_CHECKPOINT = re.compile(r"stopped at step \d+ with a checkpoint")
TTL_MARGIN_S = 120.0  # a VM this close to maxRunDuration that vanishes was deleted by its TTL
#: (the cluster, the nodes to re-create: every other one stands untouched) -> the new one
Recreate = Callable[[StackOutputs, Sequence[str]], tuple[Fleet, StackOutputs]]
#: What each of GCE's terminations is called in the lines a recovery prints.
CAUSES = {
    PREEMPTED: "preempted",
    HOST_ERROR: "lost to a host error",
    HOST_MAINTENANCE: "terminated for host maintenance",
}


class RecoveryError(GputrainError):
    """A preempted run could not be recovered (none left, or the re-creation failed);
    `results_missing` as the failed attempt's TrainingError had it (the teardown keeps the
    bucket for them)."""

    results_missing: dict[str, str] = {}  # noqa: RUF012 (replaced, never changed in place)


@dataclass(frozen=True)
class NodeCloudState:
    """What the Compute API says about one node."""

    name: str
    status: str | None  # None: the instance is gone
    preempted_at: str | None  # insertTime of GCE's termination operation during this attempt
    event: str = PREEMPTED  # that operation's type (TERMINATIONS)
    fault: str | None = None  # a GPU fault during training (scripts/watch): replaced like a loss

    @property
    def evidence(self) -> str:
        if self.fault:
            return self.fault
        if self.preempted_at:
            return f"{self.event} at {self.preempted_at}"
        return "instance deleted" if self.status is None else f"instance {self.status}"

    def ended(self, node: str) -> str:
        """`GCE preempted NODE`, `a host error ended NODE`, `host maintenance ended NODE`."""
        return {
            "lost to a host error": f"a host error ended {node}",
            "terminated for host maintenance": f"host maintenance ended {node}",
            "lost to a GPU fault": f"a GPU fault ended {node}",
        }.get(self.cause, f"GCE preempted {node}")

    @property
    def cause(self) -> str:
        """preempted / lost to a host error / terminated for host maintenance / lost to a GPU
        fault."""
        if self.fault:
            return "lost to a GPU fault"
        return CAUSES.get(self.event, "preempted") if self.preempted_at else "preempted"


def preempted_nodes(
    states: Sequence[NodeCloudState], *, ttl_over: bool, spot: bool = True
) -> dict[str, NodeCloudState]:
    """The nodes GCE took away: a termination operation (preempted, host error, maintenance),
    or, on spot before the TTL could have done it, an instance stopping, stopped or deleted
    (without an operation an on-demand VM gone is not GCE's doing). Pure."""
    return {
        s.name: s
        for s in states
        if s.preempted_at
        or (spot and not ttl_over and (s.status is None or s.status in GONE_STATES))
    }


def looks_stopped(error: TrainingError) -> bool:
    """The node that failed first was killed, lost, or stopped early with a checkpoint (SIGTERM
    or the preemption notice): what a preemption looks like from the node, worth waiting for the
    Compute API to catch up. (Nodes we stopped after it are collateral, not evidence.)"""
    return error.failure.kind in ("killed", "lost") or any(
        STOPPED_WITH_CHECKPOINT.search(line) for line in error.failure.root_cause
    )


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
        stack: str = "",
        automatic_restart: bool = True,  # ClusterSpec.automatic_restart
    ) -> None:
        self.api, self.outputs, self.spot, self.ttl_s = api, outputs, spot, ttl_s
        self.bucket, self.stack, self.automatic_restart = bucket, stack, automatic_restart
        self._recreate, self.clock, self.sleep = recreate, clock, sleep
        self.created_at = clock()  # the TTL runs from here (the survivors' start, conservatively)
        self.zones = [outputs.zone]  # where the cluster ran, in order (its cost record's)
        # (instance, insertTime, type) of the terminations a recovery was started for: each is
        # counted once, whatever GCE's clock says against ours
        self.counted: set[tuple[str, str, str]] = set()

    @property
    def deadline(self) -> float:
        """The run's TTL from its first launch: never renewed (not_recreating), nor outlived."""
        return self.created_at + self.ttl_s

    def job_env(self, run_id: str) -> dict[str, str]:
        env = {WATCH_MAINTENANCE_ENV: "1"}  # any GCE VM: checkpoint on a maintenance notice
        uri = checkpoint_uri(self.bucket, run_id)
        if uri:
            env[CHECKPOINT_URI_ENV] = uri
            env[TENSORBOARD_DIR_ENV] = uri.removesuffix("checkpoints/") + "tensorboard/"
        if self.spot:
            env[WATCH_PREEMPTION_ENV] = "1"
        return env

    def states(self, since: float) -> list[NodeCloudState]:
        project = self.outputs.project
        ops: dict[str, tuple[str, str]] = {}
        for zone in sorted({n.zone for n in self.outputs.nodes}):
            for t in self.api.terminations(project, zone):
                if (t.instance, t.at, t.kind) in self.counted:
                    continue  # a VM of that name ended before: its new one may run fine
                if unix_time(t.at, 0.0) >= since - 5:
                    ops[t.instance] = (t.at, t.kind)
        return [
            NodeCloudState(
                n.name,
                self.api.instance_status(project, n.zone, n.name),
                *ops.get(n.name, (None, PREEMPTED)),
            )
            for n in self.outputs.nodes
        ]

    def preempted(
        self, since: float, *, wait_s: float, poll_s: float = 2.0
    ) -> dict[str, NodeCloudState]:
        """The preempted nodes; asks again for up to `wait_s` while there are none yet. An
        operation found once is not found again: `since` is our clock, the operation's time
        GCE's, and a lagging laptop clock made the first preemption look like a second one."""
        end = self.clock() + wait_s
        while True:
            ttl_over = self.clock() - self.created_at >= self.ttl_s - TTL_MARGIN_S
            found = preempted_nodes(self.states(since), ttl_over=ttl_over, spot=self.spot)
            if found or self.clock() >= end:
                self.counted |= {
                    (s.name, s.preempted_at, s.event) for s in found.values() if s.preempted_at
                }
                return found
            self.sleep(poll_s)

    def delete(self, name: str) -> None:
        """Delete a node's VM (its GPU failed): the re-creation below brings a new one."""
        node = next(n for n in self.outputs.nodes if n.name == name)
        self.api.delete_instance(self.outputs.project, node.zone, node.name)

    def recreate(
        self, lost: Mapping[str, NodeCloudState | None], *, gone_deadline_s: float = 300.0
    ) -> Fleet:
        """Wait until GCE has deleted the preempted VMs (an `up` would keep a STOPPING one) — or,
        after a host error or maintenance, until it deleted or restarted them (automatic restart
        brings an on-demand VM back RUNNING). A VM GCE will not restart (spot, flex-start,
        compact placement) that such an event left TERMINATED is deleted here: it would stay
        so, and `up` would keep it. Then re-create the cluster (`up` keeps what stands untouched:
        the nodes not lost, those GCE restarted; a lost one of unknown state, None, is neither
        waited for nor kept); `outputs` are the new cluster's."""
        project, end = self.outputs.project, self.clock() + gone_deadline_s
        known, restarted = {n: s for n, s in lost.items() if s is not None}, set[str]()
        for node in [n for n in self.outputs.nodes if n.name in known]:
            host_event = known[node.name].cause != "preempted"
            back = ("RUNNING",) if host_event else ()
            while (status := self.api.instance_status(project, node.zone, node.name)) is not None:
                if status in back:
                    restarted.add(node.name)
                    break
                if status == "TERMINATED" and host_event and not self.automatic_restart:
                    ui.say(
                        f"{node.name}: {known[node.name].cause}, left TERMINATED (no automatic "
                        "restart on this stack): deleting it for the re-creation"
                    )
                    self.api.delete_instance(project, node.zone, node.name)
                    continue
                if self.clock() > end:
                    raise RecoveryError(
                        f"{node.name} is still {status} {gone_deadline_s:.0f} s after GCE "
                        f"{known[node.name].cause.replace('lost to', 'reported')}: not "
                        "re-creating it (run `gputrain down` to end the stack)"
                    )
                self.sleep(1.0)
        gone = [n for n in lost if n not in restarted]
        fleet, self.outputs = self._recreate(self.outputs, gone)  # its zone first, its image
        if self.outputs.zone != self.zones[-1]:  # the cluster moved (another zone had room)
            self.zones.append(self.outputs.zone)
        return fleet


@dataclass
class _Pending:
    """A recovery whose relaunch has not trained a step yet; finished (and its one line said)
    at the relaunch's first step, or when that attempt ends."""

    number: int
    limit: int
    nodes: tuple[str, ...]
    cause: str  # preempted / lost to a host error / terminated for host maintenance
    at: float  # when GCE preempted (its operation), else when it was noticed
    reached: int | None  # the last step seen before
    zone: str = ""
    record: Recovery | None = None
    announce: Callable[[str], object] | None = None  # the recovery line to the webhooks
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
                    self.nodes, self.at, end - self.at, self.zone, start, repeated, self.cause,
                    unit=watch.unit,
                )  # fmt: skip
                ui.say(line := recovery_line(self.record, self.number, self.limit, self.cause))
                if self.announce is not None:
                    self.announce(line)
            return self.record


def recovery_line(r: Recovery, number: int, limit: int, cause: str = "preempted") -> str:
    """The one line a recovery prints. Pure."""
    when = time.strftime("%H:%M:%S", time.localtime(r.preempted_at))
    step = "an unknown step" if r.resumed_from is None else f"{r.unit} {r.resumed_from}"
    again = "" if r.steps_repeated is None else f" ({r.steps_repeated} {r.unit}(s) trained again)"
    return (
        f"recovery {number}/{limit}: {', '.join(r.nodes)} {cause} at {when}; training again "
        f"{r.downtime_s:.0f} s later in {r.zone}, resumed from {step}{again}"
    )


class RecoveringSession(FleetSession):
    """The session of a `--stack` target: FleetSession plus the bucket's env for the job and
    recovery from up to `max_recoveries` nodes GCE took away (preempted, host error, maintenance)."""

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
        stall_timeout_s: float | None = None,
        autodown: Autodown | None = None,
        spec: ClusterSpec | None = None,  # the cluster's, as `up` made it: its cost record's
        partial_usd: float | None = 0.0,  # what `up`'s partial creates billed for the run
    ) -> None:
        super().__init__(
            fleet,
            settings,
            hourly_usd=hourly_usd,
            keep=keep,
            connect_deadline_s=connect_deadline_s,
            fabric=fabric,
            stall_timeout_s=stall_timeout_s,
        )
        self.nodes, self.max_recoveries, self.confirm_s = nodes, max_recoveries, confirm_s
        self.spec, self.partial_usd = spec, partial_usd
        self.billed_since = nodes.created_at  # as the budget's and the watchdog's record count
        self.holds_lease = True  # the laptop's controller; a reconciler's pass holds its own
        head = lambda: (self._transports or {}).get(self.fleet.head.name)  # noqa: E731
        self.watchdogs = Watchdogs(autodown, head) if autodown is not None else None

    def verify(self, fabric: bool = False) -> None:
        """As any fleet's, with an earlier run's autodown held off from the first connection
        (Watchdogs.hold): everything from here to this run's own watchdogs may take a while."""
        if self.watchdogs is not None:
            self.watchdogs.hold(self.transports[self.fleet.head.name])
        super().verify(fabric)

    def __exit__(self, *exc: Any) -> None:
        if self.watchdogs is not None:  # the controller lets go: the head's switch starts
            # counting; unless the cluster stays, its watchdogs end first (the bucket goes next)
            self.watchdogs.stop(None if self.keep else self._transports, results_missing(exc[1]))
        super().__exit__(*exc)

    def footprint(self) -> Footprint:
        """The fleet, and the zones its cluster ran in, in order: a recovery may move it."""
        return replace(super().footprint(), zones=tuple(self.nodes.zones))

    def ledger_bucket(self) -> tuple[Any, str, str] | None:
        """(storage, bucket, prefix) where the run's cost-ledger record goes (scripts/cost)."""
        if not self.nodes.bucket:
            return None
        from infra.gcp.gcs import StorageApi

        bucket, _, prefix = self.nodes.bucket.removeprefix("gs://").partition("/")
        return StorageApi(self.nodes.outputs.project), bucket, prefix

    def run_detached(self, job: Job, guard: SignalGuard) -> float:
        """`--detach`: the job with the bucket's env and the watchdogs armed, left running once
        it trains; its manifest in the bucket and the lease let go, so `gputrain reconcile`
        (the stack's Cloud Run job, or any machine) recovers it from then on."""
        hold = self._hold(job)
        job = self._with_bucket_env(job)
        try:
            self._arm(job)  # before the job starts: nothing to stop if it fails
            return super().run_detached(job, guard)
        finally:
            if hold is not None:
                hold.release()

    def _with_bucket_env(self, job: Job) -> Job:
        """The job's env with the run's checkpoint and out-dir places in the bucket: the same for
        an attached run, a detached one and a reconcile pass's relaunch."""
        env = {**self.nodes.job_env(job.run_id), **output_env(self.nodes.bucket, job), **job.env}
        return replace(job, env=env)

    def _hold(self, job: Job) -> ControllerHold | None:
        """The stack's lease for this controller and the run's manifest (a stack with a
        bucket; `job` as the user gave it: a relaunch adds the bucket's env itself)."""
        if not self.nodes.bucket or not self.holds_lease:
            return None
        from infra.gcp.gcs import StorageApi
        from scripts.job.launch import collect_code
        from scripts.targets.gce.manifest import ControllerHold

        hold = ControllerHold(
            StorageApi(self.nodes.outputs.project),
            self.nodes.bucket,
            self.nodes.stack,
            max_recoveries=self.max_recoveries,
            deadline=self.nodes.deadline,
            budget_usd=budget.usd if (budget := self._budget()) is not None else None,
            started_at=self.nodes.created_at,
            ledger=self.watchdogs.plan.ledger if self.watchdogs is not None else None,
        )
        hold.start(job, collect_code(job) if job.workdir is not None else {})
        return hold

    def has_run(self, run_id: str) -> bool:
        """Its checkpoints (or results) in the stack's bucket, or its directory on the head."""
        from scripts.targets.gce.autodown import bucket_has_run

        in_bucket = bucket_has_run(self.nodes.bucket, self.nodes.outputs.project, run_id)
        return in_bucket or super().has_run(run_id)

    def _arm(self, job: Job) -> None:
        if self.watchdogs is not None:  # the VMs as they are now (re-created ones too)
            nodes = [(n.name, n.zone, n.role) for n in self.nodes.outputs.nodes]
            self.watchdogs.arm(self.fleet, self.transports, job.run_id, job.env, nodes)

    def run_job(self, job: Job, results_dir: Path, guard: SignalGuard) -> JobResult:
        from scripts.targets.gce.manifest import not_recreating
        from scripts.watch.monitor import watched_launch, with_stall_default

        hold = self._hold(job)
        job = self._with_bucket_env(job)
        job = with_stall_default(job, self.stall_timeout_s)
        watch = StepWatch()
        done: list[Recovery] = []
        pending: _Pending | None = None
        missing: dict[str, str] = {}  # the last failed attempt's nodes whose results are not home

        def line(node: str, text: str) -> None:
            say_line(node, text)
            watch.line(node, text)

        try:
            while True:
                started = time.time()
                try:
                    self._arm(job)
                    result = watched_launch(
                        self.fleet, self.transports, job, results_dir, on_line=line
                    )
                    if pending is not None:
                        done.append(pending.finish(watch))
                    if done:
                        result = replace(result, recoveries=tuple(done))
                        write_job_record(result)
                    if hold is not None:
                        hold.record(state="finished")
                    return result
                except TrainingError as e:
                    missing = e.results_missing  # a recovery that fails keeps the bucket for them
                    if pending is not None:
                        done.append(pending.finish(watch))
                        pending = None
                        write_job_record(
                            replace(e.result, recoveries=tuple(done)), e.results_missing
                        )
                    if (spent := self._budget_reached(e, job, started)) is not None:
                        raise spent from e  # no recovery: the money is spent
                    preempted = self._lost(e, started)
                    if not preempted:
                        raise
                    if hold is not None and hold.lease is not None and hold.lease.lost.is_set():
                        raise self._taken_over(job, preempted) from e
                    why = not_recreating(self.nodes.deadline, self._budget(), time.time())
                    if len(done) >= self.max_recoveries:
                        why = (
                            f"--max-recoveries {self.max_recoveries} allows no more "
                            f"recoveries ({len(done)} done)"
                        )
                    if why is not None:
                        raise self._not_recovered(job, preempted, why) from e
                    now = time.time()
                    # GCE's clock, not ours: never later than we noticed it
                    at = min(now, *(unix_time(s.preempted_at, now) for s in preempted.values()))
                    pending = _Pending(
                        len(done) + 1,
                        self.max_recoveries,
                        tuple(preempted),
                        " / ".join(sorted({s.cause for s in preempted.values()})),
                        at,
                        watch.reached,
                    )
                    if (notifier := self.notifier) is not None:
                        evidence = "; ".join(f"{n}: {c.evidence}" for n, c in preempted.items())
                        notifier.send("preempted", step=watch.reached, detail=evidence)
                        pending.announce = lambda ln: notifier.send("recovered", detail=ln)
                    watch.new_attempt(functools.partial(pending.finish, watch))
                    pending.zone = self._recover(preempted, job, results_dir, len(done) + 1)
                    job = replace(job, attempt=job.attempt + 1)  # --resume-args from now on
                    if hold is not None:
                        hold.record(attempt=job.attempt, nodes=list(preempted))
        except BaseException as e:
            if isinstance(e, RecoveryError):
                e.results_missing = missing
            if hold is not None and isinstance(e, GputrainError):
                hold.record(state="failed", error=str(e).splitlines()[0][:300])
            self._stop(guard, job.run_id)
            raise
        finally:
            if hold is not None:
                hold.release()

    def _budget(self) -> RunBudget | None:
        return self.watchdogs.plan.budget if self.watchdogs is not None else None

    def _budget_reached(self, error: TrainingError, job: Job, since: float) -> BudgetReached | None:
        """The head stopped this attempt (begun at `since`) at the run's budget (never unset)."""
        if self._budget() is None:
            return None
        head = self.fleet.head.name
        return budget_reached(error, head, job.env.get(CHECKPOINT_URI_ENV), since)

    def _lost(self, error: TrainingError, since: float) -> dict[str, NodeCloudState]:
        """The nodes to replace: the node of a GPU fault during training, else the preempted."""
        from scripts.watch.monitor import GpuFaultError

        if isinstance(error, GpuFaultError):
            f = error.fault
            fault = f"GPU {f.gpu}: {f.what}"
            return {f.node: NodeCloudState(f.node, "RUNNING", None, fault=fault)}
        return self._preempted(error, since)

    def _preempted(self, error: TrainingError, since: float) -> dict[str, NodeCloudState]:
        """The nodes GCE took away during this attempt (any capacity: host errors and
        maintenance end on-demand and reserved VMs too)."""
        try:
            return self.nodes.preempted(since, wait_s=self.confirm_s if looks_stopped(error) else 0)
        except ComputeApiError as e:
            ui.warn(f"could not ask the Compute API whether a node was preempted: {e}")
            return {}

    def _taken_over(self, job: Job, preempted: Mapping[str, NodeCloudState]) -> GputrainError:
        """This controller's lease lapsed while it was away and a reconcile pass took it: the
        pass recovers the run, never both. The cluster is kept for it (autodown still ends it)."""
        self.keep = True
        return GputrainError(
            f"run {job.run_id}: {', '.join(preempted)} taken away, and a reconcile pass holds "
            "the run's lease (this controller's lapsed while it could not renew it): the pass "
            f"recovers it, not this controller; follow it with `gputrain status --stack "
            f"{self.nodes.stack}` and `gputrain logs --stack {self.nodes.stack} --run {job.run_id}`"
        )

    def _not_recovered(
        self, job: Job, preempted: Mapping[str, NodeCloudState], why: str
    ) -> RecoveryError:
        what = ", ".join(f"{s.ended(n)} ({s.evidence})" for n, s in preempted.items())
        return RecoveryError(
            f"run {job.run_id}: {what} and {why}. Its newest checkpoint is in "
            f"{job.env.get(CHECKPOINT_URI_ENV) or 'the nodes out dirs'} and comes home "
            "with the results"
        )

    def _recover(
        self, preempted: Mapping[str, NodeCloudState], job: Job, results_dir: Path, number: int
    ) -> str:
        """Stop the survivors, re-create the cluster, pin, verify; the zone it is in now."""
        from scripts.job.launch import stop_job

        names = list(preempted)
        causes = " / ".join(sorted({s.cause for s in preempted.values()}))
        ui.say(
            f"{', '.join(names)} {causes} ({'; '.join(s.evidence for s in preempted.values())}): recovering "
            f"({number}/{self.max_recoveries}), the other node(s) stop, the VMs are re-created"
        )
        survivors = [n for n in (self._transports or {}) if n not in preempted]
        if self._transports and survivors:
            stop_job(self._transports, job.run_id, only=survivors)
        self.close()
        keep_attempt_files(results_dir, f"attempt{number}")
        try:
            for name in [n for n, s in preempted.items() if s.fault]:
                self.nodes.delete(name)  # a VM with a failed GPU is replaced, not reused
            self.fleet = self.nodes.recreate(preempted)
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
