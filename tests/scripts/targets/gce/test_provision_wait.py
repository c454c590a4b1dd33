"""Waiting for capacity and stepping down a capacity list (scripts/targets/gce/provision.py),
driven through the real zone and candidate failover against FakeStackRunner, whose resources the
fake Compute server reports until destroyed: nothing may be left billing while it waits."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from infra.gcp.compute import ComputeApi
from infra.gcp.sweep import sweep
from scripts.targets.gce.provision import (
    CapacityWait,
    ProvisioningError,
    down_the_ladder,
    provision_with_failover,
    step_line,
)
from tests.support.fake_compute import FakeCompute
from tests.support.fake_stack import FakeStackRunner

if TYPE_CHECKING:
    from scripts.targets.gce.target import GceTarget

A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"


class Clock:
    """A clock the waits advance: no test sleeps for real."""

    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds + 5  # and each round of `up` takes a while


@pytest.fixture
def runner(fake: FakeCompute) -> FakeStackRunner:
    return FakeStackRunner("dev", compute=fake, project=fake.project, zones=(A, B, C))


def wait(limit_s: float, clock: Clock) -> CapacityWait:
    return CapacityWait(limit_s, 30, 600, clock=clock.time, sleep=clock.sleep)


def test_every_zone_stocked_out_three_rounds_then_capacity_returns(
    runner: FakeStackRunner, fake: FakeCompute, api: ComputeApi
) -> None:
    for zone in (A, B, C):
        runner.fail_stockout(zone, times=3)
    clock, lines = Clock(), []
    left_while_waiting: list[int] = []

    def sleep(seconds: float) -> None:
        left_while_waiting.append(len(sweep(fake.project, "dev", api=api)))
        clock.sleep(seconds)

    waiter = CapacityWait(600, 30, 600, clock=clock.time, sleep=sleep)
    zone, outputs = waiter.run(lambda: provision_with_failover(runner, [A, B, C]), lines.append)
    assert zone == A and len(outputs["nodes"]) == 2
    assert [c[1] for c in runner.calls if c[0] == "up"] == [A, B, C] * 3 + [A]
    assert clock.slept == [30, 60, 120]  # backoff doubles
    assert left_while_waiting == [0, 0, 0]  # every failed attempt destroyed before each wait
    assert len(lines) == 3 and all(line.count("\n") == 0 for line in lines)
    assert lines[0].startswith(f"no capacity (round 1: {A}, {B}, {C} stocked out); next try at ")
    assert "(in 30 s), waiting up to 10m more; nothing is billing; Ctrl-C stops" in lines[0]
    assert lines[2].startswith("no capacity (round 3:") and "(in 120 s)" in lines[2]


def test_the_wait_ends_with_the_last_stockout_and_how_long_it_waited(
    runner: FakeStackRunner, fake: FakeCompute, api: ComputeApi
) -> None:
    for zone in (A, B):
        runner.fail_stockout(zone, times=100)
    clock = Clock()
    with pytest.raises(ProvisioningError) as err:
        wait(200, clock).run(lambda: provision_with_failover(runner, [A, B]), lambda _l: None)
    msg = str(err.value)
    assert msg.startswith("could not create the cluster: no capacity in any of your zones")
    assert msg.endswith(
        "waited 3m20s for capacity (--wait-for-capacity) over 4 round(s); still none"
    )
    assert sum(clock.slept) <= 200 and clock.slept[-1] < 240  # the last pause fits the limit
    assert sweep(fake.project, "dev", api=api) == []


def test_quota_is_not_waited_for_and_no_wait_means_one_round(runner: FakeStackRunner) -> None:
    runner.fail_quota(A, "NVIDIA_L4_GPUS")
    clock = Clock()
    with pytest.raises(ProvisioningError, match="quota exceeded"):
        wait(600, clock).run(lambda: provision_with_failover(runner, [A, B]), lambda _l: None)
    runner.fail_stockout(B)
    with pytest.raises(ProvisioningError, match="no capacity"):
        wait(0, clock).run(lambda: provision_with_failover(runner, [B]), lambda _l: None)
    assert clock.slept == []


def test_a_capacity_list_steps_down_after_stockouts_with_one_line(
    runner: FakeStackRunner,
) -> None:
    for zone in (A, B):
        runner.fail_stockout(zone, times=5, capacity="spot")
    prices = {"spot": 0.341, "on-demand": 0.854}
    lines: list[str] = []

    def attempt(mode: str) -> tuple[str, dict[str, object]]:
        runner.set_config("gputrain:capacityInUse", mode)
        return provision_with_failover(runner, [A, B])

    zone, _ = down_the_ladder(["spot", "on-demand"], attempt, lines.append, prices.get)
    assert zone == A and runner.config["gputrain:capacityInUse"] == "on-demand"
    assert lines == [
        "no spot capacity anywhere tried: trying on-demand next, $0.85/h instead of $0.34/h "
        "(+150 % per hour)"
    ]
    assert step_line("spot", "flex-start", {"spot": 1.0}.get).endswith(
        "unknown/h instead of $1.00/h"
    )


def test_a_ladder_whose_every_mode_stocks_out_reports_every_attempt(
    runner: FakeStackRunner,
) -> None:
    runner.fail_stockout(A, times=5)

    def attempt(mode: str) -> tuple[str, dict[str, object]]:
        runner.set_config("gputrain:capacityInUse", mode)
        return provision_with_failover(runner, [A])

    with pytest.raises(ProvisioningError) as err:
        down_the_ladder(["spot", "on-demand"], attempt, lambda _l: None, lambda _m: None)
    assert [a.zone for a in err.value.attempts] == [A, A]


def test_a_flex_start_up_says_it_cannot_queue_and_a_stockout_fails_at_once(
    fake: FakeCompute, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pulumi-gcp's Instance cannot send requestValidForDuration, so GCE allocates Flex-start
    capacity only if it is free now: `up` says so, and a stock-out fails the round at once
    (waiting is --wait-for-capacity's, tested above)."""
    from scripts.cli import main
    from scripts.settings import Settings
    from scripts.targets.gce.clients import GceClients
    from tests.support.pulumi_mocks import ROOT, TEST_PUBLIC_KEY, TEST_SOURCE_RANGE

    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.flex.yaml").write_text(
        "config:\n  gcp:project: gputrain-test\n  gputrain:machineType: a3-megagpu-8g\n"
        "  gputrain:capacity: flex-start\n  gputrain:maxRunDuration: 1d\n"
        f"  gputrain:zones: [{A}, {B}]\n  gputrain:sshPublicKey: {TEST_PUBLIC_KEY}\n"
        f"  gputrain:sshSourceRanges: [{TEST_SOURCE_RANGE}]\n"
    )
    runner = FakeStackRunner("flex", compute=fake, project=fake.project, zones=(A, B))
    for zone in (A, B):
        runner.fail_stockout(zone, times=100)
    gce = GceClients(
        runner_for=lambda s, r: runner,
        compute_endpoint=fake.url,
        retry_pause_s=0,
    )
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    argv = ["up", "--stack", "flex", "--yes", "--skip-preflight"]
    assert main(argv, settings, gce) == 1
    out, err = capsys.readouterr()
    assert (
        "up: Flex-start does not queue here: pulumi-gcp cannot send requestValidForDuration" in out
    )
    assert "no capacity in any of your zones" in err
    assert [c[1] for c in runner.calls if c[0] == "up"] == [A, B]  # one round, at once


