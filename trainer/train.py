"""The reference DDP trainer: `python -m trainer.train --preset tiny`, alone or under torchrun.

Writes metrics.jsonl, summary.json and checkpoints to --out (and checkpoints to --checkpoint-uri).
SIGTERM or GCE's preemption notice checkpoints, finishes the upload and exits with status 143;
`--resume auto` then continues from the newest intact checkpoint.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import resource
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import get_error_handler, record

from trainer import checkpoint
from trainer.config import TrainConfig, parse_config
from trainer.data import DataSource, open_data, uniform_loss
from trainer.dist import DistEnv, all_gather, any_rank, setup, teardown
from trainer.errors import InputError
from trainer.mfu import flops_per_token, mfu, peak_tflops
from trainer.model import GPT, GPTConfig, padded_vocab, param_checksum
from trainer.preemption import StopRequest

PREEMPTED_EXIT = 143  # 128 + SIGTERM: stopped early on purpose, with a checkpoint to resume from
FINAL_UPLOAD_WAIT_S = 600.0  # at the normal end nothing kills us: wait for the last upload


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio · lr at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))) * (cfg.lr - floor)


def amp_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype != "auto":
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[cfg.dtype]
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else torch.float16


def make_optimizer(model: GPT, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; fused kernels on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda"
    )


def peak_mem_bytes(device: torch.device) -> int:
    """Device memory high-water mark on CUDA; the process's peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mean_over_ranks(env: DistEnv, value: torch.Tensor) -> float:
    if env.distributed:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= env.world_size
    return float(value.item())


