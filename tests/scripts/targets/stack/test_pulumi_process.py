"""scripts/targets/stack/pulumi_process.py through the real adapter and Automation API, with a fake
`pulumi` script as real processes: each pulumi in a session of its own (the terminal's Ctrl-C is
not sent to it; gputrain hands an interruption on as pulumi's own cancel), and a pulumi silent for
GPUTRAIN_PULUMI_SILENCE_S ended with its process group, with one line."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scripts.targets.base import Interrupted, signal_guard
from scripts.targets.stack import pulumi_process
from scripts.targets.stack.clients import PulumiStackRunner
from scripts.targets.stack.pulumi_process import PulumiStuckError, pulumi_silence_s
from tests.support import wait_for
from tests.support.fake_pulumi_cli import fake_pulumi, hanging, kill_all, wait_until_gone


@pytest.fixture
def work_dir(tmp_path: Path) -> Path:
    (tmp_path / "Pulumi.yaml").write_text("name: gputrain\nruntime: python\n")
    return tmp_path


def _cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **verbs: str) -> Path:
    """The fake `pulumi` first on PATH; the log of its argv."""
    log = tmp_path / "pulumi.log"
    fake_pulumi(tmp_path / "bin", log, **verbs)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return log


def _within(seconds: float, call: Callable[[], Any], pids: Path) -> BaseException | None:
    """What `call` raised (None: it returned), in a thread: a test fails, not hangs, where the
    old code waited for pulumi forever (its processes are killed first)."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            raised.append(None)
        except BaseException as e:
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        kill_all(pids)
        thread.join(10)
        pytest.fail(f"still waiting for pulumi after {seconds} s")
    return raised[0]


def test_a_silent_pulumi_is_ended_with_its_group_and_one_line(
    work_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pids: Path
) -> None:
    monkeypatch.setenv("GPUTRAIN_PULUMI_SILENCE_S", "1")
    log = _cli(tmp_path, monkeypatch, destroy=hanging(pids))
    started = time.monotonic()
    raised = _within(20, PulumiStackRunner("dev", work_dir).destroy, pids)
    assert isinstance(raised, PulumiStuckError)
    assert str(raised) == (
        "pulumi destroy of stack dev printed nothing for 1s (GPUTRAIN_PULUMI_SILENCE_S), so "
        "gputrain stopped it"
    )  # it answered its cancel (SIGINT): no lock is left, nothing more to say
    assert time.monotonic() - started < 10
    assert wait_until_gone(pids) == []  # pulumi and its child: the whole group
    verbs = [ln.split()[0] for ln in log.read_text().splitlines()]
    assert [v for v in verbs if v != "version"] == ["stack", "destroy"]  # select, then destroy once


def test_a_pulumi_deaf_to_its_cancel_is_killed_and_none_is_started_again(
    work_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pids: Path
) -> None:
    """None but the teardown's: the lock the killed update left, once it said it held it (its
    header), is ours (left_own_lock, once), and pulumi may start again to clear it and destroy."""
    monkeypatch.setenv("GPUTRAIN_PULUMI_SILENCE_S", "1")
    monkeypatch.setattr(pulumi_process, "STOP_GRACE_S", 0.5)
    refresh = 'echo "Refreshing (dev):"; ' + hanging(pids, deaf=True)
    log = _cli(tmp_path, monkeypatch, refresh=refresh)
    runner = PulumiStackRunner("dev", work_dir)
    raised = _within(20, runner.refresh, pids)
    assert isinstance(raised, PulumiStuckError)
    assert str(raised).endswith(
        "; it did not answer its own cancel and was killed, so the stack may stay locked until a "
        "teardown clears it (pulumi cancel): the one that follows in this command, or `gputrain "
        "down --stack dev`"
    )
    assert wait_until_gone(pids) == []
    with pytest.raises(PulumiStuckError, match=r"^pulumi destroy of stack dev not started: "):
        runner.destroy()  # the sweep after it is what the teardown still has
    assert "destroy" not in log.read_text()
    assert runner.left_own_lock() and not runner.left_own_lock()  # ours once, then no longer
    runner.cancel()
    runner.destroy()
    verbs = [ln.split()[0] for ln in log.read_text().splitlines()]
    assert [v for v in verbs if v in ("cancel", "destroy")] == ["cancel", "destroy"]


