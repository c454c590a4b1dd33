"""bench/trainer_throughput.py without a GPU: its CPU table, and nanoGPT's side of the comparison
(the flags its configurator accepts, the figures read from its log)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from types import ModuleType

import pytest

from tests.support.trainer_helpers import ROOT, run

BENCH = ROOT / "bench" / "trainer_throughput.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trainer_throughput", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# karpathy/nanoGPT train.py's defaults (commit 3adf61e) for the keys the bench sets: its
# configurator literal_evals each `--key=value` and asserts the type equals the default's.
NANOGPT_DEFAULT_TYPES = {
    **dict.fromkeys(("dataset", "out_dir", "device", "dtype"), str),
    **dict.fromkeys(("n_layer", "n_head", "n_embd", "block_size", "batch_size"), int),
    **dict.fromkeys(("gradient_accumulation_steps", "warmup_iters", "lr_decay_iters"), int),
    **dict.fromkeys(("max_iters", "eval_iters"), int),
    "learning_rate": float,
    **dict.fromkeys(("always_save_checkpoint", "compile"), bool),
}


def configured(flags: list[str]) -> dict[str, object]:
    """nanoGPT's configurator.py, for `--key=value` arguments."""
    values: dict[str, object] = {}
    for arg in flags:
        key, text = arg[2:].split("=")
        try:
            value: object = ast.literal_eval(text)
        except (SyntaxError, ValueError):
            value = text
        assert type(value) is NANOGPT_DEFAULT_TYPES[key], arg  # its `assert type(...) == ...`
        values[key] = value
    return values


def test_nanogpt_gets_the_presets_shape_the_split_asked_and_the_bench_steps() -> None:
    bench = load_bench()
    gpu = configured(bench.nanogpt_flags("gpt2-124m", 50, cuda=True, split=(64, 1)))
    assert (gpu["n_layer"], gpu["n_embd"], gpu["block_size"]) == (12, 768, 1024)
    assert (gpu["batch_size"], gpu["gradient_accumulation_steps"]) == (64, 1)
    assert gpu["max_iters"] == 49 and gpu["eval_iters"] == 0  # iterations 0..49, no eval batches
    assert gpu["compile"] is True and "device" not in gpu  # nanoGPT's own cuda + bf16 defaults
    cpu = configured(bench.nanogpt_flags("tiny", 120, cuda=False, split=(16, 1)))
    assert (cpu["device"], cpu["dtype"], cpu["compile"], cpu["n_embd"]) == (
        "cpu",
        "float32",
        False,
        64,
    )


def test_nanogpt_steady_figure_skips_the_same_warm_up_as_ours() -> None:
    bench = load_bench()
    lines = ["tokens per iteration will be: 65,536", "step 0: train loss nan, val loss nan"]
    lines += [f"iter {i}: loss {10.9 - i / 100:.4f}, time {900.0 if i == 0 else 125.0:.2f}ms, "
              f"mfu {-100.0 if i < 5 else 41.2:.2f}%" for i in range(50)]  # fmt: skip
    figures = bench.nanogpt_figures("\n".join(lines), 50, 65536)
    assert figures["timed_steps"] == 40  # iterations 10..49: min(10, 50 // 5) untimed
    assert abs(figures["tokens_per_s"] - 65536 / 0.125) < 1e-6
    assert abs(figures["wall_tokens_per_s"] - 50 * 65536 / (0.9 + 49 * 0.125)) < 1e-6
    assert figures["final_loss"] == 10.41
    assert bench.nanogpt_figures("tokens per iteration will be: 65,536\n", 50, 65536) is None


def test_the_bench_without_cuda_says_so_and_prints_a_cpu_table() -> None:
    only = ["--only", "preset default,logits chunked"]
    done = run([sys.executable, str(BENCH), "--quick", "--steps", "5", *only])  # x 4 on the CPU
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "GPU figures NOT measured" in done.stdout
    rows = [ln.split() for ln in done.stdout.splitlines() if ln.startswith("  preset default ")]
    rows += [ln.split() for ln in done.stdout.splitlines() if ln.startswith("  logits chunked ")]
    assert len(rows) == 2
    for row in rows:  # name (2 words), micro x accum, tokens/s, MFU, x nanoGPT, wall, mem, loss
        assert row[2:5] == ["16", "x", "1"] and float(row[5].replace(",", "")) > 0
        assert row[6:8] == ["n/a", "n/a"] and float(row[8].replace(",", "")) > 0
    assert rows[0][11] == rows[1][11]  # the same loss: same data, same maths


def test_an_unknown_configuration_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bench's main() in this process: argparse's exit status and message, nothing run."""
    bench = load_bench()
    monkeypatch.setattr(sys, "argv", [str(BENCH), "--only", "preset default,warp drive"])
    with pytest.raises(SystemExit) as exc:
        bench.main()
    assert exc.value.code == 2
    said = capsys.readouterr()
    assert "--only 'warp drive': no such configuration (known: preset default," in said.err
    assert said.out == ""
