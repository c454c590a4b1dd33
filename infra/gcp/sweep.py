"""Sweep: every resource of a stack that still exists (and may bill), found by label or by name.
It lists, never deletes; `down` and `sweep` print what it finds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from infra.billing import guard_name
from infra.gcp.artifact_registry import ArtifactRegistryApi
from infra.gcp.budget_reads import BudgetReadsApi
from infra.gcp.cloud_run import JobInfo, ReconcileJobsApi
from infra.gcp.compute import ComputeApi
from infra.gcp.gcs import StorageApi
from infra.gcp.iam import IamApi
from infra.reconciler import account_id as reconcile_account_id
from infra.reconciler import is_refresh_role, job_name
from infra.stackfile import STACK_LABEL, service_account_id

#: The kinds the sweep lists: Compute kinds from ComputeApi.stack_resource_candidates, and the
#: stack's own bucket (Cloud Storage, by label) for gcp:storage/bucket:Bucket; the bucket's
#: objectUser grant (gcp:storage/bucketIAMMember:BucketIAMMember) lives and dies with it.
BUCKET_KIND = "bucket"


@dataclass(frozen=True)
class Leftover:
    """A resource of the stack that still exists (and may bill)."""

    kind: str  # instance, disk, address, firewall, network, subnetwork, resource-policy, bucket,
    # service-account, iam-binding, repository, cloud-run-job, scheduler-job, custom-role,
    # pubsub-topic, pubsub-subscription, budget
    name: str
    location: str  # zone, region, "global", or a bucket's location
    matched_by: str  # "label gputrain-stack=dev" or "name prefix dev-"

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({self.location}; {self.matched_by})"


def owned_by_name(name: str, stack: str) -> bool:
    """The name rule for resources GCE cannot label (firewalls, networks, subnetworks, resource
    policies): the stack's resources are named `<stack>` or `<stack>-...` (`dev-net`, `dev-ssh`,
    `dev-node-0`). Another stack whose name starts with `<stack>-` (dev / dev-2) also matches, so
    sweep reports it: a loud false positive, never a silent miss."""
    return name == stack or name.startswith(f"{stack}-")


#: Every resource type the Pulumi program declares -> the sweep kind that finds it when it is left
#: behind (one table; tests/infra/gcp/test_sweep.py runs the program and holds the two in step).
SWEPT_TYPES: dict[str, str] = {
    "gcp:compute/instance:Instance": "instance",  # + its boot "disk"; external IPs are ephemeral
    "gcp:compute/network:Network": "network",
    "gcp:compute/subnetwork:Subnetwork": "subnetwork",
    "gcp:compute/firewall:Firewall": "firewall",
    "gcp:compute/resourcePolicy:ResourcePolicy": "resource-policy",
    "gcp:serviceaccount/account:Account": "service-account",
    "gcp:projects/iAMMember:IAMMember": "iam-binding",
    "gcp:storage/bucket:Bucket": "bucket",  # found by its label
    "gcp:storage/bucketIAMMember:BucketIAMMember": "bucket",  # goes with its bucket
    "gcp:artifactregistry/repository:Repository": "repository",  # `build`: found by its label
    # the reader grant lives and dies with its repository
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": "repository",
    # laptop-closed recovery: the reconcile job (by its label), its invoker grant with it, the
    # Scheduler job (by its name), its account's grant on the nodes' account with the accounts
    "gcp:cloudrunv2/job:Job": "cloud-run-job",
    "gcp:cloudrunv2/jobIamMember:JobIamMember": "cloud-run-job",
    "gcp:cloudscheduler/job:Job": "scheduler-job",
    "gcp:serviceaccount/iAMMember:IAMMember": "service-account",
    # the reconcile job's read-only roles for `pulumi refresh` (by their id's stack part)
    "gcp:projects/iAMCustomRole:IAMCustomRole": "custom-role",
    # `billingBudget`'s guard: its topic and subscription (by their exact name), the reader grant
    # with the subscription, the budget (by its display name, on the billing account)
    "gcp:pubsub/topic:Topic": "pubsub-topic",
    "gcp:pubsub/subscription:Subscription": "pubsub-subscription",
    "gcp:pubsub/subscriptionIAMMember:SubscriptionIAMMember": "pubsub-subscription",
    "gcp:billing/budget:Budget": "budget",
}

#: Declared but never a leftover: the Vertex AI API stays enabled on destroy (disable_on_destroy
#: is off, as other stacks and the user's own jobs may use it) and costs nothing.
NOT_SWEPT: dict[str, str] = {
    "gcp:projects/service:Service": "left enabled on purpose",
    # a member of the user's own secret's policy: costs nothing, grants nothing once the stack's
    # service account (swept) is deleted, and the secret is not the stack's to delete
    "gcp:secretmanager/secretIamMember:SecretIamMember": "goes with the service account",
    # the reconcile job's account on the user's own KMS key (the Pulumi secrets provider): the
    # same, a member of the key's policy, which is not the stack's
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": "goes with the service account",
    "pulumi:providers:gcp": "the budget's provider (billing_project): no cloud resource",
}


def sweep(
    project: str,
    stack: str,
    *,
    api: ComputeApi | None = None,
    iam: IamApi | None = None,
    storage: StorageApi | None = None,
    registry: ArtifactRegistryApi | None = None,
    jobs: ReconcileJobsApi | None = None,
    region: str | None = None,
    budget_reads: BudgetReadsApi | None = None,
    billing_account: str | None = None,
) -> list[Leftover]:
    """Every resource of `stack` that still exists: anything labelled gputrain-stack=<stack>
    (instances, disks, addresses), anything named by the stack prefix rule (all kinds, since
    boot disks only carry labels when the program copies them), the stack's service account and
    the project role bindings that name it, and (given a `storage` adapter, as the controller always
    does) the stack's bucket by its label, and (given `registry` and the stack's `region`) its
    image repository by its label, and (given `jobs` and the region) the reconcile job and its
    Scheduler job, and (given `budget_reads` and the billing account of `billingBudget`) the
    guard's topic, subscription and budget. Lists, never deletes."""
    api = api or ComputeApi()
    iam = iam or IamApi(api.api_endpoint)
    leftovers: list[Leftover] = []
    for kind, item, location in api.stack_resource_candidates(project):
        labels: Mapping[str, str] = dict(getattr(item, "labels", {}) or {})
        if labels.get(STACK_LABEL) == stack:
            leftovers.append(Leftover(kind, item.name, location, f"label {STACK_LABEL}={stack}"))
        elif owned_by_name(item.name, stack):
            leftovers.append(Leftover(kind, item.name, location, f"name prefix {stack}-"))
    leftovers += identity_leftovers(iam, project, stack)
    if storage is not None:
        leftovers += bucket_leftovers(storage, project, stack)
    if registry is not None and region:
        leftovers += repository_leftovers(registry, project, region, stack)
    if jobs is not None and region:
        leftovers += reconcile_job_leftovers(jobs, project, region, stack)
    if budget_reads is not None and billing_account:
        leftovers += budget_guard_leftovers(budget_reads, project, stack, billing_account)
    return sorted(leftovers, key=lambda leftover: (leftover.kind, leftover.location, leftover.name))


