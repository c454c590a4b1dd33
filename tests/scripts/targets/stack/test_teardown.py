"""destroy_stack: refresh + destroy retried; before every retry its hook runs (the bucket emptied
again when a late writer refilled it), and a failing hook is said, not fatal. `down` with a fake
`pulumi` as real processes: a silent one is ended and the sweep still looks; a Ctrl-C during the
teardown reaches no pulumi, and a second one stops waiting with what is left said. A pulumi `up`
that gputrain killed (silent, or at a second Ctrl-C) leaves a lock the teardown clears."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from scripts.targets.stack.teardown import destroy_stack
from tests.support import ROOT, wait_for
from tests.support.fake_pulumi_cli import (
    fake_pulumi,
    hanging,
    kill_all,
    locking,
    running,
    wait_until_gone,
)
from tests.support.fake_stack import FakeStackRunner


def test_the_hook_runs_before_each_retry_only(capsys: pytest.CaptureFixture[str]) -> None:
    runner = FakeStackRunner(destroy_failures=2)
    seen: list[int] = []

    def hook() -> tuple[str, ...]:
        seen.append(runner.call_names().count("destroy"))
        if len(seen) == 1:
            raise RuntimeError("the bucket could not be listed")
        return ()

    assert destroy_stack(runner, "dev", attempts=3, pause_s=0, before_retry=hook) is None
    assert seen == [1, 2]  # before attempts 2 and 3, never before the first
    assert runner.call_names().count("destroy") == 3
    err = capsys.readouterr().err
    assert "down: before destroy attempt 2: the bucket could not be listed" in err


# ---- a pulumi that hangs, a Ctrl-C during teardown: `down` with a fake `pulumi` as real processes

GPUTRAIN = (
    "import sys\nfrom pathlib import Path\nfrom scripts.cli import main\n"
    "from scripts.settings import Settings\nroot = Path(sys.argv[1])\n"
    "sys.exit(main(sys.argv[2:], Settings(root=root, runs_dir=root / 'runs')))\n"
)
OFFER = (
    "warning: teardown is in progress and goes on; press Ctrl-C again within 5 s to stop "
    "waiting: what the teardown of stack dev had not destroyed yet stays: its VMs delete "
    "themselves 6h after they started (maxRunDuration); `gputrain down --stack dev` destroys the "
    "rest (and clears the lock a stopped pulumi may leave)"
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with stack `dev` (gcp:project set); a test's fake `pulumi` goes beside it."""
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.dev.yaml").write_text("config:\n  gcp:project: gputrain-test\n")
    return tmp_path


