"""`python -m gputrain_node.fetch_data --root DIR NAME=gs://BUCKET/PREFIX ...`: every node copies its
datasets out of Cloud Storage before torchrun starts.

Many objects at once and large objects in slices (google-cloud-storage's transfer_manager), each
verified (size and CRC32C) into a `.part` file renamed into place; what is there already with the
object's generation is kept (a manifest per dataset), so a repeat run, a kept cluster or a
re-created node downloads only what changed; files no longer in the bucket are removed. The sizes
are listed first and a disk that cannot hold the download is refused before any byte moves (exit
3). Progress lines every few seconds; the last line is `gputrain-data: {json}` for the controller.
Stands alone (the nodes run it from the uploaded trainer package); honours STORAGE_EMULATOR_HOST.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = ".gputrain-data.json"
RESULT_PREFIX = "gputrain-data: "
EXIT_NO_SPACE = 3
EXIT_UNREADABLE = 4
#: objects at least this big are downloaded in slices (ranged reads at once), smaller ones whole
DEFAULT_SLICE_MIB = 32
DEFAULT_WORKERS = 16
RESERVE_BYTES = 1 << 30  # left free on the disk for checkpoints, logs and the OS
CHUNK = 1 << 20


@dataclass(frozen=True)
class Remote:
    """One object of a dataset (relative path under the prefix)."""

    path: str
    name: str
    size: int
    generation: int
    crc32c: str | None


@dataclass(frozen=True)
class Plan:
    """What to fetch for one dataset and what to delete; bytes to download and kept."""

    name: str
    uri: str
    dest: Path
    remote: tuple[Remote, ...]
    fetch: tuple[Remote, ...]
    stale: tuple[str, ...]

    @property
    def total_bytes(self) -> int:
        return sum(r.size for r in self.remote)

    @property
    def fetch_bytes(self) -> int:
        return sum(r.size for r in self.fetch)


class FetchError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def parse_spec(spec: str) -> tuple[str, str, str]:
    """NAME=gs://BUCKET/PREFIX[:copy] -> (name, bucket, prefix ending in '/' or '')."""
    name, _, uri = spec.partition("=")
    if uri.endswith(":copy"):
        uri = uri[: -len(":copy")]
    if not name or not uri.startswith("gs://"):
        raise FetchError(f"dataset {spec!r}: expected NAME=gs://BUCKET/PREFIX", 2)
    bucket, _, prefix = uri[len("gs://") :].partition("/")
    prefix = prefix.strip("/")
    return name, bucket, f"{prefix}/" if prefix else ""


def crc32c_b64(path: Path) -> str:
    """The object metadata's form: base64 of the big-endian CRC32C."""
    import google_crc32c

    c = google_crc32c.Checksum()
    with open(path, "rb") as f:
        while block := f.read(8 * CHUNK):
            c.update(block)
    return base64.b64encode(c.digest()).decode()


def manifest_path(dest: Path) -> Path:
    """Beside the dataset's directory, so the job's listing of it holds only the data."""
    return dest.parent / f".{dest.name}{MANIFEST}"


