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
from infra.gcp.api import bounded, credentials_error, refused, unreachable


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
    generation: int | None = None  # which write of the name this is (a rewrite is a new one)


def file_crc32c(path: Path) -> str:
    """A local file's CRC32C in Cloud Storage's form (base64 of the big-endian value), to compare
    with an object's `crc32c`. (The node helpers, standalone, keep their own few lines.)"""
    import base64

    import google_crc32c

    crc = google_crc32c.Checksum()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            crc.update(block)
    return base64.b64encode(crc.digest()).decode()


class StorageApi:
    """One client per project, built on first use."""

    def __init__(self, project: str | None = None) -> None:
        self.project = project
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            try:
                import google.cloud.storage as storage

                client = storage.Client(project=self.project)
            except Exception as e:  # DefaultCredentialsError and friends
                raise credentials_error(
                    "cannot build a Cloud Storage client", e, StorageApiError
                ) from e
            self._client = bounded(client)  # else it retries a refused connection for 2 min
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
        except (gexc.RetryError, OSError) as e:  # no answer in the retries; refused, Unreachable
            raise StorageApiError(
                f"Cloud Storage {what}: cannot reach it ({unreachable(e)})"
            ) from e
        except Exception as e:  # google.auth's (a metadata server's TransportError, a refresh)
            from google.auth import exceptions as auth_exc

            if not isinstance(e, auth_exc.GoogleAuthError):
                raise
            if refused(e):  # an expired login: the user's setup, as no credentials are
                raise credentials_error(
                    f"Cloud Storage {what}: the credentials were refused", e, StorageApiError
                ) from e
            raise StorageApiError(  # a token endpoint out of reach, its 5xx or its proxy's page
                f"Cloud Storage {what}: cannot reach it ({unreachable(e)})"
            ) from e

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
            return [
                ObjectInfo(b.name, int(b.size or 0), b.crc32c, int(b.generation or 0) or None)
                for b in blobs
            ]

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

    def delete_objects(self, bucket: str, objects: Iterable[ObjectInfo | str]) -> int:
        """Deletes each object (one already gone is fine); how many are gone. A listed object
        (with its generation) only while it is still that write (`ifGenerationMatch`): one
        rewritten since it was listed stays for the next listing (not counted)."""
        from google.api_core import exceptions as gexc

        count = 0
        for o in objects:
            name, generation = (o, None) if isinstance(o, str) else (o.name, o.generation)

            def delete(name: str = name, generation: int | None = generation) -> bool:
                try:
                    self.client().bucket(bucket).blob(name).delete(if_generation_match=generation)
                except gexc.PreconditionFailed:
                    return False
                return True

            count += bool(
                self._call(f"objects.delete gs://{bucket}/{name}", delete, not_found=True)
            )
        return count

    def read_versioned(self, bucket: str, name: str) -> tuple[bytes, int] | None:
        """The object and its generation (None: it does not exist). The bytes are read under
        `ifGenerationMatch` of that generation, so the pair is consistent."""

        def fetch() -> tuple[bytes, int] | None:
            from google.api_core import exceptions as gexc

            tries = 3  # a write between the two reads: read the new generation
            while True:
                blob = self.client().bucket(bucket).get_blob(name)
                if blob is None:
                    return None
                generation = int(blob.generation)
                try:
                    return bytes(blob.download_as_bytes(if_generation_match=generation)), generation
                except gexc.PreconditionFailed:
                    tries -= 1
                    if not tries:
                        raise

        result = self._call(f"objects.get gs://{bucket}/{name}", fetch, not_found=None)
        return result if result is None else (result[0], result[1])

    def write_if_generation(
        self, bucket: str, name: str, data: bytes, generation: int | None
    ) -> int | None:
        """Write the object only if its live generation is still `generation` (0: only if it
        does not exist; None: unconditionally): Cloud Storage's `ifGenerationMatch`
        precondition. The new generation, or None when another writer got there first (412)."""
        from google.api_core import exceptions as gexc

        def put() -> int | None:
            blob = self.client().bucket(bucket).blob(name)
            try:
                blob.upload_from_string(
                    data, content_type="application/json", if_generation_match=generation
                )
            except gexc.PreconditionFailed:
                return None
            return int(blob.generation)

        result = self._call(f"objects.insert gs://{bucket}/{name}", put)
        return None if result is None else int(result)
