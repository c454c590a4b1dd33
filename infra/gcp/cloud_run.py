"""Thin adapter for the two reads the sweep needs of laptop-closed recovery: the Cloud Run jobs of
a project in one region (Cloud Run Admin API v2 `projects.locations.jobs.list`, with their labels)
and its Cloud Scheduler jobs there (Cloud Scheduler v1 `projects.locations.jobs.list`; a
Scheduler job has no labels, so the sweep matches it by name). REST, all pages, plain results;
like infra/gcp/artifact_registry.py, lazy Google imports and an endpoint for a local fake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.gcp.api import authorized_session, list_all

RUN_ENDPOINT = "https://run.googleapis.com"
SCHEDULER_ENDPOINT = "https://cloudscheduler.googleapis.com"


@dataclass(frozen=True)
class JobInfo:
    name: str  # the job id: the last part of its resource name
    location: str
    labels: dict[str, str] = field(default_factory=dict)


class ReconcileJobsApi:
    """`run_endpoint` / `scheduler_endpoint`: a local fake's URL (then no real credentials)."""

    def __init__(
        self, run_endpoint: str | None = None, scheduler_endpoint: str | None = None
    ) -> None:
        self.run_endpoint, self.scheduler_endpoint = run_endpoint, scheduler_endpoint
        self._session: Any = None

    def _authorized(self) -> Any:
        if self._session is None:
            endpoint = self.run_endpoint or self.scheduler_endpoint
            self._session = authorized_session("Cloud Run", endpoint)
        return self._session

    def run_jobs(self, project: str, location: str) -> list[JobInfo]:
        """Every Cloud Run job of the project in `location`."""
        base = self.run_endpoint or RUN_ENDPOINT
        url = f"{base}/v2/projects/{project}/locations/{location}/jobs"
        return self._list("Cloud Run jobs.list", url, location)

    def scheduler_jobs(self, project: str, location: str) -> list[JobInfo]:
        """Every Cloud Scheduler job of the project in `location`."""
        base = self.scheduler_endpoint or SCHEDULER_ENDPOINT
        url = f"{base}/v1/projects/{project}/locations/{location}/jobs"
        return self._list("Cloud Scheduler jobs.list", url, location)

    def _list(self, label: str, url: str, location: str) -> list[JobInfo]:
        return [
            JobInfo(job["name"].rsplit("/", 1)[-1], location, dict(job.get("labels") or {}))
            for job in list_all(self._authorized(), label, url, "jobs")
        ]
