"""The stack's Cloud Billing budget guard on the head (`billingBudget`): the budget sends every
update to a Pub/Sub topic of the stack; the head's watchdog (`budget_guard.py` beside it, standard
library only) pulls the topic's subscription through Pub/Sub's REST API with the VM's token and
stops the run once a notification's costAmount has reached its budgetAmount. Notifications come
a few times a day and lag the usage: a coarse, project-wide bound next to the run's own budget.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.request import Request, urlopen

PUBSUB_ENDPOINT_ENV = "GPUTRAIN_PUBSUB_ENDPOINT"  # tests: the fake Pub/Sub API
GUARD = "billingBudget"  # the budget mark's `by` (contract.GUARD_STOP)


def in_period(data: dict[str, Any], now: float | None) -> bool:
    """Whether the notification's budget month (from its costIntervalStart) has not ended: last
    month's, still retained, says nothing of this one. Pure."""
    start = data.get("costIntervalStart")
    if now is None or not isinstance(start, str):
        return True
    try:
        begun = datetime.fromisoformat(start.replace("Z", "+00:00"))
        ends = begun.replace(year=begun.year + begun.month // 12, month=begun.month % 12 + 1)
    except ValueError:
        return True
    return now < ends.timestamp()


def reached_by(received: dict[str, Any], now: float | None = None) -> dict[str, Any] | None:
    """The budget mark's figures when this message is a notification of this budget month whose
    costAmount has reached its budgetAmount (its base64 `data`); None for anything else. Pure."""
    try:
        data = json.loads(base64.b64decode(received["message"]["data"]))
        cost, amount = float(data["costAmount"]), float(data["budgetAmount"])
    except (KeyError, TypeError, ValueError):
        return None  # not a budget notification: acknowledged and left
    if cost < amount or not in_period(data, now):
        return None
    return {"spent_usd": cost, "budget_usd": amount, "by": GUARD}


def guard_reached(
    messages: list[dict[str, Any]], now: float | None = None
) -> dict[str, Any] | None:
    """The last message's figures that reached the budget (reached_by). Pure."""
    found = [hit for received in messages if (hit := reached_by(received, now)) is not None]
    return found[-1] if found else None


def pull(subscription: str, keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Pub/Sub v1 subscriptions.pull, then .acknowledge of every message but those `keep` says
    (left for the next pull, also the next run's: Pub/Sub delivers them again), with this VM's
    token from the metadata server: no client library to install."""
    md = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    ask = Request(f"http://{md}/computeMetadata/v1/instance/service-accounts/default/token")
    ask.add_header("Metadata-Flavor", "Google")
    with urlopen(ask, timeout=10) as r:
        auth = {"Authorization": f"Bearer {json.loads(r.read())['access_token']}"}
    base = os.environ.get(PUBSUB_ENDPOINT_ENV) or "https://pubsub.googleapis.com"

    def post(verb: str, body: dict[str, Any]) -> Any:
        data = json.dumps(body).encode()
        req = Request(f"{base}/v1/{subscription}:{verb}", data, auth, method="POST")
        with urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")

    received = list(post("pull", {"maxMessages": 100}).get("receivedMessages", []))
    done = [m["ackId"] for m in received if not keep(m)]
    if done:
        post("acknowledge", {"ackIds": done})
    return received


class Guard:
    """Pulls every `poll_s` (the first at once: a budget already spent stops the run early)
    until a notification of this month has reached the budget, then keeps saying so. That one is
    never acknowledged: the next run's first pull gets it too (within the subscription's day)."""

    def __init__(self, subscription: str, poll_s: float, log: Callable[[str], None]) -> None:
        self.subscription, self.poll_s, self.log = subscription, poll_s, log
        self.next_pull = 0.0
        self.hit: dict[str, Any] | None = None

    def reached(self, now: float) -> dict[str, Any] | None:
        if self.hit is None and now >= self.next_pull:
            self.next_pull = now + self.poll_s
            try:
                received = pull(self.subscription, lambda m: reached_by(m, now) is not None)
                self.hit = guard_reached(received, now)
            except Exception as e:  # the network: the next pull tries again
                self.log(f"could not read the billing budget's notifications: {e!r}")
        return self.hit
