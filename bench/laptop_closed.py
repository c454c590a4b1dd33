"""Recovery with the laptop closed, on the sshd test bed: `run --stack --detach` returns, GCE
takes a worker away, and `gputrain reconcile` passes (the production command, in this process,
as the stack's Cloud Run job runs it) bring the run back.

Prints: (1) preemption -> first resumed step, counted from the reconcile pass's start (the wait
for the next Scheduler tick is not in it; the re-creation, which on GCE includes the VM's boot,
is printed apart); (2) a pass with nothing to do: its wall and CPU seconds (CPU of this whole
process, the fakes serving it included: an upper bound), the interpreter's start and imports
measured apart, and from those Cloud Run's list price per idle day at the default tick;
(3) during a stock-out: how many VMs bill between two passes. Needs root and openssh-server.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.keys import parse_duration
from infra.reconciler import DEFAULT_EVERY, GIB_SECOND_USD, VCPU_SECOND_USD, idle_cost_per_day
from scripts import ui
from tests.support.stack_world import ZONES, world_factory
from tests.support.testbed import TestBed

TRAIN = ["-m", "trainer.train", "--preset", "tiny", "--steps", "60", "--checkpoint-every", "10"]
TRAIN += ["--log-every", "1", "--eval-batches", "0"]


def wait(ready: object, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.1)


def startup_s() -> float:
    """A fresh interpreter up to gputrain's parser: what each Cloud Run execution adds."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "scripts.cli", "reconcile", "--help"],
        check=True,
        capture_output=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return time.perf_counter() - start


def main() -> int:
    said: list[tuple[float, str]] = []
    quiet, table = ui.say, ui.table
    ui.say = lambda m: said.append((time.time(), m))  # type: ignore[assignment]
    ui.table = lambda *a, **k: None  # type: ignore[assignment]
    monkeypatch = pytest.MonkeyPatch()
    try:
        with TestBed() as tb, tempfile.TemporaryDirectory(prefix="gputrain-bench-") as tmp:
            factory = world_factory(tb, Path(tmp), monkeypatch)
            try:
                w = next(factory)(bucket=True)
                assert w.gcs is not None
                env = ["--env", f"STORAGE_EMULATOR_HOST={w.gcs.url}"]
                argv = ["run", "--stack", "e2e", "--yes", "--skip-preflight", "--detach"]
                assert w.run(*argv, *env, "--", *TRAIN) == 0
                wait(lambda: any(s >= 10 for s in w.checkpoints_in_bucket()))

                idle = []
                for _ in range(3):  # every VM up, nothing taken away
                    wall, cpu = time.perf_counter(), time.process_time()
                    assert w.run("reconcile", "--stack", "e2e") == 0
                    idle.append((time.perf_counter() - wall, time.process_time() - cpu))

                for zone in ZONES:  # every zone out of stock for one pass
                    w.runner.fail_stockout(zone, times=1)
                w.preempt("e2e-node-1")
                assert w.run("reconcile", "--stack", "e2e") == 0
                billing = len(w.compute.instances)

                said.clear()
                start = time.time()
                assert w.run("reconcile", "--stack", "e2e") == 0
                resumed = time.time() - start
                created = next(t for t, ln in said if ln.endswith("cluster created")) - start
                connected = next(t for t, ln in said if ln.startswith("connected to")) - start
                assert any("trains again" in ln for _, ln in said), said[-5:]
            finally:
                next(factory, None)
                monkeypatch.undo()
    finally:
        ui.say, ui.table = quiet, table

    boot = startup_s()
    wall = statistics.median(s for s, _ in idle)
    cpu = statistics.median(c for _, c in idle)
    every = parse_duration(DEFAULT_EVERY)
    per_day = idle_cost_per_day(every, wall + boot)
    print("laptop closed, test bed (bench/laptop_closed.py):")
    print(
        f"  preemption -> first resumed step, from the reconcile pass's start: {resumed:.1f} s "
        f"(re-creation incl. the test host's boot {created:.1f} s, host keys pinned and "
        f"connected {connected:.1f} s); the Scheduler tick's wait is not in it"
    )
    print(
        f"  idle pass: {wall:.2f} s wall, {cpu:.2f} s CPU (median of {len(idle)}; this process "
        f"with the fakes); interpreter start + imports {boot:.2f} s"
    )
    print(
        f"  idle day at reconcileEvery {DEFAULT_EVERY}: {86400 // every} passes x "
        f"{wall + boot:.1f} s x (1 vCPU x ${VCPU_SECOND_USD} + 0.5 GiB x ${GIB_SECOND_USD}) = "
        f"${per_day:.3f}/day at list price, before the free tier (SkyPilot's controller VM ~$6/day)"
    )
    print(f"  VMs billing between passes during a stock-out: {billing}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
