"""GCE GPU hardware catalog: pure data + lookups, no I/O.

Figures come from /work/shared/reference/gcp-gpu-facts.md (docs machine-family page 2026-04-15,
SkyPilot catalog v8, Cluster Toolkit). Values marked UNCONFIRMED there are kept but flagged here;
the Compute API preflight confirms the rest at run time.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Series = Literal["a2", "a3", "a4", "g2", "n1"]

# --------------------------------------------------------------------------------------------
# Accelerators
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Accelerator:
    """One GPU model: its GCE accelerator type, what nvidia-smi calls it, and its quota metric."""

    name: str  # GCE accelerator type, e.g. "nvidia-l4"
    model: str  # as `nvidia-smi --query-gpu=name` prints it
    memory_gb: int  # nominal per-GPU memory
    quota_base: str  # regional on-demand quota metric; spot adds the PREEMPTIBLE_ prefix
    aliases: tuple[str, ...] = ()  # other spellings the docs use for the same accelerator

    @property
    def min_memory_mib(self) -> int:
        """The least memory per GPU `verify` accepts: 90 % of the nominal GB read as GiB.
        nvidia-smi reports a little less than nominal (an L4's 24 GB shows as 23034 MiB)."""
        return int(self.memory_gb * 1024 * 0.9)


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator("nvidia-tesla-t4", "Tesla T4", 16, "NVIDIA_T4_GPUS"),
        Accelerator("nvidia-tesla-v100", "Tesla V100-SXM2-16GB", 16, "NVIDIA_V100_GPUS"),
        Accelerator("nvidia-tesla-p100", "Tesla P100-PCIE-16GB", 16, "NVIDIA_P100_GPUS"),
        Accelerator("nvidia-tesla-p4", "Tesla P4", 8, "NVIDIA_P4_GPUS"),
        # The 2026 docs print "nvidia-a100-40gb"; whether it is an alias is UNCONFIRMED.
        Accelerator(
            "nvidia-tesla-a100",
            "NVIDIA A100-SXM4-40GB",
            40,
            "NVIDIA_A100_GPUS",
            aliases=("nvidia-a100-40gb",),
        ),
        Accelerator("nvidia-a100-80gb", "NVIDIA A100-SXM4-80GB", 80, "NVIDIA_A100_80GB_GPUS"),
        Accelerator("nvidia-l4", "NVIDIA L4", 24, "NVIDIA_L4_GPUS"),
        Accelerator("nvidia-h100-80gb", "NVIDIA H100 80GB HBM3", 80, "NVIDIA_H100_GPUS"),
        Accelerator("nvidia-h100-mega-80gb", "NVIDIA H100 80GB HBM3", 80, "NVIDIA_H100_MEGA_GPUS"),
        Accelerator("nvidia-h200-141gb", "NVIDIA H200", 141, "NVIDIA_H200_GPUS"),
        Accelerator("nvidia-b200", "NVIDIA B200", 180, "NVIDIA_B200_GPUS"),
    )
}

GLOBAL_GPU_QUOTA_METRIC = "GPUS_ALL_REGIONS"

#: What users type (SkyPilot's names) -> GCE accelerator type. H100 is A3 High only, never A3 Mega.
GPU_MODELS: dict[str, str] = {
    "T4": "nvidia-tesla-t4",
    "P4": "nvidia-tesla-p4",
    "P100": "nvidia-tesla-p100",
    "V100": "nvidia-tesla-v100",
    "L4": "nvidia-l4",
    "A100": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100": "nvidia-h100-80gb",
    "H100-MEGA": "nvidia-h100-mega-80gb",
    "H200": "nvidia-h200-141gb",
    "B200": "nvidia-b200",
}
MODEL_OF: dict[str, str] = {acc: model for model, acc in GPU_MODELS.items()}


ZONE_NAME = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")  # us-central1-a


def region_of(zone: str) -> str:
    """us-central1-a -> us-central1."""
    return zone.rsplit("-", 1)[0]


