"""Checkpoints in Cloud Storage: the object first, a small manifest last, so a listing tells complete
checkpoints from interrupted uploads and a later truncation shows as a size or checksum mismatch.

`gs://BUCKET/PREFIX` holds `ckpt-00000100.pt` and `ckpt-00000100.pt.manifest.json` (step, size,
crc32c and md5 as the server computed them). Only global rank 0 writes, from one background thread,
so training never waits for the network. google-cloud-storage is imported only when a gs:// URI is
used; it honours STORAGE_EMULATOR_HOST, which is how the tests reach their emulator.
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trainer.errors import CorruptCheckpoint, InputError

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = "gputrain-checkpoint/1"
OBJECT = re.compile(r"^ckpt-(\d{8})\.pt$")
# GCS bucket naming rules (the dotted 222-character form is not used for checkpoints).
BUCKET = re.compile(r"^[a-z0-9][a-z0-9_.-]{1,61}[a-z0-9]$")
CHUNK_BYTES = 32 * 1024 * 1024  # resumable upload chunks: a dropped connection resends one chunk


@dataclass(frozen=True)
class GsUri:
    bucket: str
    prefix: str  # "" or ends with "/"

    def __str__(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"


def parse_gs_uri(value: str, setting: str) -> GsUri:
    """`gs://BUCKET[/PREFIX]` -> GsUri; anything else is one line naming the setting."""
    bucket, _, prefix = value.removeprefix("gs://").partition("/")
    if (
        not value.startswith("gs://")
        or not BUCKET.match(bucket)
        or bucket.startswith("goog")
        or "google" in bucket
        or "//" in prefix
    ):
        raise InputError(
            f"{setting} {value}: must be gs://BUCKET[/PREFIX], BUCKET 3-63 of a-z 0-9 - _ . "
            "starting and ending with a letter or digit, without 'goog' as prefix or 'google'"
        )
    return GsUri(bucket, prefix.rstrip("/") + "/" if prefix.strip("/") else "")


def crc32c_of(path: Path) -> str:
    """The file's CRC32C as GCS reports it: base64 of the big-endian 4 bytes."""
    import google_crc32c

    checksum = google_crc32c.Checksum()
    with path.open("rb") as f:
        while chunk := f.read(8 * 1024 * 1024):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode()


def new_client() -> Any:
    """A google-cloud-storage client: the VM's service account on GCE, the emulator in tests."""
    from google.cloud.storage import Client

    return Client()


def upload_files(paths: list[Path], uri: GsUri) -> list[str]:
    """Plain copies of run outputs (summary, metrics) under `uri`; missing files are skipped."""
    bucket = new_client().bucket(uri.bucket)
    sent = []
    for path in paths:
        if path.is_file():
            bucket.blob(uri.prefix + path.name).upload_from_filename(str(path), checksum="crc32c")
            sent.append(path.name)
    return sent


@dataclass(frozen=True)
class RemoteCheckpoint:
    step: int
    name: str  # object name
    size: int
    crc32c: str


