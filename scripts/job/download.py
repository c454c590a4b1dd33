"""Bring a run's results home: one tar per node into results_dir/<node>/, and job.json beside them."""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from scripts import ui
from scripts.job.outputs import build_collect_workdir_command
from scripts.job.records import JobResult
from scripts.node_layout import run_dir
from scripts.parallel import parallel
from scripts.transport.base import Transport

COLLECT_ERRORS = ".collect-errors"  # in the run dir on the node: why workdir/ is incomplete
#: the run dir's entries that stay on the node: the code snapshot and run.sh's bookkeeping
NOT_DOWNLOADED = ("./code", "./pgid", "./jobpid", "./node", "./container")


def download_results(transports: Mapping[str, Transport], run_id: str, results_dir: Path) -> None:
    """Every node's out dir's files, torchrun.log, torchrun-logs/, exitcode, setup.log and workdir/
    (what the job created or changed in its working directory) under results_dir/<node>/; a node
    that cannot be reached is reported, not fatal."""
    d = run_dir(run_id)
    # on the download's own channel, first: what the job wrote beside its code into workdir/
    # (what went wrong doing so travels in the tar as COLLECT_ERRORS)
    collect = (
        f"({build_collect_workdir_command(run_id)}) >/dev/null "
        f"2> {shlex.quote(d)}/{COLLECT_ERRORS} || true"
    )

    def one(name: str) -> None:
        dest = results_dir / name
        with tempfile.TemporaryDirectory(dir=results_dir, prefix=f".{name}-") as tmp:
            got = Path(tmp)
            if not transports[name].download(d, got, exclude=NOT_DOWNLOADED, before=collect):
                return
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

    results_dir.mkdir(parents=True, exist_ok=True)
    _, errors = parallel(list(transports), one)
    for name, e in errors.items():
        ui.warn(f"{name}: could not download results: {e}")


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


def write_job_record(result: JobResult) -> None:
    """results_dir/job.json: how the run ended, for people and scripts."""
    data = {
        "run_id": result.run_id,
        "ok": result.ok,
        "exit_codes": dict(result.exit_codes),
        "duration_s": round(result.duration_s, 2),
        "failed_node": result.failed_node,
        "root_cause": list(result.root_cause),
        "recoveries": [asdict(r) for r in result.recoveries],
    }
    (result.results_dir / "job.json").write_text(json.dumps(data, indent=2) + "\n")
