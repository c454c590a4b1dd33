"""Preflight of a Vertex AI stack, before anything is created: Vertex runs the shape, the region
offers it (the catalog, then the Compute API in the stack's zones: Vertex's replicas run on that
capacity), and the Vertex quota — which no API we call reports, so it is *unknown*, never zero.

The Compute API is not needed to run Vertex jobs, so a check it cannot answer warns, it never
blocks; a region where no listed zone has the machine type fails.
"""

from __future__ import annotations

import dataclasses
import re

from infra import vertex
from infra.base.errors import GputrainError
from infra.catalog import quota_console_url
from infra.gcp.compute import ComputeApi, ComputeApiError
from infra.preflight import (
    TABLE_HEADERS,
    CheckResult,
    PreflightReport,
    check_machine_type,
    request_for,
)
from infra.spec import ClusterSpec
from scripts import ui


def vertex_preflight(spec: ClusterSpec, api: ComputeApi) -> PreflightReport:
    """Every check, one row each; never raises on a failed check."""
    assert spec.project is not None  # require_deployable ran first
    region = spec.region
    offer = vertex.vertex_offer(spec.machine_type)
    assert offer is not None  # parse_spec refused the rest
    rows = [
        CheckResult(
            "Vertex machine",
            region,
            "warn" if offer.status == "unverified" else "ok",
            f"{spec.machine_type}: {offer.status} ({offer.source})",
            "" if offer.status != "unverified" else "expect Vertex to refuse it at job creation",
        )
    ]
    regions = vertex.vertex_regions(spec.accelerator)
    if regions is not None:
        known = region in regions
        rows.append(
            CheckResult(
                "region",
                region,
                "ok" if known else "warn",
                f"{spec.accelerator} is {'' if known else 'not '}known in {region}",
                "" if known else f"regions known to offer it: {', '.join(regions)}",
            )
        )
    rows.append(_zones_row(spec, api))
    rows.append(
        CheckResult(
            "Vertex quota",
            region,
            "warn",
            f"unknown: the Compute API does not report Vertex AI training quotas; the job needs "
            f"{spec.nodes * spec.gpus_per_node} x {vertex.accelerator_enum(spec.accelerator)}"
            + (" (Spot: the preemptible quota)" if spec.spot else ""),
            f"check 'custom model training' GPU quotas of aiplatform.googleapis.com in {region}: "
            + quota_console_url(spec.project),
        )
    )
    return PreflightReport(tuple(rows))


def _zones_row(spec: ClusterSpec, api: ComputeApi) -> CheckResult:
    """The machine type exists with its GPUs in at least one of the stack's zones."""
    req = request_for(spec)
    offered_in, why = [], []
    for zone in spec.zones:
        z = dataclasses.replace(req, zone=zone)
        try:
            info = api.machine_type(z.project, zone, z.machine_type)
            accels = api.accelerator_types(z.project, zone) if z.is_n1 else []
        except (ComputeApiError, OSError) as e:  # OSError: requests' connection errors
            return CheckResult(
                "machine type",
                spec.region,
                "warn",
                f"could not check with the Compute API: {e}",
                "not needed for Vertex; enable compute.googleapis.com to have it checked",
            )
        row = check_machine_type(z, info)
        if row.status == "fail":
            why.append(row.detail)
        elif z.is_n1 and not any(a.name == z.accelerator for a in accels):
            why.append(f"{z.accelerator} is not offered in {zone}")
        else:
            offered_in.append(zone)
    if offered_in:
        return CheckResult(
            "machine type", spec.region, "ok", f"{spec.machine_type} in {', '.join(offered_in)}"
        )
    return CheckResult(
        "machine type",
        spec.region,
        "fail",
        "; ".join(why),
        "pick zones of a region that offers it (gputrain:zones)",
    )


#: The first google-cloud-aiplatform with every field and enum the job body sends: Scheduling
#: `strategy` and `maxWaitDuration` (1.62), FLEX_START (1.66), NVIDIA_H100_MEGA_80GB (1.75),
#: NVIDIA_H200_141GB and NVIDIA_B200 (1.93.0: read in the released wheels' aiplatform_v1/types/
#: accelerator_type.py and custom_job.py). proto-plus's from_json refuses a name it lacks, so an
#: older client would fail at submission, after `up`. pyproject.toml pins the same floor.
AIPLATFORM_FLOOR = (1, 93, 0)
AIPLATFORM = "google-cloud-aiplatform"


def aiplatform_problem(installed: str | None = None) -> str | None:
    """One line when the installed client cannot send our jobs (too old, or absent); None when
    it can. `installed`: the version to judge (default: what this Python has)."""
    from importlib import metadata

    if installed is None:
        try:
            installed = metadata.version(AIPLATFORM)
        except metadata.PackageNotFoundError:
            installed = ""
    floor = ".".join(map(str, AIPLATFORM_FLOOR))
    if not installed:
        return f"{AIPLATFORM} is not installed; backend vertex needs it: pip install '{AIPLATFORM}>={floor}'"
    parts = [int(p) for p in re.findall(r"\d+", installed)[:3]]
    if tuple(parts + [0] * (3 - len(parts))) < AIPLATFORM_FLOOR:
        return (
            f"{AIPLATFORM} {installed} is too old for backend vertex (it lacks the Vertex fields "
            f"and GPU names gputrain sends); allowed: {floor} or newer: "
            f"pip install '{AIPLATFORM}>={floor}'"
        )
    return None


def preflight_region(spec: ClusterSpec, api: ComputeApi) -> None:
    """Print the table; refuse to go on when a check failed."""
    report = vertex_preflight(spec, api)
    ui.table("preflight (Vertex AI)", TABLE_HEADERS, report.table_rows())
    if not report.ok:
        raise GputrainError(
            "preflight failed (see the fixes in the table above); nothing was created"
        )
