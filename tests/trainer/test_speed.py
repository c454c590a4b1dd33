"""The trainer's throughput figure and speed settings on CPU: honest numbers, same maths, no syncs."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.support.fake_oom_train import limit_forward
from tests.support.trainer_helpers import metrics, run, summary, torchrun_argv
from trainer.batches import Batches, StepShape
from trainer.config import parse_config
from trainer.data import DataSource, open_data
from trainer.dist import DistEnv
from trainer.errors import InputError
from trainer.loss import chunked_cross_entropy
from trainer.metrics import StepClock
from trainer.microbatch import fixed_shape, largest_fitting
from trainer.model import GPT, GPTConfig
from trainer.step import compile_kwargs
from trainer.train import Trainer, main

pytestmark = [
    pytest.mark.filterwarnings("ignore:Unable to enable fault handler"),
    pytest.mark.filterwarnings(
        "ignore:`torch.jit.script_method` is deprecated"
    ),  # torch.compile's import
]
CPU = torch.device("cpu")
QUICK = ["--steps", "120", "--log-every", "20", "--checkpoint-every", "20", "--eval-batches", "2"]


# ---------------------------------------------------------------- the figure


def test_step_clock_counts_only_training_spans_after_warm_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    clock = StepClock(start_step=0, warmup_until=2)
    for done, span, pause in ((2, 10.0, 5.0), (4, 1.0, 30.0), (6, 1.0, 0.0)):
        clock.resume()
        now[0] += span  # steps
        clock.pause(done)
        now[0] += pause  # a checkpoint: not counted
    assert (clock.steady_steps, clock.steady_s) == (4, 2.0)  # warm-up (compile) left out
    assert clock.take_interval() == (6, 12.0) and clock.take_interval() == (0, 0.0)


def test_a_slow_checkpoint_writer_lowers_the_wall_figure_not_the_training_throughput(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main([*QUICK, "--out", str(tmp_path / "base")])
    real_save = Trainer.save

    def slow_save(self: Trainer, step: int) -> None:
        time.sleep(1.5)  # a slow disk or bucket
        real_save(self, step)

    monkeypatch.setattr(Trainer, "save", slow_save)
    main([*QUICK, "--out", str(tmp_path / "slow")])
    base, slow = summary(tmp_path / "base"), summary(tmp_path / "slow")
    assert slow["final_loss"] == base["final_loss"]  # the same run, only slower to save
    saves = 120 // 20
    assert slow["timed_s"] + saves * 1.5 <= slow["elapsed_s"]  # no sleep inside the timed spans
    assert slow["timed_steps"] == 120 - 10  # every step after the 10 warm-up steps
    assert slow["tokens_per_s"] == pytest.approx(
        slow["timed_steps"] * slow["tokens_per_step"] / slow["timed_s"]
    )
    # the wall figure did drop: every step's tokens over a span holding the saves' 9 s of sleeps
    # (nothing is bounded by the base run's figures: under make test's load two runs differed 3.8x)
    all_tokens = 120 * slow["tokens_per_step"]
    assert slow["wall_tokens_per_s"] == pytest.approx(all_tokens / slow["elapsed_s"])
    assert slow["wall_tokens_per_s"] <= all_tokens / (slow["timed_s"] + saves * 1.5)
    # the logged intervals too, against their own run's training throughput (a save inside
    # them would cut each to about a sixth: 0.3 s of steps + 1.5 s of sleep)
    slow_rows = [r["tokens_per_s"] for r in metrics(tmp_path / "slow")[2:]]
    assert statistics.median(slow_rows) > 0.4 * slow["tokens_per_s"], slow_rows


def test_the_device_is_synced_only_where_the_clock_pauses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_pause = StepClock.pause

    def pause(self: StepClock, step: int) -> None:
        synced.append(step)
        real_pause(self, step)

    monkeypatch.setattr(StepClock, "pause", pause)
    main(["--steps", "30", "--log-every", "10", "--checkpoint-every", "15", "--out", str(tmp_path)])
    assert synced == [1, 6, 10, 15, 20, 30]  # first step, warm-up end (30 // 5), logs, checkpoints


def test_a_training_step_reads_nothing_back_from_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA each of these would wait for the GPU; the step must queue work and return."""
    cfg = parse_config(["--out", str(tmp_path), "--grad-accum", "2", "--resume", "never"])
    data = open_data("synthetic", block_size=32, vocab_size=64, successors=4, seed=1)
    trainer = Trainer(cfg, DistEnv(0, 0, 1, 1, CPU), data)
    batches = trainer.batches(0, 5, prefetch=True, stream=0)
    reads: list[str] = []
    for name in ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"):
        real = getattr(torch.Tensor, name)

        def spy(self: torch.Tensor, *a: Any, _real: Any = real, _name: str = name) -> Any:
            reads.append(_name)
            return _real(self, *a)

        monkeypatch.setattr(torch.Tensor, name, spy)
    losses = [trainer.train_step(step, batches.next_step()) for step in range(5)]
    batches.close()
    monkeypatch.undo()
    assert reads == []
    assert losses[-1].item() < losses[0].item()


