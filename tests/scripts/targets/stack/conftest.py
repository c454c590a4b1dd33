"""The stack tests' shared fixtures: the fake `pulumi` processes a test starts, ended after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_pulumi_cli import kill_all


@pytest.fixture
def pids(tmp_path: Path) -> Iterator[Path]:
    """Where the fake pulumi writes its pids; whatever of them still runs is killed after."""
    path = tmp_path / "pids"
    yield path
    kill_all(path)
