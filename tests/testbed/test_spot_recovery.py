"""A spot run survives preemption, end to end: `gputrain run --stack` on the sshd test bed with the
real trainer, its checkpoints in a real Cloud Storage emulator on the bridge. The fake Compute
server marks node 2 preempted and the test kills every process on it mid-training; the fake stack's
`up` brings it back as a new host with a NEW host key; training finishes with the same final loss
and parameters as an uninterrupted run. Recoveries run out; a crash is never retried; Ctrl-C during
the re-creation still destroys everything."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.http_sink import HttpSink
from tests.support.stack_world import ZONES, World, assert_torn_down

pytestmark = [pytest.mark.testbed, pytest.mark.filterwarnings("ignore:Unable to enable fault")]


def last_run(w: World) -> Path:
    target = w.dir / "runs" / "stack-e2e"
    return target / (target / "LAST_RUN").read_text().strip()


def test_preempted_node_comes_back_and_the_run_ends_as_if_uninterrupted(
    world: Callable[..., World],
    uninterrupted: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    w = world(bucket=True)
    killed: list[float] = []

    def preempt() -> None:
        old_key = w.node_hosts["e2e-node-1"].host_key
        killed.append(time.time())
        w.preempt("e2e-node-1")
        killed.append(hash(old_key))

    t = w.at_checkpoint(20, preempt)
    with HttpSink() as sink:  # the run's webhook: every event, the recovery's two included
        rc = w.run_trainer("--notify", sink.url + "/hook")
        events = sink.events()
    t.join(timeout=5)
    out, err = capsys.readouterr()
    assert rc == 0, out[-4000:]
    assert "could not download" not in err, err
    assert events == ["started", "preempted", "recovered", "finished"], events
    assert killed, "the run ended before a checkpoint reached the bucket"
    # One recovery, in one line; the same zone; the run's own checkpoints resumed it.
    [line] = [ln for ln in out.splitlines() if ln.startswith("recovery 1/3: ")]
    assert "e2e-node-1 preempted at" in line and "us-central1-a" in line
    ups = [c for c in w.runner.calls if c[0] in ("up", "refresh")]
    assert ups[:3] == [("up", "us-central1-a"), ("refresh",), ("up", "us-central1-a")]
    # The VM came back as a new host with a new host key, pinned from its guest attributes.
    assert len(w.hosts) == 3 and hash(w.node_hosts["e2e-node-1"].host_key) != killed[1]
    assert len(w.compute.requests_matching("/instances/e2e-node-1/getGuestAttributes")) >= 2
    # The run's record and summary tell the story.
    run_dir = last_run(w)
    [recovery] = json.loads((run_dir / "job.json").read_text())["recoveries"]
    assert recovery["nodes"] == ["e2e-node-1"] and recovery["resumed_from"] >= 20
    assert recovery["steps_repeated"] >= 0 and recovery["downtime_s"] > 0
    assert "recoveries" in out and "1 (e2e-node-1)" in out and "steps repeated" in out
    (segment,) = run_dir.glob("ledger-*.json")  # its cost-ledger record (one segment)
    ledger = json.loads(segment.read_text())
    assert ledger["recoveries"] == 1 and ledger["downtime_s"] == round(recovery["downtime_s"], 1)
    assert w.run("cost", "--stack", "e2e", "--json") == 0  # as `cost` shows it
    (record,) = json.loads(capsys.readouterr().out)["runs"]
    assert record["run_id"] == run_dir.name and record["recoveries"] == 1
    assert record["downtime_s"] == ledger["downtime_s"] > 0
    assert (run_dir / "e2e-node-0" / "torchrun.attempt1.log").is_file()  # the first attempt's log
    # Same end as an uninterrupted run: loss and every parameter, bit for bit.
    summary = json.loads((run_dir / "e2e-node-0" / "summary.json").read_text())
    assert summary["resumed_from"] == recovery["resumed_from"]
    reference = uninterrupted  # the same TRAIN, never interrupted (tests/testbed/conftest.py)
    assert summary["final_loss"] == reference["final_loss"]
    assert set(summary["param_checksums"]) == set(reference["param_checksums"])
    assert summary["params_in_sync"]
    assert_torn_down(w)  # the bucket too: its newest checkpoint was home already


def test_recoveries_run_out_and_the_stack_is_destroyed(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-recoveries 1: the first preemption is survived, the second (after the resume got
    past step 50) ends the run, destroyed, with the reason. (The trainer's stand-in: the
    subject is the count, not the trainer's resume.)"""
    w = world(bucket=True)
    second: list[threading.Thread] = []

    def first() -> None:
        w.preempt("e2e-node-1")
        second.append(w.at_checkpoint(50, lambda: w.preempt("e2e-node-1"), after_up=2))

    t = w.at_checkpoint(20, first)
    rc = w.run_steps("--max-recoveries", "1")
    t.join(timeout=5)
    captured = capsys.readouterr()
    assert rc == 1, captured.err
    assert "recovery 1/1: e2e-node-1 preempted" in captured.out
    assert "GCE preempted e2e-node-1 (compute.instances.preempted at" in captured.err
    assert "--max-recoveries 1 allows no more recoveries (1 done)" in captured.err
    assert w.runner.call_names().count("up") == 2
    assert len(json.loads((last_run(w) / "job.json").read_text())["recoveries"]) == 1
    # Nothing lost: the newest checkpoint is home, then everything is gone.
    assert list(last_run(w).rglob("ckpt-*.pt"))
    assert_torn_down(w)


