"""A local fake of the Compute Engine v1 REST API for the paths gputrain's clients call.

Speaks the real JSON shapes (camelCase fields, `selfLink`s, Google's error body, `nextPageToken`
paging, aggregated lists keyed by scope) so the production code runs unchanged through the real
google-cloud-compute clients. The default world is seeded from the facts sheet
(shared/reference/gcp-gpu-facts.md §1, §2, §4, §6, §9); tests then adjust it with the seeding API.
"""

from __future__ import annotations

import datetime
import itertools
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from infra.catalog import region_of
from tests.support.fake_http import FakeHttpServer, send_json
from tests.support.fake_iam import FakeIamMixin

PROJECT = "gputrain-test"
BASE = "https://www.googleapis.com/compute/v1"
#: Reservation fields only the compute beta API returns (its v1 resource has none of them)
BETA_ONLY = ("reservationMode",)
PAGE_SIZE = 3  # small on purpose: every list a test makes crosses at least one page boundary

# ---- facts (gcp-gpu-facts.md) -------------------------------------------------------------------

# machine type -> (vCPUs, memory GB, accelerator type or None, GPU count)   (§1.1-§1.3)
MACHINE_TYPES: dict[str, tuple[int, float, str | None, int]] = {
    **{
        f"g2-standard-{cpus}": (cpus, mem, "nvidia-l4", gpus)
        for cpus, mem, gpus in [
            (4, 16, 1),
            (8, 32, 1),
            (12, 48, 1),
            (16, 64, 1),
            (24, 96, 2),
            (32, 128, 1),
            (48, 192, 4),
            (96, 384, 8),
        ]
    },
    **{
        f"a2-highgpu-{g}g": (cpus, mem, "nvidia-tesla-a100", g)
        for g, cpus, mem in [(1, 12, 85), (2, 24, 170), (4, 48, 340), (8, 96, 680)]
    },
    "a2-megagpu-16g": (96, 1360, "nvidia-tesla-a100", 16),
    **{
        f"a2-ultragpu-{g}g": (cpus, mem, "nvidia-a100-80gb", g)
        for g, cpus, mem in [(1, 12, 170), (2, 24, 340), (4, 48, 680), (8, 96, 1360)]
    },
    **{
        f"a3-highgpu-{g}g": (cpus, mem, "nvidia-h100-80gb", g)
        for g, cpus, mem in [(1, 26, 234), (2, 52, 468), (4, 104, 936), (8, 208, 1872)]
    },
    "a3-megagpu-8g": (208, 1872, "nvidia-h100-mega-80gb", 8),
    "a3-ultragpu-8g": (224, 2952, "nvidia-h200-141gb", 8),
    "a4-highgpu-8g": (224, 3968, "nvidia-b200", 8),
    **{f"n1-standard-{c}": (c, c * 3.75, None, 0) for c in (1, 2, 4, 8, 16, 32, 64, 96)},
}

# accelerator -> max cards per instance (§2 for N1 cards; the built-in ones from §1)
MAX_CARDS = {
    "nvidia-tesla-t4": 4,
    "nvidia-tesla-v100": 8,
    "nvidia-tesla-p100": 4,
    "nvidia-tesla-p4": 4,
    "nvidia-l4": 8,
    "nvidia-tesla-a100": 16,
    "nvidia-a100-80gb": 8,
    "nvidia-h100-80gb": 8,
    "nvidia-h100-mega-80gb": 8,
    "nvidia-h200-141gb": 8,
    "nvidia-b200": 8,
}

# accelerator -> zones that offer it (§9)
ZONES_BY_ACCELERATOR = {
    "nvidia-tesla-a100": "us-central1-a/b/c/f europe-west4-a/b asia-southeast1-a/b/c us-east1-b",
    "nvidia-a100-80gb": "us-central1-a/c us-east4-c us-east5-a/b europe-west4-a",
    "nvidia-h100-80gb": "us-central1-a/b/c us-east4-a/b/c us-east5-a us-west1-a/b europe-west4-b/c",
    "nvidia-h100-mega-80gb": "us-central1-a/b/c us-east4-a/b/c europe-west4-b/c asia-southeast1-b/c",
    "nvidia-h200-141gb": "us-central1-b us-east4-b us-east5-a us-south1-b europe-west4-a",
    "nvidia-b200": "us-central1-b us-east1-b us-east4-b us-south1-b europe-west4-b",
    "nvidia-l4": "us-central1-a/b/c us-east1-b/c/d us-west1-a/b/c europe-west4-a/b/c asia-east1-a/b/c",
    "nvidia-tesla-t4": "us-central1-a/b/c/f us-east1-b/c/d us-west1-a/b europe-west4-a/b/c",
    "nvidia-tesla-v100": "us-central1-a/b/c/f us-east1-b/c us-west1-a/b europe-west4-a/b/c",
}

