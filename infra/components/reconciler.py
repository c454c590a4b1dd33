"""StackReconciler: laptop-closed recovery, declared with the stack and destroyed with it — a Cloud
Run job whose container runs `gputrain reconcile --stack S`, a Cloud Scheduler job that starts it
every `reconcileEvery` (an HTTP POST to the Cloud Run Admin API's `jobs:run`, with an OAuth token
of the job's own service account), that account with grants on the stack's own resources, Direct
VPC egress into the stack's subnet, and SSH opened to that subnet's range only.

Nothing of it runs between passes: a job execution bills only while the pass runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.components import child_options
from infra.reconciler import job_name, run_uri, schedule

COMPONENT_TYPE = "gputrain:infra:StackReconciler"
#: What the pass does, as predefined roles: read the stack (Pulumi refresh), re-create its VMs
#: and delete them (conditioned on the stack's own instances and disks), act as the nodes'
#: account when creating them, and read/write the stack's bucket (manifest, lease, checkpoints).
PROJECT_VIEW_ROLE = "roles/compute.viewer"
INSTANCE_ROLE = "roles/compute.instanceAdmin.v1"
ACT_AS_ROLE = "roles/iam.serviceAccountUser"
BUCKET_ROLE = "roles/storage.objectAdmin"
INVOKER_ROLE = "roles/run.invoker"  # Cloud Scheduler's token calls jobs:run as this account
OAUTH_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
#: The image in the stack's Artifact Registry repository: gputrain with the Pulumi CLI
IMAGE_NAME = "gputrain-reconcile:latest"


@dataclass(frozen=True)
class StackReconcilerArgs:
    stack: str
    project: str
    region: str
    image: str  # the container with gputrain (and the Pulumi CLI) in it
    every_s: int
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str] | None
    subnet_cidr: str  # Direct VPC egress takes its addresses here: SSH opens to it only
    tag: str  # the nodes' network tag
    bucket: pulumi.Input[str]
    node_account_id: pulumi.Input[str]  # the nodes' service account (its `name`)
    instance_condition: str  # CEL: the stack's own VMs and disks
    labels: dict[str, str]  # the stack's labels (what `sweep` looks for)


def account_id(stack: str) -> str:
    """`gputrain-rc-<stack>`, cut to IAM's 30 characters."""
    return f"gputrain-rc-{stack}"[:30].rstrip("-")


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
