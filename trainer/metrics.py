"""What a run reports: the steady-state clock, metrics.jsonl lines, memory, atomic JSON files.

Throughput users compare hardware with must be training throughput: `StepClock` counts only spans
that hold nothing but training steps (after warm-up), so checkpoint writes, eval, logging and
whatever follows the last step never dilute it. Wall-clock figures are reported beside it, labelled.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


class StepClock:
    """Training time over spans of steps; `resume()` starts one, `pause(step)` ends it.

    The caller pauses only right after the device has finished step `step` (a sync point) and does
    its non-training work while paused. Spans starting at or after `warmup_until` (compilation and
    allocator warm-up done) make the steady figure.
    """

    def __init__(self, start_step: int, warmup_until: int) -> None:
        self.step, self.warmup_until = start_step, warmup_until
        self.steady_steps, self.steady_s = 0, 0.0
        self.interval_steps, self.interval_s = 0, 0.0
        self._since: float | None = None

    def resume(self) -> None:
        self._since = time.perf_counter()

    def pause(self, step: int) -> None:
        assert self._since is not None, "pause() without resume()"
        span, steps = time.perf_counter() - self._since, step - self.step
        self.interval_steps += steps
        self.interval_s += span
        if self.step >= self.warmup_until:
            self.steady_steps += steps
            self.steady_s += span
        self.step, self._since = step, None

    def take_interval(self) -> tuple[int, float]:
        """(steps, training seconds) since the last call: the per-interval log figure."""
        taken = self.interval_steps, self.interval_s
        self.interval_steps, self.interval_s = 0, 0.0
        return taken


def throughput(
    clock: StepClock,
    tokens_per_step: int,
    steps_run: int,
    elapsed_s: float,
    mfu_of: Callable[[float], float | None],
) -> dict[str, Any]:
    """The summary's figures: steady-state (timed steps only) and, labelled, wall-clock."""
    steady = clock.steady_steps * tokens_per_step / clock.steady_s if clock.steady_steps else None
    wall = steps_run * tokens_per_step / elapsed_s if steps_run else None
    return {
        "tokens_per_s": steady,
        "mfu": None if steady is None else mfu_of(steady),
        "timed_steps": clock.steady_steps,
        "timed_s": clock.steady_s,
        "wall_tokens_per_s": wall,
        "wall_mfu": None if wall is None else mfu_of(wall),
    }


def interval_line(row: dict[str, Any], steps: int) -> str:
    """Rank 0's line per log interval, from its metrics.jsonl row."""
    mfu = "n/a" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
    return (
        f"step {row['step']:>6}/{steps} | loss {row['loss']:.4f} | lr {row['lr']:.2e} | "
        f"{row['tokens_per_s'] / 1e3:.1f}k tok/s | mfu {mfu} | "
        f"mem {row['peak_mem_bytes'] / 2**20:.0f} MiB | {row['elapsed_s']:.1f} s"
    )


class Metrics:
    """metrics.jsonl: one JSON object per logged step; a resume drops lines past its start step."""

    def __init__(self, path: Path, writes: bool, keep_upto: int) -> None:
        self.path, self.writes = path, writes
        if writes and path.exists():
            lines = path.read_text().splitlines()
            kept = [ln for ln in lines if ln.strip() and json.loads(ln)["step"] <= keep_upto]
            path.write_text("".join(ln + "\n" for ln in kept))

    def log(self, row: dict[str, Any]) -> None:
        if self.writes:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")


def peak_mem_bytes(device: torch.device) -> int:
    """Device memory high-water mark on CUDA; the process's peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_json_atomic(path: Path, obj: object) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def say(line: str) -> None:
    print(line, flush=True)
