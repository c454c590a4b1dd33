"""Dataset copy (`copy` mode): a generated dataset of >= 1 GiB in many objects plus one object of
>= 256 MiB in the Cloud Storage emulator (gcp-storage-emulator, its own process), copied by
`python -m gputrain_node.fetch_data` into two node directories at once (two processes, as two nodes
would run it; `--hosts-dirs` names where), then again (cached), then compared in the same run
with a single-stream download of the same data (one object after another, each in one request).

The emulator is a single-process Python server: it serves requests on threads under one GIL and
on the same 2 cores as the downloaders, so it caps what parallel requests can gain here; the
figures say what this machine allows, not what Cloud Storage does.

    .venv/bin/python bench/data_copy.py [--small-mib 768] [--big-mib 256] [--objects 768]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gputrain_node import contract  # noqa: E402

BUCKET = "bench-data"
SERVER = """
import sys, time
from gcp_storage_emulator.server import create_server
s = create_server("127.0.0.1", 0, in_memory=True, default_bucket=sys.argv[1])
s.start()
print(s._api._httpd.server_address[1], flush=True)
while True:
    time.sleep(3600)
"""


def client(url: str):  # type: ignore[no-untyped-def]
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="bench", credentials=AnonymousCredentials(), client_options={"api_endpoint": url}
    )


def fill(url: str, objects: int, small_mib: int, big_mib: int) -> int:
    """`objects` objects sharing `small_mib` MiB, plus big.bin; returns the bytes in all."""
    b = client(url).bucket(BUCKET)
    each = (small_mib << 20) // objects
    block = os.urandom(each)
    for i in range(objects):
        b.blob(f"ds/shard-{i:05d}.bin").upload_from_string(block[i % 7 :] + block[: i % 7])
    b.blob("ds/big/big.bin").upload_from_string(os.urandom(big_mib << 20))
    return objects * each + (big_mib << 20)


def fetch_nodes(url: str, dirs: list[Path], spec: str) -> list[dict[str, float]]:
    """gputrain_node.fetch_data in one process per node directory, all at once."""
    env = {**os.environ, "STORAGE_EMULATOR_HOST": url, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", contract.FETCH_DATA, "--root", str(d), "--node", d.name, spec],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for d in dirs
    ]
    out = []
    for p in procs:
        text, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"fetch_data failed ({p.returncode}):\n{text[-2000:]}")
        out.append(json.loads(text.strip().splitlines()[-1].removeprefix("gputrain-data: ")))
    return out


def single_stream(url: str, dest: Path, prefix: str) -> tuple[float, int]:
    """One object after another, each in one request: the baseline."""
    c = client(url)
    start, total = time.monotonic(), 0
    for blob in c.list_blobs(BUCKET, prefix=prefix):
        f = dest / blob.name
        f.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(f))
        total += blob.size
    return time.monotonic() - start, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=768)
    p.add_argument("--small-mib", type=int, default=768, help="MiB shared by the many objects")
    p.add_argument("--big-mib", type=int, default=256)
    args = p.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, BUCKET], stdout=subprocess.PIPE, text=True
    )
    work = Path(tempfile.mkdtemp(prefix="gputrain-bench-data-"))
    try:
        url = f"http://127.0.0.1:{server.stdout.readline().strip()}"  # type: ignore[union-attr]
        t = time.monotonic()
        total = fill(url, args.objects, args.small_mib, args.big_mib)
        print(
            f"dataset: {args.objects} objects + 1 x {args.big_mib} MiB = "
            f"{total / (1 << 30):.2f} GiB in the emulator ({time.monotonic() - t:.0f} s to upload)"
        )
        print("nodes: two local directories, one fetch_data process each, at once")
        dirs = [work / "node-0", work / "node-1"]
        spec = f"train=gs://{BUCKET}/ds"
        for label in ("first", "cached"):
            for r in fetch_nodes(url, dirs, spec):
                mbs = r["downloaded_bytes"] / max(r["seconds"], 1e-9) / 1e6
                print(
                    f"  {label:6} {r['node']}: {r['seconds']:6.1f} s, "
                    f"{r['downloaded_bytes'] / (1 << 20):7.0f} MiB, {mbs:6.1f} MB/s, "
                    f"{r['cached_objects']} cached"
                )
        for d in dirs:
            shutil.rmtree(d)
        # The big object alone: sliced (fetch_data) vs one stream, one node, same run.
        big = f"big=gs://{BUCKET}/ds/big"
        [r] = fetch_nodes(url, [work / "big-sliced"], big)
        s_big, n_big = single_stream(url, work / "big-single", "ds/big/")
        sliced = n_big / r["seconds"] / 1e6
        single = n_big / s_big / 1e6
        print(
            f"big object ({n_big >> 20} MiB), one node: sliced {r['seconds']:.1f} s "
            f"({sliced:.1f} MB/s) vs single stream {s_big:.1f} s ({single:.1f} MB/s): "
            f"{sliced / single:.2f}x"
        )
        [r] = fetch_nodes(url, [work / "all-parallel"], spec)
        s_all, n_all = single_stream(url, work / "all-single", "ds/")
        print(
            f"whole dataset, one node: fetch_data {r['seconds']:.1f} s "
            f"({n_all / r['seconds'] / 1e6:.1f} MB/s) vs single stream {s_all:.1f} s "
            f"({n_all / s_all / 1e6:.1f} MB/s): {s_all / r['seconds']:.2f}x"
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
