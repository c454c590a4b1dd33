"""Outputs that survive a preemption, for any trainer: each node's out dir (GPUTRAIN_OUT) is
mirrored to the stack's bucket while training runs (trainer/mirror_out.py, started by run.sh) and
restored onto a re-created node before the relaunch; relaunches after the first attempt get
`--resume-args` appended to ENTRY and every attempt is told its number (GPUTRAIN_ATTEMPT).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path

from infra.base.records import Fleet
from scripts import ui
from scripts.job.records import Job
from scripts.node_layout import run_dir
from scripts.parallel import parallel
from scripts.transport.base import Transport, TransportError

#: the node side, standalone for --restore (sent on stdin before the code is uploaded)
MIRROR_SOURCE = Path(__file__).resolve().parent.parent.parent / "trainer" / "mirror_out.py"
OUT_URI_ENV = "GPUTRAIN_OUT_URI"  # gs://BUCKET/PREFIX/: each node's files under <node>/
ATTEMPT_ENV = "GPUTRAIN_ATTEMPT"
MIRROR_INTERVAL_ENV = "GPUTRAIN_MIRROR_INTERVAL_S"  # seconds between passes (default 10)
#: Vertex AI: --resume-args as a JSON list, appended by the replica itself when it starts again
#: (trainer/vertex_mirror.py); on GCE the controller appends them (attempt_entry)
RESUME_ARGS_ENV = "GPUTRAIN_RESUME_ARGS"
#: no mirror beside these: the reference trainer uploads its own checkpoints
#: (GPUTRAIN_CHECKPOINT_URI), the health check has nothing to keep
NOT_MIRRORED = (("-m", "trainer.train"), ("-m", "trainer.healthcheck"))


def out_uri(bucket: str | None, run_id: str) -> str | None:
    """Where a run's out dirs go under the stack's gs://<bucket>/<prefix>. Pure."""
    return f"{bucket}runs/{run_id}/out/" if bucket else None


def output_env(bucket: str | None, job: Job) -> dict[str, str]:
    """The mirror's destination for a job on a stack (none for NOT_MIRRORED entries). Pure."""
    uri = out_uri(bucket, job.run_id)
    if uri is None or any(tuple(job.entry[: len(e)]) == e for e in NOT_MIRRORED):
        return {}
    return {OUT_URI_ENV: uri}


def vertex_output_env(bucket: str, job: Job) -> dict[str, str]:
    """A Vertex job's mirror destination and resume args (its replicas restart themselves). Pure."""
    resume = {RESUME_ARGS_ENV: json.dumps(list(job.resume_args))} if job.resume_args else {}
    return {**output_env(bucket, job), **resume}


def attempt_entry(job: Job) -> tuple[str, ...]:
    """ENTRY, plus --resume-args on every attempt after the first. Pure."""
    return (*job.entry, *job.resume_args) if job.attempt > 1 else tuple(job.entry)


def mirror_start_lines(job: Job, python: str) -> str:
    """run.sh, before torchrun: the attempt number, the node's name (written by the start)
    and, with GPUTRAIN_OUT_URI, the mirror in the background. Pure."""
    py = shlex.quote(python)
    return (
        f"export {ATTEMPT_ENV}={job.attempt}\n"
        'NODE_NAME=; read -r NODE_NAME 2>/dev/null < "$RUN/node" || NODE_NAME=$(hostname)\n'
        f'if [ -n "${{{OUT_URI_ENV}:-}}" ]; then\n'
        f'  (cd "$RUN/code" && exec {py} -m trainer.mirror_out --dir "$RUN/out" '
        f'--uri "${{{OUT_URI_ENV}%/}}/$NODE_NAME/" --interval "${{{MIRROR_INTERVAL_ENV}:-10}}") &\n'
        "  MIRROR=$!\n"
        "fi\n"
    )


#: run.sh, after torchrun: the mirror's last pass, before the exit code tells the controller
MIRROR_STOP_LINES = (
    'if [ -n "${MIRROR:-}" ]; then kill -TERM "$MIRROR" 2>/dev/null; wait "$MIRROR"; fi\n'
)


def build_restore_command(job: Job, node: str, python: str) -> tuple[str, bytes] | None:
    """On a relaunch, before the start: the out dir's files that the bucket holds and the node
    lacks (a re-created VM lacks them all), by trainer/mirror_out.py (standalone for --restore)
    sent on stdin: the code is not there yet. The command and its stdin; None on a first attempt
    or without GPUTRAIN_OUT_URI. Pure but for reading that file."""
    uri = job.env.get(OUT_URI_ENV)
    if job.attempt == 1 or not uri:
        return None
    from scripts.job.environment_node import values_channel

    q = shlex.quote
    d = q(run_dir(job.run_id))
    read_values, values = values_channel(job.env)  # on stdin before the source: never in argv
    cmd = (
        f"mkdir -p {d}/out && {read_values}{q(python)} - --restore --dir {d}/out "
        f"--uri {q(uri.rstrip('/') + '/' + node + '/')}"
    )
    return cmd, (values or b"") + MIRROR_SOURCE.read_bytes()


def prepare_outputs(fleet: Fleet, transports: Mapping[str, Transport], job: Job) -> None:
    """On a relaunch, the out dirs are back from the bucket (said per node); a first attempt's
    out dir is made by the start (scripts/job/node_scripts.build_upload_and_start_command)."""
    restores = {n.name: build_restore_command(job, n.name, fleet.python) for n in fleet.nodes}
    commands = {name: c for name, c in restores.items() if c is not None}
    if not commands:
        return

    def one(name: str) -> str:
        cmd, stdin = commands[name]
        r = transports[name].run(cmd, 1800, stdin=stdin)
        if not r.ok:
            raise TransportError(
                f"node {name}: could not prepare the run's out dir: "
                + " | ".join((r.stdout + r.stderr).strip().splitlines()[-3:])
            )
        return r.stdout.strip()

    results, errors = parallel(list(commands), one)
    if errors:
        raise TransportError("\n".join(str(e) for e in errors.values()))
    for name in commands:
        if results[name]:
            ui.say(f"{name}: {results[name].splitlines()[-1]}")
