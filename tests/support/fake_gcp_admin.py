"""A local fake of the Google APIs `gputrain doctor` calls besides Compute: Cloud Resource Manager v3
(projects.get, projects.testIamPermissions), Service Usage v1 (services:batchGet) and the OAuth 2.0
token endpoint that Application Default Credentials refresh against (the `token_uri` of a
service-account key file; the JWT's RS256 signature is checked; a login's refresh token is refused
as expired or revoked).

It speaks the real REST paths and JSON shapes, including Google's error bodies (`status`, and an
ErrorInfo in `details` with the reason, e.g. SERVICE_DISABLED), so the production clients
(google-cloud-resource-manager, google-cloud-service-usage, google-auth) run unchanged.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.padding import PKCS1v15
from cryptography.hazmat.primitives.hashes import SHA256

from tests.support.fake_http import FakeHttpServer, send_json

PROJECT = "gputrain-test"
NUMBER = "123456789012"
SERVICE_TITLES = {
    "compute.googleapis.com": "Compute Engine API",
    "iam.googleapis.com": "Identity and Access Management (IAM) API",
    "cloudresourcemanager.googleapis.com": "Cloud Resource Manager API",
    "aiplatform.googleapis.com": "Vertex AI API",
    "storage.googleapis.com": "Cloud Storage API",
    "serviceusage.googleapis.com": "Service Usage API",
}
SERVICE_ACCOUNT = f"gputrain-operator@{PROJECT}.iam.gserviceaccount.com"


@dataclass
class _Injected:
    pattern: re.Pattern[str]
    status: int
    message: str
    reason: str
    times: int


@dataclass
class AdminWorld:
    """The project as the APIs see it; tests change it freely."""

    project: str = PROJECT
    state: str = "ACTIVE"
    visible: bool = True  # False: the caller has no role in it (Resource Manager answers 403)
    enabled: set[str] = field(
        default_factory=lambda: {
            "compute.googleapis.com",
            "iam.googleapis.com",
            "cloudresourcemanager.googleapis.com",
            "serviceusage.googleapis.com",
            "storage.googleapis.com",  # on by default in a new project
        }
    )
    granted: set[str] | None = None  # None: every permission asked for (an Owner)
    asked_permissions: set[str] = field(default_factory=set)  # what testIamPermissions was asked
    tokens_issued: int = 0
    #: what the token endpoint answers instead, (status, body): a dict as JSON, a str as an HTML
    #: page (a Google front end's 503, a proxy's)
    token_answer: tuple[int, Any] | None = None


class FakeGcpAdmin(FakeHttpServer):
    def __init__(self) -> None:
        self.world = AdminWorld()
        self.requests: list[tuple[str, str, Any]] = []
        self._injected: list[_Injected] = []
        self._keys: dict[str, Any] = {}  # private_key_id -> RSA public key of a service account
        self._lock = threading.RLock()
        self._serve()

    def inject_error(
        self, path_regex: str, status: int, message: str, reason: str, *, times: int = 1
    ) -> None:
        """The next `times` requests whose path matches answer with this Google error."""
        with self._lock:
            self._injected.append(_Injected(re.compile(path_regex), status, message, reason, times))

    def adc_file(self, directory: Path, *, revoked: bool = False) -> Path:
        """A service-account key file as the Cloud console makes it, whose token_uri is this server:
        point GOOGLE_APPLICATION_CREDENTIALS at it. `revoked`: a key the server does not know (a
        deleted key), so its token requests are refused as Google refuses them."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        kid = f"{len(self._keys) + 1:040x}"
        if not revoked:
            self._keys[kid] = key.public_key()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        path = directory / "adc-key.json"
        path.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": self.world.project,
                    "private_key_id": kid,
                    "private_key": pem,
                    "client_email": SERVICE_ACCOUNT,
                    "client_id": "104838221301960425370",
                    "auth_uri": "https://accounts.google.com/o/oauth2/auth",
                    "token_uri": f"{self.url}/token",
                }
            )
        )
        return path

    def expired_login(self, monkeypatch: Any, directory: Path) -> Path:
        """This process logged in with `gcloud auth application-default login` (an authorized_user
        file, GOOGLE_APPLICATION_CREDENTIALS names it) long ago: its refresh token is expired or
        revoked, and this server refuses it as Google does. google-auth sends a login's refresh
        to Google's token endpoint whatever the file says, so that is pointed here."""
        monkeypatch.setattr(
            "google.oauth2.credentials._GOOGLE_OAUTH2_TOKEN_ENDPOINT", f"{self.url}/token"
        )
        monkeypatch.setenv("CLOUDSDK_CONFIG", str(directory / "gcloud"))  # no real gcloud login
        monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)  # else anonymous credentials
        path = directory / "adc-login.json"
        path.write_text(
            json.dumps(
                {
                    "type": "authorized_user",
                    "client_id": "32555940559.apps.googleusercontent.com",
                    "client_secret": "test-secret",
                    "refresh_token": "1//0gexpired",
                }
            )
        )
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
        return path

    # -- HTTP

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, method: str) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode() if length else ""
                status, body = fake._dispatch(method, unquote(parts.path), parts.query, raw)
                if not isinstance(body, str):
                    send_json(self, status, body)
                    return
                page = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=UTF-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

        return Handler

    def _dispatch(self, method: str, path: str, query: str, raw: str) -> tuple[int, Any]:
        with self._lock:
            self.requests.append((method, path, raw))
            for inj in self._injected:
                if inj.times > 0 and inj.pattern.search(path):
                    inj.times -= 1
                    return _error(inj.status, inj.message, inj.reason)
            w = self.world
            if method == "POST" and path == "/token":
                return self._token(parse_qs(raw))
            m = re.fullmatch(r"/v3/projects/([^/:]+)(:testIamPermissions)?", path)
            if m and "cloudresourcemanager.googleapis.com" not in w.enabled:
                return _disabled("cloudresourcemanager.googleapis.com")
            if m and self._visible(m.group(1)):
                if m.group(2):
                    return self._test_permissions(json.loads(raw or "{}"))
                return 200, {
                    "name": f"projects/{NUMBER}",
                    "parent": "organizations/987654321098",
                    "projectId": w.project,
                    "state": w.state,
                    "displayName": w.project,
                    "createTime": "2026-01-05T10:00:00.000Z",
                    "etag": 'W/"5ab2b6e4c5ec1d21"',
                }
            if m:
                return _error(403, "The caller does not have permission", "")
            m = re.fullmatch(r"/v1/projects/([^/]+)/services:batchGet", path)
            if m:
                if "serviceusage.googleapis.com" not in w.enabled:
                    return _disabled("serviceusage.googleapis.com")
                if not self._visible(m.group(1)):
                    return _error(403, "Permission denied to get service", "AUTH_PERMISSION_DENIED")
                names = parse_qs(query).get("names", [])
                return 200, {"services": [self._service(n.rsplit("/", 1)[-1]) for n in names]}
            return _error(404, f"The requested URL {path} was not found on this server.", "")

    def _visible(self, project: str) -> bool:
        return project == self.world.project and self.world.visible

    def _service(self, name: str) -> dict[str, Any]:
        return {
            "name": f"projects/{NUMBER}/services/{name}",
            "parent": f"projects/{NUMBER}",
            "config": {"name": name, "title": SERVICE_TITLES.get(name, name)},
            "state": "ENABLED" if name in self.world.enabled else "DISABLED",
        }

    def _test_permissions(self, body: dict[str, Any]) -> tuple[int, Any]:
        asked = list(body.get("permissions", []))
        self.world.asked_permissions |= set(asked)
        granted = self.world.granted
        held = [p for p in asked if granted is None or p in granted]
        return 200, ({"permissions": held} if held else {})  # proto3 JSON omits an empty list

    def _token(self, form: dict[str, list[str]]) -> tuple[int, Any]:
        """The JWT-bearer grant of a service-account key: the assertion must be signed by a key
        the server knows (RS256), as Google checks it. A login's refresh token: expired."""
        if self.world.token_answer is not None:
            return self.world.token_answer
        if form.get("grant_type") == ["refresh_token"]:
            return 400, {
                "error": "invalid_grant",
                "error_description": "Token has been expired or revoked.",
            }
        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
            return 400, {
                "error": "unsupported_grant_type",
                "error_description": "Invalid grant_type",
            }
        refused = (400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
        try:
            head, claims, signature = form["assertion"][0].split(".")
            kid = json.loads(_unb64(head))["kid"]
            public = self._keys[kid]
            public.verify(_unb64(signature), f"{head}.{claims}".encode(), PKCS1v15(), SHA256())
        except (KeyError, ValueError, InvalidSignature):
            return refused
        self.world.tokens_issued += 1
        return 200, {
            "access_token": f"ya29.test-{self.world.tokens_issued}",
            "expires_in": 3599,
            "token_type": "Bearer",
        }


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
          404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}  # fmt: skip


