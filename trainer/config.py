"""The trainer's settings, each written once: a field of TrainConfig whose metadata makes its flag.

Presets fill in what the command line leaves out. Every value is parsed and checked here, so a bad
one fails in one line naming the flag, the value and what is allowed (exit 2), before any work.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn, get_type_hints

from trainer.errors import InputError
from trainer.storage import parse_gs_uri

CHECKPOINT_URI_ENV = "GPUTRAIN_CHECKPOINT_URI"  # the controller sets gs://<bucket>/runs/<run-id>/
PRESET = object()  # a setting's default comes from the --preset column below

# One column per preset, one row per setting it fills in. gpt2-124m: 16 x 1024 x 4 = 65,536 tokens
# per step per GPU. tiny: seconds on a CPU, learns the synthetic chain from ln 64 toward ln 4.
PRESET_NAMES = ("tiny", "gpt2-124m")
# fmt: off
PRESET_TABLE: dict[str, tuple[int | float, ...]] = {
    "n_layer":          (2,     12),
    "n_head":           (2,     12),
    "n_embd":           (64,    768),
    "block_size":       (32,    1024),
    "vocab_size":       (64,    50257),
    "batch_size":       (16,    16),
    "grad_accum":       (1,     4),
    "steps":            (300,   2000),
    "lr":               (1e-2,  6e-4),
    "warmup_steps":     (20,    100),
    "log_every":        (25,    10),
    "checkpoint_every": (100,   500),
}
# fmt: on
PRESETS: dict[str, dict[str, int | float]] = {
    name: {key: row[i] for key, row in PRESET_TABLE.items()} for i, name in enumerate(PRESET_NAMES)
}


@dataclass(frozen=True)
class Rule:
    """What a value must satisfy, and the words that say so in the error."""

    ok: Callable[[Any], bool]
    allowed: str


WHOLE_POSITIVE = Rule(lambda v: v >= 1, "must be a whole number >= 1")
NOT_NEGATIVE = Rule(lambda v: v >= 0, "must be >= 0")
POSITIVE = Rule(lambda v: v > 0, "must be > 0")


def setting(
    help: str,
    default: Any = PRESET,
    *,
    choices: tuple[str, ...] = (),
    rule: Rule | None = None,
    parse: Callable[[str], Any] | None = None,
    metavar: str = "",
) -> Any:
    """A TrainConfig field's flag: its help, default, allowed values and custom parser."""
    if choices:
        *head, last = choices
        rule = Rule(lambda v: v in choices, f"must be {', '.join(head)} or {last}")
    return field(
        metadata={
            "help": help,
            "default": default,
            "rule": rule,
            "parse": parse,
            "metavar": metavar or "|".join(choices),
        }
    )


