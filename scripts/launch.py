"""Start torchrun on every node, detached; stream the logs; on the first failure stop the rest.

Node layout (relative to the node root, see transport.NODE_ROOT_SH):
``.gputrain/code/`` synced code; ``.gputrain/runs/<run-id>/`` holds run.sh, pgid, torchrun.log,
exitcode ("<rc> <unix time>"), out/ (GPUTRAIN_OUT), logs/ (torchrun --log-dir) and code/ (a
hard-link snapshot of the code the run started with).
"""

from __future__ import annotations

import collections
import contextlib
import json
import queue
import re
import shlex
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from infra.base.errors import GputrainError, UserError
from infra.base.records import Fleet
from scripts import ui
from scripts.fleet import parallel
from scripts.sync import CODE_DIR, DEFAULT_MAX_UPLOAD_MIB, check_size, collect_sources, sync_code
from scripts.transport.base import ConnectionLostError, Transport, TransportError

DEFAULT_ENTRY: tuple[str, ...] = ("-m", "trainer.train", "--preset", "tiny")
RUNS_DIR = ".gputrain/runs"
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TRAINER_DIR = Path(__file__).resolve().parent.parent / "trainer"


class TrainingError(GputrainError):
    """The job failed on a node; names the node, its exit code and the root-cause lines."""

    def __init__(
        self, message: str, *, node: str, node_exit_code: int | None, result: JobResult
    ) -> None:
        super().__init__(message)
        self.node = node
        self.node_exit_code = node_exit_code  # the node's torchrun exit code (None: killed)
        self.result = result


@dataclass(frozen=True)
class Job:
    """One torchrun job. ``entry`` is what follows torchrun's options (``-m mod`` or a script)."""

    run_id: str
    entry: tuple[str, ...] = DEFAULT_ENTRY
    env: Mapping[str, str] = field(default_factory=dict)
    max_restarts: int = 0
    rdzv_port: int = 29400
    workdir: Path | None = None  # the user's code to upload (None: only the trainer package)
    include_trainer: bool = True
    nproc_per_node: int | None = None  # default: GPU count, or 1 on CPU
    max_upload_mib: float = DEFAULT_MAX_UPLOAD_MIB
    max_duration_s: float | None = None  # stop the job after this long (None: no limit)


@dataclass(frozen=True)
class JobResult:
    run_id: str
    ok: bool
    exit_codes: Mapping[str, int | None]
    duration_s: float
    results_dir: Path
    failed_node: str | None = None
    root_cause: tuple[str, ...] = ()


