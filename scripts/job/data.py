"""A job's datasets on every node before torchrun: `copy` runs the node package's fetch on each node at
once (progress streamed, a summary line per node), `mount` mounts the prefix with Cloud Storage
FUSE (scripts/job/gcsfuse.py). Also the controller's own check that each prefix can be listed,
run before anything is created.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gputrain_node import contract
from gputrain_node.contract import FETCH_RESULT_PREFIX, FETCH_USER_ERRORS
from infra.base.errors import UserError
from infra.base.records import Fleet
from infra.datasets import NODE_DATA_DIR, Dataset, data_env
from infra.scratch import SCRATCH_ENV, SCRATCH_MOUNT
from scripts import ui
from scripts.job.gcsfuse import build_mount_command
from scripts.node_layout import NODE_ROOT_SH
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
    from google.cloud.storage.retry import DEFAULT_RETRY

    from infra.gcp.api import unreachable

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
    except (gexc.GoogleAPIError, OSError) as e:  # RetryError, a refused connection
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
