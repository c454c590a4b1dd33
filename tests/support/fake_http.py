"""What every fake Google REST API of the tests shares: a threaded HTTP server on a free loopback
port, started and stopped with the fake, and JSON answers with the headers the real clients read.
Each fake keeps its own routing (`_handler_class`) and state; unreachable_endpoint is where no
answer comes."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

T = TypeVar("T", bound="FakeHttpServer")


class FakeHttpServer:
    """Subclasses build their request handler class in `_handler_class()`."""

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def _serve(self, host: str = "127.0.0.1") -> None:
        """Call at the end of __init__: the server is bound (its port known), not started;
        `host` the test bed's bridge where the test hosts must reach it."""
        self._server = ThreadingHTTPServer((host, 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

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


@contextmanager
def unreachable_endpoint(kind: str) -> Iterator[str]:
    """An http://127.0.0.1:PORT that gives no answer, as Google does not without a network:
    "refuses" (nothing listens: refused at once), "never accepts" (a full listen queue drops the
    connection's packets, as a firewall does: it times out) or "never answers" (a connection is
    accepted, no answer comes)."""
    with contextlib.ExitStack() as held:
        listener = held.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        if kind == "refuses":
            listener.close()
        elif kind == "never accepts":
            listener.listen(0)
            for _ in range(3):  # queued, never accepted: the queue stays full
                filler = held.enter_context(socket.socket())
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
        else:
            listener.listen(16)
            listener.settimeout(0.05)
            done = threading.Event()
            accepted: list[socket.socket] = []

            def accept() -> None:
                while not done.is_set():
                    with contextlib.suppress(TimeoutError):
                        accepted.append(listener.accept()[0])
                for conn in accepted:
                    conn.close()

            thread = threading.Thread(target=accept, daemon=True)
            thread.start()
            held.callback(thread.join, 5)
            held.callback(done.set)
        yield f"http://127.0.0.1:{port}"
