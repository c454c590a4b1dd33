"""What a node's disks cost beside its VM, so the spending caps count the whole cluster: the boot
disk (pd-balanced, pd-ssd) and Local SSD (added with `localSsdCount`, or bundled with A2 Ultra and
A3), at list price per GiB-month. infra/prices.csv prices the VM alone (SkyPilot's CPU, RAM and GPU
SKUs). Pure.

Source: Cyclenerd/google-cloud-pricing-cost-calculator `pricing.yml` at commit 0166a59 (generated
2025-03-06 from the Cloud Billing catalog's SKUs), `compute.storage.balanced`, `.ssd` and `.local`
(`month`, `month_spot`), USD per GiB-month per region; read 2026-11-28. Google's [Disk and image
pricing](https://cloud.google.com/compute/disks-image-pricing) agrees where it gives figures ("a
200 GB SSD Persistent Disk volume would cost $34.00 for the whole month": $0.17 in the US) and says
disks bill per second of their provisioned size, used or not. A month is 730 hours, as the source
counts it (its `month` is `hour` x 730). Bundled Local SSD bills beside the machine type: "Google
Cloud bills accelerator-optimized machine types for their attached GPUs, predefined vCPU, memory,
and bundled Local SSD (if applicable)" ([Accelerator-optimized machine
family](https://cloud.google.com/compute/docs/accelerator-optimized-machines)); the source prices
it at the Local SSD rate, as here.

Not priced (said where the caps are shown): a hyperdisk-balanced boot disk (its price has capacity,
IOPS and throughput parts the source has no figure for; A3 Ultra and A4 take only it), the bundled
Local SSD of A3 Ultra and A4 (size not in the catalog), and network traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra import catalog
from infra.spec import BUNDLED_SIZE_UNKNOWN

if TYPE_CHECKING:
    from infra.offers import Candidate
    from infra.spec import ClusterSpec

HOURS_PER_MONTH = 730
#: region: USD per GiB-month of (pd-balanced, pd-ssd, Local SSD, Local SSD on a Spot VM); the
#: regions infra/prices.csv has GPU VMs in
PER_GIB_MONTH: dict[str, tuple[float, float, float, float]] = {
    "asia-east1": (0.1, 0.17, 0.08, 0.032),
    "asia-east2": (0.11, 0.187, 0.088, 0.0352),
    "asia-northeast1": (0.13, 0.221, 0.104, 0.0416),
    "asia-northeast3": (0.13, 0.221, 0.104, 0.0416),
    "asia-south1": (0.12, 0.204, 0.096, 0.0384),
    "asia-south2": (0.12, 0.204, 0.096, 0.0384),
    "asia-southeast1": (0.11, 0.187, 0.088, 0.0616),
    "asia-southeast2": (0.13, 0.221, 0.09592, 0.0384),
    "australia-southeast1": (0.135, 0.23, 0.108, 0.0405),
    "europe-central2": (0.13, 0.204, 0.096, 0.0382),
    "europe-north1": (0.11, 0.187, 0.088, 0.0352),
    "europe-west1": (0.1, 0.17, 0.08, 0.032),
    "europe-west2": (0.12, 0.204, 0.096, 0.067),
    "europe-west3": (0.12, 0.204, 0.096, 0.0493),
    "europe-west4": (0.11, 0.187, 0.088, 0.0547),
    "europe-west6": (0.13, 0.221, 0.104, 0.0416),
    "europe-west8": (0.116, 0.1972, 0.0928, 0.0371),
    "europe-west9": (0.116, 0.1972, 0.0928, 0.0371),
    "me-central2": (0.16, 0.272, 0.128, 0.0484),
    "me-west1": (0.11, 0.187, 0.088, 0.0352),
    "northamerica-northeast1": (0.11, 0.187, 0.088, 0.0352),
    "northamerica-northeast2": (0.11, 0.187, 0.088, 0.0352),
    "southamerica-east1": (0.15, 0.255, 0.12, 0.048),
    "us-central1": (0.1, 0.17, 0.08, 0.032),
    "us-east1": (0.1, 0.17, 0.08, 0.032),
    "us-east4": (0.11, 0.187, 0.088, 0.0616),
    "us-east5": (0.1, 0.17, 0.08, 0.032),
    "us-south1": (0.12, 0.2006, 0.0944, 0.0623),
    "us-west1": (0.1, 0.17, 0.08, 0.032),
    "us-west2": (0.12, 0.204, 0.096, 0.0384),
    "us-west3": (0.12, 0.204, 0.096, 0.0384),
    "us-west4": (0.11, 0.187, 0.088, 0.0352),
}
BOOT_COLUMN = {"pd-balanced": 0, "pd-ssd": 1}


@dataclass(frozen=True)
class DiskRate:
    """USD per hour of one node's disks that have a price, and what has none (not in it)."""

    hourly: float
    unpriced: tuple[str, ...] = ()