class CheckpointStore:
    """The bucket side of checkpointing: upload with manifest, list complete ones, verified download."""

    def __init__(self, uri: GsUri, client: Any = None, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.uri, self.client = uri, client or new_client()
        self.chunk_bytes = chunk_bytes
        self.bucket = self.client.bucket(uri.bucket)

    @classmethod
    def open(cls, uri: GsUri, setting: str) -> CheckpointStore:
        """A store whose bucket is known to exist and take writes: checked before any training."""
        from google.api_core import exceptions

        try:
            store = cls(uri)
            probe = store.bucket.blob(f"{uri.prefix}.gputrain-write-probe-{os.getpid()}")
            probe.upload_from_string(b"", timeout=30)
            probe.delete(timeout=30)
        except exceptions.NotFound:
            raise InputError(f"{setting} {uri}: bucket {uri.bucket} does not exist") from None
        except exceptions.Forbidden as e:
            raise InputError(f"{setting} {uri}: no write access ({e.message})") from None
        except Exception as e:  # no credentials, no route: still one line, before training
            raise InputError(
                f"{setting} {uri}: cannot reach it ({type(e).__name__}: {e})"
            ) from None
        return store

    def object_uri(self, name: str) -> str:
        return f"gs://{self.uri.bucket}/{name}"

    def upload(self, f: BinaryIO, step: int, size: int) -> dict[str, Any]:
        """Upload one checkpoint (the client checks the server's CRC32C), then its manifest."""
        name = f"{self.uri.prefix}ckpt-{step:08d}.pt"
        blob = self.bucket.blob(
            name, chunk_size=self.chunk_bytes if size > self.chunk_bytes else None
        )
        blob.upload_from_file(f, size=size, checksum="crc32c", rewind=True)
        if blob.size != size:
            raise CorruptCheckpoint(
                f"{self.object_uri(name)}: {blob.size} bytes stored, {size} sent"
            )
        manifest = {
            "format": MANIFEST_FORMAT,
            "step": step,
            "object": name.rsplit("/", 1)[-1],
            "size": size,
            "crc32c": blob.crc32c,
            "md5": blob.md5_hash,
            "generation": blob.generation,
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        self.bucket.blob(name + MANIFEST_SUFFIX).upload_from_string(
            json.dumps(manifest, indent=2), content_type="application/json"
        )
        return manifest

    def _listing(self) -> dict[str, Any]:
        """Objects directly under the prefix, by base name."""
        blobs = self.client.list_blobs(self.uri.bucket, prefix=self.uri.prefix)
        return {
            b.name[len(self.uri.prefix) :]: b
            for b in blobs
            if "/" not in b.name[len(self.uri.prefix) :]
        }

    def complete(self) -> tuple[list[RemoteCheckpoint], list[str]]:
        """Checkpoints with a manifest whose object matches it (oldest first), and why others don't."""
        found, problems = [], []
        listing = self._listing()
        for base, blob in sorted(listing.items()):
            m = OBJECT.match(base.removesuffix(MANIFEST_SUFFIX))
            if not base.endswith(MANIFEST_SUFFIX) or not m:
                continue
            obj = listing.get(m.group(0))
            where = self.object_uri(blob.name.removesuffix(MANIFEST_SUFFIX))
            try:
                manifest = json.loads(blob.download_as_bytes())
                size, crc = int(manifest["size"]), str(manifest["crc32c"])
            except (ValueError, KeyError, TypeError):
                problems.append(f"{where}: its manifest is unreadable")
                continue
            if obj is None:
                problems.append(f"{where}: the object is missing (its manifest is there)")
            elif obj.size != size or obj.crc32c != crc:
                problems.append(
                    f"{where}: {obj.size} bytes with crc32c {obj.crc32c}, the manifest says "
                    f"{size} bytes with {crc} (truncated or overwritten)"
                )
            else:
                found.append(RemoteCheckpoint(int(m.group(1)), obj.name, size, crc))
        return found, problems

    def download(self, ckpt: RemoteCheckpoint, dest: Path) -> None:
        """Fetch into `dest` atomically; CorruptCheckpoint when the bytes differ from the manifest."""
        tmp = dest.with_name(f"{dest.name}.download{os.getpid()}")
        try:
            with tmp.open("wb") as f:
                self.bucket.blob(ckpt.name).download_to_file(f, checksum=None)
            size, crc = tmp.stat().st_size, crc32c_of(tmp)
            if (size, crc) != (ckpt.size, ckpt.crc32c):
                raise CorruptCheckpoint(
                    f"{self.object_uri(ckpt.name)}: downloaded {size} bytes with crc32c {crc}, "
                    f"the manifest says {ckpt.size} bytes with {ckpt.crc32c}"
                )
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def prune(self, keep: int) -> list[str]:
        """Keep the newest `keep` complete checkpoints; manifests go first, so none points nowhere."""
        listing = self._listing()
        steps = sorted(
            int(m.group(1))
            for base in listing
            if base.endswith(MANIFEST_SUFFIX)
            and (m := OBJECT.match(base.removesuffix(MANIFEST_SUFFIX)))
        )
        if len(steps) <= keep:
            return []
        oldest_kept, gone = steps[-keep], []
        for base in sorted(listing, key=lambda b: not b.endswith(MANIFEST_SUFFIX)):
            m = OBJECT.match(base.removesuffix(MANIFEST_SUFFIX))
            if m and int(m.group(1)) < oldest_kept:
                listing[base].delete()
                gone.append(base)
        return gone


class Uploader:
    """One background thread uploads the newest saved checkpoint; a newer save replaces one that
    has not started, since only the newest matters for a resume."""

    def __init__(self, store: CheckpointStore, keep: int) -> None:
        self.store, self.keep = store, keep
        self._cond = threading.Condition()
        self._pending: tuple[int, BinaryIO, int] | None = None
        self._busy = False
        self.uploaded: list[int] = []
        self.failures: list[str] = []
        threading.Thread(target=self._loop, name="gputrain-upload", daemon=True).start()

    def submit(self, path: Path, step: int) -> None:
        f = path.open("rb")  # held open: keeping the last K locally may unlink it before it is sent
        size = os.fstat(f.fileno()).st_size
        with self._cond:
            if self._pending is not None:
                old, stale, _ = self._pending
                stale.close()
                print(f"checkpoint step {old}: upload skipped, step {step} is newer", flush=True)
            self._pending = (step, f, size)
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """True when every submitted checkpoint is uploaded or has failed, within `timeout` s."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                assert self._pending is not None
                (step, f, size), self._pending = self._pending, None
                self._busy = True
            try:
                self._send(step, f, size)
            except Exception as e:  # training goes on; the local copy is still there
                self.failures.append(f"step {step}: {type(e).__name__}: {e}")
                print(f"checkpoint step {step}: upload to {self.store.uri} failed: {e}", flush=True)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _send(self, step: int, f: BinaryIO, size: int) -> None:
        started = time.perf_counter()
        with f:
            manifest = self.store.upload(f, step, size)
        self.uploaded.append(step)
        print(
            f"checkpoint step {step} uploaded to {self.store.uri}{manifest['object']} "
            f"({size / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s)",
            flush=True,
        )
        try:
            self.store.prune(self.keep)
        except Exception as e:  # the new checkpoint is complete; older ones just linger
            print(f"checkpoint step {step}: removing older ones failed: {e}", flush=True)
