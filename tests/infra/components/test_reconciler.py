"""The laptop-closed recovery the program declares (infra/components/reconciler.py) under the SDK
mocks: on a spot or flex-start stack with `recover: auto` (the default) whose state a job can
reach (or any stack with `always`) a Cloud Run job that runs `gputrain reconcile` from the image
the controller builds into the stack's repository, a Cloud Scheduler job POSTing to its
`jobs:run` with an OAuth token, a service account with grants on the stack's own resources (and
its state and KMS key), Direct VPC egress into the stack's subnet and SSH open to that range
only; nothing of it otherwise."""

from __future__ import annotations

import dataclasses
import os
import re
import runpy
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from infra.components.reconciler import ReconcileSource
from infra.reconciler import (
    JobReach,
    account_id,
    idle_cost_per_day,
    parse_every,
    parse_recover,
    plan_line,
    schedule,
)
from infra.reconciler_image import image_reference
from infra.spec import ClusterSpec, parse_spec
from infra.stackfile import SpecError, load_stack_config
from tests.support import ROOT
from tests.support.pulumi_mocks import (
    FIREWALL,
    TEST_PROJECT,
    GcpMocks,
    deployable_config,
    pulumi_mocks,
)

JOB = "gcp:cloudrunv2/job:Job"
SCHEDULER = "gcp:cloudscheduler/job:Job"
ACCOUNT = "gcp:serviceaccount/account:Account"
PROJECT_MEMBER = "gcp:projects/iAMMember:IAMMember"
SA_MEMBER = "gcp:serviceaccount/iAMMember:IAMMember"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
INVOKER = "gcp:cloudrunv2/jobIamMember:JobIamMember"
REPOSITORY = "gcp:artifactregistry/repository:Repository"
REPO_MEMBER = "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"
KMS_MEMBER = "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember"
KEY = "projects/gputrain-test-1/locations/global/keyRings/gputrain/cryptoKeys/state"
REACH = JobReach("gs://my-pulumi-state/gputrain", f"gcpkms://{KEY}")
IMAGE = f"us-central1-docker.pkg.dev/{TEST_PROJECT}/gputrain-dev/gputrain-reconcile:ctx-0"
SOURCE = ReconcileSource(IMAGE, "config:\n  gputrain:capacity: spot\n", "dev")


def _spec(reach: JobReach | None = REACH, **overrides: str) -> ClusterSpec:
    spec = parse_spec(deployable_config("dev", **overrides), "dev")
    return dataclasses.replace(spec, job_reach=reach)


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
    cluster = GpuCluster(spec.stack, spec, reconcile=SOURCE)

    def check(_: Any) -> None:
        [job] = mocks.of_type(JOB)
        t = job.inputs["template"]["template"]
        [container] = t["containers"]
        assert container["args"] == ["reconcile", "--stack", "dev"]
        assert container["image"] == IMAGE
        env = {e["name"]: e["value"] for e in container["envs"]}
        assert env == {
            "GPUTRAIN_STACK_FILE": SOURCE.stack_file,
            "PULUMI_BACKEND_URL": "gs://my-pulumi-state/gputrain",
        }
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
        assert set(grants) == {
            "roles/compute.viewer",
            "roles/compute.instanceAdmin.v1",
            f"projects/{TEST_PROJECT}/roles/gputrainRc.project.dev.0",  # no policy below it
        }
        cel = grants["roles/compute.instanceAdmin.v1"]["condition"]["expression"]
        assert "dev-node-" in cel
        [bucket_grant] = [
            m for m in mocks.of_type(BUCKET_MEMBER) if m.name == "dev-reconcile-bucket"
        ]
        assert bucket_grant.inputs["role"] == "roles/storage.objectAdmin"
        # the Pulumi state: objects of the backend's bucket, and decrypting with its KMS key
        [state] = [m for m in mocks.of_type(BUCKET_MEMBER) if m.name == "dev-reconcile-state"]
        assert (state.inputs["bucket"], state.inputs["role"]) == (
            "my-pulumi-state",
            "roles/storage.objectAdmin",
        )
        [decrypt] = [m for m in mocks.of_type(KMS_MEMBER) if m.name == "dev-reconcile-decrypt"]
        assert decrypt.inputs["cryptoKeyId"] == KEY
        assert decrypt.inputs["role"] == "roles/cloudkms.cryptoKeyDecrypter"
        act_as = [m for m in mocks.of_type(SA_MEMBER) if "act-as" in m.name]
        assert {m.inputs["role"] for m in act_as} == {"roles/iam.serviceAccountUser"}
        [invoker] = [m for m in mocks.of_type(INVOKER) if m.name == "dev-reconcile-invoker"]
        assert invoker.inputs["role"] == "roles/run.invoker"
        # SSH from the job's egress range (the stack's subnet), never a public range
        [fw] = [f for f in mocks.of_type(FIREWALL) if f.name == "dev-reconcile-ssh"]
        assert fw.inputs["sourceRanges"] == ["10.42.0.0/20"]
        assert fw.inputs["allows"] == [{"protocol": "tcp", "ports": ["22"]}]

    return declared(cluster).apply(check)


