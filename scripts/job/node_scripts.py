"""The shell that runs on the nodes: the run script every node starts (detached, its own session),
and the commands that start, follow, read the exit code of and stop it. Pure: strings only.
Where things are on the node: scripts/node_layout.py.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gputrain_node import contract
from gputrain_node.contract import OUT_ENV, RUN_ID_ENV
from scripts import ui
from scripts.job.container import container_name
from scripts.job.data_io import (
    MIRROR_STOP_LINES,
    attempt_entry,
    build_collect_workdir_command,
    data_env_lines,
    mirror_start_lines,
)
from scripts.job.environment import READ_SECRETS_SH, REDACT_OUTPUT_SH
from scripts.job.leftovers import OURS_SH, kill_tagged_sh
from scripts.job.records import Job
from scripts.job.sync import RUN_SCRIPT, unpack_command
from scripts.node_layout import CODE_DIR, NCCL_ENV_FILE, NODE_ROOT_SH, RUNS_DIR, run_dir
from scripts.transport.base import TransportError
from scripts.transport.tar import Codec
from scripts.watch import node as watch

RUN_SUBDIRS = ("out", "logs", "watch")  # the start makes them with the code dir (one mkdir)
MAKE_RUN_SUBDIRS_SH = (  # in run.sh: a process only where the start did not make them
    " && ".join(f'[ -d "$RUN/{x}" ]' for x in RUN_SUBDIRS)
    + " || mkdir -p "
    + " ".join(f'"$RUN/{x}"' for x in RUN_SUBDIRS)
)


def build_node_command(
    job: Job,
    *,
    nnodes: int,
    nproc_per_node: int,
    head_address: str,
    python: str,
    container: str = "",
    host_python: str | None = None,
) -> str:
    """The run.sh every node runs (the same on all: c10d assigns ranks). Pure; every value is
    shell-quoted so arguments arrive verbatim. The network interface toward the head is found on
    the node (never assumed): the one holding the head's address, else ``ip route get``.
    `container`: the `docker run ... IMAGE` torchrun runs in (container.build_docker_run); then
    `python` is the image's and `host_python` the node's own, for the helpers run.sh starts."""
    if job.rdzv_port is None:
        raise ValueError(
            "build_node_command needs the run's rendezvous port (prepare_nodes picks it)"
        )
    q = shlex.quote
    helper = host_python or python
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
        # with secrets no per-rank log files (they would hold what a rank prints, unfiltered)
        "--tee", "0" if job.secrets else "3",
    ]  # fmt: skip
    argv = " ".join(q(a) for a in torchrun) + ' --log-dir "$RUN/logs" '
    argv += " ".join(entry_argument(a) for a in attempt_entry(job))
    # the health check (a node module) runs from gputrain's own copy, never the user's code
    workdir = f"$RUN/code/{contract.LIB_DIR}" if contract.is_node_entry(job.entry) else "$RUN/code"
    if container:  # the stop command removes it by name (a KILLed docker CLI leaves it running)
        argv = f'echo {q(container_name(job.run_id))} > "$RUN/container"\n{container} {argv}'
    return f"""#!/bin/sh
