"""What a real nvidia-smi answered on a lent H200 (tests/support/nvidia_smi/, recorded by
bench/gpu_cli.sh): verify and the telemetry sampler read it as they should, the queries they send
are still the ones recorded, and the test bed's fake nvidia-smi answers in the same shape."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from gputrain_node import telemetry
from infra.catalog import ACCELERATORS
from scripts.settings import Settings
from scripts.targets.base import RunOptions
from scripts.targets.local import LocalTarget
from scripts.verify.nodes import (
    NVIDIA_SMI_QUERY,
    GpuExpectation,
    GpuInfo,
    check_gpus,
    parse_gpu_csv,
)
from tests.support.testbed import FAKE_NVIDIA_SMI, GpuConfig, GpuPhase

H200 = Path(__file__).parent / "support" / "nvidia_smi" / "h200-580.159.04.txt"
SAMPLER_ARGS = (
    f"--query-gpu={','.join(telemetry.QUERY_FIELDS)}",
    "--format=csv,noheader,nounits",
)


@dataclass(frozen=True)
class Call:
    args: tuple[str, ...]
    exit_code: int
    stdout: str


def recorded(path: Path = H200) -> list[Call]:
    """The records: `=== nvidia-smi ARGS`, `--- exit N`, stdout lines, `--- stderr`, stderr."""
    text = "".join(ln for ln in path.read_text().splitlines(True) if not ln.startswith("#"))
    calls = []
    for block in text.split("=== nvidia-smi ")[1:]:
        head, rest = block.split("\n", 1)
        exit_line, rest = rest.split("\n", 1)
        stdout = rest.split("--- stderr\n", 1)[0]
        calls.append(Call(tuple(shlex.split(head)), int(exit_line.split()[-1]), stdout))
    return calls


def answer(args: tuple[str, ...]) -> Call:
    matches = [c for c in recorded() if c.args == args]
    assert matches, f"no recorded answer to nvidia-smi {' '.join(args)}: record it again"
    return matches[-1]


def test_verify_sends_the_recorded_query_and_passes_a_real_h200() -> None:
    call = answer(tuple(NVIDIA_SMI_QUERY.split()[1:]))
    gpus = parse_gpu_csv(call.stdout)
    assert gpus == [
        GpuInfo(
            index=0,
            name="NVIDIA H200",
            uuid="GPU-a2b3c97e-efe5-6c9f-586d-575422a445df",
            memory_mib=143771,
            driver_version="580.159.04",
            ecc_uncorrected=0,
            pci_bus_id="00000000:00:06.0",
            temperature_c=39,
        )
    ]
    h200 = ACCELERATORS["nvidia-h200-141gb"]
    expect = GpuExpectation(model=h200.model, count=1, min_memory_mib=h200.min_memory_mib)
    assert check_gpus(gpus, expect) == []


def _replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: Call) -> None:
    """An nvidia-smi on PATH that answers exactly the recorded call, and refuses anything else."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\n[ "$*" = {shlex.quote(" ".join(call.args))} ] || exit 2\n'
        f"printf %s {shlex.quote(call.stdout)}\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(telemetry, "kernel_xids", dict)  # this machine's own kernel log


@pytest.mark.parametrize("which", [0, 1])
def test_the_sampler_reads_the_real_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: int
) -> None:
    call = [c for c in recorded() if c.args == SAMPLER_ARGS][which]
    _replay(tmp_path, monkeypatch, call)
    [row] = telemetry.sample_rows(100.0)
    expected = [
        ["0", "0", "0", "143771", "84.10", "38", "345", "0"],  # idle
        ["0", "100", "35521", "143771", "707.55", "55", "1560", "0"],  # training gpt2-124m
    ][which]
    assert row[1:9] == expected
    assert row[9:] == ["0", "", ""]  # no Xid


def test_the_local_target_counts_a_real_h200(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _replay(tmp_path, monkeypatch, answer(("--query-gpu=name", "--format=csv,noheader")))
    fleet, _ = LocalTarget(Settings(root=tmp_path, runs_dir=tmp_path / "runs")).fleet(RunOptions())
    assert fleet.expect.count == 1


# One field's shape: what a consumer of the text depends on (number format, units, id patterns).
SHAPES = (
    ("uuid", r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),
    ("pci", r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]"),
    ("version", r"\d+\.\d+\.\d+"),
    ("2 decimals", r"\d+\.\d\d"),
    ("whole", r"\d+"),
)


def shape(line: str) -> list[str]:
    out = []
    for cell in line.split(", "):
        value, _, unit = cell.partition(" ")
        kind = next((k for k, rx in SHAPES if re.fullmatch(rx, value)), None)
        out.append(f"{kind} {unit}".strip() if kind else cell)
    return out


def test_the_fake_answers_every_recorded_query_in_the_real_shape(tmp_path: Path) -> None:
    gpu_dir = tmp_path / "gpu"
    gpu_dir.mkdir()
    cfg = GpuConfig(model="NVIDIA H200", memory_mib=143771, driver="580.159.04")
    cfg = dataclasses.replace(cfg, timeline=(GpuPhase(util_pct=100, mem_used_mib=35521),))
    (gpu_dir / "gpu.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    fake = tmp_path / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI.replace("__GPU_DIR__", str(gpu_dir)))
    fake.chmod(0o755)
    queries = [c for c in recorded() if c.args[0].startswith("--query-gpu=")]
    assert len(queries) == 5
    for call in queries:
        done = subprocess.run([fake, *call.args], capture_output=True, text=True, timeout=30)
        assert done.returncode == call.exit_code
        real, ours = call.stdout.splitlines(), done.stdout.splitlines()
        assert len(ours) == len(real), call.args
        if "noheader" not in call.args[-1]:
            assert ours[0] == real[0]  # the header, word for word
        assert [shape(ln) for ln in ours] == [shape(ln) for ln in real], call.args
