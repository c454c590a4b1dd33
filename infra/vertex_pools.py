"""Vertex AI worker pools beyond "one shape, N replicas": the chief's own shape, a Reduction
Server pool (worker pool 2), each pool priced (a user's CustomJobSpec file too: its checks are in
infra/vertex_jobspec.py).

Pure: no I/O (the controller reads and writes the files). Sources, read while building this:
- Vertex "Distributed training" (docs.cloud.google.com/vertex-ai/docs/training/
  distributed-training): pool 0 the primary (replicaCount 1), 1 workers, 2 parameter servers or
  Reduction Server, 3 evaluators; the reductionserver image URIs; reducers use no GPUs;
  n1-highcpu-16 recommended, "a general purpose N1/N2 VM with at least 16 vCPU" (32 Gbps);
  the reducers' total bandwidth should match the GPU workers'; prerequisites (GPU workers, NCCL
  all-reduce, prebuilt PyTorch >= 1.4 or a custom container with `google-reduction-server`).
- GoogleCloudPlatform/vertex-ai-samples reduction_server notebook: NCCL_DEBUG=INFO on the
  training pools, n1-highcpu-16 reducers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra import catalog, vertex
from infra.base.errors import UserError
from infra.offers import ZonePrice, price_table

#: Google's Reduction Server image, one per multi-region (the docs list these three).
REDUCTION_SERVER_IMAGE = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
DEFAULT_REDUCER_MACHINE = "n1-highcpu-16"  # the docs' recommendation
REDUCER_GBPS = 32  # n1-highcpu-16's egress bandwidth (the docs' worked example)
#: What the training pools get with a Reduction Server: Google's sample sets NCCL_DEBUG=INFO, so
#: the replicas' logs say whether NCCL loaded the reduction-server plugin.
REDUCTION_SERVER_ENV = {"NCCL_DEBUG": "INFO"}
_REDUCER_RE = re.compile(r"(n1|n2)-(standard|highcpu|highmem)-([0-9]+)")
#: The least upper bound on `reductionServer.replicas`: Vertex documents no limit, so as many as
#: `nodes` may be (offers.MAX_NODES), or more where the bandwidth rule asks for more.
MIN_MAX_REDUCERS = 64
POOL_ROLES = ("chief", "workers", "parameter servers", "evaluators")  # pool 2: or reducers


def reduction_server_image(region: str) -> str:
    """The image in the multi-region nearest the job (the docs: it "might reduce latency")."""
    area = "europe" if region.startswith("europe") else "asia" if region.startswith("asia") else ""
    return REDUCTION_SERVER_IMAGE.replace("us-", f"{area}-", 1) if area else REDUCTION_SERVER_IMAGE


def is_reduction_server_image(uri: str) -> bool:
    return bool(re.fullmatch(r"(us|europe|asia)-docker\.pkg\.dev/vertex-ai-restricted/"
                             r"training/reductionserver(:[\w.-]+|@sha256:[0-9a-f]{64})?", uri))  # fmt: skip


# --------------------------------------------------------------------------------------------
# Stack keys: reductionServer and chief
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolShape:
    """One worker pool's machines: what Vertex bills for."""

    machine_type: str
    accelerator: str | None  # catalog name (N1: attached); None for CPU-only
    gpus: int  # per replica
    replicas: int
    reducers: bool = False  # pool 2 running Google's Reduction Server image

    def role(self, index: int) -> str:
        """What pool `index` of this shape is: chief, workers, reduction server, ..."""
        return "reduction server" if self.reducers else POOL_ROLES[index]


@dataclass(frozen=True)
class ReductionServer:
    replicas: int
    machine_type: str = DEFAULT_REDUCER_MACHINE

    def shape(self) -> PoolShape:
        return PoolShape(self.machine_type, None, 0, self.replicas, reducers=True)


@dataclass(frozen=True)
class Chief:
    """`chief`: pool 0's own machine (the workers keep the stack's)."""

    machine_type: str
    gpu_type: str | None  # as written; None = implied by the machine type
    gpu_count: int


def _map(
    value: Mapping[str, Any] | None, key: str, allowed: tuple[str, ...]
) -> Mapping[str, Any] | None:
    """A map-valued stack key (its shape checked by infra/schema.py); None when unset."""
    if value is None:
        return None
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise UserError(
            f"gputrain:{key}.{unknown[0]}: not a setting; allowed: {', '.join(allowed)}"
        )
    return value