def test_a_pulumi_killed_before_it_said_it_held_the_lock_leaves_any_lock_to_the_user(
    work_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pids: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Silent and deaf to its cancel before its header (still reaching the backend): the lock on
    the stack may be another update's, so it is not ours (left_own_lock) and the lines say
    that `gputrain down` clears it, not the teardown."""
    monkeypatch.setenv("GPUTRAIN_PULUMI_SILENCE_S", "1")
    monkeypatch.setattr(pulumi_process, "STOP_GRACE_S", 0.5)
    _cli(tmp_path, monkeypatch, refresh=hanging(pids, deaf=True))
    runner = PulumiStackRunner("dev", work_dir)
    raised = _within(20, runner.refresh, pids)
    assert isinstance(raised, PulumiStuckError)
    assert str(raised).endswith("; it did not answer its own cancel and was killed")
    assert (
        "warning: pulumi refresh of stack dev was killed before it showed that it held the "
        "stack's lock (its `Refreshing (dev):` line): this command clears no lock on the stack; "
        "if one stays, `gputrain down --stack dev` clears it"
    ) in capsys.readouterr().err.splitlines()
    assert not runner.left_own_lock()
    with pytest.raises(PulumiStuckError, match=r"^pulumi destroy of stack dev not started: "):
        runner.destroy()


@pytest.mark.parametrize(
    "header", ["", "Updating (dev):", "View Live: https://app.pulumi.com/o/p/dev/updates/3"]
)
def test_an_up_killed_at_a_second_ctrl_c_leaves_a_lock_ours_once_it_said_it_held_it(
    header: str, work_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pids: Path
) -> None:
    """A second Ctrl-C kills `up` at once: the lock is ours to clear after its header (a
    self-managed backend takes it first) or Pulumi Cloud's `View Live:` line (its update, the
    lock, started first); killed before either, it may have met someone else's lock."""
    marks = tmp_path / "marks"
    up = (
        f'echo $$ >> "{pids}"; echo "{header}"; trap \'echo INT >> "{marks}"\' INT; '
        f'echo started >> "{marks}"; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done'
    )  # its cancel takes a minute
    _cli(tmp_path, monkeypatch, up=up)
    runner = PulumiStackRunner("dev", work_dir)

    def ctrl_c_twice() -> None:
        wait_for("pulumi up", marks.exists, timeout=30)
        os.kill(os.getpid(), signal.SIGINT)  # pulumi's own cancel
        wait_for("its cancel", lambda: "INT" in marks.read_text().split(), timeout=30)
        os.kill(os.getpid(), signal.SIGINT)  # at once

    with signal_guard(), pytest.raises(Interrupted):
        threading.Thread(target=ctrl_c_twice, daemon=True).start()
        runner.up()
    assert wait_until_gone(pids) == []
    assert runner.left_own_lock() is bool(header)


def test_an_interrupted_up_hands_pulumi_its_own_cancel_and_waits_for_it(
    work_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pids: Path
) -> None:
    """Ctrl-C during `up`: pulumi, in a session of its own, does not get the terminal's SIGINT;
    gputrain hands it on and waits while pulumi finishes what is in flight (so the teardown after
    it destroys that too)."""
    marks = tmp_path / "marks"
    up = (  # its trap first: the Ctrl-C comes once its session is written
        f"trap 'sleep 0.5; echo cancelled >> \"{marks}\"; exit 255' INT; "
        f'echo $$ >> "{pids}"; sid=$(ps -o sid= -p $$); echo $sid >> "{marks}"; '
        "i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done"
    )
    _cli(tmp_path, monkeypatch, up=up)
    runner = PulumiStackRunner("dev", work_dir)

    def ctrl_c_once_up_runs() -> None:  # the terminal's Ctrl-C, were gputrain its only process
        wait_for("pulumi up", lambda: marks.exists() and marks.read_text().strip(), timeout=30)
        os.kill(os.getpid(), signal.SIGINT)

    with signal_guard(), pytest.raises(Interrupted):
        threading.Thread(target=ctrl_c_once_up_runs, daemon=True).start()
        runner.up()
    sid, cancelled = marks.read_text().split()
    assert int(sid) != os.getsid(0)  # a session of its own
    assert cancelled == "cancelled"  # it got SIGINT from gputrain, and finished before the raise
    assert wait_until_gone(pids, within_s=0) == []


@pytest.mark.parametrize("raw", ["0", "soon", "90000"])
def test_a_bad_silence_bound_is_one_line_before_any_pulumi(
    raw: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from scripts.cli import main
    from scripts.settings import Settings

    log = _cli(tmp_path, monkeypatch)
    monkeypatch.setenv("GPUTRAIN_PULUMI_SILENCE_S", raw)
    assert main(["down", "--stack", "dev"], Settings(tmp_path, tmp_path / "runs")) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"gputrain: error: GPUTRAIN_PULUMI_SILENCE_S={raw!r}: allowed: seconds > 0, at most 86400"
    ]
    assert log.read_text() == ""
    assert (
        pulumi_silence_s({}) == 1800 and pulumi_silence_s({"GPUTRAIN_PULUMI_SILENCE_S": "60"}) == 60
    )
