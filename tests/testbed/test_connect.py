"""Fleet operations against real sshd test hosts (network namespaces): pinning, jump, waiting."""

from __future__ import annotations

import dataclasses
import re
import socket
import time
from pathlib import Path

import pytest

from scripts.targets.session import ConnectError, close_all, connect
from scripts.transport.ssh import HostKeyError, KnownHosts, SshTransport, fingerprint
from tests.support.testbed import TestBed

pytestmark = pytest.mark.testbed


def _fp(key_line: str) -> str:
    return fingerprint(key_line.split()[1])


def test_pinned_key_connects_and_runs(tb: TestBed) -> None:
    h = tb.add_host()
    fleet = tb.fleet([h])
    ts = connect(fleet, deadline_s=10)
    r = ts[h.name].run("hostname; printf '%s' \"$1\"", timeout=10)
    assert r.exit_code == 0 and r.stdout.split("\n")[0] == h.name
    # Nagle off: a command's channel open must not wait for the server's delayed ACK (~40 ms)
    t = ts[h.name]
    assert isinstance(t, SshTransport) and t._client is not None
    link = t._client.get_transport()
    assert link is not None and link.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    ts[h.name].close()


def test_a_command_that_ends_at_once_keeps_the_connection(
    tb: TestBed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """paramiko sends a channel's message after letting go of the channel's lock, so its transport
    thread may answer the server's close first; sshd then drops the whole connection for an end
    of input (or data) on a channel it has freed. Under make test's load that took down a head
    and every node behind it. Here the sending thread is held back between building the message
    and sending it, as a loaded machine does by chance: the command, the upload and the node's
    connection must come through."""
    import paramiko
    from paramiko.common import cMSG_CHANNEL_DATA, cMSG_CHANNEL_EOF

    send = paramiko.Transport._send_user_message

    def late(self: paramiko.Transport, data: paramiko.Message) -> None:
        if data.asbytes()[:1] in (cMSG_CHANNEL_EOF, cMSG_CHANNEL_DATA):
            time.sleep(0.3)  # the sending thread descheduled
        send(self, data)

    monkeypatch.setattr(paramiko.Transport, "_send_user_message", late)
    h = tb.add_host()
    [t] = connect(tb.fleet([h]), deadline_s=10).values()
    try:
        assert t.run("true", timeout=10).ok  # ends before its end of input is sent
        assert t.run("head -c 1 >/dev/null", timeout=10, stdin=b"xy").ok  # stops reading
        assert t.run("echo still", timeout=10).stdout == "still\n" and t.is_alive()
    finally:
        t.close()


def test_a_download_ends_on_a_stall_not_on_its_size(
    tb: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its timeout is time without data, so results that take longer than it to stream come
    home. Each read of data moves the clock the download reads half a second on: 32 MiB, read
    at most 1 MiB at a time, take over 16 s by that clock against a 5 s timeout, while only 5 s
    without data (real time, however loaded the machine) would end it."""
    import paramiko

    h = tb.add_host()
    [t] = connect(tb.fleet([h]), deadline_s=10).values()
    try:
        assert t.run("mkdir big && head -c 32M /dev/urandom > big/blob", timeout=30).ok
        real, ahead = time.monotonic, [0.0]
        recv = paramiko.Channel.recv

        def slow_recv(self: paramiko.Channel, nbytes: int) -> bytes:
            ahead[0] += 0.5
            return recv(self, nbytes)

        monkeypatch.setattr(time, "monotonic", lambda: real() + ahead[0])
        monkeypatch.setattr(paramiko.Channel, "recv", slow_recv)
        assert t.download("big", tmp_path / "home", timeout=5)
        monkeypatch.undo()
        assert (tmp_path / "home" / "blob").stat().st_size == 32 << 20
        assert ahead[0] >= 16  # the stream outlasted the timeout by the clock it reads
    finally:
        t.close()


def test_a_connections_first_command_does_not_wait_for_a_delayed_ack(tb: TestBed) -> None:
    """After the login sshd sends a message of its own; unless the controller acknowledges it
    at once, the answer to the first channel open waits for its delayed ACK (40 ms at least:
    Linux's TCP_DELACK_MIN), so every first command would take longer. Under `make test`'s load
    one of them may take over 30 ms all the same: the fastest of eight is what is judged."""
    h = tb.add_host()
    fleet = tb.fleet([h])
    firsts = []
    for _ in range(8):
        ts = connect(fleet, deadline_s=10)
        start = time.monotonic()
        assert ts[h.name].run("true", timeout=10).ok
        firsts.append(time.monotonic() - start)
        close_all(ts)
    assert min(firsts) < 0.04, firsts


def test_wrong_key_refused_with_both_fingerprints(tb: TestBed) -> None:
    h, other = tb.add_host(), tb.add_host()
    fleet = tb.fleet([h])
    wrong = dataclasses.replace(fleet.nodes[0], host_keys=(other.host_key,))
    fleet = dataclasses.replace(fleet, nodes=(wrong,))
    start = time.monotonic()
    with pytest.raises(HostKeyError) as e:
        connect(fleet, deadline_s=10)
    msg = str(e.value)
    assert h.name in msg and _fp(h.host_key) in msg and _fp(other.host_key) in msg
    assert "mismatch" in msg
    assert time.monotonic() - start < 3  # refused at once, not retried until the deadline


def test_unknown_host_refused_and_trust_new_hosts_records(tb: TestBed, tmp_path: Path) -> None:
    h = tb.add_host()
    fleet = tb.fleet([h])
    unpinned = dataclasses.replace(
        fleet, nodes=(dataclasses.replace(fleet.nodes[0], host_keys=()),)
    )
    with pytest.raises(HostKeyError) as e:
        connect(unpinned, deadline_s=10)
    assert "unknown host key" in str(e.value) and _fp(h.host_key) in str(e.value)

    known = tmp_path / "known_hosts"
    ts = connect(unpinned, deadline_s=10, trust_new_hosts=known)
    ts[h.name].close()
    recorded = KnownHosts(known).keys_for(h.address)
    assert recorded == (h.host_key,)
    # the recorded file is now the source of the pin
    pinned = dataclasses.replace(
        fleet, nodes=(dataclasses.replace(fleet.nodes[0], host_keys=recorded),)
    )
    connect(pinned, deadline_s=10)[h.name].close()


def test_jump_through_head_to_worker_without_route(tb: TestBed) -> None:
    head = tb.add_host()
    hidden = tb.add_host(isolated_behind=head.name)
    # the controller itself cannot reach the hidden worker
    with pytest.raises(OSError), socket.create_connection((hidden.address, 22), timeout=1):
        pass
    fleet = tb.fleet([head, hidden], jump=True)
    assert fleet.nodes[1].address is None
    ts = connect(fleet, deadline_s=10)
    assert ts[hidden.name].run("hostname", timeout=10).stdout.strip() == hidden.name
    # its host key is still pinned through the tunnel
    bad = dataclasses.replace(fleet.nodes[1], host_keys=(head.host_key,))
    with pytest.raises(HostKeyError, match=re.escape(_fp(hidden.host_key))):
        connect(dataclasses.replace(fleet, nodes=(fleet.nodes[0], bad)), deadline_s=10)
    for t in ts.values():
        t.close()


def test_waits_for_sshd_that_starts_late(tb: TestBed, capsys: pytest.CaptureFixture[str]) -> None:
    h = tb.add_host(sshd_delay_s=2.5)
    start = time.monotonic()
    ts = connect(tb.fleet([h]), deadline_s=20)
    took = time.monotonic() - start
    assert 2.0 < took < 8
    assert ts[h.name].run("true", timeout=10).ok
    out = capsys.readouterr().out
    assert f"{h.name}: waiting for SSH (connection refused)" in out
    ts[h.name].close()


def test_unreachable_node_fails_at_its_deadline(tb: TestBed) -> None:
    h = tb.add_host()
    tb.stop_sshd(h.name)
    start = time.monotonic()
    with pytest.raises(ConnectError, match=rf"{h.name}.*not reachable within 2 s"):
        connect(tb.fleet([h]), deadline_s=2)
    assert time.monotonic() - start < 4
