"""A trainer that checkpoints beside its code (pytorch/examples' `multinode.py` writes `snapshot.pt`
into its working directory, no flag changes that) under `run --stack` on 2 test hosts: node 2 is
preempted once its snapshot is in the bucket; on the relaunch the head keeps its own snapshot
(the new code snapshot gets it back) and the re-created node gets its one from the bucket, so
both resume from it, not from epoch 0, and the snapshot comes home with the results. A trainer
that saves on rank 0 only (a shared-filesystem assumption): the re-created worker gets rank 0's
snapshot before the relaunch, so every rank resumes from it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from tests.support.stack_world import World, assert_torn_down, bucket_object, preempt_when

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(600)]

EPOCHS = 30
#: written for this test, in the shape of multinode.py: its lines, its snapshot in the cwd, loaded
#: at the start if present; saved by each node's first rank (every node has its own)
MULTINODE = f'''"""A stand-in for pytorch/examples' distributed/ddp-tutorial-series/multinode.py."""
import os, time

snapshot_path = "snapshot.pt"
rank = int(os.environ["RANK"])
epochs_run = 0
if os.path.exists(snapshot_path):
    with open(snapshot_path) as f:
        epochs_run = int(f.read())
    print(f"Resuming training from snapshot at Epoch {{epochs_run}}", flush=True)
for epoch in range(epochs_run, {EPOCHS}):
    print(f"[GPU{{rank}}] Epoch {{epoch}} | Batchsize: 32 | Steps: 4", flush=True)
    time.sleep(0.2)
    if int(os.environ["LOCAL_RANK"]) == 0:
        with open(snapshot_path, "w") as f:  # in place, as torch.save does
            f.write(str(epoch + 1))
        print(f"Epoch {{epoch}} | Training snapshot saved at {{snapshot_path}}", flush=True)
'''


def run_through_a_preemption(
    w: World, capsys: pytest.CaptureFixture[str], trainer: str, snapshot_node: str
) -> tuple[str, str, list[int]]:
    """`trainer` as multinode.py under `run --stack`, node 2 preempted once `snapshot_node`'s
    snapshot.pt in the bucket counts 3 epochs: (output before the preemption, after it, the
    epoch count it was preempted at); the run succeeded."""
    assert w.gcs is not None
    (w.dir / "multinode.py").write_text(trainer)

    def epochs() -> int | None:  # the epoch count of that node's snapshot.pt in the bucket now
        found = bucket_object(w, f"/workdir/{snapshot_node}/snapshot.pt")
        return None if found is None else int(found)

    t, preempted_at = preempt_when(w, "e2e-node-1", epochs, at_least=3)
    rc = w.run(
        "run", "--stack", "e2e", "--yes", "--skip-preflight",
        "--env", f"STORAGE_EMULATOR_HOST={w.gcs.url}", "--env", "GPUTRAIN_MIRROR_INTERVAL_S=0.3",
        "--", "multinode.py",
    )  # fmt: skip
    t.join(timeout=5)
    out = capsys.readouterr().out
    assert rc == 0, out[-4000:]
    assert preempted_at, f"{snapshot_node}'s snapshot.pt never reached the bucket: " + out[-3000:]
    split = out.index("e2e-node-1 preempted (compute.instances.preempted at")
    return out[:split], out[split:], preempted_at


def test_a_trainer_checkpointing_beside_its_code_resumes_after_a_preemption(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(bucket=True)
    before, after, preempted_at = run_through_a_preemption(w, capsys, MULTINODE, "e2e-node-1")
    # (c10d's rendezvous assigns the ranks: node 1 may hold global rank 0, "[GPU0]")
    assert re.search(r"\[e2e-node-1\] \[rank\d\]:\[GPU\d\] Epoch 0 \|", before)
    # the re-created node got its snapshot back from the bucket, beside the new code
    assert re.search(r"e2e-node-1: restored 1 file\(s\) from gs://\S+/workdir/e2e-node-1/", after)
    for node in ("e2e-node-0", "e2e-node-1"):  # the head kept its own
        resumed = re.search(
            rf"\[{node}\] \[rank\d\]:Resuming training from snapshot at Epoch (\d+)", after
        )
        assert resumed and int(resumed.group(1)) >= preempted_at[0], (node, after[-3000:])
    assert not re.search(r"\[GPU\d\] Epoch 0 \|", after), after[-3000:]
    # the recovery line says where the trainer resumed, from its own lines
    line = re.search(r"recovery 1/\d+: e2e-node-1 preempted .* resumed from epoch (\d+)", after)
    assert line and int(line.group(1)) >= preempted_at[0], after[-3000:]
    # what the job wrote beside its code came home; the code it was given did not
    target = w.dir / "runs" / "stack-e2e"
    run_dir = target / (target / "LAST_RUN").read_text().strip()
    for node in ("e2e-node-0", "e2e-node-1"):
        workdir = run_dir / node / "workdir"
        assert (workdir / "snapshot.pt").read_text() == str(EPOCHS), node
        assert not (workdir / "multinode.py").exists()
    assert_torn_down(w)


AGAIN = 15
#: a trainer saving on rank 0 only, as most single-machine scripts do: its snapshot as
#: multinode.py's, its per-epoch line one gputrain does not know (with the time it was printed);
#: on a relaunch (GPUTRAIN_ATTEMPT > 1) every rank must find the snapshot, as DDP ranks must agree
RANK0_ONLY = f'''"""Saves on global rank 0 only (a shared-filesystem assumption)."""
import os, time

