"""Bring a run's results home: one tar per node into results_dir/<node>/, and job.json beside them."""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from gputrain_node.contract import BUDGET_MARK
from infra.base.errors import GputrainError
from scripts import ui
from scripts.job.data_io import FILLED_RECORD, FORGET_FILLED_SH, build_collect_workdir_command
from scripts.job.records import JobResult, TrainingError
from scripts.node_layout import run_dir
from scripts.parallel import parallel
from scripts.transport.base import ConnectionLostError, Transport, TransportError

COLLECT_ERRORS = ".collect-errors"  # in the run dir on the node: why workdir/ is incomplete
#: the run dir's entries that stay on the node: the code snapshot and run.sh's bookkeeping
NOT_DOWNLOADED = ("./code", "./pgid", "./jobpid", "./node", "./container", f"./{FILLED_RECORD}")
DOWNLOAD_TRIES = 3  # a transient SSH error (a dropped channel, a reset) is tried again
RETRY_PAUSE_S = 2.0  # before the second try; doubled before the third
RECONNECT_S = 15.0  # after a lost connection: a node that does not answer by then is given up
#: what each attempt's download writes anew under results_dir/<node>/ (the rest it adds to); the
#: budget's mark only comes when the budget stopped that attempt, and must not stay for the next
PER_ATTEMPT = ("torchrun.log", "exitcode", "torchrun-logs", BUDGET_MARK)


class ResultsNotHomeError(GputrainError):
    """Some node's results could not be brought home: never a success. `results_missing`: node
    -> why (a TrainingError carries the same attribute)."""

    def __init__(self, message: str, missing: Mapping[str, str]) -> None:
        super().__init__(message)
        self.results_missing = dict(missing)


def results_missing(error: BaseException | None) -> dict[str, str]:
    """node -> why its results are not home, as a failure carries them ({}: all came home)."""
    if isinstance(error, ResultsNotHomeError | TrainingError):
        return dict(error.results_missing)
    return {}


def keep_attempt_files(results_dir: Path, tag: str) -> None:
    """Before a relaunch (a recovery, a restart after a stall, `train --resume`): the next
    download would overwrite or trip over each node's PER_ATTEMPT files, so torchrun.log becomes
    torchrun.<tag>.log, exitcode exitcode.<tag>, torchrun-logs torchrun-logs.<tag>, the budget's
    mark watch/budget.<tag>.json (.<tag>.2 and on where a resumed run's recovery counts again
    from 1: never over an earlier one)."""
    for node_dir in [p for p in results_dir.glob("*") if p.is_dir()]:
        for name in PER_ATTEMPT:
            if (node_dir / name).exists():
                stem, dot, ext = name.partition(".")
                kept, again = node_dir / f"{stem}.{tag}{dot}{ext}", 1
                while kept.exists():
                    again += 1
                    kept = node_dir / f"{stem}.{tag}.{again}{dot}{ext}"
                shutil.move(node_dir / name, kept)


#: on a node, in the run dir: the earlier attempt's torchrun.log as torchrun.attempt<N>.log, N
#: the first free (the start truncates torchrun.log), and its budget's mark as
#: watch/budget.attempt<N>.json (left, it would say the budget stopped this attempt too: its
#: watchdog's end marker, its notification); the download brings them home
KEEP_NODE_LOG_SH = (
    "n=1; while [ -e torchrun.attempt$n.log ]; do n=$((n+1)); done; "
    f"if [ -e {BUDGET_MARK} ]; then "
    f"mv {BUDGET_MARK} {BUDGET_MARK.removesuffix('.json')}.attempt$n.json; fi; "
    "if [ -e torchrun.log ]; then mv torchrun.log torchrun.attempt$n.log; fi"
)


def keep_previous_attempt(
    transports: Mapping[str, Transport], run_id: str, results_dir: Path
) -> None:
    """`train --resume RUN`: what the run's earlier attempt left, at home (keep_attempt_files)
    and its torchrun.log and budget mark on every node (KEEP_NODE_LOG_SH), kept as a recovery
    keeps them: `torchrun.attempt<N>.log`, N the first number no node has yet at home (the nodes
    count the same way)."""
    n = 1
    while any(results_dir.glob(f"*/torchrun.attempt{n}.log")):
        n += 1
    keep_attempt_files(results_dir, f"attempt{n}")
    cmd = f"cd {shlex.quote(run_dir(run_id))} 2>/dev/null || exit 0; {KEEP_NODE_LOG_SH}"

    def one(name: str) -> None:
        r = transports[name].run(cmd, timeout=60)
        if not r.ok:
            raise TransportError(r.stderr.strip() or f"exit {r.exit_code}")

    _, errors = parallel(list(transports), one)
    for name, e in errors.items():
        ui.warn(f"{name}: the earlier attempt's torchrun.log may be overwritten ({e})")


