"""What the watch makes of a running job: its settings (WatchSettings: how often it looks; the
GPUTRAIN_WATCH_* variables shorten them), what the nodes' GPU samples say (gputrain_node/telemetry.py
writes them: the latest per GPU, the GPU faults that appeared during the run, a node that stays
idle, the one-line summary), the stall clock (when did any rank last make a training step, how
long may that take, which rank is the stuck one), and what a job's log lines show: the step being
trained, the step a (resumed) run starts from, and when an attempt's first step shows up
(StepWatch, fed by the follower threads; `log_progress` reads a downloaded torchrun.log). Pure but
for those two.

The trainer prints `start step 20/300` in its banner, `step 30/300 | loss ...` per interval and
`checkpoint .../ckpt-00000030.pt` per save; nanoGPT prints `iter 30: loss ...` (its first one after
a resume is the step it resumed from); pytorch/examples' ddp-tutorial-series prints `Resuming
training from snapshot at Epoch 4` and `[GPU0] Epoch 4 | Batchsize: 32 | Steps: 64` (counted in
epochs); an entry point that prints none of them leaves them unknown. When an attempt's first
progress came is also read from any other trainer's lines (is_any_progress)."""

from __future__ import annotations

import collections
import csv
import io
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infra.base.errors import GputrainError, UserError
from infra.keys import effective_timeout
from scripts.watch.xid import XidClass, meaning, worst, xid_class


@dataclass(frozen=True)
class Sample:
    """One GPU at one time (node clock); None: unknown."""

    time: float
    gpu: int
    util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    power_w: float | None
    temp_c: float | None
    sm_clock_mhz: float | None
    ecc_uncorrected: int | None
    xid_count: int
    last_xid: int | None
    xids: tuple[int, ...] = ()  # the latest codes, oldest first (empty from an older node side)


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def parse_samples(text: str) -> list[Sample]:
    """telemetry.csv lines (the header and broken lines skipped)."""
    out = []
    for row in csv.reader(io.StringIO(text)):
        if len(row) not in (11, 12) or row[0] == "time":
            continue
        t, gpu = _num(row[0]), _num(row[1])
        if t is None or gpu is None:
            continue
        ecc, xids, last = _num(row[8]), _num(row[9]), _num(row[10])
        out.append(
            Sample(
                t,
                int(gpu),
                _num(row[2]),
                _num(row[3]),
                _num(row[4]),
                _num(row[5]),
                _num(row[6]),
                _num(row[7]),
                None if ecc is None else int(ecc),
                int(xids or 0),
                None if last is None else int(last),
                tuple(int(c) for c in row[11].split() if c.isdigit()) if len(row) == 12 else (),
            )
        )
    return out


@dataclass(frozen=True)
class GpuFault:
    """A new Xid or uncorrectable ECC error during the run; only the hardware class replaces
    the node (scripts/watch/xid.py)."""

    node: str
    gpu: int
    what: str  # "Xid 79" / "3 uncorrectable ECC error(s)"
    at: float
    kind: XidClass = XidClass.HARDWARE
    meaning: str = ""  # NVIDIA's description of the Xid, when the table names it

    def __str__(self) -> str:
        return f"node {self.node} GPU {self.gpu}: {self.what}"

    def explain(self) -> str:
        """'node n GPU 0: Xid 13 (graphics engine exception, ...)'."""
        return f"{self}{f' ({self.meaning})' if self.meaning else ''}"


def _new_xids(s: Sample, before: int) -> list[int]:
    """The codes logged since the count was `before` (the last one where the node does not list
    them)."""
    new = s.xid_count - before
    if s.xids and new <= len(s.xids):
        return list(s.xids[-new:])
    return [s.last_xid] if s.last_xid is not None else []


