"""NodeIdentity: the service account the nodes run as, with the project roles it needs and no more
(log and metric writes) and, with autodown, deleting the stack's own VMs — an IAM condition on
the instances' resource names, so nothing else in the project."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.components import child_options

NODE_ROLES = ("logging.logWriter", "monitoring.metricWriter")  # the service account's only roles


@dataclass(frozen=True)
class NodeIdentityArgs:
    account_id: str  # e.g. gputrain-dev; also names the role bindings
    project: str | None
    display_name: str
    roles: tuple[str, ...] = NODE_ROLES
    # autodown: the CEL condition (infra/autodown.py) under which the account may delete VMs;
    # None: no such right at all
    delete_vms_condition: str | None = None


class NodeIdentity(pulumi.ComponentResource):
    """`email` is what the instances run as."""

    def __init__(
        self, name: str, args: NodeIdentityArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gputrain:infra:NodeIdentity", name, None, opts)
        child = child_options(self, opts)
        self.account = gcp.serviceaccount.Account(
            args.account_id,
            account_id=args.account_id,
            display_name=args.display_name,
            project=args.project,
            opts=child,
        )
        self.email: pulumi.Output[str] = self.account.email
        self.member: pulumi.Output[str] = self.email.apply(lambda e: f"serviceAccount:{e}")
        member = self.member
        self.role_bindings = [
            gcp.projects.IAMMember(
                f"{args.account_id}-{role.split('.')[1].lower()}",
                project=str(args.project),
                role=f"roles/{role}",
                member=member,
                opts=child,
            )
            for role in args.roles
        ]
        if args.delete_vms_condition is not None:
            from infra.autodown import ROLE

            self.role_bindings.append(
                gcp.projects.IAMMember(
                    f"{args.account_id}-autodown",
                    project=str(args.project),
                    role=f"roles/{ROLE}",
                    member=member,
                    condition=gcp.projects.IAMMemberConditionArgs(
                        title="gputrain autodown: this stack's VMs only",
                        description="the head node's watchdog deletes the stack's VMs after the job",
                        expression=args.delete_vms_condition,
                    ),
                    opts=child,
                )
            )
        self.register_outputs({"email": self.email})