def _partial_rounds(runner: FakeStackRunner, clock: Clock, zones: list[str]) -> object:
    """Each round's `up` makes one VM of two, then stocks out; its destroy takes 2 minutes."""
    for zone in zones:
        runner.fail_partial(zone, created=1)
        runner.failures[zone].times = 100
    destroy = runner.destroy

    def slow_destroy(*args: object, **kwargs: object) -> None:
        clock.now += 120
        destroy(*args, **kwargs)  # type: ignore[arg-type]

    runner.destroy = slow_destroy  # type: ignore[method-assign]
    return lambda: provision_with_failover(runner, zones, expected_nodes=2, clock=clock.time)


def test_a_partial_create_while_waiting_says_what_it_made_and_that_it_billed(
    runner: FakeStackRunner,
) -> None:
    """A partial create is a stock-out worth waiting out, but its VM billed until the destroy:
    the round's line says so, with what the wait's partial creates billed so far."""
    clock, lines = Clock(), []
    attempt = _partial_rounds(runner, clock, [A])
    waiter = CapacityWait(
        400, 30, 600, clock=clock.time, sleep=clock.sleep, vm_hourly=lambda a: 0.9
    )
    with pytest.raises(ProvisioningError) as err:
        waiter.run(attempt, lines.append)  # type: ignore[arg-type]
    assert lines[0].startswith(
        f"no capacity (round 1: {A} stocked out; its partial creates made and billed 1 VM in "
        f"{A} for 2m, then destroyed (this wait so far: 1 VM(s), 2m, about $0.03)); next try"
    )
    assert "(this wait so far: 2 VM(s), 4m, about $0.06))" in lines[1]
    assert lines[0].endswith("; nothing is billing; Ctrl-C stops")  # destroyed before the wait
    text = str(err.value)
    assert f"  {A}: stockout: " in text and "; 1 VM made, billed 2m until destroyed" in text
    assert text.endswith("still none (this wait so far: 3 VM(s), 6m, about $0.09)")
    assert runner.existing == []


