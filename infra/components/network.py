"""ClusterNetwork: the stack's VPC and subnet (or an existing VPC as is) and its two firewall rules —
everything between the cluster's own nodes, SSH only from the operator's ranges."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.components import child_options

SUBNET_CIDR = "10.42.0.0/20"


@dataclass(frozen=True)
class ClusterNetworkArgs:
    stack: str  # names every resource: <stack>-net, <stack>-subnet, <stack>-internal, <stack>-ssh
    project: str | None
    region: str
    tag: str  # the network tag every node carries
    ssh_source_ranges: tuple[str, ...]
    existing_network: str | None = None  # an existing VPC to use as is (no VPC, no subnet made)
    subnet_cidr: str = SUBNET_CIDR  # the first /20 of subnetRange
    mtu: int | None = None  # GPUDirect stacks: the fabric's MTU on the primary VPC too


class ClusterNetwork(pulumi.ComponentResource):
    """`network_ref` and `subnetwork_ref` are what the nodes' interfaces attach to."""

    network: gcp.compute.Network | None = None
    subnet: gcp.compute.Subnetwork | None = None
    network_ref: pulumi.Input[str]
    subnetwork_ref: pulumi.Output[str] | None = None

    def __init__(
        self, name: str, args: ClusterNetworkArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gputrain:infra:ClusterNetwork", name, None, opts)
        child = child_options(self, opts)
        s = args.stack
        if args.existing_network:
            self.network_ref = args.existing_network
        else:
            self.network = gcp.compute.Network(
                f"{s}-net",
                name=f"{s}-net",
                project=args.project,
                auto_create_subnetworks=False,
                mtu=args.mtu,
                description=f"gputrain stack {s}",
                opts=child,
            )
            self.subnet = gcp.compute.Subnetwork(
                f"{s}-subnet",
                name=f"{s}-subnet",
                project=args.project,
                region=args.region,
                network=self.network.id,
                ip_cidr_range=args.subnet_cidr,
                opts=child,
            )
            self.network_ref = self.network.id
            self.subnetwork_ref = self.subnet.id

        self.internal_firewall = gcp.compute.Firewall(
            f"{s}-internal",
            name=f"{s}-internal",
            project=args.project,
            network=self.network_ref,
            direction="INGRESS",
            source_tags=[args.tag],
            target_tags=[args.tag],
            allows=[
                gcp.compute.FirewallAllowArgs(protocol="tcp"),
                gcp.compute.FirewallAllowArgs(protocol="udp"),
                gcp.compute.FirewallAllowArgs(protocol="icmp"),
            ],
            description="gputrain: all traffic between the cluster's nodes",
            opts=child,
        )
        self.ssh_firewall = gcp.compute.Firewall(
            f"{s}-ssh",
            name=f"{s}-ssh",
            project=args.project,
            network=self.network_ref,
            direction="INGRESS",
            source_ranges=list(args.ssh_source_ranges),
            target_tags=[args.tag],
            allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
            description="gputrain: SSH from the operator's ranges only",
            opts=child,
        )
        self.register_outputs({"network": self.network_ref, "subnetwork": self.subnetwork_ref})
