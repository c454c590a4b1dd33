"""What a Cloud Storage checkpoint costs the training loop, and how long the upload runs behind it.

Saves a state of --mb megabytes the way the trainer does (local atomic write, then a background
upload with manifest), against the Cloud Storage emulator on loopback. The loop only waits for the
local write and the hand-off; the upload and the verified download are this machine's and the
emulator's speed, not GCS's (no GCP here): read them as our overhead, not as network figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' emulator helper

from tests.support.gcs_emulator import GcsEmulator
from trainer import checkpoint
from trainer.storage import CheckpointStore, GsUri, Uploader


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mb", type=int, default=256, help="checkpoint size in MB")
    args = p.parse_args()
    state = {
        "step": 100,
        "model": {"w": torch.randn(args.mb * 2**20 // 4)},
        "optimizer": {},
        "model_config": {},
    }
    with GcsEmulator() as gcs, tempfile.TemporaryDirectory() as tmp:
        os.environ["STORAGE_EMULATOR_HOST"] = gcs.url
        out = Path(tmp)
        store = CheckpointStore(GsUri(gcs.bucket_name, "runs/bench/"))
        uploader = Uploader(store, keep=2)
        t0 = time.perf_counter()
        path = checkpoint.save(out, state, keep=2)
        t1 = time.perf_counter()
        size = path.stat().st_size / 1e6
        uploader.submit(path, 100)
        t2 = time.perf_counter()
        assert uploader.wait(600) and not uploader.failures, uploader.failures
        t3 = time.perf_counter()
        (remote,), _ = store.complete()
        store.download(remote, out / "downloaded.pt")
        t4 = time.perf_counter()
    print(f"checkpoint {size:.0f} MB (emulator on loopback, 2-core machine)")
    print(f"  training waits: local write {t1 - t0:.2f} s + upload hand-off {t2 - t1:.4f} s")
    print(f"  background upload + manifest: {t3 - t2:.2f} s ({size / (t3 - t2):.0f} MB/s)")
    print(f"  resume: list, download and verify crc32c: {t4 - t3:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
