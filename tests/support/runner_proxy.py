"""The test's fake stack runner, served to a `gputrain` in another process (the fake Cloud Run
job's container, tests/support/controller_child.py): what the Pulumi CLI and the stack's state
backend are to the real job. Each StackRunner call (outputs, refresh, up, set_config, ...) goes
over a local authenticated connection to the runner in the test's process, which re-creates VMs
on the test bed there; its answer, or the exception it raised, comes back. Output callbacks
(`on_output`) stay in the calling process: the lines are not sent."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Client, Connection, Listener
from typing import Any


@contextmanager
def serving(runner: Any) -> Iterator[dict[str, Any]]:
    """Serve `runner` while the block runs; yields what the child needs to reach it (JSON)."""
    key = secrets.token_bytes(16)
    listener = Listener(("127.0.0.1", 0), authkey=key)
    stop = threading.Event()

    def answer(conn: Connection) -> None:
        with conn:
            while not stop.is_set():
                try:
                    name, args, kwargs = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    conn.send(("ok", getattr(runner, name)(*args, **kwargs)))
                except Exception as e:  # the runner's own failure, for the caller to raise
                    conn.send(("error", e))

    def accept() -> None:
        while not stop.is_set():
            try:
                conn = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    host, port = listener.address
    try:
        yield {"host": host, "port": port, "key": key.hex()}
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)


class RunnerProxy:
    """In the child: a StackRunner whose calls the test's runner answers."""

    def __init__(self, address: dict[str, Any]) -> None:
        self._conn = Client(
            (address["host"], address["port"]), authkey=bytes.fromhex(address["key"])
        )
        self._lock = threading.Lock()

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        args = tuple(None if callable(a) else a for a in args)  # an output callback
        kwargs = {k: None if callable(v) else v for k, v in kwargs.items()}
        with self._lock:
            self._conn.send((name, args, kwargs))
            status, value = self._conn.recv()
        if status == "error":
            raise value
        return value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._call(name, *args, **kwargs)
