"""`gpus` stacks: `plan` checks the ranked candidates against the fake Compute server, and `up`
fails over down them with the fake stack runner (another zone, region or machine type)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from infra import catalog
from infra.gcp.compute import ComputeApi
from infra.gcp.sweep import sweep
from infra.offers import Candidate, candidate_label, parse_request, resolve
from infra.ttl import RECREATE_IMAGE_ENV, Recreation
from scripts.cli import main
from scripts.settings import Settings
from scripts.targets.gce.clients import GceClients
from scripts.targets.gce.provision import ProvisioningError, next_candidate, provision_candidates
from tests.support.fake_compute import FakeCompute
from tests.support.fake_stack import FakeStackRunner
from tests.support.pulumi_mocks import ROOT, TEST_PUBLIC_KEY

H100_16 = ["us-central1", "us-east4", "europe-west4"]


def _ranked(request: str, *, spot: bool = True, **where: list[str]) -> list[Candidate]:
    return resolve(parse_request(request), spot=spot, **where)  # type: ignore[arg-type]


def _ups(runner: FakeStackRunner) -> list[tuple[str, str]]:
    """(candidate, zone) of every `up`, from the config the runner had at that moment."""
    out, config = [], {}
    for call in runner.calls:
        if call[0] == "set_config":
            config[call[1]] = call[2]
        elif call[0] == "up":
            out.append((config["gputrain:candidate"], call[1]))
    return out


@pytest.fixture
def runner(fake: FakeCompute) -> FakeStackRunner:
    return FakeStackRunner("gpus", compute=fake, project=fake.project)


# ---- up: the ranked walk ---------------------------------------------------------------------


def test_first_candidate_stocked_out_then_the_second_is_created(
    runner: FakeStackRunner, fake: FakeCompute, api: ComputeApi
) -> None:
    ranked = _ranked("H100:16", regions=H100_16)
    first, second = ranked[0], ranked[1]
    runner.fail_stockout(first.zone)
    events: list[str] = []
    chosen, outputs, attempts = provision_candidates(runner, ranked, on_event=events.append)
    assert chosen == second and outputs["zone"] == second.zone
    assert _ups(runner) == [("a3-highgpu-8g x 2", first.zone), ("a3-highgpu-8g x 2", second.zone)]
    assert [a.outcome for a in attempts] == ["stockout", "created"]
    assert runner.call_names()[:4] == ["set_config", "set_config", "up", "destroy"]
    assert f"stockout of a3-highgpu-8g in {first.zone}: trying a3-highgpu-8g x 2 in " in "\n".join(
        events
    )
    left = sweep(fake.project, "gpus", api=api)  # only the live cluster is left
    assert {x.location for x in left if x.kind == "instance"} == {second.zone}


def test_a_stockout_blocks_that_machine_type_in_that_zone_only() -> None:
    """80GB+:8: after a2-ultragpu-8g stocks out in both its zones, a3-highgpu-8g is tried in a
    zone that already failed — another machine type there is another pool."""
    ranked = _ranked("80GB+:8", regions=["us-central1"])
    a2 = [c for c in ranked if c.machine_type == "a2-ultragpu-8g"]
    assert ranked[: len(a2)] == a2  # cheapest first
    blocked = {(c.machine_type, c.zone) for c in a2}
    nxt = next_candidate(ranked, set(a2), blocked, set())
    assert nxt is not None and nxt.machine_type == "a3-highgpu-8g" and nxt.zone == a2[0].zone


def test_machine_type_changes_after_its_zones_stock_out(fake: FakeCompute) -> None:
    from tests.support.fake_stack import default_node_factory

    runner = FakeStackRunner(
        "gpus", compute=fake, project=fake.project, node_factory=default_node_factory("gpus", 1)
    )
    ranked = _ranked("80GB+:8", regions=["us-central1"])
    a2_zones = [c.zone for c in ranked if c.machine_type == "a2-ultragpu-8g"]
    for zone in a2_zones:
        runner.fail_stockout(zone)
    chosen, _, attempts = provision_candidates(runner, ranked)
    assert [c for c, _ in _ups(runner)] == ["a2-ultragpu-8g x 1"] * len(a2_zones) + [
        "a3-highgpu-8g x 1"
    ]
    assert chosen.machine_type == "a3-highgpu-8g" and len(attempts) == len(a2_zones) + 1


def test_regional_quota_skips_the_region(runner: FakeStackRunner) -> None:
    ranked = _ranked("H100:16", regions=H100_16)
    first = ranked[0]
    runner.fail_quota(first.zone, "PREEMPTIBLE_NVIDIA_H100_GPUS")
    chosen, _, _ = provision_candidates(runner, ranked)
    assert chosen.region != first.region
    assert [z for _, z in _ups(runner)] == [first.zone, chosen.zone]
    assert chosen == next(c for c in ranked if c.region != first.region)


def test_project_wide_quota_ends_the_search(runner: FakeStackRunner) -> None:
    ranked = _ranked("H100:16", regions=H100_16)
    runner.fail_quota(ranked[0].zone, "GPUS_ALL_REGIONS", region=None)
    with pytest.raises(ProvisioningError) as exc:
        provision_candidates(runner, ranked)
    assert len(_ups(runner)) == 1
    assert "quota exceeded for the whole project: GPUS_ALL_REGIONS" in str(exc.value)
    assert runner.existing == []


def test_all_stocked_out_is_a_clear_error_and_leaves_nothing(
    runner: FakeStackRunner, fake: FakeCompute, api: ComputeApi
) -> None:
    ranked = _ranked("H100:16", regions=H100_16)
    for c in ranked:
        runner.fail_stockout(c.zone, times=99)
    with pytest.raises(ProvisioningError) as exc:
        provision_candidates(runner, ranked, max_candidates=3)
    message = str(exc.value)
    assert len(_ups(runner)) == 3 and len(exc.value.attempts) == 3
    assert message.startswith(
        f"could not create the cluster: no capacity in the 3 candidate(s) tried, of {len(ranked)}"
    )
    assert "raise --max-candidates (now 3)" in message
    assert "nothing was left running" in message
    assert runner.existing == [] and sweep(fake.project, "gpus", api=api) == []


# ---- the CLI: plan's candidate table and up's failover ---------------------------------------


def _project(tmp_path: Path, stack_yaml: str) -> Path:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.g.yaml").write_text(
        "config:\n"
        "  gcp:project: gputrain-test\n"
        f"  gputrain:sshPublicKey: {TEST_PUBLIC_KEY}\n"
        "  gputrain:sshSourceRanges: [203.0.113.7/32]\n" + stack_yaml
    )
    return tmp_path


def _gce(fake: FakeCompute, runner: FakeStackRunner | None = None) -> GceClients:
    return GceClients(
        runner_for=(lambda stack, root: runner) if runner else None,
        compute_endpoint=fake.url,
        retry_pause_s=0,
    )


def test_plan_checks_candidates_and_chooses_the_cheapest_that_passes(
    tmp_path: Path, fake: FakeCompute, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _project(tmp_path, "  gputrain:gpus: 80GB+:8\n  gputrain:regions: [us-central1]\n")
    ranked = _ranked("80GB+:8", regions=["us-central1"])
    first, second, third = ranked[:3]
    assert (first.machine_type, second.machine_type) == ("a2-ultragpu-8g", "a2-ultragpu-8g")
    fake.remove_machine_type(first.zone, "a2-ultragpu-8g")  # the zone lacks the GPU's VM
    metric = catalog.quota_metric("nvidia-a100-80gb", True)
    fake.set_region_quota("us-central1", metric, 4)  # 8 needed: short everywhere in the region
    rc = main(["plan", "--stack", "g"], Settings(root=root), _gce(fake))
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = {line.split()[0]: line for line in out.splitlines() if line[:2].strip().isdigit()}
    assert f"a2-ultragpu-8g is not offered in {first.zone}" in rows["1"]
    assert metric in rows["2"] and "✔" not in rows["1"] + rows["2"]
    assert third.machine_type == "a3-highgpu-8g" and " ok " in rows["3"] and "✔" in rows["3"]
    assert sum("✔" in r for r in rows.values()) == 1
    assert len(rows) == 10 and f"… {len(ranked) - 10} more" in out
    plan_row = out.splitlines()[2].split()  # the plan's own row is the chosen candidate
    assert plan_row[:2] == ["1", "a3-highgpu-8g"] and third.zone in plan_row


def _up_with_every_zone_stocked_out(
    tmp_path: Path, fake: FakeCompute, stack_yaml: str, ranked: list[Candidate], most: int
) -> tuple[int, FakeStackRunner]:
    """`up --stack g` (up to `most` candidates) where every candidate's zone is stocked out."""
    root = _project(tmp_path, stack_yaml)
    runner = FakeStackRunner("g", compute=fake, project="gputrain-test")
    for c in ranked:
        runner.fail_stockout(c.zone, times=99)
    rc = main(
        ["up", "--stack", "g", "--yes", "--skip-preflight", "--max-candidates", str(most)],
        Settings(root=root, runs_dir=tmp_path / "runs"),
        _gce(fake, runner),
    )
    return rc, runner


