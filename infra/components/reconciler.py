"""StackReconciler: laptop-closed recovery, declared with the stack and destroyed with it — a Cloud
Run job whose container runs `gputrain reconcile --stack S`, a Cloud Scheduler job that starts it
every `reconcileEvery` (an HTTP POST to the Cloud Run Admin API's `jobs:run`, with an OAuth token
of the job's own service account), that account with grants on the stack's own resources, Direct
VPC egress into the stack's subnet, and SSH opened to that subnet's range only. The job's
container is infra/reconciler_image.py's, which the controller builds into the stack's own
repository before `up`; it finds the stack's Pulumi state and its stack file in its environment.

Nothing of it runs between passes: a job execution bills only while the pass runs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from infra.components import child_options
from infra.components.secret_access import grant_secret_access
from infra.reconciler import (
    BACKEND_ENV,
    REFRESH_PERMISSIONS,
    STACK_FILE_ENV,
    JobReach,
    account_id,
    job_name,
    job_reach,
    refresh_role_id,
    run_uri,
    schedule,
    wanted,
)
from infra.spec import ClusterSpec
from infra.stackfile import SpecError, read_stack_file

COMPONENT_TYPE = "gputrain:infra:StackReconciler"
#: What the pass does, as predefined roles: read the stack (Pulumi refresh), re-create its VMs
#: and delete them (conditioned on the stack's own instances and disks), act as the nodes'
#: account when creating them, and read/write the stack's bucket (manifest, lease, checkpoints).
PROJECT_VIEW_ROLE = "roles/compute.viewer"
INSTANCE_ROLE = "roles/compute.instanceAdmin.v1"
ACT_AS_ROLE = "roles/iam.serviceAccountUser"
BUCKET_ROLE = "roles/storage.objectAdmin"
INVOKER_ROLE = "roles/run.invoker"  # Cloud Scheduler's token calls jobs:run as this account
#: The pass's Pulumi CLI reads and writes the stack's state (a gs:// backend: objects and their
#: lock in that bucket) and decrypts the stack's secrets with its gcpkms:// key
STATE_ROLE = "roles/storage.objectAdmin"
DECRYPT_ROLE = "roles/cloudkms.cryptoKeyDecrypter"
OAUTH_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


#: Cloud Run's limit on one environment variable's value (the v2 Job's `env.value`)
ENV_VALUE_MAX = 32768


@dataclass(frozen=True)
class ReconcileSource:
    """What the job runs and reads: its image (reconciler_image.py's reference) and the stack
    file's text (its secure values stay ciphertext, which the job decrypts with the KMS key)."""

    image: str
    stack_file: str
    stack: str

    def environment(self, reach: JobReach | None) -> dict[str, str]:
        if len(self.stack_file) > ENV_VALUE_MAX:
            raise SpecError(
                f"Pulumi.{self.stack}.yaml is {len(self.stack_file)} characters: the reconcile "
                f"job gets it in one environment variable, at most {ENV_VALUE_MAX}; allowed: a "
                "smaller stack file, or recover: never"
            )
        env = {STACK_FILE_ENV: self.stack_file}
        if reach is not None and reach.backend:
            env[BACKEND_ENV] = reach.backend
        return env


def program_source(
    spec: ClusterSpec, root: Path, environ: Mapping[str, str]
) -> tuple[ClusterSpec, ReconcileSource | None]:
    """In the program: the spec with where a job would find the state (the environment's
    PULUMI_BACKEND_URL, the stack file's secrets provider) and, where the stack then declares the
    reconciler, its image and stack file."""
    from infra.reconciler_image import image_reference

    stack_file = root / f"Pulumi.{spec.stack}.yaml"
    provider = read_stack_file(root, spec.stack).secrets.provider if stack_file.is_file() else None
    spec = dataclasses.replace(spec, job_reach=job_reach(environ, provider))
    if not wanted(spec.recover, spec.capacity, spec.job_reach) or spec.project is None:
        return spec, None
    image = image_reference(root, spec.region, spec.project, spec.stack)
    return spec, ReconcileSource(image, stack_file.read_text(), spec.stack)


@dataclass(frozen=True)
class StackReconcilerArgs:
    stack: str
    project: str
    region: str
    image: str  # the container with gputrain (and the Pulumi CLI) in it: reconciler_image.py
    every_s: int
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str] | None
    subnet_cidr: str  # Direct VPC egress takes its addresses here: SSH opens to it only
    tag: str  # the nodes' network tag
    bucket: pulumi.Input[str]
    node_account_id: pulumi.Input[str]  # the nodes' service account (its `name`)
    instance_condition: str  # CEL: the stack's own VMs and disks
    labels: dict[str, str]  # the stack's labels (what `sweep` looks for)
    environment: dict[str, str]  # the container's: the state backend, the stack file
    state_bucket: str | None = None  # the gs:// backend's bucket: the job reads and writes it
    kms_key: str | None = None  # the stack's gcpkms:// key: the job decrypts with it
    repository: pulumi.Input[str] | None = None  # the stack's Artifact Registry repository id
    # (project, secret id) of the stack's `secrets` from Secret Manager: the pass reads them
    secret_access: tuple[tuple[str, str], ...] = ()


