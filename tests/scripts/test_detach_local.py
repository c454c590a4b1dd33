"""`--local --detach`: the command returns once the job trains, the job runs on without it (its
own session), `gputrain logs --local` reattaches and follows it to the end; `--resume` or `logs` of
a run that is not there is one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.settings import Settings
from tests.support import JOBS

VENV_BIN = Path(sys.executable).parent
#: the trainer's stand-in without torch (tests/support/jobs/steps.py): 400 step lines in ~6 s
TRAIN = ["steps.py", "400", "0.015"]


def gputrain(tmp_path: Path, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUTRAIN_NODE_ROOT"}
    env["HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [str(VENV_BIN / "gputrain"), *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_local_detach_returns_while_the_job_trains_and_logs_reattaches(tmp_path: Path) -> None:
    shutil.copy(JOBS / "steps.py", tmp_path)
    r = gputrain(tmp_path, "train", "--local", "--detach", "--", *TRAIN)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_id = (tmp_path / "runs" / "local" / "LAST_RUN").read_text().strip()
    node_root = Settings(root=tmp_path, runs_dir=tmp_path / "runs").local_node_root
    run = node_root / ".gputrain" / "runs" / run_id
    assert " | loss " in r.stdout  # it showed the first step before letting go
    assert f"gputrain logs --local --run {run_id}" in r.stdout, r.stdout[-2000:]
    # where the results are: this machine's node root, and the command that brings them home
    assert f"results:   in {run / 'out'}/; `gputrain results --local {run_id}`" in r.stdout
    assert not (run / "exitcode").exists()  # still training after the command returned
    pgid = int((run / "pgid").read_text())
    os.killpg(pgid, 0)  # its process group is alive
    (tmp_path / "runs" / "local" / "LAST_RUN").unlink()  # as on a machine that did not start it
    again = gputrain(tmp_path, "logs", "--local")  # the newest run on the node
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"step +400/400 \|", again.stdout), again.stdout[-2000:]
    deadline = time.monotonic() + 30
    while not (run / "exitcode").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (run / "exitcode").read_text().split()[0] == "0"
    assert json.loads((run / "out" / "summary.json").read_text())["steps"] == 400


def test_resume_of_a_run_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    r = gputrain(tmp_path, "train", "--local", "--resume", "20990101-000000-dead", timeout=120)
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert err[0].startswith(
        "gputrain: error: --resume 20990101-000000-dead: no such run on --local (nothing of it "
        "where the target keeps a run's checkpoints)"
    )
    bad = gputrain(tmp_path, "train", "--local", "--resume", "../x", timeout=60)
    assert bad.returncode == 2 and "--resume '../x': not a run id" in bad.stderr


def test_logs_of_a_run_that_does_not_exist_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `top` says it: no shell's `cd` error on the output, and exit 2."""
    from scripts.cli import main

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("GPUTRAIN_NODE_ROOT", raising=False)
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["logs", "--local", "--run", "nope"], settings) == 2
    out, err = capsys.readouterr()
    assert "cd" not in out and err == (
        "gputrain: error: logs: run nope does not exist on local (no node has it)\n"
    )
