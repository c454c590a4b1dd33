"""Thin adapter over google-cloud-aiplatform (JobServiceClient, REST transport) and
google-cloud-logging (JSON API): create, get and cancel a CustomJob, follow it to a final state
with its log lines, and turn API failures into typed one-line errors.

Everything it returns is a plain record from scripts/targets/vertex/job.py, so the rules stay pure.
`google.cloud.aiplatform_v1` costs about 0.8 s to import (it loads every Vertex service), so all
Google imports happen inside the methods: `gputrain --help` and the GCE path never pay for them.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from infra.base.errors import GputrainError
from infra.gcp.api import bounded, credentials_error, refused, unreachable
from scripts.targets.vertex.job import (
    JobStatus,
    LogCursor,
    LogLine,
    format_log_lines,
    parent,
    parse_job,
)


class VertexApiError(GputrainError):
    """A Vertex AI or Cloud Logging call failed; the message is one line."""


class VertexPermissionError(VertexApiError):
    """403: the caller lacks a role, or the API is not enabled in the project."""


class VertexQuotaError(VertexApiError):
    """429: a Vertex AI quota (GPUs per region, concurrent jobs...) is exhausted."""


class VertexNotFound(VertexApiError):
    """404: the job (or project/region) does not exist."""


LOGGING_ENDPOINT = "https://logging.googleapis.com"
_ROLES = {"aiplatform": "roles/aiplatform.user", "logging": "roles/logging.viewer"}


@dataclass(frozen=True)
class Followed:
    """How a followed job ended, with its last log lines for the failure message."""

    status: JobStatus
    last_lines: tuple[str, ...]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class VertexApi:
    """One project and region. `api_endpoint` ("http://127.0.0.1:PORT") points both clients at a
    local fake with anonymous credentials; otherwise the regional Vertex endpoint and Application
    Default Credentials."""

    def __init__(
        self,
        project: str,
        region: str,
        *,
        api_endpoint: str | None = None,
        logging_endpoint: str | None = None,
    ) -> None:
        self.project, self.region = project, region
        self.api_endpoint = api_endpoint or f"{region}-aiplatform.googleapis.com"
        local = api_endpoint if api_endpoint and api_endpoint.startswith("http://") else None
        self.logging_endpoint = logging_endpoint or local or LOGGING_ENDPOINT
        self._clients: dict[str, Any] = {}

    # -- clients

    def _credentials(self, endpoint: str | None) -> dict[str, Any]:
        if endpoint and endpoint.startswith("http://"):
            from google.auth.credentials import AnonymousCredentials

            # Never send real credentials to a plain-http test endpoint.
            return {"credentials": AnonymousCredentials()}
        return {}

    def _client(self, kind: str) -> Any:
        if kind not in self._clients:
            try:
                if kind == "jobs":
                    from google.cloud import aiplatform_v1

                    self._clients[kind] = aiplatform_v1.JobServiceClient(
                        transport="rest",
                        client_options={"api_endpoint": self.api_endpoint},
                        **self._credentials(self.api_endpoint),
                    )
                else:
                    from google.cloud import logging_v2

                    self._clients[kind] = logging_v2.Client(
                        project=self.project,
                        _use_grpc=False,  # the JSON API: one transport, no grpc channel
                        client_options={"api_endpoint": self.logging_endpoint},
                        **self._credentials(self.logging_endpoint),
                    )
            except Exception as e:  # DefaultCredentialsError and friends
                raise credentials_error(
                    "cannot build a Google API client", e, VertexApiError
                ) from e
            bounded(self._clients[kind])
        return self._clients[kind]

    def _call(self, what: str, fn: Callable[[], Any], api: str = "aiplatform") -> Any:
        """Runs one API call; Google's errors become typed one-line VertexApiErrors."""
        from google.api_core import exceptions as gexc

        try:
            return fn()
        except gexc.Forbidden as e:  # HTTP 403; PERMISSION_DENIED over gRPC is a subclass
            msg = _message(e)
            hint = (
                f"enable it: gcloud services enable {api}.googleapis.com --project {self.project}"
                if re.search(r"SERVICE_DISABLED|has not been used|is disabled", msg)
                else f"the caller needs {_ROLES[api]} on project {self.project}"
            )
            raise VertexPermissionError(f"{what}: permission denied: {msg}; {hint}") from e
        except gexc.TooManyRequests as e:  # HTTP 429 / RESOURCE_EXHAUSTED
            raise VertexQuotaError(
                f"{what}: quota exceeded in {self.region}: {_message(e)}; request more Vertex AI "
                "training quota (console: IAM & Admin > Quotas) or use fewer nodes"
            ) from e
        except gexc.NotFound as e:
            raise VertexNotFound(f"{what}: not found: {_message(e)}") from e
        except gexc.Unauthorized as e:  # HTTP 401 / UNAUTHENTICATED
            raise VertexApiError(
                f"{what}: not authenticated ({_message(e)}); run "
                "`gcloud auth application-default login`"
            ) from e
        except gexc.GoogleAPICallError as e:
            raise VertexApiError(f"{what}: {_code(e)} {_message(e)}") from e
        except OSError as e:  # requests' ConnectionError and timeouts derive from it
            where = self.logging_endpoint if api == "logging" else self.api_endpoint
            raise VertexApiError(f"{what}: cannot reach {where}: {_one_line(e)}") from e
        except Exception as e:  # google.auth's: an expired login is the user's setup to fix
            from google.auth import exceptions as auth_exc

            if not isinstance(e, auth_exc.GoogleAuthError):
                raise
            if refused(e) or isinstance(e, auth_exc.DefaultCredentialsError):
                raise credentials_error(
                    f"{what}: the credentials were refused", e, VertexApiError
                ) from e
            # the token endpoint out of reach, or its "try again": as call() says it
            raise VertexApiError(f"{what}: cannot reach it ({unreachable(e)})") from e

    # -- jobs

    def create_job(self, body: Mapping[str, Any]) -> JobStatus:
        """Submit a CustomJob (REST JSON body, see vertex/job.py: custom_job_body)."""
        from google.cloud import aiplatform_v1

        job = aiplatform_v1.CustomJob.from_json(json.dumps(body))
        created = self._call(
            f"Vertex AI create job in {self.region}",
            lambda: self._client("jobs").create_custom_job(
                parent=parent(self.project, self.region), custom_job=job, timeout=60
            ),
        )
        return parse_job(_as_json(created))

    def list_jobs(self, labels: Mapping[str, str]) -> list[JobStatus]:
        """The region's jobs carrying all these labels, newest first. Filtered here: the API's
        filter syntax for label keys with '-' (gputrain-stack) is not documented."""

        def fetch() -> list[JobStatus]:
            from google.cloud import aiplatform_v1

            request = aiplatform_v1.ListCustomJobsRequest(
                parent=parent(self.project, self.region), page_size=100
            )
            pages = self._client("jobs").list_custom_jobs(request=request, timeout=60)
            jobs = [parse_job(_as_json(job)) for job in pages]
            return [j for j in jobs if all(j.labels.get(k) == v for k, v in labels.items())]

        return list(self._call(f"Vertex AI list jobs in {self.region}", fetch))

    def get_job(self, name: str) -> JobStatus:
        job = self._call(
            f"Vertex AI get job {name}",
            lambda: self._client("jobs").get_custom_job(name=name, timeout=60),
        )
        return parse_job(_as_json(job))

    def cancel_job(self, name: str) -> None:
        """Ask Vertex to cancel; a job that already ended is left as it is."""
        from google.api_core import exceptions as gexc

        try:
            self._call(
                f"Vertex AI cancel job {name}",
                lambda: self._client("jobs").cancel_custom_job(name=name, timeout=60),
            )
        except VertexApiError as e:
            # FAILED_PRECONDITION travels as HTTP 400: the job reached a final state first.
            if not isinstance(e.__cause__, gexc.BadRequest):
                raise
            if not self.get_job(name).done:
                raise

    def cancel_and_wait(
        self,
        name: str,
        *,
        poll_s: float = 5.0,
        timeout_s: float = 600.0,
        on_state: Callable[[JobStatus, dt.datetime], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> JobStatus:
        """Cancel and poll until the job is in a final state (CANCELLED, or whatever it reached)."""
        status = self.get_job(name)
        if not status.done:
            self.cancel_job(name)
        deadline = time.monotonic() + timeout_s
        last = ""
        while True:
            status = self.get_job(name)
            if on_state and status.state != last:
                on_state(status, _utcnow())
            last = status.state
            if status.done:
                return status
            if time.monotonic() > deadline:
                raise VertexApiError(
                    f"Vertex job {status.job_id} is still {status.short_state} {timeout_s:.0f} s "
                    f"after cancel; check `gcloud ai custom-jobs describe {name}`"
                )
            sleep(poll_s)

    # -- logs

    def log_lines(self, job_id: str, cursor: LogCursor) -> list[LogLine]:
        """The job's log entries not seen before (resource ml_job, label job_id), oldest first."""
        from google.cloud import logging_v2

        def fetch() -> list[LogLine]:
            entries = self._client("logging").list_entries(
                resource_names=[f"projects/{self.project}"],
                filter_=cursor.filter(job_id),
                order_by=logging_v2.ASCENDING,
                page_size=1000,
            )
            return [_log_line(e) for e in entries]

        return cursor.take(
            self._call(f"Cloud Logging read logs of Vertex job {job_id}", fetch, api="logging")
        )

    # -- following a job

    def follow(
        self,
        name: str,
        *,
        on_state: Callable[[JobStatus, dt.datetime], None],
        on_lines: Callable[[list[str]], None],
        poll_s: float = 15.0,
        settle_s: float = 5.0,
        tail: int = 20,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Followed:
        """Poll the job until it ends: every state change to on_state (with when it was seen),
        every new log line ([replica] prefixed) to on_lines; once more after the end, since
        Cloud Logging delivers the last lines a few seconds late."""
        last_state, cursor = "", None
        recent: collections.deque[str] = collections.deque(maxlen=tail)
        while True:
            status = self.get_job(name)
            if status.state != last_state:
                on_state(status, _utcnow())
                last_state = status.state
            if cursor is None:
                cursor = LogCursor(since=status.create_time)
            if status.done:
                sleep(settle_s)
            lines = format_log_lines(
                self.log_lines(status.job_id, cursor), reducers=status.reducers
            )
            if lines:
                recent.extend(lines)
                on_lines(lines)
            if status.done:
                return Followed(status, tuple(recent))
            sleep(poll_s)


# ---- helpers -------------------------------------------------------------------------------------


def _as_json(message: Any) -> dict[str, Any]:
    """A proto-plus message as the REST JSON the API speaks (camelCase, enum names)."""
    return json.loads(type(message).to_json(message, use_integers_for_enums=False))


def _log_line(entry: Any) -> LogLine:
    """A google-cloud-logging entry -> LogLine; text from textPayload or jsonPayload.message."""
    payload = entry.payload
    if isinstance(payload, Mapping):
        text = str(payload.get("message", "")) or json.dumps(dict(payload), sort_keys=True)
    else:
        text = "" if payload is None else str(payload)
    labels = (entry.resource.labels if entry.resource else None) or {}
    return LogLine(
        timestamp=entry.timestamp or _utcnow(),
        insert_id=entry.insert_id or "",
        task=labels.get("task_name", ""),
        text=text,
        severity=entry.severity or "DEFAULT",
    )


def _one_line(e: object) -> str:
    return " ".join(str(e).split())


def _message(e: Any) -> str:
    """The server's message on one line, without the "POST http://...: " api_core puts first."""
    from infra.gcp.api import message

    return _one_line(message(e))


def _code(e: Any) -> str:
    code = getattr(e, "code", None)
    return str(int(code)) if code is not None else type(e).__name__
