"""Stall detection: when did any rank last make a training step (our trainer's log line, or a
heartbeat file the job touches), how long may that take, and which rank is the stuck one. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from infra.base.errors import GputrainError
from infra.keys import effective_timeout


class StallClock:
    """Progress signals in, "stalled for how long" out. Armed at the first signal (a job that
    shows none is never called stalled); the automatic timeout follows the slowest gap seen."""

    def __init__(self, explicit_s: float | None) -> None:
        self.explicit_s = explicit_s
        self.last_at: float | None = None
        self.slowest_s: float | None = None

    def progress(self, at: float) -> None:
        if self.last_at is not None:
            gap = at - self.last_at
            self.slowest_s = gap if self.slowest_s is None else max(self.slowest_s, gap)
        self.last_at = at

    @property
    def timeout_s(self) -> float:
        return effective_timeout(self.explicit_s, self.slowest_s)

    def overdue(self, now: float) -> float | None:
        """Seconds without progress once past the timeout; None while fine or not armed."""
        if self.last_at is None:
            return None
        quiet = now - self.last_at
        return quiet if quiet > self.timeout_s else None


@dataclass(frozen=True)
class RankState:
    """One rank on one node at the time of the stall (gputrain_node/telemetry.py's dump)."""

    node: str
    rank: int
    pid: int
    state: str  # /proc state: R, S, D, T (stopped), Z
    stack: str
    how: str  # py-spy / faulthandler / none: why
    heartbeat_age_s: float | None = None  # its own heartbeat file (.rank<R>), if it keeps one


_COLLECTIVE = re.compile(
    r"all_reduce|allreduce|barrier|broadcast|all_gather|reduce_scatter|wait\b|_wait|synchronize"
)
_STATE_WHY = {
    "T": "stopped (SIGSTOP or a debugger)",
    "D": "in uninterruptible sleep (I/O)",
    "Z": "exited",
}


def stuck_rank(ranks: Sequence[RankState]) -> tuple[RankState, str] | None:
    """The rank that holds the others up, and why we think so: a stopped or blocked process; else
    the one whose own heartbeat is clearly oldest; else the one not waiting in a collective while
    the rest are. None when nothing singles one out."""
    for r in ranks:
        if r.state in _STATE_WHY:
            return r, f"its process is {_STATE_WHY[r.state]}"
    aged = [r for r in ranks if r.heartbeat_age_s is not None]
    if len(aged) >= 2:
        ordered = sorted(aged, key=lambda r: r.heartbeat_age_s or 0.0, reverse=True)
        first, second = ordered[0], ordered[1]
        if (first.heartbeat_age_s or 0) - (second.heartbeat_age_s or 0) > 5:
            return first, f"its last step was {first.heartbeat_age_s:.0f} s ago, the others' later"
    with_stack = [r for r in ranks if r.stack]
    waiting = [r for r in with_stack if _COLLECTIVE.search(r.stack)]
    others = [r for r in with_stack if r not in waiting]
    if waiting and len(others) == 1:
        return others[0], "the other ranks wait in a collective, it does not"
    return None


def rank_heartbeats(beats: Mapping[str, float], node_now: float | None) -> dict[int, float]:
    """heartbeat.rank<R> files -> rank: seconds since it was touched (node clock)."""
    out = {}
    for name, mtime in beats.items():
        m = re.fullmatch(r"heartbeat\.rank(\d+)", name)
        if m and node_now is not None:
            out[int(m.group(1))] = max(0.0, node_now - mtime)
    return out


@dataclass(frozen=True)
class Stall:
    """What the watch found when the run stalled."""

    quiet_s: float
    timeout_s: float
    ranks: tuple[RankState, ...]
    stuck: RankState | None
    why: str
    stacks_dir: str

    def describe(self) -> str:
        who = (
            f"node {self.stuck.node} rank {self.stuck.rank} (pid {self.stuck.pid}: {self.why})"
            if self.stuck
            else "no single rank stands out (see the stacks)"
        )
        return (
            f"no rank made a training step for {self.quiet_s:.0f} s (stall timeout "
            f"{self.timeout_s:.0f} s); stuck: {who}; every rank's stack: {self.stacks_dir}"
        )


class StallError(GputrainError):
    """The run stalled and no restart was left."""
