"""What one optimizer step is made of: LR schedule, autocast dtype, AdamW, and the speed settings.

The step itself (Trainer.train_step) does no host sync: the loss stays a device tensor until a log
step reads it, the LR is a Python float, clipping and the fused optimizer stay on the device.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from trainer.config import TrainConfig
from trainer.errors import InputError


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio · lr at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))) * (cfg.lr - floor)


def amp_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype != "auto":
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[cfg.dtype]
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else torch.float16


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_optimizer(
    model: torch.nn.Module, cfg: TrainConfig, device: torch.device
) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; the fused kernel on CUDA and CPU alike (the
    unfused one reads its step count back with .item() for every parameter)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def compile_kwargs(cfg: TrainConfig, device: torch.device) -> dict[str, Any] | None:
    """torch.compile's arguments, or None when not compiling (--compile auto: on for CUDA)."""
    if cfg.compile == "off" or (cfg.compile == "auto" and device.type != "cuda"):
        return None
    return {} if cfg.compile_mode == "default" else {"mode": cfg.compile_mode}


def check_speed_settings(cfg: TrainConfig, device: torch.device, dtype: torch.dtype) -> None:
    """Kernel choices this device and dtype cannot run, refused before any step."""
    if cfg.attention == "cudnn" and device.type != "cuda":
        raise InputError("--attention cudnn: needs a CUDA device (use auto, flash or math)")
    if cfg.attention in ("flash", "cudnn") and device.type == "cuda" and dtype == torch.float32:
        raise InputError(
            f"--attention {cfg.attention}: needs --dtype bf16 or fp16 on CUDA (or use auto or math)"
        )


def prefetching(cfg: TrainConfig, device: torch.device) -> bool:
    """--prefetch auto: on for CUDA, where the GPU computes while the thread builds the next batch;
    off on CPU, where the thread would compete with training for the same cores."""
    return cfg.prefetch == "on" or (cfg.prefetch == "auto" and device.type == "cuda")
