"""`down` brings home what only the bucket has: a file of one node is never taken for another's
that has the same name and size (every node writes `model.bin` of the same size), or the second
node's results were emptied out of the bucket without coming home."""

from __future__ import annotations

from pathlib import Path

from scripts.targets.stack.bucket import local_copy


def test_another_nodes_file_of_the_same_name_and_size_is_not_a_copy(tmp_path: Path) -> None:
    (tmp_path / "node-0").mkdir()
    (tmp_path / "node-0" / "model.bin").write_bytes(b"x" * 64)
    nodes = frozenset({"node-0", "node-1"})  # their watchdogs' end markers are in the bucket
    found = local_copy(tmp_path, "node-0/model.bin", 64, nodes)
    assert found == tmp_path / "node-0" / "model.bin"
    assert local_copy(tmp_path, "node-1/model.bin", 64, nodes) is None


def test_the_same_nodes_file_elsewhere_in_its_folder_is_one(tmp_path: Path) -> None:
    (tmp_path / "node-1" / "out").mkdir(parents=True)
    (tmp_path / "node-1" / "out" / "model.bin").write_bytes(b"x" * 64)
    nodes = frozenset({"node-1"})
    found = local_copy(tmp_path, "node-1/model.bin", 64, nodes)
    assert found == tmp_path / "node-1" / "out" / "model.bin"
    assert local_copy(tmp_path, "node-1/model.bin", 65, nodes) is None
    # a shared prefix (the mirror's checkpoints/) may be home in any node's folder
    assert local_copy(tmp_path, "checkpoints/model.bin", 64, nodes) is not None
