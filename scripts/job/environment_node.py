"""The node side of a job's environment (scripts/job/environment.py): the script every node runs
before torchrun — under a per-node lock, reuse the environment of this hash or build it (venv,
requirements, setup) — and running it on every node with its lines live as `[node] [PHASE] ...`.
"""

from __future__ import annotations

import shlex
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gputrain_node import contract
from infra.base.errors import GputrainError
from scripts.job.environment import (
    ENVS_DIR,
    PYPROJECT,
    READ_SECRETS_SH,
    REQUIREMENTS_TXT,
    UV_LOCK,
    Environment,
    EnvironmentSetupError,
    redact,
    secret_stdin,
)
from scripts.job.leftovers import kill_tagged_sh
from scripts.transport.base import Transport, TransportError

#: What the node script prints before its own lines; the launcher shows `[node] [PHASE] ...`.
PHASES = ("requirements", "setup")
_MARK = "gputrain-env:"
#: The node's torch and the CUDA runtime it came with, as pip constraints in the file argv[1]
#: (the node package's, run by its source: the code is not there yet); prints the torch version.
#: `--conflict LOG`: pip's reasons for a ResolutionImpossible in LOG, as ": A; B"
NODE_PINS_PY = contract.source_of(contract.TORCH_PINS).read_text()


