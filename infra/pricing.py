"""Indicative hourly prices of the catalog's machine shapes (us-central1, USD; disks, network and
Local SSD excluded), each with its source, date and how it was derived. Pure data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.catalog import MachineType

# Sources as cited in gcp-gpu-facts.md §10; the catalog figures carry the date the facts were
# compiled (the catalog itself is dated only "2025-26").
_SKY = "SkyPilot catalog v8"
_MIRROR = "gcloud-compute.com billing mirror"
PRICE_REGION = "us-central1"


@dataclass(frozen=True)
class Price:
    """An indicative hourly price; `as_of` is the ISO date the figure was taken."""

    on_demand: float
    spot: float
    as_of: str
    source: str
    basis: str = ""  # how it was derived from the source; empty = the source's own figure

    @property
    def confirmed(self) -> bool:
        return not self.basis

    def describe(self) -> str:
        return f"{self.source}, {self.as_of}" + (f"; {self.basis}" if self.basis else "")

    def hourly(self, spot: bool) -> float:
        return self.spot if spot else self.on_demand


#: Per-GPU prices for N1 attachable GPUs (on top of the N1 host).
N1_GPU_PRICES: dict[str, Price] = {
    "nvidia-tesla-t4": Price(0.35, 0.175, "2026-04-15", _SKY),
    "nvidia-tesla-p4": Price(0.60, 0.224, "2026-04-15", _SKY),
    "nvidia-tesla-p100": Price(1.46, 0.703, "2026-04-15", _SKY),
    "nvidia-tesla-v100": Price(2.48, 1.089, "2026-04-15", _SKY),
}

#: N1 host rates fitted to "n1-standard-8 + T4 = 0.730 / 0.280" (host 0.380 / 0.105).
_N1_VCPU_RATE = 0.031611
_N1_MEM_RATE = 0.004237
_N1_SPOT_FACTOR = 0.105 / 0.380

#: G2 rates fitted to g2-standard-4 / -8 (0.707 / 0.854 on-demand, 0.282 / 0.341 Spot):
#: L4 0.560 / 0.223 per GPU plus 0.03675 / 0.01475 per vCPU (memory is 4 GB per vCPU).
_G2_GPU = (0.560, 0.223)
_G2_VCPU = (0.03675, 0.01475)

#: Whole-machine prices from the facts sheet (scaled per GPU inside a shape where marked).
_A_PRICES: dict[str, Price] = {
    "a2-highgpu-1g": Price(3.673, 1.804, "2026-04-15", _SKY),
    "a2-highgpu-8g": Price(29.387, 14.431, "2026-04-15", _SKY),
    "a3-highgpu-1g": Price(11.06, 6.62, "2026-10-04", _MIRROR),
    "a3-megagpu-8g": Price(92.21, 28.17, "2026-04-15", _SKY),
    "a3-ultragpu-8g": Price(86.76, 40.99, "2026-04-15", _SKY),
    # GPUs only: a lower bound.
    "a4-highgpu-8g": Price(90.22, 32.61, "2026-04-15", _SKY, "GPUs only: a lower bound"),
}
# Per-GPU bases for shapes without a direct figure (derived: base x GPUs).
_A_PER_GPU_BASE = {
    "a2-highgpu": "a2-highgpu-1g",
    "a2-megagpu": "a2-highgpu-1g",
    "a3-highgpu": "a3-highgpu-1g",
    "a3-edgegpu": "a3-highgpu-1g",
}
# A100 80 GB: the facts sheet marks the catalog row anomalous (UNCONFIRMED); public list
# price ~5.07/h per GPU on-demand, spot ~40 % of it. Kept as an unconfirmed estimate.
_A2_ULTRA_PER_GPU = Price(5.07, 2.03, "2026-04-15", "list-price estimate", "UNCONFIRMED")


def price(mt: MachineType, gpu_type: str | None = None, gpu_count: int = 0) -> Price:
    """Indicative hourly price of one VM of this shape (us-central1)."""
    if mt.series == "n1":
        od_host = mt.vcpus * _N1_VCPU_RATE + mt.memory_gb * _N1_MEM_RATE
        host = Price(
            round(od_host, 4),
            round(od_host * _N1_SPOT_FACTOR, 4),
            "2026-04-15",
            _SKY,
            "host rates fitted to n1-standard-8",
        )
        if gpu_type is None or gpu_count == 0:
            return host
        g = N1_GPU_PRICES[gpu_type]
        return Price(
            round(host.on_demand + gpu_count * g.on_demand, 4),
            round(host.spot + gpu_count * g.spot, 4),
            g.as_of,
            g.source,
            ""
            if mt.name == "n1-standard-8" and gpu_count == 1
            else "host rates fitted to n1-standard-8",
        )
    if mt.series == "g2":
        od = mt.gpus * _G2_GPU[0] + mt.vcpus * _G2_VCPU[0]
        sp = mt.gpus * _G2_GPU[1] + mt.vcpus * _G2_VCPU[1]
        direct = mt.name in ("g2-standard-4", "g2-standard-8")
        basis = "" if direct else "rates fitted to g2-standard-4/8"
        return Price(round(od, 4), round(sp, 4), "2026-04-15", _SKY, basis)
    if mt.name in _A_PRICES:
        return _A_PRICES[mt.name]
    if mt.name.startswith("a2-ultragpu"):
        base, unit = _A2_ULTRA_PER_GPU, "per-GPU estimate"
    else:
        unit = _A_PER_GPU_BASE[mt.name.rsplit("-", 1)[0]]
        base = _A_PRICES[unit]
    return Price(
        round(base.on_demand * mt.gpus, 4),
        round(base.spot * mt.gpus, 4),
        base.as_of,
        base.source,
        "; ".join(b for b in (base.basis, f"{unit} x {mt.gpus}") if b),
    )
