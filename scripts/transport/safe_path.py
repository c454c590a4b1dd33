"""The one rule for every name a node or a bucket gives the controller to write under a results
directory (a node's result tar, bucket objects at `down`, at a run's teardown and by Vertex
`results`): a relative path of plain parts, written only through real folders. Whatever code runs
with the nodes' storage role can name objects; none of them may land outside the results."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from scripts.transport.base import TransportError

ALLOWED = (
    "a relative path of '/'-separated names, none empty, '.' or '..', without '\\' or controls"
)


def unsafe_reason(name: str) -> str | None:
    """Why `name` may not be written under a results directory (None: it may). Pure."""
    if not name:
        return "an empty name"
    if name.startswith("/"):
        return "an absolute path"
    if "\\" in name:
        return "a backslash"
    if any(not c.isprintable() for c in name):
        return "a control character"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "an empty, '.' or '..' part"
    return None


class SafeTree:
    """Writes under `root` only: each name must pass `unsafe_reason`, each folder on the way is
    made 0700 or must already be a real folder (never a symbolic link), and a file is opened
    without following a link. One lstat per folder, cached: the controller unpacks every node's
    results through it."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self._checked = {""}  # folders below root known to be real folders (made or lstat-ed)

    def check(self, name: str) -> str:
        """`name` itself, or TransportError naming it and why it is refused."""
        why = unsafe_reason(name)
        if why:
            raise TransportError(f"refusing {name!r} under {self.root}: {why} (allowed: {ALLOWED})")
        return name

    def folder(self, rel: str) -> Path:
        """root/rel as a real folder (made 0700 where missing)."""
        if rel not in self._checked:
            self.check(rel)
            self.folder(os.path.dirname(rel))
            path = os.path.join(self.root, rel)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    raise TransportError(
                        f"refusing a path through {rel!r} under {self.root} (not a folder)"
                    ) from None
            self._checked.add(rel)
        return self.root / rel if rel else self.root

    def file(self, name: str) -> Path:
        """Where the file `name` goes: its folders made and checked; not itself a link."""
        self.check(name)
        self.folder(os.path.dirname(name))
        path = self.root / name
        if path.is_symlink():
            raise TransportError(f"refusing to write {name!r} under {self.root}: a symbolic link")
        return path

    def open_new(self, name: str) -> int:
        """A file descriptor to write `name` (created 0600, truncated), never through a link."""
        path = self.file(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        try:
            return os.open(path, flags, 0o600)
        except OSError as e:  # ELOOP: the file's name became a symbolic link
            raise TransportError(f"refusing to write {name!r}: {e}") from None
