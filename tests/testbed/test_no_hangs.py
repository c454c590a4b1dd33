"""No hangs, end to end over real SSH (the sshd test bed, `--hosts`): `--detach` returns for a job
that ends before any step (its output holding a character str.splitlines() breaks at), for one
whose first step is only a heartbeat, and — after GPUTRAIN_DETACH_WAIT_S — for one that never
shows a step; each time with the job's state as it is on the nodes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scripts.cli import main
from scripts.settings import Settings
from tests.support.testbed import TestBed

QUIET = "import time\nprint('loading, no progress format gputrain knows', flush=True)\n"
QUIET += "time.sleep(600)\n"
HEARTBEAT = "import os, pathlib, time\nprint('warming up', flush=True)\ntime.sleep(1)\n"
HEARTBEAT += "pathlib.Path(os.environ['GPUTRAIN_HEARTBEAT'] + '.rank' + os.environ['RANK'])"
HEARTBEAT += ".touch()\ntime.sleep(600)\n"
ENDS = "import sys\nprint('record\\x1eseparator\\x0cfeed', flush=True)\nsys.exit(3)\n"


@pytest.fixture
def lab(tb: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Settings]:
    hosts = tb.add_hosts(2)
    path = tb.hosts_file(tmp_path, hosts, "gpus: {model: NVIDIA L4, count: 1}\n")
    monkeypatch.chdir(tmp_path)
    for name, text in (("quiet.py", QUIET), ("heartbeat.py", HEARTBEAT), ("ends.py", ENDS)):
        (tmp_path / name).write_text(text)
    return path, Settings(root=tmp_path, runs_dir=tmp_path / "runs", connect_deadline_s=30)


def detach(lab: tuple[Path, Settings], entry: str) -> tuple[int, float]:
    path, settings = lab
    t0 = time.monotonic()
    rc = main(["run", "--hosts", str(path), "--detach", "--", entry], settings)
    return rc, time.monotonic() - t0


def stop(lab: tuple[Path, Settings]) -> None:
    path, settings = lab
    assert main(["stop", "--hosts", str(path)], settings) == 0


def test_a_job_that_ends_before_a_step_ends_the_detach(
    lab: tuple[Path, Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, took = detach(lab, "ends.py")
    err = capsys.readouterr().err
    assert rc == 1, err[-2000:]
    assert "ended before its first training step" in err and "=1" in err, err[-2000:]
    assert took < 120


def test_a_heartbeat_is_the_first_step(
    lab: tuple[Path, Settings], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUTRAIN_DETACH_WAIT_S", "300")
    try:
        rc, took = detach(lab, "heartbeat.py")
        out = capsys.readouterr()
        assert rc == 0, out.err[-2000:]
        assert "detached" in out.out and "showed no training step" not in out.err
        assert took < 200  # the heartbeat, not the 300 s wait
    finally:
        stop(lab)


def test_a_trainer_that_shows_no_step_is_let_go_after_the_wait(
    lab: tuple[Path, Settings], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # long enough for torchrun and the job to start and print under a full `make test`'s load
    monkeypatch.setenv("GPUTRAIN_DETACH_WAIT_S", "25")
    try:
        rc, took = detach(lab, "quiet.py")
        out = capsys.readouterr()
        assert rc == 0, out.err[-2000:]
        assert "showed no training step in 25 s" in out.err, out.err[-2000:]
        assert "detached" in out.out and "loading, no progress format" in out.out
        assert took < 200
    finally:
        stop(lab)
