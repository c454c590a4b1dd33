"""Sweep: every resource of a stack that still exists (and may bill), found by label or by name.
It lists, never deletes; `down` and `sweep` print what it finds.

`SWEPT` is the one table of what is swept: each kind a stack can leave behind, the Pulumi types
that create it, and where it is listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from infra.compute import ComputeApi
from infra.gcs import StorageApi
from infra.stackfile import STACK_LABEL


@dataclass(frozen=True)
class SweptKind:
    """One kind of resource the sweep looks for."""

    kind: str  # as the table prints it
    pulumi_types: tuple[str, ...]  # what declares it ("" comments: made by GCE for us)
    api: str  # "compute" or "storage"
    client: str  # the google-cloud-compute client; "buckets" for storage
    field: str | None  # the aggregated list's field; None: a global (or storage) list


SWEPT: tuple[SweptKind, ...] = (
    SweptKind("instance", ("gcp:compute/instance:Instance",), "compute", "InstancesClient", "instances"),
    SweptKind("disk", (), "compute", "DisksClient", "disks"),  # boot disks, made with the VMs
    SweptKind("address", (), "compute", "AddressesClient", "addresses"),
    SweptKind("address", (), "compute", "GlobalAddressesClient", None),
    SweptKind("subnetwork", ("gcp:compute/subnetwork:Subnetwork",), "compute", "SubnetworksClient", "subnetworks"),
    SweptKind("resource-policy", ("gcp:compute/resourcePolicy:ResourcePolicy",), "compute", "ResourcePoliciesClient", "resource_policies"),
    SweptKind("firewall", ("gcp:compute/firewall:Firewall",), "compute", "FirewallsClient", None),
    SweptKind("network", ("gcp:compute/network:Network",), "compute", "NetworksClient", None),
    SweptKind("bucket", ("gcp:storage/bucket:Bucket",), "storage", "buckets", None),
)  # fmt: skip


@dataclass(frozen=True)
class Leftover:
    """A resource of the stack that still exists (and may bill)."""

    kind: str  # a SweptKind.kind
    name: str
    location: str  # zone, region, "global", or a bucket's location
    matched_by: str  # "label gputrain-stack=dev" or "name prefix dev-"

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({self.location}; {self.matched_by})"


def owned_by_name(name: str, stack: str) -> bool:
    """The name rule for resources GCE cannot label (firewalls, networks, subnetworks, resource
    policies): the stack's resources are named `<stack>` or `<stack>-...` (`dev-net`, `dev-ssh`,
    `dev-node-0`). Another stack whose name starts with `<stack>-` (dev / dev-2) also matches, so
    sweep reports it: a loud false positive, never a silent miss."""
    return name == stack or name.startswith(f"{stack}-")


def sweep(
    project: str, stack: str, *, api: ComputeApi | None = None, storage: StorageApi | None = None
) -> list[Leftover]:
    """Every resource of `stack` that still exists: anything labelled gputrain-stack=<stack>
    (instances, disks, addresses, buckets) and anything named by the stack prefix rule (Compute
    kinds, since boot disks only carry labels when the program copies them). Lists, never
    deletes. Buckets are listed when a `storage` adapter is given (the controller always does)."""
    api = api or ComputeApi()
    leftovers: list[Leftover] = []
    for swept in SWEPT:
        if swept.api == "storage":
            if storage is not None:
                for b in storage.list_buckets(project):
                    if b.labels.get(STACK_LABEL) == stack:
                        leftovers.append(
                            Leftover(swept.kind, b.name, b.location, f"label {STACK_LABEL}={stack}")
                        )
            continue
        for item, location in api.list_resources(project, swept.client, swept.field):
            labels: Mapping[str, str] = dict(getattr(item, "labels", {}) or {})
            if labels.get(STACK_LABEL) == stack:
                leftovers.append(
                    Leftover(swept.kind, item.name, location, f"label {STACK_LABEL}={stack}")
                )
            elif owned_by_name(item.name, stack):
                leftovers.append(Leftover(swept.kind, item.name, location, f"name prefix {stack}-"))
    return sorted(leftovers, key=lambda leftover: (leftover.kind, leftover.location, leftover.name))
