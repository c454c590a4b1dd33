"""The root cause of a failed rank is its exception, not the last lines it printed before it
(issue 27, class 7). The log is torchrun's real output for a script that calls CUDA-only code on a
CPU host (nanoGPT's DDP device code does), with no error.json (the script has no @record)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.job.diagnosis import root_cause_lines, worker_traceback
from scripts.job.follow import NodeState

LOG = (Path(__file__).parent / "torchrun_cpu_cuda_failure.log").read_text().splitlines()
EXCEPTION = "[rank0]:AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'"


def test_the_exception_ends_the_root_cause_without_torchruns_report() -> None:
    lines = root_cause_lines([], LOG)
    assert lines[-1] == EXCEPTION
    assert lines[0] == "[rank0]:Traceback (most recent call last):"
    assert not any("iter" in ln or "ChildFailedError" in ln for ln in lines)


def test_a_long_log_and_a_long_report_still_show_the_exception() -> None:
    """200 lines of training output before, torchrun's report after, and the node keeps them."""
    state = NodeState("n0", exit_code=1, done=True)
    chatter = [f"[rank0]:iter {i}: loss 4.2" for i in range(200)]
    other = [f"[rank1]:iter {i}: loss 4.3" for i in range(3)]
    state.tail.extend([*chatter, *LOG[5:8], *other, *LOG[8:], *["I1124 more agent logging"] * 20])
    failure = state.failure()
    assert failure.root_cause[-1] == EXCEPTION
    assert not any(ln.startswith("[rank1]") for ln in failure.root_cause)


def test_the_last_of_chained_tracebacks_is_the_one_shown() -> None:
    log = [
        "[rank1]:Traceback (most recent call last):",
        '[rank1]:  File "a.py", line 1, in <module>',
        "[rank1]:KeyError: 'x'",
        "[rank1]:",
        "[rank1]:During handling of the above exception, another exception occurred:",
        "[rank1]:",
        "[rank1]:Traceback (most recent call last):",
        '[rank1]:  File "a.py", line 3, in <module>',
        "[rank1]:    raise ValueError('bad')",
        "[rank1]:ValueError: bad",
        "[rank1]:after",
    ]
    assert worker_traceback(log)[-1] == "[rank1]:ValueError: bad"
    assert worker_traceback(["[rank0]:iter 1: loss 3"]) == []


def test_torchs_own_rank_prefix_inside_torchruns_is_understood() -> None:
    """After the process group formed, torch prefixes an uncaught exception's lines itself."""
    log = [
        "[rank1]:Overriding: backend = gloo",
        "[rank1]:[rank1]: Traceback (most recent call last):",
        '[rank1]:[rank1]:   File "train.py", line 89, in <module>',
        "[rank1]:[rank1]:     torch.cuda.set_device(device)",
        "[rank1]:[rank1]:     ^^^^^^^^^^^^^^^^^^^^^^^^",
        "[rank1]:[rank1]: AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'",
        "E1124 19:14:53.558000 29139 torch/distributed/elastic/multiprocessing/api.py:1002] failed",
    ]
    got = root_cause_lines([], log)
    assert got[0].endswith("Traceback (most recent call last):")
    assert got[-1].endswith("AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'")


def test_the_console_shows_torchs_own_rank_prefix_once(capsys: pytest.CaptureFixture[str]) -> None:
    """torchrun 2.13's real output for a rank that raises after init_process_group, under our
    TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: torch's `[rank0]: ` inside ours."""
    from scripts.job.follow import say_line

    for line in (
        "[rank0]:[rank0]: Traceback (most recent call last):",
        '[rank0]:[rank0]:   File "/tmp/boom.py", line 3, in <module>',
        "[rank0]:[rank0]: FileNotFoundError: data/missing-shard.bin",
        "[rank1]:step 10 | loss 2.0",  # ours alone stays as it is
        "[rank1]:[rank0]: not the same rank: both kept",
    ):
        say_line("n0", line)
    assert capsys.readouterr().out.splitlines() == [
        "[n0] [rank0]: Traceback (most recent call last):",
        '[n0] [rank0]:   File "/tmp/boom.py", line 3, in <module>',
        "[n0] [rank0]: FileNotFoundError: data/missing-shard.bin",
        "[n0] [rank1]:step 10 | loss 2.0",
        "[n0] [rank1]:[rank0]: not the same rank: both kept",
    ]


TORCHRUN_REPORT = [
    "E1127 09:00:01.123000 4242 torch/distributed/elastic/multiprocessing/api.py:869] failed "
    "(exitcode: 1) local_rank: 0 (pid: 4243) of binary: /usr/bin/python3",
    "Traceback (most recent call last):",
    '  File "/usr/local/bin/torchrun", line 8, in <module>',
    "    sys.exit(main())",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "============================================================",
    "train.py FAILED",
    "Root Cause (first observed failure):",
    "  exitcode  : 1 (pid: 4243)",
    "============================================================",
]


def test_the_failed_webhooks_root_cause_is_the_exception_not_torchruns_last_line() -> None:
    """An entry point whose output torchrun does not prefix (no [rankN]:): the exception is the
    worker's, torchrun's own report and log lines after it are not."""
    from scripts.job.records import JobResult, TrainingError
    from scripts.lifecycle import root_cause_line

    worker = [
        "loading data",
        "Traceback (most recent call last):",
        '  File "train.py", line 12, in <module>',
        "    model = build(cfg)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ]
    state = NodeState("n0", exit_code=1, done=True)
    state.tail.extend([*worker, *TORCHRUN_REPORT])
    failure = state.failure()
    error = TrainingError(
        "run r1 failed", failure=failure, result=JobResult("r1", False, {"n0": 1}, 1.0, Path("."))
    )
    assert root_cause_line(error) == worker[-1]
    # a prefixed worker, more agent logging after its report: the same rule
    state = NodeState("n1", exit_code=1, done=True)
    state.tail.extend([*LOG, "I1127 09:00:02 agent: shutting down"])
    error = TrainingError(
        "run r1 failed",
        failure=state.failure(),
        result=JobResult("r1", False, {"n1": 1}, 1.0, Path(".")),
    )
    assert root_cause_line(error) == EXCEPTION
