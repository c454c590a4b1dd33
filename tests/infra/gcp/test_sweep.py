"""Teardown coverage (infra/gcp/sweep.py): every resource type the Pulumi program declares maps to a
kind the sweep lists, the service account and its project role bindings are found through the
real IAM / Cloud Resource Manager REST shapes, and other stacks' accounts are left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from infra.billing import guard_name
from infra.components.identity import NODE_ROLES
from infra.gcp.api import GoogleApiError
from infra.gcp.artifact_registry import ArtifactRegistryApi
from infra.gcp.budget_reads import BudgetReadsApi
from infra.gcp.cloud_run import ReconcileJobsApi
from infra.gcp.compute import ComputeApi
from infra.gcp.gcs import StorageApi
from infra.gcp.iam import IamApi
from infra.gcp.sweep import NOT_SWEPT, SWEPT_TYPES, repository_leftovers, sweep
from infra.gcp.sweep import budget_guard_leftovers as sweep_guard
from infra.reconciler import refresh_role_id
from infra.stackfile import STACK_LABEL, load_stack_config, service_account_id
from tests.support.fake_artifact_registry import FakeArtifactRegistry
from tests.support.fake_cloud_run import FakeCloudRun
from tests.support.fake_compute import FakeCompute
from tests.support.fake_pubsub import FakePubSub
from tests.support.gcs_emulator import GcsEmulator
from tests.support.program import FAMILIES
from tests.support.pulumi_mocks import ROOT, deployable_config, pulumi_mocks

ACCOUNT = "012345-6789AB-CDEF01"  # billingBudget's billing account
# A representative set of stacks: every shipped stack file, every machine family, and the
# options that add or remove resources (an existing network, compact placement, many nodes).
STACKS: list[tuple[str, str, dict[str, str]]] = [
    *[(f"shipped-{s}", s, {}) for s in ("dev", "a100", "h100", "t4", "a4", "a3mega")],
    (
        "a3-ultra-spot",
        "a4",
        {"machineType": "a3-ultragpu-8g", "capacity": "spot", "reservation": ""},
    ),
    ("fabric-existing-network", "a3mega", {"network": "shared-vpc"}),
    *FAMILIES,
    ("existing-network", "dev", {"network": "shared-vpc", "publicIp": "all"}),
    ("compact-4", "h100", {"nodes": "4", "placement": "compact"}),
    ("existing-bucket", "dev", {"bucket": "gs://team-runs/gputrain"}),
    ("shipped-vertex", "vertex", {}),
    ("vertex-secrets", "vertex", {"secrets": '["HF=sm://hf-token"]'}),  # a per-secret grant
    ("build", "dev", {"build": "Dockerfile"}),  # the image repository and its reader grant
    # the project-wide guard: a Cloud Billing budget, its Pub/Sub topic and subscription
    ("billing-budget", "dev", {"billingBudget": '{"account": "012345-6789AB-CDEF01", "usd": 300}'}),
]


def _declared_types(stack: str, overrides: dict[str, str]) -> set[str]:
    """Run the Pulumi program (__main__.py) under mocks; the custom resource types it declared."""
    return {r.typ for r in _declared(stack, overrides)}


def _declared(stack: str, overrides: dict[str, str]) -> list[Any]:
    """Run the Pulumi program (__main__.py) under mocks; the custom resources it declared."""
    import runpy

    cfg = deployable_config(stack, **overrides)
    with pulumi_mocks(load_stack_config(ROOT, stack), stack=stack) as mocks:

        @pulumi.runtime.test
        def program() -> Any:
            pulumi.runtime.set_all_config(cfg, secret_keys=["gputrain:sshPrivateKey"])
            ns = runpy.run_path(str(ROOT / "__main__.py"))
            return pulumi.Output.all(**ns["cluster"].exports())

        program()
        return [r for r in mocks.resources if r.custom]


def _with_recovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """A spot stack whose state a reconcile job can reach: what laptop-closed recovery adds."""
    doc = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text()) or {}
    doc["secretsprovider"] = "gcpkms://projects/p/locations/global/keyRings/r/cryptoKeys/k"
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    with monkeypatch.context() as m:
        m.chdir(tmp_path)
        m.setenv("PULUMI_BACKEND_URL", "gs://state")
        return _declared_types("dev", {})


def test_every_resource_type_the_program_declares_is_swept(
    fake: FakeCompute, gcs: GcsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    declared: set[str] = _with_recovery(tmp_path, monkeypatch)
    assert "gcp:cloudrunv2/job:Job" in declared
    for _, stack, overrides in STACKS:
        declared |= _declared_types(stack, overrides)
    missing = sorted(declared - set(SWEPT_TYPES) - set(NOT_SWEPT))
    assert not missing, f"declared but never swept (add them to infra/sweep.SWEPT_TYPES): {missing}"
    # both ways: an entry for a type nothing declares is stale
    assert set(SWEPT_TYPES) | set(NOT_SWEPT) <= declared
    # ... and every kind in the table is one the sweep really lists: a world with one of each
    dev = "dev"
    fake.add_instance(f"{dev}-node-0", "us-central1-a", labels={"gputrain-stack": dev})
    for kind, name, where in [
        ("networks", f"{dev}-net", {}),
        ("subnetworks", f"{dev}-subnet", {"region": "us-central1"}),
        ("firewalls", f"{dev}-ssh", {}),
        ("resourcePolicies", f"{dev}-compact", {"region": "us-central1"}),
    ]:
        fake.add_resource(kind, name, **where)
    email = fake.add_service_account(service_account_id(dev))
    fake.add_role_binding("roles/logging.logWriter", f"serviceAccount:{email}")
    fake.add_custom_role(refresh_role_id(dev, "bucket", "104"))
    bucket = gcs.client().create_bucket(f"gputrain-{dev}-{fake.project}")
    bucket.labels = {STACK_LABEL: dev}  # the emulator drops labels on insert
    bucket.patch()
    storage = StorageApi(fake.project)
    job = f"projects/{fake.project}/locations/us-central1/jobs/{dev}-reconcile"
    with (
        FakeArtifactRegistry(fake.project) as artifacts,
        FakeCloudRun({}, {}) as run,
        FakePubSub() as guard,
    ):
        artifacts.add(fake.project, "us-central1", "gputrain-dev", {STACK_LABEL: dev})
        run.jobs[job] = {"name": job, "labels": {STACK_LABEL: dev}}
        run.schedules[job] = {"name": job}
        for kind in ("topics", "subscriptions"):
            name = f"projects/{fake.project}/{kind}/{guard_name(dev)}"
            guard.listed[f"projects/{fake.project}/{kind}"] = [{"name": name}]
        budget = {"name": f"billingAccounts/{ACCOUNT}/budgets/b1", "displayName": guard_name(dev)}
        guard.listed[f"billingAccounts/{ACCOUNT}/budgets"] = [budget]
        found = {
            x.kind
            for x in sweep(
                fake.project,
                dev,
                api=ComputeApi(fake.url),
                storage=storage,
                registry=ArtifactRegistryApi(artifacts.url),
                jobs=ReconcileJobsApi(run.url, run.url),
                region="us-central1",
                budget_reads=BudgetReadsApi(guard.url, guard.url),
                billing_account=ACCOUNT,
            )
        }
    assert set(SWEPT_TYPES.values()) <= found


def test_the_budget_guard_is_found_by_its_names_on_every_page() -> None:
    """`billingBudget`'s topic and subscription by their exact names (the program labels
    neither), its budget by its display name on the billing account, asked with the stack's
    project as the quota project; another stack's (`dev-2`) and the user's own are not listed."""
    with FakePubSub() as guard:
        for kind in ("topics", "subscriptions"):
            guard.listed[f"projects/p-1/{kind}"] = [
                {"name": f"projects/p-1/{kind}/{n}"}
                for n in ("alerts", guard_name("dev"), guard_name("dev-2"), "zz")
            ]  # two pages of two
        guard.listed[f"billingAccounts/{ACCOUNT}/budgets"] = [
            {"name": f"billingAccounts/{ACCOUNT}/budgets/{i}", "displayName": n}
            for i, n in enumerate(("team", guard_name("dev-2"), guard_name("dev")))
        ]
        reads = BudgetReadsApi(guard.url, guard.url)
        found = sweep_guard(reads, "p-1", "dev", ACCOUNT)
        assert [(x.kind, x.name, x.location) for x in found] == [
            ("pubsub-topic", f"projects/p-1/topics/{guard_name('dev')}", "global"),
            ("pubsub-subscription", f"projects/p-1/subscriptions/{guard_name('dev')}", "global"),
            ("budget", f"billingAccounts/{ACCOUNT}/budgets/2", f"billing account {ACCOUNT}"),
        ]
        assert guard.quota_projects[-2:] == ["p-1", "p-1"]  # the budgets' two pages
        guard.listed.clear()
        assert sweep_guard(reads, "p-1", "dev", ACCOUNT) == []


def test_the_image_repository_is_found_by_its_label_on_every_page() -> None:
    with FakeArtifactRegistry("p-1") as artifacts:
        api = ArtifactRegistryApi(artifacts.url)
        for name in ("aaa", "gputrain-dev", "team-images", "zzz"):  # 2 pages of 2
            labels = {STACK_LABEL: "dev"} if name == "gputrain-dev" else {STACK_LABEL: "dev-2"}
            artifacts.add("p-1", "us-central1", name, labels)
        found = repository_leftovers(api, "p-1", "us-central1", "dev")
        assert [(x.kind, x.name, x.location, x.matched_by) for x in found] == [
            ("repository", "gputrain-dev", "us-central1", "label gputrain-stack=dev")
        ]
        assert len(api.repositories("p-1", "us-central1")) == 4
        assert repository_leftovers(api, "p-1", "europe-west4", "dev") == []
        artifacts.remove("p-1", "us-central1", "gputrain-dev")
        assert repository_leftovers(api, "p-1", "us-central1", "dev") == []
        with pytest.raises(GoogleApiError, match=r"repositories\.list: 403 Permission"):
            api.repositories("someone-else", "us-central1")
        artifacts.disabled = True  # the API is off: no repository can exist
        assert repository_leftovers(api, "p-1", "us-central1", "dev") == []


@pytest.mark.parametrize("stack", ["a4", "a3mega"])
def test_every_network_subnet_and_firewall_of_a_fabric_is_swept(
    fake: FakeCompute, stack: str
) -> None:
    """The GPU fabric's 3 or 9 VPCs, their subnets and firewalls: each one found by the sweep."""
    kinds = {
        "gcp:compute/network:Network": ("networks", "network"),
        "gcp:compute/subnetwork:Subnetwork": ("subnetworks", "subnetwork"),
        "gcp:compute/firewall:Firewall": ("firewalls", "firewall"),
    }
    declared = [r for r in _declared(stack, {}) if r.typ in kinds]
    assert len([r for r in declared if r.typ.endswith("Network")]) == (3 if stack == "a4" else 9)
    for r in declared:
        where = {"region": r.inputs["region"]} if "region" in r.inputs else {}
        fake.add_resource(kinds[r.typ][0], r.inputs["name"], **where)
    found = {(x.kind, x.name) for x in sweep(fake.project, stack, api=ComputeApi(fake.url))}
    assert found == {(kinds[r.typ][1], r.inputs["name"]) for r in declared}


