"""What the controller reads from a job's log lines: the step being trained, the step a (resumed)
run starts from, and when the first step of an attempt shows up. The trainer prints them
(`start step 20/300` in its banner, `step 30/300 | loss ...` per interval, `checkpoint
.../ckpt-00000030.pt` per save); nanoGPT prints `iter 30: loss ...` (its first one after a
resume is the step it resumed from); an entry point that prints neither leaves them unknown.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

_STEP = re.compile(r"\bstep\s+(\d+)/(\d+) \|")
_START = re.compile(r"\bstart step (\d+)/(\d+)")
_SAVED = re.compile(r"\bcheckpoint \S*ckpt-(\d{8})\.pt\b")
_ITER = re.compile(r"\biter (\d+): loss ")  # nanoGPT's (and scripts like it) per-step line
_HF_LOGS = re.compile(r"\{'loss': ")  # Hugging Face Trainer's logging line, a dict


def is_training_step(line: str) -> bool:
    """Does this log line show a trained step: ours (`step N/M |`), nanoGPT's (`iter N: loss`) or
    the Hugging Face Trainer's (`{'loss': ...}`)? (`--detach`'s first step; a heartbeat too.)"""
    return bool(_STEP.search(line) or _ITER.search(line) or _HF_LOGS.search(line))


class StepWatch:
    """Fed every node's lines (from the follower threads); one attempt at a time."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.reached: int | None = None  # the highest step any line of this attempt showed
        self.start_step: int | None = None  # this attempt's `start step N`
        self.first_step_at: float | None = None  # when this attempt's first step line came
        self._on_first_step: Callable[[], object] | None = None

    def new_attempt(self, on_first_step: Callable[[], object] | None = None) -> None:
        """A relaunch: forget the attempt before; call `on_first_step` once, at its first step."""
        with self._lock:
            self.reached = self.start_step = self.first_step_at = None
            self._on_first_step = on_first_step

    def line(self, node: str, text: str) -> None:
        fire = None
        with self._lock:
            if m := _START.search(text):
                self.start_step = int(m.group(1))
            trained = _STEP.search(text) or _ITER.search(text)
            step = trained or _SAVED.search(text)
            if step:
                n = int(step.group(1))
                self.reached = n if self.reached is None else max(self.reached, n)
                if self.first_step_at is None and trained:
                    self.first_step_at = self.clock()
                    if self.start_step is None and trained.re is _ITER:  # no banner: its first
                        self.start_step = n
                    fire, self._on_first_step = self._on_first_step, None
        if fire is not None:
            fire()
