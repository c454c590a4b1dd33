"""Orphans (issue 27, class 8): after the controller is killed the job trains on, detached;
`gputrain results` brings it home, a new run there is refused unless --force, `gputrain stop`
ends it. On the local target: the same node scripts as over SSH."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPUTRAIN = Path(sys.executable).parent / "gputrain"


def _gputrain(work: Path, *argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GPUTRAIN), *argv],
        cwd=work,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GPUTRAIN_NODE_ROOT"}


def test_results_stop_and_busy_after_the_controller_is_killed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "ddp_sum.py").write_text(
        (ROOT / "tests" / "support" / "jobs" / "ddp_sum.py").read_text()
    )
    controller = subprocess.Popen(
        [str(GPUTRAIN), "run", "--local", "--yes", "--env", "DDP_STEPS=600",
         "--env", "DDP_STEP_S=0.2", "--", "ddp_sum.py"],
        cwd=work, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert controller.stdout is not None
    seen = []
    for line in controller.stdout:
        seen.append(line)
        if "[rank0]:step 2 " in line:
            break
    os.killpg(controller.pid, signal.SIGKILL)  # the controller dies; the job is detached
    controller.wait(timeout=30)
    run_id = (work / "runs" / "local" / "LAST_RUN").read_text().strip()
    try:
        got = _gputrain(work, "results", "--local")
        assert got.returncode == 0, got.stderr
        assert f"run {run_id}: still running on" in got.stdout
        log = work / "runs" / "local" / run_id / "local" / "torchrun.log"
        assert "[rank0]:step 2 sum 1" in log.read_text()

        busy = _gputrain(work, "train", "--local", "--", "ddp_sum.py")
        assert busy.returncode == 2, busy.stdout + busy.stderr
        (line,) = busy.stderr.strip().splitlines()
        assert f"still training on --local (local: run {run_id})" in line
        assert f"`gputrain stop --local {run_id}`" in line and "--force" in line
        assert f"`gputrain logs --local --run {run_id}`" in line

        stopped = _gputrain(work, "stop", "--local", run_id)
        assert stopped.returncode == 0, stopped.stderr
        assert f"stop {run_id}: local terminated" in stopped.stdout or "killed" in stopped.stdout
        assert f"run {run_id}: stopped; results in" in stopped.stdout
        exitcode = work / "runs" / "local" / run_id / "local" / "exitcode"
        assert exitcode.read_text().split()[0] != "0", stopped.stdout
    finally:
        _gputrain(work, "stop", "--local", run_id, timeout=60)
    again = _gputrain(work, "results", "--local", run_id)
    assert f"run {run_id}: results in" in again.stdout
    ok = _gputrain(work, "train", "--local", "--env", "DDP_STEPS=1", "--", "ddp_sum.py")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "warning: another gputrain run" not in ok.stderr
    last = (work / "runs" / "local" / "LAST_RUN").read_text().strip()
    record = json.loads((work / "runs" / "local" / last / "job.json").read_text())
    assert record["ok"] is True


def test_results_without_a_recorded_run_is_one_line(tmp_path: Path) -> None:
    got = _gputrain(tmp_path, "results", "--local")
    assert got.returncode == 2
    assert got.stderr.strip().startswith("gputrain: error: no run recorded for local")