def quota_console_url(project: str | None) -> str:
    """Where a project's quotas are raised."""
    url = "https://console.cloud.google.com/iam-admin/quotas"
    return f"{url}?project={project}" if project else url


def canonical_accelerator(name: str) -> str | None:
    """The catalog name for an accelerator type, one of its aliases or its model name as `gpus`
    takes it (T4, A100-80GB), in any case; None if unknown."""
    lower = name.lower()
    if lower in ACCELERATORS:
        return lower
    for acc in ACCELERATORS.values():
        if lower in acc.aliases:
            return acc.name
    return GPU_MODELS.get(name.upper())


def gpu_choices(accelerators: Iterable[str]) -> str:
    """`nvidia-tesla-t4 (T4), ...`: the gpuType values an error allows, by both names."""
    return ", ".join(f"{a} ({MODEL_OF[a]})" if a in MODEL_OF else a for a in accelerators)


def quota_metric(accelerator: str, spot: bool) -> str:
    """Regional GPU quota metric, e.g. NVIDIA_L4_GPUS or PREEMPTIBLE_NVIDIA_L4_GPUS for Spot."""
    canonical = canonical_accelerator(accelerator)
    if canonical is None:
        raise KeyError(f"unknown accelerator type {accelerator!r}")
    base = ACCELERATORS[canonical].quota_base
    return f"PREEMPTIBLE_{base}" if spot else base


_CPU_QUOTA_BASE: dict[str, str] = {
    "n1": "CPUS",
    "a2": "A2_CPUS",
    "a3": "A3_CPUS",
    "a4": "A4_CPUS",
    "g2": "G2_CPUS",
}


def cpu_quota_metric(series: str, spot: bool) -> str:
    """Regional vCPU quota metric: <SERIES>_CPUS (N1 uses CPUS), PREEMPTIBLE_ prefix for Spot."""
    base = _CPU_QUOTA_BASE[series]
    return f"PREEMPTIBLE_{base}" if spot else base


# --------------------------------------------------------------------------------------------
# Machine types
# --------------------------------------------------------------------------------------------

DiskClass = Literal["pd", "a3", "hyperdisk"]

#: Boot disk types each disk class accepts; the first one is the default.
BOOT_DISK_TYPES: dict[DiskClass, tuple[str, ...]] = {
    "pd": ("pd-balanced", "pd-ssd"),  # N1, A2, G2: no pd-standard (G2), no pd-extreme
    "a3": ("pd-ssd", "pd-balanced", "hyperdisk-balanced"),  # A3 High/Mega/Edge: no pd-standard
    "hyperdisk": ("hyperdisk-balanced",),  # A3 Ultra, A4
}


@dataclass(frozen=True)
class MachineType:
    """A machine type gputrain can provision, with what it brings and what it needs."""

    name: str
    series: Series
    vcpus: int
    memory_gb: float
    accelerator: str | None = None  # built-in GPUs (A2/A3/A4/G2); None for N1
    gpus: int = 0  # built-in GPU count; 0 for N1 (GPUs are attached)
    nics: str = "1"  # what the docs say the type uses for full bandwidth
    gvnic: bool = False  # primary NIC must be gVNIC (required in practice on A3/A4)
    max_gbps: int | None = None
    local_ssd_gib: int | None = None  # bundled Local SSD; None if optional/unknown
    disk_class: DiskClass = "pd"
    spot_only: bool = False  # on-demand not offered (A3 High 1/2/4g: Spot or Flex-start)
    orderable: bool = True  # False for serving-only products (A3 Edge)
    compact_placement: bool = True  # supports a COLLOCATED group placement policy

    @property
    def has_builtin_gpus(self) -> bool:
        return self.accelerator is not None


