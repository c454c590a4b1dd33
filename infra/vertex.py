"""Vertex AI custom training facts: which catalog shapes it runs, its accelerator enum names, its
price premium, its default PyTorch container, and the rule that rejects what it cannot run.

Pure data + lookups, no I/O. Each fact says how sure we are:
  documented  a Google page or API reference read while building this says so;
  listed      issue 9 / shared/reference/vertex-gcs-and-corrections.md list it (compiled from
              Google's docs), but the Vertex page was not re-read here;
  unverified  only secondary sources (public job configs, the Vertex *training clusters* page,
              which is a different product) - `plan` prints a caveat.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from infra import catalog, offers, stackfile
from infra.offers import ZonePrice, price_table

Status = Literal["documented", "listed", "unverified"]

# --------------------------------------------------------------------------------------------
# Accelerators: catalog name -> MachineSpec.acceleratorType
# documented: Vertex REST reference `MachineSpec` / `AcceleratorType` and google-cloud-aiplatform
# 2.7.0 `aiplatform_v1/types/accelerator_type.py` (NVIDIA_TESLA_K80 is deprecated there).
# --------------------------------------------------------------------------------------------

ACCELERATOR_ENUMS: dict[str, str] = {
    "nvidia-tesla-t4": "NVIDIA_TESLA_T4",
    "nvidia-tesla-v100": "NVIDIA_TESLA_V100",
    "nvidia-tesla-p100": "NVIDIA_TESLA_P100",
    "nvidia-tesla-p4": "NVIDIA_TESLA_P4",
    "nvidia-tesla-a100": "NVIDIA_TESLA_A100",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB",
    "nvidia-l4": "NVIDIA_L4",
    "nvidia-h100-80gb": "NVIDIA_H100_80GB",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_80GB",
    "nvidia-h200-141gb": "NVIDIA_H200_141GB",
    "nvidia-b200": "NVIDIA_B200",
}


def accelerator_enum(gpu_type: str) -> str:
    """Vertex's acceleratorType for a catalog accelerator (or one of its aliases)."""
    canonical = catalog.canonical_accelerator(gpu_type)
    if canonical is None or canonical not in ACCELERATOR_ENUMS:
        raise KeyError(f"no Vertex accelerator type for {gpu_type!r}")
    return ACCELERATOR_ENUMS[canonical]


# --------------------------------------------------------------------------------------------
# Machine types Vertex custom training (CustomJob) runs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VertexOffer:
    """A family of catalog machine types that Vertex custom training runs, and how sure we are."""

    pattern: str  # full-match regex over catalog machine type names
    family: str  # how errors and `plan` name it
    status: Status
    source: str


_ISSUE = "issue 9 list (Vertex 'Configure compute resources for custom training')"
_CLUSTERS = (
    "listed for Vertex AI training clusters (docs.cloud.google.com/vertex-ai/docs/training/"
    "training-clusters/compute-resources), not on a CustomJob page read here"
)

OFFERS: tuple[VertexOffer, ...] = (
    VertexOffer(r"a2-highgpu-(1|2|4|8)g", "a2-highgpu-1g/2g/4g/8g", "listed", _ISSUE),
    VertexOffer(r"a2-ultragpu-(1|2|4|8)g", "a2-ultragpu-1g/2g/4g/8g", "listed", _ISSUE),
    VertexOffer(r"a3-highgpu-8g", "a3-highgpu-8g", "listed", _ISSUE),
    VertexOffer(r"a3-megagpu-8g", "a3-megagpu-8g", "listed", _ISSUE + "; " + _CLUSTERS),
    VertexOffer(r"g2-standard-[0-9]+", "g2-standard-*", "listed", _ISSUE),
    # N1 with an attached T4/V100/P100/P4. Vertex's list starts at 4 vCPUs for n1-standard and
    # 16 for n1-highcpu (recalled from the configure-compute page; not re-read offline).
    VertexOffer(
        r"n1-standard-(4|8|16|32|64|96)|n1-highmem-[0-9]+|n1-highcpu-(16|32|64|96)",
        "n1-standard-4..96, n1-highmem-*, n1-highcpu-16..96",
        "listed",
        _ISSUE + "; vCPU floor unverified",
    ),
    VertexOffer(r"a2-megagpu-16g", "a2-megagpu-16g", "unverified", "public CustomJob configs"),
    VertexOffer(
        r"a3-highgpu-(1|2|4)g",
        "a3-highgpu-1g/2g/4g (Spot)",
        "unverified",
        "Spot/Flex-start only on Compute Engine; assumed the same on Vertex",
    ),
    VertexOffer(r"a3-ultragpu-8g", "a3-ultragpu-8g", "unverified", _CLUSTERS),
    VertexOffer(r"a4-highgpu-8g", "a4-highgpu-8g", "unverified", _CLUSTERS),
)


