"""GpuCluster: the Pulumi component that turns a validated ClusterSpec into GCE resources.

Everything it needs comes from the ClusterSpec (the only reader of stack config is
infra/spec.py); nothing here reads files or generates keys, so `pulumi up` is repeatable.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_gcp as gcp

from infra import spec as specmod
from infra.spec import ClusterSpec, SpecError

COMPONENT_TYPE = "gputrain:infra:GpuCluster"
SUBNET_CIDR = "10.42.0.0/20"
NODE_ROLES = ("logging.logWriter", "monitoring.metricWriter")  # the service account's only roles
NODE_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)  # access is limited by roles


def stack_config_from_pulumi() -> dict[str, str]:
    """The stack's config as the same string mapping load_stack_config builds (for parse_spec).

    Reads only the keys the program needs; sshPrivateKey is never read.
    """
    cfg = pulumi.Config(specmod.PROJECT)
    out: dict[str, str] = {}
    for key in specmod.PROGRAM_KEYS:
        value = cfg.get(key)
        if value is not None:
            out[specmod.NS + key] = value
    project = pulumi.Config("gcp").get("project")
    if project:
        out[specmod.GCP_PROJECT_KEY] = project
    # Keys in our namespace that are not settings (typos) must fail parse_spec, not be ignored.
    # Their values are not needed (and not read: a mistyped private-key key stays unread).
    for key in _config_keys():
        if key.startswith(specmod.NS) and key[len(specmod.NS) :] not in specmod.DEFAULTS:
            out[key] = ""
    return out


def _config_keys() -> set[str]:
    """Every config key the engine passed (internal SDK state; the public API has no listing)."""
    from pulumi.runtime import config as runtime_config

    return set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())


def cluster_labels(spec: ClusterSpec, pulumi_project: str) -> dict[str, str]:
    """Labels for every labelable resource: ours (for sweeps and billing) + the user's."""
    return {"gputrain-stack": spec.stack, "gputrain-project": pulumi_project, **spec.labels}