@pytest.mark.parametrize(
    ("reach", "overrides"),
    [
        (REACH, {"capacity": "on-demand", "recover": "auto"}),
        (REACH, {"capacity": "on-demand"}),
        (REACH, {"recover": "never"}),
        (None, {}),
        (JobReach("file:///home/me/.pulumi", f"gcpkms://{KEY}"), {}),
        (JobReach("gs://my-pulumi-state", None), {}),
    ],
    ids=[
        "on-demand-auto",
        "on-demand-default",
        "spot-never",
        "spot-state-unknown",
        "spot-local-state",
        "spot-passphrase",
    ],
)
@pulumi.runtime.test
def test_nothing_is_declared_unless_asked_or_preemptible_and_reachable(
    mocks: GcpMocks, reach: JobReach | None, overrides: dict[str, str]
) -> Any:
    from infra.components.cluster import GpuCluster

    spec = _spec(reach, **overrides)
    cluster = GpuCluster(spec.stack, spec, reconcile=SOURCE)

    def check(_: Any) -> None:
        assert mocks.of_type(JOB) == [] and mocks.of_type(SCHEDULER) == []
        assert not [f for f in mocks.of_type(FIREWALL) if "reconcile" in f.name]

    return declared(cluster).apply(check)


@pulumi.runtime.test
def test_recover_always_declares_it_on_demand_too(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = _spec(capacity="on-demand", recover="always")
    cluster = GpuCluster(spec.stack, spec, reconcile=SOURCE)
    return declared(cluster).apply(
        lambda _: len(mocks.of_type(JOB)) == len(mocks.of_type(SCHEDULER)) == 1 or pytest.fail("")
    )


@pytest.mark.parametrize("overrides", [{}, {"secrets": '["HF_TOKEN=sm://hf-token"]'}])
@pulumi.runtime.test
def test_the_permission_table_covers_what_recovery_declares(
    mocks: GcpMocks, overrides: dict[str, str]
) -> Any:
    """`gputrain doctor` asks for the permissions of the types `spec_resource_types` names: with
    the reconciler they must be exactly what the program declares, its repository included."""
    from infra.components.cluster import GpuCluster
    from infra.components.registry import stack_registry
    from infra.permissions import RESOURCE_PERMISSIONS, spec_resource_types

    spec = _spec(**overrides)
    registry = stack_registry(spec)  # as __main__.py declares it for the job's image
    cluster = GpuCluster(spec.stack, spec, registry=registry, reconcile=SOURCE)

    def check(_: Any) -> None:
        types = {r.typ for r in mocks.resources if r.custom}
        assert types <= set(RESOURCE_PERMISSIONS), types - set(RESOURCE_PERMISSIONS)
        assert types == set(spec_resource_types(spec))

    return pulumi.Output.all(declared(cluster), registry.repository.urn).apply(check)


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
        _spec(REACH, **{key: value})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_two_long_stack_names_never_share_the_jobs_account() -> None:
    """IAM's 30 characters: a name over 18 keeps its beginning and a hash of the whole (cut to
    30 alone, `llama-finetune-run-1` and `-2` were one account: the second `up` failed, and one
    stack's sweep listed the other's account)."""
    names = ["dev", "a" * 18, "llama-finetune-run-1", "llama-finetune-run-2", "abcdefghijklmnop-x"]
    ids = [account_id(n) for n in names]
    assert ids[:2] == ["gputrain-rc-dev", "gputrain-rc-" + "a" * 18]  # as before: they fit
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", i) for i in ids), ids
    assert account_id("llama-finetune-run-1") == account_id("llama-finetune-run-1")


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
    on = plan_line("auto", "spot", 120, REACH)
    assert "every 2m" in on and "$0.068/day" in on
    assert "off (on-demand VMs are not preempted" in plan_line("auto", "on-demand", 120, REACH)
    assert plan_line("auto", "spot", 120, JobReach(None, None)) == (
        "laptop-closed recovery: off (PULUMI_BACKEND_URL does not name the stack's Pulumi "
        "state (a gs:// backend), so a Cloud Run job could not act; `recover: always` turns it "
        "on)"
    )
    assert "not under a gcpkms:// secrets provider" in plan_line(
        "auto", "flex-start", 120, JobReach("gs://state", "passphrase")
    )
    assert parse_recover("") == "auto"  # the default


def _program(project: Path, **overrides: str) -> GcpMocks:
    """__main__.py under mocks, run from `project` (its stack file, its files hashed)."""
    cfg = deployable_config("dev", **overrides)
    with pulumi_mocks(load_stack_config(ROOT, "dev"), stack="dev") as mocks:

        @pulumi.runtime.test
        def program() -> Any:
            pulumi.runtime.set_all_config(cfg, secret_keys=["gputrain:sshPrivateKey"])
            ns = runpy.run_path(str(ROOT / "__main__.py"))
            rc = ns["cluster"].reconciler
            more = [] if rc is None else [rc.job.urn, rc.scheduler.urn]
            if ns["registry"] is not None:
                more.append(ns["registry"].repository.urn)
            return pulumi.Output.all(pulumi.Output.all(**ns["cluster"].exports()), *more)

        program()
    return mocks


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory whose stack keeps its state in gs:// and its secrets under KMS."""
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    doc = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text()) or {}
    doc["secretsprovider"] = f"gcpkms://{KEY}"
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PULUMI_BACKEND_URL", "gs://my-pulumi-state")
    return tmp_path


