"""ENTRY against what the upload will hold, before anything is created: a script or module that is
not there is refused (not found after a cluster boot in 30 lines of torchrun traceback), and a data
path ENTRY names that the upload leaves out (ignored by git, a secret) is warned about."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from gputrain_node import contract
from infra.base.errors import UserError
from scripts import ui
from scripts.job.sync import list_workdir_files, never_upload

BUNDLED = ("trainer",)  # packages the upload adds itself (job.include_trainer)


def check_entry(entry: Sequence[str], workdir: Path) -> None:
    """UserError for an ENTRY script or module the nodes will not have; a warning for each path
    an argument names that exists here but stays out of the upload."""
    listed = set(list_workdir_files(workdir))
    if not entry:
        return
    if contract.is_node_entry(entry):  # gputrain's own copy runs it, never the user's code
        args = entry[2:]
    elif entry[0] == "-m":
        if len(entry) < 2 or not entry[1]:
            raise UserError("ENTRY -m: give the module to run, e.g. -m trainer.train")
        _check_module(entry[1], workdir, listed)
        args = entry[2:]
    else:
        if not entry[0].startswith("/"):
            _check_file(entry[0], workdir, listed, what=f"ENTRY {entry[0]}")
        args = entry[1:]
    for arg in args:
        for value in {arg, arg.partition("=")[2]} - {""}:
            _warn_left_out(value, workdir, listed)


def _left_out(rel: str, workdir: Path, listed: set[str]) -> str | None:
    """Why this local file stays home, or None when the upload sends it."""
    if rel not in listed:
        if (workdir / ".git").exists():
            return "ignored by .gitignore"
        return "in a directory the upload skips (VCS, virtualenv, cache or runs)"
    return never_upload({rel: workdir / rel}, workdir).get(rel)


def _check_file(rel: str, workdir: Path, listed: set[str], *, what: str) -> None:
    rel = str(Path(rel))
    if not (workdir / rel).is_file():
        raise UserError(f"{what}: no such file in {workdir} (the directory that is uploaded)")
    why = _left_out(rel, workdir, listed)
    if why is not None:
        raise UserError(
            f"{what}: it is left out of the upload ({why}); the nodes would not have it"
        )


def _check_module(module: str, workdir: Path, listed: set[str]) -> None:
    parts = module.split(".")
    top = parts[0]
    if top in BUNDLED:
        return
    local = workdir / top
    if not (local.is_dir() or (workdir / f"{top}.py").is_file()):
        if importlib.util.find_spec(top) is None:
            ui.warn(
                f"ENTRY -m {module}: not in {workdir} and not installed here; it must be "
                "installed on the nodes"
            )
        return
    path = "/".join(parts)
    for candidate in (f"{path}.py", f"{path}/__main__.py", f"{path}/__init__.py"):
        if (workdir / candidate).is_file():
            _check_file(candidate, workdir, listed, what=f"ENTRY -m {module}")
            return
    raise UserError(
        f"ENTRY -m {module}: no {path}.py or {path}/__main__.py in {workdir} (the directory that "
        "is uploaded)"
    )


def _warn_left_out(value: str, workdir: Path, listed: set[str]) -> None:
    if value.startswith(("-", "/", "~")) or "{out}" in value or "\n" in value:
        return
    try:
        path = workdir / value
        if not path.exists():
            return
        rel = str(path.resolve().relative_to(workdir.resolve()))
    except (OSError, ValueError):
        return
    if path.is_dir():
        inside = [f for f in listed if f.startswith(rel.rstrip("/") + "/")]
        if inside or not any(p.is_file() for p in path.rglob("*")):
            return
        why = "every file in it is ignored by .gitignore"
    else:
        why = _left_out(rel, workdir, listed) or ""
        if not why:
            return
    ui.warn(
        f"ENTRY names {value}, which the upload leaves out ({why}): it will not be on the nodes "
        "(add it to the upload, or put the data on the nodes and give its path there)"
    )
