"""The user's environment on the nodes, prepared before torchrun: their requirements installed into a
venv that still sees the interpreter's own packages (torch), then their `setup` commands — once per
node per content hash. The controller reads and checks the files (bad input is one line before
anything is created); the node script is pure text, run over the transport with live output.

Node layout (relative to the node root): ``.gputrain/envs/<key>/`` the venv, ``ready`` (written
last: the interpreter it was built for), ``setup.sh`` and ``setup.log``; the run's results get a
copy of ``setup.log``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from infra.base.errors import GputrainError, UserError
from scripts.node_layout import NODE_STATE

ENVS_DIR = f"{NODE_STATE}/envs"
DEFAULT_SETUP_TIMEOUT_S = 1800.0
REQUIREMENTS_TXT = "requirements.txt"
PYPROJECT = "pyproject.toml"
UV_LOCK = "uv.lock"
REQUIREMENT_FILES = (REQUIREMENTS_TXT, PYPROJECT, UV_LOCK)
#: gputrain's own distribution name: a pyproject.toml of that name is gputrain's own checkout,
#: whose dependencies (Pulumi, the Google clients...) are the controller's, never the nodes'
OWN_PROJECT = "gputrain"
#: Bumped when the node script changes what a cached environment holds.
_LAYOUT = "1"


class EnvironmentSetupError(GputrainError):
    """Installing the requirements or running `setup` failed on a node (after the machines
    exist: the caller's teardown follows)."""


@dataclass(frozen=True)
class Environment:
    """What every node prepares before torchrun. `key` names the cached environment: a hash of
    the requirement files and the setup commands, then (`for_python`) of the interpreter."""

    key: str
    sources: tuple[str, ...]  # the requirement files used (relative to the working dir)
    pyproject_deps: tuple[str, ...]  # [project].dependencies, installed by name
    use_requirements_txt: bool
    use_uv_lock: bool
    setup: str = ""
    setup_timeout_s: float = DEFAULT_SETUP_TIMEOUT_S
    force: bool = False

    def for_python(self, python: str) -> Environment:
        """The same environment keyed for one interpreter (each gets its own venv)."""
        key = hashlib.sha256(f"{self.key}\0{python}".encode()).hexdigest()[:16]
        return dataclasses.replace(self, key=key)

    @property
    def python_rel(self) -> str:
        """The venv's interpreter seen from the run's code snapshot (``.gputrain/runs/ID/code``),
        where run.sh starts torchrun: relative, so it holds whatever the node root is."""
        return f"../../../envs/{self.key}/bin/python"


def plan_environment(
    workdir: Path | None,
    *,
    requirements: bool = True,
    setup: str = "",
    setup_timeout_s: float = DEFAULT_SETUP_TIMEOUT_S,
    force: bool = False,
) -> Environment | None:
    """The environment the nodes must prepare, or None when there is nothing to install or run.
    Reads and checks the requirement files (UserError naming the file and line)."""
    if not 0 < setup_timeout_s <= 7 * 86400:
        raise UserError(
            f"--setup-timeout {setup_timeout_s:g}: not allowed; use seconds > 0, at most 7 days"
        )
    texts: dict[str, str] = {}
    if requirements and workdir is not None:
        for name in REQUIREMENT_FILES:
            path = workdir / name
            if path.is_file():
                try:
                    texts[name] = path.read_text()
                except (OSError, UnicodeDecodeError) as e:
                    raise UserError(f"{name}: cannot read it ({type(e).__name__})") from None
    deps: tuple[str, ...] = ()
    if PYPROJECT in texts and is_own_project(texts[PYPROJECT]):
        from scripts import ui

        ui.say(
            f"{PYPROJECT}: gputrain's own project; its dependencies are the controller's and "
            "are not installed on the nodes"
        )
        del texts[PYPROJECT]
    elif PYPROJECT in texts:
        deps = pyproject_dependencies(texts[PYPROJECT])
        for dep in deps:
            for named in re.findall(r"file:\S+", dep):
                if outside_upload(named):
                    raise UserError(
                        f"{PYPROJECT}: dependency {dep!r} names {named!r}, outside the uploaded "
                        "code; allowed: a requirement, or a file: path inside the project"
                    )
    if REQUIREMENTS_TXT in texts:
        check_requirements_txt(texts[REQUIREMENTS_TXT])
    used_txt = REQUIREMENTS_TXT in texts
    used_uv = UV_LOCK in texts
    if not (used_txt or deps or used_uv or setup.strip()):
        return None
    h = hashlib.sha256(f"gputrain-env {_LAYOUT}\0".encode())
    for name in sorted(texts):
        if name == PYPROJECT:  # only what is installed from it counts, not the rest of the file
            h.update(f"{name}\0{chr(0).join(deps)}\0".encode())
        else:
            h.update(f"{name}\0{texts[name]}\0".encode())
    h.update(f"setup\0{setup}".encode())
    sources = tuple(n for n in REQUIREMENT_FILES if n in texts)
    return Environment(
        key=h.hexdigest()[:16],
        sources=sources if (used_txt or deps or used_uv) else (),
        pyproject_deps=deps,
        use_requirements_txt=used_txt,
        use_uv_lock=used_uv,
        setup=setup,
        setup_timeout_s=setup_timeout_s,
        force=force,
    )


#: pip's option lines that name a file or folder it reads (`-r FILE`, `--requirement=FILE`...);
#: `--find-links DIR` only lists archives there (a node's wheel cache): pip's to judge
_PATH_OPTION = re.compile(r"^(?:-r|--requirement|-c|--constraint|-e|--editable)(?:=|\s*)(\S+)")
_FIND_LINKS = re.compile(r"^(?:-f|--find-links)\b")


def outside_upload(path: str) -> bool:
    """A path pip would read on the node that is not in the uploaded code: absolute, from a
    home or a variable (pip expands ${VAR}), or climbing out with `..` (file: URLs alike). Pure."""
    if "://" in path and not path.startswith("file:"):
        return False  # an index or archive on the network: pip's to fetch
    if path.startswith("file:"):
        path = re.sub(r"^file:(//[^/]*)?", "", path) or "/"
    parts = path.replace("\\", "/").split("/")
    return path.startswith(("/", "~", "$")) or "$" in path or ".." in parts


def check_requirements_txt(text: str) -> None:
    """Every requirement line must parse (PEP 508); option lines (`-r`, `-e`, `--index-url`, ...)
    and URLs are pip's to judge, but none may name a file outside the upload (`-r /etc/passwd`,
    `-e ../x`, `file:///...`). UserError names the line."""
    from packaging.requirements import InvalidRequirement, Requirement

    for number, raw in enumerate(_logical_lines(text), start=1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        option = _PATH_OPTION.match(line)
        named = option.group(1) if option else line if line.startswith((".", "/", "~")) else None
        named = named or next(iter(re.findall(r"file:\S+", line)), None)
        if named is not None and not _FIND_LINKS.match(line) and outside_upload(named):
            raise UserError(
                f"{REQUIREMENTS_TXT} line {number}: {line!r} names {named!r}, outside the "
                "uploaded code; allowed: a path inside the project, relative to "
                f"{REQUIREMENTS_TXT} (not absolute, not from ~ or a $VARIABLE, no '..')"
            )
        if not line or line.startswith("-") or "://" in line or line.startswith((".", "/")):
            continue
        try:
            Requirement(line)
        except InvalidRequirement as e:
            raise UserError(
                f"{REQUIREMENTS_TXT} line {number}: {line!r} is not a requirement ({_first_line(e)}); "
                "allowed: NAME[extras] [version specifiers] [; markers], or a pip option line"
            ) from None


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _logical_lines(text: str) -> list[str]:
    """pip's lines: a trailing backslash continues the line (numbered by its first line)."""
    out: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def _toml(text: str) -> dict[str, object]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{PYPROJECT}: not valid TOML ({_first_line(e)})") from None


def is_own_project(text: str) -> bool:
    """The pyproject.toml is gputrain's own (`make run` from its checkout): nothing of it goes
    to the nodes (the reference trainer's needs are installed where the image lacks them)."""
    project = _toml(text).get("project")
    return isinstance(project, dict) and project.get("name") == OWN_PROJECT


def pyproject_dependencies(text: str) -> tuple[str, ...]:
    """`[project].dependencies` of a pyproject.toml (empty when it declares none); UserError for a
    file that is not TOML or a dependency that does not parse."""
    from packaging.requirements import InvalidRequirement, Requirement

    project = _toml(text).get("project")
    deps = project.get("dependencies", []) if isinstance(project, dict) else []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise UserError(f"{PYPROJECT}: [project].dependencies must be a list of strings")
    for d in deps:
        try:
            Requirement(d)
        except InvalidRequirement as e:
            raise UserError(
                f"{PYPROJECT}: dependency {d!r} is not a requirement ({_first_line(e)}); "
                "allowed: PEP 508"
            ) from None
    return tuple(deps)


@dataclass(frozen=True)
class EnvironmentSettings:
    """What a target's file declares (a stack's `setup`/`secrets` keys, a hosts file's): the
    command line adds to it (`--secret`) or replaces it (`--setup`)."""

    setup: str = ""
    secrets: tuple[str, ...] = ()
    image: str = ""
    build: str = ""  # a stack's `build` Dockerfile (the stack target builds it)
    project: str | None = None  # for `sm://SECRET` without a project
    source: str = ""  # how error lines name the file's keys, e.g. "gputrain:" or "hosts.yaml: "
    # "vertex": no SSH; the job resolves its secrets and runs the setup itself
    backend_without_ssh: str | None = None