def _a2() -> list[MachineType]:
    out = []
    for n, vcpu, mem, gbps in (
        (1, 12, 85, 24),
        (2, 24, 170, 32),
        (4, 48, 340, 50),
        (8, 96, 680, 100),
    ):
        out.append(
            MachineType(f"a2-highgpu-{n}g", "a2", vcpu, mem, "nvidia-tesla-a100", n, max_gbps=gbps)
        )
    out.append(MachineType("a2-megagpu-16g", "a2", 96, 1360, "nvidia-tesla-a100", 16, max_gbps=100))
    for n, vcpu, mem, ssd, gbps in (
        (1, 12, 170, 375, 24),
        (2, 24, 340, 750, 32),
        (4, 48, 680, 1500, 50),
        (8, 96, 1360, 3000, 100),
    ):
        out.append(
            MachineType(
                f"a2-ultragpu-{n}g",
                "a2",
                vcpu,
                mem,
                "nvidia-a100-80gb",
                n,
                max_gbps=gbps,
                local_ssd_gib=ssd,
            )
        )
    return out


def _a3_a4() -> list[MachineType]:
    out = []
    for n, vcpu, mem, ssd, gbps in (
        (1, 26, 234, 750, 25),
        (2, 52, 468, 1500, 50),
        (4, 104, 936, 3000, 100),
    ):
        out.append(
            MachineType(
                f"a3-highgpu-{n}g",
                "a3",
                vcpu,
                mem,
                "nvidia-h100-80gb",
                n,
                nics="1",
                gvnic=True,
                max_gbps=gbps,
                local_ssd_gib=ssd,
                disk_class="a3",
                spot_only=True,
            )
        )
    out += [
        MachineType(
            "a3-highgpu-8g",
            "a3",
            208,
            1872,
            "nvidia-h100-80gb",
            8,
            nics="1 + 4 gVNIC (GPUDirect-TCPX)",
            gvnic=True,
            max_gbps=1000,
            local_ssd_gib=6000,
            disk_class="a3",
        ),
        MachineType(
            "a3-megagpu-8g",
            "a3",
            208,
            1872,
            "nvidia-h100-mega-80gb",
            8,
            nics="1 + 8 gVNIC (GPUDirect-TCPXO)",
            gvnic=True,
            max_gbps=1800,
            local_ssd_gib=6000,
            disk_class="a3",
        ),
        MachineType(
            "a3-edgegpu-8g",
            "a3",
            208,
            1872,
            "nvidia-h100-80gb",
            8,
            nics="1 + 4 gVNIC (GPUDirect-TCPX)",
            gvnic=True,
            max_gbps=400,
            local_ssd_gib=6000,
            disk_class="a3",
            orderable=False,
        ),
        MachineType(
            "a3-ultragpu-8g",
            "a3",
            224,
            2952,
            "nvidia-h200-141gb",
            8,
            nics="2 gVNIC + 8 MRDMA (RoCE VPC)",
            gvnic=True,
            max_gbps=3600,
            disk_class="hyperdisk",
        ),
        MachineType(
            "a4-highgpu-8g",
            "a4",
            224,
            3968,
            "nvidia-b200",
            8,
            nics="2 gVNIC + 8 MRDMA (RoCE VPC)",
            gvnic=True,
            max_gbps=3600,
            disk_class="hyperdisk",
        ),
    ]
    return out


#: G2: vCPUs -> (L4 count, default memory GB, max Gbps). g2-standard-32 has ONE GPU.
_G2 = {
    4: (1, 16, 10),
    8: (1, 32, 16),
    12: (1, 48, 16),
    16: (1, 64, 32),
    24: (2, 96, 32),
    32: (1, 128, 32),
    48: (4, 192, 50),
    96: (8, 384, 100),
}


def _g2() -> list[MachineType]:
    return [
        MachineType(f"g2-standard-{v}", "g2", v, mem, "nvidia-l4", n, max_gbps=gbps)
        for v, (n, mem, gbps) in _G2.items()
    ]


#: N1 memory per vCPU by class (GB).
_N1_CLASSES = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}
_N1_VCPUS = (1, 2, 4, 8, 16, 32, 64, 96)


def _n1() -> list[MachineType]:
    out = []
    for cls, per_vcpu in _N1_CLASSES.items():
        for v in _N1_VCPUS:
            if v == 1 and cls != "standard":
                continue  # n1-highmem-1 / n1-highcpu-1 do not exist
            out.append(MachineType(f"n1-{cls}-{v}", "n1", v, v * per_vcpu, compact_placement=False))
    return out


