"""A stand-in for karpathy/nanoGPT's train.py in the respects the tests need (ours, not a copy):
`--key=value` overrides of module globals, DDP when torchrun sets RANK (gloo on CPU), prints
`iter N: loss X`, writes `out_dir/ckpt.pt` relative to the working directory and resumes from it
with `--init_from=resume`. It imports `gputrain_probe`, the package its requirements.txt names and
the test hosts lack, as a real project imports what its requirements name."""

import os
import sys

import gputrain_probe  # noqa: F401  (installed from requirements.txt on the nodes)
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

out_dir = "out"
max_iters = 5
init_from = "scratch"
learning_rate = 0.05
backend = "gloo"
for arg in sys.argv[1:]:
    key, _, value = arg.removeprefix("--").partition("=")
    if key not in globals():
        raise ValueError(f"Unknown config key: {key}")
    globals()[key] = type(globals()[key])(value)

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    dist.init_process_group(backend=backend)
master = not ddp or dist.get_rank() == 0
torch.manual_seed(1337)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
iter_num = 0
ckpt_path = os.path.join(out_dir, "ckpt.pt")
if init_from == "resume":
    ckpt = torch.load(ckpt_path)
    model.load_state_dict(ckpt["model"])
    iter_num = ckpt["iter_num"]
net = DDP(model) if ddp else model
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
while iter_num < max_iters:
    loss = torch.nn.functional.mse_loss(net(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"iter {iter_num}: loss {loss.item():.4f}", flush=True)
    iter_num += 1
if master:
    os.makedirs(out_dir, exist_ok=True)
    torch.save({"model": model.state_dict(), "iter_num": iter_num}, ckpt_path)
if ddp:
    dist.barrier()  # rank 0 may still be saving
    # no destroy_process_group: on 2 loaded cores gloo's teardown under a peer still leaving the
    # barrier aborted the process now and then ("terminate called without an active exception")
    os._exit(0)