@dataclass(frozen=True)
class TrainConfig:
    preset: str = setting("size and schedule defaults", "tiny", choices=PRESET_NAMES)
    out: Path = setting(  # noqa: RUF009 (setting returns a dataclasses.field)
        "output directory (default: $GPUTRAIN_OUT if set, else ./out)", None, parse=Path
    )
    data: str = setting(
        "a seeded Markov chain, a .bin uint16 token file, or a text file/directory",
        "synthetic",
        metavar="synthetic|FILE|DIR",
    )
    device: str = setting("where to train", "auto", choices=("auto", "cpu", "cuda"))
    steps: int = setting("optimizer steps", rule=WHOLE_POSITIVE)
    batch_size: int | str = setting(
        "sequences per micro-step per rank, or auto: the largest that fits in device memory, "
        "keeping the step's tokens (the preset's batch x accum, or --tokens-per-step). "
        "Default on CUDA: auto, unless --grad-accum is given; else",
        rule=Rule(lambda v: v == "auto" or v >= 1, "must be a whole number >= 1 or auto"),
        parse=lambda text: text if text == "auto" else int(text),
        metavar="N|auto",
    )
    grad_accum: int = setting("micro-steps per optimizer step", rule=WHOLE_POSITIVE)
    block_size: int = setting("context length in tokens", rule=WHOLE_POSITIVE)
    n_layer: int = setting("transformer blocks", rule=WHOLE_POSITIVE)
    n_head: int = setting("attention heads", rule=WHOLE_POSITIVE)
    n_embd: int = setting("model width", rule=WHOLE_POSITIVE)
    vocab_size: int = setting(
        "synthetic chain and .bin files; text is always 256 (bytes)", rule=WHOLE_POSITIVE
    )
    successors: int = setting(
        "synthetic data: successors per token; the loss floor is ln of this", 4
    )
    lr: float = setting("peak learning rate", rule=POSITIVE)
    min_lr_ratio: float = setting(
        "cosine floor as a fraction of --lr",
        0.1,
        rule=Rule(lambda v: 0 <= v <= 1, "must be between 0 and 1"),
    )
    warmup_steps: int = setting("linear learning-rate warm-up steps", rule=NOT_NEGATIVE)
    weight_decay: float = setting("AdamW weight decay on matrices", 0.1, rule=NOT_NEGATIVE)
    grad_clip: float = setting(
        "max gradient norm; 0 = off",
        1.0,
        rule=Rule(lambda v: v >= 0, "must be >= 0 (0 turns clipping off)"),
    )
    seed: int = setting(
        "seeds the model and the data",
        1337,
        rule=Rule(lambda v: 0 <= v < 2**32, "must be a whole number from 0 to 4294967295"),
    )
    compile: str = setting(
        "torch.compile: auto = on for CUDA", "auto", choices=("auto", "on", "off")
    )
    dtype: str = setting(
        "autocast dtype: auto = bf16 on Ampere+, fp16 older, fp32 CPU",
        "auto",
        choices=("auto", "bf16", "fp16", "fp32"),
    )
    log_every: int = setting("steps between metrics lines", rule=WHOLE_POSITIVE)
    checkpoint_every: int = setting("steps between checkpoints", rule=WHOLE_POSITIVE)
    keep_checkpoints: int = setting("checkpoints kept in --out", 2, rule=WHOLE_POSITIVE)
    resume: str = setting(
        "auto: the newest intact checkpoint in --out or --checkpoint-uri; never; or a file",
        "auto",
        metavar="auto|never|PATH",
    )
    checkpoint_uri: str | None = setting(
        "Cloud Storage for checkpoints too, written by rank 0 "
        "(default: $GPUTRAIN_CHECKPOINT_URI; unset = --out only)",
        None,
        metavar="gs://BUCKET/PREFIX",
    )
    upload_timeout_s: float = setting(
        "at a stop (SIGTERM, preemption), the most seconds to wait for the checkpoint upload; "
        "GCE allows about 30 in all",
        20.0,
        rule=POSITIVE,
    )
    eval_batches: int = setting(
        "held-out batches (a step's sequences each) per rank at the end", 8, rule=NOT_NEGATIVE
    )
    pg_timeout_s: float = setting("process-group timeout in seconds", 600.0, rule=POSITIVE)
    # How fast, never what: these change neither the data nor the maths (to rounding).
    tokens_per_step: int | None = setting(
        "tokens per optimizer step over all ranks; sets --grad-accum "
        "(default: batch x grad-accum x block-size x ranks)",
        None,
        rule=Rule(lambda v: v is None or v >= 1, "must be a whole number >= 1"),
        parse=int,
        metavar="N",
    )
    prefetch: str = setting(
        "build the next step's batches on a background thread: auto = on for CUDA",
        "auto",
        choices=("auto", "on", "off"),
    )
    attention: str = setting(
        "scaled_dot_product_attention kernel: auto = PyTorch's choice; cudnn needs CUDA",
        "auto",
        choices=("auto", "flash", "cudnn", "math"),
    )
    logits: str = setting(
        "full: materialise the (tokens x vocab) logits; chunked: linear + cross-entropy "
        "in row chunks, never all logits at once; liger: the same fused in Liger-Kernel's "
        "Triton kernel (CUDA, pip install liger-kernel)",
        "full",
        choices=("full", "chunked", "liger"),
    )
    fp8: str = setting(
        "the blocks' linear layers as float8 matmuls (torchao's float8 training, tensorwise "
        "scales; CUDA compute capability 8.9+, pip install torchao); the logits stay in --dtype",
        "off",
        choices=("off", "on"),
    )
    compile_mode: str = setting(
        "torch.compile mode; reduce-overhead and max-autotune capture CUDA graphs and need "
        "grad-accum 1",
        "default",
        choices=("default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"),
    )


