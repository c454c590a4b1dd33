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
import shlex
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from infra.base.errors import GputrainError, UserError
from scripts.node_layout import NODE_STATE
from scripts.transport.base import Transport, TransportError

ENVS_DIR = f"{NODE_STATE}/envs"
DEFAULT_SETUP_TIMEOUT_S = 1800.0
REQUIREMENTS_TXT = "requirements.txt"
PYPROJECT = "pyproject.toml"
UV_LOCK = "uv.lock"
#: Bumped when the node script changes what a cached environment holds.
_LAYOUT = "1"
#: What the node script prints before its own lines; the launcher shows `[node] [PHASE] ...`.
PHASES = ("requirements", "setup")
_MARK = "gputrain-env:"


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
        for name in (REQUIREMENTS_TXT, PYPROJECT, UV_LOCK):
            path = workdir / name
            if path.is_file():
                try:
                    texts[name] = path.read_text()
                except (OSError, UnicodeDecodeError) as e:
                    raise UserError(f"{name}: cannot read it ({type(e).__name__})") from None
    deps: tuple[str, ...] = ()
    if PYPROJECT in texts:
        deps = pyproject_dependencies(texts[PYPROJECT])
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
    sources = tuple(n for n in (REQUIREMENTS_TXT, PYPROJECT, UV_LOCK) if n in texts)
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


