"""Host-key pinning: OpenSSH fingerprints, the names known_hosts files use, reading and writing those
files, and the paramiko policy that refuses an unknown host (or records it when asked to)."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from infra.base.errors import GputrainError
from infra.base.records import Fleet
from scripts import ui


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
