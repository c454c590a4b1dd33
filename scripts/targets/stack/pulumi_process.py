"""The Pulumi CLI as gputrain starts it (PulumiStackRunner hands this to the Automation API as its
PulumiCommand): each `pulumi` in a session of its own, so the terminal's Ctrl-C reaches gputrain
alone and gputrain decides what pulumi hears; its output watched, so a pulumi that prints nothing
for GPUTRAIN_PULUMI_SILENCE_S is ended with one line instead of holding the controller forever.

Interrupted (Ctrl-C, SIGTERM: `Interrupted` from the run's SignalGuard), pulumi gets SIGINT, its
own graceful cancel: it finishes the operations in flight, records them and lets go of the stack's
lock, so the teardown that follows destroys them. A further interruption, or the user's "stop
waiting" (StoppedWaiting, a KeyboardInterrupt), ends it sooner: SIGINT, then SIGKILL to its
process group. Pulumi's plugins are in that group; nothing else is. A pulumi killed in an update
(up, refresh, destroy), silent or interrupted again, after it showed that it holds the stack's
lock (LOCK_HELD) leaves that lock behind: it is gputrain's own, and the teardown that follows
clears it (`release`); one killed before may have found someone else's lock, which is left alone.
Light to import: the SDK only inside `run`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from infra.base.errors import GputrainError
from scripts import ui

SILENCE_ENV = "GPUTRAIN_PULUMI_SILENCE_S"
#: Pulumi prints a line whenever a resource's operation ends or fails, and the program's longest
#: one (a VM's create or delete, infra/components/nodes.py) times out after 20 minutes: 30 minutes
#: without a line is a pulumi that is stuck, not a slow cloud.
DEFAULT_SILENCE_S = 1800.0
STOP_GRACE_S = 10.0  # SIGINT to SIGKILL, when pulumi is stuck or the user stops waiting
NOTE_EVERY_S = 300.0  # a line while pulumi is silent, so a long wait is never a blank screen
READERS_JOIN_S = 5.0  # pulumi has ended: the rest of its output, unless something holds the pipe
#: the verbs gputrain runs that hold the stack's lock, each with its header (Pulumi's ActionLabel)
UPDATES = {"up": "Updating", "refresh": "Refreshing", "destroy": "Destroying"}
#: A line pulumi prints only once it holds the stack's lock (Pulumi's source, pkg/backend): a
#: self-managed backend's Update, Refresh and Destroy (diy/backend.go) call Lock, then `apply`
#: prints the header `Updating (STACK):`; Pulumi Cloud's `apply` (httpstate/backend.go) prints
#: its header, without the colon, before StartUpdate (the service's lock), and `View Live: URL`
#: (display.go) after it. Killed before such a line, the lock on the stack may be another's.
LOCK_HELD = re.compile(r"(?:Updating|Refreshing|Destroying) \([^()]+\):|View Live: \S+")


def pulumi_silence_s(environ: Mapping[str, str] = os.environ) -> float:
    """How long pulumi may print nothing: GPUTRAIN_PULUMI_SILENCE_S, else 30 minutes."""
    from scripts.watch.telemetry import env_seconds

    value = env_seconds(SILENCE_ENV, environ)
    return DEFAULT_SILENCE_S if value is None else value


class PulumiStuckError(GputrainError):
    """A pulumi run printed nothing for the bound and was ended (or, after one that would not
    end, was not started)."""


def _duration(seconds: float) -> str:
    from infra.keys import format_duration

    return format_duration(max(1, round(seconds)))


def _what(args: list[str]) -> tuple[str, str, str]:
    """('pulumi destroy of stack S', 'destroy', 'S') from the argv the SDK built."""
    words = [a for a in args if a != "--non-interactive"]
    verb = " ".join(words[:2] if words and words[0] in ("stack", "config") else words[:1])
    stack = words[words.index("--stack") + 1] if "--stack" in words[:-1] else "?"
    return f"pulumi {verb} of stack {stack}", verb, stack


class _Silent(Exception):
    """pulumi printed no line for the bound."""


class _Heard:
    """When pulumi last printed a line, and whether one said it holds the stack's lock (its
    reader threads say so)."""

    def __init__(self) -> None:
        self.at = time.monotonic()
        self.locked = False

    def quiet_s(self) -> float:
        return time.monotonic() - self.at


def _reader(
    stream: IO[str], callback: Callable[[str], Any] | None, lines: list[str], heard: _Heard
) -> threading.Thread:
    def read() -> None:
        for line in iter(stream.readline, ""):
            heard.at = time.monotonic()
            stripped = line.rstrip()
            heard.locked = heard.locked or LOCK_HELD.fullmatch(stripped.strip()) is not None
            if callback:
                callback(stripped)
            lines.append(stripped)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _join(readers: list[threading.Thread]) -> None:
    """The rest of pulumi's output read, unless something holds the pipe (READERS_JOIN_S)."""
    until = time.monotonic() + READERS_JOIN_S
    for reader in readers:
        reader.join(timeout=max(0.0, until - time.monotonic()))


def _signal_group(process: subprocess.Popen[str], signum: int) -> None:
    """`signum` to the process group we started (its id is pulumi's pid: start_new_session)."""
    with contextlib.suppress(ProcessLookupError):  # every process of it has ended already
        os.killpg(process.pid, signum)


def _end(process: subprocess.Popen[str], grace_s: float) -> bool:
    """SIGINT to pulumi's group, SIGKILL after `grace_s` or at a further interruption (then
    raised on); what of its group outlives it (a plugin deaf to SIGINT), SIGKILL too. True:
    pulumi itself had to be killed (its stack's lock may remain)."""
    _signal_group(process, signal.SIGINT)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        _signal_group(process, signal.SIGKILL)
        process.wait()
    return _killed(process)


