"""Warnings about a valid stack: things that are allowed but worth knowing before money is spent
(`plan` prints them; `up` shows them before it creates anything)."""

from __future__ import annotations

from infra import catalog, vertex
from infra.spec import ClusterSpec
from infra.stackfile import DEFAULT_IMAGE_PROJECT

# The docs-supported alternative for G2 (driver preinstalled; Cluster Toolkit uses it on A3/A4).
ACCELERATOR_IMAGE_PROJECT = "ubuntu-os-accelerator-images"
ACCELERATOR_IMAGE_FAMILY = "ubuntu-accelerator-2204-amd64-with-nvidia-580"


def spec_warnings(spec: ClusterSpec) -> list[str]:
    """Things that are allowed but worth knowing before money is spent."""
    out = (
        [f"ignored with backend {spec.backend}: {', '.join(spec.ignored)}"] if spec.ignored else []
    )
    mt = catalog.MACHINE_TYPES[spec.machine_type]
    if spec.on_vertex:
        out += vertex.vertex_warnings(spec.machine_type, spec.accelerator, spec.region)
    else:
        out += _gce_warnings(spec, mt)
    if not spec.price.confirmed:
        out.append(
            f"the price of {mt.name} is derived ({spec.price.basis}), not a published figure"
        )
    return out


def _gce_warnings(spec: ClusterSpec, mt: catalog.MachineType) -> list[str]:
    out = []
    if spec.series == "g2" and spec.image_project == DEFAULT_IMAGE_PROJECT:
        out.append(
            "G2 on a Deep Learning VM image: Google's docs call it unsupported, public scripts "
            "run it; verify proves the GPU before training. If boot or verify fails, set "
            f"imageProject {ACCELERATOR_IMAGE_PROJECT} and imageFamily {ACCELERATOR_IMAGE_FAMILY} "
            "(driver only: PyTorch must be installed for python3)"
        )
    known = catalog.KNOWN_ZONES.get(spec.accelerator)
    if known is not None:
        unknown = [z for z in spec.zones if z not in known]
        if unknown:
            out.append(
                f"{', '.join(unknown)} not among the zones known to offer {spec.accelerator} "
                f"({', '.join(sorted(known))}); the preflight checks"
            )
    if spec.fabric is not None and not spec.fabric.enabled and spec.fabric.note:
        out.append(spec.fabric.note)  # A3 High multi-node, or gpuDirect off: what one NIC costs
    return out
