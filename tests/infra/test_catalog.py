"""The catalog against the facts sheet (gcp-gpu-facts.md), transcribed here independently."""

from __future__ import annotations

import pytest

from infra import catalog

# machine type -> (accelerator, GPUs, vCPUs, memory GB), from gcp-gpu-facts.md §1.
FACTS: dict[str, tuple[str, int, int, float]] = {
    "a2-highgpu-1g": ("nvidia-tesla-a100", 1, 12, 85),
    "a2-highgpu-2g": ("nvidia-tesla-a100", 2, 24, 170),
    "a2-highgpu-4g": ("nvidia-tesla-a100", 4, 48, 340),
    "a2-highgpu-8g": ("nvidia-tesla-a100", 8, 96, 680),
    "a2-megagpu-16g": ("nvidia-tesla-a100", 16, 96, 1360),
    "a2-ultragpu-1g": ("nvidia-a100-80gb", 1, 12, 170),
    "a2-ultragpu-2g": ("nvidia-a100-80gb", 2, 24, 340),
    "a2-ultragpu-4g": ("nvidia-a100-80gb", 4, 48, 680),
    "a2-ultragpu-8g": ("nvidia-a100-80gb", 8, 96, 1360),
    "a3-highgpu-1g": ("nvidia-h100-80gb", 1, 26, 234),
    "a3-highgpu-2g": ("nvidia-h100-80gb", 2, 52, 468),
    "a3-highgpu-4g": ("nvidia-h100-80gb", 4, 104, 936),
    "a3-highgpu-8g": ("nvidia-h100-80gb", 8, 208, 1872),
    "a3-megagpu-8g": ("nvidia-h100-mega-80gb", 8, 208, 1872),
    "a3-edgegpu-8g": ("nvidia-h100-80gb", 8, 208, 1872),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8, 224, 2952),
    "a4-highgpu-8g": ("nvidia-b200", 8, 224, 3968),
    "g2-standard-4": ("nvidia-l4", 1, 4, 16),
    "g2-standard-8": ("nvidia-l4", 1, 8, 32),
    "g2-standard-12": ("nvidia-l4", 1, 12, 48),
    "g2-standard-16": ("nvidia-l4", 1, 16, 64),
    "g2-standard-24": ("nvidia-l4", 2, 24, 96),
    "g2-standard-32": ("nvidia-l4", 1, 32, 128),
    "g2-standard-48": ("nvidia-l4", 4, 48, 192),
    "g2-standard-96": ("nvidia-l4", 8, 96, 384),
}

# accelerator -> (on-demand quota metric, GPU memory GB), §6 and §2.
QUOTA = {
    "nvidia-tesla-t4": ("NVIDIA_T4_GPUS", 16),
    "nvidia-tesla-v100": ("NVIDIA_V100_GPUS", 16),
    "nvidia-tesla-p100": ("NVIDIA_P100_GPUS", 16),
    "nvidia-tesla-p4": ("NVIDIA_P4_GPUS", 8),
    "nvidia-tesla-a100": ("NVIDIA_A100_GPUS", 40),
    "nvidia-a100-80gb": ("NVIDIA_A100_80GB_GPUS", 80),
    "nvidia-l4": ("NVIDIA_L4_GPUS", 24),
    "nvidia-h100-80gb": ("NVIDIA_H100_GPUS", 80),
    "nvidia-h100-mega-80gb": ("NVIDIA_H100_MEGA_GPUS", 80),
    "nvidia-h200-141gb": ("NVIDIA_H200_GPUS", 141),
    "nvidia-b200": ("NVIDIA_B200_GPUS", 180),
}


def test_every_gpu_machine_type_of_the_facts_sheet_is_in_the_catalog_and_matches() -> None:
    builtin = {n: m for n, m in catalog.MACHINE_TYPES.items() if m.has_builtin_gpus}
    assert set(builtin) == set(FACTS)
    for name, (acc, gpus, vcpus, mem) in FACTS.items():
        mt = builtin[name]
        assert (mt.accelerator, mt.gpus, mt.vcpus, mt.memory_gb) == (acc, gpus, vcpus, mem), name
        assert mt.series == name[:2]


def test_every_machine_type_has_a_known_accelerator_or_is_n1() -> None:
    for mt in catalog.MACHINE_TYPES.values():
        if mt.series == "n1":
            assert mt.accelerator is None and mt.gpus == 0 and not mt.compact_placement
        else:
            assert mt.accelerator in catalog.ACCELERATORS and mt.gpus >= 1