# gputrain run {job.run_id}: started detached by the controller (setsid), see torchrun.log
echo $$ > pgid
{JOB_TAG_SH}
RUN=$PWD
{forget_run_script_line(job.code_dir)}
{REDACT_OUTPUT_SH if job.secrets else ""}PATH="$PATH:/usr/sbin:/sbin"
HEAD={head}
# the route toward the head names the interface; on the head itself it is "local" (via lo):
# there the interface holding its address
IFACE= IS_HEAD=
ROUTE=$(ip -o route get "$HEAD" 2>/dev/null)
case "$ROUTE" in
  local*) IS_HEAD=1; IFACE=$(ip -o -4 addr show 2>/dev/null | awk -v a="$HEAD" '{{split($4, p, "/"); if (p[1] == a) {{print $2; exit}}}}') ;;
  *) set -- $ROUTE; while [ $# -gt 1 ]; do if [ "$1" = dev ]; then IFACE=$2; break; fi; shift; done ;;
esac
if [ -n "$IFACE" ]; then export GLOO_SOCKET_IFNAME="$IFACE" NCCL_SOCKET_IFNAME="$IFACE"; fi
# the GPU network's NCCL plugin and NICs (written by the fabric setup) replace the one interface
NCCL_ENV_FILE="${{GPUTRAIN_NODE_ROOT:-$HOME}}/{NCCL_ENV_FILE}"
if [ -f "$NCCL_ENV_FILE" ]; then . "$NCCL_ENV_FILE"; else NCCL_ENV_FILE=/dev/null; fi
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1 PYTHONUNBUFFERED=1
export {OUT_ENV}="$RUN/out" {RUN_ID_ENV}={q(job.run_id)}
export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${{rank}}]:'
{MAKE_RUN_SUBDIRS_SH}
{RESERVE_EXITCODE_SH}
{watch.run_env_lines()}{data_env_lines(job.datasets)}{env_lines}{mirror_start_lines(job, helper)}HOST=; read -r HOST 2>/dev/null < /proc/sys/kernel/hostname || HOST=$(hostname)
echo "gputrain: $HOST starts run {job.run_id}; interface toward head $HEAD: ${{IFACE:-unknown}}"
cd "{workdir}" || {{ echo "111 $(date +%s.%N)" > "$RUN/exitcode"; exit 111; }}
{argv} &
JOB=$!
echo $JOB > "$RUN/jobpid"
{watch.sampler_line(helper, job.watch.sample_interval_s if job.watch else 5.0)}
{worker_watchdog(helper, job.rdzv_port, nnodes)}# a stop (TERM to the group) reaches torchrun too; this shell stays to record its exit code
trap : TERM INT HUP
wait $JOB; rc=$?
while kill -0 $JOB 2>/dev/null; do wait $JOB; rc=$?; done
# one short write: readers wait for a non-empty file ([ -s ]), so no temporary file is needed
{MIRROR_STOP_LINES}{KILL_LEFTOVERS_SH}
cd "$RUN" && T=$(date +%s.%N) && {{ echo "$rc $T" > exitcode || {WRITE_RESERVED_EXITCODE_SH}; }}
exit $rc
"""


#: run.sh's tag for every process of the job, also kept in `jobtag` for `stop`: unique to this
#: start on this node (run.sh's pid and the time), so nodes that share a machine or a PID
#: namespace (the test bed) never end each other's job, as a run id or a path could
JOB_TAG_SH = 'export GPUTRAIN_JOB_TAG="$$-$(date +%s%N)"; echo "$GPUTRAIN_JOB_TAG" > jobtag'
#: run.sh's line after torchrun ended: what the job left running (a double-forked daemon keeps
#: the tag in its environment) does not outlive the run
KILL_LEFTOVERS_SH = kill_tagged_sh("GPUTRAIN_JOB_TAG", "$GPUTRAIN_JOB_TAG")
#: `stop`'s line in the run dir: the same, for the tag run.sh wrote
STOP_LEFTOVERS_SH = (
    'JT=; [ ! -s jobtag ] || read -r JT < jobtag; [ -z "$JT" ] || { '
    + kill_tagged_sh("GPUTRAIN_JOB_TAG", "$JT")
    + "; }"
)

DISK_FULL = "disk-full"  # the exit code's third word when only the reserved block held it
# A full disk must not cost the job's exit code: run.sh holds a block for it from the start, and
# overwrites it in place (no new block) when the plain write fails, then renames it over.
RESERVE_EXITCODE_SH = "printf '%64s\\n' '' > \"$RUN/exitcode.reserve\""
WRITE_RESERVED_EXITCODE_SH = (
    f'{{ printf \'%s %s {DISK_FULL}\\n\' "$rc" "$T" 1<> exitcode.reserve && '
    "mv -f exitcode.reserve exitcode; }"
)


def forget_run_script_line(code_dir: str = CODE_DIR) -> str:
    """run.sh's line that removes it (it holds the --env values; the shell reads it from its open
    descriptor): both its links, in the code dir and in the run's snapshot the start ran it from."""
    return f'rm -f "$RUN/code/{RUN_SCRIPT}" {NODE_ROOT_SH}/{shlex.quote(code_dir)}/{RUN_SCRIPT}'


