"""TensorBoard event files of a run (rank 0): train/loss, train/lr, train/tokens_per_s,
train/mfu, eval/loss by step, written with torch's SummaryWriter (the `tensorboard` package).

GPUTRAIN_TENSORBOARD_DIR picks where: a local directory, or gs://BUCKET/PREFIX (a stack's
bucket: Vertex AI TensorBoard or `tensorboard --logdir gs://...` read it), then the files are
written under <out>/tensorboard and copied there at every checkpoint and at the end. Unset:
<out>/tensorboard, which comes home with the results. No `tensorboard` package: one line, no files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

TENSORBOARD_DIR_ENV = "GPUTRAIN_TENSORBOARD_DIR"


class Board:
    def __init__(self, writer: Any, local: Path, remote: str | None) -> None:
        self.writer, self.local, self.remote = writer, local, remote

    @classmethod
    def open(cls, out: Path, is_main: bool, environ: dict[str, str] | None = None) -> Board | None:
        if not is_main:
            return None
        where = (os.environ if environ is None else environ).get(TENSORBOARD_DIR_ENV, "")
        remote = where if where.startswith("gs://") else None
        local = Path(where) if where and remote is None else out / "tensorboard"
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            print(f"tensorboard: no event files ({e}); pip install tensorboard", file=sys.stderr)
            return None
        return cls(SummaryWriter(log_dir=str(local)), local, remote)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        for name, value in values.items():
            if value is not None:
                self.writer.add_scalar(name, value, step)

    def flush(self) -> None:
        """Written to disk, and copied to the bucket when that is where they go."""
        self.writer.flush()
        if self.remote is not None:
            from trainer.storage import parse_gs_uri, upload_files

            try:
                upload_files(sorted(self.local.glob("events.out.tfevents.*")),
                             parse_gs_uri(self.remote, TENSORBOARD_DIR_ENV))  # fmt: skip
            except Exception as e:  # the events are a view of the run, never its failure
                print(f"tensorboard: could not copy to {self.remote}: {e}", file=sys.stderr)

    def close(self) -> None:
        self.flush()
        self.writer.close()
