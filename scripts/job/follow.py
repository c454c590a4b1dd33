"""Follow a started job on every node: stream each node's log (resuming after a dropped connection)
until its torchrun ends, read its exit code, and on the first failure name that node and stop the
rest."""

from __future__ import annotations

import collections
import contextlib
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from scripts import ui
from scripts.job.diagnosis import (
    FailureFacts,
    first_failure,
    root_cause_lines,
    split_error_files,
    worker_exit,
)
from scripts.job.node_scripts import (
    DISK_FULL,
    EXIT_CODE_PENDING,
    build_error_files_command,
    build_follow_command,
    parse_exitcode,
    split_follow_line,
)
from scripts.job.records import FailureKind, Job, NodeFailure
from scripts.transport.base import ConnectionLostError, Transport

PENDING_LIMIT_S = 300.0  # torchrun ended, run.sh not: the mirror's last pass (uploads retried)

LineSink = Callable[[str, str], None]  # (node, line)
StopNodes = Callable[[list[str]], None]  # stop the job on these nodes (in the background)


# our torchrun prefix ([rankN]:, node_scripts) and torch's own "[rankN]: " on an exception's lines
_DOUBLED_RANK = re.compile(r"^(\[rank\d+\]:) ?\1 ?")


def console_line(line: str) -> str:
    """A worker's line as the console shows it: torch's own `[rankN]:` inside ours once. Pure."""
    return _DOUBLED_RANK.sub(lambda m: m.group(1) + " ", line, count=1)


def say_line(node: str, line: str) -> None:
    # torch's [rankN]: once; a redrawn progress bar: its last state; no control sequences
    ui.say(f"[{node}] {ui.terminal_safe(console_line(line))}")


@dataclass
class NodeState:
    name: str
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=400))
    lines: int = 0
    reconnecting: bool = False
    done: bool = False
    exit_code: int | None = None
    ended_at: float | None = None  # wall clock, node side when known
    lost: BaseException | None = None  # why the node could not be followed
    error_files: list[str] = field(default_factory=list)  # torchrun error.json texts
    disk_full: bool = False  # run.sh could write its exit code only into its reserved block

    @property
    def failed(self) -> bool:
        return self.done and (self.exit_code != 0 or self.lost is not None)

    def failure(self) -> NodeFailure:
        if self.lost is not None:
            # What the node printed before contact was lost is its normal output, not a cause.
            why = f"lost contact with node {self.name}: {self.lost}"
            return NodeFailure(self.name, "lost", self.exit_code, (why,), self.lost)
        kind: FailureKind = "killed" if self.exit_code is None else "exited"
        tail = list(self.tail)
        root = root_cause_lines(self.error_files, tail) or ["(no output)"]
        if self.disk_full:
            root.append(DISK_FULL_LINE.format(node=self.name))
        ended = worker_exit(tail)
        worker_code = ended[1] if ended is not None else None
        return NodeFailure(self.name, kind, self.exit_code, tuple(root), None, worker_code)


DISK_FULL_LINE = (
    "OSError: [Errno 28] No space left on device (ENOSPC): node {node}'s disk is full; the job's "
    "last output is missing from its log (free space on the node, or write less into the run)"
)


@dataclass(frozen=True)
class FollowOutcome:
    states: Mapping[str, NodeState]
    failure: NodeFailure | None  # the node that failed first


