"""Trainer flags that used to crash, train to nan or die silently: each one line and an exit code
(issue 27, class 1). The trainer's own `main()` runs in this process: the code, the line on
standard error and the exit status a `python -m trainer.train` process gives
(test_train.py's test_bad_data_in_a_real_process_has_no_traceback runs one as a real process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.config import parse_config
from trainer.errors import InputError
from trainer.memory import available_bytes, check_fits, estimate
from trainer.train import main


def _train(capfd: pytest.CaptureFixture[str], tmp_path: Path, *flags: str) -> tuple[int, str]:
    """`trainer.train --out tmp_path/out` with these flags: its exit status and all it wrote to
    standard error (file descriptor 2: a warning or traceback printed by anything would show)."""
    capfd.readouterr()
    try:
        main(["--out", str(tmp_path / "out"), *flags])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)  # as the interpreter
    return code, capfd.readouterr().err


@pytest.mark.parametrize("seed", ["-1", "4294967296", "99999999999999999999"])
def test_an_out_of_range_seed_is_one_line(seed: str) -> None:
    with pytest.raises(InputError, match=rf"--seed {seed}: must be a whole number from 0"):
        parse_config([f"--seed={seed}"])


@pytest.mark.parametrize("flag", ["--lr", "--weight-decay", "--grad-clip", "--pg-timeout-s"])
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_non_finite_numbers_are_refused(flag: str, value: str) -> None:
    with pytest.raises(InputError, match=rf"{flag} {value}: must be"):
        parse_config([f"{flag}={value}"])


def test_a_diverging_loss_ends_the_run_with_exit_1_naming_the_step(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, err = _train(
        capfd, tmp_path, "--lr", "1e30", "--grad-clip", "0", "--warmup-steps", "0",
        "--steps", "40", "--log-every", "5",
    )  # fmt: skip
    assert code == 1, err
    line = next(ln for ln in err.splitlines() if ln.startswith("error:"))
    assert "the loss is nan at step" in line or "the loss is inf at step" in line
    assert "Traceback" not in err


def test_a_model_too_big_for_memory_is_refused_with_the_figures(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    flags = ("--block-size", "200000", "--n-embd", "4096", "--n-head", "32")
    code, err = _train(capfd, tmp_path, *flags)
    assert code == 2, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert "model too big" in line and "GiB free" in line and "--block-size 200000" in line
    assert "Traceback" not in err


def test_the_estimate_counts_state_and_activations_and_passes_the_presets() -> None:
    cpu = torch.device("cpu")
    tiny = parse_config([])
    est = check_fits(tiny, 64, cpu, torch.float32, 1)
    assert 0 < est.state_bytes < est.total < 1 << 30
    big = parse_config(["--preset", "gpt2-124m"])
    gpt2 = estimate(big, 50304, 2)
    assert 120e6 < gpt2.params < 130e6  # GPT-2 small
    assert gpt2.state_bytes == gpt2.params * 16
    assert (
        estimate(parse_config(["--preset", "gpt2-124m", "--logits", "chunked"]), 50304, 2).total
        < gpt2.total
    )
    assert available_bytes(cpu, 1) is not None  # this machine's real /proc/meminfo parses


def test_ranks_on_one_machine_share_its_available_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fixed meminfo file: the live one moves while parallel tests run."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24576000 kB\nMemAvailable:   20000000 kB\n")
    monkeypatch.setattr("trainer.memory.MEMINFO", str(meminfo))
    cpu = torch.device("cpu")
    assert available_bytes(cpu, 1) == 20000000 * 1024
    assert available_bytes(cpu, 3) == 20000000 * 1024 // 3
    meminfo.write_text("MemTotal:       24576000 kB\n")  # an old kernel without the field
    assert available_bytes(cpu, 1) is None


def test_an_out_dir_that_cannot_be_created_names_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    code, err = _train(capfd, tmp_path / "file")  # --out tmp_path/file/out
    assert code == 2
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line.startswith(f"error: --out {tmp_path / 'file' / 'out'}: cannot write there")


@pytest.mark.parametrize("kernel", ["flash", "cudnn"])
def test_gpu_only_attention_kernels_are_refused_alike_on_cpu(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], kernel: str
) -> None:
    code, err = _train(capfd, tmp_path, "--attention", kernel, "--steps", "1")
    assert code == 2
    assert f"error: --attention {kernel}: needs a CUDA device" in err


def test_text_data_never_writes_beside_itself(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "ro" / "corpus.txt"
    data.parent.mkdir()
    data.write_text("hello world, " * 400)
    monkeypatch.setenv("GPUTRAIN_DATA_CACHE", str(tmp_path / "cache"))
    code, err = _train(capfd, tmp_path, "--data", str(data), "--steps", "2", "--eval-batches", "0")
    assert code == 0, err
    assert sorted(p.name for p in data.parent.iterdir()) == ["corpus.txt"]
    assert len(list((tmp_path / "cache").glob("corpus.txt-*.bytes.u16"))) == 1
    bad = tmp_path / "file"
    bad.write_text("x")
    monkeypatch.setenv("GPUTRAIN_DATA_CACHE", str(bad / "cache"))
    code, err = _train(capfd, tmp_path, "--data", str(data), "--steps", "2")
    assert code == 2 and "GPUTRAIN_DATA_CACHE" in err and "Traceback" not in err
