"""The one seam between the lifecycle and where jobs run.

A `Target` is a GCP stack, a hosts file, this machine — and next a Vertex AI job, which has no
fleet and no SSH. So the top level assumes neither: it plans, creates and destroys what the target
owns, and hands out a `Session` for work on something that exists. A session proves the machines,
runs a job (the caller picks the run id, so a recovery can relaunch it), follows logs and opens a
shell — raising UserError for whatever does not apply to it.

Every target and session is handed the run's SignalGuard: Ctrl-C and SIGTERM become one exception
in the main thread, so every `finally` tears down; a Ctrl-C while teardown runs is answered, not
obeyed: teardown is sacred. A teardown that says what it leaves and what still ends it server-side
(a stack's: its machines' maxRunDuration) lets a second Ctrl-C within STOP_WINDOW_S stop waiting.
"""

from __future__ import annotations

import enum
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from infra.base.errors import EXIT_INTERRUPTED, GputrainError, UserError
from infra.datasets import Dataset
from scripts import ui
from scripts.job.environment import EnvironmentSettings
from scripts.job.records import Job, JobResult

if TYPE_CHECKING:
    from infra.schema import StackSettings
    from infra.spec import ClusterSpec
    from infra.vertex_pools import PoolShape
    from scripts.job.container import ImageRef
    from scripts.job.image_build import PlannedBuild
    from scripts.notify import Notifier
    from scripts.transport.base import Transport


class Feature(enum.Enum):
    """What a target may be able to do (SkyPilot's CloudImplementationFeatures). A target
    declares the ones it lacks, with why; the run plan refuses an option needing one of them."""

    DETACH = "detach"  # --detach: leave the job running on its own
    RESUME = "resume"  # train --resume RUN: find the run's checkpoints (bucket or nodes)
    BUILD = "build"  # --build / `build`: an image built into the target's own registry
    RECREATE_NODES = "recreate nodes"  # --max-recoveries: re-create nodes the cloud took away
    AUTODOWN = "autodown"  # --autodown: delete the machines once the job ends
    SSH = "ssh"  # a shell on a node, `top`, an image checked on the nodes
    EXPORT_JOB = "export the job"  # plan --export: the job as a file another tool submits


@dataclass(frozen=True)
class Capabilities:
    """A target's features, as data: every Feature but those in `lacking` (-> why, in the
    user's words, the end of a one-line refusal)."""

    lacking: Mapping[Feature, str] = field(default_factory=dict)

    def __contains__(self, feature: object) -> bool:
        return feature not in self.lacking

    def require(self, feature: Feature, option: str) -> None:
        """UserError `OPTION: why` when the target lacks `feature`."""
        if feature in self.lacking:
            raise UserError(f"{option}: {self.lacking[feature]}")


@dataclass(frozen=True)
class Declared:
    """What a target's own file declares for a run, read once before anything is created."""

    name: str  # runs/<name>/<run-id>/ holds the results
    label: str  # what notifications call the target: the stack's name, else `name`
    datasets: tuple[Dataset, ...] = ()  # the file's `data`
    environment: EnvironmentSettings = field(default_factory=EnvironmentSettings)  # setup...
    notify: tuple[str, ...] = ()  # the file's `notify` webhook URLs
    spec: ClusterSpec | None = None  # a stack's validated spec
    stack_settings: StackSettings | None = None  # a stack file's keys, typed (infra/schema.py)
    # a Vertex job file's pools (index, shape), which the spending caps price in place of `spec`'s
    job_pools: Sequence[tuple[int, PoolShape]] | None = None


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


@dataclass(frozen=True)
class Footprint:
    """The machines a session's run occupies, as the cost ledger records a run that has no
    stack spec to tell them (scripts/cost/ledger.py)."""

    nodes: int
    machine: str  # a machine type; "local" or "hosts" for machines gputrain did not make
    gpus_per_node: int
    zones: tuple[str, ...] = ()  # a stack's, in order: a recovery may move its cluster


class Session(Protocol):
    """Work on a target that exists."""

    name: str  # the target's name: results go to runs/<name>/<run-id>/
    hourly_usd: float | None  # what it costs while it exists; None: nothing billed by us
    # unix time its machines began to bill for this run: a stack's from its VMs' creation during
    # `up` (the capacity wait and the prompt before are not the run's), on Vertex AI when the job
    # began to run; None: not yet
    billed_since: float | None
    keep: bool  # a created target outlives the command (set by `up` once it is proven)
    notifier: Notifier | None  # set by the lifecycle: a recovery's events go to it

    @property
    def node_count(self) -> int | None:
        """The machines it runs on (None: not ours to count, e.g. Vertex's replicas)."""
        ...

    @property
    def spec(self) -> ClusterSpec | None:
        """A stack's spec of the cluster as it was made (the `gpus` candidate, the capacity of
        a list that `up` got), which its cost record describes; None: not a stack."""
        ...

    @property
    def partial_usd(self) -> float | None:
        """What making it billed before `billed_since` for this run: the VMs that `up`'s partial
        creates made and destroyed (every round's, before the attempt that made the cluster
        too); None: their price is unknown."""
        ...

    def footprint(self) -> Footprint:
        """What a run here occupies, for the cost ledger."""
        ...

    def ledger_bucket(self) -> tuple[Any, str, str] | None:
        """(storage, bucket, prefix) the run's cost-ledger record also goes to; None: runs/
        on this machine only."""
        ...

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

    def run_detached(self, job: Job, guard: SignalGuard) -> float:
        """Start the job, return once it trains (Feature.DETACH)."""
        ...

    def has_run(self, run_id: str) -> bool:
        """Anything of the run where its checkpoints would be (Feature.RESUME)."""
        ...

    def latest_run(self) -> str | None:
        """The last run the target knows of (another machine's `run`), if it can tell."""
        ...

    def verify_image(self, image: ImageRef) -> None:
        """Every node can run the image and sees its GPUs in it (Feature.SSH)."""
        ...

    @property
    def transports(self) -> Mapping[str, Transport]:
        """A connection to each node (Feature.SSH)."""
        ...


