"""What a job leaves running does not outlive its run: a daemon the job double-forks (its own
session, out of torchrun's process tree) is ended when the run ends, and by `stop`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support import alive

VENV_BIN = Path(sys.executable).parent
DAEMON = """import os, subprocess, sys, time
out = os.environ["GPUTRAIN_OUT"]
subprocess.Popen(  # double-forked: setsid in a shell that exits at once
    ["sh", "-c", "setsid sh -c 'echo $$ > " + out + "/daemon.pid; exec sleep 300' "
     "</dev/null >/dev/null 2>&1 &"]
).wait()
while not os.path.exists(out + "/daemon.pid"):
    time.sleep(0.05)
print("step 1/1 | loss 1.0", flush=True)
time.sleep(float(sys.argv[1]))
"""


def gputrain(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUTRAIN_NODE_ROOT"}
    env["GPUTRAIN_NODE_ROOT"] = str(tmp_path / "runs" / "local" / "node")  # read below
    env["HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [str(VENV_BIN / "gputrain"), *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def daemon_pid(tmp_path: Path) -> int:
    run_id = (tmp_path / "runs" / "local" / "LAST_RUN").read_text().strip()
    node_run = tmp_path / "runs" / "local" / "node" / ".gputrain" / "runs" / run_id
    return int((node_run / "out" / "daemon.pid").read_text())


def gone(pid: int, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_daemon_the_job_left_ends_with_the_run(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(DAEMON)
    r = gputrain(tmp_path, "run", "--local", "--", "job.py", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    pid = daemon_pid(tmp_path)
    try:
        assert gone(pid), f"the job's daemon {pid} outlived the run"
    finally:
        if not gone(pid, 0):
            os.kill(pid, 9)


def test_stop_ends_the_daemon_too(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(DAEMON)
    r = gputrain(tmp_path, "run", "--local", "--detach", "--", "job.py", "120")
    assert r.returncode == 0, r.stderr[-2000:]
    pid = daemon_pid(tmp_path)
    try:
        stopped = gputrain(tmp_path, "stop", "--local")
        assert stopped.returncode == 0, stopped.stderr[-2000:]
        assert gone(pid), f"the job's daemon {pid} outlived `stop`"
    finally:
        if not gone(pid, 0):
            os.kill(pid, 9)
