"""Rows for what `plan` and `gputrain gpus` print about GPU offers: pure, no I/O, no rendering.

The candidate table reads like SkyPilot's optimizer output; the listing like `sky show-gpus`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from infra import catalog
from infra.offers import (
    GPU_MODELS,
    MODEL_OF,
    UNKNOWN,
    Candidate,
    GpuRequestError,
    PriceTable,
    mode_name,
    parse_alternative,
    price_table,
    region_of,
    shapes,
)

CANDIDATE_HEADERS = (
    "#",
    "machine type x nodes",
    "zone",
    "GPUs",
    "$/h",
    "worst case",
    "preflight",
    "chosen",
)
LISTING_HEADERS = ("GPU", "memory", "per VM", "machine types", "cheapest zone", "$/h per GPU")
MAX_ROWS = 10
CHOSEN = "✔"


def money(value: float | None) -> str:
    """Dollars with cents, or "unknown" (never $0.00 for a price we do not have)."""
    return UNKNOWN if value is None else f"${value:,.2f}"


# --------------------------------------------------------------------------------------------
# `plan`: the ranked candidates
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """A preflight verdict on one candidate: usable, or the reason it is not."""

    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class CandidateTable:
    """The rows to print, the candidate chosen (None if none passed) and how many rows are hidden."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    chosen: Candidate | None
    hidden: int

    @property
    def footer(self) -> str:
        return f"… {self.hidden} more" if self.hidden else ""


def choose(candidates: Sequence[Candidate], checks: Mapping[Candidate, Check]) -> Candidate | None:
    """The best-ranked candidate that passed preflight; the first one when nothing was checked."""
    if not checks:
        return candidates[0] if candidates else None
    return next((c for c in candidates if c in checks and checks[c].ok), None)


def candidate_table(
    candidates: Sequence[Candidate],
    max_run_s: int,
    checks: Mapping[Candidate, Check] | None = None,
    limit: int = MAX_ROWS,
    price_factor: float = 1.0,
) -> CandidateTable:
    """At most `limit` rows in rank order; the chosen row is always shown and marked. Prices are
    Compute Engine's times `price_factor` (Vertex AI's training premium, as in the headline)."""

    def scaled(value: float | None) -> float | None:
        return None if value is None else value * price_factor

    checks = checks or {}
    chosen = choose(candidates, checks)
    ranked = list(enumerate(candidates, 1))
    shown = ranked[:limit]
    if chosen is not None and chosen not in candidates[:limit]:
        shown = [*ranked[: limit - 1], (candidates.index(chosen) + 1, chosen)]
    rows = []
    for rank, c in shown:
        check = checks.get(c)
        verdict = "" if check is None else ("ok" if check.ok else check.reason or "failed")
        rows.append(
            (
                str(rank),
                f"{c.machine_type} x {c.nodes}",
                c.zone,
                f"{c.total_gpus} x {c.shape.model} ({c.shape.memory_gb} GB)",
                money(scaled(c.hourly)),
                money(scaled(c.worst_case(max_run_s))),
                verdict,
                CHOSEN if c == chosen else "",
            )
        )
    return CandidateTable(CANDIDATE_HEADERS, tuple(rows), chosen, len(candidates) - len(shown))


# --------------------------------------------------------------------------------------------
# `gputrain gpus [MODEL|MEMORY+] [--spot] [--region R]`
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuOffering:
    """One GPU model as sold in a capacity mode: its shapes and its cheapest zone per GPU."""

    model: str
    memory_gb: int
    counts: tuple[int, ...]  # GPUs per VM
    machine_types: tuple[str, ...]
    zone: str | None
    hourly_per_gpu: float | None
    sold: bool  # False: no shape of it is sold in this mode (e.g. H200 on demand)
    zones: int = 0  # the zones that sell it in this mode (where no price is known, what is said)


def compact_names(names: Sequence[str]) -> str:
    """ "a3-highgpu-1g, a3-highgpu-8g" -> "a3-highgpu-{1g,8g}"; order kept, groups by prefix."""
    groups: dict[str, list[str]] = {}
    for name in names:
        prefix, _, last = name.rpartition("-")
        groups.setdefault(prefix, []).append(last)
    return ", ".join(
        f"{p}-{tails[0]}" if len(tails) == 1 else f"{p}-{{{','.join(tails)}}}"
        for p, tails in groups.items()
    )


def gpu_offerings(
    what: str | None = None,
    *,
    spot: bool = False,
    region: str | None = None,
    table: PriceTable | None = None,
) -> list[GpuOffering]:
    """What the catalog offers, one entry per GPU model, smallest memory first.

    `what` is a MODEL or MEMORY+ (COUNT optional and ignored); `region` limits the zones.
    """
    table = table or price_table()
    accelerators = set(GPU_MODELS.values())
    if what is not None:
        accelerators &= parse_alternative(what, key="gpus", need_count=False).accelerators
    regions = {region_of(z) for item in table.items.values() for z in item}
    if region is not None and region not in regions:
        raise GpuRequestError(
            f"--region = {region!r}: no GPU offered there; regions: {', '.join(sorted(regions))}"
        )
    out = []
    for acc in sorted(accelerators, key=lambda a: (catalog.ACCELERATORS[a].memory_gb, a)):
        offered = [s for s in shapes() if s.accelerator == acc]
        sold = sorted((s for s in offered if mode_name(spot) in s.modes()), key=lambda s: s.gpus)
        listed = sold or offered
        zones = {
            (shape, zone)
            for shape in listed
            for zone in shape.zones(table)
            if region is None or region_of(zone) == region
        }
        if not zones:
            continue
        per_gpu = [
            (hourly / shape.gpus, zone)
            for shape, zone in zones
            if shape in sold
            and (price := shape.price(table, zone)) is not None
            and (hourly := price.hourly(spot)) is not None
        ]
        best = min(per_gpu) if per_gpu else None
        selling = {zone for shape, zone in zones if shape in sold}
        out.append(
            GpuOffering(
                model=MODEL_OF[acc],
                memory_gb=catalog.ACCELERATORS[acc].memory_gb,
                counts=tuple(sorted({s.gpus for s in listed})),
                machine_types=tuple(dict.fromkeys(s.machine_type for s in listed)),
                zone=best[1] if best else None,
                hourly_per_gpu=best[0] if best else None,
                sold=bool(sold),
                zones=len(selling),
            )
        )
    return out


def listing_rows(offerings: Sequence[GpuOffering], spot: bool) -> list[tuple[str, ...]]:
    """Rows under LISTING_HEADERS; a model not sold in this mode says so instead of a price."""
    rows: list[tuple[str, ...]] = []
    for o in offerings:
        if not o.sold:
            zone, price = "-", "Spot only" if not spot else "not orderable"
        elif o.zone is None:  # sold, but the price table has no price for it anywhere
            zone, price = f"{o.zones} zone(s)", "unknown"
        else:
            zone, price = o.zone, money(o.hourly_per_gpu)
        rows.append(
            (
                o.model,
                f"{o.memory_gb} GB",
                ", ".join(map(str, o.counts)),
                compact_names(o.machine_types),
                zone,
                price,
            )
        )
    return rows