def test_a_killed_node_that_was_not_preempted_is_a_crash(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(bucket=True)  # the test job, not the trainer: the subject is the kill's verdict
    assert w.gcs is not None
    t = w.at_job_start(lambda: w.bed.kill_processes(w.node_hosts["e2e-node-1"].name))
    rc = w.run_job("sleep", "--env", f"STORAGE_EMULATOR_HOST={w.gcs.url}")
    t.join(timeout=5)
    captured = capsys.readouterr()
    assert rc == 1 and "failed on node" in captured.err
    assert "recovery" not in captured.out
    assert w.runner.call_names().count("up") == 1  # not retried
    assert_torn_down(w)


def test_ctrl_c_while_the_cluster_is_recreated_still_destroys_everything(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(bucket=True)
    real_up = w.runner.up
    ups: list[int] = []

    def interrupted_up(*args: Any, **kwargs: Any) -> dict[str, Any]:
        ups.append(1)
        if len(ups) == 2:  # the re-creation: the user presses Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        return real_up(*args, **kwargs)

    w.runner.up = interrupted_up  # type: ignore[method-assign]
    assert w.gcs is not None
    t = w.at_job_start(lambda: w.preempt("e2e-node-1"))  # the test job: no resume is asserted
    rc = w.run_job("sleep", "--env", f"STORAGE_EMULATOR_HOST={w.gcs.url}")
    t.join(timeout=5)
    err = capsys.readouterr().err
    assert rc == 130, err
    assert "SIGINT" in err and len(ups) == 2
    assert_torn_down(w)


def test_a_failed_recreation_ends_destroyed_with_the_reason(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(bucket=True)  # the trainer's stand-in: no resume happens

    def preempt_then_quota_runs_out() -> None:
        w.runner.fail_quota(ZONES[0], "PREEMPTIBLE_NVIDIA_L4_GPUS")
        w.preempt("e2e-node-1")

    t = w.at_checkpoint(20, preempt_then_quota_runs_out)
    rc = w.run_steps()
    t.join(timeout=5)
    err = capsys.readouterr().err
    assert rc == 1
    assert "recovery 1/3 of run" in err and "failed: could not create the cluster" in err
    assert "PREEMPTIBLE_NVIDIA_L4_GPUS" in err
    assert [c[1] for c in w.runner.calls if c[0] == "up"] == [ZONES[0], ZONES[0]]  # quota: stop
    assert list(last_run(w).rglob("ckpt-*.pt"))  # the checkpoints came home first
    assert_torn_down(w)


#: A third-party job: attempt 1 trains (sleeps) until GCE takes its worker; the relaunch fails
#: for its own reason, a missing file, on every rank.
FAILS_AFTER_RELAUNCH = """import os, sys, time
from pathlib import Path
attempt, rank = os.environ.get("GPUTRAIN_ATTEMPT", "1"), os.environ.get("RANK", "0")
(Path(sys.argv[1]) / f"attempt-{attempt}-rank-{rank}").write_text(str(os.getpid()))
print(f"attempt {attempt} rank {rank} started", flush=True)
if attempt == "1":
    time.sleep(120)
open("data/missing-shard.bin")
"""


def test_an_application_failure_after_a_recovery_is_not_a_second_preemption(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """GCE's clock runs 10 minutes ahead of the controller's (a laptop's clock lags): the first
    preemption's operation looks recent after the relaunch, but it is counted once. The
    relaunch's own failure ends the run with its root cause, at once."""
    w = world()
    w.compute.clock_offset_s = 600.0
    (w.dir / "flaky.py").write_text(FAILS_AFTER_RELAUNCH)
    w.marker.mkdir(parents=True, exist_ok=True)
    w.marker.chmod(0o777)

    def preempt_when_training() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (w.marker / "attempt-1-rank-1").exists():
                w.preempt("e2e-node-1")
                return
            time.sleep(0.1)

    t = threading.Thread(target=preempt_when_training, daemon=True)
    t.start()
    began = time.monotonic()
    rc = w.run(
        "run", "--stack", "e2e", "--yes", "--skip-preflight", "--", "flaky.py", str(w.marker)
    )
    took = time.monotonic() - began
    t.join(timeout=5)
    out, err = capsys.readouterr()
    assert rc == 1, out[-3000:] + err[-3000:]
    assert (w.marker / "attempt-2-rank-1").exists()  # the relaunch ran
    assert "recovering (1/3)" in out + err
    assert "recovering (2/3)" not in out + err, err[-3000:]
    [line] = [ln for ln in out.splitlines() if ln.startswith("recovery 1/3: ")]
    assert "training again -" not in line, line  # GCE's clock is not ours
    assert w.runner.call_names().count("up") == 2  # one re-creation
    assert "FileNotFoundError" in err and "missing-shard.bin" in err, err[-3000:]
    assert took < 240, took  # not 300 s waiting for a running VM to go
    assert_torn_down(w)