def validate_job(job: Job) -> None:
    """One clear line for each kind of bad job setting (UserError)."""
    if not _RUN_ID.match(job.run_id):
        raise UserError(
            f"run id: {job.run_id!r} is not allowed; use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if not job.entry:
        raise UserError("entry: empty; give a script or '-m module' (default: -m trainer.train)")
    for name in job.env:
        if not _ENV_NAME.match(name):
            raise UserError(
                f"env: variable name {name!r} is not allowed; use letters, digits and '_'"
            )
    if not 0 <= job.max_restarts <= 100:
        raise UserError(f"max restarts: {job.max_restarts} is not allowed; use 0..100")
    if not 1024 <= job.rdzv_port <= 65535:
        raise UserError(f"rendezvous port: {job.rdzv_port} is not allowed; use 1024..65535")
    if job.nproc_per_node is not None and job.nproc_per_node < 1:
        raise UserError(f"nproc per node: {job.nproc_per_node} is not allowed; use >= 1")


def run_dir(run_id: str) -> str:
    return f"{RUNS_DIR}/{run_id}"


def build_node_command(
    job: Job, *, nnodes: int, nproc_per_node: int, head_address: str, python: str
) -> str:
    """The run.sh every node runs (the same on all: c10d assigns ranks). Pure; every value is
    shell-quoted so arguments arrive verbatim. The network interface toward the head is found on
    the node (never assumed): the one holding the head's address, else ``ip route get``."""
    q = shlex.quote
    head = q(head_address)
    env_lines = "".join(f"export {k}={q(v)}\n" for k, v in job.env.items())
    torchrun = [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes),
        "--nproc-per-node", str(nproc_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{head_address}:{job.rdzv_port}",
        "--rdzv-id", job.run_id,
        "--max-restarts", str(job.max_restarts),
        "--tee", "3",
    ]  # fmt: skip
    argv = " ".join(q(a) for a in torchrun) + ' --log-dir "$RUN/logs" '
    argv += " ".join(q(a) for a in job.entry)
    return f"""#!/bin/sh
# gputrain run {job.run_id}: started detached by the controller (setsid), see torchrun.log
echo $$ > pgid
RUN=$(pwd)
PATH="$PATH:/usr/sbin:/sbin"
HEAD={head}
IFACE=$(ip -o -4 addr show 2>/dev/null | awk -v a="$HEAD" '{{split($4, p, "/"); if (p[1] == a) {{print $2; exit}}}}')
[ -n "$IFACE" ] || IFACE=$(ip -o route get "$HEAD" 2>/dev/null | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p')
if [ -n "$IFACE" ]; then export GLOO_SOCKET_IFNAME="$IFACE" NCCL_SOCKET_IFNAME="$IFACE"; fi
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1 PYTHONUNBUFFERED=1
export GPUTRAIN_OUT="$RUN/out" GPUTRAIN_RUN_ID={q(job.run_id)}
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${{rank}}]:'
{env_lines}mkdir -p "$RUN/out" "$RUN/logs"
echo "gputrain: $(hostname) starts run {job.run_id}; interface toward head $HEAD: ${{IFACE:-unknown}}"
cd "$RUN/code" || {{ echo "111 $(date +%s.%N)" > "$RUN/exitcode"; exit 111; }}
{argv} &
JOB=$!
echo $JOB > "$RUN/jobpid"
# a stop (TERM to the group) reaches torchrun too; this shell stays to record its exit code
trap : TERM INT HUP
wait $JOB; rc=$?
while kill -0 $JOB 2>/dev/null; do wait $JOB; rc=$?; done
cd "$RUN" && echo "$rc $(date +%s.%N)" > exitcode.tmp && mv exitcode.tmp exitcode
exit $rc
"""


def build_start_command(run_id: str, code_dir: str = CODE_DIR) -> str:
    """Reads run.sh on stdin, snapshots the code, starts it in a new session (so a dropped SSH
    connection cannot kill it) and prints its process-group id."""
    d = shlex.quote(run_dir(run_id))
    c = shlex.quote(code_dir)
    return (
        f"mkdir -p {d} && cat > {d}/run.sh && rm -rf {d}/code && "
        f"(cp -al {c} {d}/code 2>/dev/null || cp -a {c} {d}/code) && cd {d} || exit 1; "
        "rm -f exitcode pgid jobpid; "
        "nohup setsid sh run.sh > torchrun.log 2>&1 < /dev/null & "
        "i=0; while [ ! -s jobpid ] && [ ! -s exitcode ] && [ $i -lt 200 ]; do "
        "sleep 0.05; i=$((i+1)); done; cat pgid"
    )


def build_tail_command(run_id: str, lines_seen: int) -> str:
    """Follow torchrun.log from the line after ``lines_seen``; ends once torchrun ends (its pid,
    reaped at once by run.sh — an orphaned shell may stay a zombie until init reaps it)."""
    d = shlex.quote(run_dir(run_id))
    return (
        f"cd {d} || exit 1; P=$(cat jobpid 2>/dev/null || cat pgid); "
        f'exec tail -n +{lines_seen + 1} -s 0.2 -F --pid="$P" torchrun.log 2>/dev/null'
    )


def build_exitcode_command(run_id: str) -> str:
    """The recorded exit code, waiting briefly while run.sh writes it; nothing if the job's shell
    is gone without one (killed)."""
    d = shlex.quote(run_dir(run_id))
    return (
        f"cd {d} || exit 1; P=$(cat pgid); i=0; "
        'while [ ! -s exitcode ] && [ $i -lt 100 ]; do s=$(ps -o stat= -p "$P" 2>/dev/null); '
        'case "$s" in ""|Z*) break;; esac; sleep 0.05; i=$((i+1)); done; '
        "cat exitcode 2>/dev/null; true"
    )


def build_stop_command(run_id: str, grace_s: float = 10.0) -> str:
    """TERM the job's process group (torchrun forwards it to its workers), SIGKILL what is left
    of the whole process tree after the grace period (workers live in their own sessions)."""
    d = shlex.quote(run_dir(run_id))
    ticks = max(1, int(grace_s * 5))
    return f"""cd {d} 2>/dev/null || exit 0
[ -s pgid ] || exit 0
P=$(cat pgid)
tree() {{ ps -e -o pid= -o ppid= | awk -v r="$P" '{{par[$1] = $2}} END {{keep[r] = 1; ch = 1; while (ch) {{ch = 0; for (x in par) if (!(x in keep) && (par[x] in keep)) {{keep[x] = 1; ch = 1}}}} for (x in keep) print x}}'; }}
alive() {{ for p in $1; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }}
T0=$(tree)
alive "$T0" || {{ echo stopped-already; exit 0; }}
kill -TERM -"$P" 2>/dev/null
i=0; while alive "$T0 $(tree)" && [ $i -lt {ticks} ]; do sleep 0.2; i=$((i+1)); done
ALL="$T0 $(tree)"
if alive "$ALL"; then
  for p in $ALL; do kill -KILL -"$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  echo killed
else
  echo terminated
fi
"""


def parse_exitcode(text: str) -> tuple[int | None, float | None]:
    """``"<rc> <unix time>"`` -> (rc, time); (None, None) when there is none."""
    parts = text.split()
    try:
        rc = int(parts[0])
    except (IndexError, ValueError):
        return None, None
    try:
        return rc, float(parts[1])
    except (IndexError, ValueError):
        return rc, None


def root_cause_lines(error_files: list[str], log_tail: list[str], max_lines: int = 12) -> list[str]:
    """The first failure's message and traceback tail from torchrun error.json files, else the
    last lines of the node's log."""
    causes: list[tuple[str, list[str]]] = []
    for text in error_files:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            continue
        msg = data.get("message", data)
        if isinstance(msg, dict):
            message = str(msg.get("message", ""))
            extra = msg.get("extraInfo") or {}
            stack = str(extra.get("py_callstack", ""))
            ts = str(extra.get("timestamp", ""))
        else:
            message, stack, ts = str(msg), "", ""
        tb = [ln for ln in stack.splitlines() if ln.strip()][-(max_lines - 1) :]
        causes.append((ts, [message, *tb] if message not in stack else tb))
    if causes:
        causes.sort(key=lambda c: c[0] or "~")
        return causes[0][1][-max_lines:]
    lines = [ln for ln in log_tail if ln.strip()]
    # Without error.json, torchrun's own ChildFailedError report ends the log and says nothing
    # of the cause: keep what the workers printed before it (their traceback).
    agent = next((i for i, ln in enumerate(lines) if "ChildFailedError" in ln), None)
    if agent is not None:
        starts = [i for i in range(agent) if _is_agent_traceback(lines[i])]
        worker = lines[: starts[-1]] if starts else []
        lines = worker or lines
    return lines[-max_lines:]


def _is_agent_traceback(line: str) -> bool:
    """torchrun's own traceback starts unprefixed; workers' lines carry a [rankN]: prefix."""
    return line.startswith("Traceback (most recent call last)")


ERROR_FILES_CMD = (
    "for f in $(find logs -name error.json 2>/dev/null); do cat \"$f\"; printf '\\n\\036\\n'; done"
)


def _nproc(fleet: Fleet, job: Job) -> int:
    if job.nproc_per_node is not None:
        return job.nproc_per_node
    return 1 if fleet.expect.is_cpu else fleet.expect.count


LineSink = Callable[[str, str], None]


def _say_line(node: str, line: str) -> None:
    ui.say(f"[{node}] {line}")


def upload_code(fleet: Fleet, transports: Mapping[str, Transport], job: Job) -> None:
    """Collect the code once, check its size, sync it to every node in parallel."""
    workdir = job.workdir
    packages = {"trainer": TRAINER_DIR} if job.include_trainer else {}
    if workdir is None:
        files = {}
        for name, pkg in packages.items():
            files.update({f"{name}/{k}": v for k, v in collect_sources(pkg).items()})
        base = TRAINER_DIR
    else:
        files = collect_sources(workdir, packages)
        base = workdir
    total = check_size(files, job.max_upload_mib, base)
    start = time.monotonic()

    def one(name: str) -> str:
        with tempfile.TemporaryDirectory(prefix="gputrain-upload-") as tmp:
            plan = sync_code(transports[name], files, staging=Path(tmp))
        return f"{len(plan.send)} changed, {len(plan.delete)} removed"

    names = [n.name for n in fleet.nodes]
    results, errors = parallel(names, one)
    if errors:
        raise TransportError(
            "upload failed:\n" + "\n".join(f"  {n}: {e}" for n, e in errors.items())
        )
    summary = ", ".join(f"{n}: {results[n]}" for n in names)
    ui.say(
        f"uploaded {len(files)} file(s), {total / 1048576:.1f} MiB, to {len(names)} node(s) in "
        f"{time.monotonic() - start:.1f} s ({summary})"
    )


@dataclass
class _NodeState:
    name: str
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=40))
    lines: int = 0
    reconnecting: bool = False
    done: bool = False
    exit_code: int | None = None
    ended_at: float | None = None  # wall clock, node side when known
    lost: str | None = None  # why the node could not be followed
    error_files: list[str] = field(default_factory=list)  # torchrun error.json texts


