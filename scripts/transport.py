"""How the controller talks to one node: run, stream, upload, download — over SSH or on this machine.

Commands are POSIX shell strings run in the node's gputrain root (``$GPUTRAIN_NODE_ROOT`` if the
node sets it, else the login home), so relative paths mean the same thing on every kind of node.
paramiko is imported only inside the SSH transport so the CLI stays fast.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import select
import shlex
import shutil
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from infra.base.errors import GputrainError
from infra.base.retry import GaveUp, poll_until
from scripts import ui

if TYPE_CHECKING:
    import paramiko

    from infra.base.records import Node

NODE_ROOT_SH = '"${GPUTRAIN_NODE_ROOT:-$HOME}"'
"""Shell expression for the directory every command starts in (relative paths are under it)."""

LineCallback = Callable[[str], None]


class HostKeyError(GputrainError):
    """The node's host key is not the pinned one (or none is pinned): refused, nothing was sent."""


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
    """The operations fleet code needs on one node; both implementations run the same shell."""

    name: str

    def run(self, cmd: str, timeout: float, stdin: bytes | None = None) -> CommandResult: ...

    def stream(self, cmd: str, on_line: LineCallback, timeout: float | None) -> int: ...

    def upload(self, local: Path, remote: str) -> None: ...

    def upload_files(self, root: Path, files: Iterable[str], remote_dir: str) -> None: ...

    def download(
        self, remote: str, local: Path, timeout: float = 300, exclude: tuple[str, ...] = ()
    ) -> bool: ...

    def reconnect(self, deadline_s: float) -> None: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# Pure helpers: fingerprints, known_hosts lines, tar building
# ---------------------------------------------------------------------------------------------


