"""The job's environment on one Vertex AI replica, before torchrun: the requirements installed into a
venv that still sees the container's packages (torch), then the `setup` commands in the working
directory — as every GCE node prepares it (scripts/job/environment_node.py), without the cache:
each replica is a fresh machine. The controller passes both as data in the job's env
(scripts/targets/vertex/environment.py); the commands run as `sh -c`'s script (bash's when there is
one), with `-e`. Output goes to the job's log as `[requirements] ...` and `[setup] ...` lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import cast

from gputrain_node import torch_pins
from gputrain_node.contract import REQUIREMENTS_ENV, SETUP_ENV, SETUP_TIMEOUT_ENV

DEFAULT_TIMEOUT_S = 1800
KILL_GRACE_S = 10.0  # after the timeout's SIGTERM, as `timeout -k 10` on the nodes
SETUP_LOG = "setup.log"  # in the out dir: the chief's reaches the run's results (AIP_MODEL_DIR)
TIMED_OUT = 124  # the replica's exit status when setup runs out of time (timeout(1)'s)


class SetupFailed(Exception):
    """Installing the requirements or the setup failed on this replica: one line, the replica's
    exit status (the job's error names it)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code if 0 < exit_code < 256 else 1


#: Where a line goes: say(phase, text) -> `[phase] text` in the job's log (and setup.log).
Say = Callable[[str, str], None]


def print_line(phase: str, text: str) -> None:
    print(f"[{phase}] {text}", flush=True)


def _stream(
    argv: list[str],
    prefix: str,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float | None,
    say: Say = print_line,
) -> tuple[int, bool, list[str]]:
    """Run argv in its own process group, every output line as `[prefix] line`; SIGTERM/SIGINT to
    this process (a cancel) and the timeout stop the whole group. (status, timed out, last lines)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    timed_out = threading.Event()

    def stop_group() -> None:
        """SIGTERM, a grace period, then SIGKILL to whatever of the group is left (a child that
        ignores SIGTERM would hold the output pipe open)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            if sig == signal.SIGTERM:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(KILL_GRACE_S)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_group()
        sys.exit(128 + signum)

    def on_timeout() -> None:
        timed_out.set()
        stop_group()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    timer = threading.Timer(timeout_s, on_timeout) if timeout_s else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    last: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            text = line.rstrip("\n")
            say(prefix, text)
            last = [*last[-3:], text]
        status = proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status, timed_out.is_set(), last


def _make_venv(python: str, env: Mapping[str, str], task: str) -> Path:
    """A venv with system site packages plus this interpreter's own site dirs (a venv's too), so
    the container's torch stays the one used; pip from ensurepip where none is visible."""
    where = Path(tempfile.mkdtemp(prefix="gputrain-env-"))
    venv_python = str(where / "bin" / "python")
    site = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    try:
        subprocess.run(
            [python, "-m", "venv", "--without-pip", "--system-site-packages", str(where)],
            check=True,
            capture_output=True,
        )
        purelib = subprocess.run(
            [venv_python, "-c", site], check=True, capture_output=True, text=True
        ).stdout.strip()
        base = [p for p in sys.path if os.path.isdir(p) and p.endswith(("-packages", "-packages/"))]
        (Path(purelib) / "_gputrain_base.pth").write_text("".join(f"{p}\n" for p in base))
        pip = subprocess.run([venv_python, "-m", "pip", "--version"], capture_output=True, env=env)
        if pip.returncode:
            subprocess.run([venv_python, "-m", "ensurepip"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SetupFailed(
            f"requirements on {task}: cannot make a venv with pip from {python} ({e}); the "
            "image needs python3-venv or pip",
            1,
        ) from None
    return where


def install_requirements(
    spec: Mapping[str, object], workdir: Path, env: dict[str, str], task: str, say: Say = print_line
) -> Path:
    """The requirements into a new venv, under the container's torch and the CUDA runtime it came
    with as pip constraints (as on GCE nodes: pip picks a matching torchvision or fails naming
    the conflict, never replaces torch); its directory (SetupFailed naming the file, the
    conflict and pip's last lines on failure)."""
    venv = _make_venv(sys.executable, env, task)
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--no-input",
    ]
    kept = torch_pins.write(str(venv / "node-pins.txt"))
    if kept:
        say("requirements", f"torch {kept['torch']} stays ({len(kept) - 1} package(s) with it)")
        pip += ["-c", str(venv / "node-pins.txt")]
    reasons: list[str] = []

    def saying(phase: str, text: str) -> None:  # pip's reasons, for the failure's one line
        if (reason := torch_pins.conflict_reason(text)) and reason not in reasons:
            reasons.append(reason)
        say(phase, text)

    steps: list[tuple[str, list[str]]] = []
    if spec.get("uv_lock"):
        if shutil.which("uv", path=env.get("PATH")):
            exported = str(venv / "uv-requirements.txt")
            uv = [
                "uv",
                "export",
                "--frozen",
                "--no-hashes",
                "--no-emit-project",
                "--format",
                "requirements-txt",
                "-o",
                exported,
            ]
            status, _, last = _stream(uv, "requirements", workdir, env, None, say)
            if status:
                raise SetupFailed(
                    f"requirements on {task}: uv export of uv.lock failed (exit code {status})",
                    status,
                )
            steps.append(("uv.lock", [*pip, "-r", exported]))
        else:
            say("requirements", "no uv on this replica: uv.lock skipped")
    if spec.get("requirements_txt"):
        steps.append(("requirements.txt", [*pip, "-r", "requirements.txt"]))
    deps = [str(d) for d in cast(list[object], spec.get("pyproject_deps") or [])]
    if deps:
        steps.append(("pyproject.toml dependencies", [*pip, *deps]))
    for what, argv in steps:
        status, _, last = _stream(argv, "requirements", workdir, env, None, saying)
        if status:
            errors = [x.strip() for x in last if x.startswith("ERROR")] or [
                x.strip() for x in last if x.strip()
            ]
            raise SetupFailed(
                f"requirements on {task}: installing {what} failed (pip exit code {status})"
                + (f": {'; '.join(reasons)}" if reasons else "")
                + (f"; last lines: {' | '.join(errors)}" if errors else ""),
                status,
            )
    return venv


def run_setup(
    commands: str,
    workdir: Path,
    env: Mapping[str, str],
    timeout_s: float,
    task: str,
    say: Say = print_line,
) -> None:
    """The commands with `-e` in the working directory; SetupFailed naming the replica and the
    exit code, or the timeout."""
    shell = shutil.which("bash", path=env.get("PATH")) or "sh"
    say("setup", f"running setup in {workdir} (timeout {timeout_s:g} s)")
    argv = [shell, "-e", "-c", commands, "setup"]
    status, timed_out, _ = _stream(argv, "setup", workdir, env, timeout_s, say)
    if timed_out:
        raise SetupFailed(
            f"setup on {task}: timed out after {timeout_s:g} s (--setup-timeout)", TIMED_OUT
        )
    if status:
        raise SetupFailed(
            f"setup on {task}: exited with code {status}; see its [setup] lines", status
        )


@contextlib.contextmanager
def _saying(log: Path | None) -> Iterator[Say]:
    """print_line, and each line also into `log` (the run's setup.log, as on the nodes)."""
    if log is None:
        yield print_line
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:

        def say(phase: str, text: str) -> None:
            print_line(phase, text)
            f.write(f"[{phase}] {text}\n")
            f.flush()

        yield say


def prepare(environ: Mapping[str, str], workdir: Path, task: str, log: Path | None = None) -> str:
    """Requirements, then setup, as the job's env asks, their lines also into `log`; the
    interpreter torchrun must use (the venv's, or this one). `environ` holds no secret values
    yet: setup never sees them."""
    env = dict(environ)
    python = sys.executable
    raw = environ.get(REQUIREMENTS_ENV)
    commands = environ.get(SETUP_ENV, "")
    if not raw and not commands.strip():
        return python
    with _saying(log) as say:
        if raw:
            venv = install_requirements(json.loads(raw), workdir, env, task, say)
            python = str(venv / "bin" / "python")
        if commands.strip():
            timeout = environ.get(SETUP_TIMEOUT_ENV, "")
            seconds = float(timeout) if timeout.isdigit() else DEFAULT_TIMEOUT_S
            run_setup(commands, workdir, env, seconds, task, say)
    return python
