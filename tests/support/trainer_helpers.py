"""Running the trainer and health check the way the fleet does: real processes, torchrun on gloo."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.support import ROOT

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: what a node's environment sets for the trainer, never taken from the test's own
NODE_SET = ("GPUTRAIN_OUT", "GPUTRAIN_CHECKPOINT_URI", "GPUTRAIN_WATCH_PREEMPTION")


def child_env(out: Path | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for name in NODE_SET:
        env.pop(name, None)
    env.update(extra or {})
    if out is not None:
        env["GPUTRAIN_OUT"] = str(out)
    return env


def torchrun_argv(
    module: str, args: list[str], nproc: int = 2, port: int | None = None
) -> list[str]:
    """One node, `nproc` workers, c10d rendezvous on its own free port."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port or free_port()}",
        f"--rdzv-id=t{os.getpid()}",
        "-m",
        module,
        *args,
    ]


def node_argv(port: int, rdzv_id: str, args: list[str], nnodes: int = 2) -> list[str]:
    """One of `nnodes` torchrun agents on this machine, one worker each: a "node" per agent."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={rdzv_id}",
        "--local-addr=127.0.0.1",
        "-m",
        "trainer.train",
        *args,
    ]


def uninterrupted_summary(out: Path, args: list[str]) -> dict[str, Any]:
    """The trainer's summary of `args` on two torchrun agents on this machine, one worker each,
    never interrupted: what a recovered run must end with."""
    port = free_port()
    procs = [start(node_argv(port, "ref", args), child_env(out)) for _ in range(2)]
    for p in procs:
        output, _ = p.communicate(timeout=240)
        assert p.returncode == 0, output[-3000:]
    return dict(json.loads((out / "summary.json").read_text()))


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """A background run whose stdout and stderr come back together from communicate()."""
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_while_running(
    found: Callable[[], T | None], procs: list[subprocess.Popen[str]], timeout_s: float = 120
) -> T | None:
    """`found()`'s first answer that is not None, polled while every run lives (None once a run
    ended or `timeout_s` passed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        if (answer := found()) is not None:
            return answer
        time.sleep(0.05)
    return None


def wait_for_steps(out: Path, steps: int, procs: list[subprocess.Popen[str]]) -> None:
    """Until `out` has logged `steps` metrics lines (or a run ended, or 120 s passed)."""
    path = out / "metrics.jsonl"
    wait_while_running(
        lambda: True if path.exists() and len(path.read_text().splitlines()) >= steps else None,
        procs,
    )


def run(
    argv: list[str],
    out: Path | None = None,
    timeout: float = 150,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=child_env(out, env), capture_output=True, text=True, timeout=timeout
    )


def metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summary(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "summary.json").read_text()))