class Trainer:
    """One training attempt: builds everything, resumes if it can, runs the loop, writes outputs."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, data: DataSource, stop: StopRequest) -> None:
        self.cfg, self.env, self.data, self.stop = cfg, env, data, stop
        self.device = env.device
        torch.manual_seed(cfg.seed)
        self.model_cfg = GPTConfig(
            cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, padded_vocab(data.vocab_size)
        )
        self.raw = GPT(self.model_cfg).to(self.device)
        self.optimizer = make_optimizer(self.raw, cfg, self.device)
        self.dtype = amp_dtype(cfg, self.device)
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
        compiled = cfg.compile == "on" or (cfg.compile == "auto" and self.device.type == "cuda")
        model: Any = torch.compile(self.raw) if compiled else self.raw
        if env.distributed:  # compile first, then DDP (nanoGPT); static_graph stays off
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=ids, gradient_as_bucket_view=True
            )
        self.model = model
        self.compiled = compiled
        self.flops_per_token = flops_per_token(self.model_cfg, self.raw.num_params())
        self.devices = all_gather(env, env.device_name)
        self.peak = peak_tflops(self.devices[0]) if self.device.type == "cuda" else None
        self.tokens_per_step = cfg.batch_size * cfg.block_size * cfg.grad_accum * env.world_size

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

    def batch(self, step: int, micro: int, stream: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        tokens = torch.from_numpy(
            self.data.batch(
                cfg.seed, step, self.env.rank, micro, cfg.batch_size, cfg.block_size, stream
            )
        )
        if self.device.type == "cuda":
            tokens = tokens.pin_memory().to(self.device, non_blocking=True)
        return tokens[:, :-1], tokens[:, 1:]

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def train_step(self, step: int) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches; gradients sync on the last only."""
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        total = torch.zeros((), device=self.device)
        for micro in range(cfg.grad_accum):
            if self.env.distributed:  # covers forward and backward (DDP reads it in forward)
                self.model.require_backward_grad_sync = micro == cfg.grad_accum - 1
            x, y = self.batch(step, micro)
            with self.autocast():
                loss = self.model(x, y) / cfg.grad_accum
            self.scaler.scale(loss).backward()
            total += loss.detach()
        if cfg.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.raw.parameters(), cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return total

    @torch.no_grad()
    def eval_loss(self) -> float | None:
        """Mean loss on held-out batches (their own random stream), on the uncompiled model."""
        if self.cfg.eval_batches == 0:
            return None
        self.raw.eval()
        total = torch.zeros((), device=self.device)
        for i in range(self.cfg.eval_batches):
            x, y = self.batch(i, 0, stream=1)
            with self.autocast():
                total += self.raw(x, y).float()
        self.raw.train()
        return mean_over_ranks(self.env, total / self.cfg.eval_batches)

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
        cfg, env = self.cfg, self.env
        metrics = Metrics(cfg.out / "metrics.jsonl", env.writes_files, keep_upto=self.start_step)
        restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        if env.is_main:
            floor = "unknown" if self.data.loss_floor is None else f"{self.data.loss_floor:.4f}"
            say(
                f"trainer: preset {cfg.preset}, {self.raw.num_params(False) / 1e6:.2f}M params, "
                f"data {self.data.name} (vocab {self.data.vocab_size}, loss floor {floor}), "
                f"world {env.world_size} x {self.devices[0]}, {self.dtype}, compile "
                f"{'on' if self.compiled else 'off'}, {self.tokens_per_step} tokens/step, out "
                f"{cfg.out}, start step {self.start_step}/{cfg.steps}, restart {restarts}"
            )
        t0 = last_t = time.perf_counter()
        last_step = self.start_step
        warm = min(10, (cfg.steps - self.start_step) // 5)
        warm_t, stopped = None, False
        for step in range(self.start_step, cfg.steps):
            loss = self.train_step(step)
            done = step + 1
            stopped = any_rank(env, self.stop.requested)
            if done == self.start_step + warm:
                self.sync()
                warm_t = time.perf_counter()
            if done % cfg.log_every == 0 or done in (self.start_step + 1, cfg.steps) or stopped:
                self.last_loss = mean_over_ranks(env, loss)  # syncs the device
                if self.initial_loss is None:
                    self.initial_loss = self.last_loss
                now = time.perf_counter()
                tps = (done - last_step) * self.tokens_per_step / (now - last_t)
                last_step, last_t = done, now
                metrics.log(self.record(done, tps, now - t0))
            if stopped:
                return self.stop_here(done)
            if done % cfg.checkpoint_every == 0 or done == cfg.steps:
                self.ckpt.save(done, self.state)
        self.sync()
        end = time.perf_counter()
        timed = cfg.steps - self.start_step - warm
        if warm_t is not None and timed > 0 and end > warm_t:
            tokens_per_s: float | None = timed * self.tokens_per_step / (end - warm_t)
        elif cfg.steps > self.start_step:
            tokens_per_s = (cfg.steps - self.start_step) * self.tokens_per_step / (end - t0)
        else:
            tokens_per_s = None
        self.write_summary(tokens_per_s, end - t0)
        self.ckpt.finish_uploads(FINAL_UPLOAD_WAIT_S)
        return 0

    def stop_here(self, step: int) -> int:
        """Every rank saw the stop after `step`: save, finish the upload (bounded), say why, 143."""
        started = time.perf_counter()
        self.ckpt.save(step, self.state)
        uploaded = self.ckpt.finish_uploads(self.cfg.upload_timeout_s)
        reasons = [r for r in all_gather(self.env, self.stop.reason) if r]
        if self.env.is_main:
            upload = {None: "", True: " and uploaded", False: ", upload unfinished,"}[uploaded]
            say(
                f"{reasons[0] if reasons else 'stop'}: stopped at step {step} with a checkpoint "
                f"(saved{upload} in {time.perf_counter() - started:.1f} s); resume with --resume auto"
            )
        return PREEMPTED_EXIT

    def record(self, step: int, tokens_per_s: float, elapsed: float) -> dict[str, Any]:
        fraction = mfu(tokens_per_s, self.flops_per_token, self.peak, self.env.world_size)
        mem = peak_mem_bytes(self.device)
        row = {
            "step": step,
            "loss": self.last_loss,
            "lr": lr_at(step - 1, self.cfg),
            "tokens_per_s": tokens_per_s,
            "mfu": fraction,
            "peak_mem_bytes": mem,
            "elapsed_s": elapsed,
        }
        if self.env.is_main:
            mfu_text = "n/a" if fraction is None else f"{100 * fraction:.1f}%"
            say(
                f"step {step:>6}/{self.cfg.steps} | loss {self.last_loss:.4f} | lr {row['lr']:.2e} | "
                f"{tokens_per_s / 1e3:.1f}k tok/s | mfu {mfu_text} | "
                f"mem {mem / 2**20:.0f} MiB | {elapsed:.1f} s"
            )
        return row

    def write_summary(self, tokens_per_s: float | None, elapsed: float) -> None:
        checksums = all_gather(self.env, param_checksum(self.raw))
        eval_loss = self.eval_loss()
        summary = {
            "final_loss": self.last_loss,
            "eval_loss": eval_loss,
            "loss_floor": self.data.loss_floor,
            "initial_loss": self.initial_loss,
            "uniform_loss": uniform_loss(self.data.vocab_size),
            "tokens_per_s": tokens_per_s,
            "mfu": None
            if tokens_per_s is None
            else mfu(tokens_per_s, self.flops_per_token, self.peak, self.env.world_size),
            "mfu_formula": "6N + 12·L·H·Q·T flops/token over the dense bf16 peak",
            "peak_tflops_per_device": self.peak,
            "devices": self.devices,
            "world_size": self.env.world_size,
            "steps": self.cfg.steps,
            "tokens_per_step": self.tokens_per_step,
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
            "compile": self.compiled,
        }
        if self.env.writes_files:
            write_json_atomic(self.cfg.out / "summary.json", summary)
        if self.env.is_main:
            say(
                f"done: loss {summary['initial_loss']:.4f} -> {summary['final_loss']:.4f} "
                f"(eval {eval_loss if eval_loss is None else round(eval_loss, 4)}, floor "
                f"{self.data.loss_floor}), {tokens_per_s or 0:.0f} tok/s, {elapsed:.1f} s"
            )
        if not summary["params_in_sync"]:
            raise RuntimeError(f"parameters differ across ranks after training: {checksums}")


class Metrics:
    """metrics.jsonl: one JSON object per logged step; a resume drops lines past its start step."""

    def __init__(self, path: Path, writes: bool, keep_upto: int) -> None:
        self.path, self.writes = path, writes
        if writes and path.exists():
            lines = path.read_text().splitlines()
            kept = [ln for ln in lines if ln.strip() and json.loads(ln)["step"] <= keep_upto]
            path.write_text("".join(ln + "\n" for ln in kept))

    def log(self, row: dict[str, Any]) -> None:
        if self.writes:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")


def write_json_atomic(path: Path, obj: object) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def say(line: str) -> None:
    print(line, flush=True)


def run(cfg: TrainConfig) -> int:
    """Data and device problems surface before the process group forms, on every rank alike."""
    data = open_data(
        cfg.data,
        block_size=cfg.block_size,
        vocab_size=cfg.vocab_size,
        successors=cfg.successors,
        seed=cfg.seed,
    )
    stop = StopRequest()
    with stop.handling(local_rank=int(os.environ.get("LOCAL_RANK", "0"))):
        env = setup(cfg.device, cfg.pg_timeout_s)
        cfg.out.mkdir(parents=True, exist_ok=True)
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


@record
def main(argv: list[str] | None = None) -> None:
    try:
        status = run(parse_config(argv))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        get_error_handler().record_exception(e)  # torchrun's root cause names the file too
        sys.exit(e.exit_code)
    if status:
        sys.exit(status)


if __name__ == "__main__":
    main()