def identity_leftovers(iam: IamApi, project: str, stack: str) -> list[Leftover]:
    """The stack's service accounts (the nodes' and the reconcile job's, by exact account id),
    the reconcile job's custom roles (by their id), and every project role binding of the
    accounts, also the `deleted:serviceAccount:` members IAM keeps when the account went first."""
    ids = (service_account_id(stack), reconcile_account_id(stack))
    out = [
        Leftover("service-account", sa.email, "project", f"account id {sa.account_id}")
        for sa in iam.service_accounts(project)
        if sa.account_id in ids
    ]
    out += [
        Leftover("custom-role", f"projects/{project}/roles/{role}", "project", "role id")
        for role in iam.custom_roles(project)
        if is_refresh_role(role, stack)
    ]
    members = {f"serviceAccount:{i}@{project}.iam.gserviceaccount.com": i for i in ids}
    for role, who in iam.role_bindings(project):
        for member, i in members.items():
            if who == member or who.startswith(f"deleted:{member}?uid="):
                out.append(Leftover("iam-binding", f"{role} {who}", "project", f"account id {i}"))
    return out


def reconcile_job_leftovers(
    jobs: ReconcileJobsApi, project: str, region: str, stack: str
) -> list[Leftover]:
    """Laptop-closed recovery's Cloud Run job (by its label) and its Cloud Scheduler job (by its
    exact name: Scheduler jobs carry no labels); none where an API is off (then none exists)."""
    name = job_name(stack)
    found: list[JobInfo] = _unless_api_off(jobs.run_jobs, project, region)
    out = [
        Leftover("cloud-run-job", j.name, j.location, f"label {STACK_LABEL}={stack}")
        for j in found
        if j.labels.get(STACK_LABEL) == stack
    ]
    out += [
        Leftover("scheduler-job", j.name, j.location, f"name {name}")
        for j in _unless_api_off(jobs.scheduler_jobs, project, region)
        if j.name == name
    ]
    return out


def budget_guard_leftovers(
    reads: BudgetReadsApi, project: str, stack: str, account: str
) -> list[Leftover]:
    """`billingBudget`'s Pub/Sub topic and subscription (by their exact name: the program gives
    them no labels) and its budget on the billing account (by its display name, the same);
    none where an API is off (then none exists)."""
    name = guard_name(stack)
    out = [
        Leftover(kind, full, "global", f"name {name}")
        for kind, read, part in (
            ("pubsub-topic", reads.topics, "topics"),
            ("pubsub-subscription", reads.subscriptions, "subscriptions"),
        )
        for full in _unless_api_off(read, project)
        if full == f"projects/{project}/{part}/{name}"
    ]
    out += [
        Leftover("budget", b.name, f"billing account {account}", f"display name {name}")
        for b in _unless_api_off(reads.budgets, account, project)
        if b.display_name == name
    ]
    return out


def bucket_leftovers(storage: StorageApi, project: str, stack: str) -> list[Leftover]:
    """The stack's own bucket, by its label (the JSON API lists every bucket of the project)."""
    return [
        Leftover(BUCKET_KIND, b.name, b.location, f"label {STACK_LABEL}={stack}")
        for b in storage.list_buckets(project)
        if b.labels.get(STACK_LABEL) == stack
    ]


def repository_leftovers(
    registry: ArtifactRegistryApi, project: str, region: str, stack: str
) -> list[Leftover]:
    """The stack's Docker repository (`build`), by its label; none where the API is off (then
    no repository can exist)."""
    return [
        Leftover("repository", r.name, r.location, f"label {STACK_LABEL}={stack}")
        for r in _unless_api_off(registry.repositories, project, region)
        if r.labels.get(STACK_LABEL) == stack
    ]


def _unless_api_off(read: Callable[..., list[Any]], *args: str) -> list[Any]:
    """What a list call reads; nothing where its API is off (then none of its kind can exist)."""
    from infra.gcp.api import GoogleApiError

    try:
        return read(*args)
    except GoogleApiError as e:
        if e.api_disabled:
            return []
        raise
