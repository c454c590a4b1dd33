"""The sshd test bed's fixtures, for the tests in this folder only (`make test` runs this folder in a
second pytest beside the rest; the bed is machine-wide, serialised by a file lock). `testbed`: the
sshd test hosts (session-wide); `tb`: the same, removing the hosts a test added when it ends;
`world`: a `--stack e2e` world on the bed; `uninterrupted`: the stack world's TRAIN run on two
torchrun agents on this machine, never interrupted (once per session: the recovery tests of
several files compare their ends with it). In CI (CI=true) a test bed that cannot be set up fails
the suite; elsewhere the tests skip with the reason. Every test here is marked `testbed` (for
`-m` users; selection is by folder)."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack_world import TRAIN, World, world_factory
from tests.support.testbed import TestBed, TestBedUnavailable
from tests.support.trainer_helpers import uninterrupted_summary

HERE = Path(__file__).resolve().parent
#: a file each test appends one JSON line to: its wall, the test hosts' CPU seconds (cgroup v1's
#: cpuacct) and this pytest's own (with its reaped children); for measuring the bed's cost
CPU_REPORT = "GPUTRAIN_BED_CPU_REPORT"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.testbed)


@pytest.fixture(scope="session")
def testbed() -> Iterator[TestBed]:
    bed = TestBed(count_cpu=bool(os.environ.get(CPU_REPORT)))
    try:
        bed.start()
    except (TestBedUnavailable, OSError) as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"SSH test bed could not be set up in CI: {e}")
        pytest.skip(f"SSH test bed unavailable: {e}")
    try:
        yield bed
    finally:
        bed.close()


def _own_cpu_s() -> float:
    return sum(
        u.ru_utime + u.ru_stime
        for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


@pytest.fixture(autouse=True)
def _cpu_report(request: pytest.FixtureRequest) -> Iterator[None]:
    """With GPUTRAIN_BED_CPU_REPORT set: one line per test of what it cost (see CPU_REPORT)."""
    report = os.environ.get(CPU_REPORT)
    if not report:
        yield
        return
    bed: TestBed = request.getfixturevalue("testbed")
    hosts0, own0, t0 = bed.hosts_cpu_s(), _own_cpu_s(), time.monotonic()
    yield
    line = {
        "test": request.node.nodeid,
        "wall_s": round(time.monotonic() - t0, 1),
        "hosts_cpu_s": round(bed.hosts_cpu_s() - hosts0, 1),
        "pytest_cpu_s": round(_own_cpu_s() - own0, 1),
    }
    with open(report, "a") as f:
        f.write(json.dumps(line) + "\n")


@pytest.fixture
def tb(testbed: TestBed) -> Iterator[TestBed]:
    before = set(testbed.hosts)
    yield testbed
    for name in [n for n in list(testbed.hosts)[::-1] if n not in before]:
        testbed.remove_host(name)


@pytest.fixture
def world(
    tb: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., World]]:
    """make(nodes=2, ...) -> a `--stack e2e` world on the test bed (tests/support/stack_world.py)."""
    yield from world_factory(tb, tmp_path, monkeypatch)


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The summary of TRAIN on two torchrun agents on this machine, never interrupted."""
    return uninterrupted_summary(tmp_path_factory.mktemp("uninterrupted"), TRAIN)
