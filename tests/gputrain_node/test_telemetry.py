"""The node sampler (gputrain_node/telemetry.py) against the test bed's fake nvidia-smi and dmesg, and
the stack-dump hook in a real Python process."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputrain_node import contract, telemetry
from tests.support.testbed import BUSY, FAKE_DMESG, FAKE_NVIDIA_SMI, GpuConfig, GpuPhase


def _fake_gpus(tmp_path: Path, cfg: GpuConfig, monkeypatch: pytest.MonkeyPatch) -> Path:
    gpu, bin_dir = tmp_path / "gpu", tmp_path / "bin"
    gpu.mkdir(parents=True)
    bin_dir.mkdir()
    (gpu / "gpu.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    for name, body in (("nvidia-smi", FAKE_NVIDIA_SMI), ("dmesg", FAKE_DMESG)):
        (bin_dir / name).write_text(body.replace("__GPU_DIR__", str(gpu)))
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return gpu


def test_samples_show_busy_gpus_then_an_xid_on_the_right_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timeline = (BUSY, GpuPhase(at_s=0.0, util_pct=97, mem_used_mib=18000, xid=79, xid_gpu=1))
    _fake_gpus(tmp_path, GpuConfig(count=2, timeline=timeline[:1]), monkeypatch)
    rows = telemetry.sample_rows(time.time())
    assert [r[1:4] for r in rows] == [["0", "97", "18000"], ["1", "97", "18000"]]
    assert [r[9] for r in rows] == ["0", "0"]  # no Xid yet
    _fake_gpus(tmp_path / "x", GpuConfig(count=2, timeline=timeline), monkeypatch)
    rows = telemetry.sample_rows(time.time())
    assert [(r[9], r[10]) for r in rows] == [("0", ""), ("1", "79")]
    # the process killed with the GPU logs Xid 45 after it: the row lists both, oldest first
    cleanup = dataclasses.replace(timeline[1], xid=45)
    _fake_gpus(tmp_path / "y", GpuConfig(count=2, timeline=(*timeline, cleanup)), monkeypatch)
    rows = telemetry.sample_rows(time.time())
    assert [(r[9], r[10], r[11]) for r in rows] == [("0", "", ""), ("2", "45", "79 45")]


def test_sampler_writes_a_csv_until_its_pid_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_gpus(tmp_path, GpuConfig(count=1, timeline=(BUSY,)), monkeypatch)
    sleeper = subprocess.Popen(["sleep", "1.5"])
    out = tmp_path / "watch"
    started = time.monotonic()
    assert telemetry.sample(out, 0.3, sleeper.pid) == 0
    sleeper.wait()
    assert time.monotonic() - started < 5
    rows = list(csv.reader((out / "telemetry.csv").open()))
    assert rows[0] == list(telemetry.COLUMNS)
    assert len(rows) >= 3 and all(r[2] == "97" for r in rows[1:])


def test_no_nvidia_smi_is_one_line_not_a_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(telemetry, "EXTRA_PATH", str(tmp_path))
    assert telemetry.sample(tmp_path / "w", 0.2, None) == 0
    assert "no GPU telemetry" in (tmp_path / "w" / "telemetry.err").read_text()


def test_dump_reads_each_ranks_stack_through_the_hook(tmp_path: Path) -> None:
    """A worker-like tree (a parent standing in for torchrun, a child with RANK) with the hook on
    PYTHONPATH: the dump finds the rank, signals it and returns its Python stack; a stopped rank
    is reported as stopped."""
    watch = tmp_path / "watch"
    child = (
        "import os, subprocess, sys, time\n"
        "env = {**os.environ, 'RANK': '1', 'LOCAL_RANK': '0'}\n"
        "p = subprocess.Popen([sys.executable, '-c', "
        "'import time\\ndef waiting_in_a_collective():\\n    time.sleep(60)\\n"
        "waiting_in_a_collective()'], env=env)\n"
        "p.wait()\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(contract.PACKAGE_DIR / contract.WATCH_HOOK_DIR),
        "GPUTRAIN_WATCH_DIR": str(watch),
    }
    agent = subprocess.Popen([sys.executable, "-c", child], env=env)
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end and not (watch / "hooked").exists():
            time.sleep(0.05)
        time.sleep(0.3)
        ranks = telemetry.dump(watch, agent.pid, wait_s=5)
        assert [(r["rank"], r["how"]) for r in ranks] == [(1, "faulthandler")]
        assert "waiting_in_a_collective" in str(ranks[0]["stack"])
        os.kill(int(str(ranks[0]["pid"])), signal.SIGSTOP)
        time.sleep(0.2)
        again = telemetry.dump(watch, agent.pid, wait_s=1)
        assert again[0]["state"] == "T" and "stopped" in str(again[0]["how"])
    finally:
        for r in telemetry.rank_processes(agent.pid):
            os.kill(int(str(r["pid"])), signal.SIGKILL)
        agent.kill()
        agent.wait()