def build_prepare_command(
    env: Environment,
    *,
    python: str,
    code_dir: str,
    run_dir: str,
) -> str:
    """The node script (the job's --env values and secrets come on stdin: values_channel): under a per-node lock, reuse the environment `env.key` when its `ready`
    marker names this interpreter (unless forced); else build the venv (system site packages plus
    the interpreter's own paths, so torch stays visible), install the requirements, run `setup`
    in the working directory under its timeout, and write `ready`. Every line it prints starts
    with ``gputrain-env: PHASE``; a failure exits non-zero after a ``failed`` line."""
    q = shlex.quote
    env_dir = f"{ENVS_DIR}/{env.key}"
    install = []
    if env.use_uv_lock:
        install.append(
            "if command -v uv >/dev/null 2>&1; then\n"
            f'  (cd "$CODE" && uv export --frozen --no-hashes --no-emit-project '
            '--format requirements-txt -o "$ENV/uv-requirements.txt") && '
            'pip_install -r "$ENV/uv-requirements.txt" || fail requirements "uv.lock$(conflict)"\n'
            f'else say requirements "no uv on this node: {UV_LOCK} skipped"; fi\n'
        )
    if env.use_requirements_txt:
        install.append(
            f'(cd "$CODE" && pip_install -r {REQUIREMENTS_TXT}) || fail requirements '
            f'"{REQUIREMENTS_TXT}$(conflict)"\n'
        )
    if env.pyproject_deps:
        deps = " ".join(q(d) for d in env.pyproject_deps)
        install.append(
            f'(cd "$CODE" && pip_install {deps}) || fail requirements '
            f'"{PYPROJECT} dependencies$(conflict)"\n'
        )
    setup = ""
    if env.setup.strip():
        timeout_s = max(1, int(env.setup_timeout_s))
        setup = f"""cat > "$ENV/setup.sh" <<'GPUTRAIN_SETUP_EOF'
{env.setup.rstrip()}
GPUTRAIN_SETUP_EOF
SH=sh; command -v bash >/dev/null 2>&1 && SH=bash
say setup "running setup in the working directory (timeout {timeout_s} s)"
# every process setup starts carries the tag: what it leaves running (`cmd &`, a daemon) is
# ended with it, so it can neither hold this step's output open past the timeout nor linger
TAG="$$-$(date +%s%N)"
( cd "$CODE" && PATH="$ENV/bin:$PATH" VIRTUAL_ENV="$ENV" GPUTRAIN_SETUP_TAG="$TAG" \\
  timeout -k 10 {timeout_s} "$SH" -e "$ENV/setup.sh" < /dev/null 2>&1; echo "$?" > "$ENV/setup.rc"
  {kill_tagged_sh("GPUTRAIN_SETUP_TAG", "$TAG")} ) \\
  | tee -a "$ENV/setup.log" | prefix setup
rc=$(cat "$ENV/setup.rc" 2>/dev/null || echo 1)
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then fail setup "timed out after {timeout_s} s"; fi
[ "$rc" = 0 ] || fail setup "exited with code $rc"
"""
    # --force-setup: no reuse, whatever the marker says
    reuse = "false" if env.force else '[ -f "$ENV/ready" ] && [ "$(cat "$ENV/ready")" = "$WANT" ]'
    need_pip = "1" if install else ""
    pins = ""
    if install:  # the node's torch stays (NODE_PINS_PY); said once, and in a conflict's line
        pins = f"""if PINNED=$("$PY" -c {q(NODE_PINS_PY)} "$PINS") && [ -n "$PINNED" ]; then
  set -- $PINNED; say torch "$1 $2"
fi
"""
    installing = (
        f": installing {' + '.join(env.sources)} (pip's output: setup.log)" if install else ""
    )
    if install:  # pip's verdict in one line: what it installed, from every source
        install.append(
            "INSTALLED=$(grep '^Successfully installed ' \"$ENV/setup.log\" 2>/dev/null | "
            "cut -d' ' -f3- | tr '\\n' ' ')\n"
            'if [ -n "$INSTALLED" ]; then say requirements "Successfully installed ${INSTALLED% }"; '
            'else say requirements "nothing new to install"; fi\n'
        )
    return f"""set -u
ROOT=$(pwd)
PY={q(python)}
ENV="$ROOT"/{q(env_dir)}
CODE="$ROOT"/{q(code_dir)}
RUNDIR="$ROOT"/{q(run_dir)}
say() {{ p=$1; shift; echo "{_MARK} $p $*"; }}
# each line as it comes (POSIX: an image's busybox has no `sed -u`)
prefix() {{ while IFS= read -r l || [ -n "$l" ]; do printf '%s\\n' "{_MARK} $1 $l"; done; }}
keep_log() {{ if [ -f "$ENV/setup.log" ]; then cp "$ENV/setup.log" "$RUNDIR/setup.log"; fi; }}
fail() {{ say "$1" "failed: $2"; keep_log; rm -f "$ENV/ready"; exit 1; }}
PINS="$ENV/node-pins.txt"
# pip's ResolutionImpossible reasons ("X depends on torch==..."), for the failure's one line
conflict() {{
  if [ -s "$PINS" ] && [ -f "$ENV/setup.log" ]; then "$PY" -c {q(NODE_PINS_PY)} --conflict "$ENV/setup.log"; fi
}}
# pip's output goes to setup.log alone (the run's results get it); its last lines are shown
# only when it fails
pip_install() {{
  if [ -s "$PINS" ]; then set -- -c "$PINS" "$@"; fi
  "$ENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off --no-input \\
      "$@" >> "$ENV/setup.log" 2>&1 && return 0
  tail -n 8 "$ENV/setup.log" | prefix requirements; return 1
}}
mkdir -p "$ROOT"/{q(ENVS_DIR)} "$RUNDIR"
exec 9>"$ROOT"/{q(ENVS_DIR)}/.lock
if command -v flock >/dev/null 2>&1; then flock 9; fi
WANT=$("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)') || fail requirements "cannot run $PY"
if {reuse}; then
  if [ -s "$PINS" ]; then say torch "$(sed -n 's/^torch==//p' "$PINS") $(($(wc -l < "$PINS") - 1))"; fi
  say cached "{env.key} ($WANT)"
  keep_log
  exit 0
fi
rm -rf "$ENV"
mkdir -p "$ENV"
say requirements "building environment {env.key} for python $WANT{installing}"
"$PY" -m venv --without-pip --system-site-packages "$ENV" >/dev/null 2>&1 || fail requirements "cannot create a venv with $PY"
# the interpreter's own package dirs (a venv's too) after the new venv's: torch stays visible
SITE=$("$ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PY" -c 'import sys, os; print("\\n".join(p for p in sys.path if os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p)))' > "$SITE/_gputrain_base.pth"
{pins}if [ -n "{need_pip}" ] && ! "$ENV/bin/python" -m pip --version >/dev/null 2>&1; then
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
    torch: str = ""  # the node's torch the requirements were installed with ("" unknown/none)


def versions_for_torch(torch: str) -> str:
    """What pytorch/vision's and pytorch/audio's compatibility tables pair with torch 2.Y:
    torchvision 0.(Y+15), torchaudio 2.Y; '' for other versions. Pure."""
    parts = torch.split("+")[0].split(".")
    if len(parts) < 2 or parts[0] != "2" or not parts[1].isdigit():
        return ""
    minor = int(parts[1])
    return f"torchvision 0.{minor + 15}.*, torchaudio 2.{minor}.*"


def parse_prepare_line(line: str) -> tuple[str, str] | None:
    """``gputrain-env: PHASE TEXT`` -> (PHASE, TEXT); None for anything else (e.g. a login banner)."""
    if not line.startswith(_MARK + " "):
        return None
    phase, _, text = line[len(_MARK) + 1 :].partition(" ")
    return phase, text


#: The prepare command's exit status when its stdin did not carry the values (never the script's)
VALUES_FAILED = 113


def values_channel(values: Mapping[str, str]) -> tuple[str, bytes | None]:
    """How the job's --env values and secrets reach a node command without entering any argv:
    the secret channel (NAME BASE64 lines on stdin, exported by shell builtins), so a private
    index's PIP_INDEX_URL given as a secret serves pip too. (command prefix, stdin)."""
    if not values:
        return "", None
    return READ_SECRETS_SH.format(failed=VALUES_FAILED), secret_stdin(values)


