"""Ctrl-C and SIGTERM become one exception in the main thread, so every `finally` tears down.

A second Ctrl-C while teardown runs is answered, not obeyed: teardown is sacred.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from infra.base.errors import EXIT_INTERRUPTED, GputrainError
from scripts import ui


class Interrupted(GputrainError):
    """The user pressed Ctrl-C or the controller got SIGTERM."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(f"interrupted by {name}")
        self.signum = signum


class SignalGuard:
    """Turns SIGINT/SIGTERM into `Interrupted` until teardown starts; afterwards only reports."""

    def __init__(self) -> None:
        self.tearing_down = False
        self.received: list[int] = []

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self.tearing_down:
            ui.warn("teardown is in progress and will finish; nothing is left running")
            return
        raise Interrupted(signum)

    @contextmanager
    def teardown(self) -> Iterator[None]:
        """Run the enclosed block with signals reported instead of raised."""
        previous = self.tearing_down
        self.tearing_down = True
        try:
            yield
        finally:
            self.tearing_down = previous


@contextmanager
def signal_guard() -> Iterator[SignalGuard]:
    """Install the handlers (main thread only; elsewhere a no-op guard) and restore them after."""
    guard = SignalGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, guard._handle)
    try:
        yield guard
    finally:
        for s, h in old.items():
            signal.signal(s, h)
