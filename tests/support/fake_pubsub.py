"""A fake Pub/Sub REST API (v1): `POST /v1/projects/P/subscriptions/S:pull` answers
`receivedMessages[]` of `{ackId, message: {data (base64), messageId, attributes, publishTime}}`
and `:acknowledge` takes `ackIds`; an unacknowledged message is delivered again, as Pub/Sub
redelivers after the ack deadline. A bearer token may be required, as the real API does.
The sweep's reads too, in pages of two: `GET /v1/projects/P/topics` and `.../subscriptions`
(`topics[]`, `subscriptions[]` of `{name}`), and the Cloud Billing Budget API's
`GET /v1/billingAccounts/A/budgets` (`budgets[]` of `{name, displayName}`)."""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.fake_http import FakeHttpServer, send_json

PAGE = 2  # small pages: the adapter must follow nextPageToken
_LIST = re.compile(r"^/v1/(projects/[^/]+/(topics|subscriptions)|billingAccounts/[^/]+/budgets)$")


class FakePubSub(FakeHttpServer):
    def __init__(self, subscription: str = "", *, host: str = "127.0.0.1") -> None:
        self.subscription = subscription  # projects/P/subscriptions/S
        self.listed: dict[str, list[dict[str, str]]] = {}  # a list's parent/kind -> its items
        self.quota_projects: list[str | None] = []  # each list request's X-Goog-User-Project
        self.required_token: str | None = None
        self.pulls = 0
        self.acked: list[str] = []
        self._waiting: dict[str, dict[str, Any]] = {}  # ackId -> message
        self._lock = threading.Lock()
        self._next = 0
        self._serve(host)

    def publish(self, data: dict[str, Any], **attributes: str) -> None:
        """A message as Cloud Billing publishes it: the notification's JSON in `data`."""
        with self._lock:
            self._next += 1
            self._waiting[f"ack-{self._next}"] = {
                "data": base64.b64encode(json.dumps(data).encode()).decode(),
                "messageId": str(self._next),
                "attributes": attributes,
                "publishTime": "2026-11-27T12:00:00Z",
            }

    def _answer(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == f"/v1/{self.subscription}:pull":
            with self._lock:
                self.pulls += 1
                n = int(body.get("maxMessages", 1))
                picked = list(self._waiting.items())[:n]
            return 200, {"receivedMessages": [{"ackId": a, "message": m} for a, m in picked]}
        if path == f"/v1/{self.subscription}:acknowledge":
            with self._lock:
                for ack in body.get("ackIds", []):
                    if self._waiting.pop(ack, None) is not None:
                        self.acked.append(ack)
            return 200, {}
        return 404, {"error": {"code": 404, "message": "Resource not found", "status": "NOT_FOUND"}}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if not (m := _LIST.match(url.path)):
                    send_json(self, 404, {"error": {"code": 404, "status": "NOT_FOUND"}})
                    return
                fake.quota_projects.append(self.headers.get("X-Goog-User-Project"))
                items = fake.listed.get(m[1], [])
                start = int(parse_qs(url.query).get("pageToken", ["0"])[0])
                key = m[1].rsplit("/", 1)[1]
                body: dict[str, Any] = {key: items[start : start + PAGE]}
                if start + PAGE < len(items):
                    body["nextPageToken"] = str(start + PAGE)
                send_json(self, 200, body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                want = fake.required_token
                if want and self.headers.get("Authorization") != f"Bearer {want}":
                    error = {"code": 401, "message": "bad token", "status": "UNAUTHENTICATED"}
                    send_json(self, 401, {"error": error})
                    return
                status, answer = fake._answer(self.path, body)
                send_json(self, status, answer)

        return Handler
