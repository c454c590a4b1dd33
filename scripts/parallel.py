"""Run one function per node in threads: how every fleet step (connect, verify, upload, start, stop,
download) reaches all nodes at once."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


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
