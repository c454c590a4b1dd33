"""Ask for GPUs, not machine types: `H100:16` -> ranked (machine type, nodes, zone) candidates.

Pure: the catalog and the per-zone prices in infra/prices.csv (read once) decide, no API call,
so the Pulumi program, `plan`, failover and `gputrain gpus` all rank the same way.
"""

from __future__ import annotations

import csv
import difflib
import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from infra import capacity, catalog
from infra.base.errors import UserError
from infra.catalog import region_of

# ---- prices: infra/prices.csv (source and date in its header), parsed once; unknown is None,
# never 0 (a row that says 0 is refused) -------------------------------------------------------
UNKNOWN = "unknown"


@dataclass(frozen=True)
class ZonePrice:
    """USD per hour of one VM of an item in one zone; None = unknown (never 0)."""

    on_demand: float | None
    spot: float | None
    note: str = ""

    def hourly(self, spot: bool) -> float | None:
        return self.spot if spot else self.on_demand


@dataclass(frozen=True)
class PriceTable:
    """Per-zone prices by item (a machine type, or an N1 attachable GPU priced per GPU)."""

    source: str
    as_of: str
    items: Mapping[str, Mapping[str, ZonePrice]]

    @property
    def date(self) -> str:
        """The ISO date of `as_of` (the rest of that line says what the date means)."""
        return self.as_of.split()[0]

    def get(self, item: str, zone: str) -> ZonePrice | None:
        return self.items.get(item, {}).get(zone)

    def zones(self, item: str) -> frozenset[str]:
        return frozenset(self.items.get(item, {}))


def expand_zones(spec: str) -> list[str]:
    """Expand us-central1-a/b/c into us-central1-a, us-central1-b, us-central1-c."""
    region, letters = spec.strip().rsplit("-", 1)
    return [f"{region}-{letter}" for letter in letters.split("/")]


def _figure(text: str, where: str) -> float | None:
    if text == UNKNOWN:
        return None
    value = float(text)
    if value <= 0:
        raise ValueError(f"{where}: price {text!r}; write 'unknown', never 0")
    return value


def parse_prices(text: str) -> PriceTable:
    """The price table in prices.csv's format; ValueError names the line of a bad row."""
    meta: dict[str, str] = {}
    body = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep and key.strip() in ("source", "as_of"):
                meta[key.strip()] = value.strip()
        elif line.strip():
            body.append((number, line))
    items: dict[str, dict[str, ZonePrice]] = {}
    rows = csv.DictReader(line for _, line in body)
    for (number, _), row in zip(body[1:], rows, strict=True):
        where = f"prices.csv line {number}"
        price = ZonePrice(
            _figure(row["on_demand"], where), _figure(row["spot"], where), row["note"] or ""
        )
        for zone in expand_zones(row["zones"]):
            if zone in items.setdefault(row["item"], {}):
                raise ValueError(f"{where}: {row['item']} in {zone} is listed twice")
            items[row["item"]][zone] = price
    if set(meta) != {"source", "as_of"}:
        raise ValueError("prices.csv: the header must state '# source:' and '# as_of:'")
    return PriceTable(meta["source"], meta["as_of"], items)


@functools.cache
def price_table() -> PriceTable:
    """infra/prices.csv, parsed on first use."""
    return parse_prices(resources.files("infra").joinpath("prices.csv").read_text())


Mode = Literal["on-demand", "spot"]
MAX_NODES = 64  # the bound ClusterSpec puts on `nodes`
N1_VCPUS_PER_GPU = 8  # an N1 host gets n1-standard-(8 x GPUs), within every attach cap

GPU_MODELS, MODEL_OF = catalog.GPU_MODELS, catalog.MODEL_OF  # what users type -> GCE type


def capacity_modes(mt: catalog.MachineType) -> frozenset[Mode]:
    """On demand and/or Spot, as Google sells the machine type (one source: infra/capacity.py's
    table; A3 Ultra, A4 and A3 High 1/2/4g are not sold on demand); empty if not orderable."""
    if not mt.orderable:
        return frozenset()
    modes: tuple[Mode, ...] = ("on-demand", "spot")
    return frozenset(m for m in modes if m in capacity.offered(mt))


def mode_name(spot: bool) -> Mode:
    return "spot" if spot else "on-demand"


