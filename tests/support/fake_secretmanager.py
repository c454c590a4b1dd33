"""Secret Manager's REST surface that `access_secret_version` uses:
``GET /v1/projects/P/secrets/S/versions/V:access`` (V a number or `latest`), answering as Google
does (payload base64, a 404 NOT_FOUND, a 403 PERMISSION_DENIED for `denied` secrets)."""

from __future__ import annotations

import base64
import re
from http.server import BaseHTTPRequestHandler

from tests.support.fake_http import FakeHttpServer, send_json

_ACCESS = re.compile(r"^/v1/projects/([^/]+)/secrets/([^/]+)/versions/([^/:]+):access$")


class FakeSecretManager(FakeHttpServer):
    def __init__(self) -> None:
        self.versions: dict[tuple[str, str], list[bytes]] = {}  # (project, secret) -> versions
        self.denied: set[str] = set()
        self.unavailable: set[str] = set()  # answered 503 UNAVAILABLE, as an outage would be
        self.requests: list[str] = []
        self._serve()

    def add(self, project: str, secret: str, value: str) -> None:
        self.versions.setdefault((project, secret), []).append(value.encode())

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                fake.requests.append(path)
                m = _ACCESS.match(path)
                if not m:
                    return _error(self, 404, "NOT_FOUND", f"no route {path}")
                project, secret, version = m.groups()
                if secret in fake.unavailable:
                    return _error(self, 503, "UNAVAILABLE", "The service is currently unavailable.")
                if secret in fake.denied:
                    return _error(
                        self,
                        403,
                        "PERMISSION_DENIED",
                        f"Permission 'secretmanager.versions.access' denied for resource "
                        f"'projects/{project}/secrets/{secret}/versions/{version}'",
                    )
                found = fake.versions.get((project, secret), [])
                index = len(found) if version == "latest" else int(version)
                if not found or not 1 <= index <= len(found):
                    return _error(
                        self,
                        404,
                        "NOT_FOUND",
                        f"Secret [projects/{project}/secrets/{secret}] not found or has no versions.",
                    )
                send_json(
                    self,
                    200,
                    {
                        "name": f"projects/{project}/secrets/{secret}/versions/{index}",
                        "payload": {"data": base64.b64encode(found[index - 1]).decode()},
                    },
                )

        return Handler


def _error(handler: BaseHTTPRequestHandler, code: int, status: str, message: str) -> None:
    send_json(handler, code, {"error": {"code": code, "message": message, "status": status}})