def launch_torchrun(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    job: Job,
    results_dir: Path,
    *,
    on_line: LineSink = _say_line,
    reconnect_deadline_s: float = 120.0,
    stop_grace_s: float = 10.0,
    settle_s: float = 2.0,
) -> JobResult:
    """Upload, start detached on every node, stream prefixed logs until all end; on the first
    failure stop the others and raise TrainingError (results are still downloaded)."""
    validate_job(job)
    start = time.monotonic()
    upload_code(fleet, transports, job)
    names = [n.name for n in fleet.nodes]
    script = build_node_command(
        job,
        nnodes=len(names),
        nproc_per_node=_nproc(fleet, job),
        head_address=fleet.head.internal_address,
        python=fleet.python,
    )

    def start_one(name: str) -> str:
        r = transports[name].run(build_start_command(job.run_id), 60, stdin=script.encode())
        if not r.ok or not r.stdout.strip().isdigit():
            raise TransportError(f"node {name}: could not start: {r.stderr.strip() or r.stdout}")
        return r.stdout.strip()

    pgids, errors = parallel(names, start_one)
    if errors:
        stop_job(fleet, transports, job.run_id, grace_s=stop_grace_s)
        raise TransportError("\n".join(str(e) for e in errors.values()))
    ui.say(
        f"run {job.run_id} started on {len(names)} node(s) "
        f"({', '.join(f'{n}: pgid {pgids[n]}' for n in names)})"
    )

    states = {n: _NodeState(n) for n in names}
    events: queue.Queue[str] = queue.Queue()
    for n in names:
        threading.Thread(
            target=_follow,
            args=(transports[n], job.run_id, states[n], on_line, events, reconnect_deadline_s),
            daemon=True,
            name=f"follow-{n}",
        ).start()

    failed: str | None = None
    stop_started: float | None = None

    def stop_running() -> None:
        _stop_async(
            fleet, transports, job.run_id, [n for n in names if not states[n].done], stop_grace_s
        )

    while not all(s.done for s in states.values()):
        with contextlib.suppress(queue.Empty):
            events.get(timeout=0.5)
        now = time.monotonic()
        if (
            failed is None
            and stop_started is None
            and job.max_duration_s is not None
            and now - start > job.max_duration_s
        ):
            ui.say(f"run {job.run_id}: max duration {job.max_duration_s:.0f} s reached; stopping")
            stop_started = now
            stop_running()
        if failed is None and any(_failed(s) for s in states.values()):
            # let near-simultaneous failures arrive (and reconnects resolve) before naming one
            settle_end = time.monotonic() + settle_s
            while time.monotonic() < settle_end or any(s.reconnecting for s in states.values()):
                time.sleep(0.1)
                if time.monotonic() > settle_end + reconnect_deadline_s:
                    break
            for st in states.values():
                if _failed(st):
                    st.error_files = _error_files(transports[st.name], job.run_id, st.name)
            failed = _first_failure(states)
            s = states[failed]
            ui.say(f"node {failed} failed (exit code {_code_text(s)}); stopping the other node(s)")
            stop_started = time.monotonic()
            stop_running()
        if stop_started is not None and time.monotonic() - stop_started > 30:
            for s in states.values():
                if not s.done:
                    s.lost = s.lost or "did not stop within 30 s"
                    s.done = True
            break

    duration = time.monotonic() - start
    exit_codes = {n: states[n].exit_code for n in names}
    root: list[str] = []
    if failed is not None:
        st = states[failed]
        root = root_cause_lines(st.error_files, list(st.tail)) or [st.lost or "(no output)"]
    _download_all(fleet, transports, job.run_id, results_dir)
    ok = failed is None and all(c == 0 for c in exit_codes.values())
    result = JobResult(job.run_id, ok, exit_codes, duration, results_dir, failed, tuple(root))
    _write_summary(result)
    if failed is not None:
        s = states[failed]
        raise TrainingError(
            f"run {job.run_id} failed on node {failed} (exit code {_code_text(s)}); "
            f"other nodes stopped. Root cause:\n"
            + "\n".join(f"  {ln}" for ln in root)
            + f"\nlogs and results: {results_dir}",
            node=failed,
            node_exit_code=s.exit_code,
            result=result,
        )
    if not ok:
        bad = ", ".join(f"{n}={c}" for n, c in exit_codes.items() if c != 0)
        raise TrainingError(
            f"run {job.run_id} did not complete ({bad}); results: {results_dir}",
            node=next(n for n, c in exit_codes.items() if c != 0),
            node_exit_code=None,
            result=result,
        )
    ui.say(
        f"run {job.run_id} completed on {len(names)} node(s) in {duration:.1f} s; "
        f"results in {results_dir}"
    )
    return result