def test_service_account_and_its_role_bindings_are_found_until_deleted(
    fake: FakeCompute,
) -> None:
    api = ComputeApi(fake.url)
    email = fake.add_service_account("gputrain-dev", "gputrain nodes of stack dev")
    other = fake.add_service_account("gputrain-dev-2")  # another stack: dev-2
    fake.add_service_account("dev-tools")  # the user's own account that starts with the stack
    for role in NODE_ROLES:
        fake.add_role_binding(f"roles/{role}", f"serviceAccount:{email}")
        fake.add_role_binding(f"roles/{role}", f"serviceAccount:{other}")
    found = sweep(fake.project, "dev", api=api)
    assert [(x.kind, x.name, x.matched_by) for x in found] == [
        (
            "iam-binding",
            f"roles/logging.logWriter serviceAccount:{email}",
            "account id gputrain-dev",
        ),
        (
            "iam-binding",
            f"roles/monitoring.metricWriter serviceAccount:{email}",
            "account id gputrain-dev",
        ),
        ("service-account", email, "account id gputrain-dev"),
    ]
    # the account deleted before its bindings: IAM keeps them as deleted:... members
    fake.remove_service_account(email)
    left = sweep(fake.project, "dev", api=api)
    assert [x.kind for x in left] == ["iam-binding", "iam-binding"]
    assert all(
        x.name.split(" ", 1)[1].startswith(f"deleted:serviceAccount:{email}?uid=") for x in left
    )
    for role in NODE_ROLES:
        fake.remove_role_binding(f"roles/{role}", f"serviceAccount:{email}")
    assert sweep(fake.project, "dev", api=api) == []
    assert {x.name for x in sweep(fake.project, "dev-2", api=api)} >= {other}


