"""What the controller reads from a job's log lines: the step being trained, the step a (resumed)
run starts from, and when the first step of an attempt shows up. The trainer prints them
(`start step 20/300` in its banner, `step 30/300 | loss ...` per interval, `checkpoint
.../ckpt-00000030.pt` per save); nanoGPT prints `iter 30: loss ...` (its first one after a
resume is the step it resumed from); pytorch/examples' ddp-tutorial-series prints `Resuming
training from snapshot at Epoch 4` and `[GPU0] Epoch 4 | Batchsize: 32 | Steps: 64` (counted in
epochs); an entry point that prints none of them leaves them unknown. When an attempt's first
progress came is also read from any other trainer's lines (is_any_progress).
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


# any trainer's progress: a step, epoch, iteration or batch with its number (not "micro-batch"),
# a loss with its value, or a progress bar's `n/total`; never a line about resuming or saving
_ANY_STEP = re.compile(r"(?<![\w-])(?:step|iter|iteration|it|epoch|batch)\W{0,3}\d", re.I)
_BAR = re.compile(r"\d+%\|.*\|\s*\d+/\d+")
_NOT_TRAINING = re.compile(
    r"(?<![\w-])(?:resum\w*|load\w*|restor\w*|download\w*|sav\w*|checkpoint\w*|snapshot)\b", re.I
)
_TORCH_LOG = re.compile(r"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d")  # torch's own glog-style lines


def is_any_progress(line: str) -> bool:
    """Does this line of a trainer whose lines we do not know show it training? A line of the
    job's own (not gputrain's `gputrain:` lines, nor torch's log lines) naming a step, epoch,
    iteration or batch with its number, a loss with its value, or drawing a progress bar, and
    not speaking of resuming, loading or saving (that comes before the first step). Pure."""
    text = _RANK_PREFIX.sub("", line.rsplit("\r", 1)[-1]).strip()
    if not text or text.startswith("gputrain:") or _TORCH_LOG.match(text):
        return False
    if _NOT_TRAINING.search(text) or _START.search(text):
        return False
    return any(r.search(text) for r in (_ANY_STEP, _LOSS_VALUE, _BAR))


class StepWatch:
    """Fed every node's lines (from the follower threads); one attempt at a time."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.reached: int | None = None  # the highest step any line of this attempt showed
        self.start_step: int | None = None  # this attempt's `start step N`
        # when this attempt's first step line came (any trainer's first progress line: is_any_progress)
        self.first_step_at: float | None = None
        self.unit = "step"  # what the numbers count: "epoch" for a trainer that prints epochs
        self._trained = False  # whether a line of a trainer we know showed a trained step
        self._on_first_step: Callable[[], object] | None = None

    def new_attempt(self, on_first_step: Callable[[], object] | None = None) -> None:
        """A relaunch: forget the attempt before; call `on_first_step` once, at its first step."""
        with self._lock:
            self.reached = self.start_step = self.first_step_at = None
            self.unit, self._trained = "step", False
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
                if trained and not self._trained:
                    self._trained = True
                    if self.start_step is None and trained.re is not _STEP:  # no banner
                        self.start_step = n
            if self.first_step_at is None and (self._trained or is_any_progress(text)):
                self.first_step_at = self.clock()
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