class StackReconciler(pulumi.ComponentResource):
    def __init__(
        self, name: str, args: StackReconcilerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(COMPONENT_TYPE, name, None, opts)
        child = child_options(self, opts)
        s = args.stack
        self.account = gcp.serviceaccount.Account(
            f"{s}-reconcile-sa",
            account_id=account_id(s),
            project=args.project,
            display_name=f"gputrain reconcile of stack {s}",
            opts=child,
        )
        member = self.account.email.apply(lambda e: f"serviceAccount:{e}")
        self.grants: list[pulumi.Resource] = [
            gcp.projects.IAMMember(
                f"{s}-reconcile-view",
                project=args.project,
                role=PROJECT_VIEW_ROLE,
                member=member,
                opts=child,
            ),
            gcp.projects.IAMMember(
                f"{s}-reconcile-instances",
                project=args.project,
                role=INSTANCE_ROLE,
                member=member,
                condition=gcp.projects.IAMMemberConditionArgs(
                    title=f"gputrain-{s}-own-vms",
                    description=f"only the VMs and boot disks of stack {s}",
                    expression=args.instance_condition,
                ),
                opts=child,
            ),
            gcp.serviceaccount.IAMMember(
                f"{s}-reconcile-act-as",
                service_account_id=args.node_account_id,
                role=ACT_AS_ROLE,
                member=member,
                opts=child,
            ),
            gcp.storage.BucketIAMMember(
                f"{s}-reconcile-bucket",
                bucket=args.bucket,
                role=BUCKET_ROLE,
                member=member,
                opts=child,
            ),
        ]
        if args.state_bucket:
            self.grants.append(
                gcp.storage.BucketIAMMember(
                    f"{s}-reconcile-state",
                    bucket=args.state_bucket,
                    role=STATE_ROLE,
                    member=member,
                    opts=child,
                )
            )
        if args.kms_key:
            self.grants.append(
                gcp.kms.CryptoKeyIAMMember(
                    f"{s}-reconcile-decrypt",
                    crypto_key_id=args.kms_key,
                    role=DECRYPT_ROLE,
                    member=member,
                    opts=child,
                )
            )
        self.grants += grant_secret_access(
            f"{s}-reconcile", args.project, args.secret_access, member, child
        )
        self.grants += self._refresh_grants(args, member, child)
        self.firewall = gcp.compute.Firewall(
            f"{s}-reconcile-ssh",
            name=f"{s}-reconcile-ssh",
            project=args.project,
            network=args.network,
            direction="INGRESS",
            source_ranges=[args.subnet_cidr],
            target_tags=[args.tag],
            allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
            description="gputrain: SSH from the reconcile job's Direct VPC egress (the subnet)",
            opts=child,
        )
        self.job = gcp.cloudrunv2.Job(
            job_name(s),
            name=job_name(s),
            project=args.project,
            location=args.region,
            deletion_protection=False,  # `down` removes it with the stack
            labels=args.labels,
            template=gcp.cloudrunv2.JobTemplateArgs(
                task_count=1,
                parallelism=1,
                template=gcp.cloudrunv2.JobTemplateTemplateArgs(
                    service_account=self.account.email,
                    max_retries=0,  # the next scheduled pass is the retry
                    timeout="3600s",
                    containers=[
                        gcp.cloudrunv2.JobTemplateTemplateContainerArgs(
                            image=args.image,
                            args=["reconcile", "--stack", s],
                            envs=[
                                gcp.cloudrunv2.JobTemplateTemplateContainerEnvArgs(name=k, value=v)
                                for k, v in sorted(args.environment.items())
                            ],
                            resources=gcp.cloudrunv2.JobTemplateTemplateContainerResourcesArgs(
                                limits={"cpu": "1", "memory": "512Mi"}
                            ),
                        )
                    ],
                    vpc_access=gcp.cloudrunv2.JobTemplateTemplateVpcAccessArgs(
                        egress="PRIVATE_RANGES_ONLY",
                        network_interfaces=[
                            gcp.cloudrunv2.JobTemplateTemplateVpcAccessNetworkInterfaceArgs(
                                network=args.network,
                                subnetwork=args.subnetwork,
                                tags=[f"{args.tag}-reconcile"],
                            )
                        ],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[*self.grants, self.firewall])
            ),
        )
        self.invoker = gcp.cloudrunv2.JobIamMember(
            f"{s}-reconcile-invoker",
            project=args.project,
            location=args.region,
            name=self.job.name,
            role=INVOKER_ROLE,
            member=member,
            opts=child,
        )
        self.job_refresh = gcp.cloudrunv2.JobIamMember(
            f"{s}-reconcile-job-refresh",
            project=args.project,
            location=args.region,
            name=self.job.name,
            role=self.roles["job"],
            member=member,
            opts=child,
        )
        uri = self.job.name.apply(lambda n: run_uri(args.project, args.region, n))
        self.scheduler = gcp.cloudscheduler.Job(
            f"{s}-reconcile-every",
            name=job_name(s),
            project=args.project,
            region=args.region,
            schedule=schedule(args.every_s),
            time_zone="Etc/UTC",
            description=f"gputrain: starts `gputrain reconcile --stack {s}`",
            http_target=gcp.cloudscheduler.JobHttpTargetArgs(
                uri=uri,
                http_method="POST",
                oauth_token=gcp.cloudscheduler.JobHttpTargetOauthTokenArgs(
                    service_account_email=self.account.email, scope=OAUTH_SCOPE
                ),
            ),
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[self.invoker])
            ),
        )
        self.register_outputs({"job": self.job.name, "scheduler": self.scheduler.name})

    def _refresh_grants(
        self, args: StackReconcilerArgs, member: pulumi.Output[str], child: pulumi.ResourceOptions
    ) -> list[pulumi.Resource]:
        """What the pass's `pulumi refresh` reads beyond Compute, and `run.jobs.update` for an
        `up` that changes the job: a custom role per kind of resource (REFRESH_PERMISSIONS),
        each granted on the stack's own resources of that kind (the job's own grant follows the
        job); the project-level one holds only what has no resource-level policy."""
        s, project = args.stack, args.project
        kinds = [k for k in REFRESH_PERMISSIONS if k != "repository" or args.repository]
        kinds = [k for k in kinds if k != "key" or args.kms_key]
        kinds = [k for k in kinds if k != "secret" or args.secret_access]
        self.roles: dict[str, pulumi.Output[str]] = {}
        grants: list[pulumi.Resource] = []
        for kind in kinds:
            role = gcp.projects.IAMCustomRole(
                f"{s}-reconcile-refresh-{kind}",
                project=project,
                role_id=self.account.unique_id.apply(functools.partial(refresh_role_id, s, kind)),
                title=f"gputrain reconcile {s}: refresh ({kind})",
                description=f"what `pulumi refresh` of stack {s} reads ({kind})",
                permissions=list(REFRESH_PERMISSIONS[kind]),
                opts=child,
            )
            grants.append(role)
            self.roles[kind] = pulumi.Output.concat("projects/", project, "/roles/", role.role_id)
        roles, name = self.roles, f"{s}-reconcile-refresh"
        grants.append(
            gcp.projects.IAMMember(
                f"{name}-project", project=project, role=roles["project"], member=member, opts=child
            )
        )
        for bucket, which in [(args.bucket, "bucket"), (args.state_bucket, "state")]:
            if bucket:
                grants.append(
                    gcp.storage.BucketIAMMember(
                        f"{name}-{which}", bucket=bucket, role=roles["bucket"], member=member,
                        opts=child,
                    )
                )  # fmt: skip
        accounts = [(args.node_account_id, "nodes"), (self.account.name, "own")]
        for account, which in accounts:
            grants.append(
                gcp.serviceaccount.IAMMember(
                    f"{name}-{which}-account", service_account_id=account, role=roles["account"],
                    member=member, opts=child,
                )
            )  # fmt: skip
        # an `up` that changes the job deploys it as this account: actAs on it (Cloud Run)
        grants.append(
            gcp.serviceaccount.IAMMember(
                f"{s}-reconcile-act-as-own", service_account_id=self.account.name,
                role=ACT_AS_ROLE, member=member, opts=child,
            )
        )  # fmt: skip
        if args.repository:
            grants.append(
                gcp.artifactregistry.RepositoryIamMember(
                    f"{name}-repository", project=project, location=args.region,
                    repository=args.repository, role=roles["repository"], member=member,
                    opts=child,
                )
            )  # fmt: skip
        if args.kms_key:
            grants.append(
                gcp.kms.CryptoKeyIAMMember(
                    f"{name}-key", crypto_key_id=args.kms_key, role=roles["key"], member=member,
                    opts=child,
                )
            )  # fmt: skip
        for where, secret in args.secret_access:
            grants.append(
                gcp.secretmanager.SecretIamMember(
                    f"{name}-secret-{where}-{secret}", project=where, secret_id=secret,
                    role=roles["secret"], member=member, opts=child,
                )
            )  # fmt: skip
        return grants