def _failed(s: _NodeState) -> bool:
    return s.done and (s.exit_code != 0 or s.lost is not None)


CONSEQUENCE_HINTS = (
    "connection closed by peer",
    "connection reset",
    "broken pipe",
    "distnetworkerror",
    "diststoreerror",
    "timed out",
    "timeout",
    "signalexception",
    "sigterm",
    "gloo",
    "nccl communicator was aborted",
)


def error_summary(error_files: list[str]) -> tuple[float, bool]:
    """(earliest error.json timestamp or inf, whether every error looks like a consequence of
    another node's failure — a peer that went away, a timeout, a stop signal)."""
    earliest, consequences, total = float("inf"), 0, 0
    for text in error_files:
        try:
            msg = json.loads(text).get("message", {})
        except (json.JSONDecodeError, AttributeError):
            continue
        total += 1
        body = str(msg.get("message", "") if isinstance(msg, dict) else msg).lower()
        consequences += any(h in body for h in CONSEQUENCE_HINTS)
        if isinstance(msg, dict):
            with contextlib.suppress(TypeError, ValueError):
                earliest = min(earliest, float(str((msg.get("extraInfo") or {}).get("timestamp"))))
    return earliest, total > 0 and consequences == total


@dataclass(frozen=True)
class FailureFacts:
    node: str
    exit_code: int | None  # None: killed before it could record one
    error_files: tuple[str, ...]
    ended_at: float


