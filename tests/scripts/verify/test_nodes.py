"""verify's pure parts: nvidia-smi's CSV parsed (unknowns kept apart) and every problem of a node
listed against the expectation; the local SSD probe run for real against stub devices and
mountpoint, and the verdict per node."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from infra.base.records import GpuExpectation
from scripts.verify.nodes import (
    GPU_FIELDS,
    build_scratch_probe,
    check_gpus,
    parse_gpu_csv,
    scratch_verdict,
)


def test_parse_gpu_csv_and_unknowns() -> None:
    assert len(GPU_FIELDS) == 9
    text = (
        "0, NVIDIA A100-SXM4-40GB, GPU-aaa, 40960, 550.54.15, 0, 00000000:00:04.0, 31, 0\n"
        "1, NVIDIA A100-SXM4-40GB, GPU-bbb, 40960, 550.54.15, [N/A], 00000000:00:05.0, N/A, 0\n"
    )
    gpus = parse_gpu_csv(text)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].memory_mib == 40960 and gpus[0].ecc_uncorrected == 0
    assert gpus[1].ecc_uncorrected is None and gpus[1].temperature_c is None
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        parse_gpu_csv("NVIDIA-SMI has failed because it couldn't communicate with the driver")


def test_check_gpus_lists_every_problem() -> None:
    gpus = parse_gpu_csv(
        "0, Tesla T4, GPU-a, 15360, 535.1, 2, 0:4, 30, 0\n1, NVIDIA L4, GPU-b, 23034, [N/A], 0, 0:5, 30, 0\n"
    )
    problems = check_gpus(gpus, GpuExpectation(model="NVIDIA L4", count=4, min_memory_mib=20000))
    assert problems == [
        "found 2 GPU(s), expected 4",
        "GPU 0 is 'Tesla T4', expected 'NVIDIA L4'",
        "GPU 0 has 15360 MiB, expected at least 20000 MiB",
        "GPU 0 has 2 uncorrected ECC error(s)",
        "GPU 1: driver version unknown",
    ]
    assert check_gpus([], GpuExpectation()) == []  # cpu


def probe(tmp_path: Path, disks: int, mounted: bool) -> str:
    tmp_path.mkdir()
    dev, mnt, bin_dir = tmp_path / "dev", tmp_path / "mnt", tmp_path / "bin"
    for d in (dev, mnt, bin_dir):
        d.mkdir(exist_ok=True)
    for i in range(disks):
        (dev / f"google-local-nvme-ssd-{i}").touch()
    (bin_dir / "mountpoint").write_text(f"#!/bin/sh\n{'exit 0' if mounted else 'exit 1'}\n")
    (bin_dir / "mountpoint").chmod(0o755)
    cmd = build_scratch_probe(wait_s=2, mount=str(mnt), devices=f"{dev}/google-local-nvme-ssd-*")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["sh", "-c", cmd], env=env, capture_output=True, text=True).stdout


def test_the_probe_and_its_verdict(tmp_path: Path) -> None:
    assert probe(tmp_path / "a", 0, False).strip() == "none"
    assert scratch_verdict("n0", "none\n") is None
    out = probe(tmp_path / "b", 2, True)
    assert out.startswith("mounted ") and scratch_verdict("n0", out) is None
    out = probe(tmp_path / "c", 2, False)
    assert out.strip() == "not-mounted 2"
    why = scratch_verdict("n1", out)
    assert why is not None and why.startswith("node n1: its 2 local SSD(s) are not mounted at")
    assert scratch_verdict("n1", "") == "node n1: could not check its local SSD: no answer"