class GpuRequestError(UserError):
    """A `gpus` request is malformed, or nothing in the allowed zones serves it exactly."""


# --------------------------------------------------------------------------------------------
# Shapes: one VM that carries GPUs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A machine type with built-in GPUs, or an N1 host with `gpus` attached (`attached`)."""

    machine_type: str
    accelerator: str
    gpus: int
    attached: bool = False

    @property
    def model(self) -> str:
        return MODEL_OF[self.accelerator]

    @property
    def memory_gb(self) -> int:
        return catalog.ACCELERATORS[self.accelerator].memory_gb

    def modes(self) -> frozenset[Mode]:
        return capacity_modes(catalog.MACHINE_TYPES[self.machine_type])

    def zones(self, table: PriceTable) -> frozenset[str]:
        zones = table.zones(self.machine_type)
        return zones & table.zones(self.accelerator) if self.attached else zones

    def price(self, table: PriceTable, zone: str) -> ZonePrice | None:
        """One VM in `zone` (an N1 host plus its GPUs); None if not offered there."""
        host = table.get(self.machine_type, zone)
        if not self.attached or host is None:
            return host
        gpu = table.get(self.accelerator, zone)
        if gpu is None:
            return None

        def add(h: float | None, g: float | None) -> float | None:
            return None if h is None or g is None else round(h + self.gpus * g, 5)

        note = "; ".join(n for n in (host.note, gpu.note) if n)
        return ZonePrice(add(host.on_demand, gpu.on_demand), add(host.spot, gpu.spot), note)


def _n1_host(gpu: catalog.AttachableGpu, count: int) -> str:
    """The largest n1-standard with at most 8 vCPUs per GPU that the attach cap allows."""
    max_vcpu, max_mem = gpu.caps[count]
    fits = [
        mt
        for mt in catalog.MACHINE_TYPES.values()
        if mt.name.startswith("n1-standard-")
        and mt.vcpus <= min(N1_VCPUS_PER_GPU * count, max_vcpu)
        and mt.memory_gb <= max_mem
    ]
    return max(fits, key=lambda mt: mt.vcpus).name


@functools.cache
def shapes() -> tuple[Shape, ...]:
    """Every orderable GPU VM shape in the catalog."""
    out = [
        Shape(mt.name, mt.accelerator, mt.gpus)
        for mt in catalog.MACHINE_TYPES.values()
        if mt.accelerator is not None and mt.orderable
    ]
    for acc, gpu in catalog.N1_GPUS.items():
        out += [Shape(_n1_host(gpu, n), acc, n, attached=True) for n in gpu.counts]
    return tuple(out)


def vm_price(
    machine_type: str,
    zone: str,
    accelerator: str | None = None,
    gpus: int = 0,
    table: PriceTable | None = None,
) -> ZonePrice | None:
    """One VM as a spec names it (N1: with `gpus` x `accelerator` attached) in `zone`; None if
    the price data does not list it there. For `plan` when the user sets the machine type."""
    mt = catalog.MACHINE_TYPES[machine_type]
    if mt.accelerator is not None:
        shape = Shape(machine_type, mt.accelerator, mt.gpus)
    elif accelerator is not None and gpus > 0:
        shape = Shape(machine_type, accelerator, gpus, attached=True)
    else:
        raise ValueError(f"{machine_type} carries no GPU; name the attached accelerator and count")
    return shape.price(table or price_table(), zone)


def vm_zones(
    machine_type: str, accelerator: str, table: PriceTable | None = None
) -> frozenset[str]:
    """The zones the price data lists for a VM as a spec names it (N1: with `accelerator`)."""
    mt = catalog.MACHINE_TYPES[machine_type]
    shape = Shape(machine_type, accelerator, mt.gpus or 1, attached=mt.accelerator is None)
    return shape.zones(table or price_table())


# --------------------------------------------------------------------------------------------
# The request: MODEL:COUNT | MEMORY+:COUNT, or a list of them ("any of these")
# --------------------------------------------------------------------------------------------

_MEMORY_RE = re.compile(r"^([0-9]+)\s*GB(\+?)$", re.IGNORECASE)
_FORMS = "MODEL:COUNT or MEMORY+:COUNT (e.g. H100:16, 40GB+:8), or a list of them"
_FILTER_FORMS = "MODEL or MEMORY+ (e.g. H100, 40GB+)"


