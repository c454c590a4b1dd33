"""Will the model fit? An estimate of a rank's memory (weights, gradients, AdamW moments and one
micro-batch's activations) against what the device has free, checked before anything is allocated:
a model too big for the machine is one line naming the figures, not a process the kernel kills."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.config import TrainConfig
from trainer.errors import InputError

GIB = 1 << 30
MEMINFO = "/proc/meminfo"
STATE_BYTES_PER_PARAM = 16  # fp32 weights + gradients + AdamW's two moments


@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    state_bytes: int
    activation_bytes: int
    micro_batch: int

    @property
    def total(self) -> int:
        return self.state_bytes + self.activation_bytes


def estimate(cfg: TrainConfig, vocab: int, act_bytes: int) -> MemoryEstimate:
    """A lower bound: the GPT's parameters, and per layer the activations a backward keeps (about
    34 values per token per width, plus 5 attention scores per head per token pair, as Korthikanti
    et al. count them) and the logits; `--batch-size auto` counts its smallest micro-batch, 1."""
    d, t, layers = cfg.n_embd, cfg.block_size, cfg.n_layer
    params = layers * 12 * d * d + vocab * d + t * d
    b = cfg.batch_size if isinstance(cfg.batch_size, int) else 1
    per_layer = b * t * d * 34 + 5 * b * cfg.n_head * t * t
    logits = 0 if cfg.logits != "full" else b * t * vocab * 3 * 4  # fp32 logits, softmax, grad
    activations = layers * per_layer * act_bytes // 2 + logits  # Korthikanti's 34 counts 2 bytes
    return MemoryEstimate(params, params * STATE_BYTES_PER_PARAM, activations, b)


def available_bytes(device: torch.device, local_ranks: int) -> int | None:
    """Free memory for one rank: the GPU's free memory, or this machine's MemAvailable shared by
    the ranks on it; None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open(MEMINFO) as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024 // max(1, local_ranks)
    except (OSError, KeyError, ValueError):
        return None


def check_fits(
    cfg: TrainConfig, vocab: int, device: torch.device, dtype: torch.dtype, local_ranks: int
) -> MemoryEstimate:
    """InputError when the estimate is above what is free (exit 2, before any allocation)."""
    est = estimate(cfg, vocab, torch.finfo(dtype).bits // 8)
    free = available_bytes(device, local_ranks)
    if free is not None and est.total > free:
        where = "GPU" if device.type == "cuda" else f"machine ({local_ranks} rank(s) share it)"
        raise InputError(
            f"model too big: --n-layer {cfg.n_layer} --n-embd {cfg.n_embd} --block-size "
            f"{cfg.block_size} --batch-size {est.micro_batch} needs about {est.total / GIB:.1f} GiB "
            f"per rank ({est.params / 1e6:,.0f}M params: {est.state_bytes / GIB:.1f} GiB of weights, "
            f"gradients and AdamW state; {est.activation_bytes / GIB:.1f} GiB of activations), "
            f"but the {where} has {free / GIB:.1f} GiB free; use a smaller model, block size or "
            "batch size"
        )
    return est
