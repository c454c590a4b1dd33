"""Waiting for capacity, and falling back down a capacity list.

When every zone or candidate of an `up` (or a spot recovery) is stocked out, `--wait-for-capacity
DURATION` keeps trying with backoff instead of giving up: every failed attempt was destroyed
first, so nothing of it bills while it waits; one line per wait says what was tried and when the
next try is. `capacity: [spot, on-demand]` steps to the next mode after one mode's stock-outs,
with one line saying why and what it costs. Ctrl-C during a wait is the guard's Interrupted, as
anywhere else: the caller's teardown runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from infra.keys import format_duration
from scripts.targets.gce.failover import Attempt, ProvisioningError

T = TypeVar("T")

#: The first pause after a round of stock-outs, and the longest (GCE capacity moves in minutes).
FIRST_PAUSE_S = 30.0
MAX_PAUSE_S = 600.0


def stocked_out(error: ProvisioningError) -> bool:
    """Every zone or candidate tried ran out of capacity: worth trying again later (a quota
    or any other error is not)."""
    return error.failure is not None and error.failure.kind == "stockout"


def tried_text(attempts: Sequence[Attempt]) -> str:
    """What a round tried, once each, in order: `a3-highgpu-8g x 2 in us-central1-a, ...`."""
    from scripts.targets.gce.offer_failover import CandidateAttempt

    seen: list[str] = []
    for a in attempts:
        if a.outcome.startswith("skipped") or a.outcome == "destroy failed":
            continue
        what = (
            f"{a.candidate.machine_type} x {a.candidate.nodes} in {a.zone}"
            if isinstance(a, CandidateAttempt)
            else a.zone
        )
        if what not in seen:
            seen.append(what)
    return ", ".join(seen) or "nothing"


@dataclass
class CapacityWait:
    """How long to keep trying (0: not at all), and the backoff between rounds."""

    limit_s: float
    first_pause_s: float = FIRST_PAUSE_S
    max_pause_s: float = MAX_PAUSE_S
    billing_note: str = "nothing is billing"
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep

    def run(self, attempt: Callable[[], T], say: Callable[[str], None]) -> T:
        """`attempt()` until it succeeds; after a round of stock-outs wait and try again until
        `limit_s` is spent. Any other failure, or the last stock-out, is raised as it came
        (its message says how long it waited)."""
        start, pause, round_ = self.clock(), self.first_pause_s, 1
        while True:
            try:
                return attempt()
            except ProvisioningError as e:
                if self.limit_s <= 0 or not stocked_out(e):
                    raise
                left = start + self.limit_s - self.clock()
                if left <= 0:
                    raise ProvisioningError(
                        f"{e}\nwaited {format_duration(int(self.limit_s))} for capacity "
                        f"(--wait-for-capacity) over {round_} round(s); still none",
                        e.attempts,
                        e.failure,
                    ) from e
                delay = min(pause, left)
                next_at = time.strftime("%H:%M:%S", time.localtime(self.clock() + delay))
                say(
                    f"no capacity (round {round_}: {tried_text(e.attempts)} stocked out); "
                    f"next try at {next_at} (in {delay:.0f} s), waiting up to "
                    f"{format_duration(max(1, int(left)))} more; {self.billing_note}; "
                    "Ctrl-C stops"
                )
                self.sleep(delay)
                pause, round_ = min(pause * 2, self.max_pause_s), round_ + 1


def step_line(mode: str, next_mode: str, costs: Callable[[str], float | None]) -> str:
    """The one line of a step down the capacity list: why, and what the next mode costs."""
    from infra.offer_tables import money

    before, after = costs(mode), costs(next_mode)
    change = ""
    if before and after:
        change = f" ({(after / before - 1) * 100:+.0f} % per hour)"
    return (
        f"no {mode} capacity anywhere tried: trying {next_mode} next, "
        f"{money(after)}/h instead of {money(before)}/h{change}"
    )


def down_the_ladder(
    ladder: Sequence[str],
    attempt: Callable[[str], T],
    say: Callable[[str], None],
    costs: Callable[[str], float | None],
) -> T:
    """`attempt(mode)` for each mode of the capacity list in order, stepping on only after a
    mode's stock-outs; the last mode's failure (its attempts include every mode's) is raised."""
    attempts: list[Attempt] = []
    for i, mode in enumerate(ladder):
        try:
            return attempt(mode)
        except ProvisioningError as e:
            attempts += e.attempts
            if not stocked_out(e) or i + 1 == len(ladder):
                raise ProvisioningError(str(e), attempts, e.failure) from e
            say(step_line(mode, ladder[i + 1], costs))
    raise AssertionError("an empty capacity list")  # parse_spec never makes one