def test_iam_reads_page_and_fail_in_one_line(fake: FakeCompute) -> None:
    from infra.gcp.compute import ComputeApiError

    iam = IamApi(fake.url)
    for i in range(5):  # the fake pages every 2 accounts
        fake.add_service_account(f"sa-number-{i}")
    assert len(iam.service_accounts(fake.project)) == 5
    assert ("roles/owner", "user:owner@example.com") in iam.role_bindings(fake.project)
    with pytest.raises(ComputeApiError, match=r"IAM serviceAccounts.list: 403 Permission"):
        iam.service_accounts("someone-else")
    with pytest.raises(ComputeApiError, match=r"projects.getIamPolicy: 403"):
        iam.role_bindings("someone-else")


def test_the_reconcile_job_and_its_schedule_are_found_by_label_and_name() -> None:
    """Laptop-closed recovery's Cloud Run job (by its gputrain-stack label) and Cloud Scheduler
    job (by its exact name `<stack>-reconcile`: Scheduler jobs have no labels), through the real
    REST list shapes on every page; other stacks' and the user's own jobs are not listed."""
    from infra.gcp.sweep import reconcile_job_leftovers

    base = "projects/p-1/locations/us-central1"
    with FakeCloudRun({}, {}) as fake:
        for job, stack in [("a-job", None), ("dev-2-reconcile", "dev-2"), ("dev-reconcile", "dev"),
                           ("nightly", None), ("zz", "dev")]:  # fmt: skip
            labels = {STACK_LABEL: stack} if stack else {}
            fake.jobs[f"{base}/jobs/{job}"] = {"name": f"{base}/jobs/{job}", "labels": labels}
            fake.schedules[f"{base}/jobs/{job}"] = {"name": f"{base}/jobs/{job}"}
        api = ReconcileJobsApi(fake.url, fake.url)
        assert len(api.run_jobs("p-1", "us-central1")) == 5  # three pages of two
        found = reconcile_job_leftovers(api, "p-1", "us-central1", "dev")
        assert [(x.kind, x.name, x.location, x.matched_by) for x in found] == [
            ("cloud-run-job", "dev-reconcile", "us-central1", "label gputrain-stack=dev"),
            ("cloud-run-job", "zz", "us-central1", "label gputrain-stack=dev"),
            ("scheduler-job", "dev-reconcile", "us-central1", "name dev-reconcile"),
        ]
        assert reconcile_job_leftovers(api, "p-1", "europe-west4", "dev") == []
        fake.jobs.clear()
        fake.schedules.clear()
        assert reconcile_job_leftovers(api, "p-1", "us-central1", "dev") == []
        assert ("GET", f"/v1/{base}/jobs", "") in fake.requests  # Scheduler's own path


