"""Reach every node of a fleet: connect in parallel with backoff until a deadline, with progress."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from scripts import ui
from scripts.errors import GputrainError
from scripts.nodes import Fleet, Node
from scripts.transport import (
    HostKeyError,
    LocalTransport,
    SshTransport,
    Transport,
    classify_connect_error,
)

__all__ = ["ConnectError", "HostKeyError", "close_all", "connect", "parallel"]

T = TypeVar("T")


class ConnectError(GputrainError):
    """Some nodes could not be reached before their deadline."""


def backoff_delays(first: float = 0.3, factor: float = 1.6, cap: float = 5.0) -> list[float]:
    """The waits between connection attempts: quick at first (sshd often comes up within a
    second or two), then capped so a rebooting VM is noticed soon after it is back."""
    delays, d = [], first
    while d < cap:
        delays.append(round(d, 3))
        d *= factor
    return [*delays, cap]


def _connect_node(
    transport: SshTransport, deadline_s: float, progress_every_s: float = 5.0
) -> SshTransport:
    start = time.monotonic()
    end = start + deadline_s
    delays = backoff_delays()
    attempt = 0
    last_said = start
    reason = ""
    while True:
        try:
            transport.connect_once()
            if attempt:
                ui.say(f"{transport.name}: connected after {time.monotonic() - start:.1f} s")
            return transport
        except HostKeyError:
            raise
        except Exception as e:
            reason = classify_connect_error(e)
        now = time.monotonic()
        delay = delays[min(attempt, len(delays) - 1)]
        attempt += 1
        if now + delay > end:
            raise ConnectError(
                f"node {transport.name} ({transport.target[0]}:{transport.target[1]}): "
                f"not reachable within {deadline_s:.0f} s (last: {reason})"
            )
        if now - last_said >= progress_every_s or attempt == 1:
            ui.say(f"{transport.name}: waiting for SSH ({reason}), {end - now:.0f} s left")
            last_said = now
        time.sleep(delay)


def parallel(
    items: list[str], fn: Callable[[str], T]
) -> tuple[dict[str, T], dict[str, BaseException]]:
    """Run fn for every item in threads; results and errors by item."""
    results: dict[str, T] = {}
    errors: dict[str, BaseException] = {}
    if not items:
        return results, errors
    with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
        futures = {item: pool.submit(fn, item) for item in items}
        for item, fut in futures.items():
            try:
                results[item] = fut.result()
            except BaseException as e:
                errors[item] = e
    return results, errors


def connect(
    fleet: Fleet,
    *,
    deadline_s: float,
    trust_new_hosts: Path | None = None,
    local_root: Path | None = None,
    connect_timeout: float = 10.0,
) -> dict[str, Transport]:
    """A transport per node name. All nodes in parallel; workers without an address go through
    the head (its connection first). Raises HostKeyError / ConnectError naming every bad node."""
    if fleet.local:
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
            return _connect_node(t, deadline_s)
        except BaseException as e:
            if t is head_t:
                head_failed.append(e)
            raise
        finally:
            if t is head_t:
                head_ready.set()

    start = time.monotonic()
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
