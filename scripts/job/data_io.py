"""A job's data in and outputs out.

In: its datasets on every node before torchrun: `copy` runs the node package's fetch on each node
at once (progress streamed, a summary line per node), `mount` mounts the prefix with Cloud Storage
FUSE (scripts/job/gcsfuse.py). Also the controller's own check that each prefix can be listed, run
before anything is created.

Out: outputs that survive a preemption, for any trainer: each node's out dir (GPUTRAIN_OUT) is
mirrored to the stack's bucket while training runs (the node package's mirror, started by run.sh)
and restored onto a re-created node before the relaunch, and so are the files the job created or
changed in its working directory (a trainer that checkpoints beside its code). Before a relaunch
(and `train --resume`) every other node also gets what rank 0's node has there and it lacks: a
job that checkpoints on rank 0 only (assuming a shared file system) resumes on every rank.
Relaunches after the first attempt get `--resume-args` appended to ENTRY and every attempt is told
its number (GPUTRAIN_ATTEMPT).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gputrain_node import contract
from gputrain_node.contract import (
    ATTEMPT_ENV,
    FETCH_RESULT_PREFIX,
    FETCH_USER_ERRORS,
    MIRROR_INTERVAL_ENV,
    OUT_URI_ENV,
    RESUME_ARGS_ENV,
)
from infra.base.errors import UserError
from infra.base.records import Fleet
from infra.datasets import NODE_DATA_DIR, Dataset, data_env
from infra.scratch import SCRATCH_ENV, SCRATCH_MOUNT
from scripts import ui
from scripts.job.gcsfuse import build_mount_command
from scripts.job.records import Job
from scripts.node_layout import NODE_ROOT_SH, node_helper, run_dir
from scripts.parallel import parallel
from scripts.transport.base import Transport, TransportError

#: the node-side copy, standalone: sent with the command (the code is uploaded after it)
FETCH_DATA_SOURCE = contract.source_of(contract.FETCH_DATA)
#: what run.sh exports: the node's data dir (the same path on every node)
NODE_DATA_DIR_SH = f"${{GPUTRAIN_NODE_ROOT:-$HOME}}/{NODE_DATA_DIR}"


@dataclass(frozen=True)
class PrefixInfo:
    """What the controller saw under a dataset's prefix."""

    dataset: Dataset
    objects: int
    bytes: int


def data_env_lines(datasets: Iterable[Dataset]) -> str:
    """run.sh's exports: GPUTRAIN_SCRATCH where local SSD is mounted, GPUTRAIN_DATA_DIR and
    GPUTRAIN_DATA_<NAME> (expanded on the node: names are letters, digits and '_'). Pure."""
    lines = (  # the test first: no process on the nodes without local SSD
        f"if [ -d {SCRATCH_MOUNT} ] && mountpoint -q {SCRATCH_MOUNT} 2>/dev/null; "
        f"then export {SCRATCH_ENV}={SCRATCH_MOUNT}; fi\n"
    )
    for k, v in data_env(datasets, NODE_DATA_DIR_SH).items():
        lines += f'export {k}="{v}"\n'
    return lines


def storage_client() -> Any:
    """This machine's Cloud Storage client (ADC, or the emulator of STORAGE_EMULATOR_HOST)."""
    try:
        import google.cloud.storage as storage

        return storage.Client()
    except Exception as e:  # no credentials: one line, before anything is created
        raise UserError(
            f"data: cannot check the datasets without Cloud Storage credentials ({e}); run "
            "`gcloud auth application-default login`"
        ) from None


#: How long listing a dataset may retry an unreachable Cloud Storage.
LIST_DEADLINE_S = 30.0


def list_prefix(d: Dataset, client: Any, *, deadline_s: float = LIST_DEADLINE_S) -> PrefixInfo:
    """The prefix's objects and bytes; one line (UserError) when it does not exist, is empty or
    cannot be listed with these credentials."""
    from google.api_core import exceptions as gexc
    from google.auth.exceptions import GoogleAuthError
    from google.cloud.storage.retry import DEFAULT_RETRY

    from infra.gcp.api import credentials_error, refused, unreachable

    where = f"data {d.name} ({d.uri})"
    retry = DEFAULT_RETRY.with_deadline(deadline_s)  # the client's own: 120 s, then a traceback
    try:
        blobs = [
            b
            for b in client.list_blobs(d.bucket, prefix=d.prefix, retry=retry, timeout=deadline_s)
            if b.name[-1] != "/"
        ]
    except gexc.NotFound:
        raise UserError(f"{where}: bucket gs://{d.bucket} does not exist") from None
    except gexc.Forbidden as e:
        raise UserError(
            f"{where}: your credentials cannot list it ({e.message}); you need "
            f"roles/storage.objectViewer on gs://{d.bucket}"
        ) from None
    except gexc.GoogleAPICallError as e:
        raise UserError(f"{where}: cannot be listed: {e.code} {e.message}") from None
    except (gexc.GoogleAPIError, OSError, GoogleAuthError) as e:  # RetryError, refused, a token
        if refused(e):  # an expired login
            raise credentials_error(
                f"{where}: the credentials were refused", e, UserError
            ) from None
        raise UserError(
            f"{where}: Cloud Storage did not answer ({unreachable(e)}); check this machine's "
            "network or proxy and run again"
        ) from None
    if not blobs:
        raise UserError(f"{where}: no objects under this prefix (a typo in the path?)")
    return PrefixInfo(d, len(blobs), sum(int(b.size or 0) for b in blobs))


