"""infra/ttl.py: what is left of a VM's TTL."""

from __future__ import annotations

import time

import pytest

from infra.ttl import ttl_left_s


def test_ttl_left_counts_from_the_latest_start() -> None:
    now = time.time()
    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now - 600))
    assert ttl_left_s(started, 3600, now) == pytest.approx(3000, abs=1)
    assert ttl_left_s(started, 60, now) == 0
    assert ttl_left_s(None, 3600, now) is None
