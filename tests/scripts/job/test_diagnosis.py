"""Failure diagnosis: the root cause of a failed run from torchrun's error files and the workers'
logs, the cause preferred over its consequences."""

from __future__ import annotations

import json

from scripts.job.diagnosis import root_cause_lines
from scripts.job.node_scripts import parse_exitcode


def test_root_cause_prefers_earliest_error_json() -> None:
    late = {
        "message": {
            "message": "ValueError: later",
            "extraInfo": {
                "py_callstack": "Traceback (most recent call last):\n  File x\nValueError: later",
                "timestamp": "200",
            },
        }
    }
    early = {
        "message": {
            "message": "RuntimeError: first",
            "extraInfo": {
                "py_callstack": "Traceback (most recent call last):\n  File y\nRuntimeError: first",
                "timestamp": "100",
            },
        }
    }
    lines = root_cause_lines([json.dumps(late), json.dumps(early)], ["log"])
    assert lines[-1] == "RuntimeError: first"
    assert root_cause_lines([], ["", "a", "b"], max_lines=1) == ["b"]
    assert parse_exitcode("") == (None, None)
    assert parse_exitcode("143 1700000000.5") == (143, 1700000000.5)


def _err(message: str, ts: int) -> str:
    return json.dumps(
        {
            "message": {
                "message": message,
                "extraInfo": {"py_callstack": message, "timestamp": str(ts)},
            }
        }
    )


def test_first_failure_prefers_the_cause_over_its_consequences() -> None:
    from scripts.job.diagnosis import FailureFacts, first_failure

    cause = FailureFacts("w1", 1, (_err("RuntimeError: deliberate", 100),), ended_at=12.0)
    peer = FailureFacts(
        "h0", 1, (_err("RuntimeError: Connection closed by peer [10.0.0.2]", 100),), 11.0
    )
    assert first_failure([peer, cause]) == "w1"  # same second: the peer's error is a consequence
    killed = FailureFacts("w2", None, (), ended_at=20.0)
    assert first_failure([peer, cause, killed]) == "w2"  # killed without a word comes first
    early = FailureFacts("a", 1, (_err("ValueError: x", 90),), 30.0)
    assert first_failure([cause, early]) == "a"  # then by error time
    assert first_failure([FailureFacts("p", 2, (), 5.0), FailureFacts("q", 3, (), 4.0)]) == "q"


def test_root_cause_without_error_file_is_the_workers_traceback() -> None:
    """torchrun's ChildFailedError report says nothing of the cause: show the worker's lines."""
    log = [
        "[rank1]:Traceback (most recent call last):",
        '[rank1]:  File "job.py", line 7, in <module>',
        "[rank1]:PermissionError: [Errno 13] Permission denied: '/data'",
        "Traceback (most recent call last):",
        '  File "torch/distributed/run.py", line 900, in main',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "  exitcode  : 1 (pid: 4651)",
    ]
    lines = root_cause_lines([], log)
    assert lines[-1] == "[rank1]:PermissionError: [Errno 13] Permission denied: '/data'"
    assert not any("ChildFailedError" in ln for ln in lines)


def test_error_json_is_parsed_once_for_cause_and_timing() -> None:
    from scripts.job.diagnosis import error_summary, parse_error_file, split_error_files

    text = _err("RuntimeError: Connection closed by peer [10.0.0.2]", 100)
    err = parse_error_file(text)
    assert err is not None and err.timestamp == 100.0 and err.message.startswith("RuntimeError")
    assert parse_error_file("not json") is None and parse_error_file("[1, 2]") is None
    assert split_error_files(f"{text}\n\036\n{_err('x', 5)}\n\036\n") == [text, _err("x", 5)]
    assert error_summary([text]) == (100.0, True)  # a lost peer: a consequence
    assert error_summary([_err("ValueError: mine", 7), text]) == (7.0, False)
    assert error_summary([]) == (float("inf"), False)


def test_a_stdout_line_inside_the_traceback_is_not_taken_for_the_exception() -> None:
    """The log's tee may put a rank's flushed stdout line between its stderr's traceback lines
    (seen on the test bed): the root cause still ends with the exception, not that line."""
    log = [
        "[rank0]:Traceback (most recent call last):",
        "[rank0]:attempt 2 rank 0 started",
        '[rank0]:  File "/code/flaky.py", line 8, in <module>',
        '[rank0]:    open("data/missing-shard.bin")',
        "[rank1]:attempt 2 rank 1 started",
        "[rank0]:FileNotFoundError: [Errno 2] No such file or directory: 'data/missing-shard.bin'",
        "E1127 13:21:05 torch/distributed/elastic/multiprocessing/api.py failed (exitcode: 1)",
    ]
    lines = root_cause_lines([], log)
    assert lines[0] == "[rank0]:Traceback (most recent call last):"
    assert lines[-1].startswith("[rank0]:FileNotFoundError: [Errno 2]")
    assert not [ln for ln in lines if "started" in ln]


def _exited_log(code: str, signal: str = "") -> list[str]:
    """torchrun 2.x's real log for a worker that printed a line and then exited with `code`
    without a traceback (sys.exit(3), or killed by a signal)."""
    return [
        "gputrain: vm starts run r1; interface toward head 127.0.0.1: lo",
        "[rank0]:about to fail",
        "E1128 14:18:48.850000 10056 torch/distributed/elastic/multiprocessing/api.py:1002] "
        f"failed (exitcode: {code}) local_rank: 0 (pid: 10069) of binary: /usr/bin/python3",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/torch/distributed/run.py", line 1032, in <module>',
        "    main()",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "======================================================",
        "boom.py FAILED",
        "------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-28_14:18:48",
        "  host      : localhost",
        "  rank      : 0 (local_rank: 0)",
        f"  exitcode  : {code} (pid: 10069){signal}",
        "  error_file: <N/A>",
        "======================================================",
    ]


def test_a_worker_that_exits_without_a_traceback_is_reported_with_its_own_code() -> None:
    """torchrun exits 1 for any worker's failure: the node's failure says the worker's code or
    signal from torchrun's report, and the root cause is what the worker printed, never run.sh's
    start banner or torchrun's own log line."""
    from scripts.job.follow import NodeState

    for code, signal, said in (
        ("3", "", "exit code 3"),
        ("-9", "  (SIGKILL)", "killed by SIGKILL"),
    ):
        state = NodeState("local", exit_code=1, done=True)
        state.tail.extend(_exited_log(code, signal))
        failure = state.failure()
        assert failure.code_text == said and failure.exit_code == 1
        assert failure.root_cause == ("[rank0]:about to fail", f"rank 0: {said}")
    # no report (torchrun killed mid-way): the agent's log line still gives the code
    assert root_cause_lines([], _exited_log("2")[:3]) == ["[rank0]:about to fail", "exit code 2"]
    # torchrun itself killed: no worker's code to say
    state = NodeState("local", exit_code=137, done=True)
    state.tail.extend(["[rank0]:step 1"])
    assert state.failure().code_text == "exit code 137"


def test_an_unprefixed_workers_traceback_is_the_root_cause_without_what_it_printed_before() -> None:
    """With --secret torchrun prefixes no line (no per-rank files to tee): the root cause is
    still the worker's traceback, not its output before it nor torchrun's report."""
    worker = [
        "Traceback (most recent call last):",
        '  File "sec.py", line 3, in <module>',
        "ValueError: bad thing",
    ]
    report = _exited_log("1")[2:]
    lines = root_cause_lines([], ["gputrain: vm starts run r1; interface toward head h: lo",
                                  "token ***", *worker, *report])  # fmt: skip
    assert lines == worker
