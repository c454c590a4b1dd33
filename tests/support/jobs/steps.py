"""A trainer stand-in without torch, for tests whose subject is not the trainer (autodown, detach,
notifications, the ledger, a recovery's control flow): each rank prints the reference trainer's
banner (`start step N/M`) and step line (`step N/M | loss X`) from step N+1 to STEPS, STEP_S
apart; rank 0 appends each step's row to $GPUTRAIN_OUT/metrics.jsonl as it goes, and each
node's local rank 0 writes the trainer's summary.json there at the end. With
EVERY and $GPUTRAIN_CHECKPOINT_URI (as the controller sets it for a stack with a bucket) it
checkpoints as the trainer does: rank 0 uploads `ckpt-NNNNNNNN.pt` and its manifest every EVERY
steps (trainer/storage.py's protocol, its `checkpoint URI` line), every rank starts from the
newest complete one, and the ranks keep in step as DDP's collectives keep them (over plain TCP
to rank 0 at MASTER_PORT + 1): when a node's processes die, the others fail at their next step,
as gloo fails on a lost peer, rather than train on alone; a SIGTERM to any rank stops every rank
after the same step, with a checkpoint and the trainer's line saying so (exit 143). With
EVERY and $STEPS_OUT_CHECKPOINT set it checkpoints instead as a third-party trainer does (nanoGPT):
rank 0 writes `steps-ckpt.txt` into $GPUTRAIN_OUT, and every rank starts from its own node's copy
(what the out-dir mirror brings back to a re-created node, or fills from rank 0's). With
$STEPS_LOCKSTEP set the ranks keep in step without checkpoints too (a stopped rank stalls all).
Started by the production launch (torchrun on every node) like any entry; saves each rank
torch's import and the training (~3 CPU seconds a rank of the tiny preset).

Usage: steps.py STEPS [STEP_S [EVERY]]
"""

import io
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

steps = int(sys.argv[1])
step_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
every = int(sys.argv[3]) if len(sys.argv) > 3 else 0
rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
out_checkpoint = (
    Path(os.environ.get("GPUTRAIN_OUT", "out")) / "steps-ckpt.txt"
    if every and os.environ.get("STEPS_OUT_CHECKPOINT")
    else None
)
uri = os.environ.get("GPUTRAIN_CHECKPOINT_URI") if every and not out_checkpoint else None
store = None
start = 0
if out_checkpoint is not None and out_checkpoint.is_file():
    start = int(out_checkpoint.read_text().split()[1])
if uri:
    from trainer.storage import CheckpointStore, parse_gs_uri

    store = CheckpointStore(parse_gs_uri(uri, "GPUTRAIN_CHECKPOINT_URI"))
    complete, _ = store.complete()
    start = max((c.step for c in complete), default=0)
print(f"steps.py: start step {start}/{steps}", flush=True)
stop_asked: list[int] = []  # a SIGTERM came (the trainer's stop); any rank's stops them all


def lockstep() -> Callable[[bool], bool]:
    """A barrier per step between all ranks, through rank 0, that tells every rank whether any
    asked to stop (the trainer's all-reduce of its stop code); a lost rank ends the others."""
    port = int(os.environ["MASTER_PORT"]) + 1
    if rank == 0:
        with socket.create_server(("", port)) as server:
            server.settimeout(60)
            peers = [server.accept()[0] for _ in range(world - 1)]
    else:
        deadline = time.monotonic() + 60
        while True:
            try:
                peers = [socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=5)]
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    for peer in peers:
        peer.settimeout(60)

    def receive(peer: socket.socket) -> bool:
        got = peer.recv(1)
        if got not in (b".", b"S"):
            raise ConnectionResetError("connection closed")
        return got == b"S"

    def barrier(stop: bool) -> bool:
        try:
            if rank == 0:  # hears every other rank, then answers all
                stop = any([receive(peer) for peer in peers]) or stop
                for peer in peers:
                    peer.sendall(b"S" if stop else b".")
                return stop
            peers[0].sendall(b"S" if stop else b".")
            return receive(peers[0])
        except OSError as e:
            sys.exit(f"steps.py: rank {rank}: a peer is gone ({e})")

    return barrier


def save(step: int) -> None:
    if out_checkpoint is not None and rank == 0:  # whole or not at all, as the mirror reads it
        out_checkpoint.parent.mkdir(parents=True, exist_ok=True)
        (partial := out_checkpoint.with_suffix(".part")).write_text(f"step {step}\n")
        partial.replace(out_checkpoint)
    if store is not None and rank == 0:
        data = f"step {step}\n".encode()
        store.upload(io.BytesIO(data), step, len(data))
        print(f"checkpoint {uri}ckpt-{step:08d}.pt", flush=True)


saving_checkpoints = store is not None or out_checkpoint is not None
in_step = saving_checkpoints or bool(os.environ.get("STEPS_LOCKSTEP"))
barrier = lockstep() if in_step and world > 1 else (lambda stop: stop)
if saving_checkpoints:
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_asked.append(signum))


def loss_at(step: int) -> float:
    return 4.0 - step / steps


began = time.monotonic()
metrics = None
if rank == 0:  # the trainer's metrics.jsonl: a row per step, in the out dir from the start
    out_dir = Path(os.environ.get("GPUTRAIN_OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = (out_dir / "metrics.jsonl").open("a")
for step in range(start + 1, steps + 1):
    if barrier(bool(stop_asked)):  # every rank stops after the same step, saved, as the trainer
        saving = time.monotonic()
        save(step - 1)
        barrier(True)  # the others wait for rank 0's upload (the trainer's gather of reasons)
        if rank == 0:
            print(  # the SIGTERM may have come to another rank: the reason is the same
                f"SIGTERM: stopped at step {step - 1} with a checkpoint "
                f"(saved and uploaded in {time.monotonic() - saving:.1f} s)",
                flush=True,
            )
        sys.exit(143)
    print(f"step {step:>6}/{steps} | loss {loss_at(step):.4f}", flush=True)
    if metrics:
        metrics.write(json.dumps({"step": step, "loss": loss_at(step)}) + "\n")
        metrics.flush()
    if every and step % every == 0:
        save(step)
    time.sleep(step_s)
if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # as the trainer: nodes share no disk
    out = Path(os.environ.get("GPUTRAIN_OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "steps": steps,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "final_loss": loss_at(steps),
        "tokens_per_s": 1024 * (steps - start) / (time.monotonic() - began),
        "resumed_from": start or None,
    }
    (out / "summary.json").write_text(json.dumps(summary))