METAVARS = {int: "N", float: "X", Path: "DIR"}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class _Parser(argparse.ArgumentParser):
    def error(
        self, message: str
    ) -> NoReturn:  # an unknown flag: one line and exit 2, like the rest
        raise InputError(message)


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrainConfig field; values stay strings here and are parsed by parse_config."""
    p = _Parser(
        prog="python -m trainer.train",
        description="The reference DDP trainer, alone or under torchrun; outputs go to --out.",
    )
    types = get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        meta = f.metadata
        default = meta["default"]
        if default is PRESET:
            column = ", ".join(f"{n}: {PRESETS[n][f.name]}" for n in PRESET_NAMES)
            shown = f" (default from --preset: {column})"
        else:
            shown = "" if default is None else f" (default: {default})"
        p.add_argument(
            flag(f.name),
            default=None,
            metavar=meta["metavar"] or METAVARS.get(types[f.name], "VALUE"),
            help=meta["help"] + shown,
        )
    return p


def _convert(name: str, text: str, kind: Any, meta: Any) -> Any:
    """A flag's string as its field's type; the error names the flag and what it accepts."""
    parse = meta["parse"] or (kind if kind in (int, float) else str)
    try:
        return parse(text)
    except ValueError:
        words = {int: "must be a whole number", float: "must be a number"}.get(kind)
        raise InputError(f"{flag(name)} {text}: {words or meta['rule'].allowed}") from None


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    args = vars(build_parser().parse_args(argv))
    preset_field = next(f for f in fields(TrainConfig) if f.name == "preset")
    preset = args["preset"] or preset_field.metadata["default"]
    if preset not in PRESETS:
        raise InputError(f"--preset {preset}: {preset_field.metadata['rule'].allowed}")
    types = get_type_hints(TrainConfig)
    values: dict[str, Any] = {}
    for f in fields(TrainConfig):
        text, default = args[f.name], f.metadata["default"]
        if text is not None:
            values[f.name] = _convert(f.name, text, types[f.name], f.metadata)
        else:
            values[f.name] = PRESETS[preset][f.name] if default is PRESET else default
    # On CUDA the largest micro-batch that fits won on an H200 (docs/developer/benchmarks.md)
    if args["batch_size"] is None and args["grad_accum"] is None and _on_cuda(values["device"]):
        values["batch_size"] = "auto"
    values["out"] = values["out"] or Path(os.environ.get("GPUTRAIN_OUT") or "out")
    values["checkpoint_uri"] = (
        values["checkpoint_uri"] or os.environ.get(CHECKPOINT_URI_ENV) or None
    )
    cfg = TrainConfig(**values)
    validate(cfg)
    if args["grad_accum"] is not None and cfg.tokens_per_step is not None:
        raise InputError(
            f"--grad-accum {cfg.grad_accum}: give --grad-accum or --tokens-per-step, not both"
        )
    if args["grad_accum"] is not None and cfg.batch_size == "auto":
        raise InputError(
            f"--grad-accum {cfg.grad_accum}: --batch-size auto picks it "
            "(set the step's size with --tokens-per-step)"
        )
    return cfg


def _on_cuda(device: str) -> bool:
    """Whether --device resolves to CUDA (dist.pick_device's rule; torch only asked for auto)."""
    if device != "auto":
        return device == "cuda"
    import torch

    return torch.cuda.is_available()


def validate(cfg: TrainConfig) -> None:
    for f in fields(cfg):
        rule, value = f.metadata["rule"], getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"{flag(f.name)} {value}: must be a finite number")
        if rule is not None and not rule.ok(value):
            raise InputError(f"{flag(f.name)} {value}: {rule.allowed}")
    if cfg.n_embd % cfg.n_head:
        raise InputError(f"--n-embd {cfg.n_embd}: must be a multiple of --n-head {cfg.n_head}")
    if cfg.vocab_size > 65536:
        raise InputError(f"--vocab-size {cfg.vocab_size}: must be <= 65536 (uint16 tokens)")
    if cfg.out.exists() and not cfg.out.is_dir():
        raise InputError(f"--out {cfg.out}: is a file; must be a directory (existing or new)")
    if cfg.checkpoint_uri is not None:
        parse_gs_uri(cfg.checkpoint_uri, "--checkpoint-uri")
    if cfg.resume not in ("auto", "never") and not Path(cfg.resume).is_file():
        raise InputError(f"--resume {cfg.resume}: no such checkpoint file (or use auto or never)")
