"""Thin adapter for the one Artifact Registry read the sweep needs: the repositories of a project
in one region (`projects.locations.repositories.list`, REST), with their labels. Like
infra/gcp/iam.py: plain results, lazy Google imports, an `api_endpoint` for a local fake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.gcp.api import ADC_FIX, GoogleApiError, list_all

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
            from google.auth.transport.requests import AuthorizedSession

            if self.api_endpoint:
                from google.auth.credentials import AnonymousCredentials

                creds: Any = AnonymousCredentials()  # never real credentials to a test server
            else:
                import google.auth

                try:
                    creds = google.auth.default(
                        scopes=["https://www.googleapis.com/auth/cloud-platform"]
                    )[0]
                except Exception as e:  # DefaultCredentialsError
                    raise GoogleApiError(
                        f"cannot build an Artifact Registry client ({e}); {ADC_FIX}",
                        credentials=True,
                    ) from e
            self._session = AuthorizedSession(creds)
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