WATCH_INTERVAL_S = 5  # how often a worker asks whether the head's rendezvous still answers
# (every second until it first has: a link lost early must not leave the watchdog unarmed)
WATCH_REFUSALS = 3  # refusals in a row, after it once answered, that end the worker's job
WATCH_GRACE_S = 10  # TERM, then SIGKILL of what is left after this long
# the standard library only, so -I -S: no site-packages to scan on each look (a venv's .pth
# files cost a look ~3x its socket work)
_PROBE = (
    "import socket, sys\n"
    "try: socket.create_connection((sys.argv[1], int(sys.argv[2])), 3).close()\n"
    "except ConnectionRefusedError: sys.exit(3)\n"
    "except OSError: sys.exit(4)"
)


def worker_watchdog(
    python: str, port: int, nnodes: int, interval_s: float = WATCH_INTERVAL_S
) -> str:
    """On a worker: once the head's rendezvous store has answered, WATCH_REFUSALS refusals in a
    row mean the head's job is gone (stopped, failed) while this node kept running — e.g. its link
    came back after the controller gave up on it. Then the job is TERMed and SIGKILLed after
    WATCH_GRACE_S, instead of hanging in a collective until the process-group timeout. A link that
    is down (timeouts, no route) never counts: that is a partition, not an end."""
    if nnodes < 2:
        return ""
    q = shlex.quote
    return f"""if [ -z "$IS_HEAD" ]; then (
  seen=0; gone=0
  while kill -0 $JOB 2>/dev/null; do
    if [ $seen = 1 ]; then sleep {interval_s:g}; else sleep 1; fi
    kill -0 $JOB 2>/dev/null || break
    {q(python)} -I -S -c {q(_PROBE)} "$HEAD" {port} 2>/dev/null; r=$?
    case $r in 0) seen=1; gone=0;; 3) [ $seen = 1 ] && gone=$((gone+1));; *) gone=0;; esac
    if [ $gone -ge {WATCH_REFUSALS} ]; then
      echo "gputrain: the head's rendezvous $HEAD:{port} is gone; stopping this node's job"
      T=$(ps -e -o pid= -o ppid= | awk -v r=$JOB '{{par[$1] = $2}} END {{keep[r] = 1; ch = 1; while (ch) {{ch = 0; for (x in par) if (!(x in keep) && (par[x] in keep)) {{keep[x] = 1; ch = 1}}}} for (x in keep) print x}}')
      kill -TERM $T 2>/dev/null; i=0
      while kill -0 $JOB 2>/dev/null && [ $i -lt {WATCH_GRACE_S * 5} ]; do sleep 0.2; i=$((i+1)); done
      kill -KILL $T 2>/dev/null; break
    fi
  done ) & fi
"""


OUT_PLACEHOLDER = "{out}"


def entry_argument(arg: str) -> str:
    """One ENTRY argument for the shell, verbatim except that `{out}` becomes the run's out dir on
    the node (`$GPUTRAIN_OUT`, which comes home); `{{out}}` is the literal text `{out}`."""
    if OUT_PLACEHOLDER not in arg:
        return shlex.quote(arg)
    literal = "\0"
    pieces = arg.replace("{{out}}", literal).split(OUT_PLACEHOLDER)
    return '"$GPUTRAIN_OUT"'.join(shlex.quote(p.replace(literal, OUT_PLACEHOLDER)) for p in pieces)


#: in the run dir, after the new code snapshot: workdir/'s files (an earlier attempt's, or the
#: bucket's after a re-created node) linked into code/ where it has none of that name
RESTORE_WORKDIR_SH = (
    "[ ! -d workdir ] || (cd workdir && find . -type f -exec sh -c '"
    'for f; do t="../code/${f#./}"; [ -e "$t" ] || { mkdir -p "$(dirname "$t")" && '
    '{ ln "$f" "$t" 2>/dev/null || cp -p "$f" "$t"; }; }; done'
    "' sh {} +) || exit 1; "
)

UNPACK_FAILED = 112  # the exit status of build_upload_and_start_command when the code did not land


