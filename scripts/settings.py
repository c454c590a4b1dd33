"""What every target shares: where the Pulumi project and the results are, how long to wait for
machines, and the run ids results are filed under."""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from infra.base.errors import UserError
from scripts import ui

CHECKOUT = Path(__file__).resolve().parent.parent
RESULTS_MARKER = ".gputrain-results"  # in runs/: gputrain's results, never uploaded as code
MADE_BY_GPUTRAIN = "made by gputrain\n"  # the marker's text where gputrain made runs/ itself
LAST_RUN = "LAST_RUN"  # runs/<target>/LAST_RUN: the id `gputrain logs` follows by default
NODE_ROOT_ENV = "GPUTRAIN_NODE_ROOT"  # where a node keeps its code and runs (see transport/base.py)
RUNS_DIR_ENV = "GPUTRAIN_RUNS_DIR"  # where results go (`--runs-dir`): default runs/ here
RUNS_GITIGNORE = "*\n"  # runs/.gitignore: git, the upload and build contexts pass it by


def _private_dir(d: Path) -> bool:
    """`d` made 0700 (and its parents), or left as it is where it exists: whether it was made."""
    try:
        d.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        return False
    d.chmod(0o700)  # mkdir's mode passes through the umask
    return True


def _made_by_gputrain(marker: Path) -> bool:
    """The marker says gputrain made its directory: only then is the directory gputrain's. An
    empty marker is one gputrain left in a directory of the user's (or an older gputrain's)."""
    try:
        return marker.read_text() == MADE_BY_GPUTRAIN
    except (OSError, UnicodeDecodeError):
        return False


def user_path(value: str, setting: str) -> Path:
    """A path the user gave (`~` expanded), absolute; one UserError line when `~user` names no
    user here (pathlib raises RuntimeError)."""
    try:
        return Path(value).expanduser().absolute()
    except RuntimeError:
        raise UserError(
            f"{setting} {value}: {value.split('/')[0]} is no user's home directory here; "
            "allowed: a path, ~ or ~USER for a user of this machine"
        ) from None


def default_runs_dir() -> Path:
    """$GPUTRAIN_RUNS_DIR, else runs/ in the working directory (git ignores it: results_dir)."""
    override = os.environ.get(RUNS_DIR_ENV)
    return user_path(override, RUNS_DIR_ENV) if override else Path.cwd() / "runs"


def state_home() -> Path:
    """$XDG_STATE_HOME, else ~/.local/state: a user's own state, outside any project."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")


def find_project_root(start: Path | None = None) -> Path:
    """The Pulumi project: the nearest directory upwards with Pulumi.yaml, else this checkout."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "Pulumi.yaml").is_file():
            return d
    return CHECKOUT


def path_problem(path: Path) -> str | None:
    """Why the system cannot look `path` up (a name longer than it allows, a parent this user
    may not enter), or None. pathlib's exists() raises for these instead of saying False."""
    try:
        path.exists()
    except OSError as e:
        return f"not a usable path ({e.strerror})"
    return None


