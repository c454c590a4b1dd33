"""Thin adapter over google-cloud-storage: the reads and deletes that `down` and the sweep need on a
stack's bucket. Every call returns plain dataclasses; errors become one-line StorageApiError.

The client honours STORAGE_EMULATOR_HOST (anonymous credentials then), which is how the tests reach
their emulator; otherwise Application Default Credentials. Imported lazily (about 0.3 s).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.base.errors import GputrainError


class StorageApiError(GputrainError):
    """A Cloud Storage call failed (permissions, network, API off...)."""


@dataclass(frozen=True)
class BucketInfo:
    name: str
    location: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ObjectInfo:
    name: str
    size: int
    crc32c: str | None = None


class StorageApi:
    """One client per project, built on first use."""

    def __init__(self, project: str | None = None) -> None:
        self.project = project
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            try:
                import google.cloud.storage as storage

                self._client = storage.Client(project=self.project)
            except Exception as e:  # DefaultCredentialsError and friends
                raise StorageApiError(
                    f"cannot build a Cloud Storage client ({type(e).__name__}: {e}); run "
                    "`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"
                ) from e
        return self._client

    def _call(self, what: str, fn: Callable[[], Any], *, not_found: Any = ...) -> Any:
        from google.api_core import exceptions as gexc

        try:
            return fn()
        except gexc.NotFound as e:
            if not_found is not ...:
                return not_found
            raise StorageApiError(f"Cloud Storage {what}: not found: {e.message}") from e
        except gexc.GoogleAPICallError as e:
            raise StorageApiError(f"Cloud Storage {what}: {e.code} {e.message}") from e
        except OSError as e:  # no route, refused, reset: still one line
            raise StorageApiError(f"Cloud Storage {what}: {type(e).__name__}: {e}") from e

    def list_buckets(self, project: str) -> list[BucketInfo]:
        """Every bucket of the project (the JSON API lists all; labels are filtered by the caller)."""

        def fetch() -> list[BucketInfo]:
            return [
                BucketInfo(b.name, str(b.location or ""), dict(b.labels or {}))
                for b in self.client().list_buckets(project=project)
            ]

        return list(self._call(f"buckets.list {project}", fetch))

    def bucket_exists(self, bucket: str) -> bool:
        return bool(
            self._call(
                f"buckets.get {bucket}",
                lambda: self.client().get_bucket(bucket) is not None,
                not_found=False,
            )
        )

    def upload(self, bucket: str, name: str, source: Path) -> None:
        """One file (a Vertex job's code package), its CRC32C checked by the server."""
        self._call(
            f"objects.insert gs://{bucket}/{name}",
            lambda: (
                self.client()
                .bucket(bucket)
                .blob(name)
                .upload_from_filename(str(source), checksum="crc32c")
            ),
        )

    def list_objects(self, bucket: str, prefix: str = "") -> list[ObjectInfo]:
        def fetch() -> list[ObjectInfo]:
            blobs = self.client().list_blobs(bucket, prefix=prefix)
            return [ObjectInfo(b.name, int(b.size or 0), b.crc32c) for b in blobs]

        return list(self._call(f"objects.list gs://{bucket}/{prefix}", fetch, not_found=[]))

    def read(self, bucket: str, name: str) -> bytes:
        return bytes(
            self._call(
                f"objects.get gs://{bucket}/{name}",
                lambda: self.client().bucket(bucket).blob(name).download_as_bytes(),
            )
        )

    def download(self, bucket: str, name: str, dest: Path) -> None:
        """Into `dest` atomically (a temp file renamed), the client checking the CRC32C."""
        tmp = dest.with_name(f".{dest.name}.part")
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._call(
                f"objects.get gs://{bucket}/{name}",
                lambda: self.client().bucket(bucket).blob(name).download_to_filename(str(tmp)),
            )
            tmp.replace(dest)
        finally:
            tmp.unlink(missing_ok=True)

    def delete_objects(self, bucket: str, names: Iterable[str]) -> int:
        """Deletes each object (one already gone is fine); how many there were."""
        count = 0
        for name in names:
            self._call(
                f"objects.delete gs://{bucket}/{name}",
                lambda n=name: self.client().bucket(bucket).blob(n).delete(),  # type: ignore[misc]
                not_found=None,
            )
            count += 1
        return count
