"""The one rule every download path shares (a node's tar, bucket objects at `down`, at teardown,
by Vertex `results`): plain relative parts only, and nothing written through a symbolic link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts.transport.base import TransportError
from scripts.transport.safe_path import SafeTree, unsafe_reason


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/home/u/.bashrc",
        "//etc/passwd",
        "model//x",
        "x/",
        "..",
        "a/../../b",
        "./a",
        "a/./b",
        "a\\..\\..\\b",
        "a\x00b",
        "log\x1b]52;c;ZXZpbA==\x07",
        "a\nb",
    ],
)
def test_names_that_are_not_plain_relative_parts_are_refused(name: str) -> None:
    assert unsafe_reason(name)


@pytest.mark.parametrize("name", ["model.pt", "out/ckpt/ckpt-00000010.pt", "a..b/..c", "é/ü.txt"])
def test_plain_relative_names_pass(name: str) -> None:
    assert unsafe_reason(name) is None


def test_a_tree_makes_private_folders_and_never_goes_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    tree = SafeTree(tmp_path / "run")
    assert tree.file("model/x.pt") == tmp_path / "run" / "model" / "x.pt"
    assert (tmp_path / "run" / "model").stat().st_mode & 0o777 == 0o700
    os.symlink(outside, tmp_path / "run" / "linked")
    os.symlink(outside / "f", tmp_path / "run" / "f")
    fresh = SafeTree(tmp_path / "run")  # no cache: each folder is looked at
    with pytest.raises(TransportError, match="not a folder"):
        fresh.file("linked/x")
    with pytest.raises(TransportError, match="symbolic link"):
        fresh.file("f")
    with pytest.raises(TransportError, match="an absolute path"):
        fresh.file("/etc/passwd")
    assert list(outside.iterdir()) == []
