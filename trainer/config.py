"""The trainer's flags: presets fill in what the command line leaves out; bad values fail in one line."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from trainer.errors import InputError

PRESETS: dict[str, dict[str, int | float]] = {
    # Seconds on a CPU: learns the synthetic chain from ln 64 ≈ 4.16 toward its floor ln 4 ≈ 1.39.
    "tiny": dict(
        n_layer=2,
        n_head=2,
        n_embd=64,
        block_size=32,
        vocab_size=64,
        batch_size=16,
        grad_accum=1,
        steps=300,
        lr=1e-2,
        warmup_steps=20,
        log_every=25,
        checkpoint_every=100,
    ),
    # GPT-2 small; 16 x 1024 x 4 = 65,536 tokens per step per GPU.
    "gpt2-124m": dict(
        n_layer=12,
        n_head=12,
        n_embd=768,
        block_size=1024,
        vocab_size=50257,
        batch_size=16,
        grad_accum=4,
        steps=2000,
        lr=6e-4,
        warmup_steps=100,
        log_every=10,
        checkpoint_every=500,
    ),
}


@dataclass(frozen=True)
class TrainConfig:
    preset: str
    out: Path
    data: str
    device: str
    steps: int
    batch_size: int  # sequences per micro-step per rank
    grad_accum: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int  # synthetic chain and .bin files; text is always 256 (bytes)
    successors: int
    lr: float
    min_lr_ratio: float
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    seed: int
    compile: str
    dtype: str
    log_every: int
    checkpoint_every: int
    keep_checkpoints: int
    resume: str
    eval_batches: int
    pg_timeout_s: float


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: $GPUTRAIN_OUT if set, else ./out)",
    )
    p.add_argument(
        "--data",
        default="synthetic",
        help="'synthetic' (default), a .bin uint16 token file, or a text file/directory",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    for name in (
        "steps",
        "batch_size",
        "grad_accum",
        "block_size",
        "n_layer",
        "n_head",
        "n_embd",
        "vocab_size",
        "warmup_steps",
        "log_every",
        "checkpoint_every",
    ):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None, help="preset default")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (preset default)")
    p.add_argument(
        "--min-lr-ratio", type=float, default=0.1, help="cosine floor as a fraction of --lr"
    )
    p.add_argument(
        "--successors",
        type=int,
        default=4,
        help="synthetic data: successors per token; the loss floor is ln of this",
    )
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm; 0 = off")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--compile", default="auto", help="auto (on for CUDA) | on | off")
    p.add_argument(
        "--dtype",
        default="auto",
        help="auto (bf16 on Ampere+, fp16 older, fp32 CPU) | bf16 | fp16 | fp32",
    )
    p.add_argument("--keep-checkpoints", type=int, default=2)
    p.add_argument("--resume", default="auto", help="auto (newest in --out) | never | PATH")
    p.add_argument(
        "--eval-batches", type=int, default=8, help="held-out batches per rank at the end"
    )
    p.add_argument("--pg-timeout-s", type=float, default=600.0, help="process-group timeout")
    return p


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    args = vars(build_parser().parse_args(argv))
    preset = PRESETS[args["preset"]]
    values: dict[str, Any] = {
        k: (preset[k] if v is None and k in preset else v) for k, v in args.items()
    }
    values["out"] = values["out"] or Path(os.environ.get("GPUTRAIN_OUT") or "out")
    cfg = TrainConfig(**{f.name: values[f.name] for f in fields(TrainConfig)})
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    def need(ok: bool, flag: str, value: object, allowed: str) -> None:
        if not ok:
            raise InputError(f"--{flag} {value}: {allowed}")

    for name in (
        "steps",
        "batch_size",
        "grad_accum",
        "block_size",
        "n_layer",
        "n_head",
        "n_embd",
        "vocab_size",
        "log_every",
        "checkpoint_every",
        "keep_checkpoints",
    ):
        value = getattr(cfg, name)
        need(value >= 1, name.replace("_", "-"), value, "must be a whole number >= 1")
    need(cfg.warmup_steps >= 0, "warmup-steps", cfg.warmup_steps, "must be >= 0")
    need(cfg.eval_batches >= 0, "eval-batches", cfg.eval_batches, "must be >= 0")
    need(
        cfg.n_embd % cfg.n_head == 0,
        "n-embd",
        cfg.n_embd,
        f"must be a multiple of --n-head {cfg.n_head}",
    )
    need(cfg.vocab_size <= 65536, "vocab-size", cfg.vocab_size, "must be <= 65536 (uint16 tokens)")
    need(cfg.lr > 0, "lr", cfg.lr, "must be > 0")
    need(0 <= cfg.min_lr_ratio <= 1, "min-lr-ratio", cfg.min_lr_ratio, "must be between 0 and 1")
    need(cfg.weight_decay >= 0, "weight-decay", cfg.weight_decay, "must be >= 0")
    need(cfg.grad_clip >= 0, "grad-clip", cfg.grad_clip, "must be >= 0 (0 turns clipping off)")
    need(cfg.compile in ("auto", "on", "off"), "compile", cfg.compile, "must be auto, on or off")
    need(
        cfg.dtype in ("auto", "bf16", "fp16", "fp32"),
        "dtype",
        cfg.dtype,
        "must be auto, bf16, fp16 or fp32",
    )
    need(cfg.pg_timeout_s > 0, "pg-timeout-s", cfg.pg_timeout_s, "must be > 0")
    if cfg.resume not in ("auto", "never") and not Path(cfg.resume).is_file():
        raise InputError(f"--resume {cfg.resume}: no such checkpoint file (or use auto or never)")
