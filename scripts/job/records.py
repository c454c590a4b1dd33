"""What a job is and how it ended: the torchrun job the caller describes (its run id included), the
result, and the typed failure of the node that failed first."""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from gputrain_node import contract
from infra.base.errors import GputrainError, UserError
from infra.datasets import Dataset
from scripts.job.sync import DEFAULT_MAX_UPLOAD_MIB
from scripts.node_layout import CODE_DIR

if TYPE_CHECKING:
    from scripts.job.container import ImageRef
    from scripts.job.environment import Environment
    from scripts.watch.telemetry import WatchSettings

DEFAULT_ENTRY: tuple[str, ...] = ("-m", "trainer.train", "--preset", "tiny")
MAX_RESTARTS = 100  # --max-restarts: how often torchrun may restart every worker
# What the trainer reads (trainer/config.py, trainer/preemption.py); the trainer runs without us.
CHECKPOINT_URI_ENV = "GPUTRAIN_CHECKPOINT_URI"
WATCH_PREEMPTION_ENV = contract.WATCH_PREEMPTION_ENV
TENSORBOARD_DIR_ENV = "GPUTRAIN_TENSORBOARD_DIR"  # trainer/board.py
WATCH_MAINTENANCE_ENV = "GPUTRAIN_WATCH_MAINTENANCE"
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RUN_ID_ALLOWED = "1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"


def check_run_id(value: str, setting: str) -> str:
    """`value` if it is a run id, else one line naming `setting` (UserError, exit 2): every
    command that takes a run id names a folder with it (results, stop, logs, report, top, resume),
    so a path there would act outside the run's own folder."""
    if not RUN_ID.match(value):
        raise UserError(
            f"{setting} {value!r}: not a run id (like 20261124-183000-ab12); use {RUN_ID_ALLOWED}"
        )
    return value


@dataclass(frozen=True)
class Job:
    """One torchrun job. ``entry`` is what follows torchrun's options (``-m mod`` or a script).
    The caller picks the run id, so a relaunch after a recovery can reuse it."""

    run_id: str
    entry: tuple[str, ...] = DEFAULT_ENTRY
    env: Mapping[str, str] = field(default_factory=dict)
    max_restarts: int = 0
    rdzv_port: int | None = None  # None: a free port picked on the head at start (per run)
    workdir: Path | None = None  # the user's code to upload (None: only the trainer package)
    include_trainer: bool = True
    nproc_per_node: int | None = None  # default: GPU count, or 1 on CPU
    max_upload_mib: float = DEFAULT_MAX_UPLOAD_MIB
    max_duration_s: float | None = None  # stop the job after this long (None: no limit)
    code_dir: str = CODE_DIR  # where the code is synced on the nodes (per run for local runs)
    datasets: tuple[Dataset, ...] = ()  # on every node before torchrun (scripts/job/data_io.py)
    resume_args: tuple[str, ...] = ()  # appended to entry on attempts after the first
    attempt: int = 1  # 2, 3, ...: relaunches after spot recoveries (GPUTRAIN_ATTEMPT)
    resumed: bool = False  # `train --resume`: the run's mirrored state comes back as on a relaunch
    environment: Environment | None = None  # requirements + setup, prepared before torchrun
    # name -> value: only in memory, to the nodes on stdin (scripts/job/environment.py); never shown
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    image: ImageRef | None = None  # torchrun runs inside it (resolved to its digest)
    fabric: str = "none"  # the GPU network the image's container gets (rdma, tcpxo)
    # Vertex: name -> Secret Manager version the job resolves itself (references, not values)
    secret_refs: Mapping[str, str] = field(default_factory=dict)
    watch: WatchSettings | None = None  # telemetry, stall timeout (None: the defaults)


FailureKind = Literal["exited", "killed", "lost"]