class Target(Protocol):
    """Where jobs run; one implementation per module in scripts/targets/."""

    name: str

    @property
    def capabilities(self) -> Capabilities:
        """What the target can do (the rest it lacks, with why): data, no I/O."""
        ...

    def declared(self) -> Declared:
        """What the target's file declares for a run (the file read once)."""
        ...

    def planned_build(self, opts: RunOptions) -> PlannedBuild | None:
        """The image to build (`--build`, a stack's `build`), checked; None: nothing to build."""
        ...

    def built_image(self, opts: RunOptions) -> ImageRef | None:
        """The planned build's image in the registry (built now if it is not there yet)."""
        ...

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

    def sweep(self) -> bool:
        """List whatever the target left behind; True if anything is."""
        ...

    def provisioned(self, opts: RunOptions, guard: SignalGuard) -> AbstractContextManager[Session]:
        """Create the target for one command and yield its session; afterwards destroy it —
        after any failure, Ctrl-C or SIGTERM too — unless opts.keep or session.keep."""
        ...

    def attached(
        self, opts: RunOptions, *, for_run: bool = False
    ) -> AbstractContextManager[Session]:
        """A session on what exists already (nothing is created or destroyed). `for_run`: a job
        is to be launched on it (`train`): a stack whose file no longer describes what is up is
        refused, since the run's caps, budget and recoveries go by the file."""
        ...


class Interrupted(GputrainError):
    """The user pressed Ctrl-C or the controller got SIGTERM."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(f"interrupted by {name}")
        self.signum = signum


class StoppedWaiting(KeyboardInterrupt):
    """The user stopped waiting for a teardown (a second Ctrl-C): not an Exception, so no step's
    `except Exception` takes it for its own failure; the CLI says its line (exit 130)."""


STOP_WINDOW_S = 5.0  # a second Ctrl-C this soon after the first stops waiting for a teardown


class SignalGuard:
    """Turns SIGINT/SIGTERM into `Interrupted` until teardown starts; afterwards only reports,
    or, where the teardown offers a way out, lets a second Ctrl-C stop waiting."""

    def __init__(self) -> None:
        self.tearing_down = False
        self.received: list[int] = []
        self._way_out: str | None = None
        self._offered_at: float | None = None  # the Ctrl-C that offered the way out
        self._stopping = False  # the user took it

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if not self.tearing_down:
            raise Interrupted(signum)
        if self._way_out is None:
            ui.warn("teardown is in progress and will finish; nothing is left running")
            return
        now = time.monotonic()
        if signum == signal.SIGINT and (
            self._stopping
            or (self._offered_at is not None and now - self._offered_at <= STOP_WINDOW_S)
        ):
            self._stopping = True  # a Ctrl-C while that wait ends: at once
            raise StoppedWaiting(f"stopped waiting: {self._way_out}")
        offer = ""
        if signum == signal.SIGINT:
            self._offered_at = now
            offer = (
                f"; press Ctrl-C again within {STOP_WINDOW_S:.0f} s to stop waiting: "
                f"{self._way_out}"
            )
        ui.warn("teardown is in progress and goes on" + offer)

    @contextmanager
    def teardown(self, way_out: str | None = None) -> Iterator[None]:
        """Run the enclosed block with signals reported instead of raised. `way_out`: what is
        left, and what still ends it server-side, if the user stops waiting (a second Ctrl-C
        within STOP_WINDOW_S raises StoppedWaiting); None: the block always finishes."""
        previous = (self.tearing_down, self._way_out, self._offered_at, self._stopping)
        self.tearing_down, self._way_out, self._offered_at, self._stopping = (
            True,
            way_out,
            None,
            False,
        )
        try:
            yield
        finally:
            self.tearing_down, self._way_out, self._offered_at, self._stopping = previous


@contextmanager
def signal_guard() -> Iterator[SignalGuard]:
    """Install the handlers (main thread only; elsewhere a no-op guard) and restore them after."""
    guard = SignalGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, guard._handle)
    try:
        yield guard
    finally:
        for s, h in old.items():
            signal.signal(s, h)
