"""The trainer's flags: generated from TrainConfig once, presets as a table, one-line errors."""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from tests.support.trainer_helpers import run
from trainer.config import PRESET, PRESET_TABLE, PRESETS, TrainConfig, build_parser, parse_config
from trainer.train import main

pytestmark = [
    pytest.mark.filterwarnings("ignore:Unable to enable fault handler"),
    pytest.mark.filterwarnings(
        "ignore:`torch.jit.script_method` is deprecated"
    ),  # torch.compile's import
]

# Every flag and its default, as users have known them (preset-filled ones: tiny's value).
TINY_DEFAULTS = {
    "preset": "tiny",
    "data": "synthetic",
    "device": "auto",
    "steps": 300,
    "batch_size": 16,
    "grad_accum": 1,
    "block_size": 32,
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 64,
    "vocab_size": 64,
    "successors": 4,
    "lr": 1e-2,
    "min_lr_ratio": 0.1,
    "warmup_steps": 20,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "seed": 1337,
    "compile": "auto",
    "dtype": "auto",
    "log_every": 25,
    "checkpoint_every": 100,
    "keep_checkpoints": 2,
    "resume": "auto",
    "eval_batches": 8,
    "pg_timeout_s": 600.0,
    "checkpoint_uri": None,
    "upload_timeout_s": 20.0,
    # speed settings (new): the conservative defaults
    "tokens_per_step": None,
    "prefetch": "auto",
    "attention": "auto",
    "logits": "full",
    "fp8": "off",
    "compile_mode": "default",
}


def test_every_field_has_exactly_one_flag_and_the_defaults_are_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUTRAIN_OUT", raising=False)
    monkeypatch.delenv("GPUTRAIN_CHECKPOINT_URI", raising=False)
    parser = build_parser()
    options = {a.dest: a.option_strings for a in parser._actions if a.dest != "help"}
    assert options == {f.name: ["--" + f.name.replace("_", "-")] for f in fields(TrainConfig)}
    cfg = parse_config([])
    assert {f.name: getattr(cfg, f.name) for f in fields(cfg)} == {
        **TINY_DEFAULTS,
        "out": Path("out"),
    }
    gpt2 = parse_config(["--preset", "gpt2-124m"])
    assert (gpt2.n_layer, gpt2.block_size, gpt2.vocab_size, gpt2.batch_size, gpt2.grad_accum) == (
        12,
        1024,
        50257,
        16,
        4,
    )


def test_on_cuda_the_micro_batch_defaults_to_auto_unless_the_split_is_given() -> None:
    """The H200 bench: 64 x 1 (what auto picks) trained 6 % faster than the preset's 16 x 4."""
    cuda = ["--preset", "gpt2-124m", "--device", "cuda"]
    assert (parse_config(cuda).batch_size, parse_config(cuda).grad_accum) == ("auto", 4)
    assert parse_config([*cuda, "--grad-accum", "2"]).batch_size == 16
    assert parse_config([*cuda, "--batch-size", "8"]).batch_size == 8
    assert parse_config([*cuda, "--tokens-per-step", "32768"]).batch_size == "auto"
    assert parse_config(["--preset", "gpt2-124m", "--device", "cpu"]).batch_size == 16
    on_cuda = "auto" if torch.cuda.is_available() else 16
    assert parse_config(["--preset", "gpt2-124m"]).batch_size == on_cuda  # --device auto


def test_presets_are_one_table_of_the_settings_that_default_to_a_preset() -> None:
    from_preset = {f.name for f in fields(TrainConfig) if f.metadata["default"] is PRESET}
    assert set(PRESET_TABLE) == from_preset
    for name in PRESETS:
        parse_config(["--preset", name])  # every preset value passes its setting's rule


def test_help_shows_each_flags_allowed_values_and_per_preset_defaults() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "--compile auto|on|off" in text and "--preset tiny|gpt2-124m" in text
    assert "(default from --preset: tiny: 300, gpt2-124m: 2000)" in text
    assert "--seed N seeds the model and the data (default: 1337)" in text