snapshot_path = "snapshot.pt"
rank = int(os.environ["RANK"])
epochs_run = 0
if os.path.exists(snapshot_path):
    with open(snapshot_path) as f:
        epochs_run = int(f.read())
    print(f"Resuming training from snapshot at Epoch {{epochs_run}}", flush=True)
elif int(os.environ["GPUTRAIN_ATTEMPT"]) > 1:
    raise SystemExit(f"rank {{rank}}: no {{snapshot_path}} to resume from")
# a relaunch trains AGAIN more epochs (rank 0 may have finished before the recovery)
attempt = int(os.environ["GPUTRAIN_ATTEMPT"])
last = {EPOCHS} if attempt == 1 else epochs_run + {AGAIN}
for epoch in range(epochs_run, last):
    time.sleep(0.2)
    t = time.time()  # when, in which attempt: the test reads the relaunch's first
    print(f"train | ep {{epoch}} | loss {{1 / (epoch + 1):.4f}} | t={{t:.3f}}/{{attempt}}", flush=True)
    if rank == 0:
        with open(snapshot_path, "w") as f:
            f.write(str(epoch + 1))
'''


def test_a_trainer_checkpointing_on_rank_0_only_resumes_on_every_rank(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(bucket=True)
    before, after, preempted_at = run_through_a_preemption(w, capsys, RANK0_ONLY, "e2e-node-0")
    assert re.search(r"\[e2e-node-0\] \[rank0\]:train \| ep 0 \|", before)  # rank 0: the head
    assert re.search(
        r"e2e-node-1: filled 1 file\(s\) it lacked from gs://\S+/workdir/e2e-node-0/ "
        r"\(snapshot\.pt\)",
        after,
    ), after[-3000:]
    for node in ("e2e-node-0", "e2e-node-1"):  # every rank resumed from rank 0's snapshot
        resumed = re.search(
            rf"\[{node}\] \[rank\d\]:Resuming training from snapshot at Epoch (\d+)", after
        )
        assert resumed and int(resumed.group(1)) >= preempted_at[0], (node, after[-3000:])
    assert not re.search(r"train \| ep 0 \|", after), after[-3000:]
    # "training again N s later": until the relaunch's first epoch line, although gputrain does
    # not know its lines, not until the run's end
    times = [float(t) for t in re.findall(r"train \| ep \d+ \| loss \S+ \| t=(\S+)/2", after)]
    # rank 0's snapshot comes home from its node; the worker's results hold no stale copy of it
    target = w.dir / "runs" / "stack-e2e"
    run_dir = target / (target / "LAST_RUN").read_text().strip()
    head = re.search(
        r"\[e2e-node-0\] \[rank\d\]:Resuming training from snapshot at Epoch (\d+)", after
    )
    assert head is not None
    assert (run_dir / "e2e-node-0" / "workdir" / "snapshot.pt").read_text() == str(
        int(head.group(1)) + AGAIN
    )
    assert not (run_dir / "e2e-node-1" / "workdir" / "snapshot.pt").exists()
    (recovery,) = json.loads((run_dir / "job.json").read_text())["recoveries"]
    training_again = recovery["preempted_at"] + recovery["downtime_s"]
    assert abs(training_again - min(times)) < 2.0, (recovery, min(times))
    assert max(times) - training_again > 2.0  # the run went on well after it
    assert_torn_down(w)
