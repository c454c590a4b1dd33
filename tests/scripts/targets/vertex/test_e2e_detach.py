"""`run --detach` on a `backend: vertex` stack, end to end and offline (the world of test_e2e.py):
the command returns while the job runs on the fake Vertex AI, `status` shows its state, `logs`
follows it to its end and brings its results home, `down` cancels a job still running.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.vertex_world import LONG_STEPS, World, assert_torn_down

#: a job of the user's working directory that trains until the test opens its gate (a file)
GATE_JOB = (
    "import os, sys, time\nfrom pathlib import Path\n"
    "gate, rank = Path(sys.argv[1]), os.environ['RANK']\n"
    "print(f'rank {rank} waits for the gate', flush=True)\n"
    "deadline = time.monotonic() + 120\n"
    "while not gate.exists() and time.monotonic() < deadline:\n"
    "    time.sleep(0.1)\n"
    "print(f'rank {rank} passed the gate', flush=True)\n"
    "out = Path(os.environ['GPUTRAIN_OUT']); out.mkdir(parents=True, exist_ok=True)\n"
    "(out / 'gate.txt').write_text('opened')\n"
)


def detached_run(
    w: World, capsys: pytest.CaptureFixture[str], *entry: str, running: bool = True
) -> tuple[str, str]:
    """`run --detach` returned 0 (`running`: before the job ended); (run id, what it said)."""
    started = time.monotonic()
    rc = w.run("run", "--stack", "vtest", "--yes", "--skip-preflight", "--detach", "--", *entry)
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-2000:]
    assert time.monotonic() - started < 60
    [job] = w.vertex.jobs.values()
    assert not running or job.body["state"] not in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED")
    assert "destroy" not in w.runner.call_names()  # the stack stays: the job runs in it
    return w.run_dir.name, out


def test_a_detached_run_returns_while_the_job_runs_and_logs_follows_it_home(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    w = world()
    w.vertex.advance_on_its_own()  # a detached job moves on with no client asking
    Path("jobs/gate.py").write_text(GATE_JOB)
    gate = tmp_path / "gate"
    run_id, out = detached_run(w, capsys, "-m", "jobs.gate", str(gate))
    [job_id] = w.vertex.jobs
    assert f"/locations/us-central1/customJobs/{job_id} is PENDING; Vertex AI runs it" in out
    assert f"run {run_id} detached" in out
    assert f"reattach:  gputrain logs --stack vtest --run {run_id}" in out
    assert f"cancel:    gputrain stop --stack vtest {run_id}" in out
    assert "on the machines" not in out  # Vertex has none of ours

    # status, from the job's state as Vertex reports it
    assert w.run("status", "--stack", "vtest") == 0
    out = capsys.readouterr().out
    assert run_id in out and any(s in out for s in ("PENDING", "QUEUED", "RUNNING"))

    def open_gate() -> None:  # once both replicas wait at it
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            lines = [ln for out in w.replicas.outputs.values() for ln in out]
            if sum("waits for the gate" in ln for ln in lines) >= 2:
                break
            time.sleep(0.1)
        gate.touch()

    opener = threading.Thread(target=open_gate, daemon=True)
    opener.start()
    rc = w.run("logs", "--stack", "vtest", "--run", run_id)  # followed to the job's end
    opener.join(timeout=5)
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-2000:]
    assert "[chief] rank 0 waits for the gate" in out
    assert "[worker-1] rank 1 passed the gate" in out
    assert ": SUCCEEDED (" in out and f"run {run_id}: Vertex job {job_id} SUCCEEDED" in out
    assert (w.run_dir / "model" / "gate.txt").read_text() == "opened"  # brought home

    assert w.run("down", "--stack", "vtest") == 0
    assert w.vertex.requests_to("POST", r":cancel$") == []  # it had ended: nothing to cancel
    assert_torn_down(w)


def test_down_cancels_a_detached_job_brings_its_results_home_and_the_key_reaches_the_job(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    w.vertex.advance_on_its_own()  # a detached job moves on with no client asking
    stack_file = w.settings.root / "Pulumi.vtest.yaml"
    stack_file.write_text(stack_file.read_text() + "  gputrain:restartJobOnWorkerRestart: true\n")
    run_id, _ = detached_run(w, capsys, *LONG_STEPS)
    [body] = w.created()
    assert body["jobSpec"]["scheduling"] == {
        "timeout": "3600s",
        "strategy": 4,  # SPOT
        "restartJobOnWorkerRestart": True,
    }

    deadline = time.monotonic() + 120  # the job trains on with no gputrain process following it
    while time.monotonic() < deadline:
        lines = w.replicas.outputs.get("workerpool0-0", [])
        if sum("step" in ln and "loss" in ln for ln in lines) >= 2:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the detached job never trained: {w.job_states()} {w.replicas.outputs}")

    assert w.run("down", "--stack", "vtest") == 0
    out = capsys.readouterr().out
    assert "vertex: cancelling job" in out and ": CANCELLED (" in out
    assert len(w.vertex.requests_to("POST", r":cancel$")) == 1
    assert w.job_states() == ["JOB_STATE_CANCELLED"]
    assert (w.run_dir / "model" / "metrics.jsonl").is_file()  # home before the bucket went
    assert json.loads((w.run_dir / "vertex-job.json").read_text())["run_id"] == run_id
    assert_torn_down(w)


def test_logs_from_another_machine_finds_a_failed_detached_job_says_why_exits_1(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    w.vertex.advance_on_its_own()  # a detached job moves on with no client asking
    run_id, _ = detached_run(w, capsys, "-m", "jobs.answer", "crash", running=False)
    (w.dir / "runs" / "stack-vtest" / "LAST_RUN").unlink()  # as on another machine
    rc = w.run("logs", "--stack", "vtest")  # the stack's newest job, found by its label
    out, err = capsys.readouterr()
    assert rc == 1, out[-3000:] + err[-2000:]
    assert err.startswith("gputrain: error: Vertex job ") and " FAILED: " in err
    assert f"logs and results: {w.dir / 'runs' / 'stack-vtest' / run_id}" in err
    assert "[worker-1] boom: rank 1 failed on purpose" in out
    assert w.run("down", "--stack", "vtest") == 0
    assert_torn_down(w)