def read_manifest(dest: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(manifest_path(dest).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def plan_dataset(name: str, uri: str, dest: Path, remote: Sequence[Remote]) -> Plan:
    """Pure but for stat(): an object is fetched unless the manifest holds its generation and
    the file has its size; local files the bucket no longer has are stale."""
    have = read_manifest(dest)
    fetch = []
    for r in remote:
        entry = have.get(r.path)
        f = dest / r.path
        same = (
            isinstance(entry, dict)
            and entry.get("generation") == r.generation
            and f.is_file()
            and f.stat().st_size == r.size
        )
        if not same:
            fetch.append(r)
    wanted = {r.path for r in remote}
    stale = tuple(sorted(p for p in have if p not in wanted))
    return Plan(name, uri, dest, tuple(remote), tuple(fetch), stale)


def list_remote(client: Any, bucket: str, prefix: str) -> list[Remote]:
    from google.api_core import exceptions as gexc

    try:
        blobs = list(client.list_blobs(bucket, prefix=prefix))
    except gexc.NotFound as e:
        raise FetchError(f"gs://{bucket} does not exist ({e.message})", EXIT_UNREADABLE) from e
    except gexc.GoogleAPICallError as e:
        raise FetchError(
            f"cannot list gs://{bucket}/{prefix}: {e.code} {e.message}", EXIT_UNREADABLE
        ) from e
    found = []
    for b in blobs:
        rel = b.name[len(prefix) :]
        if not rel or rel.endswith("/"):  # folder placeholders
            continue
        if any(part in ("", ".", "..") for part in rel.split("/")):
            raise FetchError(f"gs://{bucket}/{b.name}: an object name that is not a safe path")
        found.append(Remote(rel, b.name, int(b.size or 0), int(b.generation), b.crc32c))
    if not found:
        raise FetchError(f"no objects under gs://{bucket}/{prefix}", EXIT_UNREADABLE)
    return found


def check_space(plans: Sequence[Plan], node: str, reserve: int = RESERVE_BYTES) -> None:
    """Refuse before downloading when the disk under the first dataset cannot hold it all."""
    need = sum(p.fetch_bytes for p in plans)
    if not plans or need == 0:
        return
    disk = plans[0].dest
    while not disk.exists():
        disk = disk.parent
    free = shutil.disk_usage(disk).free
    if need + reserve > free:
        raise FetchError(
            f"node {node}: the datasets need {_gib(need)} to download "
            f"({', '.join(f'{p.name} {_gib(p.fetch_bytes)}' for p in plans if p.fetch)}) but "
            f"{disk} has {_gib(free)} free (and {_gib(reserve)} stays free): use a bigger disk "
            "(bootDiskGb), local SSD, or `mount` mode",
            EXIT_NO_SPACE,
        )


class Progress:
    """Bytes done of a total, printed every `every_s` seconds from any thread."""

    def __init__(self, node: str, total: int, every_s: float = 2.0) -> None:
        self.node, self.total, self.every_s = node, total, every_s
        self.done = 0
        self.start = time.monotonic()
        self._last = self.start
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            if now - self._last >= self.every_s:
                self._last = now
                self.say()

    def say(self) -> None:
        rate = self.done / max(time.monotonic() - self.start, 1e-6)
        print(
            f"data: {self.node}: {_mib(self.done)} of {_mib(self.total)} MiB, {rate / 1e6:.1f} MB/s",
            flush=True,
        )


def download(
    client: Any,
    bucket: str,
    plan: Plan,
    progress: Progress,
    *,
    workers: int,
    slice_bytes: int,
) -> None:
    """Big objects one after another, each in slices at once; the rest many at once, 256 to a
    batch. Each lands in a .part file, is verified and renamed; the manifest is written after
    every big object and every batch (an interrupted copy keeps what it finished)."""
    from google.cloud.storage import transfer_manager

    manifest = read_manifest(plan.dest)
    for path in plan.stale:
        (plan.dest / path).unlink(missing_ok=True)
        manifest.pop(path, None)

    def landed(r: Remote, part: Path) -> None:
        verify(r, part)
        os.replace(part, plan.dest / r.path)
        manifest[r.path] = {"generation": r.generation, "size": r.size, "crc32c": r.crc32c}
        progress.add(r.size)

    big = [r for r in plan.fetch if r.size >= slice_bytes]
    small = [r for r in plan.fetch if r.size < slice_bytes]
    b = client.bucket(bucket)
    for r in big:
        part = _part(plan.dest, r)
        transfer_manager.download_chunks_concurrently(
            b.blob(r.name, generation=r.generation),
            str(part),
            chunk_size=max(slice_bytes // 4, 4 * CHUNK),
            max_workers=workers,
            worker_type=transfer_manager.THREAD,
            crc32c_checksum=False,  # verified below, the same way for every object
        )
        landed(r, part)
        _write_manifest(plan.dest, manifest)
    for start in range(0, len(small), 256):  # results come back per batch: progress moves
        batch = small[start : start + 256]
        pairs = [(b.blob(r.name, generation=r.generation), str(_part(plan.dest, r))) for r in batch]
        transfer_manager.download_many(
            pairs, max_workers=workers, worker_type=transfer_manager.THREAD, raise_exception=True
        )
        for r in batch:
            landed(r, _part(plan.dest, r))
        _write_manifest(plan.dest, manifest)
    _write_manifest(plan.dest, manifest)  # the stale files' removal, when nothing was fetched


def verify(r: Remote, part: Path) -> None:
    size = part.stat().st_size
    if size != r.size:
        part.unlink(missing_ok=True)
        raise FetchError(f"gs://.../{r.name}: downloaded {size} bytes, the object has {r.size}")
    if r.crc32c and crc32c_b64(part) != r.crc32c:
        part.unlink(missing_ok=True)
        raise FetchError(f"gs://.../{r.name}: CRC32C mismatch after download (corrupted)")


def fetch(
    specs: Sequence[str],
    root: Path,
    node: str,
    *,
    client: Any = None,
    workers: int = DEFAULT_WORKERS,
    slice_bytes: int = DEFAULT_SLICE_MIB << 20,
    reserve: int = RESERVE_BYTES,
    say: Callable[[str], None] = lambda s: print(s, flush=True),
) -> dict[str, Any]:
    """List, plan, check the disk, download, verify; the summary the controller reads."""
    if client is None:
        import google.cloud.storage as storage

        client = storage.Client()
    t0 = time.monotonic()
    plans = []
    buckets = {}
    for spec in specs:
        name, bucket, prefix = parse_spec(spec)
        remote = list_remote(client, bucket, prefix)
        dest = root / name
        plan = plan_dataset(name, f"gs://{bucket}/{prefix}", dest, remote)
        plans.append(plan)
        buckets[name] = bucket
        say(
            f"data: {node}: {name} = {plan.uri}: {len(remote)} object(s), "
            f"{_gib(plan.total_bytes)}; to download {len(plan.fetch)} ({_gib(plan.fetch_bytes)}), "
            f"cached {len(remote) - len(plan.fetch)}"
        )
    check_space(plans, node, reserve)
    progress = Progress(node, sum(p.fetch_bytes for p in plans))
    for plan in plans:
        plan.dest.mkdir(parents=True, exist_ok=True)
        download(
            client, buckets[plan.name], plan, progress, workers=workers, slice_bytes=slice_bytes
        )
    seconds = time.monotonic() - t0
    return {
        "node": node,
        "seconds": round(seconds, 3),
        "downloaded_bytes": progress.done,
        "downloaded_objects": sum(len(p.fetch) for p in plans),
        "cached_objects": sum(len(p.remote) - len(p.fetch) for p in plans),
        "total_bytes": sum(p.total_bytes for p in plans),
        "removed": sum(len(p.stale) for p in plans),
    }


def prepare_root(root: Path, scratch: str | None) -> Path:
    """With local SSD mounted at `scratch`, the data root is a link to its gputrain-data dir,
    so every dataset lands on the fastest disk while its path stays the same."""
    if scratch and os.path.ismount(scratch):
        target = Path(scratch) / "gputrain-data"
        target.mkdir(parents=True, exist_ok=True)
        if root.is_symlink() and root.resolve() == target.resolve():
            return root
        if root.exists() and not root.is_symlink():
            shutil.rmtree(root)  # a copy on the boot disk from before the SSD: fetched again
        root.unlink(missing_ok=True)
        root.parent.mkdir(parents=True, exist_ok=True)
        root.symlink_to(target)
    root.mkdir(parents=True, exist_ok=True)
    return root


def copy_on_vertex(env: MutableMapping[str, str], workdir: Path, node: str) -> None:
    """gputrain_node.vertex_entry's step: the `copy` datasets Vertex AI's job names (GPUTRAIN_DATA_COPY)
    onto this replica's disk, then their variables point there."""
    specs = env.get("GPUTRAIN_DATA_COPY", "").split()
    if not specs:
        return
    root = prepare_root(workdir / "gputrain-data", env.get("GPUTRAIN_SCRATCH"))
    summary = fetch(specs, root, node)
    print(RESULT_PREFIX + json.dumps(summary), flush=True)
    env["GPUTRAIN_DATA_DIR"] = str(root)
    for spec in specs:
        name = parse_spec(spec)[0]
        env[f"GPUTRAIN_DATA_{name.upper()}"] = str(root / name)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gputrain_node.fetch_data", description=__doc__)
    p.add_argument("datasets", nargs="+", metavar="NAME=gs://BUCKET/PREFIX")
    p.add_argument("--root", required=True, type=Path, help="one directory per dataset here")
    p.add_argument("--node", default=socket.gethostname(), help="the node's name in messages")
    p.add_argument("--scratch", default=os.environ.get("GPUTRAIN_SCRATCH"), help="local SSD")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    p.add_argument("--slice-mib", type=int, default=DEFAULT_SLICE_MIB)
    args = p.parse_args(argv)
    try:
        root = prepare_root(args.root, args.scratch)
        summary = fetch(
            args.datasets,
            root,
            args.node,
            workers=args.workers,
            slice_bytes=args.slice_mib << 20,
        )
    except FetchError as e:
        print(f"data: {e}", file=sys.stderr, flush=True)
        return e.code
    print(RESULT_PREFIX + json.dumps(summary), flush=True)
    return 0


def _part(dest: Path, r: Remote) -> Path:
    f = dest / r.path
    f.parent.mkdir(parents=True, exist_ok=True)
    # this process's own: two copies into one folder (replicas that share it) never rename or
    # verify each other's half-written file
    return f.with_name(f"{f.name}.{os.getpid()}.part")


def _write_manifest(dest: Path, manifest: dict[str, Any]) -> None:
    final = manifest_path(dest)
    tmp = final.with_name(f"{final.name}.{os.getpid()}.tmp")  # a sharer's rename never takes it
    tmp.write_text(json.dumps(manifest, sort_keys=True))
    os.replace(tmp, final)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f}"


if __name__ == "__main__":
    sys.exit(main())
