"""One node over SSH (paramiko): pinned host keys, an optional jump through the head, keepalives
and our own deadlines, and a connection that can be rebuilt while a job keeps running.
Host-key pinning too: OpenSSH fingerprints, the names known_hosts files use, reading and writing
those files, and the paramiko policy that refuses an unknown host (or records it when asked to).
paramiko is imported only inside these functions, so the CLI stays fast."""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import select
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.base.errors import GputrainError
from infra.base.records import Fleet, Node
from infra.base.retry import GaveUp, poll_until
from scripts import ui
from scripts.node_layout import NODE_ROOT_SH
from scripts.transport.base import (
    CommandResult,
    ConnectionLostError,
    LineCallback,
    LineSplitter,
    TransportError,
)
from scripts.transport.tar import extract_tar, pack_command, pack_outcome

if TYPE_CHECKING:
    import paramiko


def classify_connect_error(exc: BaseException) -> str:
    """A short reason for progress lines ("connection refused", "login key not accepted yet", ...),
    by the exception's type."""
    import paramiko

    if isinstance(exc, paramiko.AuthenticationException):
        return "login key not accepted yet"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        # every address failed to connect: say what the sockets said (refused, no route, ...)
        causes = sorted({_socket_reason(e) for e in exc.errors.values()})
        return "; ".join(causes) or "connection refused"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, paramiko.ChannelException):
        return "not reachable through the head yet"
    if isinstance(exc, EOFError | paramiko.SSHException):
        return "ssh not ready"  # no banner yet, or the server closed during the handshake
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return _socket_reason(exc)
    return f"{type(exc).__name__}: {exc}"