def test_n1_machine_types_cover_standard_highmem_highcpu() -> None:
    n1 = {n: m for n, m in catalog.MACHINE_TYPES.items() if m.series == "n1"}
    assert len(n1) == 8 + 7 + 7
    assert (n1["n1-standard-8"].vcpus, n1["n1-standard-8"].memory_gb) == (8, 30)
    assert n1["n1-highmem-64"].memory_gb == 416
    assert n1["n1-highcpu-96"].memory_gb == pytest.approx(86.4)
    assert "n1-highmem-1" not in n1 and "n1-standard-1" in n1


def test_n1_attachable_gpus_counts_and_caps_match_the_facts() -> None:
    g = catalog.N1_GPUS
    assert set(g) == {
        "nvidia-tesla-t4",
        "nvidia-tesla-v100",
        "nvidia-tesla-p100",
        "nvidia-tesla-p4",
    }
    assert g["nvidia-tesla-t4"].counts == (1, 2, 4)  # 8 x T4 is not supported
    assert g["nvidia-tesla-v100"].counts == (1, 2, 4, 8)
    assert g["nvidia-tesla-t4"].caps == {1: (48, 312), 2: (48, 312), 4: (96, 624)}
    assert g["nvidia-tesla-v100"].caps[1] == (12, 78) and g["nvidia-tesla-v100"].caps[8] == (
        96,
        624,
    )
    assert g["nvidia-tesla-p100"].caps == {1: (16, 104), 2: (32, 208), 4: (96, 624)}
    assert g["nvidia-tesla-p4"].caps == {1: (24, 156), 2: (48, 312), 4: (96, 624)}


@pytest.mark.parametrize("accelerator", sorted(QUOTA))
def test_quota_metrics_on_demand_and_spot(accelerator: str) -> None:
    metric, memory = QUOTA[accelerator]
    assert catalog.quota_metric(accelerator, spot=False) == metric
    assert catalog.quota_metric(accelerator, spot=True) == "PREEMPTIBLE_" + metric
    assert catalog.ACCELERATORS[accelerator].memory_gb == memory


def test_quota_metric_accepts_the_a100_alias_and_rejects_unknown() -> None:
    assert catalog.quota_metric("nvidia-a100-40gb", spot=False) == "NVIDIA_A100_GPUS"
    with pytest.raises(KeyError):
        catalog.quota_metric("nvidia-rtx-9090", spot=False)


def test_an_accelerator_is_named_by_its_type_alias_or_model_name_in_any_case() -> None:
    """gpuType takes what `gpus` takes: T4 is nvidia-tesla-t4, A100-80GB nvidia-a100-80gb."""
    for name in ("T4", "t4", "nvidia-tesla-t4", "NVIDIA-Tesla-T4"):
        assert catalog.canonical_accelerator(name) == "nvidia-tesla-t4"
    assert catalog.canonical_accelerator("a100-80gb") == "nvidia-a100-80gb"
    assert catalog.canonical_accelerator("NVIDIA-A100-40GB") == "nvidia-tesla-a100"
    assert catalog.canonical_accelerator("X100") is None
    assert catalog.canonical_accelerator(" T4") is None  # no other text read as a GPU


def test_cpu_quota_metrics() -> None:
    assert catalog.cpu_quota_metric("n1", spot=False) == "CPUS"
    assert catalog.cpu_quota_metric("n1", spot=True) == "PREEMPTIBLE_CPUS"
    assert catalog.cpu_quota_metric("a3", spot=True) == "PREEMPTIBLE_A3_CPUS"
    assert catalog.cpu_quota_metric("g2", spot=False) == "G2_CPUS"
    assert catalog.cpu_quota_metric("a2", spot=False) == "A2_CPUS"


def test_nvidia_smi_names() -> None:
    # as listed in torchrun-and-trainer.md §6.1
    names = {a: catalog.ACCELERATORS[a].model for a in catalog.ACCELERATORS}
    assert names["nvidia-l4"] == "NVIDIA L4"
    assert names["nvidia-h100-80gb"] == "NVIDIA H100 80GB HBM3"
    assert names["nvidia-h200-141gb"] == "NVIDIA H200"
    assert names["nvidia-tesla-a100"] == "NVIDIA A100-SXM4-40GB"
    assert names["nvidia-a100-80gb"] == "NVIDIA A100-SXM4-80GB"


