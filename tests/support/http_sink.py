"""A local webhook for notification tests: real HTTP on loopback (or the test bed's bridge), every
POST's JSON body recorded with its arrival time; it answers 200, or 500, or hangs (never answers
within the client's timeout), or trickles (records the body, then sends its answer a byte every
second for `hang_s`: no single read ever times out)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.fake_http import FakeHttpServer


class HttpSink(FakeHttpServer):
    def __init__(self, mode: str = "ok", *, host: str = "127.0.0.1", hang_s: float = 30.0) -> None:
        self.mode, self.hang_s = mode, hang_s
        self.received: list[tuple[float, str, dict[str, Any]]] = []  # (time, path, body)
        self.attempts = 0
        self._lock = threading.Lock()
        self._serve(host)

    def events(self) -> list[str]:
        with self._lock:
            return [body.get("event", "?") for _, _, body in self.received]

    def wait_for(self, event: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                for _, _, body in self.received:
                    if body.get("event") == event:
                        return body
            time.sleep(0.05)
        raise AssertionError(f"no {event!r} within {timeout_s} s; got {self.events()}")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with sink._lock:
                    sink.attempts += 1
                if sink.mode == "hang":
                    time.sleep(sink.hang_s)
                    return
                if sink.mode in ("ok", "trickle"):
                    with sink._lock:
                        sink.received.append((time.time(), self.path, json.loads(data)))
                if sink.mode == "trickle":
                    end = time.monotonic() + sink.hang_s
                    try:
                        self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                        while time.monotonic() < end:
                            self.wfile.write(b"a")
                            self.wfile.flush()
                            time.sleep(1.0)
                    except OSError:  # the client gave up
                        pass
                    return
                status = 200 if sink.mode == "ok" else 500
                body = b"ok" if status == 200 else b"internal error"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler
