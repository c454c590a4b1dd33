"""Thin adapter for the one Artifact Registry read the sweep needs: the repositories of a project
in one region (`projects.locations.repositories.list`, REST), with their labels. Like
infra/gcp/iam.py: plain results, lazy Google imports, an `api_endpoint` for a local fake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.gcp.api import authorized_session, list_all

ENDPOINT = "https://artifactregistry.googleapis.com"
ENDPOINT_ENV = "GPUTRAIN_ARTIFACTREGISTRY_ENDPOINT"


@dataclass(frozen=True)
class RepositoryInfo:
    name: str  # the repository id
    location: str
    format: str
    labels: dict[str, str] = field(default_factory=dict)


class ArtifactRegistryApi:
    def __init__(self, api_endpoint: str | None = None) -> None:
        self.api_endpoint = api_endpoint
        self._session: Any = None

    def _authorized(self) -> Any:
        if self._session is None:
            self._session = authorized_session("Artifact Registry", self.api_endpoint)
        return self._session

    def repositories(self, project: str, location: str) -> list[RepositoryInfo]:
        """Every repository of the project in `location` (all pages)."""
        label = "Artifact Registry repositories.list"
        url = f"{self.api_endpoint or ENDPOINT}/v1/projects/{project}/locations/{location}/repositories"
        return [
            RepositoryInfo(
                repo["name"].rsplit("/", 1)[-1],
                location,
                repo.get("format", ""),
                dict(repo.get("labels") or {}),
            )
            for repo in list_all(self._authorized(), label, url, "repositories")
        ]
