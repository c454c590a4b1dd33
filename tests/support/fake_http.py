"""What every fake Google REST API of the tests shares: a threaded HTTP server on a free loopback
port, started and stopped with the fake, and JSON answers with the headers the real clients read.
Each fake keeps its own routing (`_handler_class`) and state."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

T = TypeVar("T", bound="FakeHttpServer")


class FakeHttpServer:
    """Subclasses build their request handler class in `_handler_class()`."""

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def _serve(self) -> None:
        """Call at the end of __init__: the server is bound (its port known), not started."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self: T) -> T:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self: T) -> T:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def send_json(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
    """A JSON answer as Google's APIs give it."""
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json; charset=UTF-8")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