def test_the_reconcile_jobs_account_and_its_bindings_are_found(fake: FakeCompute) -> None:
    rc = fake.add_service_account("gputrain-rc-dev", "gputrain reconcile of stack dev")
    fake.add_service_account("gputrain-rc-dev-2")  # another stack's
    fake.add_role_binding("roles/compute.viewer", f"serviceAccount:{rc}")
    found = sweep(fake.project, "dev", api=ComputeApi(fake.url))
    assert [(x.kind, x.name, x.matched_by) for x in found] == [
        ("iam-binding", f"roles/compute.viewer serviceAccount:{rc}", "account id gputrain-rc-dev"),
        ("service-account", rc, "account id gputrain-rc-dev"),
    ]


def test_the_reconcile_jobs_custom_roles_are_found_by_their_id(fake: FakeCompute) -> None:
    """The read-only roles the program declares for the job's `pulumi refresh`, named as the
    program names them, on every page of `projects.roles.list`; another stack's whose name
    begins the same, a user's own and a deleted one (it grants and costs nothing) are not."""
    ours = [refresh_role_id("dev", kind, uid) for kind, uid in [("bucket", "111"), ("job", None)]]
    for role in [*ours, refresh_role_id("dev-2", "bucket", "222"), "myOwnRole"]:
        fake.add_custom_role(role)
    fake.add_custom_role(refresh_role_id("dev", "repo", "333"), deleted=True)
    assert len(IamApi(fake.url).custom_roles(fake.project)) == 4  # two pages of two
    found = sweep(fake.project, "dev", api=ComputeApi(fake.url))
    assert sorted((x.kind, x.name) for x in found) == sorted(
        ("custom-role", f"projects/{fake.project}/roles/{r}") for r in ours
    )
    assert ("custom-role", f"projects/{fake.project}/roles/{ours[0]}") not in [
        (x.kind, x.name) for x in sweep(fake.project, "dev-2", api=ComputeApi(fake.url))
    ]
