"""The IAM side of the fake Google APIs, mixed into tests/fake_compute.FakeCompute (one server, one
world): IAM's `projects.serviceAccounts.list` (GET /v1/projects/P/serviceAccounts),
`projects.roles.list` (GET /v1/projects/P/roles) and Cloud
Resource Manager's `projects.getIamPolicy` (POST /v3/projects/P:getIamPolicy), in their real JSON
shapes (camelCase, `nextPageToken` paging, a Policy with version, etag and bindings)."""

from __future__ import annotations

import base64
import itertools
import re
from typing import Any

PAGE_SIZE = 2  # small: a sweep crosses a page boundary with three accounts


class FakeIamMixin:
    """State and routes; FakeCompute provides `project`, `_lock` and the HTTP plumbing."""

    project: str
    _lock: Any

    def _init_iam(self) -> None:
        self.service_accounts: dict[str, dict[str, Any]] = {}  # email -> body
        self.iam_bindings: dict[str, list[str]] = {"roles/owner": ["user:owner@example.com"]}
        self.custom_roles: dict[str, bool] = {}  # role id -> deleted
        self._iam_ids = itertools.count(104_000_000_000_000_000_001)
        self._policy_version = itertools.count(1)

    # -- seeding

    def add_service_account(self, account_id: str, display_name: str = "") -> str:
        email = f"{account_id}@{self.project}.iam.gserviceaccount.com"
        uid = str(next(self._iam_ids))
        with self._lock:
            self.service_accounts[email] = {
                "name": f"projects/{self.project}/serviceAccounts/{email}",
                "projectId": self.project,
                "uniqueId": uid,
                "email": email,
                "displayName": display_name,
                "etag": base64.b64encode(uid.encode()[:8]).decode(),
                "oauth2ClientId": uid,
            }
        return email

    def remove_service_account(self, email: str) -> None:
        """As IAM does: bindings that named it now name `deleted:serviceAccount:...?uid=...`."""
        with self._lock:
            body = self.service_accounts.pop(email, None)
            if body is None:
                return
            for members in self.iam_bindings.values():
                members[:] = [
                    f"deleted:{m}?uid={body['uniqueId']}" if m == f"serviceAccount:{email}" else m
                    for m in members
                ]

    def add_custom_role(self, role_id: str, deleted: bool = False) -> None:
        with self._lock:
            self.custom_roles[role_id] = deleted

    def add_role_binding(self, role: str, member: str) -> None:
        with self._lock:
            members = self.iam_bindings.setdefault(role, [])
            if member not in members:
                members.append(member)

    def remove_role_binding(self, role: str, member: str) -> None:
        with self._lock:
            members = self.iam_bindings.get(role, [])
            members[:] = [
                m for m in members if m != member and not m.startswith(f"deleted:{member}?")
            ]
            if not members:
                self.iam_bindings.pop(role, None)

    # -- routes (None: not an IAM path)

    def _route_iam(self, method: str, path: str, query: dict[str, str]) -> Any:
        from tests.support.fake_compute import _HttpError, _not_found

        m = re.fullmatch(r"/v1/projects/([^/]+)/serviceAccounts", path)
        if m and method == "GET":
            self._iam_project(m.group(1), "iam.serviceAccounts.list")
            items = sorted(self.service_accounts.values(), key=lambda b: b["email"])
            start = int(query.get("pageToken") or 0)
            size = min(int(query.get("pageSize") or PAGE_SIZE), PAGE_SIZE)
            body: dict[str, Any] = {"accounts": items[start : start + size]}
            if start + size < len(items):
                body["nextPageToken"] = str(start + size)
            return body
        m = re.fullmatch(r"/v1/projects/([^/]+)/roles", path)
        if m and method == "GET":  # projects.roles.list: the deleted ones only with showDeleted
            self._iam_project(m.group(1), "iam.roles.list")
            shown = query.get("showDeleted") == "true"
            roles = [
                {
                    "name": f"projects/{self.project}/roles/{rid}",
                    "title": rid,
                    "etag": "BwW=",
                    **({"deleted": True} if deleted else {}),
                }
                for rid, deleted in sorted(self.custom_roles.items())
                if shown or not deleted
            ]
            start = int(query.get("pageToken") or 0)
            size = min(int(query.get("pageSize") or PAGE_SIZE), PAGE_SIZE)
            page: dict[str, Any] = {"roles": roles[start : start + size]}
            if start + size < len(roles):
                page["nextPageToken"] = str(start + size)
            return page
        m = re.fullmatch(r"/v3/projects/([^/:]+):getIamPolicy", path)
        if m:
            if method != "POST":
                raise _HttpError(405, "getIamPolicy is a POST", "badRequest")
            self._iam_project(m.group(1), "resourcemanager.projects.getIamPolicy")
            return {
                "version": 1,
                "etag": base64.b64encode(
                    b"\x07\x05" + bytes([next(self._policy_version) % 256])
                ).decode(),
                "bindings": [
                    {"role": role, "members": list(members)}
                    for role, members in sorted(self.iam_bindings.items())
                    if members
                ],
            }
        if path.startswith(("/v1/projects/", "/v3/projects/")):
            raise _not_found(path)
        return None

    def _iam_project(self, project: str, permission: str) -> None:
        from tests.support.fake_compute import _HttpError

        if project != self.project:
            raise _HttpError(
                403,
                f"Permission '{permission}' denied on resource 'projects/{project}'",
                "forbidden",
            )
