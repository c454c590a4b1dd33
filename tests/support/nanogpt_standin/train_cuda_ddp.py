"""A stand-in for karpathy/nanoGPT's train.py, ours, for tests where that file is not available
(GPUTRAIN_NANOGPT_DIR). It behaves like it where gputrain is concerned: `--key=value` arguments
override the settings below, data comes from data/<dataset>/train.bin (uint16), it prints
`iter N: loss X`, writes out_dir/ckpt.pt relative to its working directory, resumes with
--init_from=resume, and under torchrun (RANK set) it calls torch.cuda.set_device, which a CPU-only
host cannot do."""

import os
import sys
from pathlib import Path

import numpy as np
import torch

out_dir = "out"
dataset = "shakespeare_char"
init_from = "scratch"
max_iters = 20
eval_interval = 10
log_interval = 5
batch_size = 4
block_size = 16
n_embd = 16
learning_rate = 1e-2
device = "cuda"
compile = True
backend = "nccl"
dtype = "float16"

for arg in sys.argv[1:]:
    if "=" not in arg:  # a config file, executed here, as nanoGPT's configurator does
        exec(Path(arg).read_text())
        continue
    key, _, value = arg.removeprefix("--").partition("=")
    if key not in globals():
        raise ValueError(f"Unknown config key: {key}")
    old = globals()[key]
    globals()[key] = type(old)(value == "True") if isinstance(old, bool) else type(old)(value)

if int(os.environ.get("RANK", -1)) != -1:  # its DDP path assumes one CUDA device per process
    torch.distributed.init_process_group(backend=backend)
    device = f"cuda:{os.environ['LOCAL_RANK']}"
    torch.cuda.set_device(device)

data = np.memmap(os.path.join("data", dataset, "train.bin"), dtype=np.uint16, mode="r")
vocab = int(data.max()) + 1
torch.manual_seed(1337)
model = torch.nn.Sequential(torch.nn.Embedding(vocab, n_embd), torch.nn.Linear(n_embd, vocab))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
iter_num = 0
if init_from == "resume":
    ckpt = torch.load(os.path.join(out_dir, "ckpt.pt"))
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    iter_num = ckpt["iter_num"]
    print(f"Resuming training from {out_dir}")
os.makedirs(out_dir, exist_ok=True)
while iter_num <= max_iters:
    ix = torch.randint(len(data) - block_size - 1, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack(
        [torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix]
    )
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, vocab), y.view(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if iter_num % eval_interval == 0 and iter_num > 0:
        print(f"saving checkpoint to {out_dir}")
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save({**state, "iter_num": iter_num}, os.path.join(out_dir, "ckpt.pt"))
    if iter_num % log_interval == 0:
        print(f"iter {iter_num}: loss {loss.item():.4f}")
    iter_num += 1
