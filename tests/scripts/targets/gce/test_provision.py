"""scripts/targets/gce/provision.py: error classification (pure), zone order (pure), and the failover
driver against FakeStackRunner, whose resources the fake Compute server reports until destroyed."""

from __future__ import annotations

import pytest

from infra.gcp.compute import ComputeApi
from infra.gcp.sweep import sweep
from scripts.targets.gce.provision import (
    ProvisioningError,
    classify_provisioning_error,
    provision_with_failover,
    zone_order,
    zones_available_hint,
)
from tests.support.fake_compute import FakeCompute
from tests.support.fake_stack import (
    FakeStackRunner,
    other_text,
    quota_text,
    sample_nodes,
    stockout_text,
)

A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
EU = "europe-west4-a"

# ---- classification ----------------------------------------------------------------------------

RAW_503 = (
    '{"error": {"code": 503, "message": "The zone \'projects/p/zones/us-east1-b\' does not have '
    "enough resources available to fulfill the request. '(resource type:compute)'.\", "
    '"errors": [{"reason": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"}]}}'
)


@pytest.mark.parametrize(
    ("text", "kind", "hint", "metric", "region"),
    [
        (stockout_text("p", A, "dev-node-0"), "stockout", (), None, None),
        (
            stockout_text("p", B, "dev-node-0", (A, "us-central1-f")),
            "stockout",
            (A, "us-central1-f"),
            None,
            None,
        ),
        (RAW_503, "stockout", (), None, None),
        (
            "reason: resource_availability metadatas: {zone: us-central1-b}",
            "stockout",
            (),
            None,
            None,
        ),
        ("(state:STOCKOUT, attachment:nvidia-tesla-t4:1)", "stockout", (), None, None),
        ("bulk insert: VM_MIN_COUNT_NOT_REACHED", "stockout", (), None, None),
        (
            quota_text("n", "NVIDIA_L4_GPUS", "us-central1"),
            "quota",
            (),
            "NVIDIA_L4_GPUS",
            "us-central1",
        ),
        (quota_text("n", "GPUS_ALL_REGIONS", None), "quota", (), "GPUS_ALL_REGIONS", None),
        (
            "Quota 'N2_CPUS' exceeded.  Limit: 24.0 in region europe-west4.",
            "quota",
            (),
            "N2_CPUS",
            "europe-west4",
        ),
        ("operation error: QUOTA_EXCEEDED", "quota", (), None, None),
        (other_text("n", A), "other", (), None, None),
        (
            "error: The resource 'projects/p/zones/europe-west4-c/acceleratorTypes/nvidia-tesla-p4' was not found",
            "other",
            (),
            None,
            None,
        ),
        ("", "other", (), None, None),
    ],
)
def test_classify(
    text: str, kind: str, hint: tuple[str, ...], metric: str | None, region: str | None
) -> None:
    f = classify_provisioning_error(text)
    assert (f.kind, f.zones_available, f.quota_metric, f.region) == (kind, hint, metric, region)
    assert f.raw == text


def test_hint_from_the_sentence_alone_and_garbage_dropped() -> None:
    text = "Consider trying your request in the us-west1-a, us-west1-b zone(s) which currently"
    assert zones_available_hint(text) == ("us-west1-a", "us-west1-b")
    assert zones_available_hint('"zonesAvailable": "us-east1-c, not a zone,"') == ("us-east1-c",)


@pytest.mark.parametrize(
    ("tried", "hint", "expected"),
    [
        ([], (), A),
        ([A], (), B),
        ([A], (C,), C),  # hint first
        ([A], ("us-central1-f", C), C),  # hinted zones outside the user's list are ignored
        ([A, C], (C,), B),  # already tried
        ([A, B, C], (), None),
    ],
)
def test_zone_order(tried: list[str], hint: tuple[str, ...], expected: str | None) -> None:
    assert zone_order([A, B, C], tried, hint) == expected


