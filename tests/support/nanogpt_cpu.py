"""Run karpathy/nanoGPT's train.py under `gputrain` on CPU-only hosts (docs/recipes.md):
its DDP path calls torch.cuda.set_device, so on CPU each node trains on its own. Give it
--device=cpu --compile=False; its arguments pass through unchanged."""

import os
import runpy
import sys

os.environ.pop("RANK", None)  # nanoGPT's test for "is this a DDP run?"
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