def _killed(process: subprocess.Popen[str]) -> bool:
    """pulumi ended by SIGKILL, not on its own: it did not let go of the stack's lock."""
    return process.returncode == -signal.SIGKILL


class WatchedPulumiCommand:
    """What the Automation API needs of a PulumiCommand (`command`, `version`, `run`); `run` is
    the SDK's (same argv, environment and result), the process handled as the module says."""

    def __init__(self, command: str, version: Any, silence_s: float) -> None:
        self.command = command
        self.version = version
        self.silence_s = silence_s
        self.stuck: str | None = None  # a pulumi that would not end: none is started again...
        self.own_lock = False  # ...until `release`: it was killed in an update, holding the lock

    def run(
        self,
        args: list[str],
        cwd: str,
        additional_env: Mapping[str, str],
        on_output: Callable[[str], Any] | None = None,
        on_error: Callable[[str], Any] | None = None,
    ) -> Any:
        from pulumi.automation import CommandResult
        from pulumi.automation.errors import create_command_error

        what, verb, stack = _what(args)
        if self.stuck is not None:
            raise PulumiStuckError(f"{what} not started: {self.stuck}")
        end = args.index("--") if "--" in args else len(args)
        if "--non-interactive" not in args[:end]:
            args.insert(0, "--non-interactive")
        env = {**os.environ, **additional_env, "PULUMI_AUTOMATION_API": "true"}
        if os.path.isabs(self.command):  # the SDK's: the plugins beside the binary come first
            env["PATH"] = os.pathsep.join([os.path.dirname(self.command), env["PATH"]])
        heard = _Heard()
        out: list[str] = []
        err: list[str] = []
        process = subprocess.Popen(
            [self.command, *args],
            stdin=subprocess.DEVNULL,  # --non-interactive: it never reads; the terminal is ours
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,  # the terminal's Ctrl-C is not sent to it
        )
        assert process.stdout is not None and process.stderr is not None
        readers = [
            _reader(process.stdout, on_output, out, heard),
            _reader(process.stderr, on_error, err, heard),
        ]
        try:
            self._watch(process, heard, what)
        except _Silent:
            killed = _end(process, STOP_GRACE_S)
            _join(readers)  # what it printed before the kill: its lock line, if any
            line = (
                f"{what} printed nothing for {_duration(self.silence_s)} ({SILENCE_ENV}), so "
                "gputrain stopped it"
            )
            if killed:
                self.stuck = "an earlier pulumi of this command was stuck (said above)"
                line += "; it did not answer its own cancel and was killed"
                if verb in UPDATES and heard.locked:  # it lets go of the lock as it ends
                    line += (
                        ", so the stack may stay locked until a teardown clears it (pulumi "
                        f"cancel): the one that follows in this command, or `gputrain down "
                        f"--stack {stack}`"
                    )
            raise PulumiStuckError(line) from None
        except Exception:  # Interrupted: pulumi's own cancel, then the caller's teardown
            ui.warn(f"{what}: stopping after the operations in flight (Ctrl-C again: at once)")
            _end(process, self.silence_s)
            raise
        except BaseException:  # the user stops waiting
            _end(process, STOP_GRACE_S)
            raise
        finally:  # killed however (silent, deaf to its cancel, a further Ctrl-C): the lock it left
            _join(readers)  # first: the lines it printed before it was killed
            if verb in UPDATES and _killed(process):
                self._killed_in_update(what, UPDATES[verb], stack, heard.locked)
        result = CommandResult(
            stdout="\n".join(out), stderr="\n".join(err), code=process.returncode
        )
        if process.returncode != 0:
            raise create_command_error(result)
        return result

    def _killed_in_update(self, what: str, header: str, stack: str, locked: bool) -> None:
        """A lock the killed pulumi showed it held is ours to clear (`release`); before that,
        the lock on the stack may be another update's: said, and left to the user."""
        if locked:
            self.own_lock = True
            return
        ui.warn(
            f"{what} was killed before it showed that it held the stack's lock (its "
            f"`{header} ({stack}):` line): this command clears no lock on the stack; if one "
            f"stays, `gputrain down --stack {stack}` clears it"
        )

    def release(self) -> bool:
        """After an update of ours was killed: pulumi may start again, for the teardown to clear
        the lock it left, ours (pulumi cancel), and destroy; a further kill stops it for good.
        False when no update of ours was killed: a lock then is not ours to clear."""
        if not self.own_lock:
            return False
        self.stuck, self.own_lock = None, False
        return True

    def _watch(self, process: subprocess.Popen[str], heard: _Heard, what: str) -> None:
        """Until pulumi exits; _Silent once it printed no line for the bound, a note every
        NOTE_EVERY_S of silence before that."""
        said_for, said = heard.at, 0
        while True:
            quiet = heard.quiet_s()
            if quiet >= self.silence_s:
                raise _Silent
            if heard.at != said_for:
                said_for, said = heard.at, 0
            if int(quiet // NOTE_EVERY_S) > said:
                said = int(quiet // NOTE_EVERY_S)
                ui.say(
                    f"  {what}: nothing printed for {_duration(said * NOTE_EVERY_S)}; "
                    f"stopped after {_duration(self.silence_s)} of that ({SILENCE_ENV})"
                )
            try:
                process.wait(timeout=min(1.0, max(self.silence_s - quiet, 0.01)))
                return
            except subprocess.TimeoutExpired:
                pass