def fingerprint(public_key_b64: str) -> str:
    """OpenSSH's SHA256 fingerprint of a base64 public key blob, e.g. ``SHA256:abc...``."""
    digest = hashlib.sha256(base64.b64decode(public_key_b64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def parse_public_key(line: str) -> tuple[str, str]:
    """``"ssh-ed25519 AAAA... comment"`` -> (key type, base64 blob); raises ValueError otherwise."""
    parts = line.split()
    if len(parts) < 2 or not parts[0].startswith(("ssh-", "ecdsa-", "sk-")):
        raise ValueError(f"not an OpenSSH public key: {line[:40]!r}")
    base64.b64decode(parts[1], validate=True)
    return parts[0], parts[1]


def known_hosts_name(address: str, port: int) -> str:
    """The host name known_hosts uses: ``addr`` on port 22, ``[addr]:port`` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"


def load_known_hosts(path: Path, address: str, port: int = 22) -> tuple[str, ...]:
    """The pinned keys for one host from an OpenSSH known_hosts file (hashed names supported)."""
    import paramiko

    if not path.exists():
        return ()
    keys = paramiko.HostKeys(str(path))
    found = keys.lookup(known_hosts_name(address, port))
    if not found:
        return ()
    return tuple(f"{kt} {k.get_base64()}" for kt, k in found.items())


def tar_bytes_of(root: Path, files: Iterable[str]) -> bytes:
    """An uncompressed tar of ``files`` (relative to root), modes kept, owner neutral."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in files:
            info = tar.gettarinfo(str(root / rel), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isfile():
                with open(root / rel, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def extract_tar(data: bytes | IO[bytes], dest: Path) -> None:
    """Unpack a tar from a node safely (no absolute paths, no links out of dest)."""
    dest.mkdir(parents=True, exist_ok=True)
    fileobj = io.BytesIO(data) if isinstance(data, bytes) else data
    root = dest.resolve()
    with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
        for member in tar:
            target = (root / member.name).resolve()
            if member.name.startswith("/") or not target.is_relative_to(root):
                raise TransportError(f"refusing a path outside {dest}: {member.name!r}")
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                with open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                os.chmod(target, member.mode & 0o755 | 0o600)
            # links, devices and fifos from a node are skipped


def upload_command(remote_dir: str) -> str:
    return f"mkdir -p {shlex.quote(remote_dir)} && tar -x -f - -C {shlex.quote(remote_dir)}"


def download_command(remote: str, exclude: tuple[str, ...] = ()) -> str:
    """tar to stdout: a directory's contents (minus ``exclude``, e.g. "./code"), or one file;
    exit 3 (no output) if it is missing."""
    parent, name = os.path.split(remote.rstrip("/"))
    q, qp, qn = shlex.quote(remote), shlex.quote(parent or "."), shlex.quote(name)
    ex = "".join(f" --exclude={shlex.quote(e)}" for e in exclude)
    return (
        f"if [ -d {q} ]; then tar -c -f -{ex} -C {q} .; "
        f"elif [ -e {q} ]; then tar -c -f - -C {qp} {qn}; else exit 3; fi"
    )


class _LineSplitter:
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


# ---------------------------------------------------------------------------------------------
# Local: this machine, subprocess
# ---------------------------------------------------------------------------------------------


class LocalTransport:
    """This machine through ``sh -c``: the same commands as over SSH, no network."""

    def __init__(self, name: str = "local", node_root: Path | None = None) -> None:
        self.name = name
        self.node_root = (node_root or Path.home() / ".cache" / "gputrain" / "local").resolve()
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

    def stream(self, cmd: str, on_line: LineCallback, timeout: float | None) -> int:
        proc = subprocess.Popen(
            ["sh", "-c", cmd],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.node_root,
            env=self._env,
            start_new_session=True,
        )
        assert proc.stdout is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        splitter = _LineSplitter(on_line)
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

    def upload(self, local: Path, remote: str) -> None:
        if local.is_dir():
            files = [str(p.relative_to(local)) for p in sorted(local.rglob("*")) if p.is_file()]
            self.upload_files(local, files, remote)
        else:
            self.upload_files(local.parent, [local.name], os.path.dirname(remote) or ".")
            if os.path.basename(remote) != local.name:
                d = os.path.dirname(remote) or "."
                self._check(
                    self.run(f"mv -f {shlex.quote(d + '/' + local.name)} {shlex.quote(remote)}", 60)
                )

    def upload_files(self, root: Path, files: Iterable[str], remote_dir: str) -> None:
        self._check(self.run(upload_command(remote_dir), 300, stdin=tar_bytes_of(root, files)))

    def download(
        self, remote: str, local: Path, timeout: float = 300, exclude: tuple[str, ...] = ()
    ) -> bool:
        proc = subprocess.run(
            ["sh", "-c", download_command(remote, exclude)],
            capture_output=True,
            timeout=timeout,
            cwd=self.node_root,
            env=self._env,
        )
        if proc.returncode == 3:
            return False
        if proc.returncode != 0:
            raise TransportError(f"{self.name}: download of {remote} failed: {proc.stderr!r}")
        extract_tar(proc.stdout, local)
        return True

    def reconnect(self, deadline_s: float) -> None:
        """Nothing to reconnect on this machine."""

    def close(self) -> None:
        """Nothing held open."""

    def _check(self, result: CommandResult) -> None:
        if not result.ok:
            raise TransportError(f"{self.name}: {result.stderr.strip() or result.stdout.strip()}")


# ---------------------------------------------------------------------------------------------
# SSH: paramiko, pinned host keys, optional jump through the head
# ---------------------------------------------------------------------------------------------


def classify_connect_error(exc: BaseException) -> str:
    """A short reason for progress lines ("connection refused", "key not yet accepted", ...)."""
    name = type(exc).__name__
    text = str(exc).lower()
    if "AuthenticationException" in name or "authentication" in text:
        return "login key not accepted yet"
    if isinstance(exc, ConnectionRefusedError) or "refused" in text or "NoValidConnections" in name:
        return "connection refused"
    if isinstance(exc, ConnectionResetError) or "reset" in text:
        return "connection reset"
    if isinstance(exc, socket.timeout | TimeoutError) or "timed out" in text:
        return "timed out"
    if isinstance(exc, EOFError) or "banner" in text or "eof" in text:
        return "ssh not ready"
    if isinstance(exc, OSError) and "unreachable" in text:
        return "host unreachable"
    return f"{name}: {exc}"


class SshTransport:
    """One node over paramiko. Host keys are pinned; the connection can be rebuilt (reconnect)."""

    def __init__(
        self,
        node: Node,
        identity_file: Path | None,
        *,
        via: SshTransport | None = None,
        trust_new_hosts: Path | None = None,
        connect_timeout: float = 10.0,
        keepalive_s: int = 5,
        probe_after_s: float = 15.0,
    ) -> None:
        self.name = node.name
        self.node = node
        self.identity_file = identity_file
        self.via = via
        self.trust_new_hosts = trust_new_hosts
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self.probe_after_s = probe_after_s
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self.generation = 0

    # -- connection --------------------------------------------------------------------------

    @property
    def target(self) -> tuple[str, int]:
        if self.via is not None:
            return self.node.internal_address, self.node.port
        assert self.node.address is not None
        return self.node.address, self.node.port

    def connect_once(self) -> None:
        """One attempt; raises what paramiko/the socket raised, HostKeyError when keys differ."""
        import paramiko

        host, port = self.target
        client = paramiko.SSHClient()
        hk_name = known_hosts_name(host, port)
        for line in self.node.host_keys:
            try:
                ktype, blob = parse_public_key(line)
            except ValueError as e:
                raise HostKeyError(f"node {self.name}: pinned host key is invalid: {e}") from e
            key = paramiko.PKey.from_type_string(ktype, base64.b64decode(blob))
            client.get_host_keys().add(hk_name, ktype, key)
        client.set_missing_host_key_policy(_PinnedPolicy(self.name, self.trust_new_hosts))
        sock: Any = None
        if self.via is not None:
            sock = self.via.open_direct_tcpip(host, port, self.connect_timeout)
        try:
            client.connect(
                host,
                port=port,
                username=self.node.user,
                key_filename=str(self.identity_file) if self.identity_file else None,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                channel_timeout=self.connect_timeout,
                allow_agent=False,
                look_for_keys=self.identity_file is None,
                sock=sock,
            )
        except paramiko.BadHostKeyException as e:
            client.close()
            raise HostKeyError(
                f"node {self.name} ({hk_name}): host key mismatch — offered "
                f"{e.key.get_name()} {fingerprint(e.key.get_base64())}, pinned "
                f"{e.expected_key.get_name()} {fingerprint(e.expected_key.get_base64())}; refused"
            ) from e
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(self.keepalive_s)
        old, self._client = self._client, client
        self.generation += 1
        if old is not None:
            old.close()

    def open_direct_tcpip(self, host: str, port: int, timeout: float) -> Any:
        """A tunnel from this node to host:port (how workers without public addresses are reached)."""
        transport = self._transport()
        return transport.open_channel(
            "direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout
        )

    def is_alive(self) -> bool:
        c = self._client
        t = c.get_transport() if c is not None else None
        return t is not None and t.is_active()

    def reconnect(self, deadline_s: float) -> None:
        """Rebuild the connection (through the head again if needed), retrying until the deadline."""
        gen = self.generation
        with self._lock:
            if self.generation != gen and self.is_alive():
                return  # another thread already reconnected
            end = time.monotonic() + deadline_s

            def attempt() -> None:
                if self.via is not None and not self.via.probe(timeout=5):
                    self.via.reconnect(max(1.0, end - time.monotonic()))
                self.connect_once()

            try:
                poll_until(
                    attempt,
                    deadline_s=deadline_s,
                    retry_on=(Exception,),
                    fatal=(HostKeyError,),
                    reason=classify_connect_error,
                )
            except GaveUp as e:
                raise ConnectionLostError(
                    f"node {self.name}: could not reconnect within {deadline_s:.0f} s ({e.reason})"
                ) from e

    def probe(self, timeout: float) -> bool:
        """Does the connection still answer? (a dead link without FIN looks alive to paramiko)"""
        if not self.is_alive():
            return False
        try:
            return self.run("true", timeout=timeout).ok
        except TransportError:
            return False

    def _transport(self) -> paramiko.Transport:
        c = self._client
        t = c.get_transport() if c is not None else None
        if t is None or not t.is_active():
            raise ConnectionLostError(f"node {self.name}: not connected")
        return t

    def _open(self, cmd: str, timeout: float) -> paramiko.Channel:
        try:
            chan = self._transport().open_session(timeout=min(timeout, self.connect_timeout))
            chan.exec_command(f"cd {NODE_ROOT_SH} || exit 111; {cmd}")
        except ConnectionLostError:
            raise
        except Exception as e:
            raise ConnectionLostError(f"node {self.name}: could not open a channel: {e}") from e
        return chan

    # -- operations --------------------------------------------------------------------------

    def run(self, cmd: str, timeout: float, stdin: bytes | None = None) -> CommandResult:
        chan = self._open(cmd, timeout)
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        try:
            if stdin:
                self._send_all(chan, stdin, deadline)
            chan.shutdown_write()
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready():
                    while chan.recv_stderr_ready():
                        err += chan.recv_stderr(65536)
                    # drain what arrived with the status
                    while not chan.eof_received and time.monotonic() < deadline:
                        if chan.recv_ready():
                            out += chan.recv(65536)
                        elif chan.closed:
                            break
                        else:
                            time.sleep(0.005)
                    while chan.recv_ready():
                        out += chan.recv(65536)
                    break
                if chan.closed and not chan.exit_status_ready():
                    raise ConnectionLostError(f"node {self.name}: connection lost during {cmd!r}")
                if time.monotonic() > deadline:
                    raise TransportError(
                        f"node {self.name}: command did not finish within {timeout:.0f} s"
                    )
                if not got:
                    select.select([chan], [], [], 0.05)
            code = chan.recv_exit_status()
            if code == -1 and not self.is_alive():  # paramiko's status when the link closed
                raise ConnectionLostError(f"node {self.name}: connection lost during {cmd!r}")
        finally:
            chan.close()
        return CommandResult(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def _send_all(self, chan: paramiko.Channel, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        chan.settimeout(5.0)
        while view:
            if time.monotonic() > deadline:
                raise TransportError(f"node {self.name}: upload did not finish in time")
            try:
                n = chan.send(bytes(view[:65536]))
            except TimeoutError:
                continue
            if n <= 0:
                raise ConnectionLostError(f"node {self.name}: connection lost during upload")
            view = view[n:]

    def stream(self, cmd: str, on_line: LineCallback, timeout: float | None) -> int:
        """Run cmd, calling on_line per output line; a silent link is probed, a dead one raises."""
        chan = self._open(cmd, 30)
        chan.set_combine_stderr(True)
        deadline = None if timeout is None else time.monotonic() + timeout
        splitter = _LineSplitter(on_line)
        last_data = time.monotonic()
        try:
            while True:
                if chan.recv_ready():
                    data = chan.recv(65536)
                    if data:
                        splitter.feed(data)
                        last_data = time.monotonic()
                        continue
                if chan.exit_status_ready() and not chan.recv_ready():
                    if chan.eof_received or chan.closed:
                        break
                    time.sleep(0.01)
                    continue
                if chan.closed and not chan.exit_status_ready():
                    raise ConnectionLostError(f"node {self.name}: connection lost")
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    raise TransportError(f"node {self.name}: stream timed out after {timeout} s")
                if now - last_data > self.probe_after_s:
                    # silence: a dead link without FIN looks alive to paramiko, so ask
                    if not self.probe(timeout=10):
                        self._drop()
                        raise ConnectionLostError(f"node {self.name}: connection stopped answering")
                    last_data = time.monotonic()
                select.select([chan], [], [], 0.25)
            code = chan.recv_exit_status()
            if code == -1 and not self.is_alive():
                raise ConnectionLostError(f"node {self.name}: connection lost")
            splitter.flush()
            return code
        finally:
            chan.close()

    def _drop(self) -> None:
        c = self._client
        if c is not None:
            # closing a transport whose link is dead must not hang: do it off-thread
            threading.Thread(target=c.close, daemon=True).start()

    def upload(self, local: Path, remote: str) -> None:
        if local.is_dir():
            files = [str(p.relative_to(local)) for p in sorted(local.rglob("*")) if p.is_file()]
            self.upload_files(local, files, remote)
        else:
            d = os.path.dirname(remote) or "."
            self.upload_files(local.parent, [local.name], d)
            if os.path.basename(remote) != local.name:
                r = self.run(f"mv -f {shlex.quote(d + '/' + local.name)} {shlex.quote(remote)}", 60)
                if not r.ok:
                    raise TransportError(f"node {self.name}: {r.stderr.strip()}")

    def upload_files(self, root: Path, files: Iterable[str], remote_dir: str) -> None:
        r = self.run(upload_command(remote_dir), 600, stdin=tar_bytes_of(root, files))
        if not r.ok:
            raise TransportError(f"node {self.name}: upload failed: {r.stderr.strip()}")

    def download(
        self, remote: str, local: Path, timeout: float = 300, exclude: tuple[str, ...] = ()
    ) -> bool:
        chan = self._open(download_command(remote, exclude), timeout)
        deadline = time.monotonic() + timeout
        with tempfile.TemporaryFile() as tmp:
            try:
                chan.shutdown_write()
                while True:
                    if chan.recv_ready():
                        tmp.write(chan.recv(1 << 20))
                        continue
                    if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                        while chan.recv_ready():
                            tmp.write(chan.recv(1 << 20))
                        break
                    if chan.closed:
                        raise ConnectionLostError(f"node {self.name}: connection lost")
                    if time.monotonic() > deadline:
                        raise TransportError(f"node {self.name}: download of {remote} timed out")
                    select.select([chan], [], [], 0.1)
                code = chan.recv_exit_status()
                err = b""
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
            finally:
                chan.close()
            if code == 3:
                return False
            if code != 0:
                raise TransportError(f"node {self.name}: download of {remote} failed: {err!r}")
            tmp.seek(0)
            extract_tar(tmp, local)
        return True

    def close(self) -> None:
        c, self._client = self._client, None
        if c is not None:
            c.close()


class _PinnedPolicy:
    """Unknown host: refuse (RejectPolicy) naming the offered fingerprint, or record it when the
    user passed --trust-new-hosts. A *different* key never reaches here: paramiko raises
    BadHostKeyException for it."""

    def __new__(cls, node_name: str, trust_new_hosts: Path | None) -> Any:
        import paramiko

        class Policy(paramiko.RejectPolicy):
            def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:  # type: ignore[override]
                fp = fingerprint(key.get_base64())
                if trust_new_hosts is None:
                    raise HostKeyError(
                        f"node {node_name} ({hostname}): unknown host key {key.get_name()} {fp}; "
                        "refused (pin it in the hosts/known_hosts file, or pass "
                        "--trust-new-hosts to record first-seen keys)"
                    )
                record_known_host(trust_new_hosts, hostname, f"{key.get_name()} {key.get_base64()}")
                ui.say(
                    f"{node_name}: trusted new host key {key.get_name()} {fp} for {hostname}; "
                    f"recorded in {trust_new_hosts}"
                )

        return Policy()


_known_hosts_lock = threading.Lock()


def record_known_host(path: Path, hostname: str, key_line: str) -> None:
    """Append one ``hostname keytype base64`` line to a known_hosts file (created 0600)."""
    with _known_hosts_lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{hostname} {key_line}\n")


def elapsed(start: float) -> str:
    return f"{time.monotonic() - start:.1f} s"