# quota metrics per accelerator (§6)
GPU_QUOTA_METRICS = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
    "nvidia-b200": "NVIDIA_B200_GPUS",
}
CPU_QUOTA_METRICS = ("CPUS", "N1_CPUS", "G2_CPUS", "A2_CPUS", "A3_CPUS")

DLVM_PROJECT = "deeplearning-platform-release"
# family -> (image name, disk GB, deprecation state or None)   (§4)
DLVM_FAMILIES: dict[str, tuple[str, int, str | None]] = {
    "pytorch-2-9-cu129-ubuntu-2204-nvidia-580": (
        "pytorch-2-9-cu129-ubuntu-2204-nvidia-580-v20260416",
        50,
        None,
    ),
    "common-cu129-ubuntu-2204-nvidia-580": (
        "common-cu129-ubuntu-2204-nvidia-580-v20260416",
        50,
        None,
    ),
    "pytorch-2-7-cu128-ubuntu-2204-nvidia-570": (
        "pytorch-2-7-cu128-ubuntu-2204-nvidia-570-v20260310",
        50,
        "DEPRECATED",
    ),
}


def expand_zones(spec: str) -> list[str]:
    """'us-central1-a/b europe-west4-c' -> ['us-central1-a', 'us-central1-b', 'europe-west4-c']."""
    out = []
    for word in spec.split():
        region, _, letters = word.rpartition("-")
        out += [f"{region}-{letter}" for letter in letters.split("/")]
    return out


def ssh_host_keys() -> dict[str, str]:
    """A fresh ed25519 + ecdsa host key pair set as the guest agent publishes them: type -> base64."""
    keys = {}
    for priv in (ed25519.Ed25519PrivateKey.generate(), ec.generate_private_key(ec.SECP256R1())):
        line = (
            priv.public_key()
            .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            .decode()
        )
        kind, blob = line.split()[:2]
        keys[kind] = blob
    return keys


# ---- state ---------------------------------------------------------------------------------------


@dataclass
class _Instance:
    body: dict[str, Any]
    host_keys: dict[str, str] = field(default_factory=dict)
    publish_after: int = 0  # getGuestAttributes answers 404 for this many queries first
    queries: int = 0


@dataclass
class _Injected:
    path_pattern: re.Pattern[str]
    status: int
    message: str
    reason: str
    times: int