def test_help_is_fast_and_needs_no_torch() -> None:
    code = "import sys, trainer.config as c; c.build_parser(); print('torch' in sys.modules)"
    done = run([sys.executable, "-c", code])
    assert done.stdout.strip() == "False", done.stderr


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--steps", "abc"], "--steps abc: must be a whole number"),
        (["--lr", "fast"], "--lr fast: must be a number"),
        (["--lr", "0"], "--lr 0.0: must be > 0"),
        (["--min-lr-ratio", "2"], "--min-lr-ratio 2.0: must be between 0 and 1"),
        (["--grad-clip", "-1"], "--grad-clip -1.0: must be >= 0 (0 turns clipping off)"),
        (["--warmup-steps", "-1"], "--warmup-steps -1: must be >= 0"),
        (["--keep-checkpoints", "0"], "--keep-checkpoints 0: must be a whole number >= 1"),
        (["--preset", "huge"], "--preset huge: must be tiny or gpt2-124m"),
        (["--dtype", "fp8"], "--dtype fp8: must be auto, bf16, fp16 or fp32"),
        (["--vocab-size", "70000"], "--vocab-size 70000: must be <= 65536 (uint16 tokens)"),
        (["--successors", "0"], "--successors 0: must be between 1 and the vocab size 64"),
        (["--successors", "65"], "--successors 65: must be between 1 and the vocab size 64"),
        (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["--steps", "0"], "--steps 0: must be a whole number >= 1"),
        (["--n-embd", "65"], "--n-embd 65: must be a multiple of --n-head 2"),
        (["--compile", "maybe"], "--compile maybe: must be auto, on or off"),
        (["--device", "tpu"], "--device tpu: must be auto, cpu or cuda"),
        (
            ["--resume", "/nonexistent/ckpt.pt"],
            "--resume /nonexistent/ckpt.pt: no such checkpoint file (or use auto or never)",
        ),
        # speed settings
        (
            ["--tokens-per-step", "1000"],
            "--tokens-per-step 1000: must be a multiple of --block-size 32 x 1 ranks = 32",
        ),
        (
            ["--tokens-per-step", "96"],
            "--tokens-per-step 96: must be a multiple of --batch-size 16 x --block-size 32 x 1 ranks",
        ),
        (["--batch-size", "big"], "--batch-size big: must be a whole number >= 1 or auto"),
        (["--batch-size", "0"], "--batch-size 0: must be a whole number >= 1 or auto"),
        (
            ["--batch-size", "auto", "--grad-accum", "2"],
            "--grad-accum 2: --batch-size auto picks it (set the step's size with --tokens-per-step)",
        ),
        (
            ["--tokens-per-step", "512", "--grad-accum", "2"],
            "--grad-accum 2: give --grad-accum or --tokens-per-step, not both",
        ),
        (
            ["--attention", "cudnn"],
            "--attention cudnn: needs a CUDA device (use auto or math on cpu)",
        ),
        (["--logits", "fused"], "--logits fused: must be full, chunked or liger"),
        (
            ["--logits", "liger"],
            "--logits liger: needs a CUDA device (Liger-Kernel's Triton kernels; use full or "
            "chunked on cpu)",
        ),
        (["--fp8", "yes"], "--fp8 yes: must be off or on"),
        (["--fp8", "on"], "--fp8 on: needs a GPU with float8 tensor cores (8.9+), not cpu"),
        (
            ["--compile", "on", "--compile-mode", "max-autotune", "--grad-accum", "2"],
            "--compile-mode max-autotune: needs grad-accum 1 (CUDA graphs overwrite accumulated "
            "gradients), not 16 x 2; use --batch-size 32 --grad-accum 1, or --compile-mode default "
            "or max-autotune-no-cudagraphs",
        ),
        (
            ["--compile-mode", "fast"],
            "--compile-mode fast: must be default, max-autotune, max-autotune-no-cudagraphs or "
            "reduce-overhead",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_flag_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["--device", "cpu", *argv, "--out", str(out)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {line}"]
    assert not out.exists() or not any(out.iterdir())  # nothing started


def test_out_pointing_at_a_file_is_refused_in_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """All of standard error (file descriptor 2) while main() runs in this process."""
    existing = tmp_path / "results.txt"
    existing.write_text("not a directory\n")
    capfd.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(existing)])
    assert exc.value.code == 2
    assert capfd.readouterr().err.strip().splitlines() == [
        f"error: --out {existing}: is a file; must be a directory (existing or new)"
    ]
    assert existing.read_text() == "not a directory\n"
