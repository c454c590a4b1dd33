"""Unpacking what a node sends back: files land private, and nothing escapes the destination —
not by an absolute name, not by `..`, not through a symbolic link already inside it."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from scripts.transport.base import TransportError
from scripts.transport.tar import extract_tar


def _tar(*members: tuple[str, bytes | None, int]) -> bytes:
    """A tar of (name, content or None for a folder, mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def test_a_nodes_results_land_private_with_their_folders(tmp_path: Path) -> None:
    data = _tar(
        (".", None, 0o755),
        ("./out", None, 0o777),
        ("./out/ckpt/model.pt", b"weights", 0o664),  # its folder has no member of its own
        ("./run.sh", b"#!/bin/sh\n", 0o755),
        ("./torchrun.log", b"log\n", 0o644),
    )
    dest = tmp_path / "results" / "n0"
    extract_tar(data, dest)
    assert (dest / "out" / "ckpt" / "model.pt").read_bytes() == b"weights"
    assert (dest / "torchrun.log").read_bytes() == b"log\n"
    assert not (dest / "a").exists()
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (dest / "out", dest / "out" / "ckpt")}
    assert set(modes.values()) == {0o700}
    assert stat.S_IMODE((dest / "out" / "ckpt" / "model.pt").stat().st_mode) == 0o600
    assert stat.S_IMODE((dest / "run.sh").stat().st_mode) == 0o700  # the owner's bits kept
    extract_tar(_tar(("out/ckpt/model.pt", b"newer", 0o600)), dest)  # a relaunch's, over it
    assert (dest / "out" / "ckpt" / "model.pt").read_bytes() == b"newer"


def test_links_and_devices_from_a_node_are_skipped(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind in (("l", tarfile.SYMTYPE), ("h", tarfile.LNKTYPE), ("f", tarfile.FIFOTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, "/etc/passwd"
            tar.addfile(info)
    extract_tar(buf.getvalue(), tmp_path / "d")
    assert list((tmp_path / "d").iterdir()) == []


@pytest.mark.parametrize(
    "name",
    ["/etc/x", "../x", "a/../../x", "./../x", "a/../x", "out//x", "a\\..\\x", "a\nb", "a\x1b]0;t"],
)
def test_a_name_outside_the_destination_is_refused(tmp_path: Path, name: str) -> None:
    """The one rule of every download path (safe_path): not only what escapes once normalized,
    anything that is not plain relative parts."""
    with pytest.raises(TransportError, match="refusing"):
        extract_tar(_tar((name, b"x", 0o644)), tmp_path / "d")
    assert not (tmp_path / "x").exists()


def test_nothing_is_written_through_a_symbolic_link_inside_the_destination(tmp_path: Path) -> None:
    dest, outside = tmp_path / "d", tmp_path / "outside"
    outside.mkdir()
    dest.mkdir()
    os.symlink(outside, dest / "out")  # a folder name that is a link
    os.symlink(outside / "f", dest / "f")  # a file name that is a link
    with pytest.raises(TransportError, match="not a folder"):
        extract_tar(_tar(("out/ckpt.pt", b"x", 0o644)), dest)
    with pytest.raises(TransportError, match="refusing to write 'f'"):
        extract_tar(_tar(("f", b"x", 0o644)), dest)
    assert list(outside.iterdir()) == []
