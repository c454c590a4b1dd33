"""GPU verification's pure parts: nvidia-smi's CSV parsed (unknowns kept apart) and every problem
of a node listed against the expectation."""

from __future__ import annotations

import pytest

from infra.base.records import GpuExpectation
from scripts.verify.gpus import GPU_FIELDS, check_gpus, parse_gpu_csv


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
