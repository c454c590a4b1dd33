"""Why a job failed: torchrun's error.json files (parsed here, once), the worker's traceback when
there is none, and which node's failure came first (the others' errors are often consequences).
Pure."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from scripts.job.node_scripts import ERROR_FILE_SEPARATOR
from scripts.job.records import exit_text


@dataclass(frozen=True)
class TorchError:
    """One torchrun error.json: the exception message, its traceback, when it happened."""

    message: str
    traceback: str = ""
    timestamp: float | None = None


def parse_error_file(text: str) -> TorchError | None:
    """An error.json's content; None when it is not one."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    msg = data.get("message", data)
    if not isinstance(msg, dict):
        return TorchError(str(msg))
    extra = msg.get("extraInfo") or {}
    timestamp = None
    with contextlib.suppress(TypeError, ValueError):
        timestamp = float(str(extra.get("timestamp")))
    return TorchError(str(msg.get("message", "")), str(extra.get("py_callstack", "")), timestamp)


def split_error_files(output: str) -> list[str]:
    """The error.json texts in the output of node_scripts.build_error_files_command."""
    return [chunk.strip() for chunk in output.split(ERROR_FILE_SEPARATOR) if chunk.strip()]


def root_cause_lines(
    error_files: Sequence[str], log_tail: Sequence[str], max_lines: int = 12
) -> list[str]:
    """The first failure's message and traceback tail from torchrun error.json files, else the
    last lines of the node's log."""
    errors = [e for e in map(parse_error_file, error_files) if e is not None]
    if errors:
        first = min(errors, key=lambda e: (e.timestamp is None, e.timestamp or 0.0))
        tb = [ln for ln in first.traceback.splitlines() if ln.strip()][-(max_lines - 1) :]
        lines = tb if first.message in first.traceback else [first.message, *tb]
        return lines[-max_lines:]
    lines = [ln for ln in log_tail if ln.strip()]
    worker = worker_traceback(lines)
    if worker:
        return worker[-max_lines:]
    # Without error.json, torchrun's own ChildFailedError report ends the log and says nothing
    # of the cause: keep what the workers printed before it, and the exit it reports.
    ended = worker_exit(lines)
    agent = next((i for i, ln in enumerate(lines) if "ChildFailedError" in ln), None)
    if agent is not None:
        # torchrun's own traceback starts unprefixed; workers' lines carry a [rankN]: prefix
        starts = [i for i in range(agent) if lines[i].startswith("Traceback (most recent call")]
        lines = lines[: starts[-1]] if starts and starts[-1] else lines
    lines = [ln for ln in lines if not (_AGENT_LOG.match(ln) or _START_BANNER.match(ln))]
    # an unprefixed worker's traceback (with --secret torchrun prefixes no line): from its start
    starts = [i for i, ln in enumerate(lines) if ln.strip() == _TRACEBACK]
    if starts:
        return lines[starts[-1] :][-max_lines:]
    if ended is None:
        return lines[-max_lines:]
    rank, code = ended
    last = f"rank {rank}: {exit_text(code)}" if rank is not None else exit_text(code)
    return [*lines[-(max_lines - 1) :], last]


# torchrun's own log lines (glog: `E1128 14:17:39.351000 8746 torch/distributed/...] failed`)
# and run.sh's start banner: never a worker's output
_AGENT_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ torch/")
_START_BANNER = re.compile(r"^gputrain: \S+ starts run \S+; interface toward head ")
# torchrun's report of the first observed failure (`rank      : 0 (local_rank: 0)`, `exitcode  :
# -9 (pid: 42)  (SIGKILL)`), and its log line on a failed worker (`failed (exitcode: 3)`)
_REPORT_ROOT = "Root Cause (first observed failure):"
_REPORT_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(-?\d+)\b")
_AGENT_EXITCODE = re.compile(r"\] failed \(exitcode: (-?\d+)\)")


