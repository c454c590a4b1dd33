"""A tiny gloo DDP job for the fleet tests: all-reduces each rank's number for a few steps.

Controlled by env (DDP_STEPS, DDP_STEP_S, DDP_FAIL_RANK, DDP_FAIL_STEP, DDP_TIMEOUT_S); writes
$GPUTRAIN_OUT/result-rank<R>.json with the world size, the sums and argv exactly as received.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    timeout = float(os.environ.get("DDP_TIMEOUT_S", "30"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = int(os.environ.get("DDP_STEPS", "3"))
    step_s = float(os.environ.get("DDP_STEP_S", "0"))
    fail_rank = int(os.environ.get("DDP_FAIL_RANK", "-1"))
    fail_step = int(os.environ.get("DDP_FAIL_STEP", "-1"))
    sums = []
    for step in range(steps):
        if rank == fail_rank and step == fail_step:
            raise RuntimeError(f"deliberate failure on rank {rank} at step {step}")
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        sums.append(t.item())
        print(f"step {step} sum {t.item():g}", flush=True)
        time.sleep(step_s)
    out = os.environ["GPUTRAIN_OUT"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"result-rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "sums": sums, "argv": sys.argv[1:]}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
