"""Waiting with a deadline: the one "try, wait, try again" loop of gputrain.

SSH connects and reconnects, the GPU driver check, host keys from guest attributes and `pulumi
destroy` all poll through `poll_until`; they differ only in what they try, how long they wait
between attempts and what they print while waiting.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from infra.base.errors import GputrainError

T = TypeVar("T")

#: (attempts made so far, seconds since the first one) -> seconds to wait before the next.
Delay = Callable[[int, float], float]


@dataclass(frozen=True)
class Backoff:
    """Waits that start short (sshd often answers within a second or two) and grow by `factor`
    up to `cap`, so a rebooting VM is noticed soon after it is back."""

    first: float = 0.3
    factor: float = 1.6
    cap: float = 5.0

    def __call__(self, attempts: int, elapsed_s: float = 0.0) -> float:
        return round(min(self.first * self.factor ** max(0, attempts - 1), self.cap), 3)


BACKOFF = Backoff()


def every(seconds: float) -> Delay:
    """A fixed wait between attempts (e.g. to stay under an API's query rate)."""
    return lambda _attempts, _elapsed: seconds


class NotReady(Exception):
    """Raised by a probe that has no result yet; the message says why (shown while waiting)."""


class GaveUp(GputrainError):
    """The deadline or the attempt limit was reached; `reason` is the last failure's text."""

    def __init__(self, reason: str, elapsed_s: float, attempts: int) -> None:
        super().__init__(f"gave up after {attempts} attempt(s) in {elapsed_s:.0f} s: {reason}")
        self.reason = reason
        self.elapsed_s = elapsed_s
        self.attempts = attempts


@dataclass(frozen=True)
class Waiting:
    """What an `on_wait` callback learns before each wait."""

    attempts: int
    elapsed_s: float
    left_s: float
    reason: str


def poll_until(
    probe: Callable[[], T],
    *,
    deadline_s: float = math.inf,
    max_attempts: int | None = None,
    delay: Delay = BACKOFF,
    retry_on: tuple[type[BaseException], ...] = (NotReady,),
    fatal: tuple[type[BaseException], ...] = (),
    reason: Callable[[BaseException], str] = str,
    on_wait: Callable[[Waiting], None] | None = None,
    progress_every_s: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `probe` until it returns. An exception in `retry_on` (but not in `fatal`) means "try
    again": after `delay`, unless the next attempt would start past `deadline_s` or `max_attempts`
    are used up — then GaveUp (its cause is the last exception). `on_wait` hears about the first
    wait and then at most every `progress_every_s`."""
    start = clock()
    attempts = 0
    said_at: float | None = None
    while True:
        try:
            return probe()
        except fatal:
            raise
        except retry_on as e:
            last = e
        attempts += 1
        elapsed = clock() - start
        pause = delay(attempts, elapsed)
        why = reason(last)
        if elapsed + pause > deadline_s or (max_attempts is not None and attempts >= max_attempts):
            raise GaveUp(why, elapsed, attempts) from last
        if on_wait is not None and (said_at is None or elapsed - said_at >= progress_every_s):
            on_wait(Waiting(attempts, elapsed, deadline_s - elapsed, why))
            said_at = elapsed
        sleep(pause)