def reducer_problem(
    machine_type: str, gpus: int = 0, words: vertex.ShapeWords = vertex.STACK_WORDS
) -> str | None:
    """Why this cannot be a Reduction Server node (one line, the settings as `words` writes
    them), or None."""
    m = _REDUCER_RE.fullmatch(machine_type)
    if gpus:
        return (
            f"{words.said(words.gpu_count, gpus)}: Reduction Server nodes use no GPUs; allowed: 0"
        )
    if m is None or int(m[3]) < 16:
        return (
            f"{words.said(words.machine_type, machine_type)}: allowed for Reduction Server: a "
            f"general-purpose N1/N2 type with 16+ vCPUs, e.g. {DEFAULT_REDUCER_MACHINE} "
            "(Google's recommendation)"
        )
    return None


def default_reducers(workers: int, worker_gbps: int | None) -> int:
    """The docs' rule: the reducers' total egress matches the GPU nodes'
    (8 x 100 Gbps / 32 Gbps = 25); a node of unknown bandwidth counts as one reducer."""
    if not worker_gbps:
        return workers
    return math.ceil(workers * worker_gbps / REDUCER_GBPS)


def reducer_bound(nodes: int, machine_type: str) -> tuple[int, str]:
    """(the most reducers, what is allowed in words) beside `nodes` GPU nodes of this machine
    type: `reductionServer.replicas` and a job file's Reduction Server pool alike."""
    mt = catalog.machine_type(machine_type)
    default = default_reducers(nodes, mt.max_gbps if mt else None)
    most = max(default, MIN_MAX_REDUCERS)
    return most, (
        f"1 to {most} reducer nodes (default {default}: their bandwidth matching the GPU "
        "nodes'; more cannot speed up all-reduce, only add to the bill)"
    )


def parse_reduction_server(
    raw: Mapping[str, Any] | None, *, nodes: int, machine_type: str
) -> ReductionServer | None:
    """`reductionServer: {replicas: N, machineType: M}` (both optional: `{}` takes the
    defaults); refuses, in one line, a job it cannot speed up: fewer than 2 GPU nodes."""
    value = _map(raw, "reductionServer", ("replicas", "machineType"))
    if value is None:
        return None
    mt = catalog.machine_type(machine_type)
    most, allowed = reducer_bound(nodes, machine_type)
    replicas = value.get("replicas", default_reducers(nodes, mt.max_gbps if mt else None))
    if isinstance(replicas, str) and re.fullmatch(r"-?[0-9]+", replicas.strip()):
        replicas = int(replicas)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= most:
        raise UserError(f"gputrain:reductionServer.replicas = {replicas!r}: allowed: {allowed}")
    machine = str(value.get("machineType") or DEFAULT_REDUCER_MACHINE)
    problem = reducer_problem(machine)
    if problem:
        raise UserError(f"gputrain:reductionServer.{problem}")
    if nodes < 2:
        raise UserError(
            f"gputrain:reductionServer: the job has {nodes} node; Reduction Server only speeds up "
            "NCCL all-reduce between 2 or more GPU nodes (remove it, or set nodes >= 2)"
        )
    return ReductionServer(replicas, machine)


def parse_chief(raw: Mapping[str, Any] | None, *, spot: bool) -> Chief | None:
    """`chief: {machineType: M, gpuType: T, gpuCount: N}`: pool 0's own shape."""
    value = _map(raw, "chief", ("machineType", "gpuType", "gpuCount"))
    if value is None:
        return None
    machine = str(value.get("machineType") or "")
    if not machine:
        raise UserError("gputrain:chief.machineType is empty: allowed: a machine type Vertex runs")
    gpu_type = str(value["gpuType"]) if value.get("gpuType") else None
    count = value.get("gpuCount", 0)
    if isinstance(count, str) and re.fullmatch(r"[0-9]+", count.strip()):
        count = int(count)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise UserError(f"gputrain:chief.gpuCount = {count!r}: allowed: 0 (implied) or a count")
    if gpu_type and not count:
        count = 1
    problem = vertex.vertex_problem(machine, gpu_type, count, spot=spot)
    if problem:
        raise UserError(f"gputrain:chief.{problem}")
    return Chief(machine, gpu_type, count)


def stack_pool_shapes(
    machine_type: str,
    accelerator: str,
    gpus: int,
    nodes: int,
    chief: Chief | None,
    reduction_server: ReductionServer | None,
) -> list[tuple[int, PoolShape]]:
    """The pools the stack keys describe: the chief (its own machine with `chief`), the other
    nodes - 1 workers, the reducers."""
    workers = PoolShape(machine_type, accelerator, gpus, nodes - 1)
    first = PoolShape(machine_type, accelerator, gpus, 1)
    if chief is not None:
        mt = catalog.machine_type(chief.machine_type)
        assert mt is not None  # parse_chief checked it
        gpu = mt.accelerator or catalog.canonical_accelerator(chief.gpu_type or "")
        first = PoolShape(mt.name, gpu, mt.gpus or chief.gpu_count, 1)
    pools = [(0, first)] + ([(1, workers)] if nodes > 1 else [])
    if reduction_server is not None:
        pools.append((2, reduction_server.shape()))
    return pools


