"""Results come home: what the job wrote beside its code too, on the download's one channel; a
relaunch's results land on the attempt before's (folders merge, files replace)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from scripts.job.download import (
    COLLECT_ERRORS,
    download_results,
    keep_attempt_files,
    keep_previous_attempt,
    move_into,
)
from scripts.transport.base import CommandResult
from scripts.transport.local import LocalTransport


def test_a_relaunch_merges_folders_and_replaces_files(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "tensorboard").mkdir(parents=True)
    (old / "tensorboard" / "events.1").write_text("first attempt")
    (old / "summary.json").write_text("old")
    (new / "tensorboard").mkdir(parents=True)
    (new / "tensorboard" / "events.2").write_text("relaunch")
    (new / "summary.json").write_text("new")
    for p in new.iterdir():
        move_into(p, old / p.name)
    assert sorted(p.name for p in (old / "tensorboard").iterdir()) == ["events.1", "events.2"]
    assert (old / "summary.json").read_text() == "new"


class CountingTransport(LocalTransport):
    """This machine as a node, counting the commands run beside the download."""

    def __init__(self, root: Path) -> None:
        super().__init__("n", root)
        self.runs = 0

    def run(self, cmd: str, timeout: float, stdin: bytes | None = None) -> CommandResult:
        self.runs += 1
        return super().run(cmd, timeout, stdin)


def _run_dir(root: Path) -> Path:
    run = root / ".gputrain" / "runs" / "r1"
    (run / "code").mkdir(parents=True)
    (run / "code" / "train.py").write_text("old code\n")
    os.utime(run / "code" / "train.py", (1, 1))
    (run / "pgid").write_text("1\n")
    os.utime(run / "pgid", (2, 2))
    (run / "code" / "out").mkdir()
    (run / "code" / "out" / "ckpt.pt").write_text("written beside the code")
    (run / "out").mkdir()
    (run / "out" / "summary.json").write_text("{}")
    (run / "torchrun.log").write_text("log\n")
    return run


def test_results_and_the_jobs_workdir_files_come_home_on_one_channel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = CountingTransport(tmp_path / "node")
    _run_dir(tmp_path / "node")
    download_results({"n": t}, "r1", tmp_path / "results")
    got = tmp_path / "results" / "n"
    assert (got / "workdir" / "out" / "ckpt.pt").read_text() == "written beside the code"
    assert not (got / "workdir" / "train.py").exists()  # older than the run: not the job's
    assert (got / "summary.json").is_file() and (got / "torchrun.log").is_file()
    assert t.runs == 0 and "could not collect" not in capsys.readouterr().err
    assert not (got / COLLECT_ERRORS).exists()


def test_a_workdir_that_cannot_be_collected_is_said_and_the_rest_comes_home(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = CountingTransport(tmp_path / "node")
    run = _run_dir(tmp_path / "node")
    shutil.rmtree(run / "code")  # find fails: nothing to walk
    download_results({"n": t}, "r1", tmp_path / "results")
    err = capsys.readouterr().err
    assert "n: could not collect the job's working-directory files: find: " in err
    assert (tmp_path / "results" / "n" / "summary.json").is_file()


def _node_with_tar(tmp_path: Path, tar_script: str) -> LocalTransport:
    """This machine as a node whose `tar` is `tar_script` (bash; $REAL_TAR the real one): a
    node that fails the download the way a real one does, through its own shell."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "tar").write_text(f"#!/bin/bash\nREAL_TAR={shutil.which('tar')}\n{tar_script}\n")
    (fake / "tar").chmod(0o755)
    t = LocalTransport("n", tmp_path / "node")
    t._env["PATH"] = f"{fake}:{t._env['PATH']}"
    t._env["FAILS_FILE"] = str(tmp_path / "fails")
    _run_dir(tmp_path / "node")
    return t