def prepare_node(
    transport: Transport,
    env: Environment,
    *,
    python: str,
    code_dir: str,
    run_dir: str,
    extra_env: Mapping[str, str],
    on_line: Callable[[str, str], None],
    wrap: Callable[[Sequence[str], str], str] | None = None,
    secrets: Mapping[str, str] | None = None,
) -> PrepareOutcome:
    """Run the prepare script on one node, its lines to `on_line(node, "[PHASE] text")` (secret
    values shown as ***); raises EnvironmentSetupError naming the node, what failed and its last
    lines. `wrap(names, script)`: how the script runs there with those variables passed on (e.g.
    inside the job's image: container.build_in_image_command)."""
    values = {**extra_env, **(secrets or {})}
    script = build_prepare_command(env, python=python, code_dir=code_dir, run_dir=run_dir)
    read_values, stdin = values_channel(values)
    cmd = read_values + (wrap(list(values), script) if wrap is not None else script)
    hidden = list((secrets or {}).values())
    if hidden:
        shown = on_line

        def on_line(node: str, text: str) -> None:
            shown(node, redact(text, hidden))

    tail: deque[str] = deque(maxlen=4)
    other: deque[str] = deque(maxlen=3)  # what else it printed (e.g. docker's error)
    failed: list[tuple[str, str]] = []
    cached: list[bool] = []
    torch: list[str] = []

    def line(text: str) -> None:
        parsed = parse_prepare_line(text)
        if parsed is None:
            if text.strip():
                other.append(text.strip())
            return
        phase, rest = parsed
        if rest.startswith("failed: "):
            failed.append((phase, rest[len("failed: ") :]))
        elif phase == "cached":
            cached.append(True)
            on_line(transport.name, f"[setup] environment {rest} is ready: skipped (cached)")
        elif phase == "done":
            on_line(transport.name, f"[setup] environment {rest} built")
        elif phase == "torch":  # "VERSION N": the node's torch and N CUDA runtime packages
            version, _, runtime = rest.partition(" ")
            torch.append(version)
            on_line(
                transport.name,
                f"[requirements] the node's torch {version} stays (pinned with its {runtime or 0} "
                "CUDA runtime package(s)): pip picks what fits it",
            )
        else:
            if phase in PHASES:
                tail.append(rest)
            on_line(transport.name, f"[{phase}] {rest}")

    start = time.monotonic()
    try:
        rc = transport.stream(cmd, line, timeout=env.setup_timeout_s + 3600, stdin=stdin)
    except TransportError as e:
        raise EnvironmentSetupError(f"node {transport.name}: preparing the environment: {e}") from e
    if rc == VALUES_FAILED and not failed:
        raise EnvironmentSetupError(
            f"node {transport.name}: preparing the environment: the job's variables did not arrive"
        )
    if rc != 0:
        phase, why = failed[-1] if failed else ("setup", f"failed: exit code {rc}")
        what = "setup" if phase == "setup" else "installing the requirements"
        if torch and " depends on " in why:  # pip's conflict with the node's pins: that is all
            fits = versions_for_torch(torch[0])
            raise EnvironmentSetupError(
                f"node {transport.name}: {what} failed: {why}; the node's torch {torch[0]} stays: "
                + (
                    f"ask for versions built for it ({fits}), "
                    if fits
                    else "ask for versions built for it, "
                )
                + "or use an image with the torch you need"
            )
        errors = [x.strip() for x in tail if x.startswith("ERROR")]  # pip's own verdict
        last = " | ".join(errors or [x.strip() for x in tail if x.strip()] or list(other))
        raise EnvironmentSetupError(
            f"node {transport.name}: {what} failed: {why}"
            + (f"; last lines: {last}" if last else "")
        )
    return PrepareOutcome(
        cached=bool(cached), seconds=time.monotonic() - start, torch=torch[0] if torch else ""
    )


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
    wrap: Callable[[Sequence[str], str], str] | None = None,
    secrets: Mapping[str, str] | None = None,
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
            wrap=wrap,
            secrets=secrets,
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
    torches = sorted({r.torch for r in results.values() if r.torch})
    ui.say(
        f"environment {env.key} ({what}) ready on {len(names)} node(s) in {slowest:.1f} s"
        + (f" with the node's torch {', '.join(torches)}" if torches else "")
        + (f" (cached on {', '.join(cached)})" if cached else "")
    )
    return results
