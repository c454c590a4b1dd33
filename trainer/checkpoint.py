"""Checkpoints without a shared filesystem: local rank 0 of every node writes, global rank 0 also
uploads to Cloud Storage, and a resume agrees on the newest one that is intact somewhere.

DDP state is replicated, so every node's local rank 0 writes the same file into its own out dir
(atomically: temp file + rename) and keeps the last K. With a `gs://` URI, global rank 0 uploads
each one in the background (see trainer.storage). On resume all ranks agree on the newest step that
any node or the bucket has; ranks whose node has that file load it, the others receive it by
broadcast (a node replaced after a preemption comes back with an empty out dir). A copy that is
truncated or foreign is skipped, with the reason, in favour of another copy or an older step.
"""

from __future__ import annotations

import os
import pickle
import re
import socket
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.dist import DistEnv, all_gather
from trainer.errors import CorruptCheckpoint, InputError
from trainer.storage import CheckpointStore, RemoteCheckpoint, Uploader, parse_gs_uri

NAME = re.compile(r"^ckpt-(\d{8})\.pt$")
REQUIRED = ("step", "model", "optimizer", "model_config")


def checkpoint_path(out: Path, step: int) -> Path:
    return out / f"ckpt-{step:08d}.pt"


def list_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(step, path) of finished checkpoints in `out`, oldest first (temp files are ignored)."""
    found = [(int(m.group(1)), p) for p in out.glob("ckpt-*.pt") if (m := NAME.match(p.name))]
    return sorted(found)


def save(out: Path, state: dict[str, Any], keep: int) -> Path:
    path = checkpoint_path(out, int(state["step"]))
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)
    for _, old in list_checkpoints(out)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load(path: Path) -> dict[str, Any]:
    """A trainer checkpoint, loaded with weights_only=True; anything else is CorruptCheckpoint."""
    try:
        if not zipfile.is_zipfile(path):  # torch.save writes zip archives; a cut one has no index
            raise ValueError
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's message would suggest weights_only=False: never
        raise CorruptCheckpoint(
            f"checkpoint {path} is not a gputrain checkpoint: it holds Python objects other than "
            "tensors and plain data, so it was not loaded"
        ) from None
    except Exception:
        size = path.stat().st_size if path.exists() else 0
        raise CorruptCheckpoint(
            f"checkpoint {path} cannot be read: truncated or not a gputrain checkpoint "
            f"({size} bytes, not a complete PyTorch archive)"
        ) from None
    missing = [k for k in REQUIRED if not isinstance(state, dict) or k not in state]
    if missing:
        raise CorruptCheckpoint(
            f"checkpoint {path} is not a gputrain trainer checkpoint: it has no {', '.join(missing)}"
        )
    return dict(state)


class Checkpoints:
    """This run's checkpoints: --out on every node, and the bucket from global rank 0."""

    def __init__(self, env: DistEnv, out: Path, keep: int, uri: str | None) -> None:
        self.env, self.out, self.keep = env, out, keep
        self.store: CheckpointStore | None = None
        self.uploader: Uploader | None = None
        problem = None
        if uri and env.is_main:
            try:
                self.store = CheckpointStore.open(
                    parse_gs_uri(uri, "--checkpoint-uri"), "--checkpoint-uri"
                )
                self.uploader = Uploader(self.store, keep)
            except InputError as e:
                problem = str(e)
        problems = [p for p in all_gather(env, problem) if p]
        if problems:  # every rank stops alike, none waits in a collective for rank 0
            raise InputError(problems[0])

    def save(self, step: int, state: Callable[[int], dict[str, Any]]) -> None:
        """Local write on every node, upload queued on rank 0; returns when every node has
        written, so nobody exits (and gets a writer killed) before it is done."""
        if self.env.writes_files:
            path = save(self.out, state(step), self.keep)
            if self.uploader is not None:
                self.uploader.submit(path, step)
            if self.env.is_main:
                print(f"checkpoint {path}", flush=True)
        self.barrier()

    def finish_uploads(self, timeout_s: float) -> bool | None:
        """Wait (rank 0, at most `timeout_s`) until the newest checkpoint is in the bucket; every
        rank waits with it, since torchrun stops the others as soon as one rank exits.
        None without a bucket, else whether the uploads finished in time."""
        done = None
        if self.uploader is not None:
            done = self.uploader.wait(timeout_s)
            if not done:
                print(
                    f"checkpoint upload still running after {timeout_s:.0f} s: not waiting longer",
                    flush=True,
                )
        self.barrier()
        return done

    def barrier(self) -> None:
        if self.env.distributed:
            dist.barrier(group=self.env.control)

    def resume(self, resume: str) -> dict[str, Any] | None:
        """The state to continue from: `never`, `auto` (newest intact anywhere) or a file path."""
        if resume == "never":
            return None
        if resume != "auto":
            return load(Path(resume))
        local = dict(list_checkpoints(self.out))
        remote: dict[int, RemoteCheckpoint] = {}
        failed = None
        if self.store is not None:
            try:
                found, problems = self.store.complete()
            except Exception as e:  # rank 0 alone would fail; the others would wait for it
                found, problems = [], []
                failed = f"--checkpoint-uri {self.store.uri}: cannot list it ({e})"
            remote = {c.step: c for c in found}
            for problem in problems:
                print(f"resume: skipped {problem}", flush=True)
        known = all_gather(self.env, (sorted(local), sorted(remote), failed))
        if known[0][2]:
            raise InputError(known[0][2])
        in_bucket = set(known[0][1])
        steps = sorted({s for mine, theirs, _ in known for s in (*mine, *theirs)}, reverse=True)
        for step in steps:
            state, ok = self.agree(self.try_local(local.get(step)))
            if not any(ok) and step in in_bucket:
                state, ok = self.agree(self.try_remote(remote.get(step)))
            if any(ok):
                return self.share(state, ok)
        if steps:
            raise InputError(
                f"--resume auto: no usable checkpoint in {self.out}"
                + (f" or {self.store.uri}" if self.store else "")
                + " (each one found was skipped, see above); use --resume never to start over"
            )
        return None

    def try_local(self, path: Path | None) -> tuple[dict[str, Any] | None, str | None]:
        if path is None:
            return None, None
        try:
            return load(path), None
        except CorruptCheckpoint as e:
            return None, f"{e} (on {socket.gethostname()})"

    def try_remote(self, ckpt: RemoteCheckpoint | None) -> tuple[dict[str, Any] | None, str | None]:
        if self.store is None or ckpt is None:
            return None, None
        dest = self.out / ckpt.name.rsplit("/", 1)[-1]
        try:
            self.store.download(ckpt, dest)
            state = load(dest)
        except CorruptCheckpoint as e:
            return None, str(e)
        except Exception as e:  # the network, not the checkpoint: still an answer for the others
            return None, f"{self.store.object_uri(ckpt.name)}: download failed ({e})"
        print(
            f"resume: step {ckpt.step} downloaded from {self.store.object_uri(ckpt.name)}",
            flush=True,
        )
        return state, None

    def agree(
        self, attempt: tuple[dict[str, Any] | None, str | None]
    ) -> tuple[dict[str, Any] | None, list[bool]]:
        """Which ranks hold a usable copy; rank 0 says once per copy why one was skipped."""
        state, why = attempt
        results = all_gather(self.env, (state is not None, why))
        if self.env.is_main:
            for reason in dict.fromkeys(r for _, r in results if r):
                print(f"resume: skipped {reason}", flush=True)
        return state, [ok for ok, _ in results]

    def share(self, state: dict[str, Any] | None, ok: list[bool]) -> dict[str, Any]:
        """Ranks without a copy receive it from the lowest rank that has one."""
        if not all(ok):
            box = [state if self.env.rank == ok.index(True) else None]
            dist.broadcast_object_list(box, src=ok.index(True), group=self.env.control)
            state = box[0]
        assert state is not None
        return state