def _socket_reason(exc: BaseException) -> str:
    """The socket's own words ("No route to host", "Connection refused"), lower-cased."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return (exc.strerror or errno.errorcode.get(exc.errno, str(exc.errno))).lower()
    return str(exc) or type(exc).__name__


class _PromptAckSocket:
    """A TCP socket that acknowledges what it read at once (TCP_QUICKACK after each read, Linux).
    After the login OpenSSH's sshd sends a message of its own (its host keys); with the ACK for
    it delayed, the server holds its answer to the first channel open behind it (Nagle), and
    every connection's first command waited ~40 ms."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def recv(self, size: int) -> bytes:
        data = self._sock.recv(size)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _tuned_transport(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """paramiko's Transport, tuned for many short commands and bulk uploads:
    - no Nagle (paramiko sets no socket option): a channel's open otherwise waits behind the
      previous channel's close for the server's delayed ACK, ~40 ms per command; and our ACKs
      at once (_PromptAckSocket);
    - AES-GCM first (when the server offers it): the cipher then authenticates each packet
      itself, so paramiko computes and compares no HMAC per packet in Python — the largest
      per-byte cost of the controller's uploads and downloads."""
    import paramiko

    if isinstance(sock, socket.socket):  # not a tunnel through another node (a channel)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(socket, "TCP_QUICKACK"):  # Linux only
            sock = _PromptAckSocket(sock)
    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    aead = tuple(c for c in options.ciphers if c.endswith("-gcm@openssh.com"))
    options.ciphers = aead + tuple(c for c in options.ciphers if c not in aead)
    return transport


def _send_chunk(chan: paramiko.Channel, data: bytes) -> int:
    """`chan.send(data)` that never follows paramiko's answer to the server's close of the channel.
    paramiko builds a channel's message under the channel's lock and sends it after letting go,
    so its transport thread can answer a close in between. sshd then drops the whole connection,
    and every node reached through it ("idata/ieof packet referred to nonexistent channel"):
    seen under load after an upload the node's tar stopped reading, and after a command that
    ended at once. Sent under the lock, which that answer needs; while a key exchange holds sends
    back (the transport thread must then run for a send to leave), paramiko's own way."""
    from paramiko.common import cMSG_CHANNEL_DATA
    from paramiko.message import Message

    transport: Any = chan.get_transport()  # paramiko's internals: not in its type stubs
    if transport is None or not transport.clear_to_send.is_set():
        return int(chan.send(data))
    channel: Any = chan
    with channel.lock:
        if channel.closed:
            raise OSError("Socket is closed")
        size = channel._wait_for_send_window(len(data))
        if size == 0:
            return 0
        m = Message()
        m.add_byte(cMSG_CHANNEL_DATA)
        m.add_int(channel.remote_chanid)
        m.add_string(data[:size])
        transport._send_user_message(m)
    return int(size)


def _end_input(chan: paramiko.Channel) -> None:
    """`chan.shutdown_write()` (end of input), kept ahead of paramiko's answer to a close as
    _send_chunk keeps data."""
    transport: Any = chan.get_transport()
    if transport is None or not transport.clear_to_send.is_set():
        chan.shutdown_write()
        return
    channel: Any = chan
    with channel.lock:
        if channel.closed:
            return
        m = channel._send_eof()
        if m is not None:
            transport._send_user_message(m)


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
        client.set_missing_host_key_policy(pinned_policy(self.name, self.trust_new_hosts))
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
                transport_factory=_tuned_transport,
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

    @property
    def cipher(self) -> str | None:
        """The cipher the connection negotiated (None when not connected)."""
        c = self._client
        t = c.get_transport() if c is not None else None
        return t.local_cipher if t is not None else None

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
            _end_input(chan)
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
                n = _send_chunk(chan, bytes(view[:65536]))
            except TimeoutError:
                continue
            if n <= 0:
                raise ConnectionLostError(f"node {self.name}: connection lost during upload")
            view = view[n:]

    def stream(
        self, cmd: str, on_line: LineCallback, timeout: float | None, stdin: bytes | None = None
    ) -> int:
        """Run cmd, calling on_line per output line; a silent link is probed, a dead one raises.
        `stdin`: sent first, then end of input (values that must not be in cmd, i.e. argv)."""
        chan = self._open(cmd, 30)
        chan.set_combine_stderr(True)
        deadline = None if timeout is None else time.monotonic() + timeout
        if stdin is not None:
            self._send_all(
                chan, stdin, deadline if deadline is not None else time.monotonic() + 600
            )
            _end_input(chan)
        splitter = LineSplitter(on_line)
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
                    if not self.probe(timeout=self.connect_timeout):
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

    def download(
        self,
        remote: str,
        local: Path,
        timeout: float = 300,
        exclude: tuple[str, ...] = (),
        before: str = "",
    ) -> bool:
        chan = self._open(pack_command(remote, exclude, before), timeout)
        deadline = time.monotonic() + timeout
        with tempfile.TemporaryFile() as tmp:
            try:
                _end_input(chan)
                while True:
                    if chan.recv_ready():
                        tmp.write(chan.recv(1 << 20))
                        deadline = time.monotonic() + timeout  # a stall ends it, not the size
                        continue
                    if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                        while chan.recv_ready():
                            tmp.write(chan.recv(1 << 20))
                        break
                    if chan.closed:
                        raise ConnectionLostError(f"node {self.name}: connection lost")
                    if time.monotonic() > deadline:
                        raise TransportError(
                            f"node {self.name}: download of {remote} stalled: no data for "
                            f"{timeout:.0f} s"
                        )
                    select.select([chan], [], [], 0.1)
                code = chan.recv_exit_status()
                err = b""
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
            finally:
                chan.close()
            if not pack_outcome(self.name, remote, code, err):
                return False
            tmp.seek(0)
            extract_tar(tmp, local)
        return True

    def close(self) -> None:
        c, self._client = self._client, None
        if c is not None:
            c.close()


class HostKeyError(GputrainError):
    """The node's host key is not the pinned one (or none is pinned): refused, nothing was sent."""


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


def known_hosts_lines(fleet: Fleet) -> list[str]:
    """known_hosts entries for every pinned key, under the names ssh will look them up by."""
    return [
        f"{known_hosts_name(n.address or n.internal_address, n.port)} {key}"
        for n in fleet.nodes
        for key in n.host_keys
    ]


class KnownHosts:
    """An OpenSSH known_hosts file (hashed names too); raises OSError when it cannot be read. A
    line paramiko cannot use (`@cert-authority`, a corrupt key) is skipped with a warning naming
    the file and line; the keys of `@revoked` lines are never pinned, wherever else they appear."""

    def __init__(self, path: Path) -> None:
        from paramiko.hostkeys import HostKeyEntry

        self.path = path
        self._entries: list[tuple[list[str], str]] = []  # (host names, "type base64")
        self._revoked: set[str] = set()
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                marker, _, rest = line.partition(" ") if line.startswith("@") else ("", "", line)
                try:
                    entry = HostKeyEntry.from_line(rest.strip(), lineno)
                except Exception as e:  # paramiko raises several kinds for a bad key
                    entry, why = None, f"{type(e).__name__}: {e}"
                else:
                    why = "not a known_hosts entry"
                if entry is not None and entry.key is not None and marker == "@revoked":
                    self._revoked.add(entry.key.get_base64())
                    continue
                if entry is None or marker:
                    if marker:
                        why = f"{marker} lines are not supported (gputrain pins host keys)"
                    ui.warn(f"{path}:{lineno}: skipped a line ({why})")
                    continue
                self._entries.append(
                    (entry.hostnames, f"{entry.key.get_name()} {entry.key.get_base64()}")
                )

    def keys_for(self, address: str, port: int = 22) -> tuple[str, ...]:
        """The pinned "type base64" keys of one host; () when it has none."""
        from paramiko.hostkeys import HostKeys

        name = known_hosts_name(address, port)

        def matches(pattern: str) -> bool:
            return pattern == name or (
                pattern.startswith("|1|") and HostKeys.hash_host(name, pattern) == pattern
            )

        found = [
            key
            for names, key in self._entries
            if any(map(matches, names)) and key.split()[1] not in self._revoked
        ]
        return tuple(dict.fromkeys(found))


_record_lock = threading.Lock()


def record_known_host(path: Path, hostname: str, key_line: str) -> None:
    """Append one ``hostname keytype base64`` line to a known_hosts file (created 0600)."""
    with _record_lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{hostname} {key_line}\n")


def pinned_policy(node_name: str, record_to: Path | None) -> Any:
    """paramiko's policy for a host with no pinned key: refuse it naming the offered fingerprint
    (RejectPolicy), or record it in `record_to` when the user passed --trust-new-hosts. A
    *different* key never reaches here: paramiko raises BadHostKeyException for it."""
    import paramiko

    class Policy(paramiko.RejectPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:  # type: ignore[override]
            fp = fingerprint(key.get_base64())
            if record_to is None:
                raise HostKeyError(
                    f"node {node_name} ({hostname}): unknown host key {key.get_name()} {fp}; "
                    "refused (pin it in the hosts/known_hosts file, or pass "
                    "--trust-new-hosts to record first-seen keys)"
                )
            record_known_host(record_to, hostname, f"{key.get_name()} {key.get_base64()}")
            ui.say(
                f"{node_name}: trusted new host key {key.get_name()} {fp} for {hostname}; "
                f"recorded in {record_to}"
            )

    return Policy()
