"""Model FLOPs utilisation: nanoGPT/torchtitan's flops-per-token formula and dense tensor-core peaks."""

from __future__ import annotations

from trainer.model import GPTConfig

# Dense (no 2:4 sparsity) tensor-core peak in TFLOP/s for the autocast dtype the trainer uses on that
# GPU: bf16 from Ampere on, fp16 on T4/V100 (no bf16 tensor cores). Sources: torchtitan
# tools/utils.py get_peak_flops, llm.c llmc/mfu.h, NVIDIA datasheets. Most specific pattern first.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L4", 121.0),  # "NVIDIA L4"; the datasheet's 242 is with sparsity
    ("T4", 65.0),  # fp16
    ("V100", 125.0),  # fp16, SXM2
)


def peak_tflops(device_name: str) -> float | None:
    """The dense peak for a `torch.cuda.get_device_name()` string; None when unknown (never guessed)."""
    for pattern, tflops in PEAK_TFLOPS:
        if pattern in device_name:
            return tflops
    return None


def flops_per_token(cfg: GPTConfig, n_params: int) -> float:
    """6·N + 12·L·H·Q·T (forward + backward), N without the position embedding; nanoGPT's formula."""
    return 6.0 * n_params + 12.0 * cfg.n_layer * cfg.n_head * cfg.head_dim * cfg.block_size


def mfu(
    tokens_per_s: float, flops_per_tok: float, peak: float | None, n_devices: int
) -> float | None:
    """Achieved / peak flops across all devices, as a fraction; None when the peak is unknown."""
    if peak is None or n_devices <= 0:
        return None
    return tokens_per_s * flops_per_tok / (peak * 1e12 * n_devices)