def check_requirements_txt(text: str) -> None:
    """Every requirement line must parse (PEP 508); option lines (`-r`, `-e`, `--index-url`, ...)
    and URLs are pip's to judge. UserError names the line."""
    from packaging.requirements import InvalidRequirement, Requirement

    for number, raw in enumerate(_logical_lines(text), start=1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
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


def pyproject_dependencies(text: str) -> tuple[str, ...]:
    """`[project].dependencies` of a pyproject.toml (empty when it declares none); UserError for a
    file that is not TOML or a dependency that does not parse."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{PYPROJECT}: not valid TOML ({_first_line(e)})") from None
    project = data.get("project")
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


def build_prepare_command(
    env: Environment,
    *,
    python: str,
    code_dir: str,
    run_dir: str,
    extra_env: Mapping[str, str],
) -> str:
    """The node script: under a per-node lock, reuse the environment `env.key` when its `ready`
    marker names this interpreter (unless forced); else build the venv (system site packages plus
    the interpreter's own paths, so torch stays visible), install the requirements, run `setup`
    in the working directory under its timeout, and write `ready`. Every line it prints starts
    with ``gputrain-env: PHASE``; a failure exits non-zero after a ``failed`` line."""
    q = shlex.quote
    exports = "".join(f"export {k}={q(v)}\n" for k, v in extra_env.items())
    env_dir = f"{ENVS_DIR}/{env.key}"
    install = []
    if env.use_uv_lock:
        install.append(
            "if command -v uv >/dev/null 2>&1; then\n"
            f'  (cd "$CODE" && uv export --frozen --no-hashes --no-emit-project '
            '--format requirements-txt -o "$ENV/uv-requirements.txt") && '
            'pip_install -r "$ENV/uv-requirements.txt" || fail requirements "uv.lock"\n'
            f'else say requirements "no uv on this node: {UV_LOCK} skipped"; fi\n'
        )
    if env.use_requirements_txt:
        install.append(
            f'(cd "$CODE" && pip_install -r {REQUIREMENTS_TXT}) || fail requirements '
            f"{REQUIREMENTS_TXT}\n"
        )
    if env.pyproject_deps:
        deps = " ".join(q(d) for d in env.pyproject_deps)
        install.append(
            f'(cd "$CODE" && pip_install {deps}) || fail requirements "{PYPROJECT} dependencies"\n'
        )
    setup = ""
    if env.setup.strip():
        timeout_s = max(1, int(env.setup_timeout_s))
        setup = f"""cat > "$ENV/setup.sh" <<'GPUTRAIN_SETUP_EOF'
{env.setup.rstrip()}
GPUTRAIN_SETUP_EOF
SH=sh; command -v bash >/dev/null 2>&1 && SH=bash
say setup "running setup in the working directory (timeout {timeout_s} s)"
( cd "$CODE" && PATH="$ENV/bin:$PATH" VIRTUAL_ENV="$ENV" \\
  timeout -k 10 {timeout_s} "$SH" -e "$ENV/setup.sh" < /dev/null 2>&1; echo "$?" > "$ENV/setup.rc" ) \\
  | tee -a "$ENV/setup.log" | sed -u 's/^/{_MARK} setup /'
rc=$(cat "$ENV/setup.rc" 2>/dev/null || echo 1)
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then fail setup "timed out after {timeout_s} s"; fi
[ "$rc" = 0 ] || fail setup "exited with code $rc"
"""
    force = "1" if env.force else ""
    need_pip = "1" if install else ""
    return f"""set -u
ROOT=$(pwd)
PY={q(python)}
ENV="$ROOT"/{q(env_dir)}
CODE="$ROOT"/{q(code_dir)}
RUNDIR="$ROOT"/{q(run_dir)}
{exports}say() {{ p=$1; shift; echo "{_MARK} $p $*"; }}
keep_log() {{ if [ -f "$ENV/setup.log" ]; then cp "$ENV/setup.log" "$RUNDIR/setup.log"; fi; }}
fail() {{ say "$1" "failed: $2"; keep_log; rm -f "$ENV/ready"; exit 1; }}
pip_install() {{
  {{ "$ENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off --no-input \\
      "$@" 2>&1; echo "$?" > "$ENV/pip.rc"; }} | tee -a "$ENV/setup.log" | sed -u 's/^/{_MARK} requirements /'
  return "$(cat "$ENV/pip.rc" 2>/dev/null || echo 1)"
}}
mkdir -p "$ROOT"/{q(ENVS_DIR)} "$RUNDIR"
exec 9>"$ROOT"/{q(ENVS_DIR)}/.lock
if command -v flock >/dev/null 2>&1; then flock 9; fi
WANT=$("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)') || fail requirements "cannot run $PY"
if [ -z "{force}" ] && [ -f "$ENV/ready" ] && [ "$(cat "$ENV/ready")" = "$WANT" ]; then
  say cached "{env.key} ($WANT)"
  keep_log
  exit 0
fi
rm -rf "$ENV"
mkdir -p "$ENV"
say requirements "building environment {env.key} for python $WANT"
"$PY" -m venv --without-pip --system-site-packages "$ENV" >/dev/null 2>&1 || fail requirements "cannot create a venv with $PY"
# the interpreter's own package dirs (a venv's too) after the new venv's: torch stays visible
SITE=$("$ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PY" -c 'import sys, os; print("\\n".join(p for p in sys.path if os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p)))' > "$SITE/_gputrain_base.pth"
if [ -n "{need_pip}" ] && ! "$ENV/bin/python" -m pip --version >/dev/null 2>&1; then
  "$ENV/bin/python" -m ensurepip --default-pip >/dev/null 2>&1 || fail requirements "$PY has no pip (install python3-pip or python3-venv)"
fi
{"".join(install)}{setup}echo "$WANT" > "$ENV/ready"
keep_log
say done "{env.key}"
"""


@dataclass(frozen=True)
class PrepareOutcome:
    cached: bool
    seconds: float


def parse_prepare_line(line: str) -> tuple[str, str] | None:
    """``gputrain-env: PHASE TEXT`` -> (PHASE, TEXT); None for anything else (e.g. a login banner)."""
    if not line.startswith(_MARK + " "):
        return None
    phase, _, text = line[len(_MARK) + 1 :].partition(" ")
    return phase, text


def prepare_node(
    transport: Transport,
    env: Environment,
    *,
    python: str,
    code_dir: str,
    run_dir: str,
    extra_env: Mapping[str, str],
    on_line: Callable[[str, str], None],
) -> PrepareOutcome:
    """Run the prepare script on one node, its lines to `on_line(node, "[PHASE] text")`; raises
    EnvironmentSetupError naming the node, what failed and its last lines."""
    cmd = build_prepare_command(
        env, python=python, code_dir=code_dir, run_dir=run_dir, extra_env=extra_env
    )
    tail: deque[str] = deque(maxlen=4)
    failed: list[tuple[str, str]] = []
    cached: list[bool] = []

    def line(text: str) -> None:
        parsed = parse_prepare_line(text)
        if parsed is None:
            return
        phase, rest = parsed
        if rest.startswith("failed: "):
            failed.append((phase, rest[len("failed: ") :]))
        elif phase == "cached":
            cached.append(True)
            on_line(transport.name, f"[setup] environment {rest} is ready: skipped (cached)")
        elif phase == "done":
            on_line(transport.name, f"[setup] environment {rest} built")
        else:
            if phase in PHASES:
                tail.append(rest)
            on_line(transport.name, f"[{phase}] {rest}")

    start = time.monotonic()
    try:
        rc = transport.stream(cmd, line, timeout=env.setup_timeout_s + 3600)
    except TransportError as e:
        raise EnvironmentSetupError(f"node {transport.name}: preparing the environment: {e}") from e
    if rc != 0:
        phase, why = failed[-1] if failed else ("setup", f"failed: exit code {rc}")
        what = "setup" if phase == "setup" else "installing the requirements"
        errors = [x.strip() for x in tail if x.startswith("ERROR")]  # pip's own verdict
        last = " | ".join(errors or [x.strip() for x in tail if x.strip()])
        raise EnvironmentSetupError(
            f"node {transport.name}: {what} failed: {why}"
            + (f"; last lines: {last}" if last else "")
        )
    return PrepareOutcome(cached=bool(cached), seconds=time.monotonic() - start)


def prepare_environment(
    names: Sequence[str],
    transports: Mapping[str, Transport],
    env: Environment,
    *,
    python: str,
    code_dir: str,
    run_dir: str,
    extra_env: Mapping[str, str],
    on_line: Callable[[str, str], None],
) -> dict[str, PrepareOutcome]:
    """Every node at once; the first failure (by node order) is raised, naming its node."""
    from scripts import ui
    from scripts.parallel import parallel

    def one(name: str) -> PrepareOutcome:
        return prepare_node(
            transports[name],
            env,
            python=python,
            code_dir=code_dir,
            run_dir=run_dir,
            extra_env=extra_env,
            on_line=on_line,
        )

    results, errors = parallel(list(names), one)
    if errors:
        first = next(n for n in names if n in errors)
        err = errors[first]
        raise (
            err if isinstance(err, GputrainError) else EnvironmentSetupError(f"node {first}: {err}")
        )
    cached = [n for n in names if results[n].cached]
    slowest = max(r.seconds for r in results.values())
    what = " + ".join([*env.sources, *(["setup"] if env.setup.strip() else [])])
    ui.say(
        f"environment {env.key} ({what}) ready on {len(names)} node(s) in {slowest:.1f} s"
        + (f" (cached on {', '.join(cached)})" if cached else "")
    )
    return results


@dataclass(frozen=True)
class EnvironmentSettings:
    """What a target's file declares (a stack's `setup`/`secrets` keys, a hosts file's): the
    command line adds to it (`--secret`) or replaces it (`--setup`)."""

    setup: str = ""
    secrets: tuple[str, ...] = ()
    image: str = ""
    project: str | None = None  # for `sm://SECRET` without a project
    source: str = ""  # how error lines name the file's keys, e.g. "gputrain:" or "hosts.yaml: "
    backend_without_ssh: str | None = None  # "vertex": no setup or secrets there (yet)


def file_setting_text(value: object, setting: str) -> str:
    """A `setup` value: a (multi-line) string; UserError otherwise."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UserError(f"{setting}: {value!r} is not allowed; expected shell commands (a string)")
    return value


def file_setting_names(value: object, setting: str) -> tuple[str, ...]:
    """A `secrets` value: a list of strings (also from the JSON the Pulumi CLI hands over)."""
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value) if value.strip() else []
        except ValueError:
            value = [value]
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise UserError(
            f"{setting}: {value!r} is not allowed; expected a list like [WANDB_API_KEY, "
            "HF_TOKEN=sm://hf-token]"
        )
    return tuple(value)