def first_failure(facts: list[FailureFacts]) -> str:
    """Which node failed first. Pure. A node killed without an exit code comes first; then one
    whose error is its own (not a lost peer / timeout / stop); then by error.json time (1 s
    resolution), then by when it ended."""

    def key(f: FailureFacts) -> tuple[bool, bool, float, float]:
        ts, consequence = error_summary(list(f.error_files))
        return (f.exit_code is not None, consequence, ts, f.ended_at)

    return min(facts, key=key).node


def _first_failure(states: Mapping[str, _NodeState]) -> str:
    return first_failure(
        [
            FailureFacts(
                s.name,
                None if s.lost is None and s.exit_code is None else (s.exit_code or -1),
                tuple(s.error_files),
                s.ended_at if s.ended_at is not None else float("inf"),
            )
            for s in states.values()
            if _failed(s)
        ]
    )


def _code_text(s: _NodeState) -> str:
    if s.lost:
        return f"unknown: {s.lost}"
    return "none: its processes were killed" if s.exit_code is None else str(s.exit_code)


def _follow(
    transport: Transport,
    run_id: str,
    state: _NodeState,
    on_line: LineSink,
    events: queue.Queue[str],
    reconnect_deadline_s: float,
) -> None:
    """Stream one node's log to the end, reattaching after dropped connections, then read its
    exit code. Always ends with state.done and an event."""

    def line(text: str) -> None:
        state.lines += 1
        state.tail.append(text)
        on_line(state.name, text)

    try:
        while True:
            try:
                transport.stream(build_tail_command(run_id, state.lines), line, timeout=None)
                break
            except ConnectionLostError as e:
                state.reconnecting = True
                ui.say(
                    f"{state.name}: {e}; reconnecting to resume the log at line {state.lines + 1}"
                )
                transport.reconnect(reconnect_deadline_s)
                state.reconnecting = False
                ui.say(f"{state.name}: reconnected")
        r = transport.run(build_exitcode_command(run_id), 30)
        state.exit_code, node_time = parse_exitcode(r.stdout)
        state.ended_at = node_time if node_time is not None else time.time()
    except Exception as e:
        state.lost = str(e)
        state.ended_at = time.time()
    finally:
        state.reconnecting = False
        state.done = True
        events.put(state.name)