def test_the_program_points_the_job_at_the_image_the_controller_builds(project: Path) -> None:
    """The whole program on a spot stack: the stack's repository (where the controller pushes
    the image before `up`; the nodes' account may write to it, for Cloud Build, and not read
    it), the job on the image named by the hash of this project's files, with its stack file."""
    mocks = _program(project)
    [job] = mocks.of_type(JOB)
    [container] = job.inputs["template"]["template"]["containers"]
    assert container["image"] == image_reference(project, "us-central1", TEST_PROJECT, "dev")
    env = {e["name"]: e["value"] for e in container["envs"]}
    assert env["GPUTRAIN_STACK_FILE"] == (project / "Pulumi.dev.yaml").read_text()
    assert env["PULUMI_BACKEND_URL"] == "gs://my-pulumi-state"
    [repo] = mocks.of_type(REPOSITORY)
    assert repo.inputs["repositoryId"] == "gputrain-dev" and repo.inputs["format"] == "DOCKER"
    roles = sorted(m.inputs["role"] for m in mocks.of_type(REPO_MEMBER))
    # Cloud Build runs as the stack's account; the job's refresh reads the repository
    assert roles == [
        f"projects/{TEST_PROJECT}/roles/gputrainRc.repository.dev.0",
        "roles/artifactregistry.writer",
    ]


