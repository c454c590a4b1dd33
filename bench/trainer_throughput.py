"""Trainer throughput on one GPU: GPT-2 124M, bf16, seq 1024, torch.compile on and off.

Prints tokens/s and MFU (6N + 12·L·H·Q·T flops/token over the GPU's dense bf16 peak) after an
untimed warm-up. Target on H100/H200: >= 45 % MFU. Without CUDA it says so, prints a tiny CPU
smoke figure (not a GPU result) and exits 0, so `make bench` works on any machine.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from trainer.mfu import flops_per_token, mfu, peak_tflops
from trainer.model import GPT, GPTConfig, padded_vocab

GPT2_124M = GPTConfig(
    n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=padded_vocab(50257)
)
TINY = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=64)


def tokens_per_s(
    cfg: GPTConfig, device: torch.device, batch: int, compiled: bool, warmup: int, steps: int
) -> tuple[float, int]:
    """(tokens/s, peak device bytes) of full training steps on random tokens resident on the device."""
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=device.type == "cuda")
    step_model = torch.compile(model) if compiled else model
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size + 1), device=device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def step() -> None:
        with torch.autocast(device_type=device.type, dtype=dtype, enabled=device.type == "cuda"):
            loss = step_model(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):  # includes compilation
        step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return steps * batch * cfg.block_size / elapsed, int(peak)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--compile", choices=["both", "on", "off"], default="both")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print(
            "trainer_throughput: no CUDA device here: GPU figures NOT measured "
            "(run this on a GPU machine); CPU smoke figure for the tiny model only:"
        )
        tps, _ = tokens_per_s(TINY, torch.device("cpu"), 16, False, 3, 20)
        print(f"  cpu tiny fp32 compile=off: {tps:,.0f} tokens/s (not comparable to GPU figures)")
        return 0
    device = torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name(device)
    peak = peak_tflops(name)
    model = GPT(GPT2_124M)
    fpt = flops_per_token(GPT2_124M, model.num_params())
    del model
    print(
        f"trainer_throughput: {name}, torch {torch.__version__}, gpt2-124m bf16, batch "
        f"{args.batch_size} x {GPT2_124M.block_size}, {fpt / 1e9:.3f} GFLOP/token, peak "
        f"{peak if peak else 'unknown'} TFLOP/s, {args.warmup} warm-up + {args.steps} timed steps"
    )
    modes = {"both": [True, False], "on": [True], "off": [False]}[args.compile]
    for compiled in modes:
        tps, mem = tokens_per_s(
            GPT2_124M, device, args.batch_size, compiled, args.warmup, args.steps
        )
        fraction = mfu(tps, fpt, peak, 1)
        mfu_text = "n/a (unknown GPU)" if fraction is None else f"{100 * fraction:.1f}%"
        print(
            f"  compile={'on ' if compiled else 'off'}: {tps:,.0f} tokens/s, MFU {mfu_text}, "
            f"peak memory {mem / 2**30:.1f} GiB"
        )
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
