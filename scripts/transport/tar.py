"""The tar streams between the controller and a node: one way to pack files for a node, one way to
unpack what a node sends back (safely), and the shell commands at the node's end."""

from __future__ import annotations

import io
import os
import shlex
import shutil
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Literal

from scripts import ui
from scripts.transport.base import TransportError
from scripts.transport.safe_path import SafeTree

Codec = Literal["gzip", "zstd"]
"""How a tar for a node is compressed: zstd where the node has it (it unpacks ~3x faster and
is ~20 % smaller than gzip at level 1), else gzip, which every node has."""


def tar_files(
    files: Mapping[str, Path],
    data: Mapping[str, bytes] | None = None,
    *,
    compress: Codec | None = None,
) -> bytes:
    """A tar of {name in the archive: local file} (modes kept, owner neutral) and of in-memory
    ``data`` members (mode 0644); ``compress``: gzip at level 1 (``tar -x -z``) or zstd at level 3
    (``tar -x -I zstd``): source code shrinks 3-4x for a few ms per MiB, paid once, and every
    node then receives and decrypts less."""
    buf = io.BytesIO()
    opts = {"mode": "w:gz", "compresslevel": 1} if compress == "gzip" else {"mode": "w"}
    with tarfile.open(fileobj=buf, **opts) as tar:
        for name, path in files.items():
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(path, "rb") as f:
                tar.addfile(info, f)
        for name, content in (data or {}).items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
    if compress == "zstd":
        import zstandard  # lazy: only a launch's bundle needs it

        return zstandard.ZstdCompressor(level=3).compress(buf.getvalue())
    return buf.getvalue()


def untar_command(dest: str, codec: Codec) -> str:
    """At the node: unpack a tar_files(compress=codec) tar from stdin into dest (quoted)."""
    return f"tar -x {'-z' if codec == 'gzip' else '-I zstd'} -f - -C {dest}"


ZSTD_PROBE = "command -v zstd"
"""At the node: succeeds where zstd is on PATH (a builtin: no process)."""


def pack_command(remote: str, exclude: tuple[str, ...] = (), before: str = "") -> str:
    """At the node: tar to stdout a directory's contents (minus ``exclude``, e.g. "./code"), or
    one file; exit 3 (no output) if it is missing. `before`: a command run first on the same
    channel (its output must not reach stdout, which carries the tar)."""
    parent, name = os.path.split(remote.rstrip("/"))
    q, qp, qn = shlex.quote(remote), shlex.quote(parent or "."), shlex.quote(name)
    ex = "".join(f" --exclude={shlex.quote(e)}" for e in exclude)
    return (
        (f"{before}\n" if before else "") + f"if [ -d {q} ]; then tar -c -f -{ex} -C {q} .; "
        f"elif [ -e {q} ]; then tar -c -f - -C {qp} {qn}; else exit {PACK_MISSING}; fi"
    )


PACK_MISSING = 3  # pack_command's exit code when the path is not on the node
TAR_FILE_CHANGED = 1  # GNU tar --create: a file changed as it was read; the archive is whole


def pack_outcome(node: str, remote: str, code: int, stderr: str | bytes) -> bool:
    """What pack_command's exit code says: False, no such path; True, a whole tar, also where a
    file changed as tar read it (a job still writing: its copy is as read, said in one line)."""
    if code == PACK_MISSING:
        return False
    if code == TAR_FILE_CHANGED:
        ui.warn(f"{node}: a file under {remote} changed as it was read: its copy is as read")
    elif code != 0:
        raise TransportError(f"node {node}: download of {remote} failed: {stderr!r}")
    return True


def extract_tar(data: bytes | IO[bytes], dest: Path) -> None:
    """Unpack a tar from a node safely, each name by the one rule of every download path
    (safe_path.SafeTree: relative plain parts only, nothing through a symbolic link); links and
    devices skipped; folders it makes are 0700 and files private to the user."""
    tree = SafeTree(dest)
    fileobj = io.BytesIO(data) if isinstance(data, bytes) else data
    with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
        for member in tar:
            rel = member.name
            while rel.startswith("./"):  # `tar -C DIR .` names everything ./...
                rel = rel[2:]
            if rel in (".", ""):
                continue
            if member.isdir():
                tree.folder(tree.check(rel.rstrip("/")))
            elif member.isfile():  # links, devices and fifos from a node are skipped
                src = tar.extractfile(member)
                assert src is not None
                fd = tree.open_new(rel)
                with open(fd, "wb") as out:
                    shutil.copyfileobj(src, out)
                    os.fchmod(fd, member.mode & 0o700 | 0o600)  # private to the user
