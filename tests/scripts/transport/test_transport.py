"""Transports without a network: host-key fingerprints as OpenSSH prints them, the local transport's
run/put/get, and connect errors that say what the socket said."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.job.sync import sync_code
from scripts.transport.local import LocalTransport
from scripts.transport.ssh import fingerprint, known_hosts_name, parse_public_key


def test_fingerprint_matches_openssh(tmp_path: Path) -> None:
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    line = key.with_suffix(".pub").read_text()
    ktype, blob = parse_public_key(line)
    expected = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(key) + ".pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert fingerprint(blob) == expected and ktype == "ssh-ed25519"
    digest = base64.b64encode(hashlib.sha256(base64.b64decode(blob)).digest()).decode()
    assert expected == "SHA256:" + digest.rstrip("=")
    assert known_hosts_name("10.0.0.1", 22) == "10.0.0.1"
    assert known_hosts_name("10.0.0.1", 2222) == "[10.0.0.1]:2222"


def test_local_transport_roundtrip(tmp_path: Path) -> None:
    t = LocalTransport("n", tmp_path / "node")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.txt").write_text("hello")
    sync_code(t, {"d/f.txt": src / "d" / "f.txt"}, remote_dir="up")
    assert t.run("cat up/d/f.txt", 5).stdout == "hello"
    assert t.download("up", tmp_path / "back") is True
    assert (tmp_path / "back" / "d" / "f.txt").read_text() == "hello"
    assert t.download("missing", tmp_path / "none") is False
    got: list[str] = []
    assert t.stream("printf 'a\\nb'; exit 4", got.append, timeout=5) == 4
    assert got == ["a", "b"]
    assert t.run("echo $GPUTRAIN_NODE_ROOT", 5).stdout.strip() == str((tmp_path / "node").resolve())
    assert sys.executable


def test_a_file_that_grows_as_it_is_read_comes_home_as_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gputrain results` on a run still training: GNU tar says a file changed as it read it
    (exit 1) and its archive is whole, so the file comes home, with one line, not a failure."""
    t = LocalTransport("n", tmp_path / "node")
    run = tmp_path / "node" / "run"
    run.mkdir(parents=True)
    (run / "log.txt").write_bytes(b"x" * (32 << 20))
    writer = subprocess.Popen(["sh", "-c", "while :; do echo more >> log.txt; done"], cwd=run)
    try:
        assert t.download("run", tmp_path / "home")
    finally:
        writer.kill()
        writer.wait()
    assert (tmp_path / "home" / "log.txt").stat().st_size >= 32 << 20
    assert "n: a file under run changed as it was read: its copy is as read" in (
        capsys.readouterr().err
    )


def test_connect_errors_say_what_the_socket_said() -> None:
    """A silent link ends in EHOSTUNREACH, which paramiko wraps like a refusal: name it right."""
    import errno

    from paramiko.ssh_exception import NoValidConnectionsError

    from scripts.transport.ssh import classify_connect_error

    def wrapped(code: int) -> NoValidConnectionsError:
        return NoValidConnectionsError({("10.0.0.2", 22): OSError(code, os.strerror(code))})

    assert classify_connect_error(wrapped(errno.EHOSTUNREACH)) == "no route to host"
    assert classify_connect_error(wrapped(errno.ECONNREFUSED)) == "connection refused"
    assert classify_connect_error(OSError(errno.ENETUNREACH, "Network is unreachable")) == (
        "network is unreachable"
    )
    assert classify_connect_error(TimeoutError("timed out")) == "timed out"
