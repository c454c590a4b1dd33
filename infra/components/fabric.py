"""GpuFabric: the extra VPCs, subnets and firewalls of a multi-node A3 Mega / A3 Ultra / A4 stack
(infra/fabric.py plans them), and the NICs every VM attaches to them in order."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.fabric import FIREWALL_PROTOCOLS, FabricPlan


@dataclass(frozen=True)
class GpuFabricArgs:
    stack: str  # every resource is named <stack>-<suffix>: the sweep's name rule finds them
    project: str | None
    region: str
    tag: str  # the network tag every node carries
    plan: FabricPlan


@dataclass(frozen=True)
class FabricNic:
    """One extra NIC of every VM (nic1 onwards), in `plan.nics` order."""

    network: pulumi.Output[str]
    subnetwork: pulumi.Output[str]
    nic_type: str | None


class GpuFabric(pulumi.ComponentResource):
    """`nics` are the interfaces after nic0; `resources` what the VMs must wait for."""

    def __init__(
        self, name: str, args: GpuFabricArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gputrain:infra:GpuFabric", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        s, plan = args.stack, args.plan
        self.networks: dict[str, gcp.compute.Network] = {}
        self.subnets: dict[str, gcp.compute.Subnetwork] = {}
        self.firewalls: list[gcp.compute.Firewall] = []
        for net in plan.networks:
            network = gcp.compute.Network(
                f"{s}-{net.suffix}",
                name=f"{s}-{net.suffix}",
                project=args.project,
                auto_create_subnetworks=False,
                mtu=net.mtu,
                network_profile=net.network_profile,
                description=f"gputrain stack {s}: {net.purpose}",
                opts=child,
            )
            self.networks[net.suffix] = network
            for sub in net.subnets:
                self.subnets[sub.suffix] = gcp.compute.Subnetwork(
                    f"{s}-{sub.suffix}",
                    name=f"{s}-{sub.suffix}",
                    project=args.project,
                    region=args.region,
                    network=network.id,
                    ip_cidr_range=sub.cidr,
                    opts=child,
                )
            if net.firewall:  # never on the RoCE VPC: its profile refuses firewall rules
                self.firewalls.append(
                    gcp.compute.Firewall(
                        f"{s}-{net.suffix}-internal",
                        name=f"{s}-{net.suffix}-internal",
                        project=args.project,
                        network=network.id,
                        direction="INGRESS",
                        source_ranges=list(net.firewall_source_ranges),
                        target_tags=[args.tag],
                        allows=[
                            gcp.compute.FirewallAllowArgs(protocol=p) for p in FIREWALL_PROTOCOLS
                        ],
                        description="gputrain: GPU traffic between the cluster's own NICs only",
                        opts=child,
                    )
                )
        self.nics = [
            FabricNic(self.networks[nic.network].id, self.subnets[nic.subnet].id, nic.nic_type)
            for nic in plan.nics
            if nic.network != "primary"
        ]
        self.resources: list[pulumi.Resource] = [*self.subnets.values(), *self.firewalls]
        self.register_outputs({"networks": [n.id for n in self.networks.values()]})