class GpuCluster(pulumi.ComponentResource):
    """Network, firewall, service account, optional compact placement and one VM per node."""

    instances: list[gcp.compute.Instance]

    def __init__(
        self,
        name: str,
        spec: ClusterSpec,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        # Everything that can fail on the user's input fails here, before any resource exists.
        specmod.require_deployable(spec)
        image_self_link = self._resolve_image(spec)
        super().__init__(COMPONENT_TYPE, name, None, opts)
        self.spec = spec
        self.image_self_link = image_self_link
        project = spec.project
        child = pulumi.ResourceOptions(parent=self)
        self.labels = cluster_labels(spec, pulumi.get_project())
        self.tag = f"gputrain-{spec.stack}"

        # Network: the given VPC as is, or a VPC + one subnet in the region for this stack.
        self.network: gcp.compute.Network | None = None
        self.subnet: gcp.compute.Subnetwork | None = None
        network_ref: pulumi.Input[str]
        if spec.network:
            network_ref = spec.network
        else:
            self.network = gcp.compute.Network(
                f"{spec.stack}-net",
                name=f"{spec.stack}-net",
                project=project,
                auto_create_subnetworks=False,
                description=f"gputrain stack {spec.stack}",
                opts=child,
            )
            self.subnet = gcp.compute.Subnetwork(
                f"{spec.stack}-subnet",
                name=f"{spec.stack}-subnet",
                project=project,
                region=spec.region,
                network=self.network.id,
                ip_cidr_range=SUBNET_CIDR,
                opts=child,
            )
            network_ref = self.network.id

        # Firewall: everything between our own nodes, SSH only from the configured ranges.
        self.internal_firewall = gcp.compute.Firewall(
            f"{spec.stack}-internal",
            name=f"{spec.stack}-internal",
            project=project,
            network=network_ref,
            direction="INGRESS",
            source_tags=[self.tag],
            target_tags=[self.tag],
            allows=[
                gcp.compute.FirewallAllowArgs(protocol="tcp"),
                gcp.compute.FirewallAllowArgs(protocol="udp"),
                gcp.compute.FirewallAllowArgs(protocol="icmp"),
            ],
            description="gputrain: all traffic between the cluster's nodes",
            opts=child,
        )
        self.ssh_firewall = gcp.compute.Firewall(
            f"{spec.stack}-ssh",
            name=f"{spec.stack}-ssh",
            project=project,
            network=network_ref,
            direction="INGRESS",
            source_ranges=list(spec.ssh_source_ranges),
            target_tags=[self.tag],
            allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
            description="gputrain: SSH from the operator's ranges only",
            opts=child,
        )

        # Service account with log/metric writes only.
        self.service_account = gcp.serviceaccount.Account(
            f"gputrain-{spec.stack}",
            account_id=f"gputrain-{spec.stack}",
            display_name=f"gputrain nodes of stack {spec.stack}",
            project=project,
            opts=child,
        )
        member = self.service_account.email.apply(lambda email: f"serviceAccount:{email}")
        self.role_bindings = [
            gcp.projects.IAMMember(
                f"gputrain-{spec.stack}-{role.split('.')[1].lower()}",
                project=str(project),
                role=f"roles/{role}",
                member=member,
                opts=child,
            )
            for role in NODE_ROLES
        ]

        self.placement_policy: gcp.compute.ResourcePolicy | None = None
        if spec.placement == "compact":
            self.placement_policy = gcp.compute.ResourcePolicy(
                f"{spec.stack}-compact",
                name=f"{spec.stack}-compact",
                project=project,
                region=spec.region,
                group_placement_policy=gcp.compute.ResourcePolicyGroupPlacementPolicyArgs(
                    collocation="COLLOCATED", vm_count=spec.nodes
                ),
                opts=child,
            )

        depends: list[pulumi.Resource] = [
            self.internal_firewall,
            self.ssh_firewall,
            *self.role_bindings,
        ]
        self.instances = [
            self._instance(i, name_, network_ref, depends)
            for i, name_ in enumerate(spec.node_names)
        ]
        self._exports = self._build_exports()
        self.register_outputs(self._exports)

    # ----------------------------------------------------------------------------------------

    @staticmethod
    def _resolve_image(spec: ClusterSpec) -> str:
        """Pin the image the family points at now; fall back from a retired default family."""
        families = [spec.image_family]
        if spec.image_family == specmod.DEFAULT_IMAGE_FAMILY:
            families.append(specmod.FALLBACK_IMAGE_FAMILY)
        errors = []
        for family in families:
            try:
                image = gcp.compute.get_image(family=family, project=spec.image_project)
            except Exception as exc:  # the provider's NotFound arrives as a plain invoke error
                errors.append(f"{family}: {' '.join(str(exc).split())}")
                continue
            if image.disk_size_gb and spec.boot_disk_gb < image.disk_size_gb:
                raise SpecError(
                    f"gputrain:bootDiskGb = '{spec.boot_disk_gb}': image {image.name} needs at "
                    f"least {image.disk_size_gb} GB"
                )
            return image.self_link
        raise SpecError(
            f"gputrain:imageFamily = {spec.image_family!r}: not found in {spec.image_project} "
            f"({'; '.join(errors)}); list families with `gcloud compute images list "
            f"--project {spec.image_project}`"
        )

    def _instance(
        self,
        index: int,
        name: str,
        network_ref: pulumi.Input[str],
        depends: list[pulumi.Resource],
    ) -> gcp.compute.Instance:
        spec = self.spec
        public = spec.public_ip == "all" or (spec.public_ip == "head" and index == 0)
        interface = gcp.compute.InstanceNetworkInterfaceArgs(
            network=network_ref,
            subnetwork=self.subnet.id if self.subnet is not None else None,
            nic_type="GVNIC" if spec.gvnic else None,
            access_configs=[gcp.compute.InstanceNetworkInterfaceAccessConfigArgs()]
            if public
            else [],
        )
        scheduling = gcp.compute.InstanceSchedulingArgs(
            on_host_maintenance="TERMINATE",  # GPUs cannot live-migrate
            automatic_restart=not (spec.spot or spec.placement == "compact"),
            preemptible=spec.spot,
            provisioning_model="SPOT" if spec.spot else "STANDARD",
            instance_termination_action="DELETE",
            max_run_duration=gcp.compute.InstanceSchedulingMaxRunDurationArgs(
                seconds=spec.max_run_duration_s
            ),
        )
        accelerators = (
            [
                gcp.compute.InstanceGuestAcceleratorArgs(
                    type=spec.accelerator, count=spec.gpus_per_node
                )
            ]
            if spec.attach_gpus and spec.gpus_per_node > 0
            else None
        )
        return gcp.compute.Instance(
            name,
            name=name,
            project=spec.project,
            zone=spec.zone,
            machine_type=spec.machine_type,
            boot_disk=gcp.compute.InstanceBootDiskArgs(
                auto_delete=True,
                initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                    image=self.image_self_link,
                    size=spec.boot_disk_gb,
                    type=spec.boot_disk_type,
                    labels=self.labels,
                ),
            ),
            network_interfaces=[interface],
            scheduling=scheduling,
            guest_accelerators=accelerators,
            metadata={
                "ssh-keys": f"{spec.ssh_user}:{spec.ssh_public_key}",
                "enable-guest-attributes": "TRUE",  # the guest agent publishes host keys there
                "install-nvidia-driver": "True",
                "enable-oslogin": "FALSE",  # OS Login would ignore ssh-keys
            },
            tags=[self.tag],
            labels={**self.labels, "gputrain-role": "head" if index == 0 else "worker"},
            service_account=gcp.compute.InstanceServiceAccountArgs(
                email=self.service_account.email, scopes=list(NODE_SCOPES)
            ),
            resource_policies=(
                self.placement_policy.self_link if self.placement_policy is not None else None
            ),
            allow_stopping_for_update=True,
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=depends,
                custom_timeouts=pulumi.CustomTimeouts(create="20m", delete="20m"),
            ),
        )

    # ----------------------------------------------------------------------------------------

    def exports(self) -> dict[str, Any]:
        """The stack outputs the controller reads (never the private key)."""
        return dict(self._exports)

    def _build_exports(self) -> dict[str, Any]:
        spec = self.spec
        nodes = [
            pulumi.Output.all(vm.name, vm.zone, vm.network_interfaces).apply(
                functools.partial(_node_export, index=i)
            )
            for i, vm in enumerate(self.instances)
        ]
        head = nodes[0].apply(lambda n: n["externalIp"] or n["internalIp"])
        price = spec.price
        return {
            "stack": spec.stack,
            "project": spec.project,
            "region": spec.region,
            "zone": spec.zone,
            "machineType": spec.machine_type,
            "accelerator": spec.accelerator,
            "gpusPerNode": spec.gpus_per_node,
            "gpuModel": spec.gpu_model,
            "gpuMemoryGb": spec.gpu_memory_gb,
            "spot": spec.spot,
            "maxRunDuration": spec.max_run_duration,
            "maxRunDurationSeconds": spec.max_run_duration_s,
            "hourlyPricePerNodeUsd": round(spec.hourly_price_per_node, 4),
            "hourlyPriceUsd": round(spec.hourly_price_per_node * spec.nodes, 4),
            "priceAsOf": price.as_of,
            "sshUser": spec.ssh_user,
            "image": self.image_self_link,
            "headAddress": head,
            "nodes": pulumi.Output.all(*nodes),
        }


def _node_export(values: list[Any], index: int) -> dict[str, Any]:
    """One node as the controller sees it; interfaces arrive as dicts or typed classes."""
    name, zone, interfaces = values
    nic = interfaces[0] if interfaces else {}
    internal = _field(nic, "network_ip")
    configs = _field(nic, "access_configs") or []
    external = _field(configs[0], "nat_ip") if configs else None
    return {
        "name": name,
        "zone": zone,
        "internalIp": internal,
        "externalIp": external or None,
        "role": "head" if index == 0 else "worker",
    }


def _field(obj: Any, snake: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(snake)
    return getattr(obj, snake, None)
