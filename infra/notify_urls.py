"""The `notify` setting's webhook URLs (stack key, hosts-file key, `--notify`): http(s) only, and
secret — a webhook URL is its own credential, so messages show only `scheme://host/…`. Pure."""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import urlsplit

from infra.base.errors import UserError

ALLOWED = "allowed: http://HOST/... or https://HOST/... (a Slack/Discord-style incoming webhook)"


def redact(url: str) -> str:
    """`scheme://host/…`: enough to tell webhooks apart, never the secret path or query."""
    parts = urlsplit(url)
    if parts.scheme and parts.hostname:
        return f"{parts.scheme}://{parts.hostname}/…"
    return f"{parts.scheme}:…" if parts.scheme else "…"


def check_urls(urls: Sequence[object], setting: str) -> tuple[str, ...]:
    """Every URL http(s) with a host; one line naming the setting (the URL redacted) if not."""
    for i, url in enumerate(urls):
        where = setting if len(urls) == 1 else f"{setting}[{i}]"
        if not isinstance(url, str):
            raise UserError(f"{where}: not a URL; {ALLOWED}")
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"{where} {redact(url)}: not an http(s) URL; {ALLOWED}")
    return tuple(str(u).strip() for u in urls)


def parse_notify(raw: str, setting: str) -> tuple[str, ...]:
    """The stack key as the CLI passes it: a JSON list of strings (or one URL)."""
    raw = raw.strip()
    if not raw:
        return ()
    if not raw.startswith("["):
        return check_urls([raw], setting)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise UserError(f"{setting}: not a list of URLs; {ALLOWED}") from None
    if not isinstance(value, list):
        raise UserError(f"{setting}: not a list of URLs; {ALLOWED}")
    return check_urls(value, setting)
