"""Results of a relaunched run land on those of the attempt before: folders merge, files replace."""

from __future__ import annotations

from pathlib import Path

from scripts.job.download import move_into


def test_a_relaunch_merges_folders_and_replaces_files(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "tensorboard").mkdir(parents=True)
    (old / "tensorboard" / "events.1").write_text("first attempt")
    (old / "summary.json").write_text("old")
    (new / "tensorboard").mkdir(parents=True)
    (new / "tensorboard" / "events.2").write_text("relaunch")
    (new / "summary.json").write_text("new")
    for p in new.iterdir():
        move_into(p, old / p.name)
    assert sorted(p.name for p in (old / "tensorboard").iterdir()) == ["events.1", "events.2"]
    assert (old / "summary.json").read_text() == "new"