def build_upload_and_start_command(
    run_id: str,
    code_dir: str = CODE_DIR,
    *,
    node: str = "",
    secrets: bool = False,
    codec: Codec = "gzip",
) -> str:
    """One round trip: (with `secrets`, first the secrets: secrets.secret_stdin, kept in this
    shell's memory and exported) unpack the CodeBundle payload on stdin into code_dir (the changed
    files, the manifest, the delete list and run.sh), then snapshot the code, write the node's
    name (`node`, for run.sh), start run.sh in a new session (so a dropped SSH connection cannot
    kill it) from the snapshot and print its process-group id. Exits UNPACK_FAILED when the code
    could not be unpacked (nothing was started)."""
    d = shlex.quote(run_dir(run_id))
    c = shlex.quote(code_dir)
    run_subdirs = tuple(f"{run_dir(run_id)}/{x}" for x in RUN_SUBDIRS)  # run.sh finds them made
    return (  # umask 077: everything it and the job write is the user's alone
        (READ_SECRETS_SH.format(failed=UNPACK_FAILED) if secrets else "")
        + f"{unpack_command(code_dir, also_make=run_subdirs, codec=codec)} && "
        f"[ -f {c}/{RUN_SCRIPT} ] || exit {UNPACK_FAILED}; "
        # what an earlier attempt wrote beside the code is kept in workdir/ and put back into
        # the new snapshot, where the code uploaded now has no file of that name
        f"{{ [ ! -e {d}/code ] || {{ ({build_collect_workdir_command(run_id)}) && "
        f"rm -rf {d}/code; }}; }} && "
        # hard links where the runs dir shares the code's file system, else a copy (a failed
        # `cp -al` leaves a partial code/ that `cp -a` would copy into, as code/code)
        f"{{ cp -al {c} {d}/code 2>/dev/null || {{ rm -rf {d}/code; cp -a {c} {d}/code; }}; }} "
        f"&& cd {d} || exit 1; "
        f"{RESTORE_WORKDIR_SH}"
        + (f"printf '%s\\n' {shlex.quote(node)} > node; " if node else "")
        + "for f in exitcode pgid jobpid; do [ ! -e $f ] || rm -f $f; done; "
        f"(trap '' HUP; exec setsid sh code/{RUN_SCRIPT}) > torchrun.log 2>&1 < /dev/null & "
        "i=0; while [ ! -s jobpid ] && [ ! -s exitcode ] && [ $i -lt 200 ]; do "
        "sleep 0.05; i=$((i+1)); done; read -r p < pgid; echo $p"
    )


def build_tail_command(run_id: str, lines_seen: int) -> str:
    """Follow torchrun.log from the line after ``lines_seen``; ends once torchrun ends (its pid,
    reaped at once by run.sh — an orphaned shell may stay a zombie until init reaps it), at once
    when it is no longer the run's (OURS_SH): what the log holds, then the end."""
    d = shlex.quote(run_dir(run_id))
    lines = f"-n +{lines_seen + 1}"
    return (
        f"cd {d} || exit 1; {OURS_SH}; read -r P 2>/dev/null < jobpid || read -r P < pgid; "
        f'if ours "$P"; then tail {lines} -s 0.2 -F --pid="$P" torchrun.log 2>/dev/null; '
        f"else tail {lines} torchrun.log 2>/dev/null; fi"
    )


EXIT_CODE_LINE = "\036gputrain-exitcode"
"""Starts the last line of build_follow_command: the recorded exit code follows it."""
EXIT_CODE_PENDING = "pending"
"""What follows EXIT_CODE_LINE while torchrun has ended but run.sh, still alive, has not yet
recorded its code (the outputs' last pass to the bucket runs first): follow again."""


