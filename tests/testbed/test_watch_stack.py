"""A GPU fault during a `--stack` run (the fake stack world on the test bed): an Xid on one node's
GPU while the job trains is reported with the node and GPU, the VM is deleted and re-created
like a lost node, and the run resumes from the bucket's checkpoint and finishes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from tests.support import ROOT
from tests.support.stack_world import FirstStep, World
from tests.support.testbed import BUSY, GpuConfig, GpuPhase

pytestmark = [pytest.mark.testbed, pytest.mark.filterwarnings("ignore:Unable to enable fault")]


def run_with_fault_at_checkpoint(
    w: World, fault: Callable[[], None], capsys: pytest.CaptureFixture[str]
) -> tuple[str, str]:
    """`run --stack` of the trainer's torch-free stand-in (the watch and the recovery are the
    subject: `World.run_steps`, 120 steps at 20 a second, so the fault is seen while it still
    trains, also on a loaded machine; the watch polls each 1 s), `fault` injected once its
    step-20 checkpoint is in the bucket; the run must succeed. Its stdout and stderr."""
    t = w.at_checkpoint(20, fault)
    rc = w.run_steps()
    t.join(timeout=5)
    out, err = capsys.readouterr()
    assert rc == 0, out[-4000:] + err[-2000:]
    return out, err


def test_an_xid_on_a_stack_replaces_the_node_and_the_run_resumes(
    world: Callable[..., World],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUTRAIN_WATCH_POLL_S", "1")
    monkeypatch.setenv("GPUTRAIN_WATCH_SAMPLE_S", "0.5")
    w = world(bucket=True, gpus=GpuConfig(model="NVIDIA L4", count=1, timeline=(BUSY,)))
    faulty: list[str] = []
    keys: list[str] = []

    def xid() -> None:
        host = w.node_hosts["e2e-node-1"]
        faulty.append(host.name)
        keys.append(host.host_key)
        w.bed.set_gpus(host.name, GpuConfig(count=1, timeline=(BUSY, GpuPhase(util_pct=0, xid=79))))

    out, err = run_with_fault_at_checkpoint(w, xid, capsys)
    assert faulty and "GPU fault during the run: node e2e-node-1 GPU 0: Xid 79" in err
    assert "e2e-node-1 lost to a GPU fault (GPU 0: Xid 79): recovering (1/3)" in out
    assert "recovery 1/3: e2e-node-1 lost to a GPU fault at" in out
    # The VM was replaced by a new one: no host with the faulty one's key is left (the bed may give
    # the new host the freed name).
    assert all(h.host_key != keys[0] for h in w.bed.hosts.values())
    deletes = [r for r in w.compute.requests if r[0] == "DELETE"]
    assert [r[1].rsplit("/", 1)[1] for r in deletes] == ["e2e-node-1"]
    target = w.dir / "runs" / "stack-e2e"
    run = target / (target / "LAST_RUN").read_text().strip()
    job = json.loads((run / "job.json").read_text())
    assert job["ok"] and job["recoveries"][0]["cause"] == "lost to a GPU fault"
    # the relaunch's (rank 0 may sit on either node; a stopped attempt's rank 0 may have written one)
    newest = max(run.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    summary = json.loads(newest.read_text())
    assert summary["steps"] == 120 and summary["resumed_from"] >= 20
    assert '"kind": "gpu_fault"' in (run / "watch-events.jsonl").read_text()
    page = (run / "report.html").read_text()  # the report of `run`, the recovery in it
    assert "recoveries</th><td>1" in page and "recovery: e2e-node-1 lost to a GPU fault" in page


def test_an_xid_the_job_caused_is_reported_and_buys_no_new_node(
    world: Callable[..., World],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Xid 13 (NVIDIA: a graphics engine exception, the application's own) while the job
    runs: a warning naming it, the job goes on, no VM is deleted or re-created."""
    monkeypatch.setenv("GPUTRAIN_WATCH_POLL_S", "1")
    monkeypatch.setenv("GPUTRAIN_WATCH_SAMPLE_S", "0.5")
    w = world(gpus=GpuConfig(model="NVIDIA L4", count=1, timeline=(BUSY,)))

    def xid() -> None:
        host = w.node_hosts["e2e-node-1"]
        w.bed.set_gpus(
            host.name, GpuConfig(count=1, timeline=(BUSY, GpuPhase(util_pct=97, xid=13)))
        )

    # the watch, not the trainer, is the subject: the stand-in's step lines for 6 s, torch-free
    (w.dir / "steps.py").write_text((ROOT / "tests" / "support" / "jobs" / "steps.py").read_text())
    step = FirstStep(w)

    def at_first_step() -> None:
        while step.at is None and not done.is_set():
            time.sleep(0.1)
        if step.at is not None:
            xid()

    done = threading.Event()
    t = threading.Thread(target=at_first_step, daemon=True)
    t.start()
    rc = w.run("run", "--stack", "e2e", "--yes", "--skip-preflight", "--", "steps.py", "60", "0.1")
    done.set()
    t.join(timeout=5)
    step.stop()
    out, err = capsys.readouterr()
    assert rc == 0 and step.at is not None, out[-4000:] + err[-2000:]
    assert "node e2e-node-1 GPU 0: Xid 13 (graphics engine exception" in err
    assert "caused by the job's own GPU code, not by the GPU (no node is replaced)" in err
    assert "recovering" not in out and "GPU fault during the run" not in err
    assert [r for r in w.compute.requests if r[0] == "DELETE"] == []
    target = w.dir / "runs" / "stack-e2e"
    run = target / (target / "LAST_RUN").read_text().strip()
    [event] = [e for e in (run / "watch-events.jsonl").read_text().splitlines() if "gpu_xid" in e]
    assert json.loads(event)["xid_class"] == "application"
