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
    """An OpenSSH known_hosts file (hashed names too); raises OSError, ValueError or paramiko's
    SSHException when it cannot be read."""

    def __init__(self, path: Path) -> None:
        import paramiko

        self.path = path
        self._keys = paramiko.HostKeys()
        self._keys.load(str(path))

    def keys_for(self, address: str, port: int = 22) -> tuple[str, ...]:
        """The pinned "type base64" keys of one host; () when it has none."""
        entry = self._keys.lookup(known_hosts_name(address, port))
        return tuple(f"{k.get_name()} {k.get_base64()}" for k in entry.values()) if entry else ()


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
