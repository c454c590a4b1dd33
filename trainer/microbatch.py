"""How a step's sequences are split into micro-batches, and `--batch-size auto`'s search.

Tokens per step stay what the user asked (`--tokens-per-step`, else batch x accum x block per rank);
only the split changes. Auto tries the divisors of the step's sequences, largest first, with one
forward and backward of the real model each (eager: a try costs no compilation; compiled code needs
less memory, not more), holding the optimizer's moments in reserve; an OutOfMemoryError steps down.
Ranks then take the smallest pick, so every rank runs the same split.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from trainer.batches import StepShape
from trainer.config import PRESETS, TrainConfig
from trainer.dist import DistEnv, all_gather
from trainer.errors import InputError


def step_rows(cfg: TrainConfig, world: int) -> int:
    """Sequences per rank per optimizer step."""
    if cfg.tokens_per_step is not None:
        rows, rest = divmod(cfg.tokens_per_step, cfg.block_size * world)
        if rest or not rows:
            raise InputError(
                f"--tokens-per-step {cfg.tokens_per_step}: must be a multiple of --block-size "
                f"{cfg.block_size} x {world} ranks = {cfg.block_size * world}"
            )
        return rows
    batch = PRESETS[cfg.preset]["batch_size"] if cfg.batch_size == "auto" else cfg.batch_size
    return int(batch) * cfg.grad_accum


def fixed_shape(cfg: TrainConfig, world: int) -> StepShape | None:
    """The split when --batch-size is a number; None for auto (searched on the device)."""
    rows = step_rows(cfg, world)
    if not isinstance(cfg.batch_size, int):  # auto
        return None
    if rows % cfg.batch_size:
        raise InputError(
            f"--tokens-per-step {cfg.tokens_per_step}: must be a multiple of --batch-size "
            f"{cfg.batch_size} x --block-size {cfg.block_size} x {world} ranks"
        )
    return StepShape(rows, cfg.batch_size)


def largest_fitting(
    rows: int, attempt: Callable[[int], None], clean_up: Callable[[], None]
) -> tuple[int, list[int]]:
    """(the largest divisor of `rows` whose `attempt` ran without running out of memory, the ones
    that did). `clean_up` runs after every attempt, once the failed one's tensors are released."""
    too_big: list[int] = []
    for size in (d for d in range(rows, 0, -1) if rows % d == 0):
        try:
            attempt(size)
            fits = True
        except torch.OutOfMemoryError:
            fits = False
        clean_up()  # here, not in a finally: the traceback no longer pins the attempt's tensors
        if fits:
            return size, too_big
        too_big.append(size)
    raise InputError(
        "--batch-size auto: even 1 sequence per micro-step runs out of device memory "
        "(use a smaller model or --block-size, or a GPU with more memory)"
    )


def plan_step(
    cfg: TrainConfig,
    env: DistEnv,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> StepShape:
    """The step's split: the fixed one, or auto's pick (logged) with the optimizer's moments
    (2 fp32 tensors per parameter, unless a resumed optimizer holds them already) kept free."""
    shape = fixed_shape(cfg, env.world_size)
    if shape is not None:
        return shape
    moments = 0 if optimizer.state else 8 * sum(p.numel() for p in model.parameters())
    rows = step_rows(cfg, env.world_size)
    shape, too_big = search_micro_batch(env, model, rows, cfg.block_size, autocast, moments)
    if env.is_main:
        tried = f"; out of memory at {', '.join(map(str, too_big))}" if too_big else ""
        print(
            f"batch-size auto: micro-batch {shape.micro_batch} x grad-accum {shape.grad_accum} "
            f"= {rows} sequences per step per rank{tried}",
            flush=True,
        )
    return shape


def search_micro_batch(
    env: DistEnv,
    model: torch.nn.Module,
    rows: int,
    block: int,
    autocast: Callable[[], AbstractContextManager[Any]],
    reserve_bytes: int,
) -> tuple[StepShape, list[int]]:
    """Auto's pick, agreed by all ranks (their minimum), and the sizes that ran out of memory here."""
    device = next(model.parameters()).device

    def attempt(size: int) -> None:
        reserve = torch.empty(reserve_bytes, dtype=torch.uint8, device=device)
        tokens = torch.zeros((size, block + 1), dtype=torch.long, device=device)
        with autocast():
            loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        del reserve

    def clean_up() -> None:
        model.zero_grad(set_to_none=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    mine, too_big = largest_fitting(rows, attempt, clean_up)
    return StepShape(rows, min(all_gather(env, mine))), too_big
