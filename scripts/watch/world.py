"""Whether a multi-node job was one distributed job: each rank's process group size, as the
stack-dump hook (gputrain_node/watch_hook/sitecustomize.py) recorded it in <node>/watch/world/<RANK>
(0: the rank ended without joining one). Ranks that never join one train independent copies:
Lightning's default Trainer(num_nodes=1) under torchrun does. The group size, not the per-node
losses: a healthy DDP job's ranks print different local losses from step 1 (each its own data
shard), so losses tell the two apart no better than chance (docs/recipes.md). Reads files; no I/O
beyond."""

from __future__ import annotations

from pathlib import Path

#: the usual fixes, named in the warning (docs: recipes, "Lightning and Accelerate multi-node")
FIXES = (
    "Lightning: Trainer(num_nodes=<nodes>, devices=<GPUs per node>, strategy='ddp'); "
    "Accelerate: let Accelerator() read torchrun's variables (no `accelerate launch` config "
    "with num_machines: 1 or distributed_type: NO inside the job)"
)


def group_sizes(results_dir: Path) -> dict[str, int]:
    """'node/rank' -> the size of the process group that rank joined (0: none)."""
    sizes = {}
    for f in sorted(results_dir.glob("*/watch/world/*")):
        text = f.read_text(errors="replace").strip()
        if text.isdigit():
            sizes[f"{f.parent.parent.parent.name}/{f.name}"] = int(text)
    return sizes


def not_distributed_warning(results_dir: Path, nodes: int, run_id: str) -> str | None:
    """One warning line when a job on several nodes never formed one process group: no rank
    joined a group larger than 1. None when it did, or when nothing was recorded."""
    sizes = group_sizes(results_dir)
    if nodes < 2 or not sizes or max(sizes.values()) > 1:
        return None
    return (
        f"run {run_id} ran on {nodes} nodes but its {len(sizes)} rank(s) never joined one "
        "process group (each reported world size 1 or none): they trained independent copies, "
        f"not one distributed job. The usual fix: {FIXES}"
    )