def test_with_a_budget_the_wait_stops_before_partial_creates_could_pass_it(
    runner: FakeStackRunner,
) -> None:
    """$1 of room beside the run's worst case, $0.30 a round (one $9/h VM for 2 minutes): two
    rounds bill $0.60 and a third could reach $0.90; a fourth could pass $1, so the wait stops
    after the third round instead of spending what the run may not."""
    from scripts.targets.gce.partial import SpendRoom

    clock, lines = Clock(), []
    attempt = _partial_rounds(runner, clock, [A])
    room = SpendRoom(1.0, "--budget 21", 20.0)
    waiter = CapacityWait(
        86400, 30, 600, clock=clock.time, sleep=clock.sleep, vm_hourly=lambda a: 9.0, room=room
    )
    with pytest.raises(ProvisioningError) as err:
        waiter.run(attempt, lines.append)  # type: ignore[arg-type]
    assert len(lines) == 2 and [c[1] for c in runner.calls if c[0] == "up"] == [A, A, A]
    assert str(err.value).endswith(
        "stopped waiting for capacity after 3 round(s): its partial creates billed (this wait so "
        "far: 3 VM(s), 6m, about $0.90), and another round like the dearest so far ($0.30) "
        "could pass --budget 21, which leaves $1.00 beside the run's worst case $20.00"
    )
    assert runner.existing == []


def test_the_round_that_creates_the_cluster_counts_the_partial_creates_before_it(
    runner: FakeStackRunner,
) -> None:
    """Round 1: A made a VM, stocked out, B stocked out; round 2: A made a VM again, then B
    made the cluster. Both of A's VMs billed: the wait's count has both, and one line says so
    (the second round's is in no line of a failed round)."""
    clock, lines = Clock(), []
    runner.fail_partial(A, created=1)
    runner.failures[A].times = 2
    runner.fail_stockout(B)
    waiter = CapacityWait(
        600, 30, 600, clock=clock.time, sleep=clock.sleep, vm_hourly=lambda a: 0.9
    )
    zone, _ = waiter.run(
        lambda: provision_with_failover(
            runner, [A, B], expected_nodes=2, clock=clock.time, failed=waiter.failed
        ),
        lines.append,
    )
    assert zone == B and [c[1] for c in runner.calls if c[0] == "up"] == [A, B, A, B]
    assert (waiter.spent.vms, waiter.spent.usd) == (2, pytest.approx(2 * 0.9 / 60))
    assert (
        lines[-1]
        == "partial creates before the cluster was created billed 2 VM(s), 2m, about $0.03"
    )


def test_a_mode_that_made_vms_counts_when_the_next_mode_of_the_list_gets_the_cluster(
    runner: FakeStackRunner,
) -> None:
    """`capacity: [spot, on-demand]`, no wait: spot's `up` in A made a VM and stocked out,
    on-demand's made the cluster. The spot VM billed all the same."""
    runner.fail_partial(A, created=1)
    runner.failures[A].capacity = "spot"
    waiter, lines = CapacityWait(0, vm_hourly=lambda a: 0.9), []

    def attempt(mode: str) -> tuple[str, dict[str, object]]:
        runner.set_config("gputrain:capacityInUse", mode)
        return provision_with_failover(runner, [A], expected_nodes=2, failed=waiter.failed)

    def ladder() -> tuple[str, dict[str, object]]:
        return down_the_ladder(["spot", "on-demand"], attempt, lines.append, {}.get)

    zone, _ = waiter.run(ladder, lines.append)
    assert zone == A and runner.config["gputrain:capacityInUse"] == "on-demand"
    assert (waiter.spent.vms, waiter.spent.usd) == (1, pytest.approx(0.9 / 60))
    assert lines[-1].endswith("billed 1 VM(s), 1m, about $0.01")


