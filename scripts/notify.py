"""Notifications: a JSON POST per run event (started, preempted, recovered, failed, finished,
budget, autodown) to each `notify` URL (stack key, hosts-file key, `--notify`). The body carries `text`,
so a Slack or Discord incoming webhook shows it as it is. Delivery runs on a background thread
with retries and backoff; a webhook that fails or hangs costs one warning line and never fails or
blocks the run. The URLs are secrets (a webhook URL is its own credential): never printed or
logged in full, only `scheme://host/…`.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from infra.keys import check_urls, redact
from scripts import ui

NOTIFY_ENV = "GPUTRAIN_NOTIFY"  # space-separated webhook URLs
EVENTS = ("started", "preempted", "recovered", "failed", "finished", "budget", "autodown")
ATTEMPTS = 3
TIMEOUT_S = 5.0  # one POST; a hanging webhook costs at most ATTEMPTS of these, off the run's path
BACKOFF_S = (1.0, 3.0)
DRAIN_S = 10.0  # at exit: how long queued notifications may still take, in all


def message(event: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body: the fields, plus `text` for chat webhooks. Pure."""
    where = f"{fields.get('stack') or fields.get('target')}"
    run = fields.get("run_id")
    bits = [f"gputrain {event}: run {run} on {where}"]
    if fields.get("nodes"):
        bits.append(f"{fields['nodes']} node(s)")
    if fields.get("step") is not None:
        bits.append(f"step {fields['step']}")
    for key, label, fmt in (
        ("final_loss", "loss", "{:.4f}"),
        ("tokens_per_s", "tokens/s", "{:,.0f}"),
        ("cost_usd", "cost so far", "${:.2f}"),
    ):
        if isinstance(fields.get(key), int | float):
            bits.append(f"{label} {fmt.format(fields[key])}")
    if fields.get("root_cause"):
        bits.append(f"root cause: {fields['root_cause']}")
    if fields.get("detail"):
        bits.append(str(fields["detail"]))
    return {"event": event, **fields, "text": "; ".join(bits)}


def post(url: str, body: Mapping[str, Any], timeout_s: float = TIMEOUT_S) -> int:
    """One POST; the HTTP status (an error raises OSError/URLError, a timeout too)."""
    import urllib.request

    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "gputrain"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        return int(answer.status)


class Notifier:
    """Queues events; one daemon thread per URL delivers them in order with retries, so a
    webhook that hangs delays only its own messages."""

    def __init__(
        self,
        urls: Sequence[str],
        base: Mapping[str, Any],
        *,
        attempts: int | None = None,
        timeout_s: float | None = None,
        backoff_s: Sequence[float] | None = None,
    ) -> None:
        self.urls, self.base = tuple(urls), dict(base)
        self.attempts = ATTEMPTS if attempts is None else attempts
        self.timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
        self.backoff_s = tuple(BACKOFF_S if backoff_s is None else backoff_s)
        self.warned: set[str] = set()  # one warning per URL, however many events fail
        self._queues: dict[str, queue.Queue[dict[str, Any] | None]] = {}
        self._threads: list[threading.Thread] = []

    def send(self, event: str, **fields: Any) -> None:
        """Never blocks: the message is queued for every URL."""
        body = message(event, {**self.base, **fields})
        for url in self.urls:
            if url not in self._queues:
                self._queues[url] = queue.Queue()
                t = threading.Thread(target=self._deliver, args=(url,), daemon=True, name="notify")
                t.start()
                self._threads.append(t)
            self._queues[url].put(body)

    def close(self, drain_s: float | None = None) -> None:
        """Let queued events go out for at most `drain_s` in all (daemon threads: a hanging
        webhook never holds the exit longer)."""
        for q in self._queues.values():
            q.put(None)
        end = time.monotonic() + (DRAIN_S if drain_s is None else drain_s)
        for t in self._threads:
            t.join(timeout=max(0.0, end - time.monotonic()))

    def _deliver(self, url: str) -> None:
        q = self._queues[url]
        while (body := q.get()) is not None:
            self._one(url, body)

    def _one(self, url: str, body: Mapping[str, Any]) -> None:
        why = ""
        for attempt in range(self.attempts):
            try:
                status = post(url, body, self.timeout_s)
                if 200 <= status < 300:
                    return
                why = f"HTTP {status}"
            except Exception as e:  # HTTPError (4xx/5xx), URLError, timeouts: all the same here
                code = getattr(e, "code", None)
                why = f"HTTP {code}" if code else type(e).__name__
            if attempt + 1 < self.attempts:
                time.sleep(self.backoff_s[min(attempt, len(self.backoff_s) - 1)])
        if url not in self.warned:
            self.warned.add(url)
            ui.warn(
                f"notify: {redact(url)} did not take the {body['event']!r} event ({why} after "
                f"{self.attempts} tries); the run goes on, later events are still tried"
            )


def run_notify_urls(given: Sequence[str], declared: Sequence[str]) -> tuple[str, ...]:
    """A run's webhook URLs: `--notify`, then $GPUTRAIN_NOTIFY (kept out of argv and shell
    history; checked here), then the target's own (`notify` in the stack or hosts file)."""
    from_env = os.environ.get(NOTIFY_ENV, "").split()
    return tuple(dict.fromkeys([*given, *check_urls(from_env, NOTIFY_ENV), *declared]))


def summary_fields(summary: Mapping[str, Any], cost_usd: float | None) -> dict[str, Any]:
    """`finished`'s figures from the trainer's summary.json. Pure."""
    out = {k: summary[k] for k in ("final_loss", "tokens_per_s") if k in summary}
    if isinstance(summary.get("steps"), int):
        out["step"] = summary["steps"]
    if cost_usd is not None:
        out["cost_usd"] = round(cost_usd, 2)
    return out
