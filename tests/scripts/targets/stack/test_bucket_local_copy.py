"""`down` brings home what only the bucket has, and empties the bucket after: an object counts as
home only where that node's copy of it is, with the same content. A file of one node is never
taken for another's that has the same name and size (every node writes `model.bin` of the same
size), the mirror's `out/<node>/` and `workdir/<node>/` are that node's files, a checkpoint of a
fixed name from an earlier attempt is not the newer one, and a user's `ckpt-00000100.pt` is a
file like any other. Any of these taken for home had the node's results emptied out of the
bucket without coming home."""

from __future__ import annotations

import base64
from pathlib import Path

import google_crc32c

from infra.gcp.gcs import ObjectInfo
from scripts.targets.stack.bucket import is_checkpoint_file, local_copy

NODES = frozenset({"node-0", "node-1"})  # their watchdogs' end markers are in the bucket


def obj(relative: str, data: bytes) -> ObjectInfo:
    """The object as the bucket lists it: its size and CRC32C (base64, big-endian)."""
    crc = base64.b64encode(google_crc32c.Checksum(data).digest()).decode()
    return ObjectInfo(f"runs/r/{relative}", len(data), crc)


def test_another_nodes_file_of_the_same_name_and_size_is_not_a_copy(tmp_path: Path) -> None:
    (tmp_path / "node-0").mkdir()
    (tmp_path / "node-0" / "model.bin").write_bytes(b"x" * 64)
    found = local_copy(tmp_path, "node-0/model.bin", obj("node-0/model.bin", b"x" * 64), NODES)
    assert found == tmp_path / "node-0" / "model.bin"
    assert local_copy(tmp_path, "node-1/model.bin", obj("x", b"x" * 64), NODES) is None


def test_the_same_nodes_file_elsewhere_in_its_folder_is_one(tmp_path: Path) -> None:
    (tmp_path / "node-1" / "out").mkdir(parents=True)
    (tmp_path / "node-1" / "out" / "model.bin").write_bytes(b"x" * 64)
    found = local_copy(tmp_path, "node-1/model.bin", obj("x", b"x" * 64), NODES)
    assert found == tmp_path / "node-1" / "out" / "model.bin"
    assert local_copy(tmp_path, "node-1/model.bin", obj("x", b"x" * 65), NODES) is None
    # a shared prefix (the reference trainer's checkpoints/) may be home in any node's folder
    assert local_copy(tmp_path, "checkpoints/model.bin", obj("x", b"x" * 64), NODES) is not None


def test_the_mirrors_objects_are_their_nodes_files(tmp_path: Path) -> None:
    """`out/node-1/model.bin` is node-1's `model.bin`, `workdir/node-1/s.pt` its `workdir/s.pt`:
    never node-0's file of that name and size."""
    (tmp_path / "node-0" / "workdir").mkdir(parents=True)
    (tmp_path / "node-0" / "model.bin").write_bytes(b"a" * 8)
    (tmp_path / "node-0" / "workdir" / "s.pt").write_bytes(b"b" * 8)
    assert local_copy(tmp_path, "out/node-1/model.bin", obj("x", b"a" * 8), NODES) is None
    assert local_copy(tmp_path, "workdir/node-1/s.pt", obj("x", b"b" * 8), NODES) is None
    (tmp_path / "node-1" / "workdir").mkdir(parents=True)
    (tmp_path / "node-1" / "model.bin").write_bytes(b"a" * 8)
    (tmp_path / "node-1" / "workdir" / "s.pt").write_bytes(b"b" * 8)
    found = local_copy(tmp_path, "out/node-1/model.bin", obj("x", b"a" * 8), NODES)
    assert found == tmp_path / "node-1" / "model.bin"
    found = local_copy(tmp_path, "workdir/node-1/s.pt", obj("x", b"b" * 8), NODES)
    assert found == tmp_path / "node-1" / "workdir" / "s.pt"


def test_an_earlier_attempts_checkpoint_of_the_same_name_and_size_is_not_home(
    tmp_path: Path,
) -> None:
    (tmp_path / "node-1").mkdir()
    (tmp_path / "node-1" / "ckpt.pt").write_bytes(b"step-100")  # brought home after attempt 1
    newer = obj("out/node-1/ckpt.pt", b"step-200")  # the same size, the bucket's newest
    assert local_copy(tmp_path, "out/node-1/ckpt.pt", newer, NODES) is None
    same = obj("out/node-1/ckpt.pt", b"step-100")
    assert (
        local_copy(tmp_path, "out/node-1/ckpt.pt", same, NODES) == tmp_path / "node-1" / "ckpt.pt"
    )


def test_only_the_reference_trainers_checkpoints_are_checkpoints() -> None:
    assert is_checkpoint_file("checkpoints/ckpt-00000100.pt")
    assert is_checkpoint_file("checkpoints/ckpt-00000100.pt.manifest.json")
    assert not is_checkpoint_file("out/node-1/ckpt-00000100.pt")  # a user's trainer's: a file
    assert not is_checkpoint_file("node-1/ckpt-00000100.pt")
