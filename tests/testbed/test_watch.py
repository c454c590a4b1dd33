"""Watching a run on the sshd test bed: the fake GPUs' telemetry in `top` and the idle warning, a
SIGSTOPped rank caught as a stall (stacks saved, relaunched from its checkpoint to the same loss,
or failed naming the node and rank), an Xid during training failing the run naming the GPU."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gputrain_node.telemetry import rank_processes
from scripts.job.records import Job
from scripts.targets.session import close_all, connect
from scripts.watch.monitor import GpuFaultError, watched_launch
from scripts.watch.telemetry import StallError, WatchSettings
from scripts.watch.top import TopView
from tests.support.testbed import BUSY, IDLE, GpuConfig, GpuPhase, TestBed, TestHost
from tests.support.trainer_helpers import uninterrupted_summary

pytestmark = [pytest.mark.testbed, pytest.mark.filterwarnings("ignore:Unable to enable fault")]
REPO = Path(__file__).resolve().parents[2]
TRAIN = ["--preset", "tiny", "--checkpoint-every", "10", "--log-every", "1", "--eval-batches", "0"]
#: the trainer's stand-in without torch (tests/support/jobs/steps.py): 5000 steps, 100 a second
STEPS = ("tests/support/jobs/steps.py", "5000", "0.01")
FAST = WatchSettings(sample_interval_s=0.5, poll_s=1.0, summary_every_s=4.0, idle_window_s=3.0)


def _trainer(steps: int) -> tuple[str, ...]:
    return ("-m", "trainer.train", *TRAIN, "--steps", str(steps))


def _job(
    run_id: str,
    entry: tuple[str, ...],
    *,
    watch: WatchSettings = FAST,
    restarts: int = 0,
    env: dict[str, str] | None = None,
) -> Job:
    return Job(
        run_id=run_id,
        entry=entry,
        env=env or {},
        workdir=REPO,
        max_restarts=restarts,
        watch=watch,
    )


def _run_dir(host: TestHost, run_id: str) -> Path:
    return host.dir / "home" / ".gputrain" / "runs" / run_id


def _when(condition: Callable[[], bool], timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.2)


def _metrics_step(host: TestHost, run_id: str) -> int:
    rows = (_run_dir(host, run_id) / "out" / "metrics.jsonl").read_text().splitlines()
    return json.loads(rows[-1])["step"] if rows else 0


def _logged(host: TestHost, run_id: str, line: str) -> bool:
    log = _run_dir(host, run_id) / "torchrun.log"
    return log.exists() and line in log.read_text(errors="replace")


def _stop_a_rank(
    host: TestHost, run_id: str, at_step: int, stopped: list[Any], *, metrics: bool = True
) -> None:
    """SIGSTOP the rank on `host` once the run has logged `at_step`: in the trainer's
    metrics.jsonl (after its checkpoint), or without `metrics` in the node's torchrun.log."""

    def go() -> None:
        if metrics:
            path = _run_dir(host, run_id) / "out" / "metrics.jsonl"
            _when(lambda: path.exists() and _metrics_step(host, run_id) >= at_step)
        else:
            _when(lambda: _logged(host, run_id, f"step {at_step:>6}/"))
        jobpid = int((_run_dir(host, run_id) / "jobpid").read_text())
        rank = rank_processes(jobpid)[0]
        os.kill(int(str(rank["pid"])), signal.SIGSTOP)
        stopped.append((time.monotonic(), rank["rank"]))

    threading.Thread(target=go, daemon=True).start()


