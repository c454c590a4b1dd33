"""Cloud Build's REST surface as google-cloud-build's REST transport calls it:
``POST /v1/projects/P/builds`` (projects.builds.create: a long-running Operation whose metadata
is a BuildOperationMetadata holding the Build), ``GET /v1/projects/P/builds/ID`` (builds.get) and
``GET /v1/operations/build/P/ID`` (operations.get). A build goes QUEUED -> WORKING -> its end over
successive reads; it reads its source tarball through `read_source` (the tests' Cloud Storage
emulator) and fails as Cloud Build does when that object is missing. `fail_next` scripts a
FAILURE (the step's exit status in failureInfo). Like a project made after Cloud Build's 2024
service-account change in a secure-by-default organization: a build without `serviceAccount`
runs as the Compute Engine default account, which has no Editor role, and fails reading its
source; one with `serviceAccount` must set a logging option (or a logs bucket), else 400."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import tarfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.fake_http import FakeHttpServer, send_json

_CREATE = re.compile(r"^/v1/projects/([^/]+)/builds$")
_GET = re.compile(r"^/v1/projects/([^/]+)/builds/([^/:]+)$")
_OPERATION = re.compile(r"^/v1/operations/build/([^/]+)/([^/]+)$")
METADATA_TYPE = "type.googleapis.com/google.devtools.cloudbuild.v1.BuildOperationMetadata"
BUILD_TYPE = "type.googleapis.com/google.devtools.cloudbuild.v1.Build"
#: what a build without `serviceAccount` runs as in a project made after the 2024 change
DEFAULT_ACCOUNT = "123456789012-compute@developer.gserviceaccount.com"
#: BuildOptions.LoggingMode values a build with its own account may use (the REST client sends
#: enums as numbers); else a logs bucket, or defaultLogsBucketBehavior REGIONAL_USER_OWNED_BUCKET
LOGGING_MODES = {3: "STACKDRIVER_ONLY", 4: "NONE", 5: "CLOUD_LOGGING_ONLY"}


class FakeCloudBuild(FakeHttpServer):
    def __init__(self, read_source: Callable[[str, str], bytes | None]) -> None:
        self.read_source = read_source  # (bucket, object) -> bytes, None when there is none
        self.builds: dict[str, dict[str, Any]] = {}
        self.sources: dict[str, list[str]] = {}  # build id -> the files in its tarball
        self.requests: list[str] = []
        self.fail_next: str | None = None  # e.g. "Build step 0 ... exit status 1"
        self._reads: dict[str, int] = {}
        self._lock = threading.Lock()
        self._serve()

    def _create(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        build_id = f"b{len(self.builds) + 1:04d}-5e1f-4a6b-9c2d-3f0e1d2c3b4a"
        storage = body.get("source", {}).get("storageSource", {})
        data = self.read_source(storage.get("bucket", ""), storage.get("object", ""))
        end, detail, results = "SUCCESS", "", {}
        if not body.get("serviceAccount"):
            end = "FAILURE"
            detail = (
                f"failed to fetch source: gs://{storage.get('bucket')}/{storage.get('object')}: "
                f"googleapi: Error 403: {DEFAULT_ACCOUNT} does not have storage.objects.get "
                "access to the Google Cloud Storage object."
            )
        elif data is None:
            end = "FAILURE"
            detail = (
                f"failed to fetch source: gs://{storage.get('bucket')}/{storage.get('object')}: "
                "storage: object doesn't exist"
            )
        else:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                self.sources[build_id] = tar.getnames()
            if self.fail_next:
                end, detail, self.fail_next = "FAILURE", self.fail_next, None
            else:
                digest = "sha256:" + hashlib.sha256(data).hexdigest()
                results = {"images": [{"name": n, "digest": digest} for n in body["images"]]}
        build = {
            **body,
            "id": build_id,
            "projectId": project,
            "status": "QUEUED",
            "createTime": "2026-11-24T21:00:00Z",
            "logUrl": f"https://console.cloud.google.com/cloud-build/builds/{build_id}?project=1234",
            "_end": (end, detail, results),
        }
        self.builds[build_id] = build
        return build

    def _read(self, build_id: str) -> dict[str, Any]:
        """Each read moves a build on: QUEUED, WORKING, then how it ends."""
        build = self.builds[build_id]
        n = self._reads[build_id] = self._reads.get(build_id, 0) + 1
        if n == 1:
            build["status"] = "WORKING"
        elif n >= 2 and build["status"] == "WORKING":
            end, detail, results = build["_end"]
            build["status"] = end
            if detail:
                build["statusDetail"] = detail
                build["failureInfo"] = {"type": "USER_BUILD_STEP", "detail": detail}
            if results:
                build["results"] = results
        return _public(build)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                path = self.path.split("?")[0]
                fake.requests.append(f"POST {path}")
                m = _CREATE.match(path)
                if not m:
                    return _not_found(self, path)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                options = body.get("options") or {}
                options["logging"] = LOGGING_MODES.get(
                    options.get("logging"), options.get("logging")
                )
                if (
                    body.get("serviceAccount")
                    and not body.get("logsBucket")
                    and options["logging"] not in LOGGING_MODES.values()
                    and options.get("defaultLogsBucketBehavior")
                    not in (1, "REGIONAL_USER_OWNED_BUCKET")
                ):
                    return send_json(self, 400, {"error": {"code": 400, "message": (
                        "generic::invalid_argument: if 'build.service_account' is specified, the "
                        "build must either (a) specify 'build.logs_bucket', (b) use the "
                        "REGIONAL_USER_OWNED_BUCKET build.options.logging option, or (c) use "
                        "either CLOUD_LOGGING_ONLY / NONE logging options"
                    ), "status": "INVALID_ARGUMENT"}})  # fmt: skip
                with fake._lock:
                    build = fake._create(m.group(1), body)
                send_json(self, 200, _operation(build, done=False))

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                fake.requests.append(f"GET {path}")
                m = _GET.match(path) or _OPERATION.match(path)
                if not m:
                    return _not_found(self, path)
                build_id = m.group(2) if _GET.match(path) else _decode(m.group(2))
                if build_id not in fake.builds:
                    return _not_found(self, path)
                with fake._lock:
                    build = fake._read(build_id)
                if _GET.match(path):
                    return send_json(self, 200, build)
                send_json(self, 200, _operation(build, done=build["status"] != "WORKING"))

        return Handler


def _public(build: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in build.items() if not k.startswith("_")}


def _operation(build: dict[str, Any], *, done: bool) -> dict[str, Any]:
    name = base64.urlsafe_b64encode(build["id"].encode()).decode()
    op: dict[str, Any] = {
        "name": f"operations/build/{build['projectId']}/{name}",
        "metadata": {"@type": METADATA_TYPE, "build": _public(build)},
        "done": done,
    }
    if done:
        op["response"] = {"@type": BUILD_TYPE, **_public(build)}
    return op


def _decode(name: str) -> str:
    return base64.urlsafe_b64decode(name.encode()).decode()


def _not_found(handler: BaseHTTPRequestHandler, path: str) -> None:
    send_json(
        handler, 404, {"error": {"code": 404, "message": f"no route {path}", "status": "NOT_FOUND"}}
    )