def describe_shapes(shapes: list[tuple[int, PoolShape]]) -> str:
    """`1 x a2-highgpu-1g (chief) + 3 x a2-highgpu-8g (workers) + 4 x n1-highcpu-16 (reduction
    server)`: what the spending caps name."""
    return " + ".join(f"{s.replicas} x {s.machine_type} ({s.role(i)})" for i, s in shapes)


# --------------------------------------------------------------------------------------------
# Prices, pool by pool
# --------------------------------------------------------------------------------------------


def pool_price(shape: PoolShape, region: str) -> ZonePrice | None:
    """One replica of the pool in `region`, with Vertex's training premium; None when the price
    data does not list it there."""
    mt = catalog.machine_type(shape.machine_type)
    if mt is None:
        return None
    if mt.accelerator or (shape.accelerator and shape.gpus):
        gpu = None if mt.accelerator else shape.accelerator
        return vertex.vertex_price(mt.name, gpu, shape.gpus if gpu else 0, region)
    table = price_table()
    rows = [p for z in table.zones(mt.name) if catalog.region_of(z) == region
            if (p := table.get(mt.name, z)) is not None]  # fmt: skip
    if not rows:
        return None
    factor = 1 + vertex.TRAINING_SURCHARGE
    on_demand = min((p.on_demand for p in rows if p.on_demand is not None), default=None)
    spot = min((p.spot for p in rows if p.spot is not None), default=None)
    return ZonePrice(
        None if on_demand is None else round(on_demand * factor, 4),
        None if spot is None else round(spot * factor, 4),
        vertex.SURCHARGE_BASIS,
    )


@dataclass(frozen=True)
class PricedPool:
    index: int
    shape: PoolShape
    hourly: float | None  # all replicas of the pool, USD/h; None: unknown
    unpriced: str = ""  # with hourly None: why, for plan's row


def price_pools(
    shapes: list[tuple[int, PoolShape]], region: str, *, spot: bool
) -> list[PricedPool]:
    out = []
    for index, shape in shapes:
        price = pool_price(shape, region)
        each = price.hourly(spot) if price else None
        hourly = None if each is None else each * shape.replicas
        why = "" if hourly is not None else _unpriced(shape, region, spot)
        out.append(PricedPool(index, shape, hourly, why))
    return out


def _unpriced(shape: PoolShape, region: str, spot: bool) -> str:
    """What the price data lacks for this pool: the machine type (infra/prices.csv lists GPU
    machines and the N1 hosts; no N2), or its price in the region or capacity."""
    if not price_table().zones(shape.machine_type):
        return "not in the price data (infra/prices.csv)"
    return f"no {'Spot' if spot else 'on-demand'} price in {region}"


def pool_rows(priced: list[PricedPool]) -> list[list[str]]:
    """`plan`'s table: one row per pool, then the total."""
    rows = []
    for p in priced:
        s = p.shape
        gpus = f"{s.gpus} x {s.accelerator}" if s.accelerator and s.gpus else "-"
        cost = f"unknown: {p.unpriced}" if p.hourly is None else f"${p.hourly:,.2f}/h"
        rows.append([str(p.index), s.role(p.index), s.machine_type, gpus, str(s.replicas), cost])
    known = [p.hourly for p in priced]
    total = "unknown" if None in known else f"${sum(h for h in known if h is not None):,.2f}/h"
    rows.append(["", "total", "", "", str(sum(p.shape.replicas for p in priced)), total])
    return rows


POOL_HEADERS = ["pool", "role", "machine", "GPUs per replica", "replicas", "price"]


def total_hourly(priced: list[PricedPool]) -> float | None:
    known = [p.hourly for p in priced]
    return None if None in known else sum(h for h in known if h is not None)


def env_names(job_spec: Mapping[str, Any]) -> list[str]:
    """Every env name the pools set (what `plan` may show: never a value)."""
    names: set[str] = set()
    for pool in job_spec.get("workerPoolSpecs") or []:
        for spec in (pool or {}).get("containerSpec"), (pool or {}).get("pythonPackageSpec"):
            names.update(e.get("name", "") for e in (spec or {}).get("env") or [])
    return sorted(n for n in names if n)