@dataclass(frozen=True)
class Alternative:
    """One `MODEL:COUNT` or `MEMORY+:COUNT`: COUNT GPUs in total, split into nodes for the user."""

    text: str
    count: int
    model: str | None = None
    min_memory_gb: int | None = None

    @property
    def accelerators(self) -> frozenset[str]:
        if self.model is not None:
            return frozenset({GPU_MODELS[self.model]})
        return frozenset(
            acc
            for acc in GPU_MODELS.values()
            if catalog.ACCELERATORS[acc].memory_gb >= (self.min_memory_gb or 0)
        )

    def describe(self) -> str:
        return self.model or f"GPUs with >= {self.min_memory_gb} GB"


@dataclass(frozen=True)
class GpuRequest:
    """Any of these alternatives; candidates from all of them are ranked together."""

    alternatives: tuple[Alternative, ...]

    @property
    def text(self) -> str:
        return ", ".join(a.text for a in self.alternatives)


def _bad(key: str, value: str, why: str, forms: str = _FORMS) -> GpuRequestError:
    models = ", ".join(GPU_MODELS)
    return GpuRequestError(f"{key} = {value!r}: {why}; allowed: {forms}, MODEL one of {models}")


def parse_alternative(
    text: str, key: str = "gputrain:gpus", need_count: bool = True
) -> Alternative:
    """One `MODEL:COUNT` or `MEMORY+:COUNT`; without `need_count` COUNT may be left out (1)."""
    forms = _FORMS if need_count else _FILTER_FORMS
    what, sep, count_text = (part.strip() for part in text.strip().partition(":"))
    memory = _MEMORY_RE.match(what)
    model = what.upper()
    acc = catalog.canonical_accelerator(what.lower())
    if model not in GPU_MODELS and acc in MODEL_OF:
        model = MODEL_OF[acc]
    if memory and not memory.group(2):
        raise _bad(key, text, f"memory requests end in '+': {memory.group(1)}GB+", forms)
    if not memory and model not in GPU_MODELS:
        near = difflib.get_close_matches(model, GPU_MODELS, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise _bad(key, text, f"unknown GPU model {what!r}{hint}", forms)
    if need_count and not sep:
        raise _bad(key, text, f"missing the GPU count, e.g. {what}:8", forms)
    count = int(count_text) if re.fullmatch(r"[0-9]+", count_text) else 0 if sep else 1
    if count < 1:
        raise _bad(key, text, "COUNT must be a whole number >= 1 (the GPUs in total)", forms)
    if memory:
        return Alternative(text.strip(), count, min_memory_gb=int(memory.group(1)))
    return Alternative(text.strip(), count, model=model)


def parse_request(value: str | Sequence[str], key: str = "gputrain:gpus") -> GpuRequest:
    """A `gpus` setting: one alternative, a comma-separated string, or a list of them."""
    items = value.split(",") if isinstance(value, str) else list(value)
    written = value if isinstance(value, str) else json.dumps(items)
    if not any(i.strip() for i in items):
        raise _bad(key, written, "empty")
    if not all(i.strip() for i in items):  # never dropped: the list would mean less than written
        raise _bad(key, written, "an empty entry")
    return GpuRequest(tuple(parse_alternative(i, key) for i in items))


# --------------------------------------------------------------------------------------------
# Resolution: every (shape, nodes, zone) with GPUs per VM x nodes == COUNT, ranked
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """COUNT GPUs as `nodes` x `shape` in `zone`, priced for one capacity mode."""

    shape: Shape
    nodes: int
    zone: str
    spot: bool
    hourly_per_node: float | None  # None: price unknown
    price_note: str = ""

    @property
    def machine_type(self) -> str:
        return self.shape.machine_type

    @property
    def gpus_per_node(self) -> int:
        return self.shape.gpus

    @property
    def total_gpus(self) -> int:
        return self.shape.gpus * self.nodes

    @property
    def region(self) -> str:
        return region_of(self.zone)

    @property
    def hourly(self) -> float | None:
        """USD per hour for all nodes."""
        return None if self.hourly_per_node is None else self.hourly_per_node * self.nodes

    def worst_case(self, max_run_s: int) -> float | None:
        """What the server-side time limit caps the bill at (all nodes for max_run_s)."""
        return None if self.hourly is None else self.hourly * max_run_s / 3600


def rank_key(c: Candidate) -> tuple[int, bool, float, str, str]:
    """Fewest nodes first, then cheapest (unknown prices last), then by name and zone."""
    return (c.nodes, c.hourly is None, c.hourly or 0.0, c.machine_type, c.zone)


def _nearest(works: Sequence[int], count: int) -> str:
    below = [w for w in works if w < count]
    above = [w for w in works if w > count]
    if below and above:
        return f"{below[-1]} or {above[0]}"
    return f"at most {below[-1]}" if below else f"at least {above[0]}"


def _allowed(zone: str, zones: frozenset[str], regions: frozenset[str]) -> bool:
    """`zones` and `regions` both empty allow every zone."""
    return (not zones or zone in zones) and (not regions or region_of(zone) in regions)


def _serve(
    alt: Alternative,
    spot: bool,
    where: tuple[frozenset[str], frozenset[str]],
    max_nodes: int,
    table: PriceTable,
) -> tuple[list[Candidate], str]:
    """The candidates for one alternative, or none and the one-clause reason why."""
    mode = "as Spot" if spot else "on demand"
    offered = [s for s in shapes() if s.accelerator in alt.accelerators]
    sold = [s for s in offered if mode_name(spot) in s.modes()]
    if not offered:
        return [], f"no machine type carries {alt.describe()}"
    if not sold:
        types = ", ".join(sorted({s.machine_type for s in offered}))
        others = list(
            dict.fromkeys(
                c
                for s in offered
                for c in capacity.offered(catalog.MACHINE_TYPES[s.machine_type])
                if c != mode_name(spot)
            )
        )
        return [], (
            f"{alt.describe()} is not sold {mode} ({types}: {', '.join(others)} only); set "
            f"gputrain:capacity to {' or '.join(others)}"
        )
    placed = [(s, sorted(z for z in s.zones(table) if _allowed(z, *where))) for s in sold]
    placed = [(s, zones) for s, zones in placed if zones]
    if not placed:
        regions = sorted({region_of(z) for s in sold for z in s.zones(table)})
        return (
            [],
            f"no allowed zone offers {alt.describe()} {mode}; offered in {', '.join(regions)}",
        )
    out = []
    for shape, zones in placed:
        nodes, rest = divmod(alt.count, shape.gpus)
        if rest or not 1 <= nodes <= max_nodes:
            continue
        for zone in zones:
            price = shape.price(table, zone)
            assert price is not None  # zones() lists only priced zones
            out.append(Candidate(shape, nodes, zone, spot, price.hourly(spot), price.note))
    if not out:
        works = sorted({s.gpus * n for s, _ in placed for n in range(1, max_nodes + 1)})
        return [], (
            f"no machine type x nodes (up to {max_nodes}) gives exactly {alt.count} x "
            f"{alt.describe()} {mode}; nearest counts that work: {_nearest(works, alt.count)}"
        )
    return out, ""


def resolve(
    request: GpuRequest,
    *,
    spot: bool,
    zones: Iterable[str] = (),
    regions: Iterable[str] = (),
    max_nodes: int = MAX_NODES,
    key: str = "gputrain:gpus",
    table: PriceTable | None = None,
) -> list[Candidate]:
    """Every candidate serving the request exactly in the allowed zones, best first.

    `zones` and `regions` both empty: every zone the price data knows. Raises GpuRequestError
    with one line (what, why, the nearest counts that work) when nothing does.
    """
    table = table or price_table()
    where = (frozenset(zones), frozenset(regions))
    found: set[Candidate] = set()  # one alternative may repeat another's (80GB+:8 and H100:8)
    reasons = []
    for alt in request.alternatives:
        candidates, reason = _serve(alt, spot, where, max_nodes, table)
        if reason:
            reasons.append(reason if len(request.alternatives) == 1 else f"{alt.text}: {reason}")
        found.update(candidates)
    if not found:
        raise GpuRequestError(f"{key} = {request.text!r}: {'; '.join(reasons)}")
    return sorted(found, key=rank_key)


def candidate_label(c: Candidate) -> str:
    """How `candidate` names a candidate: "a3-highgpu-8g x 2" (the zone goes in `zone`)."""
    return f"{c.machine_type} x {c.nodes}"
