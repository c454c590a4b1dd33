"""The reference DDP trainer: `python -m trainer.train --preset tiny`, alone or under torchrun.

Writes metrics.jsonl, summary.json and checkpoints to --out (and checkpoints to --checkpoint-uri).
SIGTERM or GCE's preemption notice checkpoints, finishes the upload and exits with status 143;
`--resume auto` then continues from the newest intact checkpoint.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import get_error_handler, record

from trainer import checkpoint
from trainer.batches import Batch, Batches
from trainer.board import Board
from trainer.config import TrainConfig, parse_config
from trainer.data import EVAL, TRAIN, DataSource, open_data, uniform_loss
from trainer.dist import DistEnv, all_gather, max_rank, setup, teardown
from trainer.errors import DivergedError, InputError
from trainer.heartbeat import Heartbeat
from trainer.memory import check_fits
from trainer.metrics import (
    Metrics,
    StepClock,
    interval_line,
    peak_mem_bytes,
    say,
    throughput,
    write_json_atomic,
)
from trainer.mfu import flops_per_token, mfu, peak_tflops
from trainer.microbatch import fixed_shape, plan_step
from trainer.model import GPT, GPTConfig, padded_vocab, param_checksum
from trainer.preemption import CHECKPOINT, STOP, StopRequest
from trainer.step import (
    CUDA_GRAPH_MODES,
    amp_dtype,
    autocast,
    check_cuda_graphs,
    check_speed_settings,
    compile_kwargs,
    lr_at,
    make_optimizer,
    prefetching,
    to_float8,
)

PREEMPTED_EXIT = 143  # 128 + SIGTERM: stopped early on purpose, with a checkpoint to resume from
FINAL_UPLOAD_WAIT_S = 600.0  # at the normal end nothing kills us: wait for the last upload


def mean_over_ranks(env: DistEnv, value: torch.Tensor) -> float:
    if env.distributed:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= env.world_size
    return float(value.item())


class Trainer:
    """One training attempt: builds everything, resumes if it can, runs the loop, writes outputs."""

    def __init__(
        self, cfg: TrainConfig, env: DistEnv, data: DataSource, stop: StopRequest | None = None
    ) -> None:
        self.started = time.perf_counter()
        self.board: Board | None = None  # TensorBoard events (rank 0), opened by run()
        self.cfg, self.env, self.data = cfg, env, data
        self.stop = stop or StopRequest()  # set by SIGTERM or the preemption watcher
        self.device = env.device
        self.dtype = amp_dtype(cfg, self.device)
        check_speed_settings(cfg, self.device, self.dtype)
        check_fits(
            cfg, padded_vocab(data.vocab_size), self.device, self.dtype, env.local_world_size
        )
        torch.manual_seed(cfg.seed)
        self.model_cfg = GPTConfig(
            cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, padded_vocab(data.vocab_size)
        )
        self.raw = GPT(self.model_cfg, cfg.attention, cfg.logits).to(self.device)
        if cfg.fp8 == "on":
            to_float8(self.raw)
        self.optimizer = make_optimizer(self.raw, cfg, self.device)
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=self.dtype == torch.float16 and self.device.type == "cuda"
        )
        self.start_step = 0
        self.initial_loss: float | None = None
        self.last_loss: float | None = None
        self.ckpt = checkpoint.Checkpoints(env, cfg.out, cfg.keep_checkpoints, cfg.checkpoint_uri)
        state = self.ckpt.resume(cfg.resume)
        if state is not None:
            self.restore(state)
        self.compile = compile_kwargs(cfg, self.device)
        model: Any = self.raw if self.compile is None else torch.compile(self.raw, **self.compile)
        # auto tries sizes on the code that will run (compiled code needs less memory than eager),
        # except with CUDA graphs, whose recordings would outlive a failed try
        self.cuda_graphs = (self.compile or {}).get("mode") in CUDA_GRAPH_MODES
        self.shape = plan_step(
            cfg, env, self.raw if self.cuda_graphs else model, self.optimizer, self.autocast
        )
        check_cuda_graphs(self.compile, self.shape)
        if env.distributed and self.compile is not None and cfg.batch_size == "auto":
            torch._dynamo.reset()  # compile again under DDP, which splits graphs at its buckets
        if env.distributed:  # compile first, then DDP (nanoGPT); static_graph stays off
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=ids, gradient_as_bucket_view=True
            )
        self.model = model
        self.flops_per_token = flops_per_token(self.model_cfg, self.raw.num_params())
        self.devices = all_gather(env, env.device_name)
        self.peak = peak_tflops(self.devices[0]) if self.device.type == "cuda" else None
        self.tokens_per_step = self.shape.rows * cfg.block_size * env.world_size

    def restore(self, state: dict[str, Any]) -> None:
        if state["model_config"] != asdict(self.model_cfg):
            raise InputError(
                f"checkpoint at step {state['step']} in {self.cfg.out} is for model "
                f"{state['model_config']}, not {asdict(self.model_cfg)} "
                "(use another --out or --resume never)"
            )
        self.raw.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.start_step = int(state["step"])
        self.initial_loss, self.last_loss = state["initial_loss"], state["last_loss"]

    def batches(self, start: int, stop: int, prefetch: bool, stream: int) -> Batches:
        return Batches(
            self.data,
            seed=self.cfg.seed,
            rank=self.env.rank,
            shape=self.shape,
            block=self.cfg.block_size,
            device=self.device,
            start=start,
            stop=stop,
            prefetch=prefetch,
            stream=stream,
        )

    def autocast(self) -> Any:
        return autocast(self.device, self.dtype)

    def train_step(self, step: int, micro_batches: list[Batch]) -> torch.Tensor:
        """One optimizer step over the micro-batches; gradients sync on the last only."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, self.cfg)
        total = torch.zeros((), device=self.device)
        for micro, (x, y) in enumerate(micro_batches):
            if self.env.distributed:  # covers forward and backward (DDP reads it in forward)
                self.model.require_backward_grad_sync = micro == len(micro_batches) - 1
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are dead
            with self.autocast():
                loss = self.model(x, y) / len(micro_batches)
            self.scaler.scale(loss).backward()
            total += loss.detach()
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.raw.parameters(), self.cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return total

    @torch.no_grad()
    def eval_loss(self) -> float | None:
        """Mean loss on held-out batches (their own random stream), on the uncompiled model."""
        n = self.cfg.eval_batches
        if n == 0:
            return None
        self.raw.eval()
        batches = self.batches(0, n, prefetch=False, stream=EVAL)
        total = torch.zeros((), device=self.device)
        for _ in range(n):
            for x, y in batches.next_step():
                with self.autocast():
                    total += self.raw(x, y).float()
        self.raw.train()
        return mean_over_ranks(self.env, total / (n * self.shape.grad_accum))

    def state(self, step: int) -> dict[str, Any]:
        return {
            "step": step,
            "model": self.raw.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "model_config": asdict(self.model_cfg),
            "initial_loss": self.initial_loss,
            "last_loss": self.last_loss,
            "data": self.data.name,
            "seed": self.cfg.seed,
        }

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self) -> int:
        """The loop. The device is synced only where the clock pauses: log, checkpoint, warm-up end."""
        cfg, env = self.cfg, self.env
        metrics = Metrics(cfg.out / "metrics.jsonl", env.writes_files, keep_upto=self.start_step)
        if env.is_main:
            say(self.banner())
        warmup_until = self.start_step + min(10, (cfg.steps - self.start_step) // 5)
        clock = StepClock(self.start_step, warmup_until)
        batches = self.batches(self.start_step, cfg.steps, prefetching(cfg, self.device), TRAIN)
        heartbeat = Heartbeat()
        self.board = Board.open(cfg.out, env.is_main)
        try:
            clock.resume()
            for step in range(self.start_step, cfg.steps):
                loss = self.train_step(step, batches.next_step())
                heartbeat.beat()
                done = step + 1
                asked = self.stop.checkpoints_asked
                signal = max_rank(env, self.stop.code)  # one all-reduce: stop, save now, or on
                stopped = signal == STOP
                log = done % cfg.log_every == 0 or done in (self.start_step + 1, cfg.steps)
                save = done % cfg.checkpoint_every == 0 or done == cfg.steps
                if signal == CHECKPOINT:  # a maintenance notice on some node: save at this step
                    save, self.stop.checkpoints_taken = True, asked
                    if env.is_main:
                        say(f"maintenance notice: checkpoint at step {done}, training on")
                if log or save or stopped or done == warmup_until:
                    self.sync()
                    clock.pause(done)
                    if log or stopped:
                        self.log(metrics, done, loss, clock)
                    if stopped:
                        return self.stop_here(done)
                    if save:
                        self.save(done)
                        if self.board:
                            self.board.flush()
                    clock.resume()
        finally:
            batches.close()
        self.write_summary(clock)
        self.ckpt.finish_uploads(FINAL_UPLOAD_WAIT_S)
        return 0

    def save(self, step: int) -> None:
        self.ckpt.save(step, self.state)

    def stop_here(self, step: int) -> int:
        """Every rank saw the stop after `step`: save, finish the upload (bounded), say why, 143."""
        started = time.perf_counter()
        self.save(step)
        if self.board:
            self.board.close()
        uploaded = self.ckpt.finish_uploads(self.cfg.upload_timeout_s)
        reasons = [r for r in all_gather(self.env, self.stop.reason) if r]
        if self.env.is_main:
            upload = {None: "", True: " and uploaded", False: ", upload unfinished,"}[uploaded]
            say(
                f"{reasons[0] if reasons else 'stop'}: stopped at step {step} with a checkpoint "
                f"(saved{upload} in {time.perf_counter() - started:.1f} s); resume with --resume auto"
            )
        return PREEMPTED_EXIT

    def banner(self) -> str:
        cfg, restarts = self.cfg, os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        floor = "unknown" if self.data.loss_floor is None else f"{self.data.loss_floor:.4f}"
        compiled = "off" if self.compile is None else f"on ({cfg.compile_mode})"
        return (
            f"trainer: preset {cfg.preset}, {self.raw.num_params(False) / 1e6:.2f}M params, "
            f"data {self.data.name} (vocab {self.data.vocab_size}, loss floor {floor}), "
            f"world {self.env.world_size} x {self.devices[0]}, {self.dtype}, compile {compiled}, "
            f"{self.tokens_per_step} tokens/step ({self.shape.micro_batch} x "
            f"{self.shape.grad_accum} x {cfg.block_size} per rank), attention {cfg.attention}, "
            f"logits {cfg.logits}, fp8 {cfg.fp8}, prefetch {'on' if prefetching(cfg, self.device) else 'off'}, "
            f"out {cfg.out}, start step {self.start_step}/{cfg.steps}, restart {restarts}"
        )

    def log(self, metrics: Metrics, step: int, loss: torch.Tensor, clock: StepClock) -> None:
        """Rank 0's line and a metrics.jsonl row: loss now, tokens/s over the interval's steps."""
        self.last_loss = mean_over_ranks(self.env, loss)
        if not math.isfinite(self.last_loss):  # the same on every rank: all stop alike
            raise DivergedError(
                f"the loss is {self.last_loss} at step {step} (--lr {self.cfg.lr}); training "
                "diverged: lower --lr, raise --warmup-steps or keep --grad-clip on"
            )
        if self.initial_loss is None:
            self.initial_loss = self.last_loss
        steps, seconds = clock.take_interval()
        tokens_per_s = steps * self.tokens_per_step / seconds
        row = {
            "step": step,
            "loss": self.last_loss,
            "lr": lr_at(step - 1, self.cfg),
            "tokens_per_s": tokens_per_s,
            "mfu": self.mfu(tokens_per_s),
            "peak_mem_bytes": peak_mem_bytes(self.device),
            "elapsed_s": time.perf_counter() - self.started,
        }
        metrics.log(row)
        if self.board:
            self.board.scalars(
                step, {f"train/{k}": row[k] for k in ("loss", "lr", "tokens_per_s", "mfu")}
            )
        if self.env.is_main:
            say(interval_line(row, self.cfg.steps))

    def write_summary(self, clock: StepClock) -> None:
        """summary.json: steady-state throughput (timed steps only) and, labelled, the wall clock."""
        checksums = all_gather(self.env, param_checksum(self.raw))
        eval_loss = self.eval_loss()
        elapsed = time.perf_counter() - self.started
        figures = throughput(
            clock, self.tokens_per_step, self.cfg.steps - self.start_step, elapsed, self.mfu
        )
        summary = {
            "final_loss": self.last_loss,
            "eval_loss": eval_loss,
            "loss_floor": self.data.loss_floor,
            "initial_loss": self.initial_loss,
            "uniform_loss": uniform_loss(self.data.vocab_size),
            **figures,
            "mfu_formula": "6N + 12·L·H·Q·T flops/token over the dense bf16 peak",
            "peak_tflops_per_device": self.peak,
            "devices": self.devices,
            "world_size": self.env.world_size,
            "steps": self.cfg.steps,
            "tokens_per_step": self.tokens_per_step,
            "micro_batch": self.shape.micro_batch,
            "grad_accum": self.shape.grad_accum,
            "elapsed_s": elapsed,
            "resumed_from": self.start_step or None,
            "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            "params": self.raw.num_params(False),
            "param_checksums": checksums,
            "params_in_sync": len(set(checksums)) == 1,
            "peak_mem_bytes": peak_mem_bytes(self.device),
            "data": self.data.name,
            "preset": self.cfg.preset,
            "dtype": str(self.dtype).removeprefix("torch."),
            "compile": self.compile is not None,
            "compile_mode": self.cfg.compile_mode if self.compile is not None else None,
            "attention": self.cfg.attention,
            "fp8": self.cfg.fp8,
            "logits": self.cfg.logits,
            "prefetch": prefetching(self.cfg, self.device),
        }
        if self.env.writes_files:
            write_json_atomic(self.cfg.out / "summary.json", summary)
        if self.board:
            self.board.scalars(self.cfg.steps, {"eval/loss": eval_loss})
            self.board.close()
        if self.env.is_main:
            say(
                f"done: loss {summary['initial_loss']:.4f} -> {summary['final_loss']:.4f} "
                f"(eval {eval_loss if eval_loss is None else round(eval_loss, 4)}, floor "
                f"{'unknown' if self.data.loss_floor is None else f'{self.data.loss_floor:.4f}'}), {figures['tokens_per_s'] or 0:.0f} tok/s over "
                f"{clock.steady_steps} timed steps, {figures['wall_tokens_per_s'] or 0:.0f} tok/s "
                f"wall-clock, {elapsed:.1f} s"
            )
        if not summary["params_in_sync"]:
            raise RuntimeError(f"parameters differ across ranks after training: {checksums}")

    def mfu(self, tokens_per_s: float) -> float | None:
        return mfu(tokens_per_s, self.flops_per_token, self.peak, self.env.world_size)


def run(cfg: TrainConfig) -> int:
    """Data and device problems surface before the process group forms, on every rank alike."""
    data = open_data(
        cfg.data,
        block_size=cfg.block_size,
        vocab_size=cfg.vocab_size,
        successors=cfg.successors,
        seed=cfg.seed,
    )
    fixed_shape(cfg, int(os.environ.get("WORLD_SIZE", "1")))  # a bad step size fails here too
    stop = StopRequest()
    with stop.handling(local_rank=int(os.environ.get("LOCAL_RANK", "0"))):
        make_out_dir(cfg)
        env = setup(cfg.device, cfg.pg_timeout_s)
        if env.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # The CPU path is for tests and demos with tiny models, where intra-op threads only add
            # sync overhead: on a loaded 2-core machine 2 threads ran the tiny preset 20x slower.
            torch.set_num_threads(1)
        if env.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        trainer = Trainer(cfg, env, data, stop)
        status = trainer.run()
        del trainer  # no DDP reducer may outlive the process group
        gc.collect()
        teardown(env)
    return status


def make_out_dir(cfg: TrainConfig) -> None:
    """--out, created before the process group forms; a place it cannot be is one line."""
    try:
        cfg.out.mkdir(parents=True, exist_ok=True)
        probe = cfg.out / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise InputError(
            f"--out {cfg.out}: cannot write there ({e.strerror or e}); use a writable directory"
        ) from None


@record
def main(argv: list[str] | None = None) -> None:
    try:
        status = run(parse_config(argv))
    except (InputError, DivergedError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        get_error_handler().record_exception(e)  # torchrun's root cause names the file too
        sys.exit(e.exit_code)
    if status:
        sys.exit(status)


if __name__ == "__main__":
    main()