@dataclass
class NodeTelemetry:
    """One node's samples (a window of them) and its fault baseline."""

    node: str
    keep_s: float = 900.0
    samples: collections.deque[Sample] = field(default_factory=collections.deque)
    latest: dict[int, Sample] = field(default_factory=dict)
    _baseline: dict[int, tuple[int, int]] = field(default_factory=dict)  # gpu -> (xids, ecc)

    def add(self, samples: Iterable[Sample]) -> list[GpuFault]:
        """Take new samples; the faults they show for the first time."""
        faults = []
        for s in samples:
            self.samples.append(s)
            self.latest[s.gpu] = s
            xids, ecc = s.xid_count, s.ecc_uncorrected or 0
            base = self._baseline.setdefault(s.gpu, (xids, ecc))
            if xids > base[0] and (code := worst(_new_xids(s, base[0]))) is not None:
                faults.append(
                    GpuFault(
                        self.node, s.gpu, f"Xid {code}", s.time, xid_class(code), meaning(code)
                    )
                )
            if ecc > base[1]:
                faults.append(
                    GpuFault(
                        self.node, s.gpu, f"{ecc - base[1]} uncorrectable ECC error(s)", s.time
                    )
                )
            self._baseline[s.gpu] = (max(xids, base[0]), max(ecc, base[1]))
        while self.samples and self.samples[-1].time - self.samples[0].time > self.keep_s:
            self.samples.popleft()
        return faults

    def mean_util(self) -> float | None:
        """The node's GPUs' mean utilization in the latest sample."""
        values = [s.util_pct for s in self.latest.values() if s.util_pct is not None]
        return sum(values) / len(values) if values else None


class IdleWatch:
    """Warns once per episode when a node's mean GPU utilization stays below `below_pct` for
    `window_s` (node clock): likely input-bound."""

    def __init__(self, window_s: float, below_pct: float) -> None:
        self.window_s, self.below_pct = window_s, below_pct
        self._since: dict[str, float | None] = {}
        self._warned: set[str] = set()

    def update(self, node: str, samples: Sequence[Sample]) -> str | None:
        by_time: dict[float, list[float]] = collections.defaultdict(list)
        for s in samples:
            if s.util_pct is not None:
                by_time[s.time].append(s.util_pct)
        message = None
        for t in sorted(by_time):
            mean = sum(by_time[t]) / len(by_time[t])
            if mean >= self.below_pct:
                self._since[node] = None
                self._warned.discard(node)
                continue
            since = self._since.get(node)
            if since is None:
                self._since[node] = since = t
            if t - since >= self.window_s and node not in self._warned:
                self._warned.add(node)
                message = (
                    f"node {node}: mean GPU utilization below {self.below_pct:.0f} % for "
                    f"{(t - since) / 60:.1f} min (now {mean:.0f} %): the job is likely "
                    "input-bound (data loading, CPU work) or waiting on other nodes"
                )
        return message


_STEP_LINE = re.compile(
    r"\bstep\s+(\d+)/(\d+) \| loss ([\d.]+|nan|inf)(?:.*?\| ([\d.]+)k tok/s)?(?:.*?\| mfu ([\d.]+)%)?"
)


@dataclass
class LogProgress:
    """Step, loss, tokens/s and MFU from our trainer's interval lines (`step N/M | loss ...`)."""

    step: int | None = None
    steps: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    mfu_pct: float | None = None

    def line(self, text: str) -> bool:
        """Take a log line; True when it shows a step beyond the last one."""
        m = _STEP_LINE.search(text)
        if not m:
            return False
        step = int(m.group(1))
        advanced = self.step is None or step > self.step
        self.step, self.steps, self.loss = step, int(m.group(2)), float(m.group(3))
        if m.group(4):
            self.tokens_per_s = float(m.group(4)) * 1e3
        if m.group(5):
            self.mfu_pct = float(m.group(5))
        return advanced

    def text(self) -> str:
        if self.step is None:
            return "no step yet"
        parts = [f"step {self.step}/{self.steps}", f"loss {self.loss:.4f}"]
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s / 1e3:.1f}k tok/s")
        if self.mfu_pct is not None:
            parts.append(f"mfu {self.mfu_pct:.1f}%")
        return " ".join(parts)