# ---------------------------------------------------------------- batches and prefetch


def cpu_batches(
    data: DataSource, shape: StepShape, start: int, stop: int, prefetch: bool
) -> Batches:
    return Batches(
        data,
        seed=7,
        rank=1,
        shape=shape,
        block=8,
        device=CPU,
        start=start,
        stop=stop,
        prefetch=prefetch,
    )


def test_a_steps_rows_do_not_depend_on_the_split_or_on_prefetch() -> None:
    data = open_data("synthetic", block_size=8, vocab_size=64, successors=4, seed=7)

    def rows(micro: int, prefetch: bool) -> list[torch.Tensor]:
        b = cpu_batches(data, StepShape(16, micro), 3, 8, prefetch)
        steps = []
        for _ in range(5):
            micro_batches = b.next_step()
            assert len(micro_batches) == 16 // micro
            steps.append(torch.cat([torch.cat([x, y[:, -1:]], dim=1) for x, y in micro_batches]))
        b.close()
        return steps

    reference = rows(16, prefetch=False)
    assert np.array_equal(reference[0].numpy(), data.batch(7, 3, 1, 16, 8))
    for micro, prefetch in ((16, True), (4, True), (4, False), (1, True)):
        assert all(torch.equal(a, b) for a, b in zip(rows(micro, prefetch), reference, strict=True))


def test_a_failure_on_the_prefetch_thread_surfaces_in_the_training_loop() -> None:
    class Broken:
        def sample(self, rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
            raise OSError("disk went away")

    data = DataSource("broken", Broken(), 64, None)  # type: ignore[arg-type]
    b = cpu_batches(data, StepShape(4, 4), 0, 9, prefetch=True)
    with pytest.raises(OSError, match="disk went away"):
        b.next_step()
    b.close()


def test_closing_early_stops_the_prefetch_thread() -> None:
    data = open_data("synthetic", block_size=8, vocab_size=64, successors=4, seed=0)
    b = cpu_batches(data, StepShape(4, 2), 0, 10**6, prefetch=True)
    b.next_step()
    b.close()
    assert b._thread is not None and not b._thread.is_alive()


# ---------------------------------------------------------------- micro-batch split


def test_auto_search_steps_down_on_out_of_memory_to_the_largest_divisor_that_fits() -> None:
    tried: list[int] = []
    cleaned: list[int] = []

    def attempt(size: int) -> None:
        tried.append(size)
        if size > 12:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} GiB")

    picked, too_big = largest_fitting(64, attempt, lambda: cleaned.append(len(tried)))
    assert (picked, too_big, tried, cleaned) == (8, [64, 32, 16], [64, 32, 16, 8], [1, 2, 3, 4])
    assert largest_fitting(48, attempt, lambda: None)[0] == 12  # divisors of 48: ..., 16, 12

    def broken(size: int) -> None:
        raise RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")

    with pytest.raises(RuntimeError, match="CUBLAS"):  # only running out of memory steps down
        largest_fitting(8, broken, lambda: None)


def test_auto_search_that_fits_nothing_is_one_clear_error() -> None:
    def attempt(size: int) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(InputError, match="--batch-size auto: even 1 sequence"):
        largest_fitting(4, attempt, lambda: None)


@pytest.mark.parametrize(
    ("argv", "world", "rows", "micro"),
    [
        ([], 1, 16, 16),  # tiny: 16 x 1
        (["--preset", "gpt2-124m"], 8, 64, 16),  # 16 x 4 per rank, whatever the world
        (["--preset", "gpt2-124m", "--tokens-per-step", "65536"], 1, 64, 16),
        (["--preset", "gpt2-124m", "--tokens-per-step", "524288"], 8, 64, 16),
        (["--preset", "gpt2-124m", "--tokens-per-step", "65536", "--batch-size", "64"], 1, 64, 64),
        (["--preset", "gpt2-124m", "--batch-size", "auto"], 2, 64, None),  # the preset's 16 x 4
    ],
)
def test_tokens_per_step_stay_what_was_asked(
    argv: list[str], world: int, rows: int, micro: int | None
) -> None:
    shape = fixed_shape(parse_config(argv), world)
    if micro is None:
        assert shape is None
    else:
        assert shape == StepShape(rows, micro) and shape.grad_accum == rows // micro


