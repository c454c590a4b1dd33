"""This machine as a one-node fleet, shaped as the `local` target makes it, for tests that drive
the launch through LocalTransport without the CLI."""

from __future__ import annotations

import sys

from infra.base.records import Fleet, GpuExpectation, Node


def local_fleet(gpus: int = 0) -> Fleet:
    """One head node "local" at 127.0.0.1 with this interpreter; `gpus`: what verify expects."""
    return Fleet(
        target="local",
        nodes=(Node(name="local", role="head", internal_address="127.0.0.1", address="127.0.0.1"),),
        expect=GpuExpectation(count=gpus),
        python=sys.executable,
        local=True,
    )
