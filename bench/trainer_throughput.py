"""Trainer throughput: the real training loop, one configuration per process, one table.

Each configuration runs `python -m trainer.train` exactly as users do (the Trainer with its data
source, grad accumulation, AdamW and clipping) under a time limit, and reads its summary.json:
steady-state tokens/s and MFU (timed steps after warm-up; 6N + 12·L·H·Q·T flops/token over the
GPU's dense bf16 peak), the wall-clock tokens/s, the micro-batch split, peak memory and the final
loss. Every configuration trains on the same data for the same steps and tokens per step, so the
losses agree unless a setting changed the maths: a loss off by more than LOSS_TOLERANCE is flagged.

`--nanogpt DIR` (karpathy/nanoGPT's train.py, model.py and configurator.py, unmodified) runs
nanoGPT first, in the same run, on the same model shape and sequence length at each split of
--nanogpt-splits (compiled on CUDA, as its README runs it), on uniform random tokens of the same
vocabulary; its steady tokens/s comes from its own per-iteration times after the same warm-up,
and every row gets its ratio to nanoGPT's fastest split.

Figures, dated: docs/developer/benchmarks.md (on an H200 the CUDA default, 64 x 1, is 1.02-1.03x
nanoGPT at its own best split, 64 x 1 too). Targets (issue 40): >= 1.05x nanoGPT with both at
their best split, and >= 50 % MFU.
Without CUDA it says GPU figures were not measured, prints a CPU smoke table and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.config import PRESETS  # noqa: E402
from trainer.mfu import flops_per_token, mfu, peak_tflops  # noqa: E402
from trainer.model import GPT, GPTConfig, padded_vocab  # noqa: E402

LOSS_TOLERANCE = 0.1  # nats: bf16 kernels differ in rounding, not by this much after 30-60 steps


@dataclass(frozen=True)
class Config:
    name: str
    flags: tuple[str, ...] = ()
    quick: bool = False  # in --quick (a ~5-minute GPU slot), in this order
    extra: bool = False  # only when named in --only (e.g. a compile known to take many minutes)


GPU_CONFIGS: tuple[Config, ...] = (  # the order a short GPU slot runs them in
    Config("preset default", (), quick=True),  # on CUDA: --batch-size auto
    Config("16 x 4, the preset's split", ("--batch-size", "16", "--grad-accum", "4"), quick=True),
    Config("attention cudnn", ("--attention", "cudnn"), quick=True),
    Config("logits chunked", ("--logits", "chunked"), quick=True),
    Config("cudnn + chunked", ("--attention", "cudnn", "--logits", "chunked")),
    Config("logits liger", ("--logits", "liger"), quick=True),  # pip install liger-kernel
    Config("micro-batch 32 x 2", ("--batch-size", "32", "--grad-accum", "2")),
    Config("cudnn + liger", ("--attention", "cudnn", "--logits", "liger")),
    Config("prefetch off (issue 12's loop)", ("--prefetch", "off")),
    Config(  # CUDA graphs need grad-accum 1 (step.CUDA_GRAPH_MODES)
        "64 x 1 + reduce-overhead",
        ("--batch-size", "64", "--grad-accum", "1", "--compile-mode", "reduce-overhead"),
    ),
    Config("attention flash", ("--attention", "flash")),
    Config("micro-batch 64 x 1", ("--batch-size", "64", "--grad-accum", "1")),
    Config("compile off", ("--compile", "off")),
    Config("fp8 (torchao float8 linears)", ("--fp8", "on")),  # pip install torchao
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


NANOGPT_SPLITS = ((64, 1), (16, 4))  # its best split first (2026-11-26), then the preset's
NANOGPT_ITER = re.compile(r"^iter (\d+): loss ([-\d.naninf]+), time ([\d.]+)ms")


@dataclass
class Result:
    config: Config
    status: str  # "ok", or why there is no figure
    summary: dict[str, Any]
    seconds: float


def run_logged(
    argv: list[str], cwd: Path, env: dict[str, str], limit_s: float, log: Path
) -> tuple[str, float]:
    """One process in its own session, output to `log`, killed with its whole process group when
    it outlives `limit_s`: ("ok" or why not, seconds)."""
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"timed out after {limit_s:.0f} s", limit_s
    seconds = time.monotonic() - started
    if code == 0:
        return "ok", seconds
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    last = lines[-1] if lines else "no output"
    why = next((ln for ln in reversed(lines) if "Error" in ln or "error:" in ln), last)
    return f"failed (exit {code}): {why.strip()[:100]}", seconds


def run_config(config: Config, base: list[str], limit_s: float, work: Path) -> Result:
    """One `python -m trainer.train` with the configuration's flags; its summary.json."""
    out = work / config.name.replace(" ", "_").replace("/", "_")
    argv = [sys.executable, "-m", "trainer.train", *base, *config.flags, "--out", str(out)]
    env = trainer_env()
    status, seconds = run_logged(argv, ROOT, env, limit_s, out.with_suffix(".log"))
    if status != "ok":
        return Result(config, status, {}, seconds)
    summary = json.loads((out / "summary.json").read_text())
    for ckpt in out.glob("ckpt-*.pt"):  # 1.5 GB each at gpt2-124m
        ckpt.unlink()
    return Result(config, "ok", summary, seconds)


