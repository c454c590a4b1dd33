"""Before a stack's bucket is emptied, every node's watchdog is disarmed and waited for: one that
ends on the disarm lets the command return at once, one that does not is named, not waited on
forever."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from scripts.job.autodown import build_settle_command, settle
from scripts.transport.local import LocalTransport

# a watchdog's loop: it looks for the disarm between passes (the last one still uploading)
OBEYS = "while [ ! -e watchdog.disarm ]; do sleep 0.05; done; sleep 0.4"
IGNORES = "sleep 30"


def _watchdog(root: Path, loop: str) -> subprocess.Popen[bytes]:
    run = root / ".gputrain" / "runs" / "r1"
    run.mkdir(parents=True)
    proc = subprocess.Popen(["sh", "-c", loop], cwd=run)
    (run / "watchdog.pid").write_text(f"{proc.pid}\n")
    return proc


def test_settle_disarms_and_returns_once_the_watchdog_has_ended(tmp_path: Path) -> None:
    proc = _watchdog(tmp_path, OBEYS)
    try:
        start = time.monotonic()
        settle({"n": LocalTransport("n", tmp_path)}, "r1")
        took = time.monotonic() - start
        assert (tmp_path / ".gputrain" / "runs" / "r1" / "watchdog.disarm").is_file()
        assert proc.poll() is not None  # ended (reaped by nobody until now: a zombie counts)
        assert 0.3 < took < 5
    finally:
        proc.kill()
        proc.wait()


def test_a_watchdog_that_does_not_end_is_named_after_the_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = _watchdog(tmp_path, IGNORES)
    try:
        r = LocalTransport("n", tmp_path).run(build_settle_command("r1", wait_s=0.5), 10)
        assert r.exit_code == 1 and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    # a node without the run (or its watchdog) has nothing to wait for
    assert LocalTransport("n", tmp_path).run(build_settle_command("r2"), 10).ok
    assert "could not stop" not in capsys.readouterr().err
