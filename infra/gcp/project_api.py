"""Thin adapter over Cloud Resource Manager (v3) and Service Usage (v1), for `gputrain doctor`: is
the project there and visible, which APIs are enabled, which IAM permissions the caller holds.

Plain results, one-line GoogleApiErrors (infra/gcp/api.py); clients over REST, built lazily, and
pointed at a local server with anonymous credentials when `api_endpoint` is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.gcp.api import GoogleApiError, build_client, call

BATCH_GET_MAX = 30  # Service Usage's services:batchGet takes at most 30 names
PERMISSIONS_PER_CALL = 100


@dataclass(frozen=True)
class ProjectInfo:
    project_id: str
    number: str  # "123456789012"
    state: str  # ACTIVE, DELETE_REQUESTED


class ProjectApi:
    def __init__(self, api_endpoint: str | None = None) -> None:
        self.api_endpoint = api_endpoint
        self._clients: dict[str, Any] = {}

    def _client(self, kind: str) -> Any:
        if kind not in self._clients:
            factory: Any
            if kind == "projects":
                from google.cloud import resourcemanager_v3

                factory, label = resourcemanager_v3.ProjectsClient, "Resource Manager"
            else:
                from google.cloud import service_usage_v1

                factory, label = service_usage_v1.ServiceUsageClient, "Service Usage"
            self._clients[kind] = build_client(factory, label, self.api_endpoint, transport="rest")
        return self._clients[kind]

    def project(self, project_id: str) -> ProjectInfo | None:
        """The project, or None when it does not exist or the caller cannot see it (Resource
        Manager answers 403 for both)."""
        try:
            p = call(
                f"Resource Manager projects.get {project_id}",
                lambda: self._client("projects").get_project(name=f"projects/{project_id}"),
                not_found=None,
            )
        except GoogleApiError as e:
            if e.code == 403 and not e.api_disabled:
                return None
            raise
        if p is None:
            return None
        return ProjectInfo(p.project_id, p.name.rsplit("/", 1)[-1], p.state.name)

    def service_states(self, project: str, services: list[str]) -> dict[str, str]:
        """service name (compute.googleapis.com) -> ENABLED / DISABLED."""
        states: dict[str, str] = {}
        for i in range(0, len(services), BATCH_GET_MAX):
            names = [f"projects/{project}/services/{s}" for s in services[i : i + BATCH_GET_MAX]]
            got = call(
                "Service Usage services.batchGet",
                lambda names=names: self._client("services").batch_get_services(  # type: ignore[misc]
                    request={"parent": f"projects/{project}", "names": names}
                ),
            )
            for s in got.services:
                states[s.name.rsplit("/", 1)[-1]] = s.state.name
        return states

    def granted_permissions(self, project: str, permissions: list[str]) -> set[str]:
        """The subset of `permissions` the caller holds on the project (testIamPermissions)."""
        granted: set[str] = set()
        for i in range(0, len(permissions), PERMISSIONS_PER_CALL):
            chunk = permissions[i : i + PERMISSIONS_PER_CALL]
            got = call(
                "Resource Manager projects.testIamPermissions",
                lambda chunk=chunk: self._client("projects").test_iam_permissions(  # type: ignore[misc]
                    request={"resource": f"projects/{project}", "permissions": chunk}
                ),
            )
            granted |= set(got.permissions)
        return granted