def build_follow_command(run_id: str, lines_seen: int, wait_s: float = 5.0) -> str:
    """build_tail_command, then on the same channel one EXIT_CODE_LINE line with the recorded
    exit code ("<rc> <unix time>"), waiting up to `wait_s` while run.sh writes it: empty if the
    job's shell is gone without one (killed), EXIT_CODE_PENDING if it is still at work. After a
    last log line without a newline, that line holds it too: split_follow_line parts them."""
    return (
        f"{build_tail_command(run_id, lines_seen)}; "
        # run.sh's state from /proc (builtins only: no process per look while 64 nodes wait)
        # (one look first: a number no longer the run's is no shell at all)
        'read -r G < pgid; ours "$G" || G=gone; '
        f"i=0; s=; while [ ! -s exitcode ] && [ $i -lt {max(1, int(wait_s * 20))} ]; do "
        's=; read -r s 2>/dev/null < "/proc/$G/stat"; s=${s##*) }; s=${s%% *}; '
        'case "$s" in ""|Z*) s=; break;; esac; sleep 0.05; i=$((i+1)); done; '
        'if [ -s exitcode ]; then read -r c < exitcode; elif [ -n "$s" ]; '
        f"then c={EXIT_CODE_PENDING}; else c=; fi; "
        "printf '\\036gputrain-exitcode %s\\n' \"$c\""
    )


def split_follow_line(text: str) -> tuple[str | None, str | None]:
    """A line of build_follow_command's output as (log line, recorded exit code text): the
    exit code's line may follow a last log line that had no newline."""
    log, marker, code = text.partition(EXIT_CODE_LINE)
    if not marker:
        return text, None
    return (log or None), code


def build_running_command() -> str:
    """The ids of this node's gputrain runs whose torchrun is still alive (OURS_SH), one per line."""
    return (
        f"cd {RUNS_DIR} 2>/dev/null || exit 0; for d in */; do d=${{d%/}}; "
        '[ -s "$d/jobpid" ] && [ ! -s "$d/exitcode" ] && (cd "$d" && '
        f'{OURS_SH}; read -r P < jobpid; ours "$P") && echo "$d"; done; true'
    )