def worker_exit(lines: Sequence[str]) -> tuple[int | None, int] | None:
    """(rank or None, exit code) of the failed worker as torchrun's last report (else its last
    log line on a failure) gives them, a negative code being the signal that killed it; None
    when torchrun said neither."""
    roots = [i for i, ln in enumerate(lines) if ln.strip() == _REPORT_ROOT]
    found: dict[str, int] = {}
    for ln in lines[roots[-1] + 1 :] if roots else ():
        if (m := _REPORT_FIELD.match(ln)) and m.group(1) not in found:
            found[m.group(1)] = int(m.group(2))
        if ln.startswith("====="):
            break
    if "exitcode" in found:
        return found.get("rank"), found["exitcode"]
    codes = [int(m.group(1)) for ln in lines if (m := _AGENT_EXITCODE.search(ln))]
    return (None, codes[-1]) if codes else None


_TRACEBACK = "Traceback (most recent call last):"
# torchrun's [rankN]: prefix, and torch's own "[rankN]: " that an exception after the process
# group formed adds inside it
_TRACEBACK_START = re.compile(r"^((?:\[rank\d+\]: ?)+)Traceback \(most recent call last\):\s*$")


def worker_traceback(lines: Sequence[str]) -> list[str]:
    """The last traceback a worker printed (its [rankN]: lines only, others may interleave),
    ending with the exception line; [] when no worker printed one."""
    starts = [(i, m.group(1)) for i, ln in enumerate(lines) if (m := _TRACEBACK_START.match(ln))]
    if not starts:
        return []
    first, prefix = starts[-1]
    block: list[str] = []
    for ln in lines[first:]:
        if not ln.startswith(prefix):
            continue
        body = ln[len(prefix) :]
        if block and not body.startswith(" ") and body.strip() != _TRACEBACK:
            if not _EXCEPTION_BODY.match(body.strip()):
                continue  # the rank's stdout, interleaved with its stderr by the log's tee
            block.append(ln)
            break  # the exception line: `AttributeError: ...`
        block.append(ln)
    return block


# how Python prints an exception after its traceback: `Name` or `pkg.Name: message`
_EXCEPTION_BODY = re.compile(r"^[A-Za-z_][\w.]*(?::.*)?$")


# an exception's own line, `ValueError: bad` or `torch.OutOfMemoryError: ...`, behind any
# [rankN]: prefixes; torchrun's report of a child's failure is not the child's exception
_EXCEPTION_LINE = re.compile(
    r"^(?:\[rank\d+\]: ?)*\s*(?:[A-Za-z_]\w*\.)*"
    r"[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault|Warning)(?::.*)?$"
)


def exception_line(lines: Sequence[str]) -> str | None:
    """The failing rank's exception line among a root cause's lines (the last one that is an
    exception's, not torchrun's ChildFailedError or its log lines after it); None if none is."""
    for ln in reversed(lines):
        if _EXCEPTION_LINE.match(ln) and "ChildFailedError" not in ln:
            return ln.strip()
    return None


CONSEQUENCE_HINTS = (
    "connection closed by peer",
    "connection reset",
    "broken pipe",
    "distnetworkerror",
    "diststoreerror",
    "timed out",
    "timeout",
    "signalexception",
    "sigterm",
    "gloo",
    "nccl communicator was aborted",
)


def error_summary(error_files: Sequence[str]) -> tuple[float, bool]:
    """(earliest error.json timestamp or inf, whether every error looks like a consequence of
    another node's failure — a peer that went away, a timeout, a stop signal)."""
    errors = [e for e in map(parse_error_file, error_files) if e is not None]
    times = [e.timestamp for e in errors if e.timestamp is not None]
    consequences = sum(any(h in e.message.lower() for h in CONSEQUENCE_HINTS) for e in errors)
    return min(times, default=float("inf")), bool(errors) and consequences == len(errors)


@dataclass(frozen=True)
class FailureFacts:
    node: str
    exit_code: int | None  # None: killed before it could record one
    error_files: tuple[str, ...]
    ended_at: float


def first_failure(facts: Sequence[FailureFacts]) -> str:
    """Which node failed first. A node killed without an exit code comes first; then one whose
    error is its own (not a lost peer / timeout / stop); then by error.json time (1 s
    resolution), then by when it ended."""

    def key(f: FailureFacts) -> tuple[bool, bool, float, float]:
        ts, consequence = error_summary(f.error_files)
        return (f.exit_code is not None, consequence, ts, f.ended_at)

    return min(facts, key=key).node