def not_home_message(
    run_id: str, missing: Mapping[str, str], results_dir: Path, nodes: int | None = None
) -> str:
    """What could not come home and where it still is; the other nodes' results only when the
    run had others (`nodes`: how many it ran on; None: not known). Pure."""
    why = "; ".join(f"{n}: {reason}" for n, reason in missing.items())
    others = nodes is None or nodes > len(missing)
    return (
        f"the results of {', '.join(missing)} could not be brought home ({why}); they stay on "
        f"the node in .gputrain/runs/{run_id}/ while it exists: `gputrain results {run_id}` "
        "with the run's target tries again"
        + (f" (the other nodes' are in {results_dir})" if others else "")
    )


def download_results(
    transports: Mapping[str, Transport],
    run_id: str,
    results_dir: Path,
    *,
    retry_pause_s: float = RETRY_PAUSE_S,
) -> dict[str, str]:
    """Every node's out dir's files, torchrun.log, torchrun-logs/, exitcode, setup.log and workdir/
    (what the job created or changed in its working directory) under results_dir/<node>/. A node
    that fails is tried DOWNLOAD_TRIES times (reconnected after a lost connection; one that
    cannot be reconnected is not tried again). Returns the nodes whose results did not come
    home, with why (said here too): the caller must not call that a success."""
    d = run_dir(run_id)
    # on the download's own channel, first: what the job wrote beside its code into workdir/
    # (what went wrong doing so travels in the tar as COLLECT_ERRORS)
    collect = (
        f"({build_collect_workdir_command(run_id)}) >/dev/null "
        f"2> {shlex.quote(d)}/{COLLECT_ERRORS} || true\n"
        f"(cd {shlex.quote(d)} && {FORGET_FILLED_SH}) >/dev/null 2>&1 || true"
    )

    def one(name: str) -> None:
        for attempt in range(1, DOWNLOAD_TRIES + 1):
            try:
                return fetch(name)
            except Exception as e:
                if attempt == DOWNLOAD_TRIES:
                    raise
                ui.warn(f"{name}: downloading results failed ({e}); trying again")
                time.sleep(retry_pause_s * 2 ** (attempt - 1))
                if isinstance(e, ConnectionLostError):
                    try:
                        transports[name].reconnect(RECONNECT_S)
                    except Exception as again:  # unreachable: another try cannot succeed
                        raise e from again

    def fetch(name: str) -> None:
        dest = results_dir / name
        with tempfile.TemporaryDirectory(dir=results_dir, prefix=f".{name}-") as tmp:
            got = Path(tmp)
            if not transports[name].download(d, got, exclude=NOT_DOWNLOADED, before=collect):
                raise LookupError(f"the node has no run {run_id}")
            errors = got / COLLECT_ERRORS
            if errors.is_file() and errors.read_text(errors="replace").strip():
                ui.warn(
                    f"{name}: could not collect the job's working-directory files: "
                    + errors.read_text(errors="replace").strip()
                )
            dest.mkdir(parents=True, exist_ok=True)
            if (got / "out").is_dir():
                for p in (got / "out").iterdir():
                    move_into(p, dest / p.name)
            for src, to in (
                ("workdir", "workdir"),
                ("torchrun.log", "torchrun.log"),
                ("logs", "torchrun-logs"),
                ("exitcode", "exitcode"),
                ("setup.log", "setup.log"),  # the environment's build (scripts/job/environment.py)
                ("watch", "watch"),  # GPU telemetry, heartbeats, stacks (scripts/watch/)
            ):
                if (got / src).exists():
                    move_into(got / src, dest / to)
            for kept in got.glob("torchrun.attempt*.log"):  # the logs `--resume` kept
                move_into(kept, dest / kept.name)

    results_dir.mkdir(parents=True, exist_ok=True)
    _, errors = parallel(list(transports), one)
    missing = {name: str(e) or type(e).__name__ for name, e in errors.items()}
    for name, why in missing.items():
        ui.warn(f"{name}: could not download results: {why}")
    return missing


def move_into(src: Path, dest: Path) -> None:
    """src to dest; a folder merges into one already there (a relaunch's out/tensorboard/ meets
    the first attempt's), a file replaces the older copy."""
    if src.is_dir() and dest.is_dir():
        for child in src.iterdir():
            move_into(child, dest / child.name)
        return
    if dest.is_dir():
        shutil.rmtree(dest)
    src.replace(dest)


def write_job_record(result: JobResult, results_missing: Mapping[str, str] | None = None) -> None:
    """results_dir/job.json: how the run ended, for people and scripts (and whose results did
    not come home)."""
    data = {
        "run_id": result.run_id,
        "ok": result.ok,
        "exit_codes": dict(result.exit_codes),
        "duration_s": round(result.duration_s, 2),
        "failed_node": result.failed_node,
        "root_cause": list(result.root_cause),
        "recoveries": [asdict(r) for r in result.recoveries],
    }
    if results_missing:
        data["results_missing"] = dict(results_missing)
    (result.results_dir / "job.json").write_text(json.dumps(data, indent=2) + "\n")
