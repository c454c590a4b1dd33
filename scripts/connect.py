"""Reach every node of a fleet: connect in parallel with backoff until a deadline, with progress;
workers without an address of their own go through the head."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from infra.base.errors import GputrainError
from infra.base.records import Fleet, Node
from infra.base.retry import GaveUp, Waiting, poll_until
from scripts import ui
from scripts.parallel import parallel
from scripts.transport.base import Transport
from scripts.transport.hostkeys import HostKeyError
from scripts.transport.local import LocalTransport
from scripts.transport.ssh import SshTransport, classify_connect_error


class ConnectError(GputrainError):
    """Some nodes could not be reached before their deadline."""


def _connect_node(
    transport: SshTransport, deadline_s: float, status: ui.StatusLines
) -> SshTransport:
    """One node, retried with backoff through refused connections, resets and a login key not
    yet installed, until the deadline; a host key that is not the pinned one is refused at once.
    While it waits, the node's status line says why and how long is left."""
    start = time.monotonic()
    waited: list[Waiting] = []

    def waiting(w: Waiting) -> None:
        waited.append(w)
        status.update(transport.name, f"waiting for SSH ({w.reason}), {w.left_s:.0f} s left")

    try:
        poll_until(
            transport.connect_once,
            deadline_s=deadline_s,
            retry_on=(Exception,),
            fatal=(HostKeyError,),
            reason=classify_connect_error,
            on_wait=waiting,
        )
    except GaveUp as e:
        host, port = transport.target
        status.update(transport.name, f"not reachable ({e.reason})", final=True)
        raise ConnectError(
            f"node {transport.name} ({host}:{port}): not reachable within {deadline_s:.0f} s "
            f"(last: {e.reason}); --wait SECONDS waits longer"
        ) from e
    if waited:
        status.update(
            transport.name, f"connected after {time.monotonic() - start:.1f} s", final=True
        )
    return transport


def connect(
    fleet: Fleet,
    *,
    deadline_s: float,
    trust_new_hosts: Path | None = None,
    local_root: Path | None = None,
    connect_timeout: float = 10.0,
    probe_after_s: float = 15.0,
) -> dict[str, Transport]:
    """A transport per node name. All nodes in parallel; workers without an address go through
    the head (its connection first). Raises HostKeyError / ConnectError naming every bad node."""
    if fleet.local:
        if local_root is None:
            raise ConnectError(f"{fleet.target}: a local fleet needs its node root")
        return {n.name: LocalTransport(n.name, local_root) for n in fleet.nodes}
    head = fleet.head
    by_name: dict[str, SshTransport] = {}

    def make(node: Node, via: SshTransport | None) -> SshTransport:
        return SshTransport(
            node,
            fleet.identity_file,
            via=via,
            trust_new_hosts=trust_new_hosts,
            connect_timeout=connect_timeout,
            probe_after_s=probe_after_s,
        )

    if head.address is None:
        raise ConnectError(f"node {head.name}: the head needs an address the controller can reach")
    head_t = make(head, None)
    by_name[head.name] = head_t
    for node in fleet.nodes:
        if node.name != head.name:
            by_name[node.name] = make(node, head_t if node.address is None else None)

    head_ready = threading.Event()
    head_failed: list[BaseException] = []

    def run(name: str) -> SshTransport:
        t = by_name[name]
        if t.via is not None:
            head_ready.wait()
            if head_failed:
                raise ConnectError(f"node {name}: not reachable because the head is not")
        try:
            return _connect_node(t, deadline_s, status)
        except BaseException as e:
            if t is head_t:
                head_failed.append(e)
            raise
        finally:
            if t is head_t:
                head_ready.set()

    start = time.monotonic()
    with ui.status_lines() as status:
        results, errors = parallel(list(by_name), run)
    if errors:
        for t in results.values():
            t.close()
        lines = [str(e) for e in errors.values()]
        cls = (
            HostKeyError
            if any(isinstance(e, HostKeyError) for e in errors.values())
            else ConnectError
        )
        raise cls("\n".join(lines))
    ui.say(f"connected to {len(results)} node(s) in {time.monotonic() - start:.1f} s")
    return dict(results)


def close_all(transports: dict[str, Transport]) -> None:
    for t in transports.values():
        with contextlib.suppress(Exception):
            t.close()
