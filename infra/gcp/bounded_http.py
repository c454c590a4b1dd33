"""How long gputrain lets a Google API go unanswered. Every Google client it builds (api.py:
build_client, authorized_session, bounded) sends through BoundedAdapter, so no network, a firewall,
or an endpoint that refuses, never accepts or never answers ends in the adapter's one line: within
seconds when refused, CONNECT_S to UNREACHABLE_S and a connection more when connections time out,
READ_S when nothing answers. Left to themselves the libraries wait silently: Compute gives a call
600 s (the OS gives up a connection after about 2 min), Cloud Storage retries a refused connection
for 2 min, a token refresh waits up to 120 s a try. Imported by api.py's functions only.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

#: The longest one connection to a Google API may take: Google's front ends accept one within a
#: second from anywhere, so 10 s (room for a few lost packets) without one is no network, a
#: firewall or a wrong endpoint. Tests shorten it.
CONNECT_S = 10.0
#: How long, or how many times on end, connections to an API may fail before the library's own
#: retries are cut short (Cloud Storage's would go on for 2 min): a blip passes; a dead network is
#: one line within seconds when refused, 30 s when nothing answers (as a dataset listing's or a
#: secret's read). Tests shorten it.
UNREACHABLE_S = 30.0
FAILED_CONNECTIONS = 4
#: The longest a Google API may take to answer a request (Compute's calls would wait 600 s, with
#: no timeout for ever): the libraries' own 60 s elsewhere.
READ_S = 60.0


class Unreachable(OSError):
    """An API gave no answer (refused, not connected, silent) UNREACHABLE_S or FAILED_CONNECTIONS
    times on end. An OSError, which every adapter says as "cannot reach it"; no ConnectionError
    nor Timeout, which the libraries' retry predicates retry."""


class BoundedAdapter(HTTPAdapter):
    """requests' adapter with every request bounded (a connection within CONNECT_S, an answer
    within READ_S or the caller's shorter timeout), and Unreachable once requests have failed so
    on end (the library retrying them) for UNREACHABLE_S or FAILED_CONNECTIONS times; a response
    of any status ends the run."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failing_since: float | None = None  # when the current run of failed requests began
        self.failed = 0  # how many it holds

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        bounded = (min(connect or CONNECT_S, CONNECT_S), min(read or READ_S, READ_S))
        started = time.monotonic()
        try:
            response = super().send(request, stream, bounded, verify, cert, proxies)
        except (requests.ConnectionError, requests.Timeout) as e:  # refused, no name, no answer
            since = self.failing_since = self.failing_since or started
            self.failed += 1
            waited = time.monotonic() - since
            if waited < UNREACHABLE_S and self.failed < FAILED_CONNECTIONS:
                raise
            said = (str(e).strip().splitlines() or [""])[0][:200]
            host = urlsplit(request.url or "").netloc
            raise Unreachable(
                f"no answer from {host} in {self.failed} tries over {waited:.0f} s "
                f"({type(e).__name__}: {said})"
            ) from e
        self.failing_since, self.failed = None, 0
        return response


def bound(session: requests.Session) -> requests.Session:
    """`session`, and the session its credentials refresh through (google-auth's
    AuthorizedSession keeps one), sending http(s) through BoundedAdapter with the retries their
    adapters had. An adapter of another kind (mutual TLS) is left as it is."""
    refresh: requests.Session | None = getattr(session, "_auth_request_session", None)
    for each in (session, refresh) if refresh is not None else (session,):
        for prefix, adapter in list(each.adapters.items()):
            if type(adapter) is HTTPAdapter and prefix in ("https://", "http://"):
                each.mount(prefix, BoundedAdapter(max_retries=adapter.max_retries))
    return session