def test_gvnic_and_nics() -> None:
    for mt in catalog.MACHINE_TYPES.values():
        assert mt.gvnic == (mt.series in ("a3", "a4")), mt.name
    assert catalog.MACHINE_TYPES["a3-megagpu-8g"].nics.startswith("1 + 8 gVNIC")
    assert catalog.MACHINE_TYPES["a4-highgpu-8g"].nics.startswith("2 gVNIC + 8 MRDMA")
    assert catalog.MACHINE_TYPES["g2-standard-24"].nics == "1"


def test_boot_disk_types_per_series() -> None:
    types = {n: catalog.boot_disk_types(m) for n, m in catalog.MACHINE_TYPES.items()}
    assert types["a4-highgpu-8g"] == types["a3-ultragpu-8g"] == ("hyperdisk-balanced",)
    for name, allowed in types.items():
        assert "pd-extreme" not in allowed
        if not name.startswith("n1"):
            assert "pd-standard" not in allowed
    assert catalog.default_boot_disk_type(catalog.MACHINE_TYPES["g2-standard-4"]) == "pd-balanced"
    assert catalog.default_boot_disk_type(catalog.MACHINE_TYPES["a3-megagpu-8g"]) == "pd-ssd"


def test_spot_only_and_orderable_flags() -> None:
    spot_only = {n for n, m in catalog.MACHINE_TYPES.items() if m.spot_only}
    assert spot_only == {"a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g"}
    assert [n for n, m in catalog.MACHINE_TYPES.items() if not m.orderable] == ["a3-edgegpu-8g"]


#: Machine types the price data has no figure for (plan says "unknown", never 0).
UNPRICED = {"a4-highgpu-8g"}


@pytest.mark.parametrize("name", sorted(catalog.MACHINE_TYPES))
def test_every_machine_type_has_a_dated_price_or_is_known_unpriced(name: str) -> None:
    from infra.offers import price_table, vm_price, vm_zones

    table = price_table()
    assert table.source and table.as_of[:4].isdigit()
    mt = catalog.MACHINE_TYPES[name]
    shapes = (
        [(g, c) for g, gpu in catalog.N1_GPUS.items() for c in gpu.counts]
        if mt.series == "n1"
        else [(mt.accelerator, mt.gpus)]
    )
    for accelerator, count in shapes:
        assert accelerator is not None
        zones = vm_zones(name, accelerator, table)
        prices = [vm_price(name, z, accelerator, count, table) for z in sorted(zones)]
        known = [p for p in prices if p is not None and p.on_demand is not None]
        if name in UNPRICED:
            assert not known, f"{name} has a price now: take it out of UNPRICED"
            continue
        assert known, f"no price for {name} with {count} x {accelerator}"
        for p in known:
            assert p.on_demand is not None and p.on_demand > 0
            assert p.spot is None or 0 < p.spot < p.on_demand


def test_prices_quoted_in_the_facts_sheet() -> None:
    """The per-zone price data (infra/prices.csv) agrees with the facts sheet's us-central1 figures."""
    from infra.offers import vm_price

    def both(*args: object) -> tuple[float | None, float | None]:
        p = vm_price(*args)  # type: ignore[arg-type]
        assert p is not None
        return p.on_demand, p.spot

    assert both("g2-standard-4", "us-central1-a") == pytest.approx((0.707, 0.282), abs=0.002)
    assert both("g2-standard-8", "us-central1-a") == pytest.approx((0.854, 0.341), abs=0.002)
    t4 = both("n1-standard-8", "us-central1-a", "nvidia-tesla-t4", 1)
    assert t4[0] == pytest.approx(0.730, abs=0.002)
    assert both("a2-highgpu-8g", "us-central1-a")[0] == pytest.approx(29.387, abs=0.001)
    assert both("a3-megagpu-8g", "us-central1-a")[0] == pytest.approx(92.21, abs=0.01)


def test_nearest_machine_type_names() -> None:
    assert catalog.nearest_machine_types("a2-higpu-1g")[0] == "a2-highgpu-1g"
    assert catalog.nearest_machine_types("g2-standrd-8")[0] == "g2-standard-8"
    assert catalog.nearest_machine_types("zzzz") == []
