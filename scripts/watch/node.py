"""The shell that watches a run on the nodes. Pure: strings only.

In the run dir (scripts/node_layout.py) `watch/` holds telemetry.csv (the node package's
sampler), heartbeat files the job touches (GPUTRAIN_HEARTBEAT, per rank `.rank<R>`), the
stack-dump hook's markers and stacks; it comes home with the results as <node>/watch/.
"""

from __future__ import annotations

import shlex

from gputrain_node import contract
from gputrain_node.contract import HEARTBEAT_ENV, WATCH_DIR_ENV
from scripts.job.leftovers import OURS_SH
from scripts.node_layout import node_helper, run_dir

WATCH_DIR = "watch"
#: in the run's code snapshot: the sitecustomize that dumps stacks (a folder with that file
#: alone, so the ranks get the hook and nothing else of gputrain's)
HOOK_DIR = f"{contract.LIB_DIR}/{contract.PACKAGE}/{contract.WATCH_HOOK_DIR}"


def run_env_lines() -> str:
    """run.sh lines before torchrun starts (run.sh made "$RUN/watch"): where the job's heartbeat
    goes, the stack-dump hook first on PYTHONPATH, and no heartbeat left from an earlier attempt
    of the run (rm only when there is one)."""
    return (
        f'export {WATCH_DIR_ENV}="$RUN/watch" {HEARTBEAT_ENV}="$RUN/watch/heartbeat"\n'
        f'export PYTHONPATH="$RUN/code/{HOOK_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        'for f in "$RUN/watch/heartbeat"*; do [ ! -e "$f" ] || rm -f "$RUN/watch/heartbeat"*; '
        "break; done\n"
    )


def sampler_line(python: str, interval_s: float) -> str:
    """run.sh line after torchrun started ($JOB): the GPU sampler, detached in the job's process
    group (a stop ends it too); it ends by itself once torchrun has."""
    args = f'sample --out "$RUN/watch" --interval {interval_s:g} --until-pid $JOB'
    sampler = node_helper(python, contract.TELEMETRY, args)
    return f'({sampler}) >> "$RUN/watch/sampler.log" 2>&1 < /dev/null &'


POLL_TELEMETRY = "@@telemetry"
POLL_HEARTBEAT = "@@heartbeat"
POLL_NOW = "@@now"


def build_poll_command(run_id: str, offset: int) -> str:
    """The node's clock, the telemetry.csv bytes after `offset` (`@@telemetry SIZE` first) and
    every heartbeat file's mtime; exit 3 when the run does not exist there."""
    d = shlex.quote(run_dir(run_id))
    return (
        f"cd {d} 2>/dev/null || exit 3; echo {POLL_NOW} $(date +%s.%N); "
        "f=watch/telemetry.csv; s=$(wc -c < $f 2>/dev/null || echo 0); "
        f"echo {POLL_TELEMETRY} $s; "
        f'[ "$s" -gt {offset} ] && tail -c +{offset + 1} $f | head -c $((s - {offset})); echo; '
        f"echo {POLL_HEARTBEAT}; "
        "find watch -maxdepth 1 -name 'heartbeat*' -printf '%f %T@\\n' 2>/dev/null; true"
    )


def parse_poll(text: str) -> tuple[float | None, int, str, dict[str, float]]:
    """(node clock, telemetry size, the new telemetry bytes, heartbeat file -> mtime). Pure."""
    now: float | None = None
    size, chunk, beats = 0, "", {}
    head, sep, rest = text.partition(f"{POLL_TELEMETRY} ")
    for line in head.splitlines():
        if line.startswith(POLL_NOW):
            try:
                now = float(line.split()[1])
            except (IndexError, ValueError):
                now = None
    if sep:
        first, _, rest = rest.partition("\n")
        size = int(first.strip()) if first.strip().isdigit() else 0
        chunk, _, tail = rest.partition(f"\n{POLL_HEARTBEAT}\n")
        for line in tail.splitlines():
            name, _, mtime = line.rpartition(" ")
            try:
                beats[name] = float(mtime)
            except ValueError:
                continue
    return now, size, chunk, beats


def build_dump_command(run_id: str, python: str, wait_s: float) -> str:
    """Every rank's stack on this node, as the node package's telemetry dump prints it."""
    d = shlex.quote(run_dir(run_id))
    return (
        f"cd {d} 2>/dev/null || exit 3; {OURS_SH}; read -r P 2>/dev/null < jobpid; "
        'ours "$P" || exit 4; '
    ) + node_helper(
        python,
        contract.TELEMETRY,
        f'dump --watch "$R/watch" --jobpid "$P" --wait {wait_s:g}',
        code='"$R/code"',
    )


TAIL_BYTES = 65536  # enough for the latest sample of 8 GPUs many times over


def build_top_command(run_id: str, log_lines: int = 200) -> str:
    """The end of telemetry.csv, `@@log`, the log's last lines and, once the run has ended,
    `@@exit RC`; exit 3 when the run does not exist on the node."""
    d = shlex.quote(run_dir(run_id))
    return (
        f"cd {d} 2>/dev/null || exit 3; tail -c {TAIL_BYTES} watch/telemetry.csv 2>/dev/null; "
        f"echo; echo @@log; tail -n {log_lines} torchrun.log 2>/dev/null; "
        "[ -s exitcode ] && echo @@exit $(cut -d' ' -f1 exitcode); true"
    )