def _error(code: int, message: str, reason: str) -> tuple[int, Any]:
    """Google's JSON error body of the newer APIs: status, and an ErrorInfo with the reason."""
    error: dict[str, Any] = {"code": code, "message": message, "status": STATUS[code]}
    if reason:
        error["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": "googleapis.com",
            }
        ]
    return code, {"error": error}


def _disabled(service: str) -> tuple[int, Any]:
    title = SERVICE_TITLES.get(service, service)
    code, body = _error(
        403,
        f"{title} has not been used in project {NUMBER} before or it is disabled. Enable it by "
        f"visiting https://console.developers.google.com/apis/api/{service}/overview?project="
        f"{NUMBER} then retry.",
        "SERVICE_DISABLED",
    )
    body["error"]["details"][0]["metadata"] = {"service": service, "consumer": f"projects/{NUMBER}"}
    return code, body


FAKE_PULUMI = """#!/bin/sh
# a fake `pulumi` for the doctor's tests: answers `version` and `whoami --json` like the real CLI
case "$1" in
  version) {version};;
  whoami) {whoami};;
  *) echo "error: unknown command $1 for pulumi" >&2; exit 255;;
esac
"""
NOT_LOGGED_IN = (
    "echo 'error: PULUMI_ACCESS_TOKEN must be set for login during non-interactive CLI sessions'"
    " >&2; exit 255"
)


def install_fake_pulumi(
    directory: Path,
    *,
    version: str = "echo v3.160.0",
    whoami: str = 'echo \'{"user": "gputrain", "url": "file://~"}\'',
) -> Path:
    """A `pulumi` executable in `directory` (put it first on PATH); `version` and `whoami` are
    the shell its subcommands run."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pulumi"
    path.write_text(FAKE_PULUMI.format(version=version, whoami=whoami))
    path.chmod(0o755)
    return path


def ready_for_doctor(monkeypatch: Any, directory: Path, admin: FakeGcpAdmin) -> None:
    """This process as a user who followed docs/getting-started.md's checklist: a logged-in Pulumi CLI on PATH
    (local backend) with the passphrase set, and Application Default Credentials."""
    import os

    bin_dir = install_fake_pulumi(directory / "bin").parent
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "correct horse battery staple")
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE_FILE", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(admin.adc_file(directory)))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(directory / "gcloud"))  # no real gcloud login
