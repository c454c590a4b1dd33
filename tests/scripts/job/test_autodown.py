"""A node's watchdog: armed before each attempt, it replaces the node's earlier one and no earlier
attempt's exit code is left for it; before a stack's bucket is emptied, every node's watchdog is
disarmed and waited for: one that ends on the disarm lets the command return at once, one that
does not is named, not waited on forever."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputrain_node import contract
from scripts.job.autodown import (
    Autodown,
    Watchdogs,
    build_settle_command,
    build_watchdog_start,
    settle,
)
from scripts.node_layout import NODE_STATE
from scripts.transport.local import LocalTransport
from tests.support import alive

# a watchdog's loop: it looks for the disarm between passes (the last one still uploading)
OBEYS = "while [ ! -e watchdog.disarm ]; do sleep 0.05; done; sleep 0.4"
IGNORES = "sleep 30"


def _watchdog(root: Path, loop: str) -> subprocess.Popen[bytes]:
    run = root / ".gputrain" / "runs" / "r1"
    run.mkdir(parents=True)
    proc = subprocess.Popen(["sh", "-c", loop], cwd=run)
    (run / "watchdog.pid").write_text(f"{proc.pid}\n")
    return proc


# a watchdog that says whether it found an exit code when it started, then runs until ended
# (its command line names watchdog.py, as the real one's does)
SLEEPS = f"{sys.executable} -c 'import time; time.sleep(30)'"
FAKE_WATCHDOG_PYTHON = (
    "#!/bin/sh\n[ ! -e exitcode ] || echo found > found-exitcode\n"
    f'echo $$ > watchdog.pid\nexec {SLEEPS} "$@"\n'
)


def test_arming_replaces_the_nodes_watchdog_and_an_earlier_attempts_exit_code(
    tmp_path: Path,
) -> None:
    """The relaunch of a run's next attempt comes within a second of the last attempt's end: its
    exit code must not look like the new attempt's to the new watchdog. The node's earlier
    watchdog ends; a process that now holds some pid file's number but is no watchdog of that
    run directory lives on."""
    python = tmp_path / "python"
    python.write_text(FAKE_WATCHDOG_PYTHON)
    python.chmod(0o755)
    t = LocalTransport("n", tmp_path)
    runs = tmp_path / ".gputrain" / "runs"
    (runs / "r0").mkdir(parents=True)
    stranger = subprocess.Popen(  # a watchdog of no run here
        [sys.executable, "-c", "import time; time.sleep(30)", "watchdog.py"], cwd=tmp_path
    )
    (runs / "r0" / "watchdog.pid").write_text(f"{stranger.pid}\n")
    pids: list[int] = []
    try:
        first = t.run(build_watchdog_start("r1", str(python)), 10, stdin=b"{}")
        assert first.ok, first.stderr
        pids.append(int(first.stdout))
        (runs / "r1" / "exitcode").write_text(f"1 {time.time()}\n")  # the attempt ended
        second = t.run(build_watchdog_start("r1", str(python)), 10, stdin=b"{}")
        assert second.ok, second.stderr
        pids.append(int(second.stdout))
        time.sleep(0.2)
        assert not (runs / "r1" / "exitcode").exists()
        assert not (runs / "r1" / "found-exitcode").exists()
        assert not alive(pids[0]) and alive(pids[1]) and alive(stranger.pid)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stranger.kill()
        stranger.wait()


def test_only_a_budget_mark_of_this_attempt_is_its_budget_stop(tmp_path: Path) -> None:
    """The head's mark comes home with the attempt's results; one from before the attempt began
    (a stop of the run's earlier segment, left on a kept head) says nothing of this end, while
    this attempt's does, also from a head whose clock lags this machine's a little."""
    import json

    from scripts.job.autodown import MARK_CLOCK_SLACK_S, budget_reached
    from scripts.job.records import JobResult, NodeFailure, TrainingError

    mark = tmp_path / "n0" / contract.BUDGET_MARK
    mark.parent.mkdir(parents=True)
    result = JobResult("r1", False, {"n0": 143}, 9.0, tmp_path)
    error = TrainingError("x", failure=NodeFailure("n0", "exited", 143, ()), result=result)
    began = 10_000.0
    for at, this_attempts in (
        (began - 3600, False),  # the earlier segment's stop
        (began - MARK_CLOCK_SLACK_S - 1, False),
        (began - 5, True),  # the head's clock a little behind
        (began + 600, True),
    ):
        mark.write_text(json.dumps({"spent_usd": 398.7, "budget_usd": 400.0, "at": at}))
        reached = budget_reached(error, "n0", "gs://b/runs/r1/checkpoints/", began)
        assert (reached is not None) == this_attempts, at
    mark.write_text(json.dumps({"spent_usd": 398.7, "budget_usd": 400.0}))  # no time: not ours
    assert budget_reached(error, "n0", None, began) is None


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


# a watchdog whose job has ended: its upload takes 0.6 s; it notes whether it was done at the disarm
UPLOADS = (  # the test writes the job's exit code before the settle
    "(sleep 0.6; touch results.uploaded) & "
    "while [ ! -e watchdog.disarm ]; do sleep 0.05; done; "
    "if [ -e results.uploaded ]; then echo after > disarmed; else echo before > disarmed; fi"
)


def test_a_node_whose_download_failed_is_disarmed_only_once_its_upload_is_done(
    tmp_path: Path,
) -> None:
    """Its results exist only on the node: the watchdog's upload to the bucket must finish."""
    roots = {n: tmp_path / n for n in ("failed", "home")}
    procs = [_watchdog(root, UPLOADS) for root in roots.values()]
    try:
        for root in roots.values():  # the job has ended before any settle looks
            (root / ".gputrain" / "runs" / "r1" / "exitcode").write_text("0\n")
        settle({n: LocalTransport(n, root) for n, root in roots.items()}, "r1", {"failed"})
        said = {n: (r / ".gputrain/runs/r1/disarmed").read_text().strip() for n, r in roots.items()}
        assert said == {"failed": "after", "home": "before"}
    finally:
        for proc in procs:
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
    # one whose watchdog has not written its pid (yet) is disarmed all the same, also after a
    # failed download (the bed's budget test lost its webhook when it was not)
    late = tmp_path / ".gputrain" / "runs" / "r3"
    late.mkdir()
    for upload_first in (False, True):
        (late / "watchdog.disarm").unlink(missing_ok=True)
        command = build_settle_command("r3", upload_first=upload_first)
        assert LocalTransport("n", tmp_path).run(command, 10).ok
        assert (late / "watchdog.disarm").is_file()
    assert "could not stop" not in capsys.readouterr().err


def test_a_hold_is_renewed_each_beat_from_the_first_connection_until_the_session_ends(
    tmp_path: Path,
) -> None:
    """Watchdogs.hold: the head's AUTODOWN_HOLD at once, then every beat (an earlier run's
    watchdog reads it), no longer once the controller lets go."""
    head = LocalTransport("n0", tmp_path)
    plan = Autodown("s", "p", "gs://b/", (("n0", "z"),), 60.0, heartbeat_s=0.2)
    watchdogs = Watchdogs(plan, lambda: head)
    hold = tmp_path / NODE_STATE / contract.AUTODOWN_HOLD
    watchdogs.hold(head)
    assert hold.is_file()  # before the call returns: the session's next step may be slow
    first = hold.stat().st_mtime_ns
    deadline = time.monotonic() + 10
    while hold.stat().st_mtime_ns == first and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hold.stat().st_mtime_ns > first  # renewed by the beat
    watchdogs.stop()
    last = hold.stat().st_mtime_ns
    time.sleep(0.6)  # three beats
    assert hold.stat().st_mtime_ns == last


def test_a_recovery_that_moved_the_cluster_adds_its_zone_to_the_watchdogs_cost_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each attempt arms the watchdogs with the VMs as they are: after a recovery re-created
    the cluster in another zone, the cost record the head's watchdog completes (a controller
    gone) names both zones, in order, each once."""
    from scripts.job import autodown

    armed: list[Autodown] = []
    monkeypatch.setattr(autodown, "arm", lambda fleet, transports, plan, *a: armed.append(plan))
    ledger = {"run_id": "", "zones": ["z1"], "hourly_usd": 2.0}
    plan = Autodown("s", "p", "gs://b/", (("n0", "z1"),), 60.0, heartbeat_s=60, ledger=ledger)
    watchdogs = Watchdogs(plan, lambda: None)
    moved = [("n0", "z2", "head"), ("n1", "z2", "worker")]
    for nodes in ([("n0", "z1", "head"), ("n1", "z1", "worker")], moved, moved):
        watchdogs.arm(None, {}, "r1", {}, nodes)  # type: ignore[arg-type]
    watchdogs.stop()
    assert [p.ledger["zones"] for p in armed if p.ledger] == [["z1"], ["z1", "z2"], ["z1", "z2"]]
    assert armed[-1].instances == (("n1", "z2"), ("n0", "z2"))  # the head last
    assert ledger["zones"] == ["z1"]  # the launch's own record is left as it was
