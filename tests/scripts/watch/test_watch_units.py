"""The pure parts of the watch: samples, faults, the idle warning, the log's progress, the stall
clock and who is stuck, the poll's parsing, the settings and the one-line refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from infra.base.errors import UserError
from infra.keys import effective_timeout, parse_stall_timeout
from scripts.cli import main
from scripts.settings import Settings
from scripts.watch.node import parse_poll
from scripts.watch.telemetry import (
    IdleWatch,
    LogProgress,
    NodeTelemetry,
    RankState,
    Sample,
    StallClock,
    parse_samples,
    rank_heartbeats,
    stuck_rank,
    summary_line,
    watch_settings,
)
from scripts.watch.xid import XID_CLASSES, XidClass, xid_class

CSV = (
    "time,gpu,util_pct,mem_used_mib,mem_total_mib,power_w,temp_c,sm_clock_mhz,ecc_uncorrected,"
    "xid_count,last_xid\n"
    "100.0,0,97,18000,23034,70.00,34,1980,0,0,\n"
    "100.0,1,[N/A],,23034,,,,,0,\n"
    "105.0,0,95,18000,23034,70.00,34,1980,0,1,79\n"
    "broken line\n"
)


def _s(t: float, util: float | None, gpu: int = 0, **kw: int) -> Sample:
    return Sample(t, gpu, util, 1000, 2000, 50, 40, 1500, kw.get("ecc", 0), kw.get("xid", 0),
                  kw.get("last"))  # fmt: skip


def test_samples_parse_unknowns_as_none_and_skip_junk() -> None:
    rows = parse_samples(CSV)
    assert [(r.time, r.gpu, r.util_pct) for r in rows] == [(100.0, 0, 97.0), (100.0, 1, None),
                                                           (105.0, 0, 95.0)]  # fmt: skip
    assert rows[1].mem_used_mib is None and rows[2].last_xid == 79


def test_a_new_xid_or_ecc_error_is_a_fault_once_the_baseline_is_known() -> None:
    node = NodeTelemetry("n0")
    assert node.add([_s(1, 90, xid=2, last=13, ecc=1)]) == []  # what the node had before the run
    assert node.add([_s(2, 90, xid=2, last=13, ecc=1)]) == []
    faults = node.add([_s(3, 0, xid=3, last=79, ecc=1), _s(3, 0, gpu=1, ecc=0)])
    assert [str(f) for f in faults] == ["node n0 GPU 0: Xid 79"]
    assert [str(f) for f in node.add([_s(4, 0, gpu=1, ecc=2)])] == [
        "node n0 GPU 1: 2 uncorrectable ECC error(s)"
    ]
    assert node.add([_s(5, 0, xid=3, last=79, ecc=1)]) == []  # reported once


def test_the_xid_table_follows_nvidias_catalogue() -> None:
    assert {c for c, (k, _) in XID_CLASSES.items() if k is XidClass.HARDWARE} == {
        48,
        62,
        64,
        74,
        79,
        95,
        119,
        120,
    }
    assert [xid_class(c) for c in (13, 31, 43, 45)] == [XidClass.APPLICATION] * 4
    assert [xid_class(c) for c in (63, 92)] == [XidClass.INFORMATIONAL] * 2
    assert xid_class(8) is XidClass.RESTART and xid_class(94) is XidClass.RESTART


def test_only_a_hardware_xid_is_a_fault_that_replaces_the_node() -> None:
    node = NodeTelemetry("n0")
    assert node.add([_s(1, 90)]) == []
    [app] = node.add([_s(2, 90, xid=1, last=13)])  # the job's own out-of-range access
    assert app.kind is XidClass.APPLICATION and "graphics engine exception" in app.explain()
    [info] = node.add([_s(3, 90, xid=2, last=63)])
    assert info.kind is XidClass.INFORMATIONAL
    # Xid 79, then 45 for the process that died with the GPU, in one sample: a hardware fault
    [hw] = node.add([dataclasses.replace(_s(4, 0, xid=4, last=45), xids=(13, 63, 79, 45))])
    assert (hw.kind, hw.what) == (XidClass.HARDWARE, "Xid 79")
    # a node side that does not list the codes: the last one
    [hw] = node.add([_s(5, 0, xid=5, last=95)])
    assert (hw.kind, hw.what) == (XidClass.HARDWARE, "Xid 95")


def test_a_job_that_fails_after_its_own_xid_is_the_jobs_error_not_a_gpu_fault() -> None:
    from scripts.job.records import JobResult, NodeFailure, TrainingError
    from scripts.watch.monitor import ApplicationXidError, GpuFaultError

    result = JobResult("r1", False, {"n1": 1}, 3.0, Path("/tmp/r1"), failed_node="n1")
    cause = TrainingError(
        "run r1 failed on node n1", failure=NodeFailure("n1", "exited", 1, ()), result=result
    )
    [xid] = NodeTelemetry("n1").add([_s(1, 90), _s(2, 90, xid=1, last=31)])
    e = ApplicationXidError([xid], cause)
    assert not isinstance(e, GpuFaultError)  # a recovery replaces nodes for GpuFaultError only
    assert str(e).startswith("run r1 failed on node n1\nThe GPU reported node n1 GPU 0: Xid 31 (")
    assert "not of the GPU" in str(e) and "No node was replaced." in str(e)
    assert e.failure is cause.failure and e.result is result


def test_samples_with_the_xid_list_column() -> None:
    [row] = parse_samples("105.0,0,95,18000,23034,70.00,34,1980,0,2,45,79 45\n")
    assert (row.xid_count, row.last_xid, row.xids) == (2, 45, (79, 45))


def test_idle_warning_after_the_window_once_per_episode_never_for_a_busy_node() -> None:
    idle = IdleWatch(window_s=600, below_pct=50)
    assert idle.update("busy", [_s(t, 97) for t in range(0, 1300, 5)]) is None
    assert idle.update("slow", [_s(t, 30) for t in range(0, 595, 5)]) is None
    msg = idle.update("slow", [_s(600, 30), _s(600, 40, gpu=1)])
    assert msg is not None and msg.startswith("node slow: mean GPU utilization below 50 % for 10.0")
    assert idle.update("slow", [_s(t, 30) for t in range(605, 1300, 5)]) is None  # once
    assert idle.update("slow", [_s(1300, 90)]) is None  # busy again: a new episode may warn
    assert idle.update("slow", [_s(1305 + t, 10) for t in range(0, 605, 5)]) is not None
    # two GPUs: one idle, one busy -> the node's mean is what counts
    assert IdleWatch(10, 50).update("mixed", [_s(t, 0) for t in range(30)] + [
        _s(t, 100, gpu=1) for t in range(30)]) is None  # fmt: skip


def test_log_progress_reads_the_trainers_interval_line() -> None:
    p = LogProgress()
    line = (
        "[rank0]:step    120/300 | loss 1.6054 | lr 8.35e-03 | 31.0k tok/s | mfu 41.8% | mem 3 MiB"
    )
    assert p.line(line) and not p.line(line)  # the same step again is no progress
    assert (p.step, p.steps, p.loss, p.tokens_per_s, p.mfu_pct) == (120, 300, 1.6054, 31000, 41.8)
    assert (
        not p.line("step 2 sum 3") and p.text() == "step 120/300 loss 1.6054 31.0k tok/s mfu 41.8%"
    )
    node = NodeTelemetry("h0")
    node.add([_s(1, 80), _s(1, 60, gpu=1)])
    assert summary_line({"h0": node, "h1": NodeTelemetry("h1")}, p) == (
        "watch: h0 2 GPU util 70% mem 2.0 GiB | h1 no GPU samples | step 120/300 loss 1.6054 "
        "31.0k tok/s mfu 41.8%"
    )


def test_stall_clock_arms_at_the_first_step_and_follows_the_slowest_step() -> None:
    c = StallClock(None)
    assert c.overdue(10_000) is None  # no step seen: a job that shows none is never stalled
    c.progress(0)
    c.progress(100)  # a 100 s step: 10 x is 1000 s
    assert c.timeout_s == 1000 and c.overdue(1099) is None and c.overdue(1101) == 1001
    short = StallClock(None)
    short.progress(0)
    short.progress(1)
    assert short.timeout_s == 600  # never below 10 minutes
    explicit = StallClock(30)
    explicit.progress(0)
    explicit.progress(200)
    assert explicit.timeout_s == 30 and explicit.overdue(231) == 31
    assert effective_timeout(None, None) == 600


def _r(node: str, rank: int, state: str = "S", stack: str = "", age: float | None = None):
    return RankState(node, rank, 100 + rank, state, stack, "faulthandler", age)


def test_the_stuck_rank_stopped_then_oldest_heartbeat_then_not_in_a_collective() -> None:
    found = stuck_rank([_r("a", 0, stack="all_reduce"), _r("b", 1, "T")])
    assert found is not None and found[0].rank == 1 and "stopped" in found[1]
    found = stuck_rank([_r("a", 0, age=40), _r("b", 1, age=95), _r("b", 2, age=41)])
    assert found is not None and found[0].rank == 1 and "95 s ago" in found[1]
    waiting = 'File "x.py", line 3 in all_reduce'
    found = stuck_rank([_r("a", 0, stack=waiting), _r("a", 1, stack='File "d.py" in load_batch')])
    assert found is not None and found[0].rank == 1
    assert stuck_rank([_r("a", 0, stack=waiting), _r("b", 1, stack=waiting)]) is None
    assert rank_heartbeats({"heartbeat.rank3": 90.0, "heartbeat": 99.0}, 100.0) == {3: 10.0}


def test_poll_output_is_split_into_clock_telemetry_and_heartbeats() -> None:
    text = (
        "@@now 1700000000.5\n@@telemetry 120\n1,0,97\n2,0,9\n@@heartbeat\nheartbeat.rank0 1699.5\n"
    )
    assert parse_poll(text) == (1700000000.5, 120, "1,0,97\n2,0,9", {"heartbeat.rank0": 1699.5})
    assert parse_poll("@@now 5\n@@telemetry 0\n\n@@heartbeat\n") == (5.0, 0, "", {})


@pytest.mark.parametrize(
    ("raw", "seconds"), [("", None), ("auto", None), ("30", 30), ("90s", 90), ("15m", 900),
                         ("1h30m", 5400), ("7d", 604800)]
)  # fmt: skip
def test_stall_timeout_values(raw: str, seconds: int | None) -> None:
    assert parse_stall_timeout(raw) == seconds


@pytest.mark.parametrize("raw", ["29s", "10", "0", "-5m", "abc", "5x", "8d", "1.5m"])
def test_stall_timeout_refused_on_one_line(raw: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--local", "--yes", f"--stall-timeout={raw}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gputrain: error: --stall-timeout {raw!r}: allowed:") and "\n" not in err


def test_watch_env_overrides_and_their_refusal() -> None:
    s = watch_settings(45, {"GPUTRAIN_WATCH_POLL_S": "1", "GPUTRAIN_WATCH_IDLE_WINDOW_S": "3"})
    assert (s.stall_timeout_s, s.poll_s, s.idle_window_s, s.summary_every_s) == (45, 1, 3, 300)
    with pytest.raises(UserError, match=r"^GPUTRAIN_WATCH_POLL_S='x': allowed: seconds > 0"):
        watch_settings(None, {"GPUTRAIN_WATCH_POLL_S": "x"})


def test_top_on_a_run_that_does_not_exist_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["top", "--local"], settings=settings) == 2
    assert capsys.readouterr().err == (
        "gputrain: error: top: no run recorded for local; pass --run RUN_ID\n"
    )
    assert main(["top", "--local", "--run", "nope"], settings=settings) == 2
    assert capsys.readouterr().err == (
        "gputrain: error: top: run nope does not exist on local (no node has it)\n"
    )


@pytest.mark.parametrize(
    ("raw", "ok"), [("10s", False), ("soon", False), ("45s", True), ("", True)]
)
def test_the_stack_key_is_checked_with_the_stack(raw: str, ok: bool) -> None:
    from infra.spec import parse_spec
    from infra.stackfile import SpecError, load_stack_config

    root = Path(__file__).resolve().parents[3]
    config = {**load_stack_config(root, "dev"), "gputrain:stallTimeout": raw}
    if ok:
        assert parse_spec(config, "dev").stall_timeout_s == (parse_stall_timeout(raw))
        return
    with pytest.raises(SpecError) as e:
        parse_spec(config, "dev")
    assert str(e.value).startswith(f"gputrain:stallTimeout = {raw!r}: allowed: ")
    assert "\n" not in str(e.value)
