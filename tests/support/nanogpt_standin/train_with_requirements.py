"""A stand-in for karpathy/nanoGPT's train.py in the respects the environment tests need (ours,
not a copy): `--key=value` overrides of module globals, prints `iter N: loss X`, rank 0 writes
`out_dir/ckpt.pt` relative to the working directory and every rank resumes from it with
`--init_from=resume`. It imports `gputrain_probe`, the package its requirements.txt names and the
test hosts lack, as a real project imports what its requirements name. Torch-free (each rank would
pay torch's import): the subject is the project's environment; nanoGPT's DDP on the test hosts is
tests/testbed/test_nanogpt.py's and test_outputs.py's."""

import json
import os
import sys

import gputrain_probe  # noqa: F401  (installed from requirements.txt on the nodes)

out_dir = "out"
max_iters = 5
init_from = "scratch"
learning_rate = 0.05
for arg in sys.argv[1:]:
    key, _, value = arg.removeprefix("--").partition("=")
    if key not in globals():
        raise ValueError(f"Unknown config key: {key}")
    globals()[key] = type(globals()[key])(value)

iter_num = 0
ckpt_path = os.path.join(out_dir, "ckpt.pt")
if init_from == "resume":
    with open(ckpt_path) as f:
        iter_num = json.load(f)["iter_num"]
while iter_num < max_iters:
    print(f"iter {iter_num}: loss {4.0 * (1 - learning_rate) ** iter_num:.4f}", flush=True)
    iter_num += 1
if int(os.environ.get("RANK", "0")) == 0:  # nanoGPT's master process saves
    os.makedirs(out_dir, exist_ok=True)
    with open(ckpt_path, "w") as f:
        json.dump({"iter_num": iter_num}, f)
