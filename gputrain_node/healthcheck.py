"""`python -m gputrain_node.healthcheck` under torchrun: are these GPUs and links as fast as they should be?

Per rank: matmul TFLOP/s and device-memory bandwidth. Across ranks: all-reduce bus bandwidth and
whether a few DDP steps leave identical parameters everywhere. Results are compared with FLOORS,
printed as a table and written to health.json (by local rank 0 of every node). Exit status 1 when a
check FAILs. On CPU (gloo) everything runs but the floors are not applied.

It imports only this package, the standard library and torch: on a Vertex job or beside a user
project with its own `trainer/` package, that name is theirs (tests/test_layers.py holds this).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from gputrain_node.contract import OUT_ENV

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
T = TypeVar("T")


class InputError(Exception):
    """A bad flag: one line on stderr, exit status 2 (as the trainer's and the controller's)."""

    exit_code = 2


@dataclass(frozen=True)
class DistEnv:
    """This rank in torchrun's group (one process alone when WORLD_SIZE is unset or 1)."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    # CPU collectives (gathering figures, barriers) that must not sync the GPU; the default
    # group itself when that is gloo already. None in a single process.
    control: Any = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def writes_files(self) -> bool:
        """Local rank 0 of every node writes, since nodes share no filesystem."""
        return self.local_rank == 0

    @property
    def device_name(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return f"cpu ({socket.gethostname()})"


def pick_device(flag: str, local_rank: int) -> torch.device:
    if flag not in ("auto", "cpu", "cuda"):
        raise InputError(f"--device {flag}: must be auto, cpu or cuda")
    if flag == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is visible to this process")
    if flag == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def setup(device_flag: str, timeout_s: float) -> DistEnv:
    """Join torchrun's group when WORLD_SIZE > 1 (NCCL on GPU with a gloo group beside it, gloo
    on CPU), with an explicit timeout."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_flag, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world == 1:
        return DistEnv(0, 0, 1, device)
    timeout = timedelta(seconds=timeout_s)
    if device.type == "cuda":
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        control = dist.new_group(backend="gloo", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
        control = dist.group.WORLD
    return DistEnv(dist.get_rank(), local_rank, world, device, control)


def teardown(env: DistEnv) -> None:
    """Barrier, then destroy: ending right after the last collective crashed a rank in 7 of 30
    runs."""
    if env.distributed and dist.is_initialized():
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)  # no NCCL kernel still queued
        dist.barrier(group=env.control)
        dist.destroy_process_group()


def all_gather(env: DistEnv, obj: T) -> list[T]:
    """Every rank's `obj` (picklable), in rank order."""
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj, group=env.control)
    return out


@dataclass(frozen=True)
class Floor:
    """(warn below, fail below) per check; units TFLOP/s and GB/s."""

    matmul: tuple[float, float]
    mem_bw: tuple[float, float]
    busbw_intra: tuple[float, float]  # all-reduce inside one node (NVLink/PCIe)


# Derived from the dense peaks and public nccl-tests figures in shared/reference
# torchrun-and-trainer.md (§6.3, §7.1), roughly 60-70 % of peak to warn and 40-50 % to fail:
# estimates, except where a row says measured. Most specific pattern first.
FLOORS: tuple[tuple[str, Floor], ...] = (
    ("H100 PCIe", Floor(matmul=(450, 300), mem_bw=(1500, 1000), busbw_intra=(20, 8))),
    ("H100", Floor(matmul=(600, 400), mem_bw=(2400, 1600), busbw_intra=(300, 150))),
    # matmul and mem_bw measured by this check on a healthy H200 (758.8 TFLOP/s, 4,176 GB/s;
    # docs/developer/benchmarks.md, 2026-11-27): warn below 85 %, fail below 70 % of those.
    # The all-reduce floor stays an estimate (one GPU was lent: no all-reduce measured).
    ("H200", Floor(matmul=(645, 530), mem_bw=(3550, 2920), busbw_intra=(300, 150))),
    ("B200", Floor(matmul=(1300, 900), mem_bw=(5500, 3500), busbw_intra=(500, 250))),
    ("A100", Floor(matmul=(220, 150), mem_bw=(1100, 700), busbw_intra=(150, 75))),
    ("L4", Floor(matmul=(60, 35), mem_bw=(200, 120), busbw_intra=(10, 3))),
    ("T4", Floor(matmul=(20, 10), mem_bw=(200, 120), busbw_intra=(5, 2))),  # fp16
    ("V100", Floor(matmul=(80, 50), mem_bw=(650, 400), busbw_intra=(100, 40))),  # fp16
)
BUSBW_INTER_NODE = (5.0, 1.0)  # GB/s; plain NCCL sockets over gVNIC reach ~12 (100 Gbps)
RELATIVE_MATMUL_FAIL = 0.8  # a GPU below 80 % of its node's median matmul rate fails


def floor_for(device_name: str) -> Floor | None:
    for pattern, floor in FLOORS:
        if pattern in device_name:
            return floor
    return None


@dataclass(frozen=True)
class Check:
    check: str
    rank: int | None  # None for checks across all ranks
    host: str
    device: str
    value: float | None
    unit: str
    warn_below: float | None
    fail_below: float | None
    status: str
    note: str = ""