def node_disk_rate(
    region: str, boot_type: str, boot_gib: int, local_ssd_gib: int | None, *, spot: bool
) -> DiskRate:
    """One node's boot disk and Local SSD (None: present, of unknown size) in `region`. Pure."""
    row = PER_GIB_MONTH.get(region)
    unpriced: list[str] = []
    per_month = 0.0
    if row is not None and boot_type in BOOT_COLUMN:
        per_month += boot_gib * row[BOOT_COLUMN[boot_type]]
    else:
        unpriced.append(f"{boot_type} boot disk")
    if local_ssd_gib is None:
        unpriced.append("bundled Local SSD (size unknown)")
    elif local_ssd_gib and row is not None:
        per_month += local_ssd_gib * row[3 if spot else 2]
    elif local_ssd_gib:
        unpriced.append("Local SSD")
    if row is None:
        unpriced = [f"{what} in {region}" for what in unpriced]
    return DiskRate(per_month / HOURS_PER_MONTH, tuple(unpriced))


def spec_disk_rate(spec: ClusterSpec, spot: bool, candidate: Candidate | None = None) -> DiskRate:
    """One node's disks as the stack declares them, at Spot's Local SSD price or not; for a
    `gpus` candidate, in its region with its machine's own bundled Local SSD and the dearer of
    the stack's boot disk type and the machine's default. Pure."""
    mt = catalog.machine_type(candidate.machine_type) if candidate is not None else None
    if candidate is None or mt is None or candidate.machine_type == spec.machine_type:
        region = catalog.region_of(candidate.zone) if candidate is not None else spec.region
        local = spec.scratch.node_gib
        return node_disk_rate(region, spec.boot_disk_type, spec.boot_disk_gb, local, spot=spot)
    bundled = mt.local_ssd_gib is not None or mt.name in BUNDLED_SIZE_UNKNOWN
    local = mt.local_ssd_gib if bundled else (0 if spec.scratch.bundled else spec.scratch.gib or 0)
    types = {catalog.default_boot_disk_type(mt)}
    if spec.boot_disk_type in catalog.boot_disk_types(mt):
        types.add(spec.boot_disk_type)
    region = catalog.region_of(candidate.zone)
    rates = [node_disk_rate(region, t, spec.boot_disk_gb, local, spot=spot) for t in sorted(types)]
    return max(rates, key=lambda r: (not r.unpriced, r.hourly))


def cluster_hourly(spec: ClusterSpec, spot: bool | None = None) -> float | None:
    """USD per hour of the whole cluster, as its spending caps, its budget and its cost record
    all count it: on Compute Engine every node's VM with its disks, on Vertex AI every worker
    pool's replicas; at Spot's price or not (None: the stack's capacity). None: a price is
    unknown. Pure."""
    spot = spec.spot if spot is None else spot
    if spec.on_vertex:
        from infra.vertex_pools import price_pools, total_hourly

        return total_hourly(price_pools(spec.vertex_pools(), spec.region, spot=spot))
    per_node = spec.price.hourly(spot) if spec.price is not None else None
    if per_node is None:
        return None
    return (per_node + spec_disk_rate(spec, spot).hourly) * spec.nodes