MACHINE_TYPES: dict[str, MachineType] = {m.name: m for m in _a2() + _a3_a4() + _g2() + _n1()}


def machine_type(name: str) -> MachineType | None:
    return MACHINE_TYPES.get(name)


def nearest_machine_types(name: str, limit: int = 3) -> list[str]:
    """Known machine types that look like a misspelled one (difflib), best first."""
    return difflib.get_close_matches(name, MACHINE_TYPES.keys(), n=limit, cutoff=0.6)


def boot_disk_types(mt: MachineType) -> tuple[str, ...]:
    return BOOT_DISK_TYPES[mt.disk_class]


def default_boot_disk_type(mt: MachineType) -> str:
    return BOOT_DISK_TYPES[mt.disk_class][0]


# --------------------------------------------------------------------------------------------
# N1 attachable GPUs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttachableGpu:
    """An N1 attachable GPU: allowed counts, each with its (max vCPU, max memory GB) cap."""

    accelerator: str
    caps: dict[int, tuple[int, int]]

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(sorted(self.caps))


N1_GPUS: dict[str, AttachableGpu] = {
    g.accelerator: g
    for g in (
        AttachableGpu("nvidia-tesla-t4", {1: (48, 312), 2: (48, 312), 4: (96, 624)}),
        AttachableGpu("nvidia-tesla-v100", {1: (12, 78), 2: (24, 156), 4: (48, 312), 8: (96, 624)}),
        # Lower caps in us-east1-c and europe-west1-b/d (64/208) are UNCONFIRMED; not modelled.
        AttachableGpu("nvidia-tesla-p100", {1: (16, 104), 2: (32, 208), 4: (96, 624)}),
        AttachableGpu("nvidia-tesla-p4", {1: (24, 156), 2: (48, 312), 4: (96, 624)}),
    )
}


# --------------------------------------------------------------------------------------------
# Zones known to offer each GPU (facts §9, SkyPilot catalog v8): a hint, not a guarantee
# of capacity; the Compute API preflight is the authority. P100/P4 are not listed there.
# --------------------------------------------------------------------------------------------


def _zones(spec: str) -> frozenset[str]:
    """Expand "us-central1-a/b/c, us-east1-b" into zone names."""
    out = set()
    for part in spec.split(","):
        region, letters = part.strip().rsplit("-", 1)
        out |= {f"{region}-{letter}" for letter in letters.split("/")}
    return frozenset(out)


KNOWN_ZONES: dict[str, frozenset[str]] = {
    "nvidia-tesla-a100": _zones(
        "us-central1-a/b/c/f, europe-west4-a/b, asia-southeast1-a/b/c, us-east1-b"
    ),
    "nvidia-a100-80gb": _zones("us-central1-a/c, us-east4-c, us-east5-a/b, europe-west4-a"),
    "nvidia-h100-80gb": _zones(
        "us-central1-a/b/c, us-east4-a/b/c, us-east5-a, us-west1-a/b, europe-west4-b/c"
    ),
    "nvidia-h100-mega-80gb": _zones(
        "us-central1-a/b/c, us-east4-a/b/c, europe-west4-b/c, asia-southeast1-b/c"
    ),
    "nvidia-h200-141gb": _zones(
        "us-central1-b, us-east4-b, us-east5-a, us-south1-b, europe-west4-a"
    ),
    "nvidia-b200": _zones("us-central1-b, us-east1-b, us-east4-b, us-south1-b, europe-west4-b"),
    "nvidia-l4": _zones(
        "us-central1-a/b/c, us-east1-b/c/d, us-west1-a/b/c, europe-west4-a/b/c, asia-east1-a/b/c"
    ),
    "nvidia-tesla-t4": _zones(
        "us-central1-a/b/c/f, us-east1-b/c/d, us-west1-a/b, europe-west4-a/b/c"
    ),
    "nvidia-tesla-v100": _zones(
        "us-central1-a/b/c/f, us-east1-b/c, us-west1-a/b, europe-west4-a/b/c"
    ),
}
