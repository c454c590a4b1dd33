"""The job's environment on the nodes, prepared before torchrun: the user's requirements installed
into a venv that still sees the interpreter's own packages (torch), then their `setup` commands —
once per node per content hash. The controller reads and checks the files (bad input is one line before
anything is created); the node script is pure text, run over the transport with live output.

Node layout (relative to the node root): ``.gputrain/envs/<key>/`` the venv, ``ready`` (written
last: the interpreter it was built for), ``setup.sh`` and ``setup.log``; the run's results get a
copy of ``setup.log``.

Secrets for the job: resolved on the controller (its environment, or Secret Manager for
``NAME=sm://SECRET[/VERSION]``), held only in process memory, sent to each node on the SSH
channel's stdin into the detached start — never into argv, run.sh, the run snapshot or any file —
and redacted from every line shown or logged. On the node the start command reads ``NAME BASE64``
lines up to an empty line and exports them (shell builtins only: no process gets a value in its
argv); run.sh then pipes its own output through an awk filter that reads the values from its
environment and prints ``***`` for each.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gputrain_node.contract import SECRET_ENDPOINT_ENV, SECRET_REFS_ENV
from infra.base.errors import GputrainError, UserError
from infra.secret_refs import SM_SCHEME as SM_SCHEME  # re-exported: parsing lives in infra
from infra.secret_refs import SecretRef
from infra.secret_refs import parse_secret as parse_secret
from infra.secret_refs import parse_secrets as parse_secrets
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
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
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


#: Where the Secret Manager client goes instead of Google (a private endpoint; the tests' fake).
ENDPOINT_ENV = SECRET_ENDPOINT_ENV
REDACTED = "***"
NAMES_ENV = "GPUTRAIN_SECRET_NAMES"  # names only (never values): what run.sh's filter redacts

SecretFetcher = Callable[[str, str, str], str]  # (project, secret, version) -> value


def resolve_secrets(
    refs: Sequence[SecretRef],
    *,
    project: str | None,
    environ: Mapping[str, str] | None = None,
    fetch: SecretFetcher | None = None,
) -> dict[str, str]:
    """Every value, or UserError naming the first secret that cannot be had (before anything is
    created)."""
    env = os.environ if environ is None else environ
    values: dict[str, str] = {}
    for ref in refs:
        if ref.sm_secret is None:
            value = env.get(ref.name)
            if value is None:
                raise UserError(
                    f"secret {ref.name}: the environment variable {ref.name} is not set here; "
                    f"export it before the command, or declare {ref.name}=sm://SECRET[/VERSION]"
                )
            values[ref.name] = value
            continue
        where = ref.sm_project or project or env.get("GOOGLE_CLOUD_PROJECT")
        if not where:
            raise UserError(
                f"secret {ref.name}: sm://{ref.sm_secret} needs a project; use "
                "sm://projects/PROJECT/secrets/SECRET or set GOOGLE_CLOUD_PROJECT"
            )
        values[ref.name] = (fetch or fetch_secret_manager)(where, ref.sm_secret, ref.sm_version)
    return values


#: How long a secret's read may retry an unreachable or unavailable Secret Manager (the
#: client's own default is 60 s of retries, then a traceback).
SECRET_DEADLINE_S = 30.0


def fetch_secret_manager(
    project: str, secret: str, version: str, *, deadline_s: float = SECRET_DEADLINE_S
) -> str:
    """One secret version's payload from Secret Manager; UserError for a missing secret, a
    refused access or a Secret Manager that does not answer (one line: the resource, the fix)."""
    from google.api_core import exceptions as gexc
    from google.api_core.retry import Retry, if_transient_error
    from google.cloud import secretmanager

    from infra.gcp.api import unreachable

    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials

        client = secretmanager.SecretManagerServiceClient(
            credentials=AnonymousCredentials(),
            transport="rest",
            client_options=ClientOptions(api_endpoint=endpoint),
        )
    else:
        client = secretmanager.SecretManagerServiceClient()
    resource = f"projects/{project}/secrets/{secret}/versions/{version}"
    retry = Retry(predicate=if_transient_error).with_deadline(deadline_s)
    try:
        answer = client.access_secret_version(name=resource, timeout=deadline_s, retry=retry)
    except gexc.NotFound:
        raise UserError(
            f"secret {resource}: not found in Secret Manager; create it with `gcloud secrets "
            f"create {secret} --project {project}` and add a version"
        ) from None
    except (gexc.Forbidden, gexc.Unauthorized) as e:  # also PermissionDenied, Unauthenticated
        raise UserError(
            f"secret {resource}: access refused ({e.message}); grant roles/secretmanager."
            "secretAccessor on it to your account"
        ) from None
    except (gexc.GoogleAPIError, OSError) as e:  # RetryError, 5xx, a refused connection
        raise UserError(
            f"secret {resource}: Secret Manager did not answer ({unreachable(e)}); check this "
            "machine's network or proxy and run again"
        ) from None
    return bytes(answer.payload.data).decode("utf-8")


SECRETS_HEADER = "#gputrain-secrets"


#: Vertex: the job's body carries references only (SECRET_REFS_ENV; the node package's Vertex
#: entry resolves them).


def secret_references(refs: Sequence[SecretRef], project: str | None) -> dict[str, str]:
    """name -> `projects/P/secrets/S/versions/V` for a job that resolves its own secrets
    (Vertex); UserError for a secret that is not in Secret Manager (a value of this machine's
    environment cannot reach the job without being written into its body)."""
    out: dict[str, str] = {}
    for ref in refs:
        if ref.sm_secret is None:
            raise UserError(
                f"secret {ref.name}: on backend: vertex a secret must come from Secret Manager "
                f"({ref.name}=sm://SECRET[/VERSION]): the job reads it there itself"
            )
        where = ref.sm_project or project
        if not where:
            raise UserError(f"secret {ref.name}: sm://{ref.sm_secret} needs a project")
        out[ref.name] = f"projects/{where}/secrets/{ref.sm_secret}/versions/{ref.sm_version}"
    return out


def refuse_env_secrets(env: Mapping[str, str], secrets: Mapping[str, Sequence[SecretRef]]) -> None:
    """A name both `--env` and a secret (`secrets`: the setting -> its refs): the node would
    set one over the other and the job see the plain value, silently. One UserError line (the
    value never echoed)."""
    for setting, refs in secrets.items():
        for ref in refs:
            if ref.name in env:
                raise UserError(
                    f"--env {ref.name}=...: {ref.name} is also a secret ({setting} {ref.name}); "
                    "allowed: a name in only one of them"
                )


def machine_secrets_line(names: Iterable[str], in_secret_manager: Iterable[str]) -> str | None:
    """Why a `gputrain reconcile` pass on another machine cannot relaunch a run whose secrets
    `names` are not all in Secret Manager: a value of this machine's environment never leaves
    it. None when every secret is a reference. Pure."""
    here = sorted(set(names) - set(in_secret_manager))
    if not here:
        return None
    return (
        f"with secrets from this machine's environment ({', '.join(here)}) a pass cannot "
        f"relaunch this run; use NAME=sm://SECRET[/VERSION] for {', '.join(here)}"
    )


def read_secret_references(
    refs: Mapping[str, str], fetch: SecretFetcher | None = None
) -> dict[str, str]:
    """name -> value of each `projects/P/secrets/S/versions/V` reference (what a reconcile pass
    reads itself, as the launch's controller did); UserError as fetch_secret_manager's."""
    values = {}
    for name, ref in refs.items():
        _, project, _, secret, _, version = ref.split("/")
        values[name] = (fetch or fetch_secret_manager)(project, secret, version)
    return values


def secret_refs_env(refs: Mapping[str, str]) -> dict[str, str]:
    import json

    return {SECRET_REFS_ENV: json.dumps(dict(refs), sort_keys=True)} if refs else {}


def secret_stdin(values: Mapping[str, str]) -> bytes:
    """What precedes run.sh on the start command's stdin when there are secrets: a header line,
    ``NAME BASE64`` lines, an empty line (nothing without secrets)."""
    if not values:
        return b""
    lines = [f"{k} {base64.b64encode(v.encode()).decode()}\n" for k, v in values.items()]
    return (f"{SECRETS_HEADER}\n" + "".join(lines) + "\n").encode()


#: The start command's first step when there are secrets (a format string: {failed} is its exit
#: status for a stdin without them): export each secret read from stdin, in shell builtins only
#: (its own variables are GPUTRAIN_*, a prefix no secret may take, so none is overwritten)
#: (`read`, `printf`, `export`; base64 reads the value on its stdin, never in argv). `read` takes
#: the lines byte by byte, so what follows the empty line (the code bundle) is left for the unpack.
READ_SECRETS_SH = (
    f"{NAMES_ENV}=''; IFS= read -r GPUTRAIN_H; [ \"$GPUTRAIN_H\" = '{SECRETS_HEADER}' ] || "
    "exit {failed}; while IFS=' ' read -r GPUTRAIN_N GPUTRAIN_V && [ -n \"$GPUTRAIN_N\" ]; do "
    'GPUTRAIN_V=$(printf "%s" "$GPUTRAIN_V" | base64 -d) || exit {failed}; '
    'export "$GPUTRAIN_N=$GPUTRAIN_V"; '
    f'{NAMES_ENV}="${NAMES_ENV} $GPUTRAIN_N"; done; export {NAMES_ENV}; '
    "unset GPUTRAIN_H GPUTRAIN_N GPUTRAIN_V; "
)

#: run.sh's own output (and so torchrun's and every rank's) through a filter that prints *** for
#: each value, line by line (awk reads them from its environment): the node's log never holds one.
REDACT_OUTPUT_SH = f"""if [ -n "${{{NAMES_ENV}:-}}" ]; then
  rm -f "$RUN/.redact"; mkfifo "$RUN/.redact"
  AWK=awk; case $(awk -W version 2>&1) in *mawk*) AWK="awk -W interactive";; esac  # line by line
  $AWK 'BEGIN {{ n = split(ENVIRON["{NAMES_ENV}"], names, " "); k = 0
       for (i = 1; i <= n; i++) {{ m = split(ENVIRON[names[i]], parts, "\\n")
         for (j = 1; j <= m; j++) if (parts[j] != "") pieces[++k] = parts[j] }} }}
  {{ line = $0
     for (i = 1; i <= k; i++) {{ v = pieces[i]; out = ""
       while ((j = index(line, v)) > 0) {{ out = out substr(line, 1, j - 1) "{REDACTED}"; line = substr(line, j + length(v)) }}
       line = out line }}
     print line; fflush() }}' < "$RUN/.redact" &
  exec > "$RUN/.redact" 2>&1
  rm -f "$RUN/.redact"
fi
"""


def redact(text: str, values: Iterable[str]) -> str:
    """Every occurrence of every value (and of each line of a multi-line one) replaced by ***,
    the longest first."""
    pieces = {p for v in values for p in [v, *v.splitlines()] if p}
    for v in sorted(pieces, key=len, reverse=True):
        text = text.replace(v, REDACTED)
    return text


def redacting(
    sink: Callable[[str, str], None], values: Iterable[str]
) -> Callable[[str, str], None]:
    """`sink` with every secret value redacted from its lines (the same sink without secrets)."""
    secrets = tuple(v for v in values if v)
    if not secrets:
        return sink

    def redacted(node: str, line: str) -> None:
        sink(node, redact(line, secrets))

    return redacted
