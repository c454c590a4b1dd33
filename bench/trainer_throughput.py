"""Trainer throughput: the real training loop, one configuration per process, one table.

Each configuration runs `python -m trainer.train` exactly as users do (the Trainer with its data
source, grad accumulation, AdamW and clipping) under a time limit, and reads its summary.json:
steady-state tokens/s and MFU (timed steps after warm-up; 6N + 12·L·H·Q·T flops/token over the
GPU's dense bf16 peak), the wall-clock tokens/s, the micro-batch split, peak memory and the final
loss. Every configuration trains on the same data for the same steps and tokens per step, so the
losses agree unless a setting changed the maths: a loss off by more than LOSS_TOLERANCE is flagged.

Issue 12's figures on one H100 80GB (torch 2.11, gpt2-124m, 16 x 4 x 1024 tokens/step): gputrain
483k tokens/s (41.8 % MFU), nanoGPT 466k; targets >= 513k (1.10x nanoGPT) and >= 47 % MFU.
Without CUDA it says GPU figures were not measured, prints a CPU smoke table and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
LOSS_TOLERANCE = 0.1  # nats: bf16 kernels differ in rounding, not by this much after 30-60 steps
NANOGPT_H100 = 466_000  # tokens/s at 16 x 4, issue 12


@dataclass(frozen=True)
class Config:
    name: str
    flags: tuple[str, ...] = ()
    quick: bool = False  # in --quick (a ~5-minute GPU slot), in this order
    extra: bool = False  # only when named in --only (e.g. a compile known to take many minutes)


GPU_CONFIGS: tuple[Config, ...] = (
    Config("preset default", (), quick=True),
    Config("prefetch off (issue 12's loop)", ("--prefetch", "off"), quick=True),
    Config("batch-size auto", ("--batch-size", "auto"), quick=True),
    Config("logits chunked", ("--logits", "chunked"), quick=True),
    Config("auto + chunked", ("--batch-size", "auto", "--logits", "chunked"), quick=True),
    Config("attention cudnn", ("--attention", "cudnn")),
    Config("attention flash", ("--attention", "flash")),
    Config("micro-batch 32 x 2", ("--batch-size", "32", "--grad-accum", "2")),
    Config("micro-batch 64 x 1", ("--batch-size", "64", "--grad-accum", "1")),
    Config("compile off", ("--compile", "off")),
    Config(  # CUDA graphs need grad-accum 1 (step.CUDA_GRAPH_MODES)
        "64 x 1 + reduce-overhead",
        ("--batch-size", "64", "--grad-accum", "1", "--compile-mode", "reduce-overhead"),
    ),
    Config(
        "auto + chunked + cudnn",
        ("--batch-size", "auto", "--logits", "chunked", "--attention", "cudnn"),
    ),
    Config(  # coordinate-descent tuning: compiles for tens of minutes at this size
        "compile max-autotune-no-cudagraphs",
        ("--compile-mode", "max-autotune-no-cudagraphs"),
        extra=True,
    ),
)
CPU_CONFIGS: tuple[Config, ...] = (
    Config("preset default", (), quick=True),
    Config("batch-size auto", ("--batch-size", "auto"), quick=True),
    Config("micro-batch 4 x 4", ("--batch-size", "4", "--grad-accum", "4"), quick=True),
    Config("logits chunked", ("--logits", "chunked"), quick=True),
    Config("prefetch on", ("--prefetch", "on"), quick=True),
    Config("attention math", ("--attention", "math"), quick=True),
)


@dataclass
class Result:
    config: Config
    status: str  # "ok", or why there is no figure
    summary: dict[str, Any]
    seconds: float


def run_config(config: Config, base: list[str], limit_s: float, work: Path) -> Result:
    """One trainer process; killed (its whole process group) when it outlives `limit_s`."""
    out = work / config.name.replace(" ", "_").replace("/", "_")
    argv = [sys.executable, "-m", "trainer.train", *base, *config.flags, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPUTRAIN_OUT", None)
    started = time.monotonic()
    with (work / "log.txt").open("w") as log:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return Result(config, f"timed out after {limit_s:.0f} s", {}, limit_s)
    seconds = time.monotonic() - started
    if code != 0:
        lines = [ln for ln in (work / "log.txt").read_text().splitlines() if ln.strip()]
        last = lines[-1] if lines else "no output"
        why = next((ln for ln in reversed(lines) if "Error" in ln or "error:" in ln), last)
        return Result(config, f"failed (exit {code}): {why.strip()[:100]}", {}, seconds)
    summary = json.loads((out / "summary.json").read_text())
    for ckpt in out.glob("ckpt-*.pt"):  # 1.5 GB each at gpt2-124m
        ckpt.unlink()
    return Result(config, "ok", summary, seconds)


COLUMNS: tuple[tuple[str, int], ...] = (
    *(("config", 34), ("micro x accum", 13), ("tokens/s", 11), ("MFU", 6)),
    *(("wall tok/s", 11), ("peak mem", 9), ("loss", 10), ("took", 0)),
)


def row_text(r: Result, reference_loss: float | None) -> str:
    """One table line, printed as soon as its configuration ends (a killed bench keeps its rows)."""
    s = r.summary
    if r.status != "ok":
        cells = [r.config.name, "", "", "", "", "", "", f"{r.seconds:.0f} s: {r.status}"]
    else:
        loss = f"{s['final_loss']:.3f}"
        if reference_loss is not None and abs(s["final_loss"] - reference_loss) > LOSS_TOLERANCE:
            loss += " (!)"
        cells = [
            r.config.name,
            f"{s['micro_batch']} x {s['grad_accum']}",
            f"{s['tokens_per_s']:,.0f}",
            "n/a" if s["mfu"] is None else f"{100 * s['mfu']:.1f}%",
            f"{s['wall_tokens_per_s']:,.0f}",
            f"{s['peak_mem_bytes'] / 2**30:.1f} GiB",
            loss,
            f"{r.seconds:.0f} s",
        ]
    return "  " + "  ".join(c.ljust(w) for c, (_, w) in zip(cells, COLUMNS, strict=True)).rstrip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the first configurations, fewer steps")
    p.add_argument("--steps", type=int, help="steps per configuration (default 40; quick 30)")
    p.add_argument(
        "--limit-s", type=float, help="time limit per configuration (default 300; quick 150)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        help="stop starting configurations after this (default none; quick 270)",
    )
    p.add_argument("--only", help="comma-separated configuration names (default: all for the mode)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    configs = GPU_CONFIGS if cuda else CPU_CONFIGS
    configs = tuple(c for c in configs if (c.quick or not args.quick) and not c.extra)
    if args.only:
        names = {n.strip() for n in args.only.split(",")}
        configs = tuple(c for c in (GPU_CONFIGS if cuda else CPU_CONFIGS) if c.name in names)
    steps = args.steps or (30 if args.quick else 40)
    limit_s = args.limit_s or (150.0 if args.quick else 300.0)
    budget_s = args.budget_s or (270.0 if args.quick else float("inf"))
    if cuda:
        name = torch.cuda.get_device_name(0)
        base = ["--preset", "gpt2-124m", "--device", "cuda", "--steps", str(steps)]
        print(
            f"trainer_throughput: {name}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
            f"gpt2-124m, {steps} steps per configuration (steady figure after warm-up), "
            f"limit {limit_s:.0f} s each"
        )
    else:
        base = ["--preset", "tiny", "--device", "cpu", "--steps", str(steps * 4)]
        print(
            "trainer_throughput: no CUDA device here: GPU figures NOT measured (run this on a GPU "
            "machine). CPU smoke table, tiny preset (not comparable to GPU figures):"
        )
    base += ["--log-every", "10", "--checkpoint-every", "1000000", "--eval-batches", "0"]
    print("  " + "  ".join(name.ljust(w) for name, w in COLUMNS).rstrip(), flush=True)
    started, reference = time.monotonic(), None
    with tempfile.TemporaryDirectory(prefix="trainer-bench-") as tmp:
        for config in configs:
            left = budget_s - (time.monotonic() - started)
            if left < 30:
                result = Result(config, "skipped (--budget-s spent)", {}, 0.0)
            else:
                result = run_config(config, base, min(limit_s, left), Path(tmp))
            if reference is None and result.status == "ok":
                reference = result.summary["final_loss"]
            print(row_text(result, reference), flush=True)
    if cuda:
        print(
            f"  reference (issue 12, H100 80GB): nanoGPT {NANOGPT_H100:,} tokens/s at 16 x 4; "
            f"targets >= {1.10 * NANOGPT_H100:,.0f} tokens/s and >= 47 % MFU; loss (!) = more "
            f"than {LOSS_TOLERANCE} nats from the first configuration's"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
