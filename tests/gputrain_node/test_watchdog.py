"""The watchdog as it runs on the nodes (`python watchdog.py` in a run's directory, settings on
stdin), against a real Cloud Storage emulator, the fake Compute API through the real
google-cloud-compute client, and a fake metadata server for the VM's credentials: every node's
results land in the bucket, and the head deletes the VMs — workers first, itself last, with the
token the metadata server handed out — only once the job has ended everywhere and the
controller's heartbeat has been silent for autodown."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputrain_node import contract
from gputrain_node.budget_guard import guard_reached
from gputrain_node.watchdog import (
    Budget,
    Config,
    autodown_after,
    job_pid,
    other_job_running,
    over_budget,
)
from tests.support.fake_compute import FakeCompute
from tests.support.fake_metadata import FakeMetadata
from tests.support.fake_pubsub import FakePubSub
from tests.support.gcs_emulator import GcsEmulator
from tests.support.http_sink import HttpSink

WATCHDOG = contract.source_of(contract.WATCHDOG)
ZONE = "us-central1-a"
NODES = [("wd-node-1", ZONE), ("wd-node-0", ZONE)]  # the head last


@pytest.fixture
def cloud(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[FakeCompute, FakeMetadata, GcsEmulator]]:
    with (
        FakeCompute() as compute,
        FakeMetadata("gputrain-wd@gputrain-test.iam.gserviceaccount.com", "gputrain-test") as md,
        GcsEmulator(bucket="gputrain-wd-bucket") as gcs,
    ):
        for name, zone in NODES:
            compute.add_instance(name, zone, labels={"gputrain-stack": "wd"})
        compute.required_token = md.token  # only the VM's own credentials may delete
        yield compute, md, gcs


def start(
    run_dir: Path,
    node: str,
    autodown_s: float | None,
    cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator],
    notify: list[str] | None = None,
    budget: dict[str, float] | None = None,
    guard: FakePubSub | None = None,
    log_to: str | None = None,  # a path for the watchdog's output instead of a pipe
) -> subprocess.Popen[str]:
    compute, md, gcs = cloud
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "heartbeat").touch()
    config = {
        "stack": "wd",
        "run_id": "r1",
        "node": node,
        "head": node == "wd-node-0",
        "project": "gputrain-test",
        "instances": [list(n) for n in NODES],
        "bucket": "gs://gputrain-wd-bucket/team/",
        "autodown_s": autodown_s,
        "poll_s": 0.2,
        "heartbeat_s": 0.3,
        "notify": notify or [],
        "budget": budget,
        "guard": guard.subscription if guard else None,
        "guard_poll_s": 0.5,
        "env": {
            "STORAGE_EMULATOR_HOST": gcs.url,
            "GCE_METADATA_HOST": md.address,
            "GCE_METADATA_IP": md.address,
            "GPUTRAIN_COMPUTE_ENDPOINT": compute.url,
            "GPUTRAIN_PUBSUB_ENDPOINT": guard.url if guard else "",
        },
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GCE_", "GOOGLE_"))}
    env["HOME"] = str(run_dir)  # no gcloud credentials of the machine running the tests
    output = subprocess.PIPE if log_to is None else open(log_to, "w")  # noqa: SIM115
    p = subprocess.Popen(
        [sys.executable, str(WATCHDOG)],
        cwd=run_dir,
        stdin=subprocess.PIPE,
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    if log_to is not None:
        output.close()
    assert p.stdin is not None
    p.stdin.write(json.dumps(config))
    p.stdin.close()
    return p


def end_job(run_dir: Path, rc: int = 0) -> None:
    (run_dir / "out").mkdir(exist_ok=True)
    (run_dir / "out" / "summary.json").write_text('{"final_loss": 1.5}')
    (run_dir / "logs" / "attempt_0").mkdir(parents=True, exist_ok=True)
    (run_dir / "logs" / "attempt_0" / "error.json").write_text("{}")
    (run_dir / "torchrun.log").write_text("step 1/1 | loss 1.5\n")
    (run_dir / "exitcode").write_text(f"{rc} {time.time()}\n")


def wait(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    assert proc.stdout is not None
    proc.wait(timeout=timeout)
    return proc.stdout.read()


def test_results_in_the_bucket_then_workers_deleted_before_the_head(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    compute, md, gcs = cloud
    head_dir, worker_dir = tmp_path / "head", tmp_path / "worker"
    sink = HttpSink().start()
    head = start(head_dir, "wd-node-0", 2.0, cloud, [sink.url + "/hook/s3cr3t"])
    worker = start(worker_dir, "wd-node-1", 2.0, cloud)
    time.sleep(1.5)
    assert compute.deletes == []  # the job runs: nothing happens, whatever the heartbeat says
    end_job(worker_dir)
    end_job(head_dir)
    ended = time.time()
    out_worker, out_head = wait(worker), wait(head)
    assert worker.returncode == 0 and head.returncode == 0, out_worker + out_head
    names = gcs.names("team/runs/r1/")
    for node in ("wd-node-0", "wd-node-1"):
        for f in ("summary.json", "torchrun.log", "exitcode", "torchrun-logs/attempt_0/error.json"):
            assert f"team/runs/r1/{node}/{f}" in names, names
    # workers first, the head last, each with the VM's own token
    assert [(n, a) for _, n, a in compute.deletes] == [
        ("wd-node-1", f"Bearer {md.token}"),
        ("wd-node-0", f"Bearer {md.token}"),
    ]
    assert not compute.instances
    record = json.loads(gcs.read("team/.gputrain/autodown.json"))
    assert record["run_id"] == "r1" and record["instances"] == ["wd-node-1", "wd-node-0"]
    assert ended - 1 <= record["job_ended_at"] <= record["deleted_at"] <= time.time()
    # the controller was gone: the head said "finished" itself, then "autodown"
    finished, down = sink.wait_for("finished", 5), sink.wait_for("autodown", 5)
    sink.stop()
    assert finished["run_id"] == "r1" and finished["stack"] == "wd" and finished["nodes"] == 2
    assert finished["text"].startswith("gputrain finished: run r1 on wd")
    assert down["text"].startswith("gputrain autodown: run r1 on wd; the job ended at")
    assert "s3cr3t" not in out_head + out_worker


def test_a_live_heartbeat_keeps_the_cluster_and_a_disarm_ends_the_watchdog(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    compute, _, gcs = cloud
    head_dir = tmp_path / "head"
    sink = HttpSink().start()
    head = start(head_dir, "wd-node-0", 1.5, cloud, [sink.url])
    end_job(head_dir)
    # a controller that touches the heartbeat every 0.2 s: 4 s at least (the autodown is 1.5 s),
    # and until the results are in the bucket (slower on a loaded machine)
    start_s = time.monotonic()
    while time.monotonic() - start_s < 4 or (
        "team/runs/r1/wd-node-0/summary.json" not in gcs.names("team/")
        and time.monotonic() - start_s < 30
    ):
        (head_dir / "heartbeat").touch()
        time.sleep(0.2)
    assert compute.deletes == []
    assert "team/runs/r1/wd-node-0/summary.json" in gcs.names("team/")
    (head_dir / "watchdog.disarm").touch()
    out = wait(head, 10)
    assert "disarmed" in out and compute.deletes == [] and len(compute.instances) == 2
    assert sink.events() == []  # the controller is alive: it tells the webhooks itself
    sink.stop()


def test_a_hold_from_the_next_runs_controller_delays_autodown_not_the_end_message(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    """This run's controller is gone; another one readying the next run renews the node's
    AUTODOWN_HOLD: no delete while it does, autodown once the hold is as old as autodown. The
    run's end is still said at once (its own controller is the one that is gone)."""
    compute, _, _ = cloud
    state = tmp_path / ".gputrain"
    head_dir, hold = state / "runs" / "r1", state / contract.AUTODOWN_HOLD
    sink = HttpSink().start()
    head = start(head_dir, "wd-node-0", 1.5, cloud, [sink.url])
    long_ago = time.time() - 3600
    os.utime(head_dir / "heartbeat", (long_ago, long_ago))
    end_job(head_dir)
    start_s = time.monotonic()
    while time.monotonic() - start_s < 4:
        hold.touch()
        touched = time.monotonic()
        time.sleep(0.2)
    time.sleep(max(0.0, touched + 1.0 - time.monotonic()))  # the hold still younger than autodown
    assert compute.deletes == [] and head.poll() is None
    assert sink.wait_for("finished", 10)["run_id"] == "r1"
    out = wait(head, 30)
    assert head.returncode == 0 and "autodown" in out, out
    assert [n for _, n, _ in compute.deletes] == ["wd-node-1", "wd-node-0"]
    sink.stop()


