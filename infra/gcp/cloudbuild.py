"""Thin adapter for Cloud Build (google-cloud-build, REST transport): submit one Build
(projects.builds.create, a long-running operation whose metadata names the build) and follow it
(projects.builds.get) until it ends, with a progress line per status change. The request body is
infra/image_build.cloud_build_request's; a failed build is one line with its log URL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from infra.base.errors import UserError
from infra.gcp.api import build_client, call

#: Tests point the client at a local server of ours (anonymous credentials).
ENDPOINT_ENV = "GPUTRAIN_CLOUDBUILD_ENDPOINT"
DONE = ("SUCCESS", "FAILURE", "INTERNAL_ERROR", "TIMEOUT", "CANCELLED", "EXPIRED")


@dataclass(frozen=True)
class BuildState:
    id: str
    status: str  # QUEUED, WORKING, SUCCESS, FAILURE, ...
    log_url: str = ""
    detail: str = ""  # statusDetail / failureInfo.detail
    digest: str = ""  # the pushed image's digest (results.images[0].digest) once it succeeded


class CloudBuildApi:
    def __init__(
        self, project: str, api_endpoint: str | None = None, *, poll_s: float = 5.0
    ) -> None:
        self.project = project
        self.api_endpoint = api_endpoint
        self.poll_s = poll_s
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            from google.cloud.devtools import cloudbuild_v1

            self._client = build_client(
                cloudbuild_v1.CloudBuildClient, "Cloud Build", self.api_endpoint, transport="rest"
            )
        return self._client

    def submit(self, body: Mapping[str, Any]) -> BuildState:
        """projects.builds.create; the build as the operation's metadata describes it."""
        from google.cloud.devtools import cloudbuild_v1

        build = cloudbuild_v1.Build.from_json(json.dumps(body))
        op = call(
            "Cloud Build projects.builds.create",
            lambda: self.client().create_build(project_id=self.project, build=build, timeout=60),
        )
        return _state(op.metadata.build)

    def get(self, build_id: str) -> BuildState:
        return _state(
            call(
                "Cloud Build projects.builds.get",
                lambda: self.client().get_build(project_id=self.project, id=build_id, timeout=60),
            )
        )

    def follow(
        self,
        build: BuildState,
        say: Callable[[str], None],
        *,
        timeout_s: float = 4000.0,
    ) -> BuildState:
        """Polls until the build ends; a line per status change and every minute while it
        works. UserError (one line, the log URL) unless it succeeded."""
        started = time.monotonic()
        shown, last_line = "", started
        while True:
            now = time.monotonic()
            if build.status != shown or now - last_line >= 60:
                say(f"cloud build {build.id}: {build.status.lower()} ({now - started:.0f} s)")
                shown, last_line = build.status, now
            if build.status in DONE:
                break
            if now - started > timeout_s:
                raise UserError(
                    f"cloud build {build.id}: still {build.status.lower()} after "
                    f"{timeout_s:.0f} s; see {build.log_url or 'the Cloud Build console'}"
                )
            time.sleep(self.poll_s)
            build = self.get(build.id)
        if build.status != "SUCCESS":
            detail = f": {build.detail}" if build.detail else ""
            raise UserError(
                f"cloud build {build.id} ended {build.status}{detail}; log: "
                f"{build.log_url or 'the Cloud Build console'}"
            )
        return build


def _state(b: Any) -> BuildState:
    images = list(getattr(getattr(b, "results", None), "images", []) or [])
    failure = getattr(getattr(b, "failure_info", None), "detail", "") or ""
    return BuildState(
        id=str(b.id),
        status=type(b).Status(b.status).name if b.status else "STATUS_UNKNOWN",
        log_url=str(b.log_url or ""),
        detail=" ".join(str(b.status_detail or failure).split())[:300],
        digest=str(images[0].digest) if images else "",
    )