def test_up_walks_the_candidates_and_says_so_and_all_stocked_out_leaves_nothing(
    tmp_path: Path, fake: FakeCompute, capsys: pytest.CaptureFixture[str]
) -> None:
    stack_yaml = "  gputrain:gpus: H100:16\n  gputrain:regions: [us-central1]\n"
    ranked = _ranked("H100:16", regions=["us-central1"])
    rc, runner = _up_with_every_zone_stocked_out(tmp_path, fake, stack_yaml, ranked, 2)
    captured = capsys.readouterr()
    assert rc == 1
    assert captured.err.startswith("gputrain: error: could not create the cluster: no capacity")
    assert f"trying {candidate_label(ranked[1])} in {ranked[1].zone} next" in captured.out
    assert "up: attempts" in captured.out and captured.out.count("stockout") >= 2
    assert len(_ups(runner)) == 2
    names = runner.call_names()
    after_last_up = names[len(names) - names[::-1].index("up") :]
    assert runner.existing == [] and "destroy" in after_last_up


def test_a_stockout_never_falls_back_to_a_candidate_over_the_cap(
    tmp_path: Path, fake: FakeCompute, capsys: pytest.CaptureFixture[str]
) -> None:
    """maxHourlyCost between the cheapest candidate and the next dearer one: the plan passes on
    the cheapest; when all its zones stock out, `up` does not buy the dearer one (it was created
    above the cap, and its worst case above the budget)."""
    ranked = _ranked("L4:1", regions=["us-central1"])
    cheapest = ranked[0]
    dearer = next(c for c in ranked if (c.hourly or 0) > (cheapest.hourly or 0) + 0.01)
    cap = round(((cheapest.hourly or 0) + (dearer.hourly or 0)) / 2, 3)
    stack_yaml = (
        f"  gputrain:gpus: L4:1\n  gputrain:regions: [us-central1]\n"
        f"  gputrain:maxHourlyCost: '{cap}'\n"
    )
    rc, runner = _up_with_every_zone_stocked_out(tmp_path, fake, stack_yaml, ranked, 8)
    captured = capsys.readouterr()
    assert rc == 1, captured.err
    assert "over maxHourlyCost or the budget" in captured.out
    tried = {c for c, _ in _ups(runner)}
    assert candidate_label(dearer) not in tried and candidate_label(cheapest) in tried
    assert runner.existing == []


