"""The sshd test bed's fixtures, for the tests in this folder only (`make test` runs this folder in a
second pytest beside the rest; the bed is machine-wide, serialised by a file lock). `testbed`: the
sshd test hosts (session-wide); `tb`: the same, removing the hosts a test added when it ends;
`world`: a `--stack e2e` world on the bed; `uninterrupted`: the stack world's TRAIN run on two
torchrun agents on this machine, never interrupted (once per session: the recovery tests of
several files compare their ends with it). In CI (CI=true) a test bed that cannot be set up fails
the suite; elsewhere the tests skip with the reason. Every test here is marked `testbed` (for
`-m` users; selection is by folder)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.stack_world import TRAIN, World, world_factory
from tests.support.testbed import TestBed, TestBedUnavailable
from tests.support.trainer_helpers import uninterrupted_summary

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.testbed)


@pytest.fixture(scope="session")
def testbed() -> Iterator[TestBed]:
    bed = TestBed()
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
