"""The lifecycle around a target (scripts/lifecycle.py) with a stand-in target and session: what a
run costs counts from when its machines bill, not from when the command started."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from scripts import lifecycle
from scripts.cost.ledger import read
from scripts.job.records import Job, JobResult
from scripts.settings import Settings
from scripts.targets.base import Capabilities, Declared, Footprint, RunOptions

UP_S = 1.5  # the prompt, an image build, a wait for capacity: before any machine bills
TRAIN_S = 0.3


class Session:
    """Machines that bill from when `provisioned` hands them out, at $3600/h ($1 a second)."""

    name = "stack-lab"
    hourly_usd = 3600.0
    node_count = 1
    notifier = None
    spec = None
    partial_usd = 0.0

    def __init__(self) -> None:
        self.billed_since: float | None = time.time()

    def verify(self, fabric: bool = False) -> None:
        pass

    def running(self) -> dict[str, list[str]]:
        return {}

    def footprint(self) -> Footprint:
        return Footprint(1, "g2-standard-8", 1)

    def ledger_bucket(self) -> None:
        return None

    def run_job(self, job: Job, results_dir: Path, guard: object) -> JobResult:
        time.sleep(TRAIN_S)
        results_dir.mkdir(parents=True, exist_ok=True)
        return JobResult(job.run_id, True, {"n0": 0}, TRAIN_S, results_dir)


class SlowToCome:
    """A target whose machines take UP_S to come (nothing bills meanwhile)."""

    name = "stack-lab"
    capabilities = Capabilities()

    def declared(self) -> Declared:
        return Declared(name=self.name, label="lab")

    @contextmanager
    def provisioned(self, opts: object, guard: object) -> Iterator[Session]:
        time.sleep(UP_S)
        yield Session()


def test_a_runs_cost_counts_from_when_its_machines_bill_not_from_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ledger's record and the summary's estimate charge the machines' time (TRAIN_S), not
    the wait before them (UP_S); the summary names the command's wall clock apart."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("print('hi')\n")
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    before = time.time()
    opts = RunOptions(entry=("job.py",))
    assert lifecycle.run(SlowToCome(), opts, settings, create=True) is not None  # type: ignore[arg-type]
    (record,) = read(tmp_path / "runs").records
    # the session's start (rounded to the ms), not the command's
    assert record.start >= before + UP_S - 0.001
    assert TRAIN_S <= record.elapsed_s < UP_S and record.estimated_usd == pytest.approx(
        record.elapsed_s, abs=0.1
    )
    out = capsys.readouterr().out
    elapsed = re.search(r"elapsed \(the command\)\s+(\d+) s", out)
    cost = re.search(r"estimated cost\s+\$([\d.]+) at \$3600.00/h", out)
    assert elapsed and int(elapsed.group(1)) >= 2, out  # UP_S + TRAIN_S, rounded
    assert cost and TRAIN_S <= float(cost.group(1)) < UP_S, out
    assert re.search(r"billed time \(the machines\)\s+\d+ s", out), out


def test_the_summarys_estimate_adds_what_ups_partial_creates_billed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run summary's estimate is the cost record's: the rate over the machines' time, plus
    what the partial creates of `up` billed (a wait's rounds, the attempts before the one that
    made the cluster), said as such."""
    result = JobResult("r1", True, {"n0": 0}, 1.0, tmp_path)
    cost = lifecycle.summarize(
        result, hourly_usd=3600.0, started=time.monotonic(), billed_s=2.0, partial_usd=0.5
    )
    assert cost == pytest.approx(2.5)
    out = capsys.readouterr().out
    assert "$2.50 at $3600.00/h; $0.50 more for what `up`'s partial creates billed" in out