def vertex_offer(machine_type: str) -> VertexOffer | None:
    return next((o for o in OFFERS if re.fullmatch(o.pattern, machine_type)), None)


def _offered_families() -> str:
    return ", ".join(o.family for o in OFFERS)


@dataclass(frozen=True)
class ShapeWords:
    """How the user wrote a shape's three settings, for vertex_problem's line: the stack's keys
    (`gpuCount 3`, `gpuType 'nvidia-l4'`), or a CustomJobSpec pool's machineSpec fields
    (`acceleratorCount = 3`, `acceleratorType = 'NVIDIA_L4'`)."""

    machine_type: str = "machineType"
    gpu_type: str = "gpuType"
    gpu_count: str = "gpuCount"
    equals: str = " "
    enums: bool = False  # GPU types as MachineSpec.acceleratorType names them

    def said(self, setting: str, value: object) -> str:
        """`gpuCount 3` / `machineSpec.acceleratorCount = 3`: the setting and its value."""
        return f"{setting}{self.equals}{value!r}"

    def gpu(self, name: str) -> str:
        return ACCELERATOR_ENUMS.get(name, name) if self.enums else name


STACK_WORDS = ShapeWords()


def vertex_problem(
    machine_type: str,
    gpu_type: str | None,
    gpu_count: int,
    *,
    spot: bool = False,
    words: ShapeWords = STACK_WORDS,
) -> str | None:
    """Why Vertex custom training cannot run this shape, in one line naming the setting as
    `words` writes it, the value and what is allowed; None when it can. gpu_type None /
    gpu_count 0 mean "implied"."""
    w = words
    mt = catalog.machine_type(machine_type)
    if mt is None:
        near = catalog.nearest_machine_types(machine_type)
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        return (
            f"{w.said(w.machine_type, machine_type)}: unknown{hint}; "
            f"Vertex offers {_offered_families()}"
        )
    offer = vertex_offer(mt.name)
    if offer is None:
        why = "A3 Edge is a serving product" if not mt.orderable else "not in Vertex's list"
        return (
            f"{w.said(w.machine_type, mt.name)}: Vertex AI custom training does not run it "
            f"({why}); allowed: {_offered_families()}"
        )
    if mt.spot_only and not spot:
        return (
            f"{w.said(w.machine_type, mt.name)}: offered only as Spot; "
            "set gputrain:capacity spot or use a3-highgpu-8g"
        )
    canonical = catalog.canonical_accelerator(gpu_type) if gpu_type else None
    shown_type = w.gpu(gpu_type) if gpu_type else gpu_type
    if gpu_type and canonical is None:
        n1_choices = (
            ", ".join(map(w.gpu, catalog.N1_GPUS))
            if w.enums
            else catalog.gpu_choices(catalog.N1_GPUS)
        )
        allowed = (
            f"empty ({mt.name} brings {w.gpu(mt.accelerator)})"
            if mt.accelerator
            else f"{n1_choices} ({mt.name} is N1)"
        )
        return f"{w.said(w.gpu_type, shown_type)}: unknown; allowed: {allowed}"
    if mt.accelerator is not None:
        if canonical not in (None, mt.accelerator):
            return (
                f"{w.said(w.gpu_type, shown_type)}: {mt.name} brings "
                f"{w.gpu(mt.accelerator)}; leave it empty"
            )
        if gpu_count not in (0, mt.gpus):
            return (
                f"{w.said(w.gpu_count, gpu_count)}: {mt.name} has {mt.gpus} x "
                f"{w.gpu(mt.accelerator)}; use 0 (implied) or {mt.gpus}"
            )
        return None
    n1_gpus = ", ".join(map(w.gpu, catalog.N1_GPUS))
    if canonical is None:
        return f"{w.gpu_type} is empty: {mt.name} on Vertex needs an attached GPU: {n1_gpus}"
    gpu = catalog.N1_GPUS.get(canonical)
    if gpu is None:
        return f"{w.said(w.gpu_type, shown_type)}: {mt.name} (N1) can attach {n1_gpus}"
    if gpu_count not in gpu.caps:
        allowed = ", ".join(map(str, gpu.counts))
        return f"{w.said(w.gpu_count, gpu_count)}: allowed for {w.gpu(canonical)} on N1: {allowed}"
    max_vcpu, max_mem = gpu.caps[gpu_count]
    if mt.vcpus > max_vcpu or mt.memory_gb > max_mem:
        return (
            f"{w.said(w.machine_type, mt.name)}: {gpu_count} x {w.gpu(canonical)} allows at most "
            f"{max_vcpu} vCPUs and {max_mem} GB ({mt.name} has {mt.vcpus} vCPUs, "
            f"{mt.memory_gb:g} GB)"
        )
    return None


