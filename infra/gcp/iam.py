"""Thin adapter for the IAM reads the sweep needs: the project's service accounts (IAM API,
`projects.serviceAccounts.list`), its custom roles (`projects.roles.list`) and its role bindings
(Cloud Resource Manager, `projects.getIamPolicy`). Like infra/gcp/compute.py: plain results, lazy Google imports, and an
`api_endpoint` ("http://127.0.0.1:PORT") that points both at a fake with anonymous credentials.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.gcp.api import authorized_session, build_client, call, list_all

IAM_ENDPOINT = "https://iam.googleapis.com"


@dataclass(frozen=True)
class ServiceAccountInfo:
    email: str
    display_name: str = ""

    @property
    def account_id(self) -> str:
        """The part before @ (what the program sets as account_id)."""
        return self.email.split("@", 1)[0]


class IamApi:
    """`service_accounts` and `custom_roles` over IAM's REST API (its Python client speaks gRPC
    only); `role_bindings` through google-cloud-resource-manager's REST transport."""

    def __init__(self, api_endpoint: str | None = None) -> None:
        self.api_endpoint = api_endpoint
        self._session: Any = None
        self._projects: Any = None

    def _list(self, label: str, path: str, key: str) -> list[dict[str, Any]]:
        if self._session is None:
            self._session = authorized_session("IAM", self.api_endpoint)
        return list_all(self._session, label, f"{self.api_endpoint or IAM_ENDPOINT}{path}", key)

    def service_accounts(self, project: str) -> list[ServiceAccountInfo]:
        """Every service account of the project (all pages)."""
        found = self._list(
            "IAM serviceAccounts.list", f"/v1/projects/{project}/serviceAccounts", "accounts"
        )
        return [ServiceAccountInfo(a["email"], a.get("displayName", "")) for a in found]

    def custom_roles(self, project: str) -> list[str]:
        """The ids of the project's custom roles that are not deleted (IAM `projects.roles.list`,
        all pages; a deleted role lingers up to 37 days, grants nothing and costs nothing)."""
        found = self._list("IAM roles.list", f"/v1/projects/{project}/roles", "roles")
        return [role["name"].rpartition("/")[2] for role in found if not role.get("deleted")]

    def role_bindings(self, project: str) -> list[tuple[str, str]]:
        """(role, member) for every member of every binding in the project's IAM policy."""
        label = "Cloud Resource Manager projects.getIamPolicy"
        if self._projects is None:
            from google.cloud import resourcemanager_v3

            self._projects = build_client(
                resourcemanager_v3.ProjectsClient, label, self.api_endpoint, transport="rest"
            )
        policy = call(
            label,
            lambda: self._projects.get_iam_policy(request={"resource": f"projects/{project}"}),
        )
        return [(b.role, m) for b in policy.bindings for m in b.members]