def unmakeable(where: Path) -> str | None:
    """Why `where` (a directory) cannot be made or written by this user, or None: its nearest
    part that exists must be a directory in which a directory can be made (tried: a writable
    mode bit says nothing in /proc or on a read-only mount for root). `where` must be usable
    (path_problem)."""
    probe = where
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable by this user"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".gputrain-probe-", dir=probe))
    except OSError as e:
        return f"no directory can be made in {probe} ({e.strerror})"
    return None


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass
class Settings:
    root: Path = field(default_factory=find_project_root)  # the Pulumi project
    runs_dir: Path = field(default_factory=default_runs_dir)
    connect_deadline_s: float = 900.0  # SSH to new cloud VMs (boot, sshd, login key)
    existing_wait_s: float = 30.0  # SSH to machines that exist: a refusal after this is final
    verify_deadline_s: float = 900.0  # the GPU driver answering nvidia-smi

    @property
    def local_node_root(self) -> Path:
        """Where `--local` keeps the node's code, runs and environments: $GPUTRAIN_NODE_ROOT,
        else one per results directory in the user's state home (never inside the project, where
        git, editors, test collectors and build contexts would walk its venvs)."""
        override = os.environ.get(NODE_ROOT_ENV)
        if override:
            return Path(override)
        runs = self.runs_dir.absolute()
        key = hashlib.sha256(str(runs).encode()).hexdigest()[:10]
        return state_home() / "gputrain" / "local" / f"{runs.parent.name or 'root'}-{key}"

    def check_results_home(self) -> None:
        """Before anything is created: runs/<target>/<run-id>/ can be made, so that no run trains
        only to find nowhere to put its results, and not the working directory itself, whose
        files are uploaded as the job's code (the results marker there would keep them all out of
        the upload). One UserError line."""
        where = self.runs_dir.absolute()
        why = path_problem(where) or unmakeable(where)
        if why is None and where.resolve() == Path.cwd().resolve():
            why = "it is the working directory, whose files are uploaded as the job's code"
        if why is None:
            return
        raise UserError(
            f"results directory {where}: {why}; allowed: a directory you can write, other than "
            f"the working directory (--runs-dir, {RUNS_DIR_ENV})"
        )

    def check_local_node_root(self) -> None:
        """Before anything runs on `--local`: its node state directory can be made (a HOME this
        user cannot write, a read-only XDG_STATE_HOME, GPUTRAIN_NODE_ROOT naming a file). One
        UserError line naming the setting."""
        why: str | None
        try:
            where = self.local_node_root.absolute()
        except RuntimeError:  # no HOME and no password entry: Path.home() cannot say
            where, why = Path("~/.local/state"), "this user has no home directory"
        else:
            why = path_problem(where) or unmakeable(where)
        if why is None:
            return
        settings = (
            NODE_ROOT_ENV
            if os.environ.get(NODE_ROOT_ENV)
            else f"XDG_STATE_HOME, or {NODE_ROOT_ENV} for the directory itself"
        )
        raise UserError(
            f"--local node state directory {where}: {why}; allowed: a directory you can write "
            f"({settings})"
        )

    def results_path(self, target: str, run_id: str) -> Path:
        """runs/<target>/<run-id>/, not made yet. Pure."""
        return self.runs_dir / target / run_id

    def results_dir(self, target: str, run_id: str) -> Path:
        """runs/<target>/<run-id>/ (runs/ as runs_home makes it), recorded as the target's last
        run."""
        made = self.made_results_dir(target, run_id)
        (made.parent / LAST_RUN).write_text(run_id + "\n")
        return made

    def made_results_dir(self, target: str, run_id: str) -> Path:
        """runs/<target>/<run-id>/ (runs/ as runs_home makes it) for a run's results brought
        home again: LAST_RUN still names the newest run started."""
        target_dir = self.runs_home() / target
        for d in (target_dir, target_dir / run_id):
            _private_dir(d)
        return target_dir / run_id

    def runs_home(self) -> Path:
        """runs/, made private to the user (0700) where gputrain makes it; a directory that
        exists keeps its mode (`--runs-dir ~/results`, a shared one). It carries the marker that keeps it
        out of every upload (job/sync.py), and, when it is gputrain's (made now, or its marker
        says gputrain made it), a .gitignore that keeps it out of git (said once, when it is
        written): never one in a directory of the user's, however often it holds results."""
        runs = self.runs_dir
        marker = runs / RESULTS_MARKER
        made = _private_dir(runs)
        if made:
            marker.write_text(MADE_BY_GPUTRAIN)
            marker.chmod(0o600)
        ignore = runs / ".gitignore"
        if (made or _made_by_gputrain(marker)) and not ignore.exists():
            ignore.write_text(RUNS_GITIGNORE)
            ui.say(
                f"results go to {runs} (git ignores it: its .gitignore); "
                f"--runs-dir or {RUNS_DIR_ENV} puts them elsewhere"
            )
        marker.touch(mode=0o600)
        return runs

    def has_last_run(self, target: str) -> bool:
        return (self.runs_dir / target / LAST_RUN).is_file()

    def last_run(self, target: str) -> str:
        last = self.runs_dir / target / LAST_RUN
        if not last.is_file():
            raise UserError(
                f"no run recorded for {target}; name the run (its id, e.g. {new_run_id()})"
            )
        return last.read_text().strip()
