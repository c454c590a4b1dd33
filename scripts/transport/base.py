"""The operations fleet code needs on one node, whatever the node is.

Commands are POSIX shell strings run in the node's gputrain root (``$GPUTRAIN_NODE_ROOT`` if the
node sets it, else the login home), so relative paths mean the same thing on every kind of node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from infra.base.errors import GputrainError

LineCallback = Callable[[str], None]


class TransportError(GputrainError):
    """A command could not be run or did not finish in time."""


class ConnectionLostError(TransportError):
    """The connection dropped (or stopped answering) while a command was running."""


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Transport(Protocol):
    """One node; both implementations run the same shell commands."""

    name: str

    def run(self, cmd: str, timeout: float, stdin: bytes | None = None) -> CommandResult: ...

    def stream(
        self, cmd: str, on_line: LineCallback, timeout: float | None, stdin: bytes | None = None
    ) -> int: ...

    def download(
        self,
        remote: str,
        local: Path,
        timeout: float = 300,
        exclude: tuple[str, ...] = (),
        before: str = "",
    ) -> bool:
        """`remote` (a directory's contents, or a file) into `local`; False: it does not exist.
        `timeout`: over SSH, seconds without data (results of any size stream); here, the whole."""
        ...

    def reconnect(self, deadline_s: float) -> None: ...

    def close(self) -> None: ...


class LineSplitter:
    """Turns byte chunks into complete decoded lines; a partial last line waits for its newline."""

    def __init__(self, on_line: LineCallback) -> None:
        self._buf = b""
        self._on_line = on_line

    def feed(self, data: bytes) -> None:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            self._on_line(line.rstrip(b"\r").decode("utf-8", "replace"))

    def flush(self) -> None:
        if self._buf:
            self._on_line(self._buf.decode("utf-8", "replace"))
            self._buf = b""