def test_up_holds_its_partial_creates_to_the_budget_a_recovery_to_the_watchdog(
    runner: FakeStackRunner, tmp_path: Path
) -> None:
    """`up`'s wait gets the budget's room beside the dearest worst case it may create; each VM
    is priced as the caps price it (disks included); a recovery's wait gets no room (the
    watchdog counts the whole cluster's rate while it recovers)."""
    from scripts.run_plan import worst_hourly
    from scripts.settings import Settings
    from scripts.targets.base import RunOptions
    from scripts.targets.gce.clients import GceClients
    from scripts.targets.gce.provision import Attempt
    from scripts.targets.gce.target import GceTarget, capacity_wait
    from tests.support.pulumi_mocks import ROOT

    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.w.yaml").write_text(
        "config:\n  gputrain:machineType: g2-standard-8\n  gputrain:nodes: 2\n"
        f"  gputrain:zones: [{A}, {B}]\n  gputrain:maxRunDuration: 2h\n"
        "  gputrain:waitForCapacity: 1h\n  gputrain:budget: 10\n"
    )
    target = GceTarget("w", Settings(root=tmp_path), GceClients(runner_for=lambda s, r: runner))
    spec = target.spec()
    rate = worst_hourly(spec)
    assert rate is not None
    waiter = capacity_wait(target.context(spec, RunOptions()), "nothing is billing", [A, B])
    assert waiter.room is not None and waiter.room.budget == "gputrain:budget 10"
    assert (waiter.room.usd, waiter.room.worst_usd) == pytest.approx((10 - rate * 2, rate * 2))
    assert waiter.vm_hourly(Attempt(A, "stockout", "", vms=1)) == pytest.approx(rate / 2)
    given = capacity_wait(target.context(spec, RunOptions(budget=12)), "x", [A])
    assert given.room is not None and given.room.budget == "--budget 12"
    assert (
        capacity_wait(target.context(spec, RunOptions()), "the surviving VM(s) bill").room is None
    )
    unwaited = target.context(spec, RunOptions(wait_for_capacity_s=0))
    assert capacity_wait(unwaited, "nothing is billing", [A]).room is None


def test_a_vm_pulumi_reports_made_is_counted_from_its_progress_line() -> None:
    """From the line that says it was created to the destroy (here: now), and a minute at
    least, as Compute Engine charges a VM that ran (one made and destroyed 20 s later)."""
    from scripts.targets.gce.partial import MadeVMs

    now = [100.0]
    passed: list[str] = []
    made = MadeVMs(passed.append, lambda: now[0])
    for line in (
        " +  gcp:compute:Instance dev-node-0 creating (0s) ",
        " +  gcp:compute:Instance dev-node-0 created (38s) ",
        " +  gcp:compute:Instance dev-node-1 creating failed error: ZONE_RESOURCE_POOL_EXHAUSTED",
        "Resources:\n    + 5 created",
    ):
        made(line)
    now[0] = 160.0
    from scripts.targets.gce.provision import Attempt

    billed = made.billed(Attempt(A, "stockout", "x"), left_up=True)
    assert (billed.vms, billed.vm_s, billed.left_up) == (1, 60.0, True)
    assert billed.billed == "; 1 VM made, billed 1m so far, left up for the next try"
    assert len(passed) == 4  # every line still reaches the caller's output
    brief = MadeVMs(None, lambda: now[0])
    brief(" +  gcp:compute:Instance dev-node-0 created (41s) ")
    now[0] += 20
    assert brief.billed(Attempt(A, "stockout", "x"), left_up=False).vm_s == 60.0


def test_what_ups_partial_creates_billed_goes_to_the_runs_cost_record(
    runner: FakeStackRunner, tmp_path: Path
) -> None:
    """`up` waited out a round whose partial create made one VM of two, then destroyed it: the
    cluster it hands over comes with what that VM billed (the minute Compute Engine charges at
    least), at its rate as the caps price it, for the session and the run's cost record."""
    from scripts.run_plan import worst_hourly
    from scripts.settings import Settings
    from scripts.targets.base import RunOptions
    from scripts.targets.gce.clients import GceClients
    from scripts.targets.gce.target import GceTarget
    from tests.support.pulumi_mocks import ROOT

    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.w.yaml").write_text(
        "config:\n  gputrain:machineType: g2-standard-8\n  gputrain:nodes: 2\n"
        f"  gputrain:zones: [{A}]\n  gputrain:waitForCapacity: 1h\n"
    )
    runner.fail_partial(A, created=1)  # once: the next round gets the cluster
    clients = GceClients(runner_for=lambda s, r: runner, capacity_pause_s=(0.0, 0.0))
    target = GceTarget("w", Settings(root=tmp_path), clients)
    ctx = target.context(target.spec(), RunOptions(skip_preflight=True))
    spec, outputs, partial_usd = target.prepare(ctx)()
    assert outputs["zone"] == A and [c[1] for c in runner.calls if c[0] == "up"] == [A, A]
    rate = worst_hourly(spec)
    assert rate is not None and partial_usd == pytest.approx(rate / 2 / 60)  # a VM's minute


