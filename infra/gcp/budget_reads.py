"""Thin adapter for the reads the sweep needs of `billingBudget`'s guard: the project's Pub/Sub
topics and subscriptions (Pub/Sub v1 `projects.topics.list`, `projects.subscriptions.list`) and
the billing account's budgets (Cloud Billing Budget API v1 `billingAccounts.budgets.list`). REST,
all pages, plain names; like infra/gcp/cloud_run.py, an endpoint for a local fake.

A budget belongs to the billing account, not the project; with a user's credentials the Budget
API wants a quota project, so the request names the stack's in `X-Goog-User-Project` (Google's
system parameters: https://cloud.google.com/apis/docs/system-parameters), as the program's
provider does with `billing_project` (infra/components/budget_guard.py). Checked against
documentation only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.gcp.api import authorized_session, list_all

PUBSUB_ENDPOINT = "https://pubsub.googleapis.com"
BUDGETS_ENDPOINT = "https://billingbudgets.googleapis.com"


@dataclass(frozen=True)
class BudgetInfo:
    name: str  # billingAccounts/ACCOUNT/budgets/ID
    display_name: str


class BudgetReadsApi:
    """`pubsub_endpoint` / `budgets_endpoint`: a local fake's URL (then no real credentials)."""

    def __init__(
        self, pubsub_endpoint: str | None = None, budgets_endpoint: str | None = None
    ) -> None:
        self.pubsub_endpoint, self.budgets_endpoint = pubsub_endpoint, budgets_endpoint
        self._sessions: dict[str, Any] = {}

    def _session(self, label: str, endpoint: str | None, quota_project: str = "") -> Any:
        if label not in self._sessions:
            self._sessions[label] = authorized_session(label, endpoint)
        session = self._sessions[label]
        if quota_project:
            session.headers["X-Goog-User-Project"] = quota_project
        return session

    def topics(self, project: str) -> list[str]:
        """The full names (projects/P/topics/T) of the project's topics."""
        return self._pubsub(project, "topics")

    def subscriptions(self, project: str) -> list[str]:
        """The full names (projects/P/subscriptions/S) of the project's subscriptions."""
        return self._pubsub(project, "subscriptions")

    def _pubsub(self, project: str, key: str) -> list[str]:
        url = f"{self.pubsub_endpoint or PUBSUB_ENDPOINT}/v1/projects/{project}/{key}"
        session = self._session("Pub/Sub", self.pubsub_endpoint)
        return [item["name"] for item in list_all(session, f"Pub/Sub {key}.list", url, key)]

    def budgets(self, account: str, quota_project: str) -> list[BudgetInfo]:
        """Every budget of the billing account `account` (012345-6789AB-CDEF01)."""
        base = self.budgets_endpoint or BUDGETS_ENDPOINT
        url = f"{base}/v1/billingAccounts/{account}/budgets"
        session = self._session("Cloud Billing Budget", self.budgets_endpoint, quota_project)
        return [
            BudgetInfo(b["name"], b.get("displayName", ""))
            for b in list_all(session, "Cloud Billing budgets.list", url, "budgets")
        ]
