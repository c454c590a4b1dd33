"""This machine as a node: the same shell commands as over SSH, run by ``sh -c``, no network."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
from pathlib import Path

from scripts.transport.base import CommandResult, LineCallback, LineSplitter, TransportError
from scripts.transport.tar import extract_tar, pack_command, pack_outcome


class LocalTransport:
    """This machine through ``sh -c``: the same commands as over SSH, no network."""

    def __init__(self, name: str, node_root: Path) -> None:
        self.name = name
        self.node_root = node_root.resolve()
        self.node_root.mkdir(parents=True, exist_ok=True)
        self._env = {**os.environ, "GPUTRAIN_NODE_ROOT": str(self.node_root)}

    def run(self, cmd: str, timeout: float, stdin: bytes | None = None) -> CommandResult:
        try:
            proc = subprocess.run(
                ["sh", "-c", cmd],
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout,
                cwd=self.node_root,
                env=self._env,
            )
        except subprocess.TimeoutExpired as e:
            raise TransportError(f"{self.name}: command timed out after {timeout:.0f} s") from e
        return CommandResult(
            proc.returncode,
            proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"),
        )

    def stream(
        self, cmd: str, on_line: LineCallback, timeout: float | None, stdin: bytes | None = None
    ) -> int:
        proc = subprocess.Popen(
            ["sh", "-c", cmd],
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.node_root,
            env=self._env,
            start_new_session=True,
        )
        assert proc.stdout is not None
        if stdin is not None:  # a few lines of NAME BASE64: the pipe's buffer holds them
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(stdin)
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        deadline = None if timeout is None else time.monotonic() + timeout
        splitter = LineSplitter(on_line)
        fd = proc.stdout.fileno()
        try:
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    raise TransportError(f"{self.name}: stream timed out after {timeout:.0f} s")
                ready, _, _ = select.select([fd], [], [], 0.5)
                if ready:
                    data = os.read(fd, 65536)
                    if not data:
                        break
                    splitter.feed(data)
            splitter.flush()
            return proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()

    def download(
        self,
        remote: str,
        local: Path,
        timeout: float = 300,
        exclude: tuple[str, ...] = (),
        before: str = "",
    ) -> bool:
        proc = subprocess.run(
            ["sh", "-c", pack_command(remote, exclude, before)],
            capture_output=True,
            timeout=timeout,
            cwd=self.node_root,
            env=self._env,
        )
        if not pack_outcome(self.name, remote, proc.returncode, proc.stderr):
            return False
        extract_tar(proc.stdout, local)
        return True

    def reconnect(self, deadline_s: float) -> None:
        """Nothing to reconnect on this machine."""

    def close(self) -> None:
        """Nothing held open."""
