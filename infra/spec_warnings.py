"""Warnings about a valid stack: things that are allowed but worth knowing before money is spent
(`plan` prints them; `up` shows them before it creates anything)."""

from __future__ import annotations

from infra import catalog, offers, vertex
from infra.offers import price_table
from infra.spec import RDMA_IMAGE, ClusterSpec
from infra.stackfile import DEFAULT_IMAGE_PROJECT

# The docs-supported alternative for G2 (driver preinstalled; Cluster Toolkit uses it on A3/A4).
ACCELERATOR_IMAGE_PROJECT = "ubuntu-os-accelerator-images"
ACCELERATOR_IMAGE_FAMILY = "ubuntu-accelerator-2204-amd64-with-nvidia-580"


def spec_warnings(spec: ClusterSpec) -> list[str]:
    """Things that are allowed but worth knowing before money is spent."""
    ignored = ", ".join(spec.ignored)
    out = [f"ignored with backend {spec.backend}: {ignored}"] if ignored else []
    mt = catalog.MACHINE_TYPES[spec.machine_type]
    if spec.on_vertex:
        out += vertex.vertex_warnings(spec.machine_type, spec.accelerator, spec.region)
    else:
        out += _gce_warnings(spec, mt)
    if spec.price is None or spec.price.note:
        why = spec.price.note if spec.price else f"none in {spec.zone}: shown as unknown"
        out.append(f"the price of {mt.name} is not the source's own figure: {why}")
    return out


def _gce_warnings(spec: ClusterSpec, mt: catalog.MachineType) -> list[str]:
    out: list[str] = []
    if spec.series == "g2" and spec.image_project == DEFAULT_IMAGE_PROJECT:
        out.append(
            "G2 on a Deep Learning VM image: Google's docs call it unsupported, public scripts "
            "run it; verify proves the GPU before training. If boot or verify fails, set "
            f"imageProject {ACCELERATOR_IMAGE_PROJECT} and imageFamily {ACCELERATOR_IMAGE_FAMILY} "
            "(driver only: gputrain pip-installs PyTorch on each VM before verify)"
        )
    known = offers.vm_zones(spec.machine_type, spec.accelerator)
    unknown = [z for z in spec.zones if z not in known]
    if unknown and not spec.gpus_request:  # gpus: zones are a filter, candidates lie within
        near = sorted(z for z in known if catalog.region_of(z) == spec.region)
        out.append(
            f"{', '.join(unknown)} not among the zones known to offer {spec.accelerator} on "
            f"{spec.machine_type} ({', '.join(near) or 'none in ' + spec.region}, price data "
            f"{price_table().as_of}); the preflight checks"
        )
    rdma = spec.fabric is not None and spec.fabric.enabled and spec.fabric.kind == "rdma"
    if rdma and spec.image_project == DEFAULT_IMAGE_PROJECT:
        out.append(
            f"imageFamily {spec.image_family} is a Deep Learning VM (standard OS) image: the gIB "
            "plugin needs NVIDIA's DOCA-OFED driver there, which gputrain does not install; "
            f"leave imageFamily/imageProject at their defaults ({' / '.join(RDMA_IMAGE)})"
        )
    if spec.fabric is not None and not spec.fabric.enabled and spec.fabric.note:
        out.append(spec.fabric.note)  # A3 High multi-node, or gpuDirect off: what one NIC costs
    return out