# ---- the driver ---------------------------------------------------------------------------------


@pytest.fixture
def runner(fake: FakeCompute) -> FakeStackRunner:
    return FakeStackRunner("dev", compute=fake, project=fake.project, zones=(A, B, C))


def ups(runner: FakeStackRunner) -> list[str]:
    return [c[1] for c in runner.calls if c[0] == "up"]


def test_stockout_moves_to_the_next_zone_and_destroys_the_first(
    runner: FakeStackRunner, fake: FakeCompute, api: ComputeApi
) -> None:
    runner.fail_stockout(A)
    events: list[str] = []
    zone, outputs = provision_with_failover(runner, [A, B, C], on_event=events.append)
    assert zone == B and outputs["zone"] == B
    assert runner.calls[:4] == [
        ("set_config", "gputrain:zone", A),
        ("up", A),
        ("destroy",),
        ("set_config", "gputrain:zone", B),
    ]
    assert ups(runner) == [A, B]
    assert any("stockout" in e and A in e for e in events)
    # Only the live cluster in B exists; nothing of the attempt in A is left.
    left = sweep(fake.project, "dev", api=api)
    assert {x.location for x in left if x.kind == "instance"} == {B}


def test_zones_available_hint_is_preferred(runner: FakeStackRunner) -> None:
    runner.fail_stockout(A, zones_available=("us-central1-f", C))
    zone, _ = provision_with_failover(runner, [A, B, C])
    assert zone == C and ups(runner) == [A, C]


def test_quota_stops_destroys_and_says_what_to_request(
    runner: FakeStackRunner, fake: FakeCompute, api: ComputeApi
) -> None:
    runner.fail_quota(A, "NVIDIA_L4_GPUS")
    with pytest.raises(ProvisioningError) as err:
        provision_with_failover(runner, [A, B, EU], project="proj-1")
    msg = str(err.value)
    assert ups(runner) == [A] and runner.call_names()[-1] == "destroy"
    assert msg.startswith("could not create the cluster: quota exceeded: NVIDIA_L4_GPUS")
    assert "request more NVIDIA_L4_GPUS in region us-central1 at " in msg
    assert "iam-admin/quotas?project=proj-1" in msg
    assert f"it already has {EU}" in msg  # another region only because the list has one
    assert err.value.failure is not None and err.value.failure.region == "us-central1"
    assert sweep(fake.project, "dev", api=api) == []


def test_quota_without_another_region_in_the_list_does_not_suggest_one(
    runner: FakeStackRunner,
) -> None:
    runner.fail_quota(A, "GPUS_ALL_REGIONS", region=None)
    with pytest.raises(ProvisioningError) as err:
        provision_with_failover(runner, [A, B])
    assert "request more GPUS_ALL_REGIONS globally" in str(err.value)
    assert "another region" not in str(err.value)


def test_partial_multi_node_counts_as_stockout(
    runner: FakeStackRunner, fake: FakeCompute, api: ComputeApi
) -> None:
    runner.node_factory = lambda zone: sample_nodes("dev", zone, 3)
    runner.fail_partial(A, created=2)
    seen_in_a: list[str] = []
    original_destroy = runner.destroy

    def destroy_spy(on_output: object = None) -> None:
        seen_in_a.extend(x.name for x in sweep(fake.project, "dev", api=api) if x.location == A)
        original_destroy()

    runner.destroy = destroy_spy  # type: ignore[method-assign]
    zone, outputs = provision_with_failover(runner, [A, B], expected_nodes=3)
    assert zone == B and len(outputs["nodes"]) == 3
    assert {"dev-node-0", "dev-node-1"} <= set(seen_in_a)  # the partial cluster really existed
    assert not [x for x in sweep(fake.project, "dev", api=api) if x.location == A]