def check_prefixes(datasets: Sequence[Dataset], client: Any = None) -> list[PrefixInfo]:
    """Each prefix must exist and be listable from here; says what each holds."""
    if not datasets:
        return []
    client = client or storage_client()
    found = [list_prefix(d, client) for d in datasets]
    for info in found:
        d = info.dataset
        ui.say(
            f"data {d.name}: {d.uri}, {info.objects} object(s), {info.bytes / (1 << 30):.2f} GiB, "
            f"{d.mode} -> {d.env_name}"
        )
    return found


def build_fetch_command(
    datasets: Sequence[Dataset], node: str, python: str, env: Mapping[str, str]
) -> tuple[str, bytes | None]:
    """The node's copy step before the code upload: the node package's fetch (standalone) sent in
    the command itself, run with the job's env (an emulator host or credentials the user
    passed), whose values come on stdin (never in an argv). (command, stdin). Pure but for
    reading that file."""
    from scripts.job.environment_node import values_channel

    q = shlex.quote
    exports, values = values_channel(env)
    specs = " ".join(q(d.spec()) for d in datasets if d.mode == "copy")
    source = FETCH_DATA_SOURCE.read_text()
    assert "\nGPUTRAIN_FETCH_DATA\n" not in source
    return (
        f"{exports}ROOT={NODE_ROOT_SH}; exec {q(python)} - "
        f'--root "$ROOT/{NODE_DATA_DIR}" --scratch {SCRATCH_MOUNT} --node {q(node)} {specs} '
        f"<<'GPUTRAIN_FETCH_DATA'\n{source}\nGPUTRAIN_FETCH_DATA\n"
    ), values


def parse_fetch_result(lines: Sequence[str]) -> dict[str, Any] | None:
    for line in reversed(lines):
        if line.startswith(FETCH_RESULT_PREFIX):
            try:
                data = json.loads(line[len(FETCH_RESULT_PREFIX) :])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def stage_data(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    datasets: Sequence[Dataset],
    *,
    env: Mapping[str, str],
    install_gcsfuse: bool = False,
) -> dict[str, dict[str, Any]]:
    """Every dataset on every node at once; returns each node's fetch summary. A node that
    cannot hold the data or read the prefix is a UserError (exit 2) naming it."""
    copies = [d for d in datasets if d.mode == "copy"]
    mounts = [d for d in datasets if d.mode == "mount"]
    if not datasets:
        return {}
    start = time.monotonic()

    def one(name: str) -> dict[str, Any]:
        t = transports[name]
        summary: dict[str, Any] = {"node": name}
        if mounts:
            cmd = build_mount_command(mounts, install=install_gcsfuse)
            r = t.run(cmd, 900)
            if not r.ok:
                raise TransportError(
                    f"node {name}: mounting {', '.join(d.uri for d in mounts)} failed: "
                    + " | ".join((r.stdout + r.stderr).strip().splitlines()[-3:])
                )
        if copies:
            lines: list[str] = []

            def line(text: str) -> None:
                lines.append(text)
                if not text.startswith(FETCH_RESULT_PREFIX):
                    ui.say(f"[{name}] {text}")

            cmd, values = build_fetch_command(copies, name, fleet.python, env)
            rc = t.stream(cmd, line, None, stdin=values)
            if rc in FETCH_USER_ERRORS:
                why = [ln.removeprefix("data: ") for ln in lines if ln.startswith("data: ")]
                raise UserError(why[-1] if why else f"node {name}: data copy refused ({rc})")
            result = parse_fetch_result(lines)
            if rc != 0 or result is None:
                raise TransportError(
                    f"node {name}: copying the datasets failed (exit {rc}): "
                    + " | ".join(lines[-3:])
                )
            summary.update(result)
        return summary

    names = [n.name for n in fleet.nodes]
    results, errors = parallel(names, one)
    if errors:
        user = [e for e in errors.values() if isinstance(e, UserError)]
        if user:
            raise user[0]
        raise TransportError("\n".join(str(e) for e in errors.values()))
    if copies:
        ui.say(
            f"data on {len(names)} node(s) in {time.monotonic() - start:.1f} s: "
            + "; ".join(_node_line(results[n]) for n in names)
        )
    return results