def gpu_rows(nodes: Mapping[str, NodeTelemetry]) -> list[list[object]]:
    """`top`'s table: one row per node and GPU."""
    rows: list[list[object]] = []
    for name, t in nodes.items():
        if not t.latest:
            rows.append([name, "-", "no samples yet", "", "", "", "", ""])
        for gpu in sorted(t.latest):
            s = t.latest[gpu]
            rows.append(
                [
                    name,
                    gpu,
                    _fmt(s.util_pct, "{:.0f} %"),
                    _mem(s),
                    _fmt(s.power_w, "{:.0f} W"),
                    _fmt(s.temp_c, "{:.0f} °C"),
                    _fmt(s.sm_clock_mhz, "{:.0f} MHz"),
                    _faults(s),
                ]
            )
    return rows


GPU_HEADERS = ["node", "GPU", "util", "memory", "power", "temp", "SM clock", "Xid / ECC"]


def _fmt(value: float | None, fmt: str) -> str:
    return "?" if value is None else fmt.format(value)


def _mem(s: Sample) -> str:
    if s.mem_used_mib is None:
        return "?"
    total = f"/{s.mem_total_mib / 1024:.0f}" if s.mem_total_mib else ""
    return f"{s.mem_used_mib / 1024:.1f}{total} GiB"


def _faults(s: Sample) -> str:
    parts = []
    if s.xid_count:
        parts.append(f"{s.xid_count} Xid (last {s.last_xid})")
    if s.ecc_uncorrected:
        parts.append(f"ECC {s.ecc_uncorrected}")
    return ", ".join(parts) or "none"


def summary_line(nodes: Mapping[str, NodeTelemetry], progress: LogProgress) -> str:
    """The line the run's output gets every few minutes."""
    parts = []
    for name, t in nodes.items():
        util = t.mean_util()
        mem = [s.mem_used_mib for s in t.latest.values() if s.mem_used_mib is not None]
        if util is None:
            parts.append(f"{name} no GPU samples")
        else:
            parts.append(
                f"{name} {len(t.latest)} GPU util {util:.0f}%"
                + (f" mem {sum(mem) / 1024:.1f} GiB" if mem else "")
            )
    return "watch: " + " | ".join([*parts, progress.text()])


ENV_KNOBS = {
    "GPUTRAIN_WATCH_SAMPLE_S": "sample_interval_s",
    "GPUTRAIN_WATCH_POLL_S": "poll_s",
    "GPUTRAIN_WATCH_SUMMARY_S": "summary_every_s",
    "GPUTRAIN_WATCH_IDLE_WINDOW_S": "idle_window_s",
}


@dataclass(frozen=True)
class WatchSettings:
    stall_timeout_s: float | None = None  # None: max(10 min, 10 x the slowest step seen)
    sample_interval_s: float = 5.0  # nvidia-smi on every node
    poll_s: float = 10.0  # the controller reads the nodes' telemetry and heartbeats
    summary_every_s: float = 300.0  # the one-line summary in the run's output
    idle_window_s: float = 600.0  # warn when a node's mean utilization stays low this long
    idle_below_pct: float = 50.0
    dump_wait_s: float = 5.0  # how long a rank's faulthandler may take to write its stack


def watch_settings(
    stall_timeout_s: float | None, environ: Mapping[str, str] = os.environ
) -> WatchSettings:
    """The defaults, the stall timeout given, and any GPUTRAIN_WATCH_* override (one line
    naming the variable when it is not a number of seconds > 0)."""
    values = {name: env_seconds(var, environ) for var, name in ENV_KNOBS.items()}
    return WatchSettings(
        stall_timeout_s=stall_timeout_s, **{k: v for k, v in values.items() if v is not None}
    )


def env_seconds(var: str, environ: Mapping[str, str] = os.environ) -> float | None:
    """A GPUTRAIN_*_S variable's seconds (None: not set); one line naming the variable when it
    is not a number of seconds > 0, at most a day."""
    raw = environ.get(var)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        raise UserError(f"{var}={raw!r}: allowed: seconds > 0, at most 86400")
    return value


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