@pytest.mark.parametrize(
    "overrides", [{"capacity": "on-demand"}, {"recover": "never"}], ids=["on-demand", "never"]
)
def test_the_program_builds_and_declares_nothing_for_it_on_demand(
    project: Path, overrides: dict[str, str]
) -> None:
    mocks = _program(project, **overrides)
    assert mocks.of_type(JOB) == mocks.of_type(SCHEDULER) == mocks.of_type(REPOSITORY) == []


def test_the_program_without_a_state_a_job_could_reach_declares_nothing(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PULUMI_BACKEND_URL")
    assert os.environ.get("PULUMI_BACKEND_URL") is None
    mocks = _program(project)
    assert mocks.of_type(JOB) == mocks.of_type(REPOSITORY) == []


CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"
SECRET_MEMBER = "gcp:secretmanager/secretIamMember:SecretIamMember"


@pulumi.runtime.test
def test_the_jobs_refresh_reads_are_custom_roles_on_the_stacks_own_resources(
    mocks: GcpMocks,
) -> Any:
    """What the pass's `pulumi refresh` reads beyond Compute, and `run.jobs.update` for an `up`
    that changes the job: custom roles of reads only, each bound on the stack's own bucket,
    repository, job, accounts, KMS key and Secret Manager secrets; on the project only what has
    no resource-level policy; the secrets the stack names readable by the pass."""
    from infra.components.cluster import GpuCluster
    from infra.components.registry import stack_registry
    from infra.reconciler import REFRESH_PERMISSIONS

    spec = _spec(secrets='["HF_TOKEN=sm://hf-token", "WANDB_API_KEY"]')
    cluster = GpuCluster(spec.stack, spec, registry=stack_registry(spec), reconcile=SOURCE)
    rc = cluster.reconciler

    def check(_: Any) -> None:
        roles = {r.inputs["roleId"]: r.inputs["permissions"] for r in mocks.of_type(CUSTOM_ROLE)}
        kinds = {"bucket", "repository", "job", "account", "key", "secret", "project"}
        assert roles == {
            f"gputrainRc.{k}.dev.0": list(REFRESH_PERMISSIONS[k]) for k in sorted(kinds)
        }
        every = [p for ps in roles.values() for p in ps]
        assert all(p.endswith((".get", ".getIamPolicy")) for p in every if p != "run.jobs.update")

        def bound(typ: str, kind: str) -> list[dict[str, Any]]:
            role = f"projects/{TEST_PROJECT}/roles/gputrainRc.{kind}.dev.0"
            return [m.inputs for m in mocks.of_type(typ) if m.inputs["role"] == role]

        assert {b["bucket"] for b in bound(BUCKET_MEMBER, "bucket")} == {
            spec.bucket_name,
            "my-pulumi-state",
        }
        [repo] = bound(REPO_MEMBER, "repository")
        assert repo["repository"] == "gputrain-dev"
        [job] = bound(INVOKER, "job")
        assert job["name"] == "dev-reconcile"
        assert len(bound(SA_MEMBER, "account")) == 2  # the nodes' account and its own
        [key] = bound(KMS_MEMBER, "key")
        assert key["cryptoKeyId"] == KEY
        [secret] = bound(SECRET_MEMBER, "secret")
        assert (secret["project"], secret["secretId"]) == (TEST_PROJECT, "hf-token")
        [project] = bound(PROJECT_MEMBER, "project")
        assert project["project"] == TEST_PROJECT and "condition" not in project
        # the pass reads the stack's Secret Manager secrets itself: that one secret only
        access = [
            m.inputs
            for m in mocks.of_type(SECRET_MEMBER)
            if m.inputs["role"] == "roles/secretmanager.secretAccessor"
        ]
        assert [(a["secretId"], a["member"]) for a in access] == [
            ("hf-token", f"serviceAccount:gputrain-rc-dev@{TEST_PROJECT}.iam.gserviceaccount.com")
        ]

    assert rc is not None
    return pulumi.Output.all(declared(cluster), rc.job_refresh.urn).apply(check)
