"""The laptop-closed recovery the program declares (infra/components/reconciler.py) under the SDK
mocks: on a spot or flex-start stack with `recover: auto` (or any stack with `always`) a Cloud
Run job that runs `gputrain reconcile`, a Cloud Scheduler job POSTing to its `jobs:run` with an
OAuth token, a service account with grants on the stack's own resources, Direct VPC egress into
the stack's subnet and SSH open to that range only; nothing of it otherwise."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from infra.reconciler import idle_cost_per_day, parse_every, parse_recover, plan_line, schedule
from infra.spec import ClusterSpec, parse_spec
from infra.stackfile import SpecError
from tests.support.pulumi_mocks import FIREWALL, TEST_PROJECT, GcpMocks, deployable_config

JOB = "gcp:cloudrunv2/job:Job"
SCHEDULER = "gcp:cloudscheduler/job:Job"
ACCOUNT = "gcp:serviceaccount/account:Account"
PROJECT_MEMBER = "gcp:projects/iAMMember:IAMMember"
SA_MEMBER = "gcp:serviceaccount/iAMMember:IAMMember"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
INVOKER = "gcp:cloudrunv2/jobIamMember:JobIamMember"


def _spec(**overrides: str) -> ClusterSpec:
    return parse_spec(deployable_config("dev", **overrides), "dev")


def declared(cluster: Any) -> pulumi.Output[Any]:
    """Resolves once every resource of the cluster, its reconciler's too, is registered."""
    rc = cluster.reconciler
    more = [] if rc is None else [rc.scheduler.urn, rc.invoker.urn, rc.job.urn, rc.firewall.urn]
    more += [] if rc is None else [g.urn for g in rc.grants]
    return pulumi.Output.all(pulumi.Output.all(**cluster.exports()), *more)


@pulumi.runtime.test
def test_a_spot_stack_with_recover_auto_declares_the_job_and_its_schedule(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = _spec(recover="auto", reconcileEvery="5m")
    cluster = GpuCluster(spec.stack, spec)

    def check(_: Any) -> None:
        [job] = mocks.of_type(JOB)
        t = job.inputs["template"]["template"]
        [container] = t["containers"]
        assert container["args"] == ["reconcile", "--stack", "dev"]
        assert container["image"].startswith("us-central1-docker.pkg.dev/gputrain-test-1/")
        assert t["maxRetries"] == 0 and job.inputs["location"] == spec.region
        assert job.inputs["labels"]["gputrain-stack"] == "dev"  # what `sweep` matches
        [nic] = t["vpcAccess"]["networkInterfaces"]
        assert t["vpcAccess"]["egress"] == "PRIVATE_RANGES_ONLY" and nic["subnetwork"]
        [sched] = mocks.of_type(SCHEDULER)
        assert sched.inputs["schedule"] == "*/5 * * * *"
        target = sched.inputs["httpTarget"]
        assert target["httpMethod"] == "POST"
        assert target["uri"] == (
            f"https://run.googleapis.com/v2/projects/{TEST_PROJECT}/locations/"
            f"{spec.region}/jobs/dev-reconcile:run"
        )
        accounts = [a for a in mocks.of_type(ACCOUNT) if a.inputs["accountId"] == "gputrain-rc-dev"]
        assert len(accounts) == 1
        assert target["oauthToken"]["scope"].endswith("/auth/cloud-platform")
        # narrow grants: instance admin only on the stack's own VMs, objects on its bucket only
        grants = {
            m.inputs["role"]: m.inputs
            for m in mocks.of_type(PROJECT_MEMBER)
            if "gputrain-rc-dev" in str(m.inputs["member"])
        }
        assert set(grants) == {"roles/compute.viewer", "roles/compute.instanceAdmin.v1"}
        cel = grants["roles/compute.instanceAdmin.v1"]["condition"]["expression"]
        assert "dev-node-" in cel
        [bucket_grant] = [
            m for m in mocks.of_type(BUCKET_MEMBER) if m.name == "dev-reconcile-bucket"
        ]
        assert bucket_grant.inputs["role"] == "roles/storage.objectAdmin"
        [act_as] = mocks.of_type(SA_MEMBER)
        assert act_as.inputs["role"] == "roles/iam.serviceAccountUser"
        [invoker] = mocks.of_type(INVOKER)
        assert invoker.inputs["role"] == "roles/run.invoker"
        # SSH from the job's egress range (the stack's subnet), never a public range
        [fw] = [f for f in mocks.of_type(FIREWALL) if f.name == "dev-reconcile-ssh"]
        assert fw.inputs["sourceRanges"] == ["10.42.0.0/20"]
        assert fw.inputs["allows"] == [{"protocol": "tcp", "ports": ["22"]}]

    return declared(cluster).apply(check)


@pytest.mark.parametrize(
    "overrides",
    [{"capacity": "on-demand", "recover": "auto"}, {"recover": "never"}, {}],
    ids=["on-demand-auto", "spot-never", "spot-default"],
)
@pulumi.runtime.test
def test_nothing_is_declared_unless_asked_or_preemptible(
    mocks: GcpMocks, overrides: dict[str, str]
) -> Any:
    from infra.components.cluster import GpuCluster

    spec = _spec(**overrides)
    cluster = GpuCluster(spec.stack, spec)

    def check(_: Any) -> None:
        assert mocks.of_type(JOB) == [] and mocks.of_type(SCHEDULER) == []
        assert not [f for f in mocks.of_type(FIREWALL) if "reconcile" in f.name]

    return declared(cluster).apply(check)


@pulumi.runtime.test
def test_recover_always_declares_it_on_demand_too(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = _spec(capacity="on-demand", recover="always")
    cluster = GpuCluster(spec.stack, spec)
    return declared(cluster).apply(
        lambda _: len(mocks.of_type(JOB)) == len(mocks.of_type(SCHEDULER)) == 1 or pytest.fail("")
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("recover", "sometimes", "gputrain:recover 'sometimes': allowed: auto"),
        ("reconcileEvery", "30s", "gputrain:reconcileEvery '30s': below 1m; allowed:"),
        ("reconcileEvery", "soon", "gputrain:reconcileEvery 'soon': allowed: 1m to 59m"),
        ("reconcileEvery", "90m", "gputrain:reconcileEvery '90m': not a cron step"),
    ],
)
def test_bad_settings_are_one_line(key: str, value: str, message: str) -> None:
    with pytest.raises(SpecError) as e:
        _spec(**{key: value})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_schedule_cost_and_plan_line() -> None:
    assert (parse_recover(" Always "), parse_every("2m"), parse_every("1h")) == (
        "always",
        120,
        3600,
    )
    assert [schedule(s) for s in (60, 120, 3600, 7200, 86400)] == [
        "*/1 * * * *", "*/2 * * * *", "0 */1 * * *", "0 */2 * * *", "0 0 * * *",
    ]  # fmt: skip
    # 720 passes a day x 5 s x (1 vCPU x $0.000018 + 0.5 GiB x $0.000002)
    assert idle_cost_per_day(120) == pytest.approx(720 * 5 * 0.000019)
    assert "every 2m" in plan_line("auto", "spot", 120) and "/day" in plan_line("auto", "spot", 120)
    assert "off (on-demand VMs are not preempted" in plan_line("auto", "on-demand", 120)
