"""Artifact Registry's REST surface the sweep uses: ``GET /v1/projects/P/locations/L/repositories``
(paged), answering with the real shape (`name` = projects/P/locations/L/repositories/ID,
`format`, `labels`), and a 403 PERMISSION_DENIED for another project."""

from __future__ import annotations

import re
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from tests.support.fake_http import FakeHttpServer, send_json

_LIST = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/repositories$")
PAGE = 2  # small pages: the adapter must follow nextPageToken


class FakeArtifactRegistry(FakeHttpServer):
    def __init__(self, project: str = "gputrain-test") -> None:
        self.project = project
        # (project, location) -> {repository id: labels}
        self.repositories: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
        self.requests: list[str] = []
        self.disabled = False  # the API is off in the project: 403 SERVICE_DISABLED
        self._serve()

    def add(self, project: str, location: str, repo: str, labels: dict[str, str]) -> None:
        self.repositories.setdefault((project, location), {})[repo] = dict(labels)

    def remove(self, project: str, location: str, repo: str) -> None:
        self.repositories.get((project, location), {}).pop(repo, None)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                fake.requests.append(url.path)
                m = _LIST.match(url.path)
                if not m:
                    return send_json(self, 404, _error(404, "NOT_FOUND", f"no route {url.path}"))
                project, location = m.groups()
                if fake.disabled:
                    return send_json(self, 403, _disabled(project))
                if project != fake.project:
                    return send_json(
                        self,
                        403,
                        _error(
                            403,
                            "PERMISSION_DENIED",
                            f"Permission 'artifactregistry.repositories.list' denied on resource "
                            f"'projects/{project}/locations/{location}' (or it may not exist).",
                        ),
                    )
                found = sorted(fake.repositories.get((project, location), {}).items())
                start = int((parse_qs(url.query).get("pageToken") or ["0"])[0])
                page = found[start : start + PAGE]
                body: dict[str, object] = {
                    "repositories": [
                        {
                            "name": f"projects/{project}/locations/{location}/repositories/{repo}",
                            "format": "DOCKER",
                            "labels": labels,
                            "createTime": "2026-11-24T20:00:00.000000Z",
                        }
                        for repo, labels in page
                    ]
                }
                if start + PAGE < len(found):
                    body["nextPageToken"] = str(start + PAGE)
                send_json(self, 200, body)

        return Handler


def _error(code: int, status: str, message: str) -> dict[str, object]:
    return {"error": {"code": code, "message": message, "status": status}}


def _disabled(project: str) -> dict[str, object]:
    """As Google answers a call to an API that is off: ErrorInfo reason SERVICE_DISABLED."""
    body = _error(
        403,
        "PERMISSION_DENIED",
        f"Artifact Registry API has not been used in project {project} before or it is "
        "disabled. Enable it by visiting https://console.developers.google.com/apis/api/"
        f"artifactregistry.googleapis.com/overview?project={project} then retry.",
    )
    body["error"]["details"] = [  # type: ignore[index]
        {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "SERVICE_DISABLED",
            "domain": "googleapis.com",
            "metadata": {
                "service": "artifactregistry.googleapis.com",
                "consumer": f"projects/{project}",
            },
        }
    ]
    return body
