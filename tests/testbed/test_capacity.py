"""Waiting for capacity and capacity lists end to end: `gputrain up`/`run --stack` on the sshd
test bed, with the fake stack's `up` stocked out as GCE reports it
(tests/support/stack_world.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.stack_world import ZONES, World, assert_torn_down

pytestmark = [pytest.mark.testbed, pytest.mark.filterwarnings("ignore:Unable to enable fault")]


def ups(w: World) -> list[str]:
    return [c[1] for c in w.runner.calls if c[0] == "up"]


def test_up_waits_out_three_rounds_of_stockouts_and_gets_the_cluster(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    w.gce.capacity_pause_s = (0.05, 0.2)
    for zone in ZONES:
        w.runner.fail_stockout(zone, times=3)
    rc = w.run("up", "--stack", "e2e", "--yes", "--skip-preflight", "--wait-for-capacity", "10m")
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    assert ups(w) == [*ZONES] * 3 + [ZONES[0]]
    waits = [line for line in out.splitlines() if line.startswith("no capacity (round")]
    assert len(waits) == 3 and all(", ".join(ZONES) + " stocked out" in x for x in waits)
    assert all("nothing is billing" in x for x in waits)
    assert "up: cluster ready in us-central1-a" in out
    assert sorted(w.runner.existing) == ["e2e-node-0", "e2e-node-1"]
    assert w.run("down", "--stack", "e2e") == 0
    assert_torn_down(w)


def test_a_capacity_list_steps_from_spot_to_on_demand_with_its_line(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(settings={"spot": None, "capacity": "[spot, on-demand]"})
    for zone in ZONES:
        w.runner.fail_stockout(zone, times=9, capacity="spot")
    rc = w.run_job("done")
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    assert ups(w) == [*ZONES, ZONES[0]]
    [step] = [line for line in out.splitlines() if line.startswith("no spot capacity")]
    assert step.startswith("no spot capacity anywhere tried: trying on-demand next, $")
    assert "/h instead of $" in step and "% per hour)" in step
    written = [c[2] for c in w.runner.calls if c[:2] == ("set_config", "gputrain:capacityInUse")]
    assert written == ["spot", "on-demand"]  # once per mode tried, just before its `up`
    assert_torn_down(w)


# ---- a recovery that meets stock-outs waits, then resumes -------------------------------------


def final_loss(w: World) -> tuple[float, dict[str, Any]]:
    target = w.dir / "runs" / "stack-e2e"
    run_dir = target / (target / "LAST_RUN").read_text().strip()
    summary = json.loads((run_dir / "e2e-node-0" / "summary.json").read_text())
    [recovery] = json.loads((run_dir / "job.json").read_text())["recoveries"]
    return float(summary["final_loss"]), recovery


def test_a_spot_recovery_that_meets_two_stockouts_waits_and_resumes(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(bucket=True)  # the trainer's stand-in: the subject is the wait, not the resume
    w.gce.capacity_pause_s = (0.05, 0.2)

    def preempt_into_a_stockout() -> None:
        for zone in ZONES:
            w.runner.fail_stockout(zone, times=2)
        w.preempt("e2e-node-1")

    t = w.at_checkpoint(20, preempt_into_a_stockout)
    rc = w.run_steps("--wait-for-capacity", "10m")
    t.join(timeout=5)
    out = capsys.readouterr().out
    assert rc == 0, out[-4000:]
    assert ups(w) == [ZONES[0], *ZONES, *ZONES, ZONES[0]]
    waits = [line for line in out.splitlines() if line.startswith("no capacity (round")]
    assert len(waits) == 2 and all("the surviving VM(s) stay up and bill" in x for x in waits)
    [line] = [ln for ln in out.splitlines() if ln.startswith("recovery 1/3: ")]
    assert "e2e-node-1 preempted at" in line and "resumed from step" in line
    _, recovery = final_loss(w)
    assert recovery["resumed_from"] >= 20
    assert_torn_down(w)


# ---- recovery beyond spot ----------------------------------------------------------------------


def test_an_on_demand_node_lost_to_a_host_error_is_recovered_with_the_same_loss(
    world: Callable[..., World],
    uninterrupted: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """GCE records compute.instances.hostError, the VM is gone and every process on it died
    without a word: the run is recovered as a preemption is (the default --max-recoveries
    counts these on any capacity) and ends with the uninterrupted run's loss."""
    w = world(bucket=True, settings={"spot": "false"})

    def host_error() -> None:
        w.compute.preempt_instance(
            "e2e-node-1",
            ZONES[0],
            delete_after_s=0.3,
            kind="compute.instances.hostError",
            message="Instance terminated by Compute Engine due to a host error.",
        )
        w.bed.kill_processes(w.node_hosts["e2e-node-1"].name)

    t = w.at_checkpoint(20, host_error)
    rc = w.run_trainer()
    t.join(timeout=5)
    out = capsys.readouterr().out
    assert rc == 0, out[-4000:]
    [line] = [ln for ln in out.splitlines() if ln.startswith("recovery 1/3: ")]
    assert "e2e-node-1 lost to a host error at" in line and "us-central1-a" in line
    assert "compute.instances.hostError at" in out
    assert ups(w) == [ZONES[0], ZONES[0]]
    loss, recovery = final_loss(w)
    assert recovery["nodes"] == ["e2e-node-1"] and recovery["resumed_from"] >= 20
    assert (
        loss == uninterrupted["final_loss"]
    )  # TRAIN never interrupted (tests/testbed/conftest.py)
    assert_torn_down(w)
