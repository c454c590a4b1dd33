"""What one optimizer step is made of: LR schedule, autocast dtype, AdamW, and the speed settings.

The step itself (Trainer.train_step) does no host sync: the loss stays a device tensor until a log
step reads it, the LR is a Python float, clipping and the fused optimizer stay on the device.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
from typing import Any

import torch

from trainer.batches import StepShape
from trainer.config import TrainConfig
from trainer.errors import InputError

# torch.compile modes that capture CUDA graphs. Their gradient outputs live in graph-owned memory
# that the next replay overwrites, so accumulating gradients over micro-steps silently corrupts them
# (pytorch/pytorch#169545, #96693): these modes need grad-accum 1.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


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
    """torch.compile's arguments, or None when not compiling (--compile auto: on for CUDA).
    Static shapes: every step has the same shape, and a size auto tried is never generalised."""
    if cfg.compile == "off" or (cfg.compile == "auto" and device.type != "cuda"):
        return None
    mode = {} if cfg.compile_mode == "default" else {"mode": cfg.compile_mode}
    return {"dynamic": False, **mode}


def check_speed_settings(cfg: TrainConfig, device: torch.device, dtype: torch.dtype) -> None:
    """Kernel choices this device and dtype cannot run, refused before any step."""
    if cfg.attention in ("flash", "cudnn") and device.type != "cuda":
        raise InputError(
            f"--attention {cfg.attention}: needs a CUDA device (use auto or math on {device.type})"
        )
    if cfg.attention in ("flash", "cudnn") and device.type == "cuda" and dtype == torch.float32:
        raise InputError(
            f"--attention {cfg.attention}: needs --dtype bf16 or fp16 on CUDA (or use auto or math)"
        )
    if cfg.logits == "liger" and device.type != "cuda":
        raise InputError(
            f"--logits liger: needs a CUDA device (Liger-Kernel's Triton kernels; use full or "
            f"chunked on {device.type})"
        )
    if cfg.logits == "liger" and importlib.util.find_spec("liger_kernel") is None:
        raise InputError(
            "--logits liger: Liger-Kernel is not installed here (pip install liger-kernel, or "
            "add it to requirements.txt; or use full or chunked)"
        )
    check_fp8(cfg, device)


def check_fp8(cfg: TrainConfig, device: torch.device) -> None:
    """--fp8 on needs float8 tensor cores (Ada, Hopper and newer) and torchao, refused before any
    step; float8 matmuls outside compile are slower than bf16 (torchao compiles them together)."""
    if cfg.fp8 == "off":
        return
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        where = device.type if device.type != "cuda" else torch.cuda.get_device_name(device)
        raise InputError(f"--fp8 on: needs a GPU with float8 tensor cores (8.9+), not {where}")
    if importlib.util.find_spec("torchao") is None:
        raise InputError(
            "--fp8 on: torchao is not installed here (pip install torchao, or add it to "
            "requirements.txt; or use --fp8 off)"
        )
    if cfg.compile == "off":
        raise InputError("--fp8 on: needs --compile on or auto (eager float8 is slower than bf16)")


def to_float8(model: torch.nn.Module) -> None:
    """The transformer blocks' nn.Linear layers become torchao Float8Linear in place (same
    parameters, same checkpoint keys); the tied lm_head stays as it is."""
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(model, module_filter_fn=lambda _, fqn: fqn.startswith("blocks."))


def check_cuda_graphs(compile: dict[str, Any] | None, shape: StepShape) -> None:
    mode = (compile or {}).get("mode")
    if mode in CUDA_GRAPH_MODES and shape.grad_accum > 1:
        raise InputError(
            f"--compile-mode {mode}: needs grad-accum 1 (CUDA graphs overwrite accumulated "
            f"gradients), not {shape.micro_batch} x {shape.grad_accum}; use --batch-size "
            f"{shape.rows} --grad-accum 1, or --compile-mode default or max-autotune-no-cudagraphs"
        )


def prefetching(cfg: TrainConfig, device: torch.device) -> bool:
    """--prefetch auto: on for CUDA, where the GPU computes while the thread builds the next batch;
    off on CPU, where the thread would compete with training for the same cores."""
    return cfg.prefetch == "on" or (cfg.prefetch == "auto" and device.type == "cuda")
