"""The fleet's thread helper: a worker's error is that item's, a signal is nobody's (it wins)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from scripts.parallel import parallel
from scripts.targets.base import Interrupted, signal_guard


def test_worker_errors_are_the_items_and_results_the_rest() -> None:
    def fn(item: str) -> int:
        if item == "b":
            raise RuntimeError("b broke")
        return len(item)

    results, errors = parallel(["a", "bb", "b"], fn)
    assert results == {"a": 1, "bb": 2}
    assert list(errors) == ["b"] and str(errors["b"]) == "b broke"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_waiting_propagates_at_once(signum: int) -> None:
    release = threading.Event()

    def slow(item: str) -> str:
        release.wait(20)  # a node that does not answer for a long time
        return item

    threading.Timer(0.3, os.kill, (os.getpid(), signum)).start()
    t0 = time.monotonic()
    try:
        with signal_guard(), pytest.raises(Interrupted) as caught:
            parallel(["node-0", "node-1"], slow)
    finally:
        release.set()
    assert caught.value.signum == signum
    assert time.monotonic() - t0 < 5  # not after the workers: the signal wins
