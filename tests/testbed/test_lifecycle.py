"""The whole lifecycle through `gputrain` (scripts.cli.main): preflight -> up with zone failover ->
host keys from guest attributes -> verify over real SSH -> torchrun on the sshd test hosts ->
results -> destroy -> sweep. Pulumi is the FakeStackRunner (its `up` brings test hosts up as the
cluster's nodes) and the Compute API is the local fake server; everything else is production code.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.stack_world import FAST_TRAIN, ZONES, World, assert_torn_down
from tests.support.testbed import GpuConfig


def test_run_stack_end_to_end(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    rc = w.run("run", "--stack", "e2e", "--yes", "--", *FAST_TRAIN)
    out = capsys.readouterr().out
    assert rc == 0, out
    names = w.runner.call_names()
    assert names.index("up") < names.index("destroy")
    # Host keys came from guest attributes, one query per node at least.
    for node in ("e2e-node-0", "e2e-node-1"):
        assert w.compute.requests_matching(f"/instances/{node}/getGuestAttributes")
    # Results of both nodes were downloaded; the trainer's summary says it learned.
    target_dir = w.dir / "runs" / "stack-e2e"
    run_dir = target_dir / (target_dir / "LAST_RUN").read_text().strip()
    assert {p.name for p in run_dir.iterdir()} >= {"e2e-node-0", "e2e-node-1"}
    summaries = list(run_dir.rglob("summary.json"))
    assert summaries, sorted(str(p) for p in run_dir.rglob("*"))
    summary = json.loads(summaries[0].read_text())
    assert summary["world_size"] == 2 and summary["final_loss"] < summary["initial_loss"]
    assert "preflight" in out and "run summary" in out
    assert "doctor: stack e2e" in out and " fail " not in out  # the checks ran first, all passed
    assert_torn_down(w)
    # the cost ledger: the run's record, priced, at home and (brought home by down) from the bucket
    assert w.run("cost", "--stack", "e2e", "--json") == 0
    (record,) = json.loads(capsys.readouterr().out)["runs"]
    assert record["run_id"] == run_dir.name and record["stack"] == "e2e" and record["ok"]
    assert record["nodes"] == 2 and record["machine"] == "g2-standard-8"
    assert record["hourly_usd"] > 0 and record["estimated_usd"] > 0 and record["price_source"]
    assert record["gpus_per_node"] == 1 and record["gpu_hours"] > 0  # the L4 built into G2
    (segment,) = run_dir.glob("ledger-*.json")  # the run's one segment
    assert json.loads(segment.read_text())["run_id"] == run_dir.name


def test_preflight_failure_creates_nothing(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    for zone in ZONES:  # what only the preflight checks (the doctor's quota row passes)
        w.compute.remove_machine_type(zone, "g2-standard-8")
    rc = w.run("run", "--stack", "e2e", "--yes", "--", *FAST_TRAIN)
    err = capsys.readouterr().err
    assert rc == 1 and "preflight failed in every zone" in err
    assert "up" not in w.runner.call_names() and w.hosts == []


@pytest.mark.parametrize("hint", [False, True], ids=["next-zone", "zonesAvailable"])
def test_stockout_fails_over_to_another_zone(world: Callable[..., World], hint: bool) -> None:
    w = world()
    w.runner.fail_stockout(ZONES[0], zones_available=(ZONES[2],) if hint else ())
    rc = w.run_job("done")
    assert rc == 0
    ups = [c[1] for c in w.runner.calls if c[0] == "up"]
    assert ups == [ZONES[0], ZONES[2] if hint else ZONES[1]]
    assert_torn_down(w)


def test_quota_error_stops_and_tears_down(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    w.runner.fail_quota(ZONES[0], "PREEMPTIBLE_NVIDIA_L4_GPUS")
    rc = w.run("run", "--stack", "e2e", "--yes", "--skip-preflight")
    err = capsys.readouterr().err
    assert rc == 1 and "PREEMPTIBLE_NVIDIA_L4_GPUS" in err
    assert [c[1] for c in w.runner.calls if c[0] == "up"] == [ZONES[0]]
    assert_torn_down(w)


def test_partial_cluster_counts_as_stockout(world: Callable[..., World]) -> None:
    w = world()
    w.runner.fail_partial(ZONES[0], created=1)
    rc = w.run_job("done")
    assert rc == 0
    assert [c[1] for c in w.runner.calls if c[0] == "up"] == [ZONES[0], ZONES[1]]
    assert_torn_down(w)


def test_host_key_mismatch_refuses_and_tears_down(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(wrong_host_keys=True)
    rc = w.run("run", "--stack", "e2e", "--yes", "--skip-preflight")
    err = capsys.readouterr().err
    assert rc == 1 and "SHA256:" in err
    assert_torn_down(w)


def test_gpu_verification_failure_tears_down(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(gpus=GpuConfig(model="NVIDIA T4", count=1, memory_mib=15360))
    rc = w.run("run", "--stack", "e2e", "--yes", "--skip-preflight")
    out, err = capsys.readouterr()
    assert rc == 1 and "NVIDIA T4" in err
    assert " started on " not in out  # nothing launched (launch.py's "run X started on N node(s)")
    assert_torn_down(w)
    # the VMs billed all the same: the run is in the ledger, failed, priced, with no results dir
    assert w.run("cost", "--stack", "e2e", "--json") == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["ok"] is False and run["nodes"] == 2 and run["estimated_usd"] > 0, run
    assert not (w.dir / "runs" / "stack-e2e" / run["run_id"]).exists()
    assert (w.dir / "runs" / ".gitignore").is_file()  # runs/ made as a run's results dir makes it


def test_training_crash_names_the_node_and_tears_down(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    rc = w.run_job("crash")
    err = capsys.readouterr().err
    assert rc == 1 and "exit" in err.lower()
    assert w.runner.call_names().count("up") == 1  # a crash on spot is not retried
    assert_torn_down(w)


def _signal_when_started(w: World, sig: int) -> threading.Thread:
    """Sends `sig` to this process once the job runs on both nodes."""

    def fire() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if len(list(w.marker.glob("pid-*"))) >= 2:
                time.sleep(0.5)
                os.kill(os.getpid(), sig)
                return
            time.sleep(0.1)

    t = threading.Thread(target=fire, daemon=True)
    t.start()
    return t


def test_signal_during_training_stops_job_and_tears_down(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM while the job runs. SIGINT takes the same guard (tests/scripts/test_parallel.py
    sends both); on the bed it comes during a re-creation (test_spot_recovery.py's Ctrl-C)."""
    sig = signal.SIGTERM
    w = world()
    t = _signal_when_started(w, sig)
    started = time.monotonic()
    rc = w.run_job("sleep")
    t.join(timeout=5)
    err = capsys.readouterr().err
    assert rc == 130, err
    assert signal.Signals(sig).name in err
    assert time.monotonic() - started < 90  # not the job's 120 s sleep
    for pid_file in w.marker.glob("pid-*"):  # the job itself is gone from the nodes
        assert not Path(f"/proc/{pid_file.read_text()}").exists()
    assert_torn_down(w)


def test_up_train_down_keeps_the_cluster_between_commands(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """`up` leaves a proven cluster; `verify`/`train`/`logs` use it; `down` removes it."""
    w = world()
    assert w.run("up", "--stack", "e2e", "--yes", "--skip-preflight") == 0
    assert "destroy" not in w.runner.call_names() and len(w.runner.existing) == 2
    assert w.run("verify", "--stack", "e2e") == 0
    job = ("job.py", "done", str(w.marker))
    assert w.run("train", "--stack", "e2e", "--", *job) == 0
    assert w.run("logs", "--stack", "e2e") == 0
    out = capsys.readouterr().out
    assert out.count("job started done") >= 4  # streamed by train, then again by logs
    assert w.runner.call_names().count("up") == 1
    assert w.run("down", "--stack", "e2e") == 0
    assert_torn_down(w)


def test_up_that_fails_verification_destroys_again(world: Callable[..., World]) -> None:
    w = world(gpus=GpuConfig(model="NVIDIA L4", count=1, ecc_errors=3))
    assert w.run("up", "--stack", "e2e", "--yes", "--skip-preflight") == 1
    assert_torn_down(w)