def test_a_fallback_of_unknown_price_is_said_as_such_not_as_over_the_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A candidate the price table has no figure for is not over the cap: the caps cannot be
    checked for it, and that is what `up` says when it leaves it out."""
    from scripts.targets.base import RunOptions
    from scripts.targets.gce.preflight import within_caps
    from scripts.targets.gce.target import GceTarget

    stack_yaml = (
        "  gputrain:gpus: H100:8\n  gputrain:regions: [us-central1, europe-west8]\n"
        "  gputrain:maxHourlyCost: '1000'\n"
    )
    target = GceTarget("g", Settings(root=_project(tmp_path, stack_yaml)), GceClients())
    spec = target.spec()
    unpriced = next(c for c in spec.candidates if c.hourly is None)
    priced = spec.candidates[0]
    kept = within_caps(target.context(spec, RunOptions()), spec, [priced, unpriced])
    out = capsys.readouterr().out
    assert kept == [priced]
    shape = f"{unpriced.nodes} x {unpriced.machine_type} in {unpriced.zone}"
    assert f"not falling back to {shape}: its price is unknown, so maxHourlyCost" in out
    assert "over maxHourlyCost" not in out


def test_spot_recovery_reups_the_same_shape_its_zone_first(
    tmp_path: Path, fake: FakeCompute
) -> None:
    """After a preemption the run keeps its GPUs per node and nodes: the same machine type x
    nodes, in its zone first, then the other zones in rank order; nothing is destroyed."""
    from scripts.targets.base import RunOptions
    from scripts.targets.gce.target import GceTarget, recreate

    root = _project(tmp_path, "  gputrain:gpus: H100:16\n  gputrain:regions: [us-central1]\n")
    runner = FakeStackRunner("g", compute=fake, project="gputrain-test")
    target = GceTarget("g", Settings(root=root), _gce(fake, runner))
    ranked = _ranked("H100:16", regions=["us-central1"])
    running = ranked[1]
    spec = target.spec_at(running)
    assert (spec.machine_type, spec.zone) == (running.machine_type, running.zone)
    runner.fail_stockout(running.zone)
    image = "https://www.googleapis.com/compute/v1/projects/p/global/images/pytorch-v20260301"
    again = Recreation(time.time() + 1800, running.zone, image)
    recreate(target.context(spec, RunOptions()), again)
    label = candidate_label(running)
    assert _ups(runner) == [(label, running.zone), (label, ranked[0].zone)]
    assert "destroy" not in runner.call_names()
    # each `up` gives the program the run's deadline, the zone its survivors stand in and the
    # image they run, which the new zone's VMs boot too
    assert runner.up_env == [again.env()] * 2
    assert runner.up_env[1][RECREATE_IMAGE_ENV] == image


def test_a_recovery_never_moves_to_a_rate_its_budget_does_not_count_at(
    tmp_path: Path, fake: FakeCompute, capsys: pytest.CaptureFixture[str]
) -> None:
    """H100:16 over three regions, capped at $40/h (only us-east4's $38.18/h passes): with
    every us-east4 zone stocked out, the recovery (the controller's and reconcile's) tries
    only those and fails, never europe-west4 at $46.48/h, over the cap and past the rate the
    watchdog's budget and the cost record count at. Without caps it keeps to that rate too."""
    from infra.disk_prices import cluster_hourly
    from infra.offer_tables import money
    from scripts.run_plan import worst_hourly
    from scripts.targets.base import RunOptions
    from scripts.targets.gce.preflight import within_caps
    from scripts.targets.gce.target import GceTarget, recreate

    regions = "  gputrain:regions: [us-east4, europe-west4, us-central1]\n"
    capped = "  gputrain:maxHourlyCost: '40'\n  gputrain:budget: '320'\n"
    for caps in (capped, ""):
        root = _project(tmp_path, f"  gputrain:gpus: H100:16\n{regions}{caps}")
        runner = FakeStackRunner("g", compute=fake, project="gputrain-test")
        target = GceTarget("g", Settings(root=root), _gce(fake, runner))
        ctx = target.context(target.spec(), RunOptions())
        running = within_caps(ctx, ctx.spec, list(ctx.spec.candidates))[0]
        spec = target.spec_at(running)
        assert running.zone.startswith("us-east4-") and running.hourly == pytest.approx(
            38.18, abs=0.01
        )  # the VMs'; the caps and the watchdog count its disks too (worst_hourly)
        assert (worst_hourly(spec) or 0) > 38.18
        east4 = {c.zone for c in spec.candidates if c.zone.startswith("us-east4-")}
        for zone in east4:
            runner.fail_stockout(zone, times=99)
        with pytest.raises(ProvisioningError, match="no capacity in the 3 candidate"):
            ctx = target.context(spec, RunOptions(wait_for_capacity_s=0))
            recreate(ctx, Recreation(time.time() + 3600, running.zone))
        with pytest.raises(ProvisioningError):  # a reconcile pass's re-creation
            target.recreated(spec, Recreation(time.time() + 3600, running.zone), None)
        assert {zone for _, zone in _ups(runner)} == east4
        out = capsys.readouterr().out
        # at the rates the budget and the cost record count: the VMs with their disks
        west4 = next(
            c for c in spec.candidates
            if (c.zone, c.machine_type) == ("europe-west4-b", spec.machine_type)
        )  # fmt: skip
        there, rate = cluster_hourly(target.spec_at(west4)), cluster_hourly(spec)
        assert there is not None and there > 46.48 and rate is not None and rate > 38.18
        assert f"recovery: not re-creating in europe-west4-b at {money(there)}/h" in out
        assert f"count at its {money(rate)}/h" in out


def test_what_a_candidate_made_before_the_next_one_was_created_counts_for_the_run(
    tmp_path: Path, fake: FakeCompute, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first candidate made one VM of its two, then stocked out and was destroyed; the
    second was created in the same round. What that VM billed (a minute, at the first
    candidate's rate per VM) comes with the cluster for the run's cost record and budget."""
    from scripts.run_plan import candidate_hourly
    from scripts.targets.base import RunOptions
    from scripts.targets.gce.target import GceTarget

    root = _project(tmp_path, f"  gputrain:gpus: H100:16\n  gputrain:regions: {H100_16}\n")
    runner = FakeStackRunner("g", compute=fake, project="gputrain-test")
    target = GceTarget("g", Settings(root=root), _gce(fake, runner))
    first, second = target.spec().candidates[:2]
    runner.fail_partial(first.zone, created=1)
    ctx = target.context(target.spec(), RunOptions(skip_preflight=True))
    spec, outputs, partial_usd = target.prepare(ctx)()
    assert (spec.zone, outputs["zone"]) == (second.zone, second.zone)
    rate = candidate_hourly(target.spec(), first)
    assert rate is not None and partial_usd == pytest.approx(rate / first.nodes / 60)
    out = capsys.readouterr().out
    assert "; 1 VM made, billed 1m until destroyed" in out  # the attempts table
    assert "partial creates before the cluster was created billed 1 VM(s), 1m, about $" in out


def test_pinning_the_stacks_own_choice_reuses_the_spec_parsed_once() -> None:
    """`up` pins the candidate it created; the stack's own choice needs no second parse, and
    the shortcut gives exactly what parsing the pinned config gives."""
    from infra.spec import parse_spec
    from infra.stackfile import NS, load_stack_config
    from scripts.targets.gce.target import GceTarget

    target = GceTarget("gpus", Settings(root=ROOT), GceClients())
    spec = target.spec()
    assert target.spec() is spec  # parsed once per command
    first = spec.candidates[0]
    pinned = {NS + "candidate": candidate_label(first), NS + "zone": first.zone}
    assert target.spec_at(first) is spec
    assert spec == parse_spec(load_stack_config(ROOT, "gpus") | pinned, "gpus")
    other = next(c for c in spec.candidates if c.zone != first.zone)
    assert (target.spec_at(other).zone, target.spec_at(other).machine_type) == (
        other.zone,
        other.machine_type,
    )
