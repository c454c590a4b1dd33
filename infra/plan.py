"""`gputrain plan`: what a stack would cost and what is still missing, from the files alone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from infra import capacity, catalog, reconciler, vertex
from infra.autodown import plan_line
from infra.fabric import FABRICS
from infra.keys import IPV4_ADDRESSES, covered_addresses, format_duration
from infra.offer_tables import CandidateTable, Check, candidate_table, money
from infra.offers import Candidate, price_table
from infra.spec import (
    RDMA_IMAGE,
    RDMA_IMAGE_WHY,
    ClusterSpec,
    MissingSetting,
    missing_settings,
    parse_spec,
)
from infra.spec_warnings import spec_warnings
from infra.stackfile import load_stack_config

HEADERS = (
    "nodes",
    "machine type",
    "GPUs per node",
    "zone",
    "capacity",
    "TTL",
    "$/h per node",
    "$/h total",
    "worst case $",
)


@dataclass(frozen=True)
class Plan:
    """The plan of one stack: a table row, the price basis, warnings and missing settings."""

    spec: ClusterSpec
    row: tuple[str, ...]
    hourly_per_node: float | None  # None: the price data has no figure (shown as "unknown")
    hourly_total: float | None
    worst_case: float | None  # price x nodes x TTL: what the TTL caps the bill at
    price_note: str
    bucket_note: str
    capacity_note: str
    fabric_note: str
    warnings: tuple[str, ...]
    missing: tuple[MissingSetting, ...]
    candidates: CandidateTable | None = None  # gpus stacks: the ranked candidates

    @property
    def cost(self) -> str:
        """ "~$1.60/h, at most $4.80 before the VMs delete themselves" (or "unknown")."""
        return f"~{money(self.hourly_total)}/h, at most {money(self.worst_case)}"

    @property
    def title(self) -> str:
        return f"gputrain plan: stack {self.spec.stack}"

    @property
    def ready(self) -> bool:
        return not self.missing

    def footer_lines(self) -> list[str]:
        """What to print under the table: price basis, warnings, then the next steps."""
        lines = [self.price_note]
        if not self.spec.on_vertex:
            lines.append(ssh_exposure(self.spec))
        lines.append(self.bucket_note)
        lines += data_notes(self.spec)
        if not self.spec.on_vertex:
            lines.append(plan_line(self.spec.autodown_s, self.spec.max_run_duration))
            lines.append(
                reconciler.plan_line(
                    self.spec.recover,
                    self.spec.capacity,
                    self.spec.reconcile_every_s,
                    self.spec.job_reach,
                )
            )
        lines += [n for n in (self.capacity_note, self.fabric_note) if n]
        lines += [f"warning: {w}" for w in self.warnings]
        if self.missing:
            lines.append(f"Before `pulumi up --stack {self.spec.stack}`, set:")
            lines += [f"  {m.key}: {m.why}\n    {m.command}" for m in self.missing]
        else:
            lines.append(f"Ready: pulumi up --stack {self.spec.stack}")
        return lines


def data_notes(spec: ClusterSpec) -> list[str]:
    """The scratch disk every node has (GCE) and the datasets every job gets. Pure."""
    lines = [] if spec.on_vertex else [f"Scratch per node: {spec.scratch.describe()}"]
    lines += [f"Data: {d.name} = {d.uri} ({d.mode}) -> {d.env_name}" for d in spec.datasets]
    return lines


def ssh_exposure(spec: ClusterSpec) -> str:
    """Who can reach SSH on which nodes: always shown, so a wide range is never a surprise."""
    reached = {"head": "the head node", "all": "every node", "none": "no node"}[spec.public_ip]
    if not spec.ssh_source_ranges:
        return f"SSH exposure: port 22 on {reached}, from nowhere yet (sshSourceRanges is not set)"
    n = covered_addresses(spec.ssh_source_ranges)
    whole = ", the whole IPv4 internet" if n == IPV4_ADDRESSES else ""
    return (
        f"SSH exposure: port 22 on {reached} (public IP), from {', '.join(spec.ssh_source_ranges)} "
        f"({n:,} address{'es' if n != 1 else ''}{whole}); nodes reach each other by network tag"
    )


def disks_extra(spec: ClusterSpec) -> str:
    """What the table's $/h leaves out: on Compute Engine the disks' list price (which the
    spending caps and the run's cost estimate count: infra/disk_prices.py) and network
    traffic. Pure."""
    if spec.on_vertex:
        return "disks and network extra"
    from infra.disk_prices import spec_disk_rate

    disks = spec_disk_rate(spec, spec.spot)
    priced = (
        f"boot disk and Local SSD {money(disks.hourly)}/h per node more (in the spending caps "
        "and the cost estimate)"
        if disks.hourly
        else ""
    )
    unpriced = (
        f"no price known for the {', '.join(disks.unpriced)} (not in the caps or the estimate)"
        if disks.unpriced
        else ""
    )
    return "; ".join(part for part in (priced, unpriced, "network extra") if part)


def build_plan(spec: ClusterSpec, checks: Mapping[Candidate, Check] | None = None) -> Plan:
    """Pure: the plan of a validated spec; `checks` are the candidates' preflight verdicts."""
    per_node = spec.hourly_price_per_node
    total = spec.hourly_price
    worst = None if total is None else total * spec.max_run_duration_s / 3600
    gpus = f"{spec.gpus_per_node} x {spec.gpu_model} ({spec.gpu_memory_gb} GB)"
    row = (
        str(spec.nodes),
        spec.machine_type,
        gpus,
        f"{spec.region} (Vertex AI)" if spec.on_vertex else spec.zone,
        spec.capacity,
        spec.max_run_duration,
        money(per_node),
        money(total),
        money(worst),
    )
    gpus_total = spec.gpus_per_node * spec.nodes
    if spec.capacity == "reservation":
        quota = (
            f"Quota: none used; the reservation {spec.reservation} must have {spec.nodes} free VMs"
        )
    else:
        quota = (
            f"Vertex AI custom training quota needed in {spec.region}: {gpus_total} x "
            f"{vertex.accelerator_enum(spec.accelerator)} GPUs"
            + (" (Spot jobs: the preemptible quota)" if spec.spot else "")
            if spec.on_vertex
            else f"Quota needed in {spec.region}: {gpus_total} x {spec.gpu_quota_metric}, "
            f"{spec.vcpus * spec.nodes} x {spec.cpu_quota_metric}"
        )
    table = price_table()
    where = f"{spec.region} (Vertex AI)" if spec.on_vertex else spec.zone
    note = (
        f"Prices: USD, {price_basis(spec)} in {where}, from {table.source}, "
        f"as of {table.as_of}"
        + (f" ({spec.price.note})" if spec.price and spec.price.note else "")
        + f"; {disks_extra(spec)}. {quota}."
    )
    return Plan(
        spec=spec,
        bucket_note=bucket_note(spec),
        row=row,
        hourly_per_node=per_node,
        hourly_total=total,
        worst_case=worst,
        price_note=note,
        capacity_note=capacity_note(spec),
        fabric_note=fabric_note(spec),
        warnings=tuple(spec_warnings(spec)),
        missing=tuple(missing_settings(spec)),
        candidates=candidate_table(
            spec.candidates,
            spec.max_run_duration_s,
            checks,
            price_factor=1 + vertex.TRAINING_SURCHARGE if spec.on_vertex else 1.0,
        )
        if spec.candidates
        else None,
    )


def bucket_note(spec: ClusterSpec) -> str:
    """Where checkpoints and results go, and who owns that bucket. Pure."""
    name = spec.bucket_name or f"gputrain-{spec.stack}-<gcp:project>"
    where = f"gs://{name}/{spec.bucket_prefix}"
    if spec.existing_bucket:
        return (
            f"Bucket: {where}runs/<run-id>/ (yours: nothing is created there but the nodes' "
            "objectUser grant; `down` never touches it)."
        )
    return (
        f"Bucket: {where}runs/<run-id>/ (the stack's own, in {spec.region}; objects expire after "
        f"{spec.bucket_retention_days} days; `down` downloads the results, then deletes it)."
    )


def plan_stack(root: Path, stack: str) -> Plan:
    """Read Pulumi.yaml + Pulumi.<stack>.yaml (no Pulumi CLI), validate, plan. Raises SpecError."""
    return build_plan(parse_spec(load_stack_config(root, stack), stack))


#: Which price the table shows per capacity mode, and how it relates to the bill.
PRICE_BASIS = {
    "spot": "Spot",
    "on-demand": "on-demand",
    "flex-start": (
        "on-demand shown as the upper bound of Flex-start (derived: Flex-start is discounted, by "
        "an amount per machine type our catalog does not have)"
    ),
    "reservation": (
        "on-demand shown as the reservation's rate (derived: a reservation bills at on-demand or "
        "its commitment's rate for as long as it exists, used or not; the VMs add nothing)"
    ),
}


def price_basis(spec: ClusterSpec) -> str:
    """PRICE_BASIS, except that Flex-start on G2 is not discounted: it bills on-demand."""
    if spec.capacity == "flex-start" and not capacity.flex_start_discounted(
        catalog.MACHINE_TYPES[spec.machine_type]
    ):
        return "on-demand (Flex-start is not discounted on G2)"
    return PRICE_BASIS[spec.capacity]


def capacity_note(spec: ClusterSpec) -> str:
    """How the VMs get their GPUs: the provisioning model, placement and what it bills."""
    if spec.on_vertex:
        return ""
    mode, ic = capacity.MODES[spec.capacity], spec.instance_capacity
    where = f" {spec.reservation}" if spec.reservation else ""
    placement = (
        "compact placement policy"
        if spec.placement == "compact"
        else "no placement policy"
        if ic.placement_policy
        else "no placement policy (the capacity places the VMs densely itself)"
    )
    mt = catalog.MACHINE_TYPES[spec.machine_type]
    discounted = capacity.flex_start_discounted(mt)  # G2: no Flex-start discount

    def rate(mode: str) -> str:
        usd = spec.price.hourly(mode == "spot") if spec.price else None
        below = mode == "flex-start" and discounted and usd is not None  # "<= unknown" says nothing
        return f"{mode} {'<= ' if below else ''}{money(usd)}"

    per_mode = ", ".join(rate(m) for m in capacity.offered(mt))
    return (
        f"Capacity: {spec.capacity}{where} (provisioningModel {ic.provisioning_model}, "
        f"{mode.quota}); {placement}; {mode.billing}. $/h per node by the capacity "
        f"{spec.machine_type} is offered in: {per_mode}." + ladder_note(spec) + wait_note(spec)
    )


def ladder_note(spec: ClusterSpec) -> str:
    """A capacity list: the modes in order with their $/h per node, and the worst case at the
    dearest of them (price x nodes x TTL). Pure."""
    if not spec.capacity_ladder:
        return ""

    def hourly(mode: str) -> float | None:  # flex-start and reservation at most on-demand
        return spec.price.hourly(mode == "spot") if spec.price else None

    rungs = [hourly(m) for m in spec.capacity_ladder]
    known = [p for p in rungs if p is not None]
    worst = (
        max(known) * spec.nodes * spec.max_run_duration_s / 3600
        if len(known) == len(rungs)
        else None
    )
    steps = " -> ".join(f"{m} {money(p)}" for m, p in zip(spec.capacity_ladder, rungs, strict=True))
    return (
        f" Capacity list: {steps} per node/h, the next tried only after the previous one's "
        f"stock-outs in every zone; worst case at the dearest: {money(worst)}."
    )


def wait_note(spec: ClusterSpec) -> str:
    """waitForCapacity: how long `up` and a spot recovery retry stock-outs. Pure."""
    if not spec.wait_for_capacity_s:
        return ""
    return (
        f" Stock-outs everywhere are retried for up to {format_duration(spec.wait_for_capacity_s)}"
        " (waitForCapacity), with backoff; nothing bills while `up` waits."
    )


def fabric_note(spec: ClusterSpec) -> str:
    """What gputrain declares and sets up for multi-node bandwidth (warnings say what is missing)."""
    fabric = spec.fabric
    if spec.on_vertex or fabric is None or not fabric.enabled:
        return ""
    published = FABRICS[spec.machine_type]
    image = (
        f" Node image: {spec.image_project}/{spec.image_family} ({RDMA_IMAGE_WHY})."
        if (spec.image_project, spec.image_family) == RDMA_IMAGE
        else ""
    )
    return (
        f"GPU network: {fabric.note}. The stack creates {fabric.networks_needed} VPCs and "
        f"{fabric.subnetworks_needed} subnets from {fabric.subnet_range} (NETWORKS/SUBNETWORKS "
        f"quota); `verify --fabric` measures {published.collective} up to "
        f"{published.published_bytes // 2**30} GiB and requires >= {published.busbw_floor_gbs:g} "
        "GB/s bus bandwidth "
        f"(half of the published {published.published_busbw_gbs:g}: {published.published_source})."
        + image
    )