def test_a_stale_exit_code_from_an_earlier_attempt_is_not_the_end(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    compute, _, gcs = cloud
    head_dir = tmp_path / "head"
    head_dir.mkdir()
    (head_dir / "exitcode").write_text("137 1\n")
    os.utime(head_dir / "exitcode", (time.time() - 60, time.time() - 60))
    head = start(head_dir, "wd-node-0", 1.0, cloud)
    time.sleep(2.5)
    assert compute.deletes == [] and not gcs.names("team/runs/")
    (head_dir / "watchdog.disarm").touch()
    wait(head, 10)


def test_a_full_disk_or_an_odd_summary_never_keeps_the_cluster(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    """Every line the watchdog writes fails (its log on a full disk: /dev/full) and the trainer
    left `null` as its summary.json, with the controller gone: the results still go up and the
    cluster is still deleted."""
    compute, _, gcs = cloud
    head_dir = tmp_path / "head"
    head = start(head_dir, "wd-node-0", 0.5, cloud, log_to="/dev/full")
    end_job(head_dir, rc=1)
    (head_dir / "out" / "summary.json").write_text("null")
    worker = start(tmp_path / "worker", "wd-node-1", 0.5, cloud)
    end_job(tmp_path / "worker", rc=1)
    wait(worker, 30)
    head.wait(timeout=60)
    assert head.returncode == 0
    assert [n for _, n, _ in compute.deletes] == ["wd-node-1", "wd-node-0"]
    assert "team/runs/r1/wd-node-0/exitcode" in gcs.names("team/runs/")


def test_an_earlier_attempts_end_marker_is_not_this_attempts(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    """A relaunch (or `--resume`) of the run: the worker's marker from the attempt before is in
    the bucket. The head, its controller long silent, waits for this attempt's (its results and
    log), and deletes the worker only once it is there."""
    compute, _, gcs = cloud
    old = {"node": "wd-node-1", "ended_at": time.time() - 3600, "exit_code": "143"}
    gcs.write("team/runs/r1/wd-node-1/.gputrain-ended.json", json.dumps(old).encode())
    head_dir, worker_dir = tmp_path / "head", tmp_path / "worker"
    head = start(head_dir, "wd-node-0", 20.0, cloud)
    worker = start(worker_dir, "wd-node-1", 20.0, cloud)
    long_ago = time.time() - 3600
    os.utime(head_dir / "heartbeat", (long_ago, long_ago))  # the controller is gone
    end_job(head_dir)
    time.sleep(3)
    assert compute.deletes == []  # the worker's job still runs
    end_job(worker_dir)
    wait(worker, 30)
    out = wait(head, 30)
    assert [n for _, n, _ in compute.deletes] == ["wd-node-1", "wd-node-0"], out
    assert "no results from" not in out


def test_an_earlier_attempts_budget_mark_is_not_this_attempts_stop(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    """`train --resume` after a budget stop, on a kept head whose run dir still holds that stop's
    mark: this attempt's end (here killed) goes up and is said as what it is, `failed`, never
    `stopped_by: budget` (reconcile would not recover it) or the `budget` event."""
    _, _, gcs = cloud
    head_dir = tmp_path / "head"
    (head_dir / "watch").mkdir(parents=True)
    stop = {"budget_usd": 400.0, "spent_usd": 398.7, "hourly_usd": 38.18, "at": time.time() - 3600}
    (head_dir / "watch" / "budget.json").write_text(json.dumps(stop))
    sink = HttpSink().start()
    try:
        head = start(head_dir, "wd-node-0", None, cloud, [sink.url])
        long_ago = time.time() - 3600
        os.utime(head_dir / "heartbeat", (long_ago, long_ago))  # the controller is gone
        end_job(head_dir, rc=137)
        out = wait(head, 30)
        marker = json.loads(gcs.read("team/runs/r1/wd-node-0/.gputrain-ended.json"))
        assert "stopped_by" not in marker and marker["exit_code"] == "137", out
        assert sink.wait_for("failed", 10)["text"].endswith("exit code 137")
        assert sink.events() == ["failed"]
    finally:
        sink.stop()


def test_the_kill_after_a_budget_stop_comes_within_the_interval_looked_ahead() -> None:
    """The rule stops the run an interval before the budget (what a stop takes): the grace a
    job gets after its SIGTERM is half of it, so the kill and the teardown fit (300 s overshot
    the default 120 s interval by about three minutes of the cluster's rate)."""
    budget = Budget(usd=10.0, hourly_usd=100.0, elapsed_s=0.0, interval_s=120.0)
    assert budget.grace_s == 60.0
    assert Budget(usd=1.0, hourly_usd=1.0, elapsed_s=0.0, interval_s=0.0).grace_s == 10.0


def test_a_job_killed_after_the_budgets_grace_still_gets_its_exit_code(tmp_path: Path) -> None:
    """The budget stop's SIGKILL, after the job ignored its SIGTERM: torchrun and its workers
    (in sessions of their own, as torch starts them) die, run.sh lives to write the exit code
    the watch waits for; killing run.sh's whole group left no exit code and the VMs billing."""
    from gputrain_node.watchdog import kill_job

    stubborn = (
        f"{sys.executable} -c 'import signal, subprocess, sys, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        'subprocess.Popen(["sleep", "60"], start_new_session=True); time.sleep(60)\''
    )
    run_sh = (
        f"echo $$ > pgid; {stubborn} & JOB=$!; echo $JOB > jobpid; trap : TERM; "
        "wait $JOB; rc=$?; while kill -0 $JOB 2>/dev/null; do wait $JOB; rc=$?; done; "
        'echo "$rc $(date +%s)" > exitcode'
    )
    shell = subprocess.Popen(["sh", "-c", run_sh], cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "jobpid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the grandchild started
        os.killpg(shell.pid, 15)  # the budget's SIGTERM: ignored
        time.sleep(0.3)
        assert shell.poll() is None and not (tmp_path / "exitcode").exists()
        kill_job(tmp_path)
        assert shell.wait(timeout=10) == 0
        assert (tmp_path / "exitcode").read_text().split()[0] == "137"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, 9)


def test_a_worker_delete_gce_took_but_did_not_carry_out_is_asked_again(tmp_path: Path) -> None:
    """The worker still runs when the wait for it is over: its delete is sent once more and said,
    then the head deletes itself (nothing of ours would be left to ask again)."""
    from gputrain_node.watchdog import Config, autodown

    class Stubborn:  # the worker's delete is taken, never carried out; the head's is
        def __init__(self) -> None:
            self.deletes: list[str] = []

        def exists(self, name: str, zone: str) -> bool:
            return name == "wd-node-1"

        def delete(self, name: str, zone: str) -> None:
            self.deletes.append(name)

    now = [1000.0]
    compute = Stubborn()
    with GcsEmulator(bucket="gputrain-wd-bucket") as gcs:
        config = {"stack": "wd", "run_id": "r1", "node": "wd-node-0", "head": True}
        config |= {"project": "p", "instances": NODES, "bucket": "gs://gputrain-wd-bucket/t/"}
        cfg = Config.parse(config | {"autodown_s": 1.0})
        bucket = gcs.client().bucket("gputrain-wd-bucket")
        tick = lambda s: now.__setitem__(0, now[0] + s)  # noqa: E731
        autodown(cfg, bucket, compute, 990.0, clock=lambda: now[0], sleep=tick, gone_deadline_s=30)  # type: ignore[arg-type]
    assert compute.deletes == ["wd-node-1", "wd-node-1", "wd-node-0"]


def test_no_autodown_uploads_the_results_and_deletes_nothing(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    compute, _, gcs = cloud
    head_dir = tmp_path / "head"
    head = start(head_dir, "wd-node-0", None, cloud)
    end_job(head_dir, rc=3)
    out = wait(head, 30)
    assert head.returncode == 0, out
    assert compute.deletes == []
    marker = json.loads(gcs.read("team/runs/r1/wd-node-0/.gputrain-ended.json"))
    assert marker["exit_code"] == "3"
    assert (head_dir / contract.WATCHDOG_UPLOADED).is_file()  # what a teardown's settle waits for


def test_a_pid_files_number_counts_only_while_its_process_is_the_runs(tmp_path: Path) -> None:
    """A run killed without a word (SIGKILL, a reboot that kept the disk) leaves its pid files; the
    kernel gives their numbers to new processes, which are not the run's: never signalled, and
    no run "still training" that holds autodown off."""
    runs = tmp_path / "runs"
    gone, live, mine = runs / "gone", runs / "live", runs / "mine"
    for d in (gone, live / "code", mine):
        d.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "30"], cwd=tmp_path)
    torchrun = subprocess.Popen(["sleep", "30"], cwd=live / "code")
    try:
        (gone / "jobpid").write_text(f"{other.pid}\n")
        (gone / "pgid").write_text(f"{other.pid}\n")
        assert job_pid(gone, "jobpid") is None and job_pid(gone, "pgid") is None
        assert other_job_running(mine) is None
        (live / "jobpid").write_text(f"{torchrun.pid}\n")
        assert job_pid(live, "jobpid") == torchrun.pid
        assert other_job_running(mine) == "live"
        assert job_pid(runs / "nowhere", "jobpid") is None
    finally:
        for proc in (other, torchrun):
            proc.kill()
            proc.wait()


def test_no_autodown_while_another_run_still_trains_on_the_node(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    compute, _, _ = cloud
    other = tmp_path / "runs" / "r0"  # a detached run the user started before, still training
    other.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "30"], cwd=other)  # its torchrun, in its run dir
    (other / "jobpid").write_text(str(sleeper.pid))
    try:
        head_dir = tmp_path / "runs" / "r1"
        head = start(head_dir, "wd-node-0", 1.0, cloud)
        end_job(head_dir)
        # its lines as it goes (the results' upload first: slower on a loaded machine), until
        # it says why it waits; it cannot end meanwhile, r0 still trains
        assert head.stdout is not None
        seen, deadline = "", time.monotonic() + 60  # a watchdog that never says it: a failure
        while "run r0 still trains on this node" not in seen:
            ready, _, _ = select.select([head.stdout], [], [], deadline - time.monotonic())
            assert ready, f"no 'still trains' line within 60 s: {seen}"
            line = head.stdout.readline()
            assert line, seen
            seen += line
        assert compute.deletes == []
        sleeper.kill()
        sleeper.wait()
        (other / "exitcode").write_text("0 1\n")
        out = seen + wait(head, 30)
        assert [n for _, n, _ in compute.deletes] == ["wd-node-1", "wd-node-0"], out
    finally:
        sleeper.kill()


def test_a_webhook_that_trickles_its_answer_delays_no_delete(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    """A byte a second never trips urllib's per-read timeout: the deletes go on regardless, and
    the watchdog gives the notifications their total deadline, not forever."""
    compute, _, _ = cloud
    head_dir, worker_dir = tmp_path / "head", tmp_path / "worker"
    sink = HttpSink("trickle", hang_s=300).start()
    try:
        head = start(head_dir, "wd-node-0", 1.0, cloud, [sink.url + "/hook"])
        worker = start(worker_dir, "wd-node-1", 1.0, cloud)
        assert head.stdout is not None and "armed" in head.stdout.readline()
        time.sleep(3)  # its clock read after the imports: an exit code older is an earlier one's
        end_job(worker_dir, rc=1)
        end_job(head_dir, rc=1)
        ended = time.monotonic()
        deadline = ended + 60
        while len(compute.deletes) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        deleted = time.monotonic()
        assert [n for _, n, _ in compute.deletes] == ["wd-node-1", "wd-node-0"]
        assert deleted - ended < 20, deleted - ended  # autodown 1 s + the uploads, no webhook
        out = wait(head, 60) + wait(worker, 10)  # its notifications' deadline, then it ends
        assert time.monotonic() - ended < 60
        assert "not sent within its deadline" in out, out
        assert sink.events()[:2] == ["failed", "autodown"]  # both were sent, in that order
    finally:
        sink.stop()


def test_the_budget_rule_stops_when_the_next_interval_would_pass_it() -> None:
    assert not over_budget(9.0, 1.0, 10.0)  # exactly at the budget after the interval: not yet
    assert over_budget(9.0, 1.01, 10.0) and over_budget(10.5, 0.0, 10.0)
    b = Budget(usd=10.0, hourly_usd=36.0, elapsed_s=0.0, interval_s=100.0)  # $1 per 100 s
    assert b.spent(900.0, 1000.0) == 0.0 and b.spent(1100.0, 1000.0) == pytest.approx(1.0)
    assert not b.reached(1000.0 + 900, 1000.0)  # $9 spent, $1 ahead: $10, not past it
    assert b.reached(1000.0 + 901, 1000.0)
    assert Budget.parse(None) is None
    setting = {"usd": 10, "hourly_usd": 36, "elapsed_s": 0, "interval_s": 100, "before_usd": 0}
    assert Budget.parse(setting) == b
    # what `up`'s partial creates billed for the run before it counts: $2 before, $7 spent
    before = Budget.parse(setting | {"before_usd": 2})
    assert before is not None and before.spent(1700.0, 1000.0) == pytest.approx(9.0)
    assert not before.reached(1000.0 + 700, 1000.0) and before.reached(1000.0 + 701, 1000.0)
    cfg = Config.parse(
        {"stack": "s", "run_id": "r", "node": "n", "head": True, "project": "p",
         "instances": [], "bucket": "gs://b/", "autodown_s": 600, "heartbeat_s": 10}
    )  # fmt: skip
    # after a budget stop the cluster goes once the controller is gone, not after autodown
    assert autodown_after(cfg, budget_stopped=False) == 600
    assert autodown_after(cfg, budget_stopped=True) == 30


def test_the_head_counts_the_budget_on_its_own_clock_whatever_the_controllers_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A laptop whose clock is an hour ahead arms the head 10 minutes into the run: the head
    counts those 10 minutes, then its own time since it was armed; a start time of day from the
    laptop's clock would have counted nothing for an hour."""
    from scripts.job.autodown import Autodown, RunBudget

    laptop_now = time.time() + 3600
    run = RunBudget(usd=10.0, hourly_usd=36.0, started_at=laptop_now - 600, interval_s=100.0)
    plan = Autodown("wd", "p", "gs://b/", (("wd-node-0", "z"),), 600, budget=run)
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: laptop_now)
        setting = json.loads(plan.config("r1", "wd-node-0", {}))
    assert set(setting["budget"]) == set(contract.BUDGET_FIELDS)
    budget = Config.parse(setting).budget
    assert budget is not None
    armed = time.time()  # the head's clock
    assert budget.spent(armed, armed) == pytest.approx(6.0)  # $36/h for 10 minutes
    assert budget.spent(armed + 300, armed) == pytest.approx(9.0)
    assert not budget.reached(armed + 300, armed) and budget.reached(armed + 301, armed)
    assert run.reached(laptop_now + 301) and not run.reached(laptop_now + 300)  # the same rule
    # $1.50 that `up`'s partial creates billed before the run: both sides count it
    spent = dataclasses.replace(run, before_usd=1.5)
    plan = dataclasses.replace(plan, budget=spent)
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: laptop_now)
        counted = Config.parse(json.loads(plan.config("r1", "wd-node-0", {}))).budget
    assert counted is not None and counted.spent(armed, armed) == pytest.approx(7.5)
    assert counted.reached(armed + 151, armed) and not counted.reached(armed + 149, armed)
    assert spent.reached(laptop_now + 151) and not spent.reached(laptop_now + 149)


def test_the_head_stops_the_job_at_the_budget_and_ends_the_cluster(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    """Budget $1 at $720/h looking 1 s ahead (a late start of the watchdog process on a loaded
    machine leaves the stop within the budget): four seconds after the run's start the head
    marks the run, SIGTERMs the job's process group (a stand-in that records 143, as run.sh
    does), uploads the mark with the results, says `budget` (the controller is silent) and
    deletes the VMs long before its 30 s autodown."""
    compute, _, gcs = cloud
    head_dir, worker_dir = tmp_path / "head", tmp_path / "worker"
    sink = HttpSink().start()
    budget = {
        "usd": 1.0,
        "hourly_usd": 720.0,
        "elapsed_s": 0.0,
        "interval_s": 1.0,
        "before_usd": 0.0,
    }
    try:
        head = start(head_dir, "wd-node-0", 30.0, cloud, [sink.url], budget=budget)
        worker = start(worker_dir, "wd-node-1", 30.0, cloud)
        assert head.stdout is not None and "budget $1.00 at $720.00/h" in head.stdout.readline()
        job = subprocess.Popen(
            ["sh", "-c", 'trap \'echo "143 $(date +%s.%N)" > exitcode; exit 143\' TERM; '
             "while :; do sleep 0.1; done"],
            cwd=head_dir, start_new_session=True,
        )  # fmt: skip
        (head_dir / "pgid").write_text(f"{job.pid}\n")
        assert job.wait(timeout=30) == 143  # the SIGTERM reached it
        stop = json.loads((head_dir / "watch" / "budget.json").read_text())
        assert stop["budget_usd"] == 1.0 and 0.5 <= stop["spent_usd"] <= 1.0, stop
        end_job(worker_dir, rc=143)  # its ranks stopped with the head's (the all-reduced flag)
        out = wait(head, 60)
        wait(worker, 30)
        assert [n for _, n, _ in compute.deletes] == ["wd-node-1", "wd-node-0"], out
        assert "stopped at the budget: $" in out and "SIGTERM to the job" in out
        assert "team/runs/r1/wd-node-0/watch/budget.json" in gcs.names("team/runs/")
        marker = json.loads(gcs.read("team/runs/r1/wd-node-0/.gputrain-ended.json"))
        assert marker["stopped_by"] == "budget" and marker["exit_code"] == "143"
        event = sink.wait_for("budget", 10)
        assert event["text"].startswith("gputrain budget: run r1 on wd; stopped at the budget: $")
        assert event["budget_usd"] == 1.0
        assert sink.events() == ["budget", "autodown"]  # never "failed" as well
        record = json.loads(gcs.read("team/.gputrain/autodown.json"))
        assert record["deleted_at"] - stop["at"] < 20  # not the 30 s autodown
        assert record["budget"] == stop  # `status` says why
    finally:
        sink.stop()


SUBSCRIPTION = "projects/gputrain-test/subscriptions/gputrain-wd-budget"


def notification(cost: float, amount: float = 5.0) -> dict[str, object]:
    """A Cloud Billing budget notification's JSON (its documented fields)."""
    return {"budgetDisplayName": "gputrain-wd-budget", "costAmount": cost,
            "costIntervalStart": "2026-11-01T07:00:00Z", "budgetAmount": amount,
            "budgetAmountType": "SPECIFIED_AMOUNT", "currencyCode": "USD"}  # fmt: skip


def test_a_notification_at_or_past_its_amount_is_the_guards_stop() -> None:
    import base64

    def received(data: object) -> dict[str, object]:
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        return {"ackId": "a", "message": {"data": base64.b64encode(raw).decode()}}

    assert guard_reached([received(notification(4.99))]) is None
    assert guard_reached([received(b"not json"), received({"costAmount": 9})]) is None
    hit = guard_reached([received(notification(4.0)), received(notification(5.0))])
    assert hit is not None and hit["spent_usd"] == 5.0 and hit["budget_usd"] == 5.0
    assert hit["by"] == "billingBudget"
    # its budget month (from costIntervalStart, 2026-11-01T07:00Z) still on, or over
    november, december = 1_795_000_000.0, 1_797_000_000.0  # 2026-11-18, 2026-12-11 (UTC)
    assert guard_reached([received(notification(5.0))], november) is not None
    assert guard_reached([received(notification(5.0))], december) is None  # last month's


def test_the_billing_budget_notification_stops_the_job_and_ends_the_cluster(
    tmp_path: Path, cloud: tuple[FakeCompute, FakeMetadata, GcsEmulator]
) -> None:
    """The head pulls the guard's subscription with the VM's token: a notification under the
    amount is acknowledged and changes nothing; one at the amount marks the run, SIGTERMs the
    job, says `budget` with the billing budget's text and deletes the VMs."""
    compute, md, _gcs = cloud
    head_dir, worker_dir = tmp_path / "head", tmp_path / "worker"
    sink = HttpSink().start()
    with FakePubSub(SUBSCRIPTION) as pubsub:
        pubsub.required_token = md.token
        pubsub.publish(notification(2.5), schemaVersion="1.0")
        started: list[subprocess.Popen[str] | subprocess.Popen[bytes]] = []
        try:
            head = start(head_dir, "wd-node-0", 30.0, cloud, [sink.url], guard=pubsub)
            worker = start(worker_dir, "wd-node-1", 30.0, cloud)
            started += [head, worker]
            deadline = time.time() + 30
            while not pubsub.acked and time.time() < deadline:
                time.sleep(0.1)
            assert pubsub.acked == ["ack-1"]  # read and acknowledged; under the amount: no stop
            # the job after the watchdog's arming (a process group older than it is an earlier
            # attempt's, never signalled)
            job = subprocess.Popen(
                ["sh", "-c", 'trap \'echo "143 $(date +%s.%N)" > exitcode; exit 143\' TERM; '
                 "while :; do sleep 0.1; done"],
                cwd=head_dir, start_new_session=True,
            )  # fmt: skip
            started.append(job)
            (head_dir / "pgid").write_text(f"{job.pid}\n")
            time.sleep(1.0)  # two pulls: nothing new, the job runs on
            assert job.poll() is None and not (head_dir / "watch" / "budget.json").exists()
            pubsub.publish(notification(5.25))
            assert job.wait(timeout=30) == 143
            stop = json.loads((head_dir / "watch" / "budget.json").read_text())
            assert stop["by"] == "billingBudget" and stop["spent_usd"] == 5.25, stop
            assert pubsub.acked == ["ack-1"]  # the one that stopped it is left for the next run
            end_job(worker_dir, rc=143)
            out = wait(head, 60)
            wait(worker, 30)
            assert [n for _, n, _ in compute.deletes] == ["wd-node-1", "wd-node-0"], out
            assert "stopped at the stack's Cloud Billing budget: $5.25 of $5.00" in out
            event = sink.wait_for("budget", 10)
            assert "Cloud Billing budget" in event["text"]
            assert sink.events() == ["budget", "autodown"]
            # the next run's guard, its first pull: stopped at once, as the month is spent
            from gputrain_node.budget_guard import Guard

            os.environ["GCE_METADATA_HOST"] = md.address
            os.environ["GPUTRAIN_PUBSUB_ENDPOINT"] = pubsub.url
            try:
                nxt = Guard(SUBSCRIPTION, 60.0, print).reached(time.time())
            finally:
                del os.environ["GCE_METADATA_HOST"], os.environ["GPUTRAIN_PUBSUB_ENDPOINT"]
            assert nxt is not None and nxt["spent_usd"] == 5.25
        finally:
            sink.stop()
            for proc in started:  # a failed assertion leaves nothing running
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
