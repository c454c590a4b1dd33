"""The language-model loss without the full logits: linear + cross-entropy in row chunks.

The plain path materialises (tokens, vocab) logits, upcasts them to fp32 and keeps them for the
backward: 16 x 1024 x 50304 is 1.6 GB in bf16 and 3.3 GB in fp32 per micro-batch. Here each chunk's
logits exist only while its loss and gradients are computed (during the forward, as Liger-Kernel's
fused linear cross-entropy does); the backward only scales the stored gradients. Same maths, same
dtypes as the plain path under autocast: matmuls in the autocast dtype, softmax in fp32.
"""

from __future__ import annotations

from typing import Any

import torch

CHUNK_ELEMENTS = 2**26  # fp32 logits per chunk: 256 MiB (1280 rows at GPT-2's 50304 vocab)


def chunk_rows(vocab: int) -> int:
    """Rows per chunk: a multiple of 64 (tensor-core friendly) holding about CHUNK_ELEMENTS logits."""
    return max(64, CHUNK_ELEMENTS // vocab // 64 * 64)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        rows: int,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        n = x.shape[0]
        w = weight.to(dtype)
        grad_x = torch.empty_like(x)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        with torch.autocast(x.device.type, enabled=False):
            for start in range(0, n, rows):
                xc, tc = x[start : start + rows].to(dtype), targets[start : start + rows]
                logits = (xc @ w.t()).float()
                lse = torch.logsumexp(logits, dim=-1)
                total += (lse - logits.gather(1, tc[:, None]).squeeze(1)).sum()
                probs = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                probs.scatter_add_(1, tc[:, None], torch.full_like(lse[:, None], -1.0))
                g = probs.div_(n).to(dtype)  # d(mean loss) / d(logits)
                grad_x[start : start + rows] = g @ w
                grad_w += g.t() @ xc
        ctx.save_for_backward(grad_x, grad_w.to(weight.dtype))
        return total / n

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_x, grad_w = ctx.saved_tensors
        return grad_x * grad_loss, grad_w * grad_loss, None, None, None


def chunked_cross_entropy(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int | None = None
) -> torch.Tensor:
    """Mean cross-entropy of `x @ weight.T` (x: (n, C), weight: (V, C)) against `targets` (n,)."""
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    rows = rows or chunk_rows(weight.shape[0])
    out: torch.Tensor = _ChunkedLinearCrossEntropy.apply(x, weight, targets, rows, dtype)
    return out


def liger_cross_entropy(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """The same loss by Liger-Kernel's fused linear cross-entropy (Triton, CUDA; `pip install
    liger-kernel`): the logits in chunks, gradients in the forward, as above but fused. A model
    calls it through torch.compiler.disable (GPT: Liger's Triton kernels run as they are)."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    with torch.autocast(device, enabled=False):  # matmuls in the autocast dtype, as above
        out = LigerFusedLinearCrossEntropyFunction.apply(
            *(x.to(dtype), weight.to(dtype), targets, None, None, -100, 0.0, 0.0, "mean"),
            *(None, False, torch.float32),  # softcap, z-loss, the weight's gradient summed in fp32
        )
    loss: torch.Tensor = out[0] if isinstance(out, tuple) else out  # 0.8 returns 4 values
    return loss
