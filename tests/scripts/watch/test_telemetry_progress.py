"""A third-party trainer's run summary shows how far its log says it got: the lines are what
pytorch/examples' mnist and multinode.py, nanoGPT and a Lightning progress bar print."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scripts.job.records import JobResult
from scripts.lifecycle import summarize
from scripts.watch.telemetry import last_progress

MNIST = [
    "[rank0]:Train Epoch: 3 [59520/60000 (99%)]\tLoss: 0.031245",
    "[rank0]:",
    "[rank0]:Test set: Average loss: 0.0326, Accuracy: 9893/10000 (99%)",
    "gputrain: n0 run r1 ended",
]
MULTINODE = [
    "[rank0]:[GPU0] Epoch 49 | Batchsize: 32 | Steps: 64",
    "[rank0]:Epoch 49 | Training snapshot saved at snapshot.pt",
]
NANOGPT = ["[rank0]:iter 2990: loss 1.0412, time 31.02ms, mfu 12.3%", "[rank0]:saving checkpoint"]
LIGHTNING = [
    "[rank0]:Epoch 9:  50%|#####     | 16/32 [00:00<00:00, v_num=0, train_loss=0.412]"
    "\rEpoch 9: 100%|##########| 32/32 [00:00<00:00, v_num=0, train_loss=0.123]",
    "[rank0]:`Trainer.fit` stopped: `max_epochs=10` reached.",
]


def test_the_last_loss_and_step_lines_of_known_trainers() -> None:
    assert last_progress(MNIST) == [
        ("last loss line", "Test set: Average loss: 0.0326, Accuracy: 9893/10000 (99%)"),
        ("last step line", "Train Epoch: 3 [59520/60000 (99%)]\tLoss: 0.031245"),
    ]
    assert last_progress(MULTINODE) == [
        ("last step line", "Epoch 49 | Training snapshot saved at snapshot.pt")
    ]
    assert last_progress(NANOGPT) == [
        ("last loss line", "iter 2990: loss 1.0412, time 31.02ms, mfu 12.3%")
    ]
    [(label, line)] = last_progress(LIGHTNING)  # the bar's last draw; one line says both
    assert label == "last loss line" and line.startswith("Epoch 9: 100%")
    assert line.endswith("train_loss=0.123]") or line.endswith("...")
    assert last_progress(["hello", "[rank0]:done"]) == []
    assert last_progress(["loss 1" + "0" * 300])[0][1].endswith("...")


def test_a_third_party_run_summary_shows_its_log_ours_shows_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for node, lines in (("n0", NANOGPT), ("n1", MNIST)):
        (tmp_path / node).mkdir()
        (tmp_path / node / "torchrun.log").write_text("\n".join(["x" * 100] * 5000 + lines))
    result = JobResult("r", True, {"n0": 0, "n1": 0}, 1.0, tmp_path)
    summarize(result, hourly_usd=None, started=time.monotonic())
    out = capsys.readouterr().out
    assert "last loss line" in out and "iter 2990: loss 1.0412" in out  # the head's log
    assert "Test set" not in out
    (tmp_path / "n0" / "summary.json").write_text('{"final_loss": 1.5}')
    summarize(result, hourly_usd=None, started=time.monotonic())
    out = capsys.readouterr().out
    assert "final loss" in out and "last loss line" not in out


def test_a_relaunch_of_multinode_py_resumes_from_the_epoch_it_says() -> None:
    """The recovery line's figures for a trainer that counts epochs: where it resumed (its
    `Resuming ... at Epoch N` line) and when it trained again (its first epoch line)."""
    from scripts.watch.telemetry import StepWatch

    clock = iter([100.0, 101.0])  # the first epoch line of each attempt
    watch = StepWatch(clock=lambda: next(clock))
    for line in MULTINODE:  # the attempt before the preemption
        watch.line("n0", line)
    assert (watch.reached, watch.unit) == (49, "epoch")
    fired: list[bool] = []
    watch.new_attempt(lambda: fired.append(True))
    assert watch.unit == "step"
    watch.line("n0", "[rank0]:Resuming training from snapshot at Epoch 47")
    assert watch.first_step_at is None and not fired  # no progress yet
    watch.line("n0", "[rank0]:[GPU0] Epoch 47 | Batchsize: 32 | Steps: 64")
    assert (watch.start_step, watch.unit, fired) == (47, "epoch", [True])
    assert watch.first_step_at == 101.0


def test_any_trainers_first_progress_is_its_first_training_line() -> None:
    """ "training again N s later" ends at the first progress of a trainer whose lines we do not
    know: its own line with a step, epoch, iteration or batch number, a loss value or a progress
    bar; never gputrain's or torch's lines, nor what it says while loading or saving."""
    from scripts.watch.telemetry import StepWatch, is_any_progress

    progress = [
        *MNIST[:1], *MULTINODE[:1], *NANOGPT[:1], *LIGHTNING[:1],
        "[rank1]:train | ep 5 | loss 0.59",
        "[rank0]:Iteration 120/5000, lr 3e-4",
        "[rank0]:  12%|#2        | 120/1000 [00:10<01:15, 11.7it/s]",
        "[rank0]:{'loss': 2.31, 'grad_norm': 1.2, 'epoch': 0.1}",
        "step 10 | 1234 tok/s",  # --tee 0: a job's lines without torchrun's prefix
    ]  # fmt: skip
    not_yet = [
        "gputrain: e2e-node-1 starts run r1; interface toward head 10.0.0.1: eth0",
        "W1127 11:15:24.172000 27361 torch/distributed/run.py:803] Setting OMP_NUM_THREADS",
        "[rank0]:[W1127 11:15:25.1 ProcessGroupGloo.cpp:727] Warning: step 1 of something",
        "[rank0]:Resuming training from snapshot at Epoch 4",
        "[rank0]:Loading checkpoint from step 300",
        "[rank0]:resume: step 20 downloaded from gs://b/ckpt",
        "[rank0]:start step 20/300",
        "[rank0]:batch-size auto: micro-batch 4 x grad-accum 2 = 8 sequences per step per rank",
        "[rank0]:Epoch 3 | Training snapshot saved at snapshot.pt",
        "[rank0]:number of parameters: 10.65M",
        "[rank0]:",
    ]
    assert [ln for ln in progress if not is_any_progress(ln)] == []
    assert [ln for ln in not_yet if is_any_progress(ln)] == []
    now = [100.0]
    w = StepWatch(clock=lambda: now[0])
    fired: list[float] = []
    w.new_attempt(lambda: fired.append(now[0]))
    for ln in not_yet:
        w.line("n1", ln)
        now[0] += 1
    assert w.first_step_at is None and fired == []
    w.line("n1", "[rank1]:train | ep 5 | loss 0.59")
    now[0] += 1
    w.line("n1", "[rank1]:train | ep 6 | loss 0.52")
    assert w.first_step_at == 111.0 and fired == [111.0]
    assert w.reached is None  # its numbers stay unknown; the time does not


def test_a_known_trainers_first_step_still_names_where_it_resumed() -> None:
    from scripts.watch.telemetry import StepWatch

    w = StepWatch(clock=lambda: 5.0)
    w.new_attempt()
    w.line("n1", "[rank0]:tokens per iteration will be: 8,192")
    w.line("n1", "[rank0]:iter 100: loss 1.5, time 1321.44ms, mfu -100.00%")
    assert (w.start_step, w.reached, w.first_step_at) == (100, 100, 5.0)
