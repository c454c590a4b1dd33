"""karpathy/nanoGPT's own train.py as the user's code on 2 sshd test hosts (issue 27, done-when):
its checkpoint, written to out/ckpt.pt beside its code, comes home without --out_dir=../out, and
its CUDA-only DDP code on a CPU host is reported with its exception as the root cause; with a
requirements.txt naming a package the hosts lack (issue 20), installed once per node and cached
for the next run (one pair of hosts and one test for all of it). The real train.py when
GPUTRAIN_NANOGPT_DIR (default /work/notes/nanogpt) holds it, else our stand-in
(tests/support/nanogpt_standin/train_cuda_ddp.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from scripts.cli import main
from scripts.settings import Settings
from tests.support.testbed import TestBed
from tests.support.wheelhouse import PackageIndex, build_wheel

SUPPORT = Path(__file__).resolve().parents[1] / "support"
NANOGPT = Path(os.environ.get("GPUTRAIN_NANOGPT_DIR", "/work/notes/nanogpt"))
REAL = (NANOGPT / "train.py").is_file()
# nanoGPT's flags for a tiny CPU run: its CPU-only quirks (see docs/recipes.md)
FLAGS = (
    "--dataset=shakespeare_char", "--gradient_accumulation_steps=1", "--device=cpu", "--compile=False", "--dtype=float32", "--max_iters=20",
    "--eval_interval=10", "--eval_iters=2", "--log_interval=5", "--batch_size=4",
    "--block_size=16", "--n_layer=1", "--n_head=2", "--n_embd=16", "--dropout=0.0",
)  # fmt: skip


def _project(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    (work / "data" / "shakespeare_char").mkdir(parents=True)
    if REAL:
        for name in ("train.py", "model.py", "configurator.py"):
            shutil.copy(NANOGPT / name, work / name)
    else:
        shutil.copy(SUPPORT / "nanogpt_standin" / "train_cuda_ddp.py", work / "train.py")
    shutil.copy(SUPPORT / "nanogpt_cpu.py", work / "nanogpt_cpu.py")
    tokens = (np.arange(4000) * 7 % 65).astype(np.uint16)
    for split in ("train", "val"):
        tokens.tofile(work / "data" / "shakespeare_char" / f"{split}.bin")
    return work


def _flags() -> list[str]:
    return list(FLAGS) if REAL else [f for f in FLAGS if f.split("=")[0] in STANDIN_KEYS]


STANDIN_KEYS = {"--dataset", "--device", "--compile", "--dtype", "--max_iters", "--eval_interval",
                "--log_interval", "--batch_size", "--block_size", "--n_embd"}  # fmt: skip


def _hosts(tb: TestBed, tmp_path: Path, n: int) -> Path:
    return tb.hosts_file(tmp_path, [tb.add_host() for _ in range(n)], "cpu: true\n")


def test_nanogpt_on_two_hosts_root_cause_then_its_requirements_once_and_checkpoints_home(
    tb: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One pair of hosts for both runs (the test bed's time is shared), the project's
    requirements.txt naming a package the hosts lack (from a package index on the bridge): the
    first run installs it once per node, then its CUDA-only DDP code fails on the CPU hosts and
    the root cause is that exception; the second, through the recipe's wrapper, finds the
    environment cached, its config file (nanoGPT executes it) imports the package, both nodes
    train and their ckpt.pt comes home."""
    hosts = _hosts(tb, tmp_path, 2)
    work = _project(tmp_path)
    monkeypatch.chdir(work)
    settings = Settings(root=work, runs_dir=work / "runs", connect_deadline_s=30)
    (work / "requirements.txt").write_text("gputrain-probe==1.0\n")
    (work / "needs_probe.py").write_text(
        "import gputrain_probe  # the package requirements.txt names\n"
        "print('config: imported', gputrain_probe.__name__)\n"
    )
    with PackageIndex(tmp_path / "index", host=tb.bridge_address) as index:
        index.add(build_wheel("gputrain-probe", tmp_path / "wheel"))
        pip = [
            "--env",
            f"PIP_INDEX_URL={index.url}",
            "--env",
            f"PIP_TRUSTED_HOST={tb.bridge_address}",
        ]
        train = ["train", "--hosts", str(hosts), *pip, "--"]
        assert main([*train, "train.py", *_flags(), "--backend=gloo"], settings) == 1
        captured = capsys.readouterr()
        assert captured.out.count("[requirements] Successfully installed gputrain-probe-1.0") == 2
        cause = captured.err.split("Root cause:", 1)[1].split("logs and results:", 1)[0]
        cause_lines = cause.strip().splitlines()
        assert cause_lines[-1].endswith(
            "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'"
        )
        assert cause_lines[0].endswith("Traceback (most recent call last):")
        assert not any("Overriding" in ln or "iter " in ln for ln in cause_lines)

        assert main([*train, "nanogpt_cpu.py", "needs_probe.py", *_flags()], settings) == 0
        out = capsys.readouterr().out
        assert out.count("skipped (cached)") == 2 and "Successfully installed" not in out
        assert out.count("config: imported gputrain_probe") == 2 and "iter 20: loss" in out
    _checkpoints_home(work)


def _checkpoints_home(work: Path) -> None:
    runs = work / "runs" / "hosts-lab"
    run = runs / (runs / "LAST_RUN").read_text().strip()
    ckpts = sorted(run.glob("*/workdir/out/ckpt.pt"))
    assert len(ckpts) == 2, sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    for ckpt in ckpts:
        assert torch.load(ckpt, weights_only=False)["iter_num"] == 20
    assert not list(run.glob("*/workdir/**/*.pyc"))  # Python's caches stay there
