"""A stand-in for karpathy/nanoGPT's train.py where its source is not at hand (the tests use the
real one from GPTRAIN_NANOGPT_DIR when present). It behaves like it where gputrain's outputs
mirror cares: config files exec'd and `--key=value` arguments, `out_dir/ckpt.pt` written in place
at every eval (relative to the working directory unless absolute), `--init_from=resume` reading
it back, `iter N: loss ...` lines, one process per node when RANK is unset. Our own code."""

import os
import sys
import time
from ast import literal_eval
from pathlib import Path

import numpy as np
import torch

out_dir = "out"
dataset = "data"
init_from = "scratch"
max_iters = 100
eval_interval = 10
log_interval = 1
eval_iters = 1
device = "cpu"
dtype = "float32"
compile = False
n_layer, n_head, n_embd, block_size, batch_size = 1, 1, 16, 16, 4
gradient_accumulation_steps = 1
learning_rate, lr_decay_iters, warmup_iters = 1e-3, 100, 1
for arg in sys.argv[1:]:  # the configurator's rules: files are exec'd, --k=v literal_eval'd
    if "=" not in arg:
        exec(Path(arg).read_text())
    else:
        key, val = arg[2:].split("=")
        try:
            globals()[key] = literal_eval(val)
        except (SyntaxError, ValueError):
            globals()[key] = val

data = np.memmap(os.path.join(dataset, "train.bin"), dtype=np.uint16, mode="r")
torch.manual_seed(1337)
model = torch.nn.Sequential(torch.nn.Embedding(256, n_embd), torch.nn.Linear(n_embd, 256))
opt = torch.optim.AdamW(model.parameters(), lr=learning_rate)
iter_num = 0
if init_from == "resume":
    print(f"Resuming training from {out_dir}")
    ckpt = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu")
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    iter_num = ckpt["iter_num"]
os.makedirs(out_dir, exist_ok=True)
while True:
    if iter_num % eval_interval == 0 and iter_num > 0:
        ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": iter_num}
        print(f"saving checkpoint to {out_dir}")
        torch.save(ckpt, os.path.join(out_dir, "ckpt.pt"))
    ix = torch.randint(len(data) - block_size - 1, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack(
        [torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix]
    )
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, 256), y.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if iter_num % log_interval == 0:
        print(f"iter {iter_num}: loss {loss.item():.4f}, time 1.00ms, mfu 0.00%", flush=True)
    time.sleep(0.005)  # nanoGPT's pace on this machine
    iter_num += 1
    if iter_num > max_iters:
        break
