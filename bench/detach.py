"""`gputrain run --stack --detach` on the sshd test bed: how long after the job's first training
step the command returns (target: <= 10 s), and how long after the job's end autodown has deleted
every VM (target: within `autodown`, 30 s here instead of the 1 min floor).

Each round is a real detached run (tests/support/stack_world.py: FakeStackRunner, the fake
Compute API and a Cloud Storage emulator on the bridge, a fake metadata server for the VMs'
token) of the tiny preset on 2 test hosts, then `down`. The first step's time is read off the
head's own disk (its torchrun.log, polled every 20 ms), independently of the controller. Needs
root and openssh-server.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts import ui
from tests.support.fake_metadata import FakeMetadata
from tests.support.stack_world import FirstStep, world_factory
from tests.support.testbed import TestBed

AUTODOWN_S = 30.0
TRAIN = ["-m", "trainer.train", "--preset", "tiny", "--steps", "60", "--log-every", "1"]
TRAIN += ["--eval-batches", "0"]


def one_round(tb: TestBed) -> tuple[float, float]:
    """(s from the first step to the return, s from the job's end to every VM deleted)."""
    monkeypatch = pytest.MonkeyPatch()
    with tempfile.TemporaryDirectory(prefix="gputrain-bench-") as tmp:
        factory = world_factory(tb, Path(tmp), monkeypatch)
        try:
            w = next(factory)(bucket=True)
            assert w.gcs is not None
            w.gce.autodown_s = AUTODOWN_S
            email = f"gputrain-e2e@{w.runner.project}.iam.gserviceaccount.com"
            with FakeMetadata(email, w.runner.project, host=tb.bridge_address) as md:
                w.compute.on_delete = lambda _z, name: tb.kill_processes(w.node_hosts[name].name)
                env = [
                    f"STORAGE_EMULATOR_HOST={w.gcs.url}",
                    f"GCE_METADATA_HOST={md.address}",
                    f"GCE_METADATA_IP={md.address}",
                    f"GPUTRAIN_COMPUTE_ENDPOINT={w.compute.url}",
                ]
                step = FirstStep(w)
                argv = ["run", "--stack", "e2e", "--yes", "--skip-preflight", "--detach"]
                rc = w.run(*argv, *[a for e in env for a in ("--env", e)], "--", *TRAIN)
                returned = time.time()
                step.stop()
                assert rc == 0 and step.at, f"the run failed (exit {rc}) or no step was seen"
                rid = (w.dir / "runs" / "stack-e2e" / "LAST_RUN").read_text().strip()
                code = w.node_hosts["e2e-node-0"].dir / "home" / ".gputrain/runs" / rid / "exitcode"
                while not w.compute.deletes or w.compute.instances:
                    time.sleep(0.1)
                gone = time.time()
                ended = float(code.read_text().split()[1])
                w.run("down", "--stack", "e2e")
            return returned - step.at, gone - ended
        finally:
            next(factory, None)
            monkeypatch.undo()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    quiet, table = ui.say, ui.table
    results = []
    with TestBed() as tb:
        for i in range(args.rounds):
            ui.say = lambda m: None  # type: ignore[assignment]
            ui.table = lambda *a, **k: None  # type: ignore[assignment]
            try:
                results.append(one_round(tb))
            finally:
                ui.say, ui.table = quiet, table
            print(
                f"round {i + 1}: returned {results[-1][0]:.2f} s after the first step; VMs "
                f"deleted {results[-1][1]:.1f} s after the job's end"
            )
    back = statistics.median(r[0] for r in results)
    gone = statistics.median(r[1] for r in results)
    print(
        f"run --detach returns {back:.2f} s after the first training step (target <= 10 s); "
        f"autodown deleted every VM {gone:.1f} s after the job's end (autodown {AUTODOWN_S:.0f} s; "
        f"median of {len(results)} rounds)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
