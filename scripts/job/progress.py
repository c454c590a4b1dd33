"""What the controller reads from a job's log lines: the step being trained, the step a (resumed)
run starts from, and when the first step of an attempt shows up. The trainer prints them
(`start step 20/300` in its banner, `step 30/300 | loss ...` per interval, `checkpoint
.../ckpt-00000030.pt` per save); nanoGPT prints `iter 30: loss ...` (its first one after a
resume is the step it resumed from); pytorch/examples' ddp-tutorial-series prints `Resuming
training from snapshot at Epoch 4` and `[GPU0] Epoch 4 | Batchsize: 32 | Steps: 64` (counted in
epochs); an entry point that prints none of them leaves them unknown.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

_STEP = re.compile(r"\bstep\s+(\d+)/(\d+) \|")
_START = re.compile(r"\bstart step (\d+)/(\d+)")
_SAVED = re.compile(r"\bcheckpoint \S*ckpt-(\d{8})\.pt\b")
_ITER = re.compile(r"\biter (\d+): loss ")  # nanoGPT's (and scripts like it) per-step line
_HF_LOGS = re.compile(r"\{'loss': ")  # Hugging Face Trainer's logging line, a dict


def is_training_step(line: str) -> bool:
    """Does this log line show a trained step: ours (`step N/M |`), nanoGPT's (`iter N: loss`),
    the Hugging Face Trainer's (`{'loss': ...}`) or pytorch/examples' epoch line? (`--detach`'s
    first step; a heartbeat too.)"""
    return any(r.search(line) for r in (_STEP, _ITER, _HF_LOGS, _EPOCH))


_RESUMING = re.compile(r"\bResuming training from snapshot at Epoch (\d+)")  # pytorch/examples'
_EPOCH = re.compile(r"\bEpoch (\d+) \| Batchsize")  # its per-epoch line (multinode.py and kin)


class StepWatch:
    """Fed every node's lines (from the follower threads); one attempt at a time."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.reached: int | None = None  # the highest step any line of this attempt showed
        self.start_step: int | None = None  # this attempt's `start step N`
        self.first_step_at: float | None = None  # when this attempt's first step line came
        self.unit = "step"  # what the numbers count: "epoch" for a trainer that prints epochs
        self._on_first_step: Callable[[], object] | None = None

    def new_attempt(self, on_first_step: Callable[[], object] | None = None) -> None:
        """A relaunch: forget the attempt before; call `on_first_step` once, at its first step."""
        with self._lock:
            self.reached = self.start_step = self.first_step_at = None
            self.unit = "step"
            self._on_first_step = on_first_step

    def line(self, node: str, text: str) -> None:
        fire = None
        with self._lock:
            if m := _START.search(text) or _RESUMING.search(text):
                self.start_step = int(m.group(1))
                if m.re is _RESUMING:
                    self.unit = "epoch"
            trained = _STEP.search(text) or _ITER.search(text) or _EPOCH.search(text)
            if trained is not None and trained.re is _EPOCH:
                self.unit = "epoch"
            step = trained or _SAVED.search(text)
            if step:
                n = int(step.group(1))
                self.reached = n if self.reached is None else max(self.reached, n)
                if self.first_step_at is None and trained:
                    self.first_step_at = self.clock()
                    if self.start_step is None and trained.re is not _STEP:  # no banner
                        self.start_step = n
                    fire, self._on_first_step = self._on_first_step, None
        if fire is not None:
            fire()


# a loss with its value: `loss 1.23` (nanoGPT), `Loss: 0.5` (mnist), `train_loss=0.12` (Lightning)
_LOSS_VALUE = re.compile(r"loss\w*\s*[:=]?\s*[-+]?\.?\d", re.IGNORECASE)
_PROGRESS = re.compile(r"\b(?:step|steps|iter|epoch|batch)\b", re.IGNORECASE)
_RANK_PREFIX = re.compile(r"^(?:\[(?:rank\d+|default\d+)\]: ?)+")
_TAIL_BYTES = 256 * 1024


def last_progress(lines: Iterable[str], width: int = 140) -> list[tuple[str, str]]:
    """What a trainer's log says of how far it got, for a summary when it wrote none of ours:
    its last line with a loss and its last step/epoch/iter line, if another. Pure."""
    loss = step = None
    for raw in lines:
        line = _RANK_PREFIX.sub("", raw.rsplit("\r", 1)[-1]).strip()  # a progress bar's last draw
        if not line or line.startswith("gputrain:"):
            continue
        if _LOSS_VALUE.search(line):
            loss = line
        if _PROGRESS.search(line):
            step = line
    clip = lambda s: s if len(s) <= width else s[: width - 3] + "..."  # noqa: E731
    rows = [("last loss line", clip(loss))] if loss else []
    return rows + ([("last step line", clip(step))] if step and step != loss else [])


def log_progress(results_dir: Path, nodes: Iterable[str]) -> list[tuple[str, str]]:
    """last_progress of the first of `nodes` (the head first) whose downloaded torchrun.log
    says anything: the tail of it only."""
    for node in nodes:
        try:
            with (results_dir / node / "torchrun.log").open("rb") as f:
                f.seek(max(0, f.seek(0, 2) - _TAIL_BYTES))
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        if rows := last_progress(text.splitlines()):
            return rows
    return []
