"""`--detach`'s wait for the first step, on real node directories through the local transport:
any trainer's first step (its progress line or a heartbeat) ends it, a job that ends before one
ends it (even when its log holds characters str.splitlines() breaks at), and a trainer that shows
neither is let go after the wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from infra.base.errors import GputrainError, UserError
from scripts.job.detach import detach_wait_s, read_poll, wait_first_step
from scripts.transport.local import LocalTransport
from scripts.watch.telemetry import is_training_step

RUN = "20261127-083000-ab12"


def node(tmp_path: Path, name: str) -> tuple[LocalTransport, Path]:
    t = LocalTransport(name, tmp_path / name)
    run = t.node_root / ".gputrain" / "runs" / RUN
    (run / "watch").mkdir(parents=True)
    (run / "torchrun.log").write_text("")
    return t, run


def shown() -> tuple[list[tuple[str, str]], object]:
    lines: list[tuple[str, str]] = []
    return lines, lambda n, line: lines.append((n, line))


@pytest.mark.parametrize(
    "line",
    [
        "step 1/300 | loss 4.1 | 12.0k tok/s",
        "[rank0]: iter 0: loss 10.9852, time 3012.41ms, mfu -100.00%",
        "{'loss': 2.3012, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.01}",
    ],
)
def test_any_trainers_progress_line_is_a_step(line: str) -> None:
    assert is_training_step(line)


@pytest.mark.parametrize(
    "line", ["Downloading: 50%|#####     | 5/10 [00:01<00:01]", "loading step 1", "iter 3"]
)
def test_other_lines_are_not(line: str) -> None:
    assert not is_training_step(line)


def test_a_job_that_ends_before_a_step_line_ends_the_wait(tmp_path: Path) -> None:
    t, run = node(tmp_path, "n0")
    # A log line holding \x1e and \x0c (both line breaks to str.splitlines()), then the end.
    (run / "torchrun.log").write_text("rec\x1esep\x0cff\nTraceback: boom\n")
    (run / "exitcode").write_text("1 1764232200\n")
    lines, sink = shown()
    t0 = time.monotonic()
    with pytest.raises(GputrainError, match=r"ended before its first training step \(n0=1\)"):
        wait_first_step({"n0": t}, RUN, on_line=sink, poll_s=0.05, wait_s=20)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 10
    assert lines == [("n0", "rec\x1esep\x0cff"), ("n0", "Traceback: boom")]


def test_a_job_that_ends_well_without_a_step_is_said_and_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t, run = node(tmp_path, "n0")
    (run / "torchrun.log").write_text("done, no progress shown")  # no final newline either
    (run / "exitcode").write_text("0 1764232200\n")
    lines, sink = shown()
    wait_first_step({"n0": t}, RUN, on_line=sink, poll_s=0.05, wait_s=20)  # type: ignore[arg-type]
    assert lines == [("n0", "done, no progress shown")]
    assert "exit 0 on every node" in capsys.readouterr().out


def test_a_heartbeat_is_a_first_step(tmp_path: Path) -> None:
    (a, _), (b, run_b) = node(tmp_path, "n0"), node(tmp_path, "n1")
    threading.Timer(0.4, (run_b / "watch" / "heartbeat.rank1").touch).start()
    t0 = time.monotonic()
    wait_first_step({"n0": a, "n1": b}, RUN, poll_s=0.05, wait_s=30)
    assert 0.3 < time.monotonic() - t0 < 10


def test_a_trainer_that_shows_nothing_is_let_go_after_the_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t, run = node(tmp_path, "n0")
    (run / "torchrun.log").write_text("epoch 1 ... (no progress format we know)\n")
    t0 = time.monotonic()
    wait_first_step({"n0": t}, RUN, poll_s=0.05, wait_s=1.0)
    assert 1.0 <= time.monotonic() - t0 < 10
    assert "showed no training step in 1 s" in capsys.readouterr().err


def test_lines_arrive_once_each_across_polls_and_partial_lines_wait(tmp_path: Path) -> None:
    t, run = node(tmp_path, "n0")
    log = run / "torchrun.log"
    log.write_text("one\ntw")
    lines, sink = shown()

    def more() -> None:
        with log.open("a") as f:
            f.write("o\nthree\nstep 1/9 | loss 1.0\n")

    threading.Timer(0.3, more).start()
    wait_first_step({"n0": t}, RUN, on_line=sink, poll_s=0.05, wait_s=20)  # type: ignore[arg-type]
    assert [x for _, x in lines] == ["one", "two", "three", "step 1/9 | loss 1.0"]


def test_read_poll_of_a_node_that_did_not_answer() -> None:
    assert read_poll("") == ([], False, None)


@pytest.mark.parametrize("raw", ["0", "-5", "ten", "1e9"])
def test_a_bad_wait_is_one_line(raw: str) -> None:
    with pytest.raises(UserError, match="GPUTRAIN_DETACH_WAIT_S"):
        detach_wait_s({"GPUTRAIN_DETACH_WAIT_S": raw})
    assert detach_wait_s({}) == 600 and detach_wait_s({"GPUTRAIN_DETACH_WAIT_S": "90"}) == 90