def test_auto_picks_the_largest_micro_batch_that_fits_and_keeps_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fixed = ["--steps", "30", "--log-every", "10", "--eval-batches", "2"]
    main([*fixed, "--out", str(tmp_path / "fixed")])
    monkeypatch.setattr(GPT, "forward", GPT.forward)  # restored after the test
    limit_forward(5)  # this "device" holds 5 sequences per forward
    main([*fixed, "--batch-size", "auto", "--out", str(tmp_path / "auto")])
    out = capsys.readouterr().out
    assert "batch-size auto: micro-batch 4 x grad-accum 4 = 16 sequences per step per rank; " in out
    assert "out of memory at 16, 8" in out
    auto, ref = summary(tmp_path / "auto"), summary(tmp_path / "fixed")
    assert (auto["micro_batch"], auto["grad_accum"], ref["micro_batch"]) == (4, 4, 16)
    assert auto["tokens_per_step"] == ref["tokens_per_step"] == 16 * 32
    # the same data and maths, only summed in another order
    assert auto["final_loss"] == pytest.approx(ref["final_loss"], rel=1e-4)


def test_two_ranks_run_the_smallest_micro_batch_either_found(tmp_path: Path) -> None:
    argv = torchrun_argv("tests.support.fake_oom_train", ["--batch-size", "auto", "--steps", "20"])
    done = run(argv, tmp_path, env={"FAKE_OOM_ABOVE": "8,4"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = summary(tmp_path)
    assert (s["micro_batch"], s["grad_accum"], s["world_size"]) == (4, 4, 2)  # rank 1's pick
    assert s["params_in_sync"] is True
    assert "micro-batch 4 x grad-accum 4 = 16 sequences per step per rank; out of memory at 16" in (
        done.stdout
    )


# ---------------------------------------------------------------- same maths, other kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_linear_cross_entropy_equals_the_plain_loss_and_gradients(
    dtype: torch.dtype,
) -> None:
    torch.manual_seed(0)
    x = torch.randn(300, 48, requires_grad=True)
    w = torch.randn(97, 48, requires_grad=True)
    t = torch.randint(97, (300,))
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        plain = F.cross_entropy(F.linear(x, w).float(), t)
        chunked = chunked_cross_entropy(x, w, t, rows=64)  # 300 rows: 4 full chunks + 44
    rtol, atol = (1e-5, 1e-6) if dtype == torch.float32 else (2e-2, 2e-3)
    torch.testing.assert_close(chunked, plain, rtol=rtol, atol=atol)
    grads = zip(
        torch.autograd.grad(2.5 * plain, (x, w)),
        torch.autograd.grad(2.5 * chunked, (x, w)),
        strict=True,
    )
    for a, b in grads:
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol)


def test_the_model_gives_the_same_loss_and_gradients_with_any_kernel_choice() -> None:
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    tokens = torch.randint(64, (4, 17), generator=torch.Generator().manual_seed(1))

    def loss_and_grads(**speed: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = GPT(cfg, **speed)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters() if p.grad is not None]

    ref_loss, ref_grads = loss_and_grads()
    for speed in ({"logits": "chunked"}, {"attention": "math"}, {"attention": "flash"}):
        loss, grads = loss_and_grads(**speed)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        for a, b in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # eval: the chunked model takes the plain path (no gradients to keep)
        torch.manual_seed(0)
        torch.testing.assert_close(
            GPT(cfg, logits="chunked")(tokens[:, :-1], tokens[:, 1:]), ref_loss
        )


def test_compile_settings() -> None:
    assert compile_kwargs(parse_config([]), CPU) is None  # auto: off on CPU
    assert compile_kwargs(parse_config(["--compile", "on"]), CPU) == {"dynamic": False}
    on = parse_config(["--compile", "on", "--compile-mode", "max-autotune"])
    assert compile_kwargs(on, torch.device("cuda", 0)) == {"dynamic": False, "mode": "max-autotune"}
    assert compile_kwargs(parse_config(["--compile", "off"]), torch.device("cuda", 0)) is None