def test_top_shows_both_nodes_the_idle_one_is_warned_and_an_xid_fails_the_run(
    tb: TestBed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One run on a busy node (2 GPUs; an Xid on GPU 1 after 9 s) and an idle one (1 GPU). The
    GPUs' figures are the fake nvidia-smi's: the job is the trainer's torch-free stand-in."""
    xid = GpuPhase(at_s=9.0, util_pct=97, mem_used_mib=18000, xid=79, xid_gpu=1)
    busy = tb.add_host(gpus=GpuConfig(count=2, timeline=(BUSY, xid)))
    idle = tb.add_host(gpus=GpuConfig(count=1, timeline=(IDLE,)))
    ts = connect(tb.fleet([busy, idle]), deadline_s=10)
    seen: list[list[list[object]]] = []

    def watch_top() -> None:
        _when(lambda: (_run_dir(idle, "top-1") / "watch" / "telemetry.csv").exists())
        view = TopView(ts, "top-1")
        _when(
            lambda: (
                view.refresh(),
                len(view.rows()) == 3 and all(isinstance(r[1], int) for r in view.rows()),
            )[1]
        )
        seen.append(view.rows())

    t = threading.Thread(target=watch_top, daemon=True)
    t.start()
    with pytest.raises(GpuFaultError) as e:
        watched_launch(tb.fleet([busy, idle]), ts, _job("top-1", STEPS), tmp_path / "r")
    t.join(timeout=10)
    close_all(ts)
    assert seen, "top never showed both nodes' GPUs during the run"
    rows = {(r[0], r[1]): r for r in seen[0]}
    assert set(rows) == {(busy.name, 0), (busy.name, 1), (idle.name, 0)}
    assert rows[(busy.name, 1)][2] == "97 %" and rows[(idle.name, 0)][2] == "12 %"
    assert rows[(busy.name, 0)][3] == "17.6/22 GiB" and rows[(idle.name, 0)][7] == "none"
    out, err = capsys.readouterr()
    assert re.search(rf"warning: node {idle.name}: mean GPU utilization below 50 %", err)
    assert f"node {busy.name}: mean" not in err and "stalled" not in err + out  # no false alarm
    assert re.search(
        rf"^watch: {busy.name} 2 GPU util 97% .* \| {idle.name} 1 GPU util 12%", out, re.M
    )
    # the Xid: named with node and GPU, the job stopped, the samples brought home
    assert f"node {busy.name} GPU 1: Xid 79 during training" in str(e.value)
    assert e.value.fault.node == busy.name and e.value.fault.gpu == 1
    assert '"kind": "gpu_fault"' in (tmp_path / "r" / "watch-events.jsonl").read_text()
    csv_rows = (tmp_path / "r" / busy.name / "watch" / "telemetry.csv").read_text().splitlines()
    assert csv_rows[0].startswith("time,gpu,util_pct") and len(csv_rows) > 4


def test_a_sigstopped_rank_is_caught_and_the_relaunch_ends_with_the_same_loss(
    tb: TestBed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = [tb.add_host(), tb.add_host()]
    ts = connect(tb.fleet(hosts), deadline_s=10)
    stopped: list[Any] = []
    _stop_a_rank(hosts[1], "stall-1", 20, stopped)
    job = _job(
        "stall-1", _trainer(40), watch=WatchSettings(stall_timeout_s=30, poll_s=1.0), restarts=1
    )
    result = watched_launch(tb.fleet(hosts), ts, job, tmp_path / "r")
    close_all(ts)
    out, err = capsys.readouterr()
    assert result.ok and stopped and "could not download" not in err
    caught = re.search(r"run stall-1 stalled: no rank made a training step for (\d+) s", err)
    assert caught and 30 <= int(caught.group(1)) <= 35, err[-3000:]
    assert f"stuck: node {hosts[1].name} rank {stopped[0][1]} (pid" in err
    assert "its process is stopped" in err
    stacks = tmp_path / "r" / "stalls" / "1"
    other = stacks / f"{hosts[0].name}-rank{1 - int(str(stopped[0][1]))}.txt"
    assert "(stack by faulthandler)" in other.read_text()
    assert "code/trainer/train.py" in other.read_text()  # where the waiting rank is
    assert "state T" in (stacks / f"{hosts[1].name}-rank{stopped[0][1]}.txt").read_text()
    assert "relaunching from its last checkpoint after the stall (restart 1; 0 left)" in out
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "r").glob("*/summary.json")]
    assert len(summaries) == 2  # both nodes' results came home after the relaunch
    summary = summaries[0]
    assert summary["resumed_from"] >= 20
    reference = uninterrupted_summary(tmp_path / "reference", [*TRAIN, "--steps", "40"])
    assert summary["final_loss"] == reference["final_loss"]
    assert (tmp_path / "r" / hosts[0].name / "torchrun.stall1.log").exists()


def test_a_stall_with_no_restart_left_fails_naming_the_node_and_rank(
    tb: TestBed, tmp_path: Path
) -> None:
    hosts = [tb.add_host(), tb.add_host()]
    ts = connect(tb.fleet(hosts), deadline_s=10)
    stopped: list[Any] = []
    _stop_a_rank(hosts[0], "stall-2", 10, stopped, metrics=False)
    # below the 30 s users may set: the watch's settings are ours here, the path is the same.
    # The job is the trainer's torch-free stand-in, its ranks in lockstep as DDP's: the stopped
    # rank stalls the other (the trainer's stall and its relaunch: the test above)
    job = _job(
        "stall-2",
        ("tests/support/jobs/steps.py", "2000", "0.05"),
        watch=WatchSettings(stall_timeout_s=4, poll_s=0.5),
        env={"STEPS_LOCKSTEP": "1"},
    )
    with pytest.raises(StallError) as e:
        watched_launch(tb.fleet(hosts), ts, job, tmp_path / "r")
    close_all(ts)
    msg = str(e.value)
    assert "--max-restarts allows no restart (0 used)" in msg
    assert f"stuck: node {hosts[0].name} rank {stopped[0][1]}" in msg
    assert e.value.exit_code == 1
