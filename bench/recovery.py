"""Spot recovery on the sshd test bed: how long from the preemption (every process on node 2
killed, the fake Compute API saying "preempted") to the first training step of the relaunched
run, and how many steps were trained twice.

Each round is a real `gputrain run --stack` (tests/support/stack_world.py: FakeStackRunner + fake
Compute server + Cloud Storage emulator on the bridge) of the tiny preset on 2 test hosts,
checkpointing every 10 steps; node 2 is preempted once a checkpoint at step >= 20 is in the bucket. What is
measured is the controller's path — detect, ask the API, stop the survivor, refresh + up, pin the
new host key, connect, verify, upload, relaunch, resume from the bucket — not GCE's VM boot (a
real re-created VM adds its boot time, minutes). Needs root and openssh-server (like the tests).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts import ui
from tests.support.stack_world import world_factory
from tests.support.testbed import TestBed

TRAIN = ["--preset", "tiny", "--steps", "200", "--checkpoint-every", "10", "--log-every", "1"]
TRAIN += ["--eval-batches", "0"]


# Where the time goes: the first line (after the kill) that marks the end of each phase.
PHASES = (
    ("failure seen", lambda ln: "failed (exit code" in ln),
    ("preemption confirmed", lambda ln: "preempted (" in ln and "recovering" in ln),
    ("VM re-created (refresh + up)", lambda ln: ln.endswith("cluster created")),
    ("host keys pinned, connected", lambda ln: ln.startswith("connected to")),
    ("verified, code synced, started", lambda ln: ln.startswith("run ") and " started on " in ln),
)


def one_round(tb: TestBed, said: list[tuple[float, str]]) -> tuple[float, int, list[float]]:
    """(seconds from the kill to the first resumed step, steps trained twice, phase ends)."""
    monkeypatch = pytest.MonkeyPatch()
    with tempfile.TemporaryDirectory(prefix="gputrain-bench-") as tmp:
        factory = world_factory(tb, Path(tmp), monkeypatch)
        try:
            w = next(factory)(bucket=True)
            assert w.gcs is not None
            killed: list[float] = []

            def preempt() -> None:
                killed.append(time.time())
                w.preempt("e2e-node-1")

            w.at_checkpoint(20, preempt)
            argv = ["run", "--stack", "e2e", "--yes", "--skip-preflight"]
            argv += ["--env", f"STORAGE_EMULATOR_HOST={w.gcs.url}", "--", "-m", "trainer.train"]
            rc = w.run(*argv, *TRAIN)
            assert rc == 0 and killed, f"the run failed (exit {rc}) or ended before a preemption"
            target = w.dir / "runs" / "stack-e2e"
            job = json.loads(
                (target / (target / "LAST_RUN").read_text().strip() / "job.json").read_text()
            )
            [r] = job["recoveries"]
            first_step = r["preempted_at"] + r["downtime_s"]
            after = [(t, ln) for t, ln in said if t >= killed[0]]
            ends = [next(t for t, ln in after if match(ln)) - killed[0] for _, match in PHASES]
            return first_step - killed[0], int(r["steps_repeated"]), ends
        finally:
            next(factory, None)
            monkeypatch.undo()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    said: list[tuple[float, str]] = []
    quiet, table = ui.say, ui.table
    results = []
    with TestBed() as tb:
        for i in range(args.rounds):
            ui.say = lambda m: said.append((time.time(), m))  # type: ignore[assignment]
            ui.table = lambda *a, **k: None  # type: ignore[assignment]
            try:
                results.append(one_round(tb, said))
            finally:
                ui.say, ui.table = quiet, table
            line = next(ln for _, ln in reversed(said) if ln.startswith("recovery 1/"))
            print(f"round {i + 1}: {results[-1][0]:.1f} s, {results[-1][1]} repeated | {line}")
    print(f"after the kill (median of {len(results)} rounds), s:")
    for j, (phase, _) in enumerate(PHASES):
        print(f"  {statistics.median(r[2][j] for r in results):5.1f}  {phase}")
    seconds = statistics.median(r[0] for r in results)
    print(
        f"  {seconds:5.1f}  first resumed step (torchrun + trainer start, resume from the bucket)"
    )
    repeated = statistics.median(r[1] for r in results)
    print(
        f"kill -> first resumed step: {seconds:.1f} s; steps trained twice: {repeated:g} (median;"
    )
    print("checkpoint every 10 steps, SIGKILL without the preemption notice)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
