"""The IAM permissions gputrain needs on the project, and the predefined roles that grant them.

Derived from what it does, not guessed: for every resource type the Pulumi program declares, what
Pulumi's gcp provider calls to create, read, update and delete it (Compute Engine, IAM and Resource
Manager reference pages, "IAM permissions" of each method); then what `up` waits on (operations)
and the controller's own reads (preflight, host keys from guest attributes, status, sweep). A test
runs the program under the SDK's mocks for every shipped stack and layout and fails if it declares
a type this table does not cover. `gputrain doctor` asks `projects.testIamPermissions` for all of
them; docs/getting-started.md lists the roles.

Not checked here: the image projects' `compute.images.useReadOnly` (public Deep Learning VM
images grant it to every authenticated user) — they are other projects.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.spec import ClusterSpec

#: Pulumi type token -> what the gcp provider needs to create, read, update and delete it.
RESOURCE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "gcp:compute/network:Network": (
        "compute.networks.create",
        "compute.networks.get",
        "compute.networks.delete",
    ),
    "gcp:compute/subnetwork:Subnetwork": (
        "compute.subnetworks.create",
        "compute.subnetworks.get",
        "compute.subnetworks.delete",
    ),
    "gcp:compute/firewall:Firewall": (
        "compute.firewalls.create",
        "compute.firewalls.get",
        "compute.firewalls.update",
        "compute.firewalls.delete",
        "compute.networks.updatePolicy",  # a firewall changes its network's policy
    ),
    "gcp:compute/resourcePolicy:ResourcePolicy": (
        "compute.resourcePolicies.create",
        "compute.resourcePolicies.get",
        "compute.resourcePolicies.delete",
        "compute.resourcePolicies.use",  # instances attach the compact placement
    ),
    "gcp:compute/instance:Instance": (
        "compute.instances.create",
        "compute.instances.get",
        "compute.instances.delete",
        "compute.instances.setMetadata",  # ssh-keys, enable-guest-attributes
        "compute.instances.setLabels",
        "compute.instances.setTags",
        "compute.instances.setServiceAccount",
        "compute.disks.create",  # the boot disk
        "compute.disks.setLabels",
        "compute.subnetworks.use",
        "compute.subnetworks.useExternalIp",  # the head's public address
        "iam.serviceAccounts.actAs",  # the VMs run as the stack's service account
    ),
    "gcp:serviceaccount/account:Account": (
        "iam.serviceAccounts.create",
        "iam.serviceAccounts.get",
        "iam.serviceAccounts.update",
        "iam.serviceAccounts.delete",
    ),
    "gcp:projects/iAMMember:IAMMember": (  # autodown's conditional binding too (policy v3):
        "resourcemanager.projects.getIamPolicy",  # the binding is a read-modify-write of the
        "resourcemanager.projects.setIamPolicy",  # project's policy; granting a role under a
    ),  # condition needs nothing more (projectIamAdmin may grant any role)
    "gcp:storage/bucket:Bucket": (
        "storage.buckets.create",
        "storage.buckets.get",
        "storage.buckets.update",
        "storage.buckets.delete",
    ),
    "gcp:storage/bucketIAMMember:BucketIAMMember": (
        "storage.buckets.getIamPolicy",  # a read-modify-write of the bucket's policy
        "storage.buckets.setIamPolicy",
    ),
    "gcp:projects/service:Service": (  # backend vertex: the Vertex AI API
        "serviceusage.services.enable",
        "serviceusage.services.get",
    ),
    "gcp:artifactregistry/repository:Repository": (  # `build`: the stack's image repository
        "artifactregistry.repositories.create",
        "artifactregistry.repositories.get",
        "artifactregistry.repositories.update",
        "artifactregistry.repositories.delete",
    ),
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": (  # reader for the nodes
        "artifactregistry.repositories.getIamPolicy",  # a read-modify-write of its policy
        "artifactregistry.repositories.setIamPolicy",
    ),
    "gcp:secretmanager/secretIamMember:SecretIamMember": (  # vertex: the job reads its secrets
        "secretmanager.secrets.getIamPolicy",  # a read-modify-write of that secret's policy
        "secretmanager.secrets.setIamPolicy",
    ),
    # billingBudget: the guard's topic and subscription, the nodes' subscriber grant on it
    "gcp:pubsub/topic:Topic": (
        "pubsub.topics.create",
        "pubsub.topics.get",
        "pubsub.topics.delete",
        "pubsub.topics.list",  # the sweep finds a leftover topic by its name
    ),
    "gcp:pubsub/subscription:Subscription": (
        "pubsub.subscriptions.create",
        "pubsub.subscriptions.get",
        "pubsub.subscriptions.delete",
        "pubsub.subscriptions.list",  # the sweep finds a leftover subscription by its name
        "pubsub.topics.attachSubscription",
    ),
    "gcp:pubsub/subscriptionIAMMember:SubscriptionIAMMember": (
        "pubsub.subscriptions.getIamPolicy",
        "pubsub.subscriptions.setIamPolicy",
    ),
    # on the billing account, not the project (infra/billing.py BUDGET_PERMISSIONS): `plan` says
    # so; projects.testIamPermissions cannot ask for them
    "gcp:billing/budget:Budget": (),
    # recover: the reconcile job (infra/components/reconciler.py), its schedule and grants
    "gcp:cloudrunv2/job:Job": (
        "run.jobs.create",
        "run.jobs.get",
        "run.jobs.update",
        "run.jobs.delete",
        "iam.serviceAccounts.actAs",  # the job runs as its own account
    ),
    "gcp:cloudrunv2/jobIamMember:JobIamMember": ("run.jobs.getIamPolicy", "run.jobs.setIamPolicy"),
    "gcp:cloudscheduler/job:Job": (
        "cloudscheduler.jobs.create",
        "cloudscheduler.jobs.get",
        "cloudscheduler.jobs.update",
        "cloudscheduler.jobs.delete",
        "iam.serviceAccounts.actAs",  # its OAuth token is the job's account's
    ),
    "gcp:serviceaccount/iAMMember:IAMMember": (
        "iam.serviceAccounts.getIamPolicy",
        "iam.serviceAccounts.setIamPolicy",
    ),
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": (  # decrypting the state's secrets
        "cloudkms.cryptoKeys.getIamPolicy",
        "cloudkms.cryptoKeys.setIamPolicy",
    ),
    "gcp:projects/iAMCustomRole:IAMCustomRole": (  # the refresh's reads, per kind of resource
        "iam.roles.create",
        "iam.roles.get",
        "iam.roles.update",
        "iam.roles.delete",
    ),
}

#: Only with `billingBudget`: the Cloud Billing budget guard.
GUARD_TYPES = frozenset(
    t for t in RESOURCE_PERMISSIONS if t.startswith(("gcp:pubsub/", "gcp:billing/"))
)

#: Only where the stack declares the reconcile job (`recover`); its image repository too.
RECONCILER_TYPES = frozenset(
    {
        "gcp:cloudrunv2/job:Job",
        "gcp:cloudrunv2/jobIamMember:JobIamMember",
        "gcp:cloudscheduler/job:Job",
        "gcp:serviceaccount/iAMMember:IAMMember",
        "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember",
        "gcp:projects/iAMCustomRole:IAMCustomRole",
    }
)

#: Only with `build`: the image repository and its reader grant.
BUILD_TYPES = frozenset(t for t in RESOURCE_PERMISSIONS if t.startswith("gcp:artifactregistry/"))

#: Only on GCE stacks: Vertex stacks have no VMs, network or placement.
COMPUTE_TYPES = frozenset(t for t in RESOURCE_PERMISSIONS if t.startswith("gcp:compute/"))

#: `pulumi up` waits on the operations it started.
OPERATIONS = (
    "compute.zoneOperations.get",
    "compute.regionOperations.get",
    "compute.globalOperations.get",
)

#: The controller's reads: preflight, host keys, status, sweep (infra/gcp/compute.py).
CONTROLLER_READS = (
    "compute.projects.get",
    "compute.regions.get",
    "compute.machineTypes.get",
    "compute.acceleratorTypes.list",
    "compute.reservations.get",  # capacity reservation: its free VMs, dense / calendar mode
    "compute.networkProfiles.get",  # A3 Ultra / A4: the zone's RoCE profile
    "compute.zoneOperations.list",  # recovery: was a VM preempted or lost to a host error?
    "compute.instances.getGuestAttributes",
    "compute.instances.list",
    "compute.disks.list",
    "compute.addresses.list",
    "compute.globalAddresses.list",
    "compute.subnetworks.list",
    "compute.resourcePolicies.list",
    "compute.firewalls.list",
    "compute.networks.list",
    "storage.buckets.list",  # the sweep finds a leftover bucket by its label
    "storage.objects.list",  # `down`: the runs' results come home, then the bucket is emptied
    "storage.objects.get",
    "storage.objects.delete",
)

#: A Vertex AI job (backend: vertex): create, follow and cancel it, its logs, its code in a bucket.
VERTEX = (
    "aiplatform.customJobs.create",
    "aiplatform.customJobs.get",
    "aiplatform.customJobs.cancel",
    "logging.logEntries.list",
    "storage.objects.create",  # the job's package is staged in the bucket
    "iam.serviceAccounts.actAs",  # jobs run as the stack's service account
)

#: `build`: the controller looks the tag up, pushes a local build and sweeps the repository.
BUILD_LOCAL = (
    "artifactregistry.repositories.downloadArtifacts",  # the tag's digest (no rebuild)
    "artifactregistry.repositories.uploadArtifacts",  # docker push
    "artifactregistry.repositories.list",  # the sweep finds a leftover repository
)
#: `build` without a local docker/podman: Cloud Build from a tarball in the stack's bucket.
BUILD_CLOUD = (
    "artifactregistry.repositories.downloadArtifacts",
    "artifactregistry.repositories.list",
    "cloudbuild.builds.create",
    "cloudbuild.builds.get",
    "storage.objects.create",  # the context tarball
    "iam.serviceAccounts.actAs",  # the build runs as the stack's service account
)

#: The predefined role that grants a permission: the most specific prefix wins.
ROLES: tuple[tuple[str, str], ...] = (
    ("compute.firewalls.", "roles/compute.securityAdmin"),
    ("compute.networks.updatePolicy", "roles/compute.securityAdmin"),
    ("compute.networks.", "roles/compute.networkAdmin"),
    ("compute.subnetworks.create", "roles/compute.networkAdmin"),
    ("compute.subnetworks.delete", "roles/compute.networkAdmin"),
    ("compute.", "roles/compute.instanceAdmin.v1"),
    ("iam.serviceAccounts.actAs", "roles/iam.serviceAccountUser"),
    ("iam.serviceAccounts.", "roles/iam.serviceAccountAdmin"),
    ("resourcemanager.projects.", "roles/resourcemanager.projectIamAdmin"),
    ("aiplatform.", "roles/aiplatform.user"),
    ("logging.", "roles/logging.viewer"),
    ("storage.buckets.", "roles/storage.admin"),
    ("storage.", "roles/storage.objectAdmin"),
    ("serviceusage.", "roles/serviceusage.serviceUsageAdmin"),
    ("artifactregistry.repositories.downloadArtifacts", "roles/artifactregistry.reader"),
    ("artifactregistry.repositories.uploadArtifacts", "roles/artifactregistry.writer"),
    ("artifactregistry.", "roles/artifactregistry.admin"),  # the repository and its policy
    ("cloudbuild.builds.", "roles/cloudbuild.builds.editor"),
    ("secretmanager.", "roles/secretmanager.admin"),  # on those secrets (or the project)
    ("pubsub.", "roles/pubsub.admin"),  # the guard's topic, subscription and its policy
    ("run.", "roles/run.admin"),  # the reconcile job and its invoker grant
    ("cloudscheduler.", "roles/cloudscheduler.admin"),
    ("iam.roles.", "roles/iam.roleAdmin"),  # the reconcile job's refresh roles
    ("cloudkms.", "roles/cloudkms.admin"),  # the decrypt grant on the state's key
)


def resource_types(
    *,
    own_network: bool,
    placement: bool,
    own_bucket: bool = True,
    vertex: bool = False,
    build: bool = False,
    secret_access: bool = False,
    guard: bool = False,
    reconciler: bool = False,
    state_key: bool = False,
) -> list[str]:
    """The types the program declares for a stack: its own VPC unless `network` names one, a
    placement policy when compact, its own bucket unless `bucket` names one, the image
    repository with `build`, per-secret access grants with a Vertex stack's Secret Manager
    `secrets`, the reconcile job with `recover` (its decrypt grant with a KMS-encrypted
    state: `state_key`); on Vertex AI the API and no Compute resources (a test holds this
    to the program under mocks)."""
    optional = {
        **dict.fromkeys(BUILD_TYPES, build or reconciler),
        **dict.fromkeys(GUARD_TYPES, guard),
        **dict.fromkeys(RECONCILER_TYPES, reconciler),
        "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": reconciler and state_key,
        "gcp:compute/network:Network": own_network,
        "gcp:compute/subnetwork:Subnetwork": own_network,
        "gcp:compute/resourcePolicy:ResourcePolicy": placement,
        "gcp:storage/bucket:Bucket": own_bucket,
        "gcp:projects/service:Service": vertex,
        "gcp:secretmanager/secretIamMember:SecretIamMember": secret_access
        and (vertex or reconciler),
    }
    return [
        t
        for t in RESOURCE_PERMISSIONS
        if optional.get(t, True) and not (vertex and t in COMPUTE_TYPES)
    ]


def spec_resource_types(spec: ClusterSpec) -> list[str]:
    """`resource_types` of a validated spec."""
    from infra.reconciler import wanted

    reconciler = not spec.on_vertex and wanted(spec.recover, spec.capacity, spec.job_reach)
    return resource_types(
        own_network=spec.network is None or (spec.fabric is not None and spec.fabric.enabled),
        placement=spec.placement == "compact",
        own_bucket=spec.existing_bucket is None,
        vertex=spec.on_vertex,
        build=bool(spec.build),
        secret_access=bool(spec.secret_access),
        guard=spec.billing_budget is not None,
        reconciler=reconciler,
        state_key=reconciler and spec.job_reach is not None and bool(spec.job_reach.kms_key),
    )


def required_permissions(
    resource_types: Iterable[str], *, vertex: bool = False, builder: str | None = None
) -> list[str]:
    """Every permission for these Pulumi resource types, `up`'s waits and the controller's reads
    (and a Vertex job's; and `build`'s with builder "local" or "cloud"), sorted and once each.
    Raises KeyError for a type not in the table."""
    needed = {p for t in resource_types for p in RESOURCE_PERMISSIONS[t]}
    needed |= {*OPERATIONS, *CONTROLLER_READS}
    if vertex:
        needed |= set(VERTEX)
    if builder is not None:
        needed |= set(BUILD_LOCAL if builder == "local" else BUILD_CLOUD)
    return sorted(needed)


def all_permissions(*, vertex: bool = False) -> list[str]:
    """What any stack may need: every resource type the program can declare."""
    return required_permissions(RESOURCE_PERMISSIONS, vertex=vertex, builder="local")


def role_for(permission: str) -> str:
    best = max((p for p, _ in ROLES if permission.startswith(p)), key=len, default=None)
    return dict(ROLES)[best] if best else "roles/owner"


def roles_for(permissions: Iterable[str]) -> list[str]:
    """The predefined roles that grant these permissions, sorted, once each."""
    return sorted({role_for(p) for p in permissions})
