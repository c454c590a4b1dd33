"""`--detach`: start the job like any run (upload, torchrun detached on every node), show its log
until it has trained its first step, then return and leave it running. `gputrain logs`
reattaches, `status` and `down` work from anywhere.

The first step is whichever comes first on any node: a line that shows a trained step (ours,
`step N/M |`; nanoGPT's `iter N: loss`; the Hugging Face Trainer's `{'loss': ...}`) or the first
touch of the heartbeat file the job gets in $GPUTRAIN_HEARTBEAT (`.rank<R>` too). In DDP every
rank takes a step together, so it means every node trains. A trainer that shows neither is
waited for GPUTRAIN_DETACH_WAIT_S (default 600 s), then let go with a line saying so.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Mapping

from infra.base.errors import GputrainError
from infra.base.records import Fleet
from scripts import ui
from scripts.job.follow import LineSink, say_line
from scripts.job.launch import start_job
from scripts.job.node_scripts import run_dir
from scripts.job.records import Job, validate_job
from scripts.parallel import parallel
from scripts.transport.base import Transport
from scripts.watch.telemetry import env_seconds, is_training_step

_END = "\036gputrain-exitcode "
_BEAT = "\036gputrain-heartbeat"
_MARKS = "\036gputrain-marks"
WAIT_ENV = "GPUTRAIN_DETACH_WAIT_S"
DEFAULT_WAIT_S = 600.0


def detach_wait_s(environ: Mapping[str, str] = os.environ) -> float:
    """How long `--detach` waits for a first step: GPUTRAIN_DETACH_WAIT_S, else 10 minutes."""
    value = env_seconds(WAIT_ENV, environ)
    return DEFAULT_WAIT_S if value is None else value


def _poll_command(run_id: str, seen: int) -> str:
    """The log's lines after `seen`; then, after a line of its own, a marker when the job touched
    its heartbeat and the exit code when the job has ended."""
    d = shlex.quote(run_dir(run_id))
    return (
        f"cd {d} || exit 1; tail -n +{seen + 1} torchrun.log 2>/dev/null; printf '\\n{_MARKS}\\n'; "
        f'for f in watch/heartbeat*; do [ ! -e "$f" ] || echo {_BEAT}; break; done; '
        f"if [ -s exitcode ]; then printf '{_END}%s\\n' \"$(cat exitcode)\"; fi"
    )


def read_poll(stdout: str) -> tuple[list[str], bool, str | None]:
    """(the log's new complete lines, heartbeat touched, exit code or None). Only "\\n" ends a
    line: a log line may hold any character str.splitlines() breaks at (\\x1e, \\x0c, \\u2028).
    A last line without its "\\n" yet is left for the next poll unless the job has ended."""
    log, found, marks = stdout.rpartition(f"\n{_MARKS}\n")
    if not found:
        return [], False, None  # the node did not answer this time
    beat = _BEAT in marks.split("\n")
    code = next(
        ((m[len(_END) :].split() or ["?"])[0] for m in marks.split("\n") if m.startswith(_END)),
        None,
    )
    if not log:
        return [], beat, code
    lines = log.split("\n")
    if lines[-1] == "":
        lines.pop()  # the log's own last "\n"
    elif code is None:
        lines.pop()  # a partial line: whole next time
    return lines, beat, code


def launch_detached(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    job: Job,
    *,
    on_line: LineSink = say_line,
    poll_s: float = 0.5,
    first_step_deadline_s: float | None = None,
) -> float:
    """Start the job and return (the time.time()) once its first training step is logged; a job
    that ends before that is an error naming its exit codes (its log stays on the nodes)."""
    validate_job(job)
    wait_s = detach_wait_s() if first_step_deadline_s is None else first_step_deadline_s
    job = start_job(fleet, transports, job, on_line=on_line)
    return wait_first_step(transports, job.run_id, on_line=on_line, poll_s=poll_s, wait_s=wait_s)


def wait_first_step(
    transports: Mapping[str, Transport],
    run_id: str,
    *,
    on_line: LineSink = say_line,
    poll_s: float = 0.5,
    wait_s: float = DEFAULT_WAIT_S,
) -> float:
    """Show the nodes' log lines until the first step (see the module's docstring), at most
    `wait_s`; the time.time() then. All nodes ended before it: an error naming the exit codes,
    unless every one is 0 (said in a line)."""
    names = list(transports)
    seen = dict.fromkeys(names, 0)
    ended: dict[str, str] = {}
    started = time.monotonic()
    while True:

        def poll(name: str) -> tuple[list[str], bool, str | None]:
            r = transports[name].run(_poll_command(run_id, seen[name]), 30)
            return read_poll(r.stdout)

        got, _ = parallel(names, poll)  # a node that does not answer now is asked again
        stepped = False
        for name in names:
            lines, beat, code = got.get(name, ([], False, None))
            if code is not None:
                ended[name] = code
            seen[name] += len(lines)
            for line in lines:
                on_line(name, line)
                stepped = stepped or is_training_step(line)
            stepped = stepped or beat
        if stepped:
            return time.time()
        if len(ended) == len(names):
            codes = ", ".join(f"{n}={c}" for n, c in ended.items())
            if all(c == "0" for c in ended.values()):
                ui.say(f"run {run_id} ended (exit 0 on every node) before it showed a step")
                return time.time()
            raise GputrainError(
                f"run {run_id} ended before its first training step ({codes}); nothing is "
                f"left running: `gputrain logs --run {run_id}` shows its log"
            )
        if time.monotonic() - started > wait_s:
            ui.warn(
                f"run {run_id} showed no training step in {wait_s:.0f} s (no `step N/M |`, "
                "`iter N: loss` or `{'loss': ...}` line, no touch of $GPUTRAIN_HEARTBEAT): "
                f"detaching anyway; it runs on ({WAIT_ENV} sets this wait)"
            )
            return time.time()
        time.sleep(poll_s)
