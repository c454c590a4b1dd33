"""Each optimizer step's micro-batches on the device, optionally built ahead on a background thread.

A step's rows come from one draw (data.py), so they are the same whatever the micro-batch split.
With prefetch the host work of the next step (sampling, pinning) overlaps the current step, and the
copy to the GPU is non_blocking from pinned memory, so the loop itself does no host work that the
GPU would wait for.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import torch

from trainer.data import TRAIN, DataSource

Batch = tuple[torch.Tensor, torch.Tensor]  # inputs, targets: (micro_batch, block) each


@dataclass(frozen=True)
class StepShape:
    """How one optimizer step's sequences on a rank are split into micro-steps."""

    rows: int  # sequences per rank per optimizer step
    micro_batch: int

    @property
    def grad_accum(self) -> int:
        return self.rows // self.micro_batch


class Batches:
    """Steps `start`..`stop - 1` in order; call `next_step()` once per step, `close()` at the end."""

    def __init__(
        self,
        data: DataSource,
        *,
        seed: int,
        rank: int,
        shape: StepShape,
        block: int,
        device: torch.device,
        start: int,
        stop: int,
        prefetch: bool,
        stream: int = TRAIN,
    ) -> None:
        self.data, self.seed, self.rank, self.shape = data, seed, rank, shape
        self.block, self.device, self.stream = block, device, stream
        self.step, self.stop = start, stop
        self._ready: queue.Queue[torch.Tensor | BaseException] = queue.Queue(maxsize=2)
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        if prefetch and start < stop:
            self._thread = threading.Thread(target=self._fill, name="prefetch", daemon=True)
            self._thread.start()

    def host(self, step: int) -> torch.Tensor:
        """The step's (rows, block + 1) tokens in host memory, pinned when they go to a GPU."""
        tokens = torch.from_numpy(
            self.data.batch(self.seed, step, self.rank, self.shape.rows, self.block, self.stream)
        )
        return tokens.pin_memory() if self.device.type == "cuda" else tokens

    def _fill(self) -> None:
        try:
            for step in range(self.step, self.stop):
                if not self._offer(self.host(step)):
                    return
        except BaseException as e:  # handed to the training thread, which raises it
            self._offer(e)

    def _offer(self, item: torch.Tensor | BaseException) -> bool:
        """Queue `item` unless the loop has closed us; False when it has."""
        while not self._closed.is_set():
            try:
                self._ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def next_step(self) -> list[Batch]:
        """This step's micro-batches, on the device (the copy is queued, not waited for)."""
        if self.step >= self.stop:
            raise IndexError(f"no step {self.step}: batches end at {self.stop}")
        host = self.host(self.step) if self._thread is None else self._ready.get()
        if isinstance(host, BaseException):
            raise host
        self.step += 1
        tokens = host.to(self.device, non_blocking=True)
        return [(t[:, :-1], t[:, 1:]) for t in tokens.split(self.shape.micro_batch)]

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