def trainer_env() -> dict[str, str]:
    """This environment with the project first on the path (after nothing: a PYTHONPATH given, e.g.
    for liger-kernel, stays behind it) and no GPUTRAIN_OUT to override --out."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("GPUTRAIN_OUT", None)
    return env


def bench_preset(cuda: bool) -> str:
    """GPT-2 124M on a GPU; the tiny preset's seconds on a CPU (a smoke table)."""
    return "gpt2-124m" if cuda else "tiny"


def warmup_steps(steps: int) -> int:
    """The trainer's rule (Trainer.train): the first min(10, steps / 5) steps are not timed."""
    return min(10, steps // 5)


def model_shape(preset: str) -> GPTConfig:
    p = PRESETS[preset]
    return GPTConfig(
        n_layer=int(p["n_layer"]),
        n_head=int(p["n_head"]),
        n_embd=int(p["n_embd"]),
        block_size=int(p["block_size"]),
        vocab_size=padded_vocab(int(p["vocab_size"])),
    )


def model_flops_per_token(preset: str) -> float:
    """The trainer's MFU numerator for this preset (nanoGPT's model has the same parameters)."""
    cfg = model_shape(preset)
    with torch.device("meta"):
        return flops_per_token(cfg, GPT(cfg).num_params())


def nanogpt_config(split: tuple[int, int]) -> Config:
    return Config(f"nanoGPT train.py {split[0]} x {split[1]}")


def nanogpt_flags(preset: str, steps: int, cuda: bool, split: tuple[int, int]) -> list[str]:
    """nanoGPT's `--key=value` overrides: our preset's shape and schedule at the micro-batch x
    accumulation `split`, `steps` iterations."""
    p = PRESETS[preset]
    flags: dict[str, object] = {
        "dataset": "bench",
        "out_dir": "out",
        **{k: p[k] for k in ("n_layer", "n_head", "n_embd", "block_size")},
        "batch_size": split[0],
        "gradient_accumulation_steps": split[1],
        "learning_rate": p["lr"],
        "warmup_iters": p["warmup_steps"],
        "lr_decay_iters": p["steps"],
        "max_iters": steps - 1,  # it runs iterations 0 to max_iters
        "eval_iters": 0,  # its evaluation at iteration 0 then reads no batch and compiles nothing
        "always_save_checkpoint": False,
        "compile": cuda,
    }
    if not cuda:
        flags |= {"device": "cpu", "dtype": "float32"}
    return [f"--{k}={v}" for k, v in flags.items()]


def nanogpt_figures(log: str, steps: int, tokens_per_iter: int) -> dict[str, Any] | None:
    """Steady and wall tokens/s from nanoGPT's `iter N: loss L, time Tms` lines (None without
    timed ones): its iterations from the trainer's warm-up on, each timed by nanoGPT itself."""
    iters = {
        int(m[1]): (float(m[2]), float(m[3]) / 1e3)
        for m in map(NANOGPT_ITER.match, log.splitlines())
        if m
    }
    timed = [dt for n, (_, dt) in iters.items() if n >= warmup_steps(steps)]
    if not timed:
        return None
    return {
        "tokens_per_s": len(timed) * tokens_per_iter / sum(timed),
        "wall_tokens_per_s": len(iters) * tokens_per_iter / sum(dt for _, dt in iters.values()),
        "timed_steps": len(timed),
        "final_loss": iters[max(iters)][0],
    }


def run_nanogpt(
    source: Path,
    preset: str,
    steps: int,
    cuda: bool,
    limit_s: float,
    work: Path,
    split: tuple[int, int],
) -> Result:
    """karpathy/nanoGPT's train.py in a scratch copy (it reads data/<dataset>/ and writes out/ in
    its working directory), on uniform random tokens of the preset's (padded) vocabulary."""
    config = nanogpt_config(split)
    run_dir = work / f"nanogpt-{split[0]}x{split[1]}"
    data = run_dir / "data" / "bench"
    data.mkdir(parents=True)
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copy(source / name, run_dir / name)
    vocab = padded_vocab(int(PRESETS[preset]["vocab_size"]))
    tokens = np.random.default_rng(0).integers(0, vocab, size=2**22, dtype=np.uint16)
    for name in ("train", "val"):
        tokens.tofile(data / f"{name}.bin")
    (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": vocab}))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    argv = [sys.executable, "train.py", *nanogpt_flags(preset, steps, cuda, split)]
    log = run_dir.with_suffix(".log")
    status, seconds = run_logged(argv, run_dir, env, limit_s, log)
    shutil.rmtree(run_dir / "data")
    if status != "ok":
        return Result(config, status, {}, seconds)
    p = PRESETS[preset]
    figures = nanogpt_figures(log.read_text(), steps, split[0] * split[1] * int(p["block_size"]))
    if figures is None:
        return Result(config, "no timed iterations in its log", {}, seconds)
    peak = peak_tflops(torch.cuda.get_device_name(0)) if cuda else None
    figures |= {
        "mfu": mfu(figures["tokens_per_s"], model_flops_per_token(preset), peak, 1),
        "micro_batch": split[0],
        "grad_accum": split[1],
        "peak_mem_bytes": None,
    }
    return Result(config, "ok", figures, seconds)


COLUMNS: tuple[tuple[str, int], ...] = (
    *(("config", 34), ("micro x accum", 13), ("tokens/s", 11), ("MFU", 6), ("x nanoGPT", 9)),
    *(("wall tok/s", 11), ("peak mem", 9), ("loss", 10), ("took", 0)),
)


def row_text(r: Result, reference_loss: float | None, nanogpt_tps: float | None) -> str:
    """One table line, printed as soon as its configuration ends (a killed bench keeps its rows).
    nanoGPT's loss is on other data (uniform random tokens), so it is never flagged."""
    s = r.summary
    if r.status != "ok":
        cells = [r.config.name, *[""] * (len(COLUMNS) - 2), f"{r.seconds:.0f} s: {r.status}"]
    else:
        loss = f"{s['final_loss']:.3f}"
        if (
            not r.config.name.startswith("nanoGPT")
            and reference_loss is not None
            and abs(s["final_loss"] - reference_loss) > LOSS_TOLERANCE
        ):
            loss += " (!)"
        cells = [
            r.config.name,
            f"{s['micro_batch']} x {s['grad_accum']}",
            f"{s['tokens_per_s']:,.0f}",
            "n/a" if s["mfu"] is None else f"{100 * s['mfu']:.1f}%",
            "n/a" if nanogpt_tps is None else f"{s['tokens_per_s'] / nanogpt_tps:.3f}x",
            f"{s['wall_tokens_per_s']:,.0f}",
            "n/a" if s["peak_mem_bytes"] is None else f"{s['peak_mem_bytes'] / 2**30:.1f} GiB",
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
    p.add_argument(
        "--nanogpt",
        type=Path,
        help="a folder with karpathy/nanoGPT's train.py, model.py, configurator.py: run it first",
    )
    p.add_argument(
        "--nanogpt-splits",
        default=",".join(f"{b}x{a}" for b, a in NANOGPT_SPLITS),
        help="nanoGPT's micro-batch x accumulation splits, comma-separated (default: %(default)s); "
        "the ratio column compares with the fastest",
    )
    p.add_argument("--json", type=Path, help="also write every row here (name, flags, summary)")
    p.add_argument(
        "--work", type=Path, help="keep the runs' folders and logs here (default: a temp dir)"
    )
    args = p.parse_args()
    if args.nanogpt and not (args.nanogpt / "train.py").is_file():
        p.error(
            f"--nanogpt {args.nanogpt}: no train.py there (nanoGPT's train.py, model.py, configurator.py)"
        )
    try:
        splits = [
            (int(b), int(a))
            for b, a in (x.strip().split("x") for x in args.nanogpt_splits.split(","))
        ]
    except ValueError:
        p.error(f"--nanogpt-splits {args.nanogpt_splits}: expected e.g. 64x1,16x4")
    cuda = torch.cuda.is_available()
    configs = GPU_CONFIGS if cuda else CPU_CONFIGS
    configs = tuple(c for c in configs if (c.quick or not args.quick) and not c.extra)
    if args.only:
        names = [n.strip() for n in args.only.split(",")]
        known = {c.name: c for c in (GPU_CONFIGS if cuda else CPU_CONFIGS)}
        if unknown := [n for n in names if n not in known]:
            p.error(f"--only {unknown[0]!r}: no such configuration (known: {', '.join(known)})")
        configs = tuple(known[n] for n in names)
    steps = args.steps or (30 if args.quick else 40)
    limit_s = args.limit_s or (150.0 if args.quick else 300.0)
    budget_s = args.budget_s or (270.0 if args.quick else float("inf"))
    preset = bench_preset(cuda)
    if cuda:
        name = torch.cuda.get_device_name(0)
        base = ["--preset", preset, "--device", "cuda", "--steps", str(steps)]
        print(
            f"trainer_throughput: {name}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
            f"gpt2-124m, {steps} steps per configuration (steady figure after warm-up), "
            f"limit {limit_s:.0f} s each"
        )
    else:
        steps *= 4
        base = ["--preset", preset, "--device", "cpu", "--steps", str(steps)]
        print(
            "trainer_throughput: no CUDA device here: GPU figures NOT measured (run this on a GPU "
            "machine). CPU smoke table, tiny preset (not comparable to GPU figures):"
        )
    base += ["--log-every", "10", "--checkpoint-every", "1000000", "--eval-batches", "0"]
    print("  " + "  ".join(name.ljust(w) for name, w in COLUMNS).rstrip(), flush=True)
    started, reference, nanogpt_tps = time.monotonic(), None, None
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        tmp = args.work or stack.enter_context(tempfile.TemporaryDirectory(prefix="trainer-bench-"))
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for split in splits if args.nanogpt else ():
            results.append(
                run_nanogpt(args.nanogpt, preset, steps, cuda, limit_s, Path(tmp), split)
            )
        nanogpt_tps = max((r.summary.get("tokens_per_s") or 0 for r in results), default=0) or None
        for result in results:  # x nanoGPT: against its fastest split
            print(row_text(result, None, nanogpt_tps), flush=True)
        for config in configs:
            left = budget_s - (time.monotonic() - started)
            if left < (75 if cuda else 30):  # a GPU configuration compiles for most of a minute
                result = Result(config, "skipped (--budget-s spent)", {}, 0.0)
            else:
                result = run_config(config, base, min(limit_s, left), Path(tmp))
            if reference is None and result.status == "ok":
                reference = result.summary["final_loss"]
            results.append(result)
            print(row_text(result, reference, nanogpt_tps), flush=True)
            if args.json:
                write_json(args.json, results)
    if args.json:
        write_json(args.json, results)
    if cuda:
        print(
            f"  targets (issue 40): >= 1.05x nanoGPT's tokens/s with both at their best split, "
            f">= 50 % MFU; loss (!) = more than {LOSS_TOLERANCE} nats from the first "
            "configuration's"
        )
    return 0


def write_json(path: Path, results: list[Result]) -> None:
    rows = [
        {
            "name": r.config.name,
            "flags": list(r.config.flags),
            "status": r.status,
            "seconds": r.seconds,
            "summary": r.summary,
        }
        for r in results
    ]
    path.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
