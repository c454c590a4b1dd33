"""Checkpoints without a shared filesystem: local rank 0 of every node writes, resume agrees on one.

DDP state is replicated, so every node's local rank 0 writes the same file into its own out dir
(atomically: temp file + rename) and keeps the last K. On resume all ranks agree on the newest step
any node has; ranks whose node has that file load it, the others receive it by broadcast from the
lowest rank that has it (a node replaced after a restart comes back with an empty out dir).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.dist import DistEnv, all_gather
from trainer.errors import InputError

NAME = re.compile(r"^ckpt-(\d{8})\.pt$")


def checkpoint_path(out: Path, step: int) -> Path:
    return out / f"ckpt-{step:08d}.pt"


def list_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(step, path) of finished checkpoints in `out`, oldest first (temp files are ignored)."""
    found = [(int(m.group(1)), p) for p in out.glob("ckpt-*.pt") if (m := NAME.match(p.name))]
    return sorted(found)


def save(out: Path, state: dict[str, Any], keep: int) -> Path:
    path = checkpoint_path(out, int(state["step"]))
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)
    for _, old in list_checkpoints(out)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load(path: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file: name it instead of a pickle traceback
        raise InputError(f"checkpoint {path} cannot be read: {type(e).__name__}: {e}") from None
    if not {"step", "model", "optimizer"} <= state.keys():
        raise InputError(f"checkpoint {path} is not a gputrain trainer checkpoint")
    return state


def resume_state(env: DistEnv, out: Path, resume: str) -> dict[str, Any] | None:
    """The state to continue from: `never`, `auto` (the newest in `out` on any node) or a path."""
    if resume == "never":
        return None
    if resume != "auto":
        return load(Path(resume))
    mine = list_checkpoints(out)
    steps = all_gather(env, mine[-1][0] if mine else -1)
    best = max(steps)
    if best < 0:
        return None
    if min(steps) == best:  # the usual case: every node has it, no transfer
        return load(checkpoint_path(out, best))
    source = steps.index(best)
    box = [load(checkpoint_path(out, best)) if env.rank == source else None]
    dist.broadcast_object_list(box, src=source, group=env.control)
    assert box[0] is not None
    return box[0]
