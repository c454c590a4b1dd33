"""StackBucket: where a run's checkpoints and results outlive its VMs — the stack's own bucket, or
the user's existing one — and the nodes' right to use that bucket and no other.

The stack's own bucket is not `force_destroy`: a plain `pulumi destroy` refuses to delete
checkpoints nobody has downloaded. `gputrain down` downloads the runs' results first, then empties
it, then destroys (scripts/targets/stack/bucket.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

# read, write, list and delete objects; no bucket administration
NODE_BUCKET_ROLE = "roles/storage.objectUser"


@dataclass(frozen=True)
class StackBucketArgs:
    name: str  # the bucket's name (the stack's own, or the user's existing one)
    project: str | None
    location: str  # the stack's region
    member: pulumi.Input[str]  # "serviceAccount:<the nodes' service account>"
    existing: bool = False  # the user's bucket: only the IAM member is declared
    retention_days: int = 30
    labels: Mapping[str, str] = field(default_factory=dict)


class StackBucket(pulumi.ComponentResource):
    """`name` is the bucket's name; `bucket` is None when the bucket is the user's."""

    bucket: gcp.storage.Bucket | None = None

    def __init__(
        self, name: str, args: StackBucketArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gputrain:infra:StackBucket", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.name: pulumi.Output[str] = pulumi.Output.from_input(args.name)
        if not args.existing:
            self.bucket = gcp.storage.Bucket(
                args.name,
                name=args.name,
                project=args.project,
                location=args.location.upper(),
                uniform_bucket_level_access=True,
                public_access_prevention="enforced",
                soft_delete_policy=gcp.storage.BucketSoftDeletePolicyArgs(
                    retention_duration_seconds=0
                ),
                lifecycle_rules=[
                    gcp.storage.BucketLifecycleRuleArgs(
                        action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                        condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                            age=args.retention_days
                        ),
                    )
                ],
                labels=dict(args.labels),
                force_destroy=False,
                opts=child,
            )
            self.name = self.bucket.name
        self.node_access = gcp.storage.BucketIAMMember(
            f"{args.name}-nodes",
            bucket=self.name,
            role=NODE_BUCKET_ROLE,
            member=args.member,
            opts=child,
        )
        self.register_outputs({"name": self.name})
