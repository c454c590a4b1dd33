"""A trainer stand-in without torch, for bed tests whose subject is not the trainer (autodown,
detach): each rank prints the reference trainer's step line (`step N/M | loss X`) STEPS times,
STEP_S apart, and rank 0 writes the trainer's summary.json to $GPUTRAIN_OUT. Started by the
production launch (torchrun on every node) like any entry; saves each rank torch's import and
the training (~3 CPU seconds a rank of the tiny preset).

Usage: steps.py STEPS [STEP_S]
"""

import json
import os
import sys
import time
from pathlib import Path

steps = int(sys.argv[1])
step_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
rank = int(os.environ.get("RANK", "0"))
for step in range(1, steps + 1):
    print(f"step {step:>6}/{steps} | loss {4.0 - step / steps:.4f}", flush=True)
    time.sleep(step_s)
if rank == 0:
    out = Path(os.environ.get("GPUTRAIN_OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    summary = {"steps": steps, "world_size": int(os.environ.get("WORLD_SIZE", "1"))}
    (out / "summary.json").write_text(json.dumps(summary))