def judge(value: float, limits: tuple[float, float] | None) -> str:
    if limits is None:
        return PASS
    warn_below, fail_below = limits
    return FAIL if value < fail_below else WARN if value < warn_below else PASS


def timed(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    """Seconds per call of fn, after one untimed call, with the device synced at both ends."""
    fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync(device)
    return (time.perf_counter() - start) / repeat


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_tflops(device: torch.device) -> float:
    """bf16 (fp16 before Ampere) 8192² matmuls on GPU; fp32 512² on CPU."""
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        n, dtype, repeat = 8192, torch.bfloat16 if major >= 8 else torch.float16, 50
    else:
        n, dtype, repeat = 512, torch.float32, 10
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / timed(lambda: torch.mm(a, b), device, repeat) / 1e12


def memory_gbps(device: torch.device) -> float:
    """Copy bandwidth (bytes read + written) of a 1 GiB buffer on GPU, 64 MiB on CPU."""
    nbytes = 2**30 if device.type == "cuda" else 2**26
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    return (
        2 * nbytes / timed(lambda: dst.copy_(src), device, 20 if device.type == "cuda" else 5) / 1e9
    )


COLLECTIVES = ("all_reduce", "all_gather")


def allreduce_busbw(
    env: DistEnv, max_bytes: int, collective: str = "all_reduce"
) -> list[tuple[int, float]]:
    """(bytes, bus GB/s) from 32 KiB up to max_bytes, as nccl-tests define bus bandwidth:
    all_reduce algbw · 2(n−1)/n; all_gather (size = the gathered result) algbw · (n−1)/n."""
    n, size = env.world_size, 32 * 2**10
    results: list[tuple[int, float]] = []
    while size <= max_bytes:
        buf = torch.zeros(size // 4, dtype=torch.float32, device=env.device)  # zeros never overflow
        if collective == "all_gather":
            part = torch.zeros(size // 4 // n, dtype=torch.float32, device=env.device)
            op, factor = partial(dist.all_gather_into_tensor, buf[: part.numel() * n], part), 1
        else:
            op, factor = partial(dist.all_reduce, buf), 2
        calls = max(1, min(50, 2**28 // size))  # back-to-back for small sizes: host overhead
        trials = []
        for _ in range(3):
            dist.barrier(group=env.control)
            trials.append(timed(op, env.device, calls))
        results.append((size, size / statistics.median(trials) * factor * (n - 1) / n / 1e9))
        size *= 8
    return results


def allreduce_is_correct(env: DistEnv) -> bool:
    t = torch.full((1024,), float(env.rank + 1), device=env.device)
    dist.all_reduce(t)
    return bool((t == env.world_size * (env.world_size + 1) / 2).all())


VOCAB = 64


def tiny_model() -> torch.nn.Module:
    """Next-token logits from an embedding and two linear layers: a few parameter tensors for
    DDP to keep equal, nothing a health check needs more."""
    return torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, 64),
        torch.nn.Linear(64, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, VOCAB),
    )


def param_checksum(model: torch.nn.Module) -> str:
    """A bitwise hash of every parameter: equal across ranks iff DDP kept them in sync."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def ddp_checksum(env: DistEnv) -> str:
    """A few DDP steps of a tiny model on rank-specific data: every rank must end bit-identical."""
    torch.manual_seed(0)
    model = tiny_model().to(env.device)
    ids = [env.device.index] if env.device.type == "cuda" else None
    ddp = (
        torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if env.distributed
        else model
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1000 + env.rank)
    for _ in range(3):
        x = torch.randint(0, VOCAB, (8, 33), generator=gen).to(env.device)
        logits = ddp(x[:, :-1])
        torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1)
        ).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    del ddp  # no DDP reducer may outlive the process group (gloo aborted at exit once)
    gc.collect()
    return param_checksum(model)


@dataclass(frozen=True)
class Measured:
    """One rank's own figures."""

    host: str
    device: str
    matmul: float  # TFLOP/s
    mem_bw: float  # GB/s


def judge_ranks(ranks: list[Measured], on_gpu: bool) -> list[Check]:
    """Per-rank checks against FLOORS, plus matmul against its node's median (GPU only)."""
    checks = []
    for rank, r in enumerate(ranks):
        floor = floor_for(r.device) if on_gpu else None
        median = statistics.median(x.matmul for x in ranks if x.host == r.host)
        for name, unit, value, limits in (
            ("matmul", "TFLOP/s", r.matmul, floor.matmul if floor else None),
            ("mem_bw", "GB/s", r.mem_bw, floor.mem_bw if floor else None),
        ):
            status = judge(value, limits)
            note = "no floor for this GPU" if on_gpu and floor is None else ""
            note = note if on_gpu else "cpu: floors not applied"
            if on_gpu and name == "matmul" and value < RELATIVE_MATMUL_FAIL * median:
                status, note = FAIL, f"below 80 % of its node's median {median:.0f}"
            warn, fail = limits if limits else (None, None)
            checks.append(
                Check(name, rank, r.host, r.device, value, unit, warn, fail, status, note)
            )
    return checks


def judge_allreduce(
    sweep: list[tuple[int, float]],
    correct: bool,
    device: str,
    hosts: list[str],
    on_gpu: bool,
    collective: str = "all_reduce",
) -> Check:
    """The best bus bandwidth of the sweep against the intra- or inter-node floor."""
    size, best = max(sweep, key=lambda s: s[1])
    floor = floor_for(device) if on_gpu else None
    limits = BUSBW_INTER_NODE if len(set(hosts)) > 1 else floor.busbw_intra if floor else None
    limits = limits if on_gpu else None
    status = judge(best, limits) if correct else FAIL
    note = f"best at {size / 2**20:g} MiB; " + ", ".join(
        f"{s / 2**20:g} MiB: {b:.2f}" for s, b in sweep
    )
    if not correct:
        note = "all-reduce returned a wrong sum; " + note
    warn, fail = limits if limits else (None, None)
    return Check(
        f"{collective.replace('_', '')}_busbw",
        None,
        ",".join(sorted(set(hosts))),
        device,
        best,
        "GB/s",
        warn,
        fail,
        status,
        note,
    )


def run_checks(env: DistEnv, max_bytes: int, collective: str = "all_reduce") -> list[Check]:
    """Every rank measures; every rank returns the same list of all ranks' checks."""
    host, on_gpu = socket.gethostname(), env.device.type == "cuda"
    mine = Measured(host, env.device_name, matmul_tflops(env.device), memory_gbps(env.device))
    ranks = all_gather(env, mine)
    checks = judge_ranks(ranks, on_gpu)
    if env.world_size > 1:
        correct = allreduce_is_correct(env)
        sweep = allreduce_busbw(env, max_bytes, collective)
        hosts = [r.host for r in ranks]
        checks.append(judge_allreduce(sweep, correct, ranks[0].device, hosts, on_gpu, collective))
    sums = all_gather(env, ddp_checksum(env))
    agree = len(set(sums)) == 1
    checks.append(
        Check(
            "param_checksum",
            None,
            host if env.world_size == 1 else "all",
            mine.device,
            None,
            "",
            None,
            None,
            PASS if agree else FAIL,
            "identical on all ranks" if agree else f"differ: {sums}",
        )
    )
    return checks


def report(checks: list[Check], env: DistEnv, out: Path) -> str:
    overall = (
        FAIL
        if any(c.status == FAIL for c in checks)
        else WARN
        if any(c.status == WARN for c in checks)
        else PASS
    )
    if env.writes_files:
        out.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {
            "overall": overall,
            "world_size": env.world_size,
            "device_type": env.device.type,
            "checks": [asdict(c) for c in checks],
        }
        tmp = out / f"health.json.tmp{os.getpid()}"
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, out / "health.json")
    if env.is_main:
        rows = [("check", "rank", "host", "device", "value", "warn<", "fail<", "status", "note")]
        for c in checks:
            rows.append(
                (
                    c.check,
                    "all" if c.rank is None else str(c.rank),
                    c.host,
                    c.device,
                    "" if c.value is None else f"{c.value:.2f} {c.unit}",
                    fmt(c.warn_below),
                    fmt(c.fail_below),
                    c.status,
                    c.note,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)) + "  " + r[-1])
        print(
            f"health: {overall} ({len(checks)} checks, world {env.world_size}) -> {out / 'health.json'}",
            flush=True,
        )
    return overall


def fmt(x: float | None) -> str:
    return "" if x is None else f"{x:g}"


@record
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gputrain_node.healthcheck", description=__doc__)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where health.json goes (default: $GPUTRAIN_OUT if set, else ./out)",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument(
        "--max-bytes",
        type=int,
        default=None,
        help="largest all-reduce (default 1 GiB on GPU, 2 MiB on CPU)",
    )
    p.add_argument(
        "--gpu-max-bytes",
        type=int,
        default=2**30,
        help="largest size on GPU when --max-bytes is not given (default 1 GiB)",
    )
    p.add_argument(
        "--collective",
        choices=COLLECTIVES,
        default="all_reduce",
        help="the collective whose bus bandwidth is measured across ranks (default all_reduce)",
    )
    p.add_argument("--pg-timeout-s", type=float, default=180.0, help="process-group timeout")
    args = p.parse_args(argv)
    out = args.out or Path(os.environ.get(OUT_ENV) or "out")
    try:
        if args.max_bytes is not None and args.max_bytes < 32 * 2**10:
            raise InputError(f"--max-bytes {args.max_bytes}: must be at least 32768 (32 KiB)")
        env = setup(args.device, args.pg_timeout_s)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    if env.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    max_bytes = args.max_bytes or (args.gpu_max_bytes if env.device.type == "cuda" else 2 * 2**20)
    overall = report(run_checks(env, max_bytes, args.collective), env, out)
    teardown(env)
    return 1 if overall == FAIL else 0


if __name__ == "__main__":
    status = main()
    # health.json is written: leave without C++ static destructors, where gloo's threads were
    # seen to abort a rank that had passed ("terminate called without an active exception")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if status is None else status)  # @record types main as returning int | None