def _three_nodes(tmp_path: Path, runner: FakeStackRunner, fake: FakeCompute) -> GceTarget:
    """A 3-node g2 stack of a 1 h maxRunDuration over `runner`, zones A then B, no wait."""
    from scripts.settings import Settings
    from scripts.targets.gce.clients import GceClients
    from scripts.targets.gce.target import GceTarget
    from tests.support.fake_stack import default_node_factory
    from tests.support.pulumi_mocks import ROOT

    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.dev.yaml").write_text(
        f"config:\n  gcp:project: {fake.project}\n  gputrain:machineType: g2-standard-8\n"
        f"  gputrain:nodes: 3\n  gputrain:zones: [{A}, {B}]\n  gputrain:maxRunDuration: 1h\n"
    )
    runner.node_factory = default_node_factory("dev", 3)
    clients = GceClients(runner_for=lambda s, r: runner, compute_endpoint=fake.url)
    return GceTarget("dev", Settings(root=tmp_path, runs_dir=tmp_path / "runs"), clients)


def test_vms_a_zone_made_before_the_next_made_the_cluster_count_for_the_run(
    runner: FakeStackRunner,
    fake: FakeCompute,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Zone A made 2 of the 3 VMs, stocked out and was destroyed; zone B made the cluster in
    the same round, no wait. What A's VMs billed (a minute each, at a third of the cluster's
    rate) is the run's all the same: in its cost record, its summary's estimate and the budget
    its head's watchdog holds, which a run whose worst case A's spend takes past the budget
    reaches that much sooner."""
    from infra.outputs import parse_stack_outputs
    from scripts import lifecycle
    from scripts.cost.ledger import record_of
    from scripts.job.records import JobResult
    from scripts.run_plan import worst_hourly
    from scripts.targets.base import RunOptions
    from scripts.targets.gce.autodown import stack_autodown
    from scripts.targets.gce.keys import store_new_keypair

    target = _three_nodes(tmp_path, runner, fake)
    store_new_keypair(runner, "dev")
    runner.fail_partial(A, created=2)
    rate = worst_hourly(target.spec())
    assert rate is not None
    a_usd = 2 * (rate / 3) / 60  # A's two VMs, a minute each
    budget = rate + a_usd / 2  # the run's worst case (1 h) fits, not beside A's spend
    ctx = target.context(target.spec(), RunOptions(skip_preflight=True, budget=budget))
    with target.create(ctx, target.prepare(ctx)) as session:
        assert [c[1] for c in runner.calls if c[0] == "up"] == [A, B]
        assert session.partial_usd == pytest.approx(a_usd)
        record = record_of(target.spec(), session, "r1", None)
        out = parse_stack_outputs(runner.outputs())
        watch = stack_autodown(
            ctx.spec, out, "gs://b/", ctx.opts, ctx.clients, 0.0, session.partial_usd
        )
    said = capsys.readouterr().out
    assert "partial creates before the cluster was created billed 2 VM(s), 2m, about $" in said
    assert record.partial_usd == pytest.approx(a_usd) and record.zones == (B,)
    hourly = record.hourly_usd
    assert hourly is not None
    assert record.estimated_usd == pytest.approx(hourly * record.billed_s / 3600 + a_usd)
    result = JobResult("r1", True, {"n0": 0}, 1.0, tmp_path)
    cost = lifecycle.summarize(
        result, hourly_usd=rate, started=0.0, billed_s=60.0, partial_usd=session.partial_usd
    )
    assert cost == pytest.approx(rate / 60 + a_usd)
    assert f"${a_usd:.2f} more for what `up`'s partial creates billed" in capsys.readouterr().out
    assert watch is not None and watch.budget is not None and watch.ledger is not None
    assert watch.ledger["partial_usd"] == pytest.approx(a_usd)
    assert watch.budget.before_usd == pytest.approx(a_usd)
    # the watchdog stops it before maxRunDuration: A's spend and the run's hour pass the budget
    late = 3600 - watch.budget.interval_s - 1
    assert watch.budget.reached(late)
    assert not dataclasses.replace(watch.budget, before_usd=0.0).reached(late)