def _stop_async(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    run_id: str,
    names: list[str],
    grace_s: float,
) -> None:
    def go() -> None:
        try:
            stop_job(fleet, transports, run_id, grace_s=grace_s, only=names)
        except Exception as e:
            ui.warn(f"stopping run {run_id}: {e}")

    threading.Thread(target=go, daemon=True, name="stop").start()


def stop_job(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    run_id: str,
    *,
    grace_s: float = 10.0,
    only: list[str] | None = None,
) -> dict[str, str]:
    """Stop the run on every node (or `only` these): TERM, then SIGKILL after grace_s."""
    names = only if only is not None else [n.name for n in fleet.nodes]
    cmd = build_stop_command(run_id, grace_s)

    def one(name: str) -> str:
        r = transports[name].run(cmd, timeout=grace_s + 15)
        return r.stdout.strip() or f"exit {r.exit_code}"

    results, errors = parallel(names, one)
    out = {**results, **{n: f"error: {e}" for n, e in errors.items()}}
    ui.say(f"stop {run_id}: " + ", ".join(f"{n} {out[n]}" for n in names))
    return out


def _error_files(transport: Transport, run_id: str, name: str) -> list[str]:
    try:
        r = transport.run(f"cd {shlex.quote(run_dir(run_id))} && {ERROR_FILES_CMD}", 30)
        return [chunk.strip() for chunk in r.stdout.split("\n\036\n") if chunk.strip()]
    except Exception as e:
        ui.warn(f"{name}: could not read torchrun error files: {e}")
        return []


def _download_all(
    fleet: Fleet, transports: Mapping[str, Transport], run_id: str, results_dir: Path
) -> None:
    d = run_dir(run_id)

    def one(name: str) -> None:
        """One tar per node (out/, torchrun.log, logs/), laid out as results_dir/<node>/:
        the out dir's files, torchrun.log and torchrun-logs/."""
        dest = results_dir / name
        with tempfile.TemporaryDirectory(dir=results_dir, prefix=f".{name}-") as tmp:
            if not transports[name].download(d, Path(tmp), exclude=("./code", "./run.sh")):
                return
            got = Path(tmp)
            dest.mkdir(parents=True, exist_ok=True)
            if (got / "out").is_dir():
                for p in (got / "out").iterdir():
                    p.rename(dest / p.name)
            for src, to in (
                ("torchrun.log", "torchrun.log"),
                ("logs", "torchrun-logs"),
                ("exitcode", "exitcode"),
            ):
                if (got / src).exists():
                    (got / src).rename(dest / to)

    results_dir.mkdir(parents=True, exist_ok=True)
    _, errors = parallel([n.name for n in fleet.nodes], one)
    for name, e in errors.items():
        ui.warn(f"{name}: could not download results: {e}")


def _write_summary(result: JobResult) -> None:
    data = {
        "run_id": result.run_id,
        "ok": result.ok,
        "exit_codes": dict(result.exit_codes),
        "duration_s": round(result.duration_s, 2),
        "failed_node": result.failed_node,
        "root_cause": list(result.root_cause),
    }
    (result.results_dir / "job.json").write_text(json.dumps(data, indent=2) + "\n")
