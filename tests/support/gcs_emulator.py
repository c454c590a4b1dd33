"""A real Cloud Storage emulator from PyPI (gcp-storage-emulator) in this process, on 127.0.0.1 or
(for jobs on the SSH test hosts) the test bed's bridge address.

The production code talks to it through the real google-cloud-storage client, which honours
STORAGE_EMULATOR_HOST; child processes (torchrun, the Vertex entry point) inherit that variable.
"""

from __future__ import annotations

import threading
from http import HTTPStatus
from typing import Any

from gcp_storage_emulator.server import create_server

BUCKET = "gputrain-ckpt-test"
_WRITES = threading.Lock()


def _with_generation_preconditions() -> None:
    """gcp-storage-emulator ignores `ifGenerationMatch` on object inserts; Cloud Storage honours
    it (0: only if the object does not exist; else only if the live generation is that one) and
    answers 412 Precondition Failed otherwise. This adds exactly that to the emulator's insert
    handler, atomically (one lock around check and write), so the lease's one-writer rule is
    tested against the real client's request. Idempotent."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    original = objects.insert
    if getattr(original, "checks_generation", False):
        return

    def insert(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = request.query.get("ifGenerationMatch")
        if not wanted:
            return original(request, response, storage, *args, **kwargs)
        name = (request.query.get("name") or [None])[0]
        if name is None and isinstance(request.data, dict):
            name = request.data.get("meta", {}).get("name")
        with _WRITES:
            try:
                live = str(storage.get_file_obj(request.params["bucket_name"], name)["generation"])
            except NotFound:
                live = "0"
            if live != wanted[0]:
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json({"error": {"code": 412, "message": "Precondition Failed"}})
                return None
            return original(request, response, storage, *args, **kwargs)

    insert.checks_generation = True  # type: ignore[attr-defined]
    objects.insert = insert
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is original:
                handlers[method] = insert


class GcsEmulator:
    """In-memory server with one bucket; `url` goes into STORAGE_EMULATOR_HOST."""

    def __init__(self, bucket: str = BUCKET, host: str = "127.0.0.1") -> None:
        self.bucket_name, self.host = bucket, host
        _with_generation_preconditions()
        self._server = create_server(host, 0, in_memory=True, default_bucket=bucket)
        self.url = ""

    def __enter__(self) -> GcsEmulator:
        self._server.start()
        httpd = self._server._api._httpd  # bound to port 0: ask the socket which port it got
        assert httpd is not None, "the emulator did not start"
        self.url = f"http://{self.host}:{httpd.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def client(self) -> Any:
        """A google-cloud-storage client for the test's own reads and writes."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.url},
        )

    def live_names(self, bucket: str, prefix: str = "") -> list[str]:
        """The names in `bucket` under `prefix`, read from the emulator's memory: what a listing
        answers, without a client and an HTTP round trip (~3 ms of this process's CPU and GIL,
        which a test polling ten times a second takes from the controller it watches)."""
        objects = self._server._storage.objects
        for _ in range(100):  # the server's thread may add an object while this copies
            try:
                return [n for n in list(objects.get(bucket, {})) if n.startswith(prefix)]
            except RuntimeError:
                continue
        raise RuntimeError("the emulator's objects kept changing while listed")

    def names(self, prefix: str = "") -> list[str]:
        return sorted(b.name for b in self.client().list_blobs(self.bucket_name, prefix=prefix))

    def read(self, name: str) -> bytes:
        return bytes(self.client().bucket(self.bucket_name).blob(name).download_as_bytes())

    def write(self, name: str, data: bytes) -> None:
        self.client().bucket(self.bucket_name).blob(name).upload_from_string(data)
