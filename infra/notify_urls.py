"""The `notify` setting's webhook URLs (stack key, hosts-file key, `--notify`): http(s) only, and
secret — a webhook URL is its own credential, so messages show only `scheme://host/…`. Pure."""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import urlsplit

from infra.base.errors import UserError

ALLOWED = "allowed: http://HOST/... or https://HOST/... (a Slack/Discord-style incoming webhook)"


def redact(url: str) -> str:
    """`scheme://host/…`: enough to tell webhooks apart, never a user, password, path or query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # a malformed IPv6 address: nothing of it is shown
        return "…"
    if parts.scheme and host:
        return f"{parts.scheme}://{host}/…"
    return f"{parts.scheme}:…" if parts.scheme.isalpha() else "…"


def check_urls(urls: Sequence[object], setting: str) -> tuple[str, ...]:
    """Every URL http(s) with a host; one line naming the setting (the URL redacted) if not."""
    for i, url in enumerate(urls):
        where = setting if len(urls) == 1 else f"{setting}[{i}]"
        if not isinstance(url, str):
            raise UserError(f"{where}: not a URL; {ALLOWED}")
        try:
            parts = urlsplit(url.strip())
            host, _ = parts.hostname, parts.port
        except ValueError:  # "http://[::1/x", a port that is no number
            raise UserError(
                f"{where} {redact(url)}: not a valid URL (its host or port); {ALLOWED}"
            ) from None
        if parts.scheme not in ("http", "https") or not host:
            raise UserError(f"{where} {redact(url)}: not an http(s) URL; {ALLOWED}")
        if "@" in parts.netloc:  # user:password@ would be sent to every hop; say neither
            raise UserError(
                f"{where} {redact(url)}: a user or password in the URL is not allowed; {ALLOWED} "
                "(the webhook's own secret goes in its path or query)"
            )
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
