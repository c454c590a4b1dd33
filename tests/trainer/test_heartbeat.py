"""The trainer's heartbeat (trainer/heartbeat.py): the file per rank the node's watch reads."""

from __future__ import annotations

from pathlib import Path

from gputrain_node import contract
from trainer import heartbeat
from trainer.heartbeat import Heartbeat


def test_heartbeat_touches_the_ranks_file_at_most_once_a_second(tmp_path: Path) -> None:
    hb = Heartbeat({"GPUTRAIN_HEARTBEAT": str(tmp_path / "heartbeat"), "RANK": "3"})
    hb.beat()
    path = tmp_path / "heartbeat.rank3"
    first = path.stat().st_mtime_ns
    hb.beat()  # within the second: not touched again
    assert path.stat().st_mtime_ns == first
    assert Heartbeat({}).path is None


def test_the_trainer_spells_the_node_agents_heartbeat_name() -> None:
    assert heartbeat.HEARTBEAT_ENV == contract.HEARTBEAT_ENV
