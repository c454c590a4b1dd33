"""Sweep: every resource of a stack that still exists (and may bill), found by label or by name.
It lists, never deletes; `down` and `sweep` print what it finds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from infra.gcp.artifact_registry import ArtifactRegistryApi
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
    # service-account, iam-binding, repository, cloud-run-job, scheduler-job
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
    # `billingBudget`'s guard, not listed yet (`down` deletes them): a budget costs nothing, and
    # its topic and subscription bill only for the few notifications a day it publishes
    "gcp:billing/budget:Budget": "costs nothing; not listed yet",
    "gcp:pubsub/topic:Topic": "a few messages a day; not listed yet",
    "gcp:pubsub/subscription:Subscription": "a few messages a day; not listed yet",
    "gcp:pubsub/subscriptionIAMMember:SubscriptionIAMMember": "goes with its subscription",
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
) -> list[Leftover]:
    """Every resource of `stack` that still exists: anything labelled gputrain-stack=<stack>
    (instances, disks, addresses), anything named by the stack prefix rule (all kinds, since
    boot disks only carry labels when the program copies them), the stack's service account and
    the project role bindings that name it, and (given a `storage` adapter, as the controller always
    does) the stack's bucket by its label, and (given `registry` and the stack's `region`) its
    image repository by its label, and (given `jobs` and the region) the reconcile job and its
    Scheduler job. Lists, never deletes."""
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
    from infra.gcp.api import GoogleApiError

    def listed(read: Callable[[str, str], list[JobInfo]]) -> list[JobInfo]:
        try:
            return read(project, region)
        except GoogleApiError as e:
            if e.api_disabled:
                return []
            raise

    name = job_name(stack)
    out = [
        Leftover("cloud-run-job", j.name, j.location, f"label {STACK_LABEL}={stack}")
        for j in listed(jobs.run_jobs)
        if j.labels.get(STACK_LABEL) == stack
    ]
    out += [
        Leftover("scheduler-job", j.name, j.location, f"name {name}")
        for j in listed(jobs.scheduler_jobs)
        if j.name == name
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
    from infra.gcp.api import GoogleApiError

    try:
        found = registry.repositories(project, region)
    except GoogleApiError as e:
        if e.api_disabled:
            return []
        raise
    return [
        Leftover("repository", r.name, r.location, f"label {STACK_LABEL}={stack}")
        for r in found
        if r.labels.get(STACK_LABEL) == stack
    ]
