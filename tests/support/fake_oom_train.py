"""`python -m tests.support.fake_oom_train ARGS`: the real trainer on a device that "runs out of memory".

FAKE_OOM_ABOVE="8,4" gives rank 0 room for 8 sequences per forward and rank 1 room for 4: above
that, the model's forward raises torch.OutOfMemoryError as CUDA's allocator would.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from trainer import model, train


def limit_forward(limit: int) -> None:
    real = model.GPT.forward

    def forward(self: model.GPT, idx: torch.Tensor, targets: Any = None) -> torch.Tensor:
        if idx.shape[0] > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory (fake: {idx.shape[0]} > {limit})")
        return real(self, idx, targets)

    model.GPT.forward = forward  # type: ignore[method-assign]


if __name__ == "__main__":
    limits = [int(x) for x in os.environ["FAKE_OOM_ABOVE"].split(",")]
    limit_forward(limits[int(os.environ.get("RANK", "0"))])
    train.main()
