"""A GPT-2 style decoder (nanoGPT's shape): pre-norm blocks, fused causal attention, tied embeddings."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from trainer.loss import chunked_cross_entropy, liger_cross_entropy

# --logits: the training loss's kernel; None materialises the (tokens x vocab) logits.
LOSS_KERNELS = {"full": None, "chunked": chunked_cross_entropy, "liger": liger_cross_entropy}

# --attention: which scaled_dot_product_attention kernel; auto lets PyTorch choose per call.
ATTENTION_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,  # CUDA only
    "math": SDPBackend.MATH,
}


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int  # context length T
    vocab_size: int  # already padded (see padded_vocab)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def padded_vocab(vocab: int, multiple: int = 64) -> int:
    """Round the vocabulary up so the logits matmul hits tensor-core friendly shapes (50257 -> 50304)."""
    return -(-vocab // multiple) * multiple


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, attention: str = "auto") -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.backend = ATTENTION_BACKENDS.get(attention)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        if self.backend is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            with sdpa_kernel(self.backend):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, attention: str = "auto") -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.attn = CausalSelfAttention(cfg, attention)
        self.ln2 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The model; `attention` and `logits` change how it computes, never what (same weights)."""

    def __init__(self, cfg: GPTConfig, attention: str = "auto", logits: str = "full") -> None:
        super().__init__()
        self.cfg = cfg
        self.loss_without_logits = LOSS_KERNELS[logits]
        if logits == "liger":  # its Triton kernels run as they are; the model around compiles
            # (wrapped here, not at import: torch.compiler.disable imports torch._dynamo, ~1.5 CPU
            # seconds a process that refuses its flags or takes another kernel never needs)
            self.loss_without_logits = torch.compiler.disable(liger_cross_entropy)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=False)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters counted once (tied weights once); MFU's N leaves out the position embedding."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V), or the mean cross-entropy when targets are given."""
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if targets is not None and self.loss_without_logits and torch.is_grad_enabled():
            return self.loss_without_logits(
                x.view(-1, x.size(-1)), self.lm_head.weight, targets.reshape(-1)
            )
        logits = self.lm_head(x)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def param_checksum(model: torch.nn.Module) -> str:
    """A bitwise hash of every parameter: equal across ranks iff DDP kept them in sync."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
