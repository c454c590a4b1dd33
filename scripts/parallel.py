"""Run one function per node in threads: how every fleet step (connect, verify, upload, start, stop,
download) reaches all nodes at once."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")


def parallel(
    items: list[str], fn: Callable[[str], T]
) -> tuple[dict[str, T], dict[str, BaseException]]:
    """Run fn for every item in threads; results and errors by item. Only what a worker raised is
    an item's error: a signal (Ctrl-C, SIGTERM as `Interrupted`) raised in the waiting thread
    propagates at once and leaves the workers behind, never becoming "node X's error"."""
    results: dict[str, T] = {}
    errors: dict[str, BaseException] = {}
    if not items:
        return results, errors
    pool = ThreadPoolExecutor(max_workers=min(32, len(items)))
    try:
        futures = {item: pool.submit(fn, item) for item in items}
        for item, fut in futures.items():
            wait([fut])  # a signal's exception raises here, outside any handler
            error = fut.exception()  # done: never waits
            if error is None:
                results[item] = fut.result()
            else:
                errors[item] = error
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results, errors