def build_stop_command(run_id: str, grace_s: float = 10.0) -> str:
    """TERM the job's process group (torchrun forwards it to its workers), SIGKILL what is left
    of the whole process tree after the grace period (workers live in their own sessions), then
    anything else of the run's (a daemon it double-forked: kill_tagged_sh). A job shell that is
    gone is never looked for by its number, which another process may hold now (OURS_SH)."""
    d = shlex.quote(run_dir(run_id))
    ticks = max(1, int(grace_s * 5))
    return f"""cd {d} 2>/dev/null || {{ echo not-started; exit 0; }}
[ -s pgid ] || {{ echo not-started; exit 0; }}
{OURS_SH}
P=$(cat pgid)
tree() {{ ps -e -o pid= -o ppid= | awk -v r="$P" '{{par[$1] = $2}} END {{keep[r] = 1; ch = 1; while (ch) {{ch = 0; for (x in par) if (!(x in keep) && (par[x] in keep)) {{keep[x] = 1; ch = 1}}}} for (x in keep) print x}}'; }}
alive() {{ for p in $1; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }}
# a container outlives a killed docker CLI: removed by name once its CLI is gone (or killed)
rmc() {{ if [ -s container ]; then docker rm -f "$(cat container)" >/dev/null 2>&1; fi; }}
ours "$P" || {{ rmc; {STOP_LEFTOVERS_SH}; echo stopped-already; exit 0; }}
T0=$(tree)
kill -TERM -"$P" 2>/dev/null
i=0; while alive "$T0 $(tree)" && [ $i -lt {ticks} ]; do sleep 0.2; i=$((i+1)); done
ALL="$T0 $(tree)"
if alive "$ALL"; then
  for p in $ALL; do kill -KILL -"$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  rmc; echo killed
else
  rmc; echo terminated
fi
{STOP_LEFTOVERS_SH}
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


#: (module the node's python must import, the pip requirement that provides it)
Requirement = tuple[str, str]
STORAGE_PACKAGES: tuple[Requirement, ...] = (
    ("google.cloud.storage", "google-cloud-storage>=2.14,<4"),  # the trainer's gs:// checkpoints
)
TRAINER_PACKAGES: tuple[Requirement, ...] = (("torch", "torch"), ("numpy", "numpy"))


#: `python -c FIND_MISSING MOD=REQ ...` prints the REQs whose MOD the interpreter cannot find: one
#: process, nothing imported (torch's import alone takes seconds on a GPU VM, on every launch)
FIND_MISSING = (
    "import importlib.util as u, sys\n"
    "def found(m):\n"
    "    try:\n"
    "        return u.find_spec(m) is not None\n"
    "    except (ImportError, ValueError):\n"
    "        return False\n"
    "print(' '.join(p.split('=', 1)[1] for p in sys.argv[1:] if not found(p.split('=', 1)[0])))"
)


def build_install_command(python: str, needs: Sequence[Requirement]) -> str:
    """Prints `present` when `python` finds every module of `needs`; else pip-installs the
    missing requirements (into the interpreter's environment, else --user; pip itself from apt
    where the image lacks it, as Ubuntu's do), prints `installed <reqs>` once they import, or
    fails with the last lines of the attempt."""
    py = shlex.quote(python)
    pairs = " ".join(shlex.quote(f"{mod}={req}") for mod, req in needs)
    every = shlex.quote(" ".join(req for _, req in needs))
    imports = "; ".join(f"import {mod}" for mod, _ in needs)
    pip = f"{py} -m pip install --quiet --disable-pip-version-check"
    return (
        f"missing=$({py} -c {shlex.quote(FIND_MISSING)} {pairs} 2>/dev/null) || missing={every}; "
        'if [ -z "$missing" ]; then echo present; exit 0; fi; '
        f"if ! {py} -m pip --version >/dev/null 2>&1; then "
        "apt=$( (sudo -n apt-get update -qq && sudo -n env DEBIAN_FRONTEND=noninteractive "
        "apt-get install -y -qq python3-pip) 2>&1); fi; "
        f"out=$({pip} $missing 2>&1 || {pip} --user $missing 2>&1); "
        f"if {py} -c {shlex.quote(imports)} >/dev/null 2>&1; then echo installed $missing; exit 0; fi; "
        'printf "%s\n" "$out" | tail -n 5; exit 1'
    )


def build_sections_command(sections: Mapping[str, str]) -> str:
    """Several commands in one round trip: each runs in its own subshell (its command
    substitution's: no second fork; stderr with stdout), and its output follows a header line
    ``\\036<name> <exit status>``; see parse_sections."""
    parts = []
    for name, cmd in sections.items():
        if not name.isidentifier():
            raise ValueError(f"section name {name!r}: letters, digits and _ only")
        parts.append(f"o=$( {{ {cmd}\n}} 2>&1 ); printf '\\036{name} %d\\n%s\\n' $? \"$o\"")
    return "\n".join(parts)


@dataclass(frozen=True)
class SectionResult:
    exit_code: int
    output: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def parse_sections(stdout: str) -> dict[str, SectionResult]:
    """What build_sections_command printed: section name -> its exit status and output (a
    section the node never reached is missing)."""
    out: dict[str, SectionResult] = {}
    for block in ("\n" + stdout).split("\n\036")[1:]:
        header, _, body = block.partition("\n")
        name, _, rc = header.partition(" ")
        out[name] = SectionResult(int(rc) if rc.strip().isdigit() else 1, body.rstrip("\n"))
    return out


ERROR_FILE_SEPARATOR = "\n\036\n"


def build_error_files_command(run_id: str) -> str:
    """Every torchrun error.json of the run, each followed by ERROR_FILE_SEPARATOR."""
    d = shlex.quote(run_dir(run_id))
    return (
        f"cd {d} && for f in $(find logs -name error.json 2>/dev/null); "
        "do cat \"$f\"; printf '\\n\\036\\n'; done"
    )


def report_install(
    python: str, needs: Sequence[Requirement], why: str, node: str, r: SectionResult
) -> None:
    """What build_install_command answered on a node (also in verify's first round trip): says
    what it installed, raises TransportError naming the node and pip's last lines if it could not."""
    lines = r.output.strip().splitlines()
    if not r.ok:
        raise TransportError(
            f"node {node}: {python} cannot import {', '.join(req for _, req in needs)} and pip "
            f"could not install it ({why}): " + " | ".join(lines[-3:])
        )
    if lines and lines[-1].startswith("installed"):
        ui.say(f"{node}: installed{lines[-1][len('installed') :]} for {python} ({why})")
