"""The one seam between the lifecycle and where jobs run.

A `Target` is a GCP stack, a hosts file, this machine — and next a Vertex AI job, which has no
fleet and no SSH. So the top level assumes neither: it plans, creates and destroys what the target
owns, and hands out a `Session` for work on something that exists. A session proves the machines,
runs a job (the caller picks the run id, so a recovery can relaunch it), follows logs and opens a
shell — raising UserError for whatever does not apply to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from infra.datasets import Dataset
from scripts.guard import SignalGuard
from scripts.job.records import Job, JobResult


@dataclass(frozen=True)
class RunOptions:
    """The command-line choices a target may need."""

    entry: tuple[str, ...] = ()
    keep: bool = False  # `run`: keep what was created
    yes: bool = False  # do not ask before spending money
    skip_preflight: bool = False
    trust_new_hosts: bool = False  # hosts: record first-seen host keys
    env: dict[str, str] = field(default_factory=dict)
    max_restarts: int = 0
    wait_s: float | None = None  # --wait: how long to wait for SSH (None: the target's default)
    keep_bucket: bool = False  # `run`/`down`: keep the stack's bucket (and what is in it)
    keep_images: bool = False  # `run`: keep the `build` repository (the next run's build cache)
    max_recoveries: int | None = None  # nodes GCE takes away to recover from; None: 3
    max_candidates: int = 5  # `gpus` stacks: how many candidates `up` tries before giving up
    fabric: bool = False  # `verify --fabric`: the GPU network too
    requirements: bool = True  # install requirements.txt / pyproject / uv.lock on the nodes
    setup: str | None = None  # --setup: replaces the target file's `setup`
    setup_timeout_s: float = 1800.0
    force_setup: bool = False  # rebuild the cached environment and run setup again
    secrets: tuple[str, ...] = ()  # --secret NAME[=sm://...]: added to the file's `secrets`
    image: str | None = None  # --image: replaces the file's `image`
    build: str | None = None  # --build Dockerfile: replaces the stack's `build`
    stall_timeout_s: float | None = None  # --stall-timeout (None: the stack's, else automatic)
    wait_for_capacity_s: int | None = None  # stock-outs: retry this long (None: waitForCapacity)
    data: dict[str, str] = field(default_factory=dict)  # `--data NAME=gs://...` (over the target's)
    resume_args: tuple[str, ...] = ()  # `--resume-args "ARGS"`: appended on relaunches
    detach: bool = False  # `run`/`train`: return once the job trains, leave it running
    autodown: str | None = None  # `--autodown` as given (validated by the CLI); None: the stack's
    selector: str = ""  # the target as the user named it (`--stack dev`), for the way back
    resume: str | None = None  # `train --resume RUN`: that run again, from its checkpoints
    notify: tuple[str, ...] = ()  # --notify webhook URLs (secrets), beside the target's own
    force: bool = False  # `run`/`train`: start even where another gputrain run is training
    budget: float | None = None  # --budget USD: what the run may cost (None: the stack's `budget`)


class Session(Protocol):
    """Work on a target that exists."""

    name: str  # the target's name: results go to runs/<name>/<run-id>/
    hourly_usd: float | None  # what it costs while it exists; None: nothing billed by us
    keep: bool  # a created target outlives the command (set by `up` once it is proven)

    def verify(self, fabric: bool = False) -> None:
        """Prove the hardware is what was asked for (GPUs, driver, torch); with `fabric`, also
        the GPU network of a multi-node stack (set up first)."""
        ...

    def run_job(self, job: Job, results_dir: Path, guard: SignalGuard) -> JobResult:
        """Launch, follow, collect into results_dir; stop the job on any failure or signal."""
        ...

    def logs(self, run_id: str) -> None:
        """Follow a run's logs (it may still be running)."""
        ...

    def ssh(self, node: str, command: Sequence[str]) -> int:
        """A shell or one command on a node (name or index); its exit status."""
        ...

    def running(self) -> dict[str, list[str]]:
        """Where gputrain runs are still training: node (or job) -> run ids."""
        ...

    def results(self, run_id: str) -> Path:
        """A run's results home (finished or not) into runs/<name>/<run-id>/; that directory."""
        ...

    def stop(self, run_id: str) -> None:
        """Stop a run on every node (or cancel its job)."""
        ...


class Target(Protocol):
    """Where jobs run; one implementation per module in scripts/targets/."""

    name: str

    def plan(self) -> None:
        """Show what would be used and what it costs; creates nothing."""
        ...

    def keygen(self, *, force: bool) -> None: ...

    def up(self, opts: RunOptions) -> None:
        """Create and prove; it stays up (destroyed again if anything fails)."""
        ...

    def down(self, opts: RunOptions) -> None:
        """Destroy everything the target created (its results brought home first), then sweep."""
        ...

    def status(self) -> None: ...

    def datasets(self) -> tuple[Dataset, ...]:
        """The datasets the target's own file names (stack `data`, hosts file `data`)."""
        ...

    def sweep(self) -> bool:
        """List whatever the target left behind; True if anything is."""
        ...

    def provisioned(self, opts: RunOptions, guard: SignalGuard) -> AbstractContextManager[Session]:
        """Create the target for one command and yield its session; afterwards destroy it —
        after any failure, Ctrl-C or SIGTERM too — unless opts.keep or session.keep."""
        ...

    def attached(self, opts: RunOptions) -> AbstractContextManager[Session]:
        """A session on what exists already (nothing is created or destroyed)."""
        ...