def test_a_transient_failure_is_tried_again_and_the_results_come_home(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = _node_with_tar(
        tmp_path,  # the first download breaks off mid-stream, as a reset connection does
        'if [ ! -e "$FAILS_FILE" ]; then touch "$FAILS_FILE"; echo "broken pipe" >&2; exit 2; fi\n'
        'exec "$REAL_TAR" "$@"',
    )
    missing = download_results({"n": t}, "r1", tmp_path / "results", retry_pause_s=0.01)
    assert missing == {}
    assert (tmp_path / "results" / "n" / "summary.json").is_file()
    assert "n: downloading results failed" in capsys.readouterr().err


@pytest.mark.parametrize(
    "tar_script",
    [
        'echo "tar: out/big: Cannot open: Permission denied" >&2; exit 2',  # fails every time
        # a hostile node: a member outside the results (the controller refuses the tar)
        "exec python3 -c 'import io, sys, tarfile\n"
        't = tarfile.open(fileobj=sys.stdout.buffer, mode="w|")\n'
        'i = tarfile.TarInfo("../evil"); i.size = 1; t.addfile(i, io.BytesIO(b"x")); t.close()\'',
    ],
)
def test_a_node_whose_results_never_come_home_is_named(
    tmp_path: Path, tar_script: str, capsys: pytest.CaptureFixture[str]
) -> None:
    t = _node_with_tar(tmp_path, tar_script)
    missing = download_results({"n": t}, "r1", tmp_path / "results", retry_pause_s=0.01)
    assert list(missing) == ["n"]
    assert "n: could not download results" in capsys.readouterr().err


def test_a_node_without_the_run_is_named_too(tmp_path: Path) -> None:
    t = LocalTransport("n", tmp_path / "node")
    missing = download_results({"n": t}, "r1", tmp_path / "results", retry_pause_s=0.01)
    assert missing == {"n": "the node has no run r1"}


def test_attempt_files_are_kept_apart(tmp_path: Path) -> None:
    """Before a relaunch each node's per-attempt files move aside under the attempt's tag."""
    (tmp_path / "n0").mkdir()
    (tmp_path / "n0" / "torchrun.log").write_text("attempt one\n")
    (tmp_path / "n0" / "exitcode").write_text("1 0\n")
    (tmp_path / "n0" / "torchrun-logs" / "attempt_0").mkdir(parents=True)
    keep_attempt_files(tmp_path, "attempt1")
    assert (tmp_path / "n0" / "torchrun-logs.attempt1" / "attempt_0").is_dir()
    assert (tmp_path / "n0" / "torchrun.attempt1.log").read_text() == "attempt one\n"
    assert (tmp_path / "n0" / "exitcode.attempt1").is_file()
    assert not (tmp_path / "n0" / "torchrun.log").exists()


def test_attempt_files_never_replace_earlier_ones(tmp_path: Path) -> None:
    """A resumed run's recovery counts from 1 again: attempt1 of before the resume stays."""
    (tmp_path / "n0").mkdir()
    (tmp_path / "n0" / "torchrun.attempt1.log").write_text("before the resume\n")
    (tmp_path / "n0" / "torchrun.log").write_text("after it\n")
    keep_attempt_files(tmp_path, "attempt1")
    assert (tmp_path / "n0" / "torchrun.attempt1.log").read_text() == "before the resume\n"
    assert (tmp_path / "n0" / "torchrun.attempt1.2.log").read_text() == "after it\n"


def test_a_resume_keeps_the_earlier_log_on_the_node_and_at_home(tmp_path: Path) -> None:
    """`train --resume`: the start truncates the node's torchrun.log and the download replaces
    the home copy; both become torchrun.attempt<N>.log first, and a log only the node kept (its
    results never came home) comes home with the next download."""
    node = tmp_path / "node"
    run = node / ".gputrain" / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "torchrun.log").write_text("first\n")
    home = tmp_path / "results"
    t = LocalTransport("n", node)
    keep_previous_attempt({"n": t}, "r1", home)  # the first attempt's results never came home
    assert (run / "torchrun.attempt1.log").read_text() == "first\n"
    (run / "torchrun.log").write_text("second\n")
    assert download_results({"n": t}, "r1", home) == {}
    assert (home / "n" / "torchrun.attempt1.log").read_text() == "first\n"
    keep_previous_attempt({"n": t}, "r1", home)
    assert (home / "n" / "torchrun.attempt2.log").read_text() == "second\n"
    assert (run / "torchrun.attempt2.log").read_text() == "second\n"
    assert not (run / "torchrun.log").exists() and not (home / "n" / "torchrun.log").exists()


def test_a_resume_moves_the_budget_stops_mark_aside_at_home_and_on_the_node(tmp_path: Path) -> None:
    """After a budget stop, `train --resume RUN --budget N`: the stop's mark (watch/budget.json,
    home with the results and on a kept head) becomes the earlier attempt's,
    watch/budget.attempt<N>.json, so the resumed attempt's end (a preemption) is no budget stop:
    it is recovered or fails as what it is."""
    import json
    import time

    from scripts.job.autodown import budget_reached
    from scripts.job.records import JobResult, NodeFailure, TrainingError

    stop = json.dumps({"budget_usd": 400.0, "spent_usd": 398.7, "at": time.time() - 3600})
    node = tmp_path / "node"
    run = node / ".gputrain" / "runs" / "r1"
    home = tmp_path / "results"
    for where in (run, home / "n"):
        (where / "watch").mkdir(parents=True)
        (where / "watch" / "budget.json").write_text(stop)
        (where / "torchrun.log").write_text("first\n")
    t = LocalTransport("n", node)
    began = time.time()
    keep_previous_attempt({"n": t}, "r1", home)
    for where in (run, home / "n"):
        assert (where / "watch" / "budget.attempt1.json").read_text() == stop
        assert not (where / "watch" / "budget.json").exists()
    (run / "torchrun.log").write_text("second, killed\n")  # the resumed attempt
    assert download_results({"n": t}, "r1", home) == {}
    assert not (home / "n" / "watch" / "budget.json").exists()
    killed = TrainingError(
        "node n lost",
        failure=NodeFailure("n", "killed", None, ("killed",)),
        result=JobResult("r1", False, {"n": None}, 60.0, home),
    )
    assert budget_reached(killed, "n", None, began) is None