@dataclass(frozen=True)
class NodeFailure:
    """The node that failed first and how: `exited` with a nonzero code, `killed` (its processes
    vanished without recording a code), or `lost` (it could not be followed: `error` says why).
    A recovery asks the cloud about `killed` and `lost` nodes before calling them crashes."""

    node: str
    kind: FailureKind
    exit_code: int | None  # torchrun's (the CLI's own exit code follows it)
    root_cause: tuple[str, ...]
    error: BaseException | None = None
    # the failed worker's exit code as torchrun reported it (negative: the signal that killed it)
    worker_exit_code: int | None = None

    @property
    def code_text(self) -> str:
        """How the node ended, in words: the worker's own exit code or signal when torchrun
        reported it (torchrun itself exits 1 for any worker's failure)."""
        if self.kind == "lost":
            return f"exit code unknown: {self.error}"
        if self.exit_code is None:
            return "exit code none: its processes were killed"
        if self.exit_code != 0 and self.worker_exit_code is not None:
            return exit_text(self.worker_exit_code)
        return f"exit code {self.exit_code}"


def exit_text(code: int) -> str:
    """`exit code 3`, or `killed by SIGKILL` for torchrun's -9 (a worker's code as its report
    gives it). Pure."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


@dataclass(frozen=True)
class Recovery:
    """One spot preemption the run survived: which node(s), when, how long until training ran
    again, and the work done twice."""

    nodes: tuple[str, ...]
    preempted_at: float  # unix time: the preemption operation, else when it was noticed
    downtime_s: float  # until the first step after the relaunch (or the relaunch's end)
    zone: str
    resumed_from: int | None  # the step training resumed from (None: the entry prints no steps)
    steps_repeated: int | None  # steps trained before the preemption that were trained again
    cause: str = "preempted"  # or "lost to a GPU fault" (scripts/watch: an Xid, ECC errors)
    unit: str = "step"  # what resumed_from and steps_repeated count ("epoch": the trainer's own)


@dataclass(frozen=True)
class JobResult:
    run_id: str
    ok: bool
    exit_codes: Mapping[str, int | None]
    duration_s: float
    results_dir: Path
    failed_node: str | None = None
    root_cause: tuple[str, ...] = ()
    recoveries: tuple[Recovery, ...] = ()


class TrainingError(GputrainError):
    """The job failed; `failure` names the node, how it failed and the root-cause lines; the
    results of every node were still downloaded (`result`)."""

    def __init__(self, message: str, *, failure: NodeFailure, result: JobResult) -> None:
        super().__init__(message)
        self.failure = failure
        self.result = result
        self.results_missing: dict[str, str] = {}  # node -> why its results are not home

    @property
    def node(self) -> str:
        return self.failure.node

    @property
    def node_exit_code(self) -> int | None:
        """The node's torchrun exit code (None: killed or lost)."""
        return self.failure.exit_code


class BudgetReached(TrainingError):
    """The head's watchdog stopped the job at the run's budget: a stop asked for, with a
    checkpoint (scripts/job/autodown.py: budget_reached), reported as such and not as a crash."""

    def __init__(
        self,
        message: str,
        *,
        error: TrainingError,
        spent_usd: float,
        budget_usd: float,
        what: str = "the budget",  # or the stack's Cloud Billing budget (billingBudget)
    ) -> None:
        super().__init__(message, failure=error.failure, result=error.result)
        self.results_missing = error.results_missing
        self.spent_usd, self.budget_usd, self.what = spent_usd, budget_usd, what


def validate_job(job: Job) -> None:
    """One clear line for each kind of bad job setting (UserError)."""
    check_run_id(job.run_id, "run id")
    if not job.entry:
        raise UserError("entry: empty; give a script or '-m module' (default: -m trainer.train)")
    for name in job.env:
        if not _ENV_NAME.match(name):
            raise UserError(
                f"env: variable name {name!r} is not allowed; use letters, digits and '_'"
            )
    if not 0 <= job.max_restarts <= MAX_RESTARTS:
        raise UserError(f"max restarts: {job.max_restarts} is not allowed; use 0..{MAX_RESTARTS}")
    if job.rdzv_port is not None and not 1024 <= job.rdzv_port <= 65535:
        raise UserError(f"rendezvous port: {job.rdzv_port} is not allowed; use 1024..65535")
    if job.nproc_per_node is not None and job.nproc_per_node < 1:
        raise UserError(f"nproc per node: {job.nproc_per_node} is not allowed; use >= 1")