def _node_line(r: Mapping[str, Any]) -> str:
    got = int(r.get("downloaded_bytes", 0))
    secs = float(r.get("seconds", 0.0)) or 1e-6
    return (
        f"{r['node']} {got / (1 << 20):,.0f} MiB downloaded ({got / secs / 1e6:,.0f} MB/s), "
        f"{r.get('cached_objects', 0)} object(s) cached"
    )


#: the node side, standalone for --restore (sent on stdin before the code is uploaded)
MIRROR_SOURCE = contract.source_of(contract.MIRROR_OUT)
#: the reference trainer uploads its own checkpoints (GPUTRAIN_CHECKPOINT_URI): no mirror beside
#: it, nor beside the health check (nothing to keep). RESUME_ARGS_ENV: on Vertex AI the replica
#: appends --resume-args itself; on GCE the controller does (attempt_entry)
REFERENCE_TRAINER = ("-m", "trainer.train")


#: in the run dir on the node: what rank 0's node's state gave this node (mirror_out --filled)
FILLED_RECORD = "filled"
#: the download's first step, once the job is over: the files a fill gave this node that are
#: still as the fill left them (size, mtime) are rank 0's (they come home from its node), not
#: this node's results
FORGET_FILLED_SH = (
    f"[ ! -s exitcode ] || [ ! -f {FILLED_RECORD} ] || "
    "while IFS=\"$(printf '\\t')\" read -r f s m g; do "
    '[ "$(stat -c \'%s %Y\' "$f" 2>/dev/null)" != "$s ${m%?????????}" ] || rm -f "$f"; '
    f"done < {FILLED_RECORD}"
)


def is_mirrored(job: Job) -> bool:
    """Whether the job's out dir goes to the bucket: always but for the health check and our
    reference trainer (a `-m trainer.train` of the user's own `trainer/` package is theirs). Pure
    but for looking whether the working directory has a trainer/."""
    entry = tuple(job.entry[:2])
    if entry == contract.HEALTHCHECK_ENTRY:
        return False
    users_own = job.workdir is not None and (job.workdir / "trainer").is_dir()
    return entry != REFERENCE_TRAINER or users_own


def checkpoint_uri(bucket: str | None, run_id: str) -> str | None:
    """Where a run's checkpoints go under the stack's `gs://<bucket>/<prefix>` (the layout Vertex's
    AIP_CHECKPOINT_DIR has too). Pure."""
    return f"{bucket}runs/{run_id}/checkpoints/" if bucket else None


def out_uri(bucket: str | None, run_id: str) -> str | None:
    """Where a run's out dirs go under the stack's gs://<bucket>/<prefix>. Pure."""
    return f"{bucket}runs/{run_id}/out/" if bucket else None


def workdir_uri(out: str) -> str:
    """Where the nodes' working-directory files go: beside the out dirs (`.../RUN/workdir/`), not
    inside them, so nothing that lists the out dirs sees them. Pure."""
    parent = out.rstrip("/").rpartition("/")[0]
    return f"{parent}/workdir/"