def test_short_cluster_without_error_is_partial(runner: FakeStackRunner) -> None:
    runner.node_factory = lambda zone: sample_nodes("dev", zone, 1 if zone == A else 2)
    events: list[str] = []
    zone, _ = provision_with_failover(runner, [A, B], expected_nodes=2, on_event=events.append)
    assert zone == B
    assert any("partial" in e and "1 of 2 nodes" in e for e in events)


def test_other_error_stops_without_trying_more_zones(runner: FakeStackRunner) -> None:
    runner.fail_other(A)
    with pytest.raises(ProvisioningError) as err:
        provision_with_failover(runner, [A, B])
    assert ups(runner) == [A] and ("destroy",) in runner.calls
    assert "not a capacity problem" in str(err.value)
    assert "Machine type with name 'g2-standard-99' does not exist" in str(err.value)


def test_stockout_everywhere_reports_every_attempt(
    runner: FakeStackRunner, fake: FakeCompute, api: ComputeApi
) -> None:
    for z in (A, B, C):
        runner.fail_stockout(z)
    with pytest.raises(ProvisioningError) as err:
        provision_with_failover(runner, [A, B, C])
    assert [a.zone for a in err.value.attempts] == [A, B, C]
    assert all(a.outcome == "stockout" for a in err.value.attempts)
    assert "no capacity in any of your zones" in str(err.value)
    assert runner.call_names().count("destroy") == 3
    assert sweep(fake.project, "dev", api=api) == []


def test_zones_failing_preflight_are_skipped(runner: FakeStackRunner) -> None:
    zone, _ = provision_with_failover(runner, [A, B], preflight_ok=lambda z: z != A)
    assert zone == B and ups(runner) == [B]
    with pytest.raises(ProvisioningError, match="every zone failed its preflight checks") as err:
        provision_with_failover(runner, [A], preflight_ok=lambda z: False)
    assert err.value.attempts[0].outcome == "skipped (preflight)"


def test_destroy_failing_after_a_stockout_stops_loudly(runner: FakeStackRunner) -> None:
    runner.fail_stockout(A)
    runner.destroy_failures = 1
    with pytest.raises(
        ProvisioningError, match=r"may still exist: run `gputrain down --stack dev`"
    ):
        provision_with_failover(runner, [A, B])
    assert ups(runner) == [A]


def test_a_clusters_time_counts_from_its_vms_creation_during_up(
    runner: FakeStackRunner,
    fake: FakeCompute,
    api: ComputeApi,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The VMs `up` made bill from their creation, before `up` is over: the run counts from the
    first of them (its cost record, its budget), not from when the cluster was handed over; a
    VM that stood before that `up` began counts from its start; a Compute API that cannot say
    leaves the count to the session, said in one line."""
    import time

    from infra.gcp.compute import ComputeApiError
    from scripts.targets.gce.partial import cluster_created

    began = time.time() - 600  # the `up`, ten minutes ago
    _, outputs = provision_with_failover(runner, [A])
    made = time.time()
    for node, ago in zip(outputs["nodes"], (120.0, 90.0), strict=True):
        fake.remove_instance(node["name"], A)
        fake.add_instance(node["name"], A, labels={"gputrain-stack": "dev"}, created_ago_s=ago)
    # another VM of the stack's label, not one of the cluster's nodes: not counted
    fake.add_instance("dev-stray", A, labels={"gputrain-stack": "dev"}, created_ago_s=500)
    since = cluster_created(api, outputs, "dev", began)
    assert since is not None and since == pytest.approx(made - 120, abs=1)
    later = time.time() - 100  # VMs that stood before this `up` began: from its start
    assert cluster_created(api, outputs, "dev", later) == pytest.approx(later)

    class Unreachable:
        def list_stack_instances(self, project: str, stack: str) -> list[dict[str, object]]:
            raise ComputeApiError("instances.aggregatedList: connection refused")

    assert cluster_created(Unreachable(), outputs, "dev", began) is None  # type: ignore[arg-type]
    assert "could not read when the VMs were created" in capsys.readouterr().err
