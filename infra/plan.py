"""`gputrain plan`: what a stack would cost and what is still missing, from the files alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra import pricing, vertex
from infra.fields import covered_addresses
from infra.spec import ClusterSpec, MissingSetting, missing_settings, parse_spec
from infra.spec_warnings import spec_warnings
from infra.stackfile import load_stack_config

HEADERS = (
    "nodes",
    "machine type",
    "GPUs per node",
    "zone",
    "spot",
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
    hourly_per_node: float
    hourly_total: float
    worst_case: float  # price x nodes x TTL: what the TTL caps the bill at
    price_note: str
    bucket_note: str
    warnings: tuple[str, ...]
    missing: tuple[MissingSetting, ...]

    @property
    def title(self) -> str:
        return f"gputrain plan: stack {self.spec.stack}"

    @property
    def ready(self) -> bool:
        return not self.missing

    def footer_lines(self) -> list[str]:
        """What to print under the table: price basis, warnings, then the next steps."""
        lines = [self.price_note, self.bucket_note]
        if not self.spec.on_vertex:
            lines.append(ssh_exposure(self.spec))
        lines += [f"warning: {w}" for w in self.warnings]
        if self.missing:
            lines.append(f"Before `pulumi up --stack {self.spec.stack}`, set:")
            lines += [f"  {m.key}: {m.why}\n    {m.command}" for m in self.missing]
        else:
            lines.append(f"Ready: pulumi up --stack {self.spec.stack}")
        return lines


def ssh_exposure(spec: ClusterSpec) -> str:
    """Who can reach SSH on which nodes: always shown, so a wide range is never a surprise."""
    reached = {"head": "the head node", "all": "every node", "none": "no node"}[spec.public_ip]
    if not spec.ssh_source_ranges:
        return f"SSH exposure: port 22 on {reached}, from nowhere yet (sshSourceRanges is not set)"
    n = covered_addresses(spec.ssh_source_ranges)
    whole = ", the whole IPv4 internet" if n == 2**32 else ""
    return (
        f"SSH exposure: port 22 on {reached} (public IP), from {', '.join(spec.ssh_source_ranges)} "
        f"({n:,} address{'es' if n != 1 else ''}{whole}); nodes reach each other by network tag"
    )


def build_plan(spec: ClusterSpec) -> Plan:
    """Pure: the plan of a validated spec."""
    per_node = spec.hourly_price_per_node
    total = per_node * spec.nodes
    worst = total * spec.max_run_duration_s / 3600
    price = spec.price
    gpus = f"{spec.gpus_per_node} x {spec.gpu_model} ({spec.gpu_memory_gb} GB)"
    row = (
        str(spec.nodes),
        spec.machine_type,
        gpus,
        f"{spec.region} (Vertex AI)" if spec.on_vertex else spec.zone,
        "yes" if spec.spot else "no",
        spec.max_run_duration,
        f"{per_node:.2f}",
        f"{total:.2f}",
        f"{worst:.2f}",
    )
    gpus_total = spec.gpus_per_node * spec.nodes
    quota = (
        f"Vertex AI custom training quota needed in {spec.region}: {gpus_total} x "
        f"{vertex.accelerator_enum(spec.accelerator)} GPUs"
        + (" (Spot jobs: the preemptible quota)" if spec.spot else "")
        if spec.on_vertex
        else f"Quota needed in {spec.region}: {gpus_total} x {spec.gpu_quota_metric}, "
        f"{spec.vcpus * spec.nodes} x {spec.cpu_quota_metric}"
    )
    note = (
        f"Prices: indicative {pricing.PRICE_REGION} USD, {'Spot' if spec.spot else 'on-demand'}, "
        f"{price.describe()}; disks and network extra. {quota}."
    )
    return Plan(
        spec=spec,
        bucket_note=bucket_note(spec),
        row=row,
        hourly_per_node=per_node,
        hourly_total=total,
        worst_case=worst,
        price_note=note,
        warnings=tuple(spec_warnings(spec)),
        missing=tuple(missing_settings(spec)),
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
