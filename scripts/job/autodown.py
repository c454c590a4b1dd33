"""Autodown from the controller's side: arm the watchdog (the node package's) on every node of a
stack run, and feed the head's dead man's switch — a `touch` over the SSH connection the session
holds anyway, every few seconds, for as long as the controller lives. A controller that is gone
(a closed laptop, `kill -9`, a detached run) stops touching; the head then ends the cluster
`autodown` after the job's end. `status` reads what the watchdog recorded in the bucket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gputrain_node import contract
from infra.base.records import Fleet
from scripts import ui
from scripts.job.leftovers import OURS_SH
from scripts.job.node_scripts import (
    STORAGE_PACKAGES,
    Requirement,
    SectionResult,
    build_install_command,
    report_install,
    run_dir,
)
from scripts.job.records import BudgetReached, TrainingError
from scripts.node_layout import NODE_STATE
from scripts.parallel import parallel
from scripts.transport.base import Transport, TransportError

if TYPE_CHECKING:
    from infra.gcp.gcs import StorageApi

WATCHDOG_SOURCE = contract.source_of(contract.WATCHDOG)
WATCHDOG_FILE = WATCHDOG_SOURCE.name  # its copy in the run dir, run from there
GUARD_SOURCE = contract.source_of(contract.BUDGET_GUARD)  # billingBudget: beside the head's
#: what the head's watchdog imports to delete VMs (every node's needs the storage client)
COMPUTE_PACKAGES: tuple[Requirement, ...] = (
    ("google.cloud.compute_v1", "google-cloud-compute>=1.14,<2"),
)
RECORD = contract.AUTODOWN_RECORD


@dataclass(frozen=True)
class RunBudget:
    """What the head's watchdog holds a run to: the budget, the cluster's worst-case rate from
    `started_at` (this machine's clock), how far ahead the rule looks, and what `up`'s partial
    creates billed for the run before it (every failed attempt's, before the one that made it)."""

    usd: float
    hourly_usd: float
    started_at: float  # unix time
    interval_s: float
    before_usd: float = 0.0

    def reached(self, now: float) -> bool:
        """The head's rule (gputrain_node/watchdog.py): the spend so far plus the next interval
        would pass the budget."""
        ahead = self.hourly_usd * (max(0.0, now - self.started_at) + self.interval_s) / 3600
        return self.before_usd + ahead > self.usd

    def setting(self, now: float) -> dict[str, float]:
        """The watchdog's `budget` setting (contract.BUDGET_FIELDS): the run's time so far as a
        span of this clock, never its time of day, which the head's clock may not share."""
        elapsed = max(0.0, now - self.started_at)
        return {
            "usd": self.usd,
            "hourly_usd": self.hourly_usd,
            "elapsed_s": elapsed,
            "interval_s": self.interval_s,
            "before_usd": self.before_usd,
        }


@dataclass(frozen=True)
class Autodown:
    """What the watchdog of a stack's run needs to know (the webhook URLs are its only secret)."""

    stack: str
    project: str
    bucket: str  # gs://NAME/PREFIX/
    instances: tuple[tuple[str, str], ...]  # (name, zone), the head last
    autodown_s: float | None  # None: the watchdog only puts results in the bucket
    heartbeat_s: float = 10.0
    poll_s: float = 2.0
    notify: tuple[str, ...] = ()  # webhook URLs: in the watchdog's stdin, never in a file
    budget: RunBudget | None = None  # the head's watchdog stops the job before it passes this
    ledger: dict[str, Any] | None = None  # the run's cost record so far (scripts/cost/ledger)
    guard: str | None = None  # billingBudget: the subscription the head pulls (projects/P/...)

    def config(self, run_id: str, node: str, env: Mapping[str, str]) -> bytes:
        head = self.instances[-1][0]
        return json.dumps(
            {
                "stack": self.stack,
                "run_id": run_id,
                "node": node,
                "head": node == head,
                "project": self.project,
                "instances": [list(i) for i in self.instances],
                "bucket": self.bucket,
                "autodown_s": self.autodown_s,
                "poll_s": self.poll_s,
                "heartbeat_s": self.heartbeat_s,
                "notify": list(self.notify),
                "env": dict(env),
                "budget": self.budget.setting(time.time()) if self.budget else None,
                "ledger": self.ledger,
                "guard": self.guard,
            }
        ).encode()


def instances_of(nodes: Sequence[tuple[str, str, str]]) -> tuple[tuple[str, str], ...]:
    """(name, zone) of (name, zone, role) nodes, the head last: it deletes itself. Pure."""
    return tuple((n, z) for n, z, role in sorted(nodes, key=lambda n: n[2] == "head"))


def build_watchdog_start(run_id: str, python: str) -> str:
    """Reads the watchdog's JSON settings on stdin and hands them to a detached watchdog (its own
    session: a dropped SSH connection cannot end it), after ending any earlier one on the node
    (the process its pid file names only while it is still that watchdog: OURS_SH in that run's
    directory). Always before the attempt starts, so an exit code in the run dir is an earlier
    attempt's and goes: a relaunch within a second of it would otherwise look ended at once to
    the new watchdog (ended_at's one-second tolerance), which would then autodown under it.
    `exec 3<&0` keeps stdin for the background process (sh gives `&` /dev/null otherwise)."""
    d = shlex.quote(run_dir(run_id))
    return (
        f"mkdir -p {d} && cd {d} || exit 1; "
        # one watchdog per node: an earlier run's (or attempt's) would count a silence of its own
        'for f in ../*/watchdog.pid; do [ -s "$f" ] || continue; p=$(cat "$f"); '
        f'(cd "${{f%/*}}" && {OURS_SH}; ours "$p") && '
        f'grep -q {WATCHDOG_FILE} "/proc/$p/cmdline" 2>/dev/null && kill "$p"; rm -f "$f"; done; '
        f"rm -f watchdog.disarm exitcode {contract.WATCHDOG_UPLOADED}; touch heartbeat; exec 3<&0; "
        f"nohup setsid {shlex.quote(python)} {WATCHDOG_FILE} <&3 >> watchdog.log 2>&1 & "
        "i=0; while [ ! -s watchdog.pid ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
        "cat watchdog.pid"
    )


def arm(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    plan: Autodown,
    run_id: str,
    env: Mapping[str, str],
) -> None:
    """The watchdog on every node for this attempt of the run (a previous one is replaced)."""

    def install(name: str) -> None:
        """Every node uploads its results; only the head deletes VMs."""
        needs = STORAGE_PACKAGES
        if plan.autodown_s is not None and name == fleet.head.name:
            needs += COMPUTE_PACKAGES
        r = transports[name].run(build_install_command(fleet.python, needs), 1800)
        result = SectionResult(r.exit_code, r.stdout + r.stderr)
        report_install(fleet.python, needs, "autodown's watchdog", name, result)

    _, failed = parallel(list(transports), install)
    if failed:
        raise TransportError("\n".join(str(e) for e in failed.values()))
    source = WATCHDOG_SOURCE.read_bytes()
    d = shlex.quote(run_dir(run_id))

    def one(name: str) -> str:
        t = transports[name]
        r = t.run(f"mkdir -p {d} && cat > {d}/{WATCHDOG_FILE}", 60, stdin=source)
        if r.ok and plan.guard and name == fleet.head.name:
            guard = GUARD_SOURCE.read_bytes()
            r = t.run(f"cat > {d}/{GUARD_SOURCE.name}", 60, stdin=guard)
        if r.ok:
            r = t.run(
                build_watchdog_start(run_id, fleet.python), 60, stdin=plan.config(run_id, name, env)
            )
        if not r.ok or not r.stdout.strip().isdigit():
            raise TransportError(f"node {name}: the watchdog did not start: {r.stderr.strip()}")
        return r.stdout.strip()

    _, errors = parallel(list(transports), one)
    if errors:
        raise TransportError("\n".join(str(e) for e in errors.values()))
    if plan.budget is not None:
        b = plan.budget
        ui.say(
            f"run {run_id}: budget ${b.usd:.2f} at up to ${b.hourly_usd:.2f}/h: the head stops the "
            f"job with a checkpoint once ${b.hourly_usd * b.interval_s / 3600:.2f} more would pass "
            "it, also with this controller gone"
        )
    if plan.autodown_s is None:
        ui.say(f"run {run_id}: watchdog armed (results to {plan.bucket}; autodown off)")
    else:
        from infra.autodown import describe

        ui.say(
            f"run {run_id}: autodown armed: if this controller goes away, the VMs are deleted "
            f"{describe(int(plan.autodown_s))} after the job ends (results kept in {plan.bucket})"
        )


def disarm(transports: Mapping[str, Transport], run_id: str) -> None:
    """The run's watchdogs stop (the cluster is the user's to keep); errors only warn."""
    d = shlex.quote(run_dir(run_id))

    def one(name: str) -> None:
        transports[name].run(f"mkdir -p {d} && touch {d}/watchdog.disarm", 30)

    _, errors = parallel(list(transports), one)
    for name, e in errors.items():
        ui.warn(f"{name}: could not disarm the watchdog of run {run_id}: {e}")


SETTLE_S = 60.0  # a watchdog mid-upload finishes it first (uploads retry for a while)


def build_settle_command(
    run_id: str, wait_s: float = SETTLE_S, *, upload_first: bool = False
) -> str:
    """Disarm the run's watchdog on this node and wait until its process has ended (a zombie
    counts as ended): from then on nothing of it writes to the bucket. The disarm is written
    whether or not a pid file is there (a watchdog still starting sees it). `upload_first` (the
    node's SSH download failed): the job's results go to the bucket first, waited for as long."""
    d = shlex.quote(run_dir(run_id))
    ticks = max(1, int(wait_s * 10))
    upload = (
        "if read -r p 2>/dev/null < watchdog.pid; then i=0; while [ -e exitcode ] && "
        f'[ ! -e {contract.WATCHDOG_UPLOADED} ] && [ $i -lt {ticks} ] && kill -0 "$p" 2>/dev/null; '
        "do sleep 0.1; i=$((i+1)); done; fi; "
    )
    return (
        f"cd {d} 2>/dev/null || exit 0; {upload if upload_first else ''}touch watchdog.disarm; "
        "read -r p 2>/dev/null < watchdog.pid || exit 0; i=0; "
        f"while [ $i -lt {ticks} ]; do "
        's=; read -r s 2>/dev/null < "/proc/$p/stat"; s=${s##*) }; s=${s%% *}; '
        'case "$s" in ""|Z*) exit 0;; esac; sleep 0.1; i=$((i+1)); done; exit 1'
    )


def settle(
    transports: Mapping[str, Transport], run_id: str, upload_first: Collection[str] = ()
) -> None:
    """Before the stack's bucket is emptied and destroyed: every node's watchdog has stopped,
    so no late upload of its results refills the bucket (the controller brought them home, or
    for the nodes in `upload_first`, whose download failed, the watchdog has uploaded them)."""

    def one(name: str) -> None:
        first = name in upload_first
        command = build_settle_command(run_id, upload_first=first)
        r = transports[name].run(command, SETTLE_S * (2 if first else 1) + 30)
        if not r.ok:
            raise TransportError(f"its watchdog did not end within {SETTLE_S:.0f} s")

    _, errors = parallel(list(transports), one)
    for name, e in errors.items():
        ui.warn(f"{name}: could not stop the watchdog of run {run_id}: {e}")


class Watchdogs:
    """A session's autodown: `arm` before each attempt of a run (a relaunch replaces the
    watchdogs), one heartbeat thread for the session's life, `stop` when the controller lets go.
    `head` gives the head's open transport, or None while the session is reconnecting."""

    def __init__(self, plan: Autodown, head: Callable[[], Transport | None]) -> None:
        self.plan, self.head = plan, head
        self.run_id: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(
        self,
        fleet: Fleet,
        transports: Mapping[str, Transport],
        run_id: str,
        env: Mapping[str, str],
        nodes: Sequence[tuple[str, str, str]],
    ) -> None:
        """`nodes`: (name, zone, role) of the stack's VMs now; the cost record's zones follow
        a recovery that moved them (the head's zone is the cluster's)."""
        from scripts.cost.ledger import with_zone

        ledger, head = self.plan.ledger, [z for _, z, role in nodes if role == "head"]
        if ledger is not None and head:
            ledger = with_zone(ledger, head[0])
        self.plan = dataclasses.replace(self.plan, instances=instances_of(nodes), ledger=ledger)
        arm(fleet, transports, self.plan, run_id, env)
        self.run_id = run_id
        self._start_beat()

    def hold(self, head: Transport) -> None:
        """From the session's first connection until this run arms its own: the head's
        AUTODOWN_HOLD renewed each beat, which an earlier run's watchdog reads (a kept cluster's
        last run, its controller gone, would otherwise autodown under this run's verify, image
        build or install). Held from a controller that dies, it ages like a heartbeat."""
        self._touch(head)
        self._start_beat()

    def _start_beat(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")
            self._thread.start()

    def _beat(self) -> None:
        """A failed touch (the link is down) is retried at the next beat: the watchdog waits for
        `autodown` of silence, far longer than a beat."""
        while not self._stop.wait(self.plan.heartbeat_s):
            head = self.head()
            if head is not None:
                self._touch(head)

    def _touch(self, head: Transport) -> None:
        """This run's heartbeat once armed, the hold before (see `hold`)."""
        if self.run_id is not None:
            touch = f"touch {shlex.quote(run_dir(self.run_id))}/heartbeat"
        else:
            touch = f"mkdir -p {NODE_STATE} && touch {NODE_STATE}/{contract.AUTODOWN_HOLD}"
        with contextlib.suppress(Exception):  # the follower reconnects; the next beat retries
            head.run(touch, timeout=self.plan.heartbeat_s)

    def stop(
        self, transports: Mapping[str, Transport] | None = None, upload_first: Collection[str] = ()
    ) -> None:
        """The heartbeat ends; with `transports` (the cluster is about to be torn down) the
        watchdogs too, waited for (see settle)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=20)
        if transports and self.run_id is not None:
            settle(transports, self.run_id, upload_first)


def last_autodown(storage: StorageApi, bucket: str, prefix: str) -> dict[str, object] | None:
    """The record the head's watchdog left, if any (a missing bucket or object is None)."""
    try:
        if not storage.bucket_exists(bucket):
            return None
        names = {o.name for o in storage.list_objects(bucket, prefix + ".gputrain/")}
        if prefix + RECORD not in names:
            return None
        data = json.loads(storage.read(bucket, prefix + RECORD))
    except (ValueError, OSError):
        return None
    return data if isinstance(data, dict) else None


def autodown_line(record: Mapping[str, object]) -> str:
    """`status`'s line about it. Pure."""

    def at(key: str) -> str:
        value = record.get(key)
        if not isinstance(value, int | float):
            return "?"
        return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(value))

    stop = record.get("budget")
    why = ""
    if isinstance(stop, Mapping):
        spent, budget = stop.get("spent_usd"), stop.get("budget_usd")
        if isinstance(spent, int | float) and isinstance(budget, int | float):
            why = f", stopped at {budget_name(stop)}: ${spent:.2f} of ${budget:.2f}"
    return (
        f"VMs deleted by autodown at {at('deleted_at')} after the job ended at "
        f"{at('job_ended_at')} (run {record.get('run_id')}{why}); `gputrain down --stack "
        f"{record.get('stack')}` brings the results home and removes the rest"
    )


def budget_name(stop: Mapping[str, object], own: str = "its budget") -> str:
    """Which budget a BUDGET_MARK names: the run's (`own`), or the stack's Cloud Billing budget
    (`billingBudget`). Pure."""
    return "the stack's Cloud Billing budget" if stop.get("by") == contract.GUARD_STOP else own


#: how far the head's clock may lag this machine's for its budget mark to count as this attempt's
MARK_CLOCK_SLACK_S = 60.0


def budget_reached(
    error: TrainingError, head: str, checkpoints: str | None, since: float
) -> BudgetReached | None:
    """The job's end as the budget's stop, when the head's watchdog left its mark for this
    attempt (BUDGET_MARK: it comes home in the head's watch/ with the results; its `at`, on the
    head's clock, not before `since`, when this attempt began here, less MARK_CLOCK_SLACK_S).
    None: it ended for another reason, also beside an earlier attempt's mark (a run resumed
    after a budget stop, whose mark stayed on a kept head): that end is recovered or failed."""
    try:
        stop = json.loads((error.result.results_dir / head / contract.BUDGET_MARK).read_text())
        spent, budget, at = float(stop["spent_usd"]), float(stop["budget_usd"]), float(stop["at"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if at < since - MARK_CLOCK_SLACK_S:
        return None
    kept = f"its newest checkpoint is in {checkpoints}; " if checkpoints else ""
    why = (
        "billed, as Cloud Billing notified"
        if stop.get("by") == contract.GUARD_STOP
        else "the next interval would pass it"
    )
    what = budget_name(stop, "the budget")
    return BudgetReached(
        f"run {error.result.run_id} stopped at {what}: ${spent:.2f} of ${budget:.2f} ({why}); "
        f"{kept}results in {error.result.results_dir}",
        error=error,
        spent_usd=spent,
        budget_usd=budget,
        what=what,
    )
