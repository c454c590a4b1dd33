"""Waiting for capacity and capacity lists end to end: `gputrain up`/`run --stack` on the sshd
test bed, with the fake stack's `up` stocked out as GCE reports it (tests/stack_world.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.stack_world import ZONES, World, assert_torn_down

pytestmark = pytest.mark.testbed


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


def test_without_a_wait_a_stockout_everywhere_ends_at_once(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    for zone in ZONES:
        w.runner.fail_stockout(zone, times=3)
    rc = w.run("up", "--stack", "e2e", "--yes", "--skip-preflight")
    assert rc == 1 and "no capacity in any of your zones" in capsys.readouterr().err
    assert ups(w) == [*ZONES]
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
    assert [c[2] for c in w.runner.calls if c[:2] == ("set_config", "gputrain:capacityInUse")] == [
        "spot",
        "spot",
        "on-demand",
    ]
    assert_torn_down(w)