class FakeCompute(FakeIamMixin, FakeHttpServer):
    """The fake server plus the Python API tests use to shape its world (thread-safe); it also
    answers the IAM and Cloud Resource Manager reads the sweep makes (tests/support/fake_iam.py)."""

    def __init__(
        self, project: str = PROJECT, *, seed: bool = True, host: str = "127.0.0.1"
    ) -> None:
        self.project = project
        # instances.delete: the Authorization header of each, and what a test does when one
        # is deleted (the test bed kills the VM's processes, as GCE would)
        self.deletes: list[tuple[str, str, str | None]] = []  # (zone, name, authorization)
        self.on_delete: Callable[[str, str], None] | None = None
        self.required_token: str | None = None  # set: a delete without this bearer gets 401
        self._lock = threading.RLock()
        self._ids = itertools.count(4_000_000_000_000_000_001)
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        self.machine_types: dict[str, dict[str, dict[str, Any]]] = {}  # zone -> name -> body
        self.accelerator_types: dict[str, dict[str, dict[str, Any]]] = {}  # zone -> name -> body
        self.region_quotas: dict[str, dict[str, dict[str, Any]]] = {}  # region -> METRIC -> quota
        self.project_quotas: dict[str, dict[str, Any]] = {}
        self.images: dict[tuple[str, str], dict[str, Any]] = {}  # (project, family) -> body
        self.instances: dict[tuple[str, str], _Instance] = {}  # (zone, name)
        # kind -> {(scope, name): body}; scope is "zones/Z", "regions/R" or "global"
        self.resources: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            k: {}
            for k in (
                "disks",
                "addresses",
                "firewalls",
                "networks",
                "subnetworks",
                "resourcePolicies",
            )
        }
        self.operations: dict[str, list[dict[str, Any]]] = {}  # zone -> operations, oldest first
        # GCE's clock minus the controller's: its operations' times are written by GCE's clock
        # (a laptop whose clock lags sees them in its future)
        self.clock_offset_s = 0.0
        self.reservations: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, name) -> body
        self.reservation_owners: dict[tuple[str, str], str] = {}  # (zone, name) -> its project
        self.readable_projects: set[str] = set()  # other projects whose reservations we may get
        self.network_profiles: dict[str, dict[str, Any]] = {}  # name -> body (global)
        self._injected: list[_Injected] = []
        self._init_iam()
        if seed:
            self.seed_from_facts()
        self._serve(host)

    # -- seeding from facts

    def seed_from_facts(self) -> None:
        """Every zone of §9 with its accelerators, the machine types that use them, N1 everywhere,
        generous quotas for every GPU/CPU metric in every region, the DLVM families of §4."""
        zones_accels: dict[str, set[str]] = {}
        for accel, spec in ZONES_BY_ACCELERATOR.items():
            for zone in expand_zones(spec):
                zones_accels.setdefault(zone, set()).add(accel)
        for zone, accels in zones_accels.items():
            for accel in accels:
                self.add_accelerator_type(zone, accel, MAX_CARDS[accel])
            for name, (cpus, mem, accel, count) in MACHINE_TYPES.items():
                if accel is None or accel in accels:
                    self.add_machine_type(zone, name, cpus, mem, accel, count)
            region = region_of(zone)
            if region not in self.region_quotas:
                for metric in GPU_QUOTA_METRICS.values():
                    self.set_region_quota(region, metric, 16)
                    self.set_region_quota(region, f"PREEMPTIBLE_{metric}", 16)
                for metric in CPU_QUOTA_METRICS:
                    self.set_region_quota(region, metric, 2400)
                    self.set_region_quota(region, f"PREEMPTIBLE_{metric}", 2400)
        self.set_project_quota("GPUS_ALL_REGIONS", 32)
        self.set_project_quota("NETWORKS", 15)  # VPC docs: 15 networks per project by default
        self.set_project_quota("SUBNETWORKS", 175)
        for accel in ("nvidia-h200-141gb", "nvidia-b200"):  # RDMA GPUs' zones have the profile
            for zone in expand_zones(ZONES_BY_ACCELERATOR.get(accel, "")):
                self.add_network_profile(f"{zone}-vpc-roce", zone)
        self.set_project_quota("CPUS_ALL_REGIONS", 4800)
        for family, (name, size, state) in DLVM_FAMILIES.items():
            self.add_image(DLVM_PROJECT, family, name, size, deprecated=state)
        family = "ubuntu-accelerator-2204-amd64-with-nvidia-580"  # the RDMA stacks' default
        self.add_image("ubuntu-os-accelerator-images", family, f"{family}-v20260522", 50)

    # -- seeding API

    def add_machine_type(
        self,
        zone: str,
        name: str,
        cpus: int,
        memory_gb: float,
        accelerator: str | None = None,
        count: int = 0,
    ) -> None:
        body: dict[str, Any] = {
            "kind": "compute#machineType",
            "id": str(next(self._ids)),
            "name": name,
            "description": f"{cpus} vCPUs, {memory_gb:g} GB RAM",
            "guestCpus": cpus,
            "memoryMb": int(memory_gb * 1024),
            "zone": zone,
            "isSharedCpu": False,
            "selfLink": f"{BASE}/projects/{self.project}/zones/{zone}/machineTypes/{name}",
        }
        if accelerator:
            body["accelerators"] = [
                {"guestAcceleratorType": accelerator, "guestAcceleratorCount": count}
            ]
        with self._lock:
            self.machine_types.setdefault(zone, {})[name] = body

    def remove_machine_type(self, zone: str, name: str) -> None:
        with self._lock:
            self.machine_types.get(zone, {}).pop(name, None)

    def add_accelerator_type(
        self, zone: str, name: str, max_cards: int, *, deprecated: str | None = None
    ) -> None:
        body: dict[str, Any] = {
            "kind": "compute#acceleratorType",
            "id": str(next(self._ids)),
            "name": name,
            "description": name.replace("-", " ").upper(),
            "zone": f"{BASE}/projects/{self.project}/zones/{zone}",
            "maximumCardsPerInstance": max_cards,
            "selfLink": f"{BASE}/projects/{self.project}/zones/{zone}/acceleratorTypes/{name}",
        }
        if deprecated:
            body["deprecated"] = {"state": deprecated}
        with self._lock:
            self.accelerator_types.setdefault(zone, {})[name] = body

    def remove_accelerator_type(self, zone: str, name: str) -> None:
        with self._lock:
            self.accelerator_types.get(zone, {}).pop(name, None)

    def set_region_quota(self, region: str, metric: str, limit: float, usage: float = 0.0) -> None:
        with self._lock:
            self.region_quotas.setdefault(region, {})[metric.upper()] = {
                "metric": metric,
                "limit": float(limit),
                "usage": float(usage),
            }

    def remove_region_quota(self, region: str, metric: str) -> None:
        with self._lock:
            self.region_quotas.get(region, {}).pop(metric.upper(), None)

    def set_project_quota(self, metric: str, limit: float, usage: float = 0.0) -> None:
        with self._lock:
            self.project_quotas[metric.upper()] = {
                "metric": metric,
                "limit": float(limit),
                "usage": float(usage),
            }

    def add_reservation(
        self,
        zone: str,
        name: str,
        machine_type: str,
        count: int,
        *,
        in_use: int = 0,
        status: str = "READY",
        specific_required: bool = True,
        deployment_type: str | None = None,
        reservation_mode: str | None = None,
        owner: str | None = None,
    ) -> None:
        """A specific (SKU) reservation as reservations.get returns it (int64 as strings).
        `deployment_type` DENSE and `reservation_mode` CALENDAR are the shapes of A3/A4 future
        reservations and calendar-mode ones; `owner`: a shared reservation of another project,
        readable at projects/OWNER/... (other projects' reads are refused with a 403)."""
        extra: dict[str, Any] = {}
        if deployment_type:
            extra["deploymentType"] = deployment_type
        if reservation_mode:
            extra["reservationMode"] = reservation_mode
        if owner:
            extra["shareSettings"] = {"shareType": "SPECIFIC_PROJECTS"}
        with self._lock:
            self.reservation_owners[(zone, name)] = owner or self.project
            self.reservations[(zone, name)] = extra | {
                "kind": "compute#reservation",
                "id": str(next(self._ids)),
                "name": name,
                "zone": f"{BASE}/projects/{self.project}/zones/{zone}",
                "selfLink": f"{BASE}/projects/{self.project}/zones/{zone}/reservations/{name}",
                "specificReservation": {
                    "count": str(count),
                    "inUseCount": str(in_use),
                    "instanceProperties": {"machineType": machine_type},
                },
                "specificReservationRequired": specific_required,
                "status": status,
            }

    def add_network_profile(self, name: str, zone: str) -> None:
        """A network profile as networkProfiles.get returns it (RDMA over RoCE, zonal)."""
        with self._lock:
            self.network_profiles[name] = {
                "kind": "compute#networkProfile",
                "id": str(next(self._ids)),
                "name": name,
                "location": {"name": zone, "scope": "ZONE"},
                "features": {"allowedNetworkInterfaceTypes": ["MRDMA"]},
                "profileType": {"networkType": "RDMA", "rdmaSubtype": "ROCE"},
                "selfLink": f"{BASE}/projects/{self.project}/global/networkProfiles/{name}",
            }

    def remove_network_profile(self, name: str) -> None:
        with self._lock:
            self.network_profiles.pop(name, None)

    def remove_project_quota(self, metric: str) -> None:
        with self._lock:
            self.project_quotas.pop(metric.upper(), None)

    def add_image(
        self,
        project: str,
        family: str,
        name: str,
        disk_size_gb: int,
        *,
        deprecated: str | None = None,
        replacement: str | None = None,
    ) -> None:
        body: dict[str, Any] = {
            "kind": "compute#image",
            "id": str(next(self._ids)),
            "name": name,
            "family": family,
            "diskSizeGb": str(disk_size_gb),  # int64 fields travel as strings in v1 JSON
            "status": "READY",
            "architecture": "X86_64",
            "selfLink": f"{BASE}/projects/{project}/global/images/{name}",
        }
        if deprecated:
            body["deprecated"] = {"state": deprecated}
            if replacement:
                body["deprecated"]["replacement"] = (
                    f"{BASE}/projects/{project}/global/images/{replacement}"
                )
        with self._lock:
            self.images[(project, family)] = body

    def remove_image_family(self, project: str, family: str) -> None:
        with self._lock:
            self.images.pop((project, family), None)

    def add_instance(
        self,
        name: str,
        zone: str,
        *,
        labels: Mapping[str, str] | None = None,
        machine_type: str = "g2-standard-4",
        internal_ip: str = "10.128.0.2",
        external_ip: str | None = None,
        host_keys: Mapping[str, str] | None = None,
        publish_after: int = 0,
        boot_disk: bool = True,
        max_run_duration_s: int = 3600,
        created_ago_s: float = 0.0,
    ) -> dict[str, Any]:
        """An instance (and, by default, its labelled boot disk), created `created_ago_s` ago.
        `host_keys` (type -> base64) are answered by getGuestAttributes after `publish_after`
        404s; None: never published."""
        iface: dict[str, Any] = {
            "name": "nic0",
            "network": f"{BASE}/projects/{self.project}/global/networks/default",
            "networkIP": internal_ip,
        }
        if external_ip:
            iface["accessConfigs"] = [
                {"type": "ONE_TO_ONE_NAT", "name": "External NAT", "natIP": external_ip}
            ]
        body: dict[str, Any] = {
            "kind": "compute#instance",
            "id": str(next(self._ids)),
            "name": name,
            "status": "RUNNING",
            "zone": f"{BASE}/projects/{self.project}/zones/{zone}",
            "machineType": f"{BASE}/projects/{self.project}/zones/{zone}/machineTypes/{machine_type}",
            "labels": dict(labels or {}),
            "networkInterfaces": [iface],
            "selfLink": f"{BASE}/projects/{self.project}/zones/{zone}/instances/{name}",
            "creationTimestamp": _rfc3339_now(-created_ago_s),
            "lastStartTimestamp": _rfc3339_now(),
            "scheduling": {
                "onHostMaintenance": "TERMINATE",
                "provisioningModel": "SPOT",
                "instanceTerminationAction": "DELETE",
                "maxRunDuration": {"seconds": str(max_run_duration_s)},
            },
        }
        with self._lock:
            self.instances[(zone, name)] = _Instance(body, dict(host_keys or {}), publish_after)
            if host_keys is None:
                self.instances[(zone, name)].publish_after = -1
            if boot_disk:
                self.add_resource("disks", name, zone=zone, labels=labels)
        return body

    def publish_host_keys(self, name: str, zone: str, host_keys: Mapping[str, str]) -> None:
        with self._lock:
            inst = self.instances[(zone, name)]
            inst.host_keys = dict(host_keys)
            inst.publish_after = 0

    def remove_instance(self, name: str, zone: str, *, with_boot_disk: bool = True) -> None:
        with self._lock:
            self.instances.pop((zone, name), None)
            if with_boot_disk:
                self.resources["disks"].pop((f"zones/{zone}", name), None)

    def preempt_instance(
        self,
        name: str,
        zone: str,
        *,
        delete_after_s: float = 0.5,
        kind: str = "compute.instances.preempted",
        message: str = "Instance was preempted.",
    ) -> None:
        """What GCE does to a spot VM it takes back: the instance goes STOPPING, the zone records
        a `compute.instances.preempted` operation, and (termination action DELETE) the instance
        and its boot disk are deleted after `delete_after_s`. `kind`
        `compute.instances.hostError` (or `...terminateOnHostMaintenance`): a host failure
        ended the VM instead (any provisioning model)."""
        with self._lock:
            inst = self.instances[(zone, name)]
            inst.body["status"] = "STOPPING"
            now = _rfc3339_now(self.clock_offset_s)
            op_id = str(next(self._ids))
            self.operations.setdefault(zone, []).append(
                {
                    "kind": "compute#operation",
                    "id": op_id,
                    "name": f"systemevent-{op_id}",
                    "zone": f"{BASE}/projects/{self.project}/zones/{zone}",
                    "operationType": kind,
                    "targetLink": inst.body["selfLink"],
                    "targetId": inst.body["id"],
                    "status": "DONE",
                    "statusMessage": message,
                    "user": "system",
                    "progress": 100,
                    "insertTime": now,
                    "startTime": now,
                    "endTime": now,
                    "selfLink": f"{BASE}/projects/{self.project}/zones/{zone}/operations/systemevent-{op_id}",
                }
            )
        timer = threading.Timer(delete_after_s, self.remove_instance, args=(name, zone))
        timer.daemon = True
        timer.start()

    def guest_attribute_queries(self, name: str, zone: str) -> int:
        with self._lock:
            return self.instances[(zone, name)].queries

    def add_resource(
        self,
        kind: str,
        name: str,
        *,
        zone: str | None = None,
        region: str | None = None,
        labels: Mapping[str, str] | None = None,
        network: str | None = None,
    ) -> dict[str, Any]:
        """A disk/address (zonal or regional, with labels), firewall/network (global, no labels in
        GCE), subnetwork/resourcePolicy (regional)."""
        scope = f"zones/{zone}" if zone else f"regions/{region}" if region else "global"
        singular = {
            "disks": "disk",
            "addresses": "address",
            "firewalls": "firewall",
            "networks": "network",
            "subnetworks": "subnetwork",
            "resourcePolicies": "resourcePolicy",
        }[kind]
        body: dict[str, Any] = {
            "kind": f"compute#{singular}",
            "id": str(next(self._ids)),
            "name": name,
            "selfLink": f"{BASE}/projects/{self.project}/{scope}/{kind}/{name}",
        }
        if zone:
            body["zone"] = f"{BASE}/projects/{self.project}/zones/{zone}"
        if region:
            body["region"] = f"{BASE}/projects/{self.project}/regions/{region}"
        if kind in ("disks", "addresses") and labels is not None:
            body["labels"] = dict(labels)
        if kind == "disks":
            body.update(sizeGb="100", status="READY", type=f"{body['zone']}/diskTypes/pd-balanced")
        if kind == "addresses":
            body.update(address="203.0.113.77", status="RESERVED")
        if network:
            body["network"] = f"{BASE}/projects/{self.project}/global/networks/{network}"
        with self._lock:
            self.resources[kind][(scope, name)] = body
        return body

    def remove_resource(self, kind: str, name: str) -> None:
        with self._lock:
            for key in [k for k in self.resources[kind] if k[1] == name]:
                del self.resources[kind][key]

    def inject_error(
        self, path_regex: str, status: int, message: str, reason: str, *, times: int = 1
    ) -> None:
        """The next `times` requests whose path matches answer with this Google error."""
        with self._lock:
            self._injected.append(_Injected(re.compile(path_regex), status, message, reason, times))

    def requests_matching(self, pattern: str) -> list[tuple[str, str, dict[str, list[str]]]]:
        with self._lock:
            return [r for r in self.requests if re.search(pattern, r[1])]

    # -- request handling

    def _reservation(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """reservations.get: a shared reservation is read in its owner's project, which
        refuses a caller it has not granted compute.reservations.get."""
        path = f"projects/{project}/zones/{zone}/reservations/{name}"
        if project != self.project and project not in self.readable_projects:
            raise _HttpError(
                403, f"Required 'compute.reservations.get' permission for '{path}'", "forbidden"
            )
        body = self.reservations.get((zone, name))
        if body is None or self.reservation_owners.get((zone, name)) != project:
            raise _not_found(path)
        return body

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer("POST")

            def do_DELETE(self) -> None:
                parts = urlsplit(self.path)
                status, body = fake._delete(unquote(parts.path), self.headers.get("Authorization"))
                send_json(self, status, body)
                if status == 200 and fake.on_delete is not None:  # after the answer, as GCE
                    zone, name = body["targetLink"].split("/zones/")[1].split("/instances/")
                    fake.on_delete(zone, name)

            def _answer(self, method: str) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                path = unquote(parts.path)
                status, body = fake._dispatch(method, path, query)
                send_json(self, status, body)

        return Handler

    def _dispatch(self, method: str, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append((method, path, query))
            for inj in self._injected:
                if inj.times > 0 and inj.path_pattern.search(path):
                    inj.times -= 1
                    return _error(inj.status, inj.message, inj.reason)
            try:
                if method == "DELETE":
                    return 200, self._delete(path)
                iam = self._route_iam(method, path, {k: v[0] for k, v in query.items()})
                return 200, iam if iam is not None else self._route(path, query)
            except _HttpError as e:
                return _error(e.status, e.message, e.reason)

    def _delete(self, path: str, authorization: str | None) -> tuple[int, Any]:
        """instances.delete: the instance and its boot disk go at once; a zone operation."""
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)", path)
        with self._lock:
            self.requests.append(("DELETE", path, {}))
            if m is None:
                return _error(404, f"The resource '{path}' was not found", "notFound")
            project, zone, name = m.groups()
            self.deletes.append((zone, name, authorization))
            if self.required_token and authorization != f"Bearer {self.required_token}":
                return _error(
                    401, "Request had invalid authentication credentials.", "unauthorized"
                )
            if (zone, name) not in self.instances:
                return _error(
                    404,
                    f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found",
                    "notFound",
                )
            self.remove_instance(name, zone)
            op_id = str(next(self._ids))
            body = {
                "kind": "compute#operation",
                "id": op_id,
                "name": f"operation-{op_id}",
                "zone": f"{BASE}/projects/{project}/zones/{zone}",
                "operationType": "delete",
                "targetLink": f"{BASE}/projects/{project}/zones/{zone}/instances/{name}",
                "status": "DONE",  # deleted at once here: op.result() needs no poll
                "insertTime": _rfc3339_now(),
                "selfLink": f"{BASE}/projects/{project}/zones/{zone}/operations/operation-{op_id}",
            }
        return 200, body

    def _route(self, path: str, query: dict[str, list[str]]) -> Any:
        beta = path.startswith("/compute/beta/projects/")
        prefix = "/compute/beta/projects/" if beta else "/compute/v1/projects/"
        if not path.startswith(prefix):
            raise _not_found(path)
        rest = path[len(prefix) :].strip("/").split("/")
        project, rest = rest[0], rest[1:]
        q = {k: v[0] for k, v in query.items()}
        if len(rest) == 4 and rest[0] == "zones" and rest[2] == "reservations":
            body = self._reservation(project, rest[1], rest[3])
            # reservationMode is a field of the beta Reservation only (v1 has none)
            return body if beta else {k: v for k, v in body.items() if k not in BETA_ONLY}
        if beta:
            raise _not_found(path)  # the fake serves only reservations in beta
        if project != self.project and not (len(rest) >= 3 and rest[:2] == ["global", "images"]):
            raise _HttpError(
                403,
                f"Required 'compute.projects.get' permission for 'projects/{project}'",
                "forbidden",
            )
        match rest:
            case []:
                return {
                    "kind": "compute#project",
                    "name": project,
                    "id": "123456789012",
                    "quotas": list(self.project_quotas.values()),
                    "selfLink": f"{BASE}/projects/{project}",
                }
            case ["regions", region]:
                if region not in self.region_quotas:
                    raise _not_found(f"projects/{project}/regions/{region}")
                return {
                    "kind": "compute#region",
                    "name": region,
                    "status": "UP",
                    "quotas": list(self.region_quotas[region].values()),
                    "zones": [
                        f"{BASE}/projects/{project}/zones/{z}"
                        for z in self.machine_types
                        if region_of(z) == region
                    ],
                    "selfLink": f"{BASE}/projects/{project}/regions/{region}",
                }
            case ["zones", zone, "machineTypes", name]:
                body = self.machine_types.get(zone, {}).get(name)
                if body is None:
                    raise _not_found(f"projects/{project}/zones/{zone}/machineTypes/{name}")
                return body
            case ["zones", zone, "acceleratorTypes"]:
                if zone not in self.accelerator_types and zone not in self.machine_types:
                    raise _HttpError(
                        400, f"Invalid value for field 'zone': '{zone}'. Unknown zone.", "invalid"
                    )
                items = sorted(
                    self.accelerator_types.get(zone, {}).values(), key=lambda b: b["name"]
                )
                return self._page("compute#acceleratorTypeList", items, q, zone)
            case ["global", "images", "family", family]:
                body = self.images.get((project, family))
                if body is None:
                    raise _not_found(f"projects/{project}/global/images/family/{family}")
                return body
            case ["zones", zone, "instances", name, "getGuestAttributes"]:
                return self._guest_attributes(project, zone, name, q.get("queryPath", ""))
            case ["zones", zone, "instances", name]:
                inst = self.instances.get((zone, name))
                if inst is None:
                    raise _not_found(f"projects/{project}/zones/{zone}/instances/{name}")
                return inst.body
            case ["global", "networkProfiles", name]:
                body = self.network_profiles.get(name)
                if body is None:
                    raise _not_found(f"projects/{project}/global/networkProfiles/{name}")
                return body
            case ["zones", zone, "operations"]:
                ops = _filtered(self.operations.get(zone, []), q.get("filter"))
                return self._page("compute#operationList", ops, q, f"zones/{zone}/operations")
            case ["zones", zone, "instances"]:
                items = [i.body for (z, _), i in sorted(self.instances.items()) if z == zone]
                items = _filtered(items, q.get("filter"))
                return self._page("compute#instanceList", items, q, f"zones/{zone}")
            case ["aggregated", "instances"]:
                by_scope: dict[str, list[dict[str, Any]]] = {}
                for (z, _), i in sorted(self.instances.items()):
                    by_scope.setdefault(f"zones/{z}", []).append(i.body)
                return self._aggregated("compute#instanceAggregatedList", "instances", by_scope, q)
            case ["aggregated", kind] if kind in self.resources:
                by_scope = {}
                for (scope, _), body in sorted(self.resources[kind].items()):
                    if scope != "global":
                        by_scope.setdefault(scope, []).append(body)
                return self._aggregated(f"compute#{kind}AggregatedList", kind, by_scope, q)
            case ["global", kind] if kind in ("firewalls", "networks", "addresses"):
                items = [b for (s, _), b in sorted(self.resources[kind].items()) if s == "global"]
                items = _filtered(items, q.get("filter"))
                return self._page(f"compute#{kind}List", items, q, "global")
        raise _not_found(path)

    def _guest_attributes(self, project: str, zone: str, name: str, query_path: str) -> Any:
        inst = self.instances.get((zone, name))
        if inst is None:
            raise _not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        inst.queries += 1
        namespace = query_path.rstrip("/")
        published = inst.publish_after >= 0 and inst.queries > inst.publish_after and inst.host_keys
        if namespace != "hostkeys" or not published:
            raise _HttpError(
                404,
                f"The resource '{query_path}' of type 'Guest Attribute' was not found.",
                "notFound",
            )
        return {
            "kind": "compute#guestAttributes",
            "queryPath": query_path,
            "queryValue": {
                "items": [
                    {"namespace": "hostkeys", "key": k, "value": v}
                    for k, v in inst.host_keys.items()
                ]
            },
            "selfLink": f"{BASE}/projects/{project}/zones/{zone}/instances/{name}/getGuestAttributes",
        }

    def _page(self, kind: str, items: list[Any], q: Mapping[str, str], scope: str) -> Any:
        start = int(q["pageToken"]) if q.get("pageToken") else 0
        size = min(int(q.get("maxResults") or PAGE_SIZE), PAGE_SIZE)
        body: dict[str, Any] = {
            "kind": kind,
            "id": f"projects/{self.project}/{scope}",
            "items": items[start : start + size],
            "selfLink": f"{BASE}/projects/{self.project}/{scope}",
        }
        if start + size < len(items):
            body["nextPageToken"] = str(start + size)
        return body

    def _aggregated(
        self, kind: str, key: str, by_scope: dict[str, list[dict[str, Any]]], q: Mapping[str, str]
    ) -> Any:
        """One scope per page (the real API pages across scopes too); empty scopes carry the
        'no results' warning the real API sends."""
        scopes = sorted(by_scope)
        start = int(q["pageToken"]) if q.get("pageToken") else 0
        items: dict[str, Any] = {}
        for scope in scopes[start : start + 1]:
            found = _filtered(by_scope[scope], q.get("filter"))
            if found:
                items[scope] = {key: found}
            else:
                items[scope] = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": "There are no results for scope 'x' on this page.",
                        "data": [{"key": "scope", "value": scope}],
                    }
                }
        body: dict[str, Any] = {
            "kind": kind,
            "id": f"projects/{self.project}/aggregated/{key}",
            "items": items,
            "selfLink": f"{BASE}/projects/{self.project}/aggregated/{key}",
        }
        if start + 1 < len(scopes):
            body["nextPageToken"] = str(start + 1)
        return body