def output_env(bucket: str | None, job: Job) -> dict[str, str]:
    """The mirror's destination for a job on a stack (none where it is not is_mirrored)."""
    uri = out_uri(bucket, job.run_id)
    if uri is None or not is_mirrored(job):
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
    and, with GPUTRAIN_OUT_URI, the mirror in the background: the out dir, and what the job
    writes in its working directory after the start (pgid's time). Pure."""
    uri = job.env.get(OUT_URI_ENV)
    changed = ""
    if uri:
        wd = shlex.quote(workdir_uri(uri))
        changed = f'--changed-dir "$RUN/code" --changed-uri {wd}"$NODE_NAME/" --newer "$RUN/pgid" '
    mirror = node_helper(
        python,
        contract.MIRROR_OUT,
        f'--dir "$RUN/out" --uri "${{{OUT_URI_ENV}%/}}/$NODE_NAME/" {changed}'
        f'--filled "$RUN/{FILLED_RECORD}" '
        f'--interval "${{{MIRROR_INTERVAL_ENV}:-10}}"',
    )
    return (
        f"export {ATTEMPT_ENV}={job.attempt}\n"
        'NODE_NAME=; read -r NODE_NAME 2>/dev/null < "$RUN/node" || NODE_NAME=$(hostname)\n'
        f'if [ -n "${{{OUT_URI_ENV}:-}}" ]; then\n'
        f"  ({mirror}) &\n"
        "  MIRROR=$!\n"
        "fi\n"
    )


#: run.sh, after torchrun: the mirror's last pass (SIGUSR1: the job has ended; a SIGTERM to the
#: group only makes it wait for this), before the exit code tells the controller
MIRROR_STOP_LINES = (
    'if [ -n "${MIRROR:-}" ]; then kill -USR1 "$MIRROR" 2>/dev/null; wait "$MIRROR"; fi\n'
)


def build_collect_workdir_command(run_id: str) -> str:
    """Hard-link into the run's workdir/ every file the job created or changed in its working
    directory (the code snapshot, newer than the attempt's start), so third-party trainers that
    write `out/ckpt.pt` beside their code have it come home; Python's caches are left out.
    workdir/ keeps what earlier attempts of the run wrote: the start puts it back (a relaunch)."""
    d = shlex.quote(run_dir(run_id))
    return (
        f"cd {d} 2>/dev/null && [ -f pgid ] || exit 0; "
        "find code -newer pgid -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -exec sh -c '"
        'for f; do t="workdir/${f#code/}"; mkdir -p "$(dirname "$t")" && '
        '{ ln -f "$f" "$t" 2>/dev/null || cp -p "$f" "$t"; }; done'
        "' sh {} +"
    )


def build_restore_command(
    job: Job, node: str, python: str, rank0_node: str | None = None
) -> tuple[str, bytes] | None:
    """On a relaunch, before the start: the out dir's files that the bucket holds and the node
    lacks (a re-created VM lacks them all), by the node package's mirror (standalone for --restore)
    sent on stdin: the code is not there yet. The working directory's files go to the run's
    workdir/ (the start puts them back into the new code snapshot), after the node's own newer
    ones were collected there. On a node that is not `rank0_node`, then what rank 0's node's
    state has and this node still lacks (noted in FILLED_RECORD). The command and its stdin;
    None on a first attempt that is no `train --resume`, or without GPUTRAIN_OUT_URI. Pure but
    for reading that file."""
    uri = job.env.get(OUT_URI_ENV)
    if (job.attempt == 1 and not job.resumed) or not uri:
        return None
    from scripts.job.environment_node import values_channel

    q = shlex.quote
    d = q(run_dir(job.run_id))
    read_values, values = values_channel(job.env)  # on stdin before the source: never in argv
    cmd = (
        f"({build_collect_workdir_command(job.run_id)}) && "
        f"mkdir -p {d}/out && {read_values}{q(python)} - --restore --dir {d}/out "
        f"--uri {q(uri.rstrip('/') + '/' + node + '/')} "
        f"--changed-dir {d}/workdir --changed-uri {q(workdir_uri(uri) + node + '/')}"
    )
    if rank0_node is not None and rank0_node != node:
        cmd += (
            f" --fill-uri {q(uri.rstrip('/') + '/' + rank0_node + '/')}"
            f" --fill-changed-uri {q(workdir_uri(uri) + rank0_node + '/')}"
            f" --filled {d}/{FILLED_RECORD}"
        )
    return cmd, (values or b"") + MIRROR_SOURCE.read_bytes()


def prepare_outputs(fleet: Fleet, transports: Mapping[str, Transport], job: Job) -> None:
    """On a relaunch (and `train --resume`), the out dirs are back from the bucket and every
    node has what rank 0's node (the head: c10d numbers the nodes in the order of their host
    names, and the head's sorts first) wrote that it lacks (said per node); a first attempt's out
    dir is made by the start (scripts/job/node_scripts.build_upload_and_start_command)."""
    head = fleet.nodes[0].name
    restores = {n.name: build_restore_command(job, n.name, fleet.python, head) for n in fleet.nodes}
    commands = {name: c for name, c in restores.items() if c is not None}
    if not commands:
        if (job.attempt > 1 or job.resumed) and len(fleet.nodes) > 1 and is_mirrored(job):
            ui.warn(
                "no bucket mirrors this run's files: every node resumes from what it kept "
                f"itself; what rank 0 alone wrote is only on {head}"
            )
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
    for name in commands:  # a line per place restored: the out dir, the working directory
        for line in results[name].splitlines():
            if line.startswith(("restored ", "filled ")):
                ui.say(f"{name}: {line}")
