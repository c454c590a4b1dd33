"""Thin adapter for the IAM reads the sweep needs: the project's service accounts (IAM API,
`projects.serviceAccounts.list`), its custom roles (`projects.roles.list`) and its role bindings
(Cloud Resource Manager, `projects.getIamPolicy`). Like infra/gcp/compute.py: plain results, lazy Google imports, and an
`api_endpoint` ("http://127.0.0.1:PORT") that points both at a fake with anonymous credentials.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from infra.gcp.compute import ComputeApiError

IAM_ENDPOINT = "https://iam.googleapis.com"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


@dataclass(frozen=True)
class ServiceAccountInfo:
    email: str
    display_name: str = ""

    @property
    def account_id(self) -> str:
        """The part before @ (what the program sets as account_id)."""
        return self.email.split("@", 1)[0]


class IamApi:
    """`service_accounts` over IAM's REST API (its Python client speaks gRPC only);
    `role_bindings` through google-cloud-resource-manager's REST transport."""

    def __init__(self, api_endpoint: str | None = None) -> None:
        self.api_endpoint = api_endpoint
        self._session: Any = None
        self._projects: Any = None

    def _credentials(self) -> Any:
        if self.api_endpoint:
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials()  # never real credentials to a test endpoint
        import google.auth

        try:
            return google.auth.default(scopes=list(SCOPES))[0]
        except Exception as e:  # DefaultCredentialsError
            raise ComputeApiError(
                f"cannot build an IAM client ({type(e).__name__}: {e}); "
                "run `gcloud auth application-default login`"
            ) from e

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        from google.api_core import exceptions as gexc

        try:
            return fn()
        except gexc.GoogleAPICallError as e:
            raise ComputeApiError(f"{what}: {e.code} {getattr(e, 'message', e)}") from e
        except OSError as e:  # requests' connection errors
            raise ComputeApiError(f"{what}: {e}") from e

    def service_accounts(self, project: str) -> list[ServiceAccountInfo]:
        """Every service account of the project (all pages)."""
        from google.auth.transport.requests import AuthorizedSession

        if self._session is None:
            self._session = AuthorizedSession(self._credentials())
        url = f"{self.api_endpoint or IAM_ENDPOINT}/v1/projects/{project}/serviceAccounts"
        found: list[ServiceAccountInfo] = []
        token = ""
        while True:
            params = {"pageSize": "100", **({"pageToken": token} if token else {})}
            r = self._call(
                "IAM serviceAccounts.list", partial(self._session.get, url, params=params)
            )
            body = r.json() if r.content else {}
            if r.status_code != 200:
                message = (body.get("error") or {}).get("message", r.text[:200])
                raise ComputeApiError(f"IAM serviceAccounts.list: {r.status_code} {message}")
            found += [
                ServiceAccountInfo(a["email"], a.get("displayName", ""))
                for a in body.get("accounts", [])
            ]
            token = body.get("nextPageToken", "")
            if not token:
                return found

    def custom_roles(self, project: str) -> list[str]:
        """The ids of the project's custom roles that are not deleted (IAM `projects.roles.list`,
        all pages; a deleted role lingers up to 37 days, grants nothing and costs nothing)."""
        from google.auth.transport.requests import AuthorizedSession

        if self._session is None:
            self._session = AuthorizedSession(self._credentials())
        url = f"{self.api_endpoint or IAM_ENDPOINT}/v1/projects/{project}/roles"
        found: list[str] = []
        token = ""
        while True:
            params = {"pageSize": "100", **({"pageToken": token} if token else {})}
            r = self._call("IAM roles.list", partial(self._session.get, url, params=params))
            body = r.json() if r.content else {}
            if r.status_code != 200:
                message = (body.get("error") or {}).get("message", r.text[:200])
                raise ComputeApiError(f"IAM roles.list: {r.status_code} {message}")
            found += [
                role["name"].rpartition("/")[2]
                for role in body.get("roles", [])
                if not role.get("deleted")
            ]
            token = body.get("nextPageToken", "")
            if not token:
                return found

    def role_bindings(self, project: str) -> list[tuple[str, str]]:
        """(role, member) for every member of every binding in the project's IAM policy."""
        if self._projects is None:
            from google.cloud import resourcemanager_v3

            options = {"api_endpoint": self.api_endpoint} if self.api_endpoint else None
            self._projects = resourcemanager_v3.ProjectsClient(
                credentials=self._credentials(), transport="rest", client_options=options
            )
        policy = self._call(
            "Cloud Resource Manager projects.getIamPolicy",
            lambda: self._projects.get_iam_policy(request={"resource": f"projects/{project}"}),
        )
        return [(b.role, m) for b in policy.bindings for m in b.members]