# ---- helpers -------------------------------------------------------------------------------------


class _HttpError(Exception):
    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def _not_found(resource: str) -> _HttpError:
    return _HttpError(404, f"The resource '{resource}' was not found", "notFound")


def _error(status: int, message: str, reason: str) -> tuple[int, Any]:
    """Google's JSON error body."""
    return status, {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }


_FILTER = re.compile(r'^\s*(labels\.[a-z0-9_-]+|name|operationType)\s*(=|eq)\s*"?([^"]*)"?\s*$')


def _filtered(items: Iterable[dict[str, Any]], expr: str | None) -> list[dict[str, Any]]:
    """The subset of GCE's filter language we use: `labels.KEY = "VALUE"`, `name = "VALUE"` or
    `operationType = "VALUE"`; anything else answers 400 as the real API does for a malformed
    filter."""
    items = list(items)
    if not expr:
        return items
    m = _FILTER.match(expr)
    if not m:
        raise _HttpError(
            400,
            f"Invalid value for field 'filter': '{expr}'. Invalid list filter expression.",
            "invalid",
        )
    field_name, _, value = m.groups()
    if field_name in ("name", "operationType"):
        return [i for i in items if i.get(field_name) == value]
    key = field_name.split(".", 1)[1]
    return [i for i in items if i.get("labels", {}).get(key) == value]


def _rfc3339_now(offset_s: float = 0.0) -> str:
    """Now (plus `offset_s`), as GCE writes timestamps (with a UTC offset)."""
    now = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset_s)
    return now.isoformat(timespec="milliseconds")
