"""Where and on what a stack runs: `gpus` resolved to ranked candidates, or `machineType` + `nodes`
as the user wrote them, with the rules of zones and GPUs against the machine. Pure (the catalog
and infra/prices.csv); infra/spec.py builds on it.

With `gpus`, `machineType` and `nodes` are outputs: the chosen candidate is the cheapest one
(infra/offers.py ranks), unless `up`'s failover pinned another one with `candidate` and `zone`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infra import capacity, catalog, offers, vertex
from infra.keys import CHECK, in_range
from infra.offers import Candidate, GpuRequestError, candidate_label
from infra.schema import (
    DEFAULTS,
    SpecError,
    StackSettings,
    config_string,
    first_repeat,
    names_nothing,
)

MACHINE_TYPE_ZONES = ("us-central1-a", "us-central1-b", "us-central1-c")
_CANDIDATE_RE = re.compile(r"^([a-z0-9-]+) x ([0-9]+)$")
_REGION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")


@dataclass(frozen=True)
class Placement:
    """The machine shape, node count and zones of a stack, however they were asked for."""

    machine_type: catalog.MachineType
    accelerator: str
    gpus_per_node: int
    attach: bool  # N1: the GPUs are attached
    nodes: int
    zones: tuple[str, ...]  # machineType: the user's list; gpus: the chosen shape's in its region
    zone: str
    request: str = ""  # the `gpus` request as written; "" on a machineType stack
    candidates: tuple[Candidate, ...] = ()  # gpus: every candidate, best first

    @property
    def shape(self) -> tuple[catalog.MachineType, str, int, bool, int]:
        """(machine type, accelerator, GPUs per node, attached, nodes)."""
        return self.machine_type, self.accelerator, self.gpus_per_node, self.attach, self.nodes


def place(
    cfg: StackSettings, *, spot: bool, backend: str, modes: tuple[str, ...] = ()
) -> Placement:
    """The placement the stack asks for; one-line SpecError naming the key when it cannot be.
    `modes`: every capacity mode the stack may use (a capacity list's rungs), which a `gpus`
    candidate's machine type must be offered in."""
    machine = cfg.machineType
    request = config_string(cfg.gpus)
    if machine:
        if not names_nothing(cfg.gpus) and request != DEFAULTS["gpus"]:
            raise CHECK.fail(
                "gpus",
                request,
                f"set either gpus or machineType (+ nodes), not both (machineType = {machine!r})",
            )
        return _by_machine_type(cfg, machine, spot)
    return _by_request(cfg, spot=spot, backend=backend, modes=modes)


def _by_machine_type(cfg: StackSettings, name: str, spot: bool) -> Placement:
    for key in ("regions", "candidate"):
        if getattr(cfg, key):
            raise CHECK.fail(
                key,
                config_string(getattr(cfg, key)),
                "allowed only with gpus; with machineType use zones",
            )
    zones, zone = _zones_of(cfg, MACHINE_TYPE_ZONES)
    mt = catalog.machine_type(name)
    if mt is None:
        near = catalog.nearest_machine_types(name)
        hint = f"nearest: {', '.join(near)}" if near else "see infra/catalog.py for the list"
        raise CHECK.fail("machineType", name, f"not a known machine type; {hint}")
    if not mt.orderable:
        raise CHECK.fail(
            "machineType", name, "A3 Edge is a serving product, not orderable for training"
        )
    accelerator, gpus, attach = _gpus_of(cfg, mt)
    nodes = in_range(cfg, "nodes") if cfg.nodes else 1  # 0: unset
    return Placement(mt, accelerator, gpus, attach, nodes, zones, zone)


def _by_request(
    cfg: StackSettings, *, spot: bool, backend: str, modes: tuple[str, ...]
) -> Placement:
    raw = config_string(cfg.gpus)
    if not raw:
        raise CHECK.fail(
            "gpus", "", "set gpus (e.g. L4:1, H100:16, 40GB+:8) or machineType (+ nodes)"
        )
    for key in ("nodes", "gpuType", "gpuCount"):
        if getattr(cfg, key):
            raise CHECK.fail(
                "gpus",
                raw,
                f"gpus decides the machine type and node count: remove gputrain:{key} "
                f"(= {str(getattr(cfg, key))!r}), or use machineType instead of gpus",
            )
    zones = list(cfg.zones)
    for z in zones:
        if not catalog.ZONE_NAME.match(z):
            raise CHECK.fail("zones", z, "allowed: zone names like us-central1-a")
    regions = list(cfg.regions)
    for r in regions:
        if not _REGION_RE.match(r):
            raise CHECK.fail("regions", r, "allowed: region names like us-central1")
    _each_once("zones", cfg.zones)
    _each_once("regions", cfg.regions)
    if zones and regions and not any(catalog.region_of(z) in regions for z in zones):
        raise CHECK.fail(  # a zone must be in both: else every GPU would be blamed
            "regions",
            config_string(cfg.regions),
            f"none of gputrain:zones ({', '.join(zones)}) is in these regions; allowed: regions "
            "that hold a listed zone, or leave zones or regions empty",
        )
    try:
        ranked = offers.resolve(
            offers.parse_request(cfg.gpus),
            spot=spot,
            zones=zones,
            regions=regions,
        )
    except GpuRequestError as e:
        raise SpecError(str(e)) from None
    ranked = _in_every_mode(raw, ranked, modes)
    if backend == "vertex":  # Vertex AI runs what its own machine list allows, per region
        ranked = [c for c in ranked if _vertex_ok(c, spot)] or _no_vertex(raw, ranked)
        ranked.sort(key=_outside_vertex_regions)  # stable: the ranking within each part stays
    pinned = _pinned(cfg, ranked)
    chosen = pinned[0]
    mt = catalog.MACHINE_TYPES[chosen.machine_type]
    return Placement(
        machine_type=mt,
        accelerator=chosen.shape.accelerator,
        gpus_per_node=chosen.gpus_per_node,
        attach=chosen.shape.attached,
        nodes=chosen.nodes,
        zones=tuple(c.zone for c in ranked if _same_shape(c, chosen) and c.region == chosen.region),
        zone=chosen.zone,
        request=raw,
        candidates=tuple(ranked),
    )


def _pinned(cfg: StackSettings, ranked: list[Candidate]) -> list[Candidate]:
    """The candidates left once `candidate` and `zone` (written by `up`'s failover) apply."""
    out = ranked
    label = cfg.candidate
    if label:
        out = [c for c in out if candidate_label(c) == label]
        if not _CANDIDATE_RE.match(label) or not out:
            allowed = ", ".join(dict.fromkeys(candidate_label(c) for c in ranked))
            raise CHECK.fail("candidate", label, f"allowed: empty or one of {allowed}")
    zone = cfg.zone
    if zone:
        in_zone = [c for c in out if c.zone == zone]
        if not in_zone:
            allowed = ", ".join(dict.fromkeys(c.zone for c in out))
            raise CHECK.fail("zone", zone, f"allowed: empty or a candidate's zone ({allowed})")
        out = in_zone
    return out


def _same_shape(a: Candidate, b: Candidate) -> bool:
    return (a.machine_type, a.nodes, a.shape) == (b.machine_type, b.nodes, b.shape)


def _vertex_ok(c: Candidate, spot: bool) -> bool:
    gpu = c.shape.accelerator if c.shape.attached else None
    return (
        vertex.vertex_problem(c.machine_type, gpu, c.gpus_per_node if gpu else 0, spot=spot) is None
    )


def _in_every_mode(raw: str, ranked: list[Candidate], modes: tuple[str, ...]) -> list[Candidate]:
    """The candidates whose machine type is offered in every one of `modes`, best first (so
    [T4:1, L4:1] with capacity [spot, flex-start] is L4: N1 has no Flex-start); when there are
    none, one line naming each GPU and the mode it is not sold as."""
    fit = [c for c in ranked if set(modes) <= set(_offered(c.machine_type))]
    if fit or not ranked:
        return fit
    reasons = []
    for gpu in dict.fromkeys(c.shape.accelerator for c in ranked):
        types = sorted({c.machine_type for c in ranked if c.shape.accelerator == gpu})
        sold = [m for m in capacity.CAPACITIES if any(m in _offered(t) for t in types)]
        lacking = [m for m in modes if m not in sold]
        name = catalog.MODEL_OF.get(gpu, gpu)
        reasons.append(
            f"{name} is not sold as {' or '.join(lacking)} ({', '.join(types)}: "
            f"{', '.join(sold)} only)"
            if lacking
            else f"no one {name} machine type is sold as {' and '.join(modes)}"
        )
    raise CHECK.fail(
        "gpus",
        raw,
        f"{'; '.join(reasons)}; allowed: GPUs sold in every mode of gputrain:capacity "
        f"({', '.join(modes)}), or other modes",
    )


def _offered(machine_type: str) -> tuple[str, ...]:
    return capacity.offered(catalog.MACHINE_TYPES[machine_type])


def _outside_vertex_regions(c: Candidate) -> bool:
    """Whether the candidate's region is not among those known to offer its GPU on Vertex
    (vertex.vertex_regions): such candidates rank after the known ones, as `plan` warns."""
    regions = vertex.vertex_regions(c.shape.accelerator)
    return regions is not None and c.region not in regions


def _no_vertex(raw: str, ranked: list[Candidate]) -> list[Candidate]:
    types = ", ".join(dict.fromkeys(c.machine_type for c in ranked))
    why = f"Vertex AI runs none of its machine types ({types})" if types else "nothing serves it"
    raise CHECK.fail("gpus", raw, f"{why}; use backend gce")


def _zones_of(s: StackSettings, default: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """(the zones in preference order, the zone to use now); `default` when none are listed."""
    listed = list(s.zones) or list(default)
    if not listed:
        raise CHECK.fail(
            "zones", "[]", "allowed: one or more zones of one region, e.g. [us-central1-a]"
        )
    for z in listed:
        if not catalog.ZONE_NAME.match(z):
            raise CHECK.fail("zones", z, "allowed: zone names like us-central1-a")
    regions = sorted({catalog.region_of(z) for z in listed})
    if len(regions) > 1:
        raise CHECK.fail(
            "zones", ",".join(listed), f"all zones must be in one region, got {', '.join(regions)}"
        )
    _each_once("zones", s.zones)
    zone = s.zone or listed[0]
    if zone not in listed:
        raise CHECK.fail("zone", zone, f"allowed: one of zones ({', '.join(listed)}) or empty")
    return tuple(listed), zone


def _each_once(key: str, listed: list[str]) -> None:
    """A zone or region listed twice is one line, with gpus as with machineType: a second
    mention adds nothing, so it likely stands where another was meant."""
    twice = first_repeat(listed)
    if twice is not None:
        raise CHECK.fail(
            key, config_string(listed), f"{twice} is listed twice; list each {key[:-1]} once"
        )


def _gpus_of(s: StackSettings, mt: catalog.MachineType) -> tuple[str, int, bool]:
    """(accelerator, count, attach) for the machine type, validating gpuType/gpuCount."""
    gpu_type_raw, count = s.gpuType, s.gpuCount
    count_raw = str(count)
    gpu_type = catalog.canonical_accelerator(gpu_type_raw) if gpu_type_raw else None
    if gpu_type_raw and gpu_type is None:
        allowed = (
            f"empty or {catalog.gpu_choices([mt.accelerator])} ({mt.name} brings it)"
            if mt.accelerator
            else f"{catalog.gpu_choices(catalog.N1_GPUS)} ({mt.name} is N1)"
        )
        raise CHECK.fail("gpuType", gpu_type_raw, f"unknown; allowed: {allowed}")
    if mt.accelerator is not None:
        if gpu_type is not None and gpu_type != mt.accelerator:
            raise CHECK.fail(
                "gpuType",
                gpu_type_raw,
                f"{mt.name} brings {mt.accelerator}; leave gpuType empty or set that",
            )
        if count not in (0, mt.gpus):
            raise CHECK.fail(
                "gpuCount",
                count_raw,
                f"{mt.name} has {mt.gpus} x {mt.accelerator}; use 0 (implied) or {mt.gpus}",
            )
        return mt.accelerator, mt.gpus, False
    # N1: the GPU is attached.
    if gpu_type is None:
        raise SpecError(
            f"gputrain:gpuType is empty: {mt.name} needs an attached GPU: {', '.join(catalog.N1_GPUS)}"
        )
    gpu = catalog.N1_GPUS.get(gpu_type)
    if gpu is None:
        raise CHECK.fail(
            "gpuType", gpu_type_raw, f"{mt.name} (N1) can attach: {', '.join(catalog.N1_GPUS)}"
        )
    if count not in gpu.caps:
        raise CHECK.fail(
            "gpuCount", count_raw, f"allowed for {gpu_type}: {', '.join(map(str, gpu.counts))}"
        )
    max_vcpu, max_mem = gpu.caps[count]
    if mt.vcpus > max_vcpu or mt.memory_gb > max_mem:
        raise CHECK.fail(
            "machineType",
            mt.name,
            f"{count} x {gpu_type} allows at most {max_vcpu} vCPUs and {max_mem} GB "
            f"({mt.name} has {mt.vcpus} vCPUs, {mt.memory_gb:g} GB)",
        )
    return gpu_type, count, True
