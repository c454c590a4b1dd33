"""`--detach`: start the job like any run (upload, torchrun detached on every node), show its log
until it has trained its first step, then return and leave it running. In DDP every rank takes a
step together, so the first `step N/M |` line (rank 0's) means every node trains; the nodes'
torchrun were started by then. `gputrain logs` reattaches, `status` and `down` work from anywhere.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import time
from collections.abc import Mapping

from infra.base.errors import GputrainError
from infra.base.records import Fleet
from scripts.job.follow import LineSink, say_line
from scripts.job.launch import (
    collect_code,
    prepare_image_and_environment,
    prepare_nodes,
    upload_and_start,
)
from scripts.job.node_scripts import run_dir
from scripts.job.records import Job, validate_job
from scripts.parallel import parallel
from scripts.transport.base import Transport

FIRST_STEP = re.compile(r"\bstep\s+\d+/\d+ \|")
_END = "\036gputrain-exitcode "


def _poll_command(run_id: str, seen: int) -> str:
    """The log's lines after `seen`, then the exit code when the job has ended."""
    d = shlex.quote(run_dir(run_id))
    return (
        f"cd {d} || exit 1; tail -n +{seen + 1} torchrun.log 2>/dev/null; "
        f"if [ -s exitcode ]; then printf '{_END}%s\\n' \"$(cat exitcode)\"; fi"
    )


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
    files = collect_code(job)
    prepared = prepare_nodes(fleet, transports, job)  # the storage client too, for gs://
    if job.rdzv_port is None:
        job = dataclasses.replace(job, rdzv_port=prepared.rdzv_port)
    job, prepared = prepare_image_and_environment(
        fleet, transports, job, files, prepared, on_line=on_line
    )
    upload_and_start(fleet, transports, job, files, prepared)
    names = [n.name for n in fleet.nodes]
    seen = dict.fromkeys(names, 0)
    ended: dict[str, str] = {}
    started = time.monotonic()
    while True:

        def poll(name: str) -> list[str]:
            r = transports[name].run(_poll_command(job.run_id, seen[name]), 30)
            return r.stdout.splitlines()

        got, _ = parallel(names, poll)  # a node that does not answer now is asked again
        stepped = False
        for name in names:
            for line in got.get(name, []):
                line, marker, code = line.partition(_END)
                if marker:
                    ended[name] = (code.split() or ["?"])[0]
                    if not line:
                        continue
                seen[name] += 1
                on_line(name, line)
                stepped = stepped or bool(FIRST_STEP.search(line))
        if stepped:
            return time.time()
        if len(ended) == len(names):
            codes = ", ".join(f"{n}={c}" for n, c in ended.items())
            raise GputrainError(
                f"run {job.run_id} ended before its first training step ({codes}); nothing is "
                f"left running: `gputrain logs --run {job.run_id}` shows its log"
            )
        if first_step_deadline_s and time.monotonic() - started > first_step_deadline_s:
            return time.time()
        time.sleep(poll_s)
