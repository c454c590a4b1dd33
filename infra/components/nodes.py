"""GpuNodes: one VM per node on a pinned Deep Learning VM image, each with a server-side lifetime
(in a recovery's `up`, a VM it creates gets what is left of the run's), and the compact placement
policy when the spec asks for one."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import pulumi
import pulumi_gcp as gcp

from infra.capacity import InstanceCapacity
from infra.components import child_options
from infra.components.fabric import FabricNic
from infra.spec import ClusterSpec
from infra.stackfile import DEFAULT_IMAGE_FAMILY, FALLBACK_IMAGE_FAMILY, SpecError
from infra.ttl import Recreation

NODE_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)  # access is limited by roles
CREATE_TIMEOUT = "20m"
#: The engine's (wire) name of `scheduling.max_run_duration`: the provider replaces a VM whose
#: maxRunDuration changes (ForceNew), so in a recovery the VMs standing keep theirs
MAX_RUN_DURATION_PATH = "scheduling.maxRunDuration"


def resolve_image(spec: ClusterSpec) -> str:
    """Pin the image the family points at now; fall back from a retired default family.
    An invoke, not a resource: a bad family fails before anything is declared."""
    families = [spec.image_family]
    if spec.image_family == DEFAULT_IMAGE_FAMILY:
        families.append(FALLBACK_IMAGE_FAMILY)
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


@dataclass(frozen=True)
class GpuNodesArgs:
    names: tuple[str, ...]  # node 0 is the head
    project: str | None
    region: str
    zone: str
    machine_type: str
    accelerator: str
    gpus_per_node: int
    attach_gpus: bool  # N1: GPUs go in guest_accelerators; A/G series bring their own
    gvnic: bool
    capacity: InstanceCapacity  # scheduling and reservation affinity of every VM
    image: str  # a pinned self link (resolve_image)
    boot_disk_gb: int
    boot_disk_type: str
    ssh_user: str
    ssh_public_key: str | None
    public_ip: Literal["head", "all", "none"]
    compact_placement: bool
    automatic_restart: bool  # ClusterSpec.automatic_restart
    placement_name: str
    labels: Mapping[str, str]
    tag: str
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str] | None
    service_account_email: pulumi.Input[str]
    fabric_nics: Sequence[FabricNic] = ()  # nic1.. of every VM (GPUDirect), never external
    local_ssd_disks: int = 0  # N1/G2 localSsdCount (bundled local SSD comes with the type)
    startup_script: str | None = None  # local SSD -> RAID 0 at /mnt/gputrain-scratch, every boot
    after: Sequence[pulumi.Resource] = field(default=())  # firewalls and role bindings first
    recreation: Recreation | None = None  # a recovery's `up` (None: the full maxRunDuration)


class GpuNodes(pulumi.ComponentResource):
    """`instances` in node order; `placement_policy` when compact placement applies."""

    def __init__(
        self, name: str, args: GpuNodesArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gputrain:infra:GpuNodes", name, None, opts)
        self.args = args
        self.placement_policy: gcp.compute.ResourcePolicy | None = None
        if args.compact_placement:
            self.placement_policy = gcp.compute.ResourcePolicy(
                args.placement_name,
                name=args.placement_name,
                project=args.project,
                region=args.region,
                group_placement_policy=gcp.compute.ResourcePolicyGroupPlacementPolicyArgs(
                    collocation="COLLOCATED", vm_count=len(args.names)
                ),
                opts=child_options(self, opts),
            )
        vm_opts = child_options(
            self,
            opts,
            depends_on=list(args.after),
            # no longer for Flex-start: its create never queues (infra/capacity.py)
            custom_timeouts=pulumi.CustomTimeouts(create=CREATE_TIMEOUT, delete="20m"),
        )
        self.instances = [self._instance(i, n, vm_opts) for i, n in enumerate(args.names)]
        self.register_outputs({"instances": [vm.self_link for vm in self.instances]})

    def _instance(
        self, index: int, name: str, opts: pulumi.ResourceOptions
    ) -> gcp.compute.Instance:
        a = self.args
        public = a.public_ip == "all" or (a.public_ip == "head" and index == 0)
        interface = gcp.compute.InstanceNetworkInterfaceArgs(
            network=a.network,
            subnetwork=a.subnetwork,
            nic_type="GVNIC" if a.gvnic else None,
            access_configs=[gcp.compute.InstanceNetworkInterfaceAccessConfigArgs()]
            if public
            else [],
        )
        cap = a.capacity
        ttl_s = cap.max_run_duration_s
        if a.recreation is not None:
            ttl_s = a.recreation.max_run_duration_s(time.time())
            if a.recreation.keeps(name, a.zone):  # it stands untouched: updated, not replaced
                # (a replacement would take the ignored value from the state); the others: ttl_s
                keep = pulumi.ResourceOptions(ignore_changes=[MAX_RUN_DURATION_PATH])
                opts = pulumi.ResourceOptions.merge(opts, keep)
        sched = cap.scheduling_args()
        sched["automatic_restart"] = a.automatic_restart
        sched["max_run_duration"] = gcp.compute.InstanceSchedulingMaxRunDurationArgs(seconds=ttl_s)
        scheduling = gcp.compute.InstanceSchedulingArgs(**sched)  # type: ignore[arg-type]
        affinity = cap.reservation_affinity
        reservation = (
            gcp.compute.InstanceReservationAffinityArgs(
                type=affinity.type,
                specific_reservation=gcp.compute.InstanceReservationAffinitySpecificReservationArgs(
                    key=affinity.key, values=list(affinity.values)
                )
                if affinity.key
                else None,
            )
            if affinity is not None
            else None
        )
        interfaces = [interface] + [
            gcp.compute.InstanceNetworkInterfaceArgs(
                network=nic.network, subnetwork=nic.subnetwork, nic_type=nic.nic_type
            )
            for nic in a.fabric_nics
        ]
        accelerators = (
            [gcp.compute.InstanceGuestAcceleratorArgs(type=a.accelerator, count=a.gpus_per_node)]
            if a.attach_gpus and a.gpus_per_node > 0
            else None
        )
        return gcp.compute.Instance(
            name,
            name=name,
            project=a.project,
            zone=a.zone,
            machine_type=a.machine_type,
            boot_disk=gcp.compute.InstanceBootDiskArgs(
                auto_delete=True,
                initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                    image=a.image, size=a.boot_disk_gb, type=a.boot_disk_type, labels=a.labels
                ),
            ),
            network_interfaces=interfaces,
            scheduling=scheduling,
            reservation_affinity=reservation,
            guest_accelerators=accelerators,
            scratch_disks=[
                gcp.compute.InstanceScratchDiskArgs(interface="NVME")
                for _ in range(a.local_ssd_disks)
            ]
            or None,
            metadata_startup_script=a.startup_script,
            metadata={
                "ssh-keys": f"{a.ssh_user}:{a.ssh_public_key}",
                "enable-guest-attributes": "TRUE",  # the guest agent publishes host keys there
                "install-nvidia-driver": "True",
                "enable-oslogin": "FALSE",  # OS Login would ignore ssh-keys
                "block-project-ssh-keys": "TRUE",  # only this stack's key, not the project's
            },
            tags=[a.tag],
            labels={**a.labels, "gputrain-role": "head" if index == 0 else "worker"},
            service_account=gcp.compute.InstanceServiceAccountArgs(
                email=a.service_account_email, scopes=list(NODE_SCOPES)
            ),
            resource_policies=(
                self.placement_policy.self_link if self.placement_policy is not None else None
            ),
            allow_stopping_for_update=True,
            opts=opts,
        )
