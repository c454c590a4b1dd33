"""The stack run's watchdog, on every node: `python -m gputrain_node.watchdog` in the run's directory
(`.gputrain/runs/<run-id>/`), started detached by the controller like torchrun, its settings as
one JSON object on stdin (so a webhook URL is never in argv or a file on the node).

Every node: once this attempt's torchrun has ended (`exitcode`, newer than the watchdog), its
results go to `<bucket>/runs/<run-id>/<node>/` (the layout `down` brings home), then an end
marker. The head alone is autodown's dead man's switch: when every node has ended and the
controller's heartbeat (`heartbeat`'s mtime) is older than `autodown_s`, it writes
`<bucket>/.gputrain/autodown.json` and deletes the VMs with the VM's own service account (workers
first, itself last). With a budget, or the stack's `billingBudget` (GUARD_FILE), the head stops
the job with SIGTERM (a preemption notice's signal: the trainer checkpoints) once it is reached.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEARTBEAT = "heartbeat"
EXITCODE = "exitcode"
DISARM = "watchdog.disarm"  # the controller ends this run's watchdog (a relaunch, `run --keep`)
UPLOADED = "results.uploaded"  # the contract's WATCHDOG_UPLOADED: this attempt's are up
HOLD = "autodown.hold"  # the contract's AUTODOWN_HOLD, in .gputrain/: the next run readies
ENDED = ".gputrain-ended.json"  # the contract's ENDED_MARKER, beside a node's results in the bucket
RECORD = ".gputrain/autodown.json"  # the stack's last autodown, read by `gputrain status`
COMPUTE_ENDPOINT_ENV = "GPUTRAIN_COMPUTE_ENDPOINT"  # tests: the fake Compute API
NOTIFY_DEADLINE_S = 20.0  # all of one event's webhooks: a slow one never holds a delete longer
BUDGET_MARK = "watch/budget.json"  # in the run dir (comes home with watch/): the budget stopped it
LEDGER_RECORD = "ledger-{start_ms}.json"  # the contract's: a segment's cost record, runs/<run-id>/
BUDGET_GRACE_S = 300.0  # billingBudget's SIGTERM, then a kill (a run's budget: half its interval)
GUARD = "billingBudget"  # the mark's `by`: the stack's Cloud Billing budget stopped the run
GUARD_FILE = "budget_guard.py"  # beside this file on the head: billingBudget's Pub/Sub reader


def over_budget(spent_usd: float, next_interval_usd: float, budget_usd: float) -> bool:
    """Stop now when the spend plus the next interval (a stop's time) would pass it. Pure."""
    return spent_usd + next_interval_usd > budget_usd


@dataclass(frozen=True)
class Budget:
    """What one run may cost: `up`'s partial creates (`before_usd`), then the worst-case rate over
    its time (a recovery's downtime too), `elapsed_s` before `armed`, then this VM's own clock."""

    usd: float
    hourly_usd: float
    elapsed_s: float  # the run's time when the controller armed this watchdog
    interval_s: float  # how far ahead the rule looks
    before_usd: float = 0.0

    def spent(self, now: float, armed: float) -> float:
        return self.before_usd + self.hourly_usd * max(0.0, self.elapsed_s + now - armed) / 3600

    @property
    def grace_s(self) -> float:  # after the stop's SIGTERM, the kill: within the interval
        return max(10.0, self.interval_s / 2)

    def reached(self, now: float, armed: float) -> bool:
        ahead = self.hourly_usd * self.interval_s / 3600
        return over_budget(self.spent(now, armed), ahead, self.usd)

    @classmethod
    def parse(cls, data: Any) -> Budget | None:
        return cls(**{k: float(data[k]) for k in cls.__dataclass_fields__}) if data else None


@dataclass(frozen=True)
class Config:
    stack: str
    run_id: str
    node: str
    head: bool
    project: str
    instances: tuple[tuple[str, str], ...]  # (name, zone), workers first, the head last
    bucket: str  # gs://NAME/PREFIX/
    autodown_s: float | None  # None: results only, never delete
    poll_s: float = 2.0
    env: tuple[tuple[str, str], ...] = ()
    notify: tuple[str, ...] = ()  # webhook URLs (secrets: only ever in this process's memory)
    heartbeat_s: float = 10.0  # the controller's beat: silent for 3 of them at the end = gone
    budget: Budget | None = None  # the head holds the run to it
    ledger: dict[str, Any] | None = None  # the run's cost record as its launch knew it
    guard: str | None = None  # billingBudget: projects/P/subscriptions/S the head pulls
    guard_poll_s: float = 60.0  # its notifications come a few times a day: a slow pull

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Config:
        return cls(
            stack=str(data["stack"]),
            run_id=str(data["run_id"]),
            node=str(data["node"]),
            head=bool(data["head"]),
            project=str(data["project"]),
            instances=tuple((str(n), str(z)) for n, z in data["instances"]),
            bucket=str(data["bucket"]),
            autodown_s=None if data.get("autodown_s") is None else float(data["autodown_s"]),
            poll_s=float(data.get("poll_s", 2.0)),
            env=tuple((str(k), str(v)) for k, v in dict(data.get("env") or {}).items()),
            notify=tuple(str(u) for u in data.get("notify") or ()),
            heartbeat_s=float(data.get("heartbeat_s", 10.0)),
            budget=Budget.parse(data.get("budget")),
            ledger=dict(data["ledger"]) if data.get("ledger") else None,
            guard=str(data["guard"]) if data.get("guard") else None,
            guard_poll_s=float(data.get("guard_poll_s", 60.0)),
        )

    @property
    def bucket_name(self) -> str:
        return self.bucket.removeprefix("gs://").split("/", 1)[0]

    @property
    def prefix(self) -> str:
        return self.bucket.removeprefix("gs://").partition("/")[2]

    def node_prefix(self, node: str) -> str:
        return f"{self.prefix}runs/{self.run_id}/{node}/"


def log(text: str) -> None:
    """One line of watchdog.log; a full disk (shared with the job's out dir) costs only the line."""
    with contextlib.suppress(OSError):
        print(f"{time.strftime('%H:%M:%S')} watchdog: {text}", flush=True)


def notify(cfg: Config, event: str, text: str, **fields: Any) -> None:
    """A JSON POST per webhook, 3 tries with backoff; a failure is one log line, nothing more."""
    import urllib.request
    from urllib.parse import urlsplit

    text = f"gputrain {event}: run {cfg.run_id} on {cfg.stack}; {text}"
    body = {"event": event, "stack": cfg.stack, "run_id": cfg.run_id, **fields}
    body |= {"nodes": len(cfg.instances), "text": text}
    for url in cfg.notify:
        for attempt in range(3):
            request = urllib.request.Request(
                url, data=json.dumps(body).encode(), method="POST",
                headers={"Content-Type": "application/json", "User-Agent": "gputrain-watchdog"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    if 200 <= answer.status < 300:
                        break
            except Exception as e:
                why = type(e).__name__
            else:
                why = f"HTTP {answer.status}"
            if attempt == 2:
                where = urlsplit(url)  # never the path: a webhook's secret
                log(f"notify: {where.scheme}://{where.hostname}/… did not take {event!r} ({why})")
            else:
                time.sleep(1.0 + 2 * attempt)


_sending: list[tuple[threading.Thread, float]] = []  # (notification thread, its deadline)


def notify_later(cfg: Config, event: str, text: str, **fields: Any) -> None:
    """`notify` in a daemon thread: a webhook that trickles its answer holds nothing up."""
    thread = threading.Thread(
        target=notify, args=(cfg, event, text), kwargs=fields, name=f"notify-{event}", daemon=True
    )
    thread.start()
    _sending.append((thread, time.monotonic() + NOTIFY_DEADLINE_S))


def notifications_done() -> None:
    """Wait for each notification under way until its deadline (then it goes with the process)."""
    for thread, deadline in _sending:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log(f"notify: {thread.name.removeprefix('notify-')!r} not sent within its deadline")
    _sending.clear()


def summary_of(run_dir: Path) -> dict[str, Any]:
    """Rank 0's figures (the head's out/summary.json), when the trainer wrote one."""
    try:
        data = json.loads((run_dir / "out" / "summary.json").read_text())
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):  # none, or the trainer's file holds any other JSON
        return {}
    picked = {k: data[k] for k in ("final_loss", "tokens_per_s") if k in data}
    return picked | ({"step": data["steps"]} if "steps" in data else {})


def ended_at(run_dir: Path, since: float) -> float | None:
    """When this attempt's torchrun ended (run.sh's exit code file), None while it runs."""
    try:
        mtime = (run_dir / EXITCODE).stat().st_mtime
    except OSError:
        return None
    return mtime if mtime >= since - 1 else None


def job_pid(run_dir: Path, name: str) -> int | None:
    """The number in the run dir's pid file `name` (pgid, jobpid) while that process is still the
    run's (its working directory is in the run dir): a number the kernel gave another process
    since is never signalled (the controller's side: scripts/job/leftovers.py's OURS_SH)."""
    try:
        pid = int((run_dir / name).read_text().strip())
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except (OSError, ValueError):
        return None
    here = run_dir.resolve()
    return pid if cwd == here or here in cwd.parents else None


def other_job_running(run_dir: Path) -> str | None:
    """The run id of another run still training here (torchrun alive, no exit code), or None."""
    for other in run_dir.parent.iterdir():
        if other == run_dir or (other / EXITCODE).exists():
            continue
        if job_pid(other, "jobpid") is not None:
            return other.name
    return None


def silence_s(run_dir: Path, now: float, *, held: bool = False) -> float:
    """Seconds since the controller's last heartbeat (the file's mtime, the head's own clock).
    `held` (autodown's wait): or since another controller last held the cluster, if later."""
    files = [run_dir / HEARTBEAT, *([run_dir.parent.parent / HOLD] if held else [])]
    ages = [now - p.stat().st_mtime for p in files if p.exists()]
    return min(ages, default=float("inf"))


def result_files(run_dir: Path) -> list[tuple[Path, str]]:
    """(file, name under the node's prefix): what `download_results` brings home. Pure walk."""
    out = []
    for src, dest in (("out", ""), ("logs", "torchrun-logs/")):
        base = run_dir / src
        if base.is_dir():
            out += [(p, dest + p.relative_to(base).as_posix()) for p in sorted(base.rglob("*"))]
    out += [
        (run_dir / n, n) for n in ("torchrun.log", EXITCODE, BUDGET_MARK) if (run_dir / n).is_file()
    ]
    return [(p, name) for p, name in out if p.is_file()]


def upload_results(cfg: Config, run_dir: Path, end: float, bucket: Any, since: float) -> int:
    """This node's results, then its end marker (last: the head trusts what it names)."""
    files = result_files(run_dir)
    for path, name in files:
        bucket.blob(cfg.node_prefix(cfg.node) + name).upload_from_filename(str(path))
    code = exit_code(run_dir)
    marker = {"node": cfg.node, "ended_at": end, "exit_code": code[0] if code else None}
    if budget_stop(run_dir, since) is not None:
        marker["stopped_by"] = "budget"
    bucket.blob(cfg.node_prefix(cfg.node) + ENDED).upload_from_string(json.dumps(marker))
    return len(files)


def node_ends(cfg: Config, bucket: Any, since: float) -> dict[str, float]:
    """node -> when its job ended, for every node whose marker for this attempt is in the bucket
    (ended after `since`, less a second: a relaunch's or `--resume`'s earlier one says nothing)."""
    ends = {}
    for name, _ in cfg.instances:
        blob = bucket.blob(cfg.node_prefix(name) + ENDED)
        if blob.exists():
            ended = float(json.loads(blob.download_as_bytes())["ended_at"])
            if ended >= since - 1:
                ends[name] = ended
    return ends


class Compute:
    """The Compute API with this VM's service account (the metadata server's): autodown's needs."""

    def __init__(self, project: str) -> None:
        from google.cloud import compute_v1

        endpoint = os.environ.get(COMPUTE_ENDPOINT_ENV)
        self.client = compute_v1.InstancesClient(
            client_options={"api_endpoint": endpoint} if endpoint else None
        )
        self.project = project

    def exists(self, name: str, zone: str) -> bool:
        from google.api_core import exceptions

        try:
            status = self.client.get(project=self.project, zone=zone, instance=name).status
        except exceptions.NotFound:
            return False
        return status not in ("STOPPING", "TERMINATED")

    def delete(self, name: str, zone: str) -> None:
        from google.api_core import exceptions

        with contextlib.suppress(exceptions.NotFound):
            self.client.delete_unary(project=self.project, zone=zone, instance=name)


def autodown(
    cfg: Config,
    bucket: Any,
    compute: Compute,
    job_end: float,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    gone_deadline_s: float = 300.0,
    stopped: dict[str, Any] | None = None,
) -> None:
    """The record first (the head's delete ends this process), then the workers, waiting until
    they are gone, then the head. The notification goes out meanwhile, in the background, and
    delays no delete: after the head's, this process waits for it until its deadline at most
    (while GCE shuts the VM down). `stopped`: the budget's mark, when the budget ended the run."""
    now, names = clock(), [n for n, _ in cfg.instances]
    record = {"stack": cfg.stack, "run_id": cfg.run_id, "job_ended_at": job_end, "deleted_at": now}
    record |= {"autodown_s": cfg.autodown_s, "instances": names}
    if stopped is not None:  # `status` says the budget ended the run
        record["budget"] = stopped
    bucket.blob(cfg.prefix + RECORD).upload_from_string(json.dumps(record))
    ended = time.strftime("%H:%M:%S", time.localtime(job_end))
    notify_later(
        cfg, "autodown", f"the job ended at {ended}; deleting the stack's VMs", deleted_at=now
    )
    *workers, (head, head_zone) = cfg.instances
    for name, zone in workers:
        log(f"deleting {name}")
        compute.delete(name, zone)
    end = clock() + gone_deadline_s
    while (left := [n for n, z in workers if compute.exists(n, z)]) and clock() < end:
        sleep(1.0)
    if left:  # a delete GCE took but did not carry out: once more, and said (to the TTL then)
        log(f"{', '.join(left)} still there after {gone_deadline_s:.0f} s: deleting again")
        for name, zone in [(n, z) for n, z in workers if n in left]:
            with contextlib.suppress(Exception):
                compute.delete(name, zone)
    log(f"deleting {head} (this VM)")
    compute.delete(head, head_zone)
    notifications_done()


def exit_code(run_dir: Path) -> list[str]:
    """[run.sh's exit code] once it wrote it, else [] (never this watchdog's failure)."""
    with contextlib.suppress(OSError):
        return (run_dir / EXITCODE).read_text().split()[:1]
    return []


def ledger_record(cfg: Config, run_dir: Path, now: float) -> dict[str, Any] | None:
    """The run's cost record completed at its end, its figures as scripts/cost/ledger.py's."""
    if not cfg.ledger:
        return None
    ok = exit_code(run_dir) == ["0"]
    record = cfg.ledger | {"run_id": cfg.run_id, "end": round(now, 3), "ok": ok}
    elapsed = max(0.0, now - float(record["start"]))
    hourly, before = record.get("hourly_usd"), float(record.get("partial_usd") or 0.0)
    cost = None if hourly is None else float(hourly) * elapsed / 3600 + before  # partial creates
    return record | {
        "elapsed_s": round(elapsed, 1),
        "gpu_hours": round(int(record["nodes"]) * int(record["gpus_per_node"]) * elapsed / 3600, 4),
        "estimated_usd": None if cost is None else round(cost, 4),
    }


def record_cost(cfg: Config, run_dir: Path, bucket: Any, now: float) -> None:
    """This segment's cost record (each `--resume` is one) into the bucket unless it is: once."""
    record = ledger_record(cfg, run_dir, now)
    if record is None:
        return
    name = LEDGER_RECORD.format(start_ms=round(float(record["start"]) * 1000))
    blob = bucket.blob(f"{cfg.prefix}runs/{cfg.run_id}/{name}")
    try:
        if not blob.exists():
            blob.upload_from_string(json.dumps(record, sort_keys=True) + "\n")
    except Exception as e:  # the ledger never holds up the end of a run
        log(f"could not put the run's cost record in the bucket: {type(e).__name__}: {e}")


def say_end(cfg: Config, run_dir: Path, bucket: Any, now: float, since: float) -> bool:
    """What the controller would do at the end, with it gone: the cost record, then `finished`
    or `failed` with the run's figures (or the budget's stop) queued for the webhooks. True."""
    record_cost(cfg, run_dir, bucket, now)
    figures, code = summary_of(run_dir), exit_code(run_dir)
    if (stop := budget_stop(run_dir, since)) is not None:
        notify_later(cfg, "budget", budget_line(stop), **figures, **stop)
    else:
        event = "finished" if code == ["0"] else "failed"
        notify_later(cfg, event, f"exit code {code[0] if code else '?'}", **figures)
    return True


def budget_stop(run_dir: Path, since: float) -> dict[str, Any] | None:
    """BUDGET_MARK's stop of the attempt armed at `since` (never an earlier one's), or None."""
    try:
        data = json.loads((run_dir / BUDGET_MARK).read_text())
        return data if float(data["at"]) >= since - 1 else None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def budget_line(stop: dict[str, Any]) -> str:
    what = "the stack's Cloud Billing budget" if stop.get("by") == GUARD else "the budget"
    return (
        f"stopped at {what}: ${stop.get('spent_usd', 0):.2f} of ${stop.get('budget_usd', 0):.2f}"
        " (a checkpoint was asked for)"
    )


def stop_for_budget(budget: Budget, run_dir: Path, now: float, since: float) -> bool:
    """The run's own budget reached (`since`: when this watchdog was armed): stop_job."""
    spent = round(budget.spent(now, since), 4)
    stop = {"budget_usd": budget.usd, "spent_usd": spent, "hourly_usd": budget.hourly_usd}
    stop |= {"started_at": since - budget.elapsed_s, "at": now}  # this VM's clock
    return budget.reached(now, since) and stop_job(stop, run_dir, since)


def stop_job(stop: dict[str, Any], run_dir: Path, since: float) -> bool:
    """The mark first (the controller and the end's notification read it), then SIGTERM to the
    job's process group: run.sh stays to record the exit code, torchrun passes the signal on to
    its ranks, and the reference trainer checkpoints and stops, as at a preemption notice. False
    while this attempt's job has not started (no process group since `since`): the next round
    tries again."""
    import signal

    try:
        if (run_dir / "pgid").stat().st_mtime < since - 1:
            return False  # an earlier attempt's
    except OSError:
        return False
    pgid = job_pid(run_dir, "pgid")
    if pgid is None:
        return False
    mark = run_dir / BUDGET_MARK
    with contextlib.suppress(OSError):  # a full disk: the stop matters more than its record
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(json.dumps(stop))
    log(f"{budget_line(stop)}: SIGTERM to the job")
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGTERM)
    return True


def billing_guard(cfg: Config) -> Any:
    """The head's reader of billingBudget's notifications (GUARD_FILE, beside this file), or None."""
    if not (cfg.head and cfg.guard):
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import budget_guard

    return budget_guard.Guard(cfg.guard, cfg.guard_poll_s, log)


def kill_job(run_dir: Path) -> None:
    """The job outlived its grace after its SIGTERM: torchrun and every process under it
    (its workers run in sessions of their own) are killed, run.sh is not: it lives on to write
    the exit code this watch waits for (then the results and autodown)."""
    import signal

    jobpid = job_pid(run_dir, "jobpid")
    if jobpid is None:
        return
    for pid in [jobpid, *descendants(jobpid)]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def descendants(root: int) -> list[int]:
    """Every process under `root` by parent pid, not `root` (standalone: telemetry's own walk)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= found
        grew = bool(found)
    return sorted(tree - {root})


def autodown_after(cfg: Config, budget_stopped: bool) -> float:
    """The controller's silence after the job's end that ends the cluster: `autodown`; after a
    budget stop only until the controller is known gone (3 beats): the money is spent. Pure."""
    assert cfg.autodown_s is not None
    return min(cfg.autodown_s, 3 * cfg.heartbeat_s) if budget_stopped else cfg.autodown_s


def watch(
    cfg: Config,
    run_dir: Path,
    *,
    clock: Callable[[], float] = time.time,
    armed: float | None = None,
) -> int:
    """The watchdog's life: results in the bucket at the end, then (head) autodown. `armed`: when
    it was armed (before its "armed" line, which may come before the job starts: a job file older
    than that, less a second, is an earlier attempt's), not after the slow storage import."""
    armed = clock() if armed is None else armed
    from google.cloud import storage

    bucket = storage.Client(project=cfg.project).bucket(cfg.bucket_name)
    uploaded = False
    compute: Compute | None = None
    said_busy: str | None = None
    said_end = False  # finished/failed sent (only when the controller is not there to say it)
    budget_stopped: float | None = None  # when this watchdog stopped the job at the budget
    guard = billing_guard(cfg)
    grace = cfg.budget.grace_s if cfg.budget is not None else BUDGET_GRACE_S
    while True:
        try:  # one bad round (a full disk, a trainer's odd file) never ends the watch
            if (run_dir / DISARM).exists():
                log("disarmed by the controller")
                return 0
            end = ended_at(run_dir, armed)
            if end is None and guard is not None and budget_stopped is None:
                hit = guard.reached(clock())
                if hit is not None and stop_job(hit | {"at": clock()}, run_dir, armed):
                    budget_stopped = clock()
            if end is None and cfg.head and (cfg.budget is not None or budget_stopped is not None):
                now = clock()
                if budget_stopped is None:
                    assert cfg.budget is not None
                    if stop_for_budget(cfg.budget, run_dir, now, armed):
                        budget_stopped = now
                elif now - budget_stopped > grace:
                    log(f"the job still runs {grace:.0f} s after its SIGTERM: killed")
                    kill_job(run_dir)
                    budget_stopped = now
            if end is not None and not uploaded:
                try:
                    n = upload_results(cfg, run_dir, end, bucket, armed)
                    uploaded = True
                    with contextlib.suppress(OSError):
                        (run_dir / UPLOADED).touch()
                    log(
                        f"job ended; {n} result file(s) in {cfg.bucket}runs/{cfg.run_id}/{cfg.node}/"
                    )
                    if cfg.head and silence_s(run_dir, clock()) > 3 * cfg.heartbeat_s:
                        # the controller is gone: say it ourselves
                        said_end = say_end(cfg, run_dir, bucket, clock(), armed)
                except Exception as e:  # the network: try again next round
                    log(f"could not upload the results yet: {type(e).__name__}: {e}")
            if uploaded and (not cfg.head or cfg.autodown_s is None):
                notifications_done()
                return 0
            if uploaded and cfg.autodown_s is not None:
                quiet = silence_s(run_dir, clock(), held=True)
                if quiet >= autodown_after(cfg, budget_stopped is not None):
                    try:
                        if not said_end:  # the controller went away after the job's end: say it
                            said_end = say_end(cfg, run_dir, bucket, clock(), armed)
                        compute = compute or Compute(cfg.project)
                        ends = node_ends(cfg, bucket, armed)
                        missing = [
                            n for n, z in cfg.instances if n not in ends and compute.exists(n, z)
                        ]
                        waited = clock() - (end or clock())
                        busy = other_job_running(run_dir)
                        if busy:
                            if busy != said_busy:
                                log(f"run {busy} still trains on this node: no autodown yet")
                            said_busy = busy
                        elif not missing or waited >= cfg.autodown_s:
                            if missing:
                                log(f"no results from {', '.join(missing)}; deleting anyway")
                            job_end = max([*ends.values(), end or clock()])
                            log(
                                f"job ended at {job_end:.0f}, controller silent for {quiet:.0f} s: "
                                "autodown"
                            )
                            stopped = budget_stop(run_dir, armed)
                            autodown(cfg, bucket, compute, job_end, clock=clock, stopped=stopped)
                            return 0
                    except Exception as e:
                        log(f"autodown failed this round: {type(e).__name__}: {e}")
        except Exception as e:
            log(f"this round failed, trying again: {type(e).__name__}: {e}")
        time.sleep(cfg.poll_s)


def main() -> int:
    armed = time.time()
    cfg = Config.parse(json.loads(sys.stdin.read()))
    os.environ.update(dict(cfg.env))  # the job's environment (emulator and metadata hosts)
    (Path.cwd() / "watchdog.pid").write_text(str(os.getpid()))
    line, b = f"armed for run {cfg.run_id} on {cfg.node}", cfg.budget
    if cfg.head and cfg.autodown_s:
        line += f"; autodown after {cfg.autodown_s:.0f} s of silence"
    if cfg.head and b:
        line += f"; budget ${b.usd:.2f} at ${b.hourly_usd:.2f}/h"
    log(line)
    return watch(cfg, Path.cwd(), armed=armed)


if __name__ == "__main__":
    sys.exit(main())