@contextmanager
def gputrain_in_a_terminal(
    project: Path, *argv: str, **verbs: str
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """`gputrain down --stack dev` (or `gputrain ARGV`) as a terminal's foreground job: a process
    group of its own, which the terminal's Ctrl-C signals as a whole (os.killpg); (it, its
    stderr's file; its stdout goes to `project/stdout`)."""
    fake_pulumi(project / "bin", project / "pulumi.log", **verbs)
    env = {k: v for k, v in os.environ.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"}
    env |= {
        "PATH": f"{project / 'bin'}:{env['PATH']}",
        "HOME": str(project),
        "PYTHONPATH": str(ROOT),
    }
    err = project / "stderr"
    with err.open("w") as sink, (project / "stdout").open("w") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", GPUTRAIN, str(project), *(argv or ("down", "--stack", "dev"))],
            cwd=ROOT, env=env, stdout=out, stderr=sink, text=True,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield child, err
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def test_down_after_a_silent_destroy_still_sweeps_and_says_what_ends_it(
    project: Path,
    pids: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from scripts.cli import main
    from scripts.settings import Settings

    log = project / "pulumi.log"
    fake_pulumi(project / "bin", log, destroy=hanging(pids))
    monkeypatch.setenv("PATH", f"{project / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("GPUTRAIN_PULUMI_SILENCE_S", "1")
    rc: list[int] = []
    down = threading.Thread(
        target=lambda: rc.append(
            main(["down", "--stack", "dev"], Settings(project, project / "runs"))
        ),
        daemon=True,
    )
    down.start()
    down.join(30)
    if down.is_alive():
        kill_all(pids)
        down.join(10)
        pytest.fail("`down` still waited for a silent pulumi after 30 s")
    assert rc == [1]
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith(
        "gputrain: error: teardown of stack dev is incomplete: destroy failed (pulumi destroy of "
        "stack dev printed nothing for 1s (GPUTRAIN_PULUMI_SILENCE_S), so gputrain stopped it); "
        "the sweep could not look for what is left ("  # it looked: no credentials here
    )
    assert line.endswith(
        "; its VMs delete themselves 6h after they started (maxRunDuration); run `gputrain down "
        "--stack dev` again or delete them in the console."
    )
    assert len([c for c in log.read_text().splitlines() if c.startswith("destroy")]) == 1  # once
    assert wait_until_gone(pids) == []


def _up_ready(project: Path) -> None:
    """Stack `dev` as `up` takes it offline (an SSH key and source range: no lookups)."""
    from tests.support.pulumi_mocks import TEST_PUBLIC_KEY, TEST_SOURCE_RANGE

    stack_file = project / "Pulumi.dev.yaml"
    stack_file.write_text(
        stack_file.read_text() + f"  gputrain:sshPublicKey: {TEST_PUBLIC_KEY}\n"
        f"  gputrain:sshSourceRanges: [{TEST_SOURCE_RANGE}]\n"
    )


def _up_with_a_silent_pulumi(
    project: Path, log: Path, verbs: dict[str, str], pids: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, list[str]]:
    """`gputrain up` with the fake `pulumi` answering `verbs` and a 1 s silence bound, in a
    thread bounded at 60 s: its exit code, and the verbs pulumi was run with, in order."""
    from scripts.cli import main
    from scripts.settings import Settings
    from scripts.targets.stack import pulumi_process

    fake_pulumi(project / "bin", log, **verbs)
    monkeypatch.setenv("PATH", f"{project / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("GPUTRAIN_PULUMI_SILENCE_S", "1")
    monkeypatch.setattr(pulumi_process, "STOP_GRACE_S", 0.5)
    argv = ["up", "--stack", "dev", "--yes", "--skip-preflight"]
    rc: list[int] = []
    up = threading.Thread(
        target=lambda: rc.append(main(argv, Settings(project, project / "runs"))), daemon=True
    )
    up.start()
    up.join(60)
    if up.is_alive():
        kill_all(pids)
        up.join(10)
        pytest.fail("`up` still waited for a silent pulumi after 60 s")
    return rc[0], [c.split()[0] for c in log.read_text().splitlines()]


def test_the_teardown_clears_the_lock_of_the_pulumi_gputrain_killed_and_destroys(
    project: Path,
    pids: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`up` hangs and does not answer its cancel: gputrain kills it, and the lock it held stays.
    That lock is gputrain's own: the teardown that follows clears it (pulumi cancel), says so,
    and destroys, rather than leaving the VMs billing until `down`."""
    _up_ready(project)
    log, lock = project / "pulumi.log", project / "stack.lock"
    verbs = locking(lock)
    verbs["up"] += "; " + hanging(pids, deaf=True)
    _, verbs_run = _up_with_a_silent_pulumi(project, log, verbs, pids, monkeypatch)
    said = capsys.readouterr()
    assert verbs_run[verbs_run.index("up") :].count("cancel") == 1, said
    assert "destroy" in verbs_run[verbs_run.index("cancel") :] and not lock.exists()
    assert "clearing the lock (pulumi cancel) and destroying again" in said.out
    assert "destroy failed" not in said.err and "not started" not in said.err, said.err
    assert wait_until_gone(pids) == []


def test_a_pulumi_killed_before_its_header_leaves_the_lock_on_the_stack_to_the_user(
    project: Path,
    pids: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`up` hangs before its header (still reaching a shared backend, where someone else's update
    holds the lock) and does not answer its cancel: gputrain kills it. The lock is not shown to
    be ours, so the teardown cancels nothing, says so and names `gputrain down`."""
    _up_ready(project)
    log, lock = project / "pulumi.log", project / "stack.lock"
    lock.touch()  # another update's
    verbs = locking(lock) | {"up": hanging(pids, deaf=True)}
    rc, verbs_run = _up_with_a_silent_pulumi(project, log, verbs, pids, monkeypatch)
    said = capsys.readouterr()
    assert "cancel" not in verbs_run and lock.exists(), said
    assert "clearing the lock" not in said.out
    assert (
        "warning: pulumi up of stack dev was killed before it showed that it held the stack's "
        "lock (its `Updating (dev):` line): this command clears no lock on the stack; if one "
        "stays, `gputrain down --stack dev` clears it"
    ) in said.err.splitlines(), said.err
    assert rc != 0
    assert wait_until_gone(pids) == []


def test_a_second_ctrl_c_during_up_kills_pulumi_and_the_teardown_clears_its_lock(
    project: Path, pids: Path
) -> None:
    """The second Ctrl-C during `up` ends pulumi at once (SIGKILL: it is slow to finish its
    cancel), and the lock it held stays. The teardown still follows in that command: the lock is
    gputrain's own, so it clears it (pulumi cancel), says so, and destroys."""
    _up_ready(project)
    marks, lock = project / "marks", project / "stack.lock"
    verbs = locking(lock)
    verbs["up"] += (
        f'; echo $$ >> "{pids}"; trap \'echo INT >> "{marks}"\' INT; echo started >> "{marks}"; '
        "i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"
    )  # its cancel takes a minute
    argv = ("up", "--stack", "dev", "--yes", "--skip-preflight")
    with gputrain_in_a_terminal(project, *argv, **verbs) as (up, err):
        wait_for("pulumi up", lambda: marks.exists(), timeout=60)
        os.killpg(up.pid, signal.SIGINT)  # the terminal's Ctrl-C: pulumi's own cancel
        wait_for("its cancel", lambda: "INT" in marks.read_text().split(), timeout=30)
        os.killpg(up.pid, signal.SIGINT)  # at once
        up.wait(timeout=60)
    said = err.read_text()
    verbs_run = [c.split()[0] for c in (project / "pulumi.log").read_text().splitlines()]
    assert verbs_run[verbs_run.index("up") :].count("cancel") == 1, said
    assert "destroy" in verbs_run[verbs_run.index("cancel") :] and not lock.exists(), said
    assert "destroy attempt 1 failed" not in said and "destroy failed" not in said, said
    assert (
        "clearing the lock (pulumi cancel) and destroying again" in (project / "stdout").read_text()
    )
    assert wait_until_gone(pids) == []


def test_ctrl_c_during_teardown_does_not_reach_pulumi_and_says_so(
    project: Path, pids: Path
) -> None:
    marks = project / "marks"
    destroy = (
        f'echo $$ >> "{pids}"; trap \'echo INT >> "{marks}"\' INT; echo started >> "{marks}"; '
        f'i=0; while [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); done; echo destroyed >> "{marks}"'
    )
    with gputrain_in_a_terminal(project, destroy=destroy) as (down, err):
        wait_for("pulumi destroy", lambda: marks.exists(), timeout=60)
        os.killpg(down.pid, signal.SIGINT)  # the terminal's Ctrl-C
        down.wait(timeout=60)
    said = err.read_text()
    assert marks.read_text().split() == ["started", "destroyed"], said  # never interrupted
    assert OFFER in said.splitlines(), said
    assert "destroy attempt 1 failed" not in said


def test_a_second_ctrl_c_stops_waiting_ends_pulumi_and_says_what_is_left(
    project: Path, pids: Path
) -> None:
    with gputrain_in_a_terminal(project, destroy=hanging(pids)) as (down, err):
        wait_for("pulumi destroy", lambda: len(running(pids)) == 2, timeout=60)
        os.killpg(down.pid, signal.SIGINT)
        wait_for("the offer", lambda: OFFER in err.read_text().splitlines(), timeout=30)
        os.killpg(down.pid, signal.SIGINT)
        assert down.wait(timeout=60) == 130, err.read_text()
    assert err.read_text().splitlines()[-1] == (
        "gputrain: stopped waiting: what the teardown of stack dev had not destroyed yet stays: "
        "its VMs delete themselves 6h after they started (maxRunDuration); `gputrain down "
        "--stack dev` destroys the rest (and clears the lock a stopped pulumi may leave)"
    )
    assert wait_until_gone(pids) == []  # pulumi and its child, ended by gputrain