def follow_job(
    transports: Mapping[str, Transport],
    job: Job,
    stop: StopNodes,
    *,
    on_line: LineSink,
    reconnect_deadline_s: float,
    settle_s: float,
    stop_timeout_s: float = 30.0,
) -> FollowOutcome:
    """Follow every node until all have ended. On the first failure (after `settle_s`, so
    near-simultaneous failures and reconnects resolve first) the others are stopped; nodes that
    have not ended `stop_timeout_s` after a stop count as lost."""
    start = time.monotonic()
    states = {n: NodeState(n) for n in transports}
    events: queue.Queue[str] = queue.Queue()
    for n, t in transports.items():
        threading.Thread(
            target=follow_node,
            args=(t, job.run_id, states[n], on_line, events, reconnect_deadline_s),
            daemon=True,
            name=f"follow-{n}",
        ).start()

    failed: str | None = None
    stop_started: float | None = None

    def stop_running() -> None:
        # a lost node may still be running the job: try it too (the stop says if it failed)
        stop([n for n, s in states.items() if not s.done or s.lost is not None])

    while not all(s.done for s in states.values()):
        with contextlib.suppress(queue.Empty):
            events.get(timeout=0.5)
        now = time.monotonic()
        if (
            failed is None
            and stop_started is None
            and job.max_duration_s is not None
            and now - start > job.max_duration_s
        ):
            ui.say(f"run {job.run_id}: max duration {job.max_duration_s:.0f} s reached; stopping")
            stop_started = now
            stop_running()
        if failed is None and any(s.failed for s in states.values()):
            settle_end = time.monotonic() + settle_s
            while time.monotonic() < settle_end or any(s.reconnecting for s in states.values()):
                time.sleep(0.1)
                if time.monotonic() > settle_end + reconnect_deadline_s:
                    break
            for st in states.values():
                if st.failed:
                    st.error_files = _error_files(transports[st.name], job.run_id)
            failed = _first_failure(states)
            others = "; stopping the other node(s)" if len(states) > 1 else ""
            ui.say(f"node {failed} failed ({states[failed].failure().code_text}){others}")
            stop_started = time.monotonic()
            stop_running()
        if stop_started is not None and time.monotonic() - stop_started > stop_timeout_s:
            for s in states.values():
                if not s.done:
                    s.lost = s.lost or TimeoutError(f"did not stop within {stop_timeout_s:.0f} s")
                    s.done = True
            break
    return FollowOutcome(states, states[failed].failure() if failed is not None else None)


def follow_node(
    transport: Transport,
    run_id: str,
    state: NodeState,
    on_line: LineSink,
    events: queue.Queue[str],
    reconnect_deadline_s: float,
) -> None:
    """Stream one node's log to the end and then its exit code (one channel), reattaching after
    dropped connections. Always ends with state.done and an event."""
    recorded: list[str] = []  # what the node's exitcode file held, once the log has ended

    def line(text: str) -> None:
        log, code = split_follow_line(text)
        if log is not None:
            state.lines += 1
            state.tail.append(log)
            on_line(state.name, log)
        if code is not None:
            recorded.append(code)

    pending_since: float | None = None
    try:
        while True:
            try:
                transport.stream(build_follow_command(run_id, state.lines), line, timeout=None)
                if not recorded or recorded[-1].strip() != EXIT_CODE_PENDING:
                    break
                if pending_since is None:  # torchrun ended; run.sh still finishing (mirror)
                    pending_since = time.monotonic()
                    ui.say(f"{state.name}: the job ended; waiting for its last outputs to be saved")
                elif time.monotonic() - pending_since > PENDING_LIMIT_S:
                    raise TimeoutError(
                        f"its job ended but run.sh recorded no exit code within "
                        f"{PENDING_LIMIT_S:.0f} s (the outputs' last upload hangs?)"
                    )
            except ConnectionLostError as e:
                state.reconnecting = True
                ui.say(
                    f"{state.name}: {e}; reconnecting to resume the log at line {state.lines + 1}"
                )
                transport.reconnect(reconnect_deadline_s)
                state.reconnecting = False
                ui.say(f"{state.name}: reconnected")
        state.exit_code, node_time = parse_exitcode(recorded[-1] if recorded else "")
        state.ended_at = node_time if node_time is not None else time.time()
        state.disk_full = bool(recorded) and DISK_FULL in recorded[-1].split()
        if state.disk_full:
            ui.warn(DISK_FULL_LINE.format(node=state.name))
    except Exception as e:
        state.lost = e
        state.ended_at = time.time()
    finally:
        state.reconnecting = False
        state.done = True
        events.put(state.name)


def _first_failure(states: Mapping[str, NodeState]) -> str:
    return first_failure(
        [
            FailureFacts(
                s.name,
                None if s.lost is None and s.exit_code is None else (s.exit_code or -1),
                tuple(s.error_files),
                s.ended_at if s.ended_at is not None else float("inf"),
            )
            for s in states.values()
            if s.failed
        ]
    )


def _error_files(transport: Transport, run_id: str) -> list[str]:
    try:
        return split_error_files(transport.run(build_error_files_command(run_id), 30).stdout)
    except Exception as e:
        ui.warn(f"{transport.name}: could not read torchrun error files: {e}")
        return []