def vertex_caveat(machine_type: str) -> str | None:
    """What `plan` should say when Vertex support for this machine type is not confirmed."""
    offer = vertex_offer(machine_type)
    if offer is None or offer.status != "unverified":
        return None
    return f"Vertex AI custom training support for {machine_type} is unverified ({offer.source})"


def vertex_regions(accelerator: str) -> tuple[str, ...] | None:
    """Regions known to offer the accelerator (catalog.KNOWN_ZONES: Compute Engine's zones, where
    Vertex's replicas run too); None when the catalog does not know. Vertex's own per-region
    training list was not re-read offline, so a region outside this is a warning, not an error."""
    known = catalog.KNOWN_ZONES.get(accelerator)
    return None if known is None else tuple(sorted({catalog.region_of(z) for z in known}))


def vertex_warnings(machine_type: str, accelerator: str, region: str) -> list[str]:
    """What `plan` says about a Vertex job of this shape before money is spent."""
    out = []
    caveat = vertex_caveat(machine_type)
    if caveat:
        out.append(caveat)
    regions = vertex_regions(accelerator)
    if regions is not None and region not in regions:
        out.append(
            f"{region} is not among the regions known to offer {accelerator} "
            f"({', '.join(regions)}); the preflight checks"
        )
    return out


# --------------------------------------------------------------------------------------------
# Price: Compute Engine list price plus Vertex's training premium
# --------------------------------------------------------------------------------------------

#: Vertex custom training list prices sit ~15 % above the same Compute Engine shapes
#: (e.g. us-central1 a2-highgpu-1g 4.2245 vs 3.6734 USD/h, n1-standard-4 0.2185 vs 0.1900,
#: T4 0.4025 vs 0.35). Derived from the Vertex AI pricing page as recalled, not re-read offline;
#: applied to Spot as well (unverified).
TRAINING_SURCHARGE = 0.15
SURCHARGE_BASIS = "Vertex training premium +15 % over Compute Engine (derived, unverified)"


def vertex_price(
    machine_type: str, gpu_type: str | None, gpu_count: int, region: str
) -> ZonePrice | None:
    """One Vertex training replica of this shape in `region`: the cheapest zone's Compute Engine
    price there plus the training premium; None when the price data has none in the region."""
    table = price_table()
    zones = sorted(z for z in table.zones(machine_type) if catalog.region_of(z) == region)
    base = [p for z in zones if (p := offers.vm_price(machine_type, z, gpu_type, gpu_count))]
    if not base:
        return None
    factor = 1 + TRAINING_SURCHARGE

    def up(value: float | None) -> float | None:
        return None if value is None else round(value * factor, 4)

    cheapest = min(base, key=lambda p: (p.on_demand is None, p.on_demand or 0.0))
    note = "; ".join(n for n in (cheapest.note, SURCHARGE_BASIS) if n)
    return ZonePrice(
        up(cheapest.on_demand), up(min((p.spot for p in base if p.spot), default=None)), note
    )


# The training container (pythonPackageSpec.executorImageUri): the `executorImage` setting.
DEFAULT_EXECUTOR_IMAGE = stackfile.DEFAULT_EXECUTOR_IMAGE
