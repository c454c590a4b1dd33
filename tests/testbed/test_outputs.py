"""Outputs that survive a preemption, for a trainer that is not ours: karpathy/nanoGPT's own
train.py (from GPUTRAIN_NANOGPT_DIR, default /work/notes/nanogpt; else our stand-in in
tests/support/) on 2 test hosts under `run --stack`, its out_dir under GPUTRAIN_OUT, its data a
`copy` dataset from the Cloud Storage emulator. Node 2 is preempted once the bucket holds its
second checkpoint; the re-created node gets its out dir back from the bucket and the relaunch
(with --resume-args "--init_from=resume") continues from that checkpoint's iteration, not 0."""

from __future__ import annotations

import io
import os
import pickle
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.stack_world import BUCKET, World, assert_torn_down

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(600)]
NANOGPT = Path(os.environ.get("GPUTRAIN_NANOGPT_DIR", "/work/notes/nanogpt"))
STANDIN = Path(__file__).resolve().parent.parent / "support" / "nanogpt_standin"
EVERY = 25  # iterations between nanoGPT's checkpoints
# nanoGPT's settings for CPU test hosts, exec'd by its configurator (our file, not nanoGPT's)
CONFIG = f"""import os
os.environ.pop("RANK", None)  # nanoGPT's DDP path calls torch.cuda.set_device: one process per node
out_dir = os.path.join(os.environ["GPUTRAIN_OUT"], "nanogpt")
dataset = os.environ["GPUTRAIN_DATA_SHAKESPEARE"]  # an absolute path: os.path.join keeps it
device = "cpu"; dtype = "float32"; compile = False
import torch; torch.set_num_threads(1)  # 2 shared cores: intra-op threads only wait on each other
n_layer = 2; n_head = 2; n_embd = 64; block_size = 64; batch_size = 8
gradient_accumulation_steps = 1; max_iters = 150; lr_decay_iters = 150; warmup_iters = 10
eval_interval = {EVERY}; eval_iters = 5; log_interval = 5
"""


def put_dataset(w: World) -> str:
    """A char-level dataset like nanoGPT's shakespeare_char, in the emulator."""
    assert w.gcs is not None
    ids = np.frombuffer(b"to be or not to be that is the question " * 2000, dtype=np.uint8)
    ids = ids.astype(np.uint16)
    w.gcs.write("datasets/shakespeare_char/train.bin", ids.tobytes())
    w.gcs.write("datasets/shakespeare_char/val.bin", ids[:5000].tobytes())
    w.gcs.write("datasets/shakespeare_char/meta.pkl", pickle.dumps({"vocab_size": 256}))
    return f"shakespeare=gs://{w.gcs.bucket_name}/datasets/shakespeare_char"


def mirrored_iter(w: World, node: str) -> int | None:
    """The iteration of the node's checkpoint as the bucket holds it now (None: none yet)."""
    assert w.gcs is not None
    client = w.gcs.client()
    if not client.bucket(BUCKET).exists():  # not before the stack's `up`
        return None
    for blob in client.list_blobs(BUCKET, prefix="runs/"):
        if blob.name.endswith(f"/out/{node}/nanogpt/ckpt.pt"):
            data = blob.download_as_bytes()
            return int(
                torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)["iter_num"]
            )
    return None


def test_nanogpt_resumes_from_its_mirrored_checkpoint_after_a_preemption(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(bucket=True)
    assert w.gcs is not None
    source = NANOGPT if (NANOGPT / "train.py").is_file() else STANDIN
    for f in source.glob("*.py"):
        shutil.copy(f, w.dir / f.name)  # at test time only: never committed
    (w.dir / "gputrain_cpu.py").write_text(CONFIG)
    preempted_at: list[int] = []
    at_death: list[int | None] = []  # node 2's checkpoint in the bucket once it is dead

    def watch() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not preempted_at:
            it = mirrored_iter(w, "e2e-node-1") if w.runner.call_names().count("up") == 1 else None
            if it is not None and it >= 2 * EVERY:  # its second checkpoint is in the bucket
                w.preempt("e2e-node-1")
                preempted_at.append(it)
                time.sleep(1)  # an upload the emulator had whole when the node died lands
                at_death.append(mirrored_iter(w, "e2e-node-1"))
                return
            time.sleep(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    rc = w.run(
        "run", "--stack", "e2e", "--yes", "--skip-preflight",
        "--env", f"STORAGE_EMULATOR_HOST={w.gcs.url}", "--env", "GPUTRAIN_MIRROR_INTERVAL_S=0.5",
        "--data", put_dataset(w), "--resume-args", "--init_from=resume",
        "--", "train.py", "gputrain_cpu.py",
    )  # fmt: skip
    t.join(timeout=5)
    out = capsys.readouterr().out
    assert rc == 0, out[-4000:]
    assert preempted_at, "training ended before node 2's second checkpoint reached the bucket"
    # The first attempt started from 0; node 2 died after its checkpoint at preempted_at[0]
    # reached the bucket (the watcher read it there, then killed it).
    split = out.index("e2e-node-1 preempted (compute.instances.preempted at")
    before, after = out[:split], out[split:]
    iters = r"\[e2e-node-1\] \[rank\d\]:iter (\d+): loss"
    first = [int(i) for i in re.findall(iters, before)]
    assert first[0] == 0
    # The re-created node got its out dir back from the bucket and nanoGPT resumed from it:
    assert "e2e-node-1: restored 1 file(s) from gs://" in after  # its nanogpt/ckpt.pt
    assert re.search(r"\[e2e-node-1\] \[rank\d\]:Resuming training from ", after)
    resumed = [int(i) for i in re.findall(iters, after)]
    # node 2's newest checkpoint in the bucket when it died (not node 1's, further on): nanoGPT
    # saves at iteration N before it prints "iter N", so node 2's log may end short of it
    assert resumed[0] % EVERY == 0 and resumed[0] >= preempted_at[0] >= 2 * EVERY, resumed[:3]
    assert at_death and resumed[0] == at_death[0], (resumed[:3], at_death)
    # The run's record says where the relaunch started (nanoGPT's `iter N` lines are read).
    [recovery] = [ln for ln in out.splitlines() if ln.startswith("recovery 1/3: e2e-node-1 ")]
    step = int(re.search(r"resumed from step (\d+)", recovery).group(1))  # type: ignore[union-attr]
    assert step > 0 and step % EVERY == 0, recovery
    assert_torn_down(w)
