"""A fake GCE metadata server: what google-auth's Compute Engine credentials ask a VM's metadata
server (the ping at the root, the service account's info and its access token, the project id),
with the `Metadata-Flavor: Google` header both ways. The test hosts reach it on the bridge through
GCE_METADATA_HOST / GCE_METADATA_IP, so code on a "VM" gets the VM's credentials as on GCE."""

from __future__ import annotations

import secrets
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.fake_http import FakeHttpServer

ROOT = "/computeMetadata/v1/"


class FakeMetadata(FakeHttpServer):
    def __init__(self, email: str, project: str, *, host: str = "127.0.0.1") -> None:
        self.email, self.project = email, project
        self.token = "ya29.fake-" + secrets.token_hex(8)
        self.token_requests = 0
        self._serve(host)

    @property
    def address(self) -> str:
        """host:port, as GCE_METADATA_HOST and GCE_METADATA_IP take it."""
        return self.url.removeprefix("http://")

    def _answer(self, path: str) -> tuple[int, str, Any]:
        sa = f"{ROOT}instance/service-accounts/"
        if path in ("", "/"):
            return 200, "text", ""
        if path.startswith(f"{sa}default/token") or path.startswith(f"{sa}{self.email}/token"):
            self.token_requests += 1
            return (
                200,
                "json",
                {"access_token": self.token, "expires_in": 3599, "token_type": "Bearer"},
            )
        if path.startswith(f"{sa}default/") or path.startswith(f"{sa}{self.email}/"):
            if "recursive=true" in path or path.rstrip("/").endswith(("default", self.email)):
                scopes = ["https://www.googleapis.com/auth/cloud-platform"]
                return 200, "json", {"email": self.email, "scopes": scopes, "aliases": ["default"]}
            if path.split("?")[0].endswith("/email"):
                return 200, "text", self.email
        if path.startswith(f"{ROOT}project/project-id"):
            return 200, "text", self.project
        if path.startswith(f"{ROOT}universe/universe-domain"):
            return 200, "text", "googleapis.com"
        return 404, "text", "not found"

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.headers.get("Metadata-Flavor") != "Google":
                    status, kind, body = 403, "text", "Missing Metadata-Flavor:Google header."
                else:
                    status, kind, body = fake._answer(self.path)
                import json

                data = (json.dumps(body) if kind == "json" else str(body)).encode()
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header(
                    "Content-Type", "application/json" if kind == "json" else "application/text"
                )
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
