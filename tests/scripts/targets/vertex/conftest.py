"""The `world` fixture of the Vertex end-to-end tests (tests/support/vertex_world.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.gcs_emulator import GcsEmulator
from tests.support.vertex_world import World, world_factory


@pytest.fixture
def world(
    tmp_path: Path, gcs: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., World]]:
    yield from world_factory(tmp_path, gcs, monkeypatch)
