"""What every target made of a Pulumi stack shares — GCE VMs (gce/) or Vertex AI jobs (vertex/):
the stack file read and parsed once per command, ONE provisioning skeleton (check -> prepare ->
confirm -> create -> session -> keep or tear down) with backend hooks, ONE teardown sequence, and
`plan`. A backend implements the hooks; each takes one `StackContext` and returns what it made,
keeping nothing on the target between calls (see each hook's docstring for its contract). `pin`
is the pure spec of a pinned candidate or capacity mode; writing the config is the caller's.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from infra.base.errors import GputrainError, UserError
from scripts import ui
from scripts.job.download import results_missing
from scripts.run_plan import check_spending_caps
from scripts.settings import Settings
from scripts.targets.base import (
    Capabilities,
    Declared,
    Feature,
    RunOptions,
    Session,
    SignalGuard,
    signal_guard,
)
from scripts.targets.stack.clients import StackClients

if TYPE_CHECKING:
    from infra.offer_tables import Check
    from infra.offers import Candidate
    from infra.spec import ClusterSpec
    from infra.stackfile import StackFile
    from infra.vertex_pools import PoolShape
    from scripts.job.container import ImageRef
    from scripts.job.environment import EnvironmentSettings
    from scripts.job.image_build import PendingBuild, PlannedBuild
    from scripts.targets.stack.bucket import KeptBucket
    from scripts.targets.stack.clients import StackRunner

C = TypeVar("C", bound=StackClients)
P = TypeVar("P")  # what a backend's `prepare` hands to its `create`


def target_name(stack: str) -> str:
    """The target a stack is: results go to runs/stack-<name>/."""
    return f"stack-{stack}"


@dataclass(frozen=True)
class StackContext(Generic[C]):
    """What a backend's hook works with, as one argument (SkyPilot's provision verbs take the
    cluster and its provider config): the stack, its file and the spec of this step, the
    Automation runner, the clients, the settings and the command's options. Hooks keep nothing
    on the target between calls and call nothing of the base class."""

    stack: str
    name: str  # the target's name: runs/<name>/
    stack_file: StackFile
    spec: ClusterSpec
    runner: StackRunner
    clients: C
    settings: Settings
    opts: RunOptions

    def at(self, spec: ClusterSpec) -> StackContext[C]:
        """The same context for another spec (a pinned candidate or capacity mode)."""
        return dataclasses.replace(self, spec=spec)


def pin(
    spec: ClusterSpec,
    config: Mapping[str, Any],
    *,
    candidate: Candidate | None = None,
    capacity: str | None = None,
) -> ClusterSpec:
    """The spec `up` creates: a `gpus` candidate (`candidate` + `zone`) and a capacity list's
    mode (`capacityInUse`) pinned on the stack file's config. The spec itself when that changes
    nothing (the stack's own choice: no second parse). Pure: writing the config is the caller's."""
    from infra.offers import candidate_label
    from infra.spec import parse_spec
    from infra.stackfile import NS

    moved = candidate is not None and (candidate.machine_type, candidate.nodes, candidate.zone) != (
        spec.machine_type,
        spec.nodes,
        spec.zone,
    )
    mode = capacity or spec.capacity
    if not moved and mode == spec.capacity:
        return spec
    pinned: dict[str, Any] = {NS + "capacityInUse": mode} if spec.capacity_ladder else {}
    if candidate is not None:
        pinned |= {NS + "candidate": candidate_label(candidate), NS + "zone": candidate.zone}
    return dataclasses.replace(
        parse_spec(dict(config) | pinned, spec.stack), job_reach=spec.job_reach
    )


class StackTarget(Generic[C, P]):
    def __init__(
        self,
        stack: str,
        settings: Settings,
        clients: C,
        *,
        stack_file: StackFile | None = None,
        doctor: StackClients | None = None,
    ) -> None:
        self.stack = stack
        self.name = target_name(stack)
        self.settings = settings
        self.clients = clients
        self.doctor = doctor or clients  # `gputrain doctor`'s clients (its project's APIs, IAM)
        self._stack_file = stack_file
        self._spec: ClusterSpec | None = None
        self._runner: StackRunner | None = None
        self._planned: tuple[PlannedBuild | None] | None = None  # `build`, once per command
        self._built: ImageRef | None = None

    @property
    def runner(self) -> StackRunner:
        if self._runner is None:
            self._runner = self.clients.runner(self.stack, self.settings.root)
        return self._runner

    @property
    def stack_file(self) -> StackFile:
        """Pulumi.yaml + Pulumi.<stack>.yaml, read once per command."""
        if self._stack_file is None:
            from infra.stackfile import read_stack_file

            self._stack_file = read_stack_file(self.settings.root, self.stack)
        return self._stack_file

    def spec(self) -> ClusterSpec:
        """The validated spec, parsed once per command."""
        if self._spec is None:
            from infra.reconciler import job_reach
            from infra.spec import stack_file_spec

            spec = stack_file_spec(self.stack_file)
            reach = job_reach(os.environ, self.stack_file.secrets.provider)
            self._spec = dataclasses.replace(spec, job_reach=reach)
        return self._spec

    @property
    def capabilities(self) -> Capabilities:
        """Everything but the job as a file (a backend declares what it lacks)."""
        return Capabilities({Feature.EXPORT_JOB: "only for --stack targets with backend vertex"})

    def declared(self) -> Declared:
        """What the stack file declares for a run: its spec, `data`, `notify` and the
        environment keys (read once per command)."""
        spec = self.spec()
        return Declared(
            name=self.name,
            label=self.stack,
            datasets=spec.datasets,
            environment=self.environment_settings(),
            notify=spec.notify,
            spec=spec,
            stack_settings=self.stack_file.settings,
            job_pools=self.job_pools(spec),
        )

    def job_pools(self, spec: ClusterSpec) -> Sequence[tuple[int, PoolShape]] | None:
        """A job file's pools that replace the spec's shape (Vertex's vertexJobSpec), for the
        spending caps; None: the spec's own shape is what bills."""
        return None

    def spec_at(self, chosen: Candidate) -> ClusterSpec:
        """The spec with a `gpus` candidate pinned (`candidate` + `zone`), as `up` pins it. The
        stack's own choice is the spec already parsed (pinning it changes nothing)."""
        return pin(self.spec(), self.stack_file.config, candidate=chosen)

    def context(self, spec: ClusterSpec, opts: RunOptions) -> StackContext[C]:
        """The one argument of the backend's hooks."""
        return StackContext(
            self.stack,
            self.name,
            self.stack_file,
            spec,
            self.runner,
            self.clients,
            self.settings,
            opts,
        )

    def spec_with_project(self) -> ClusterSpec:
        """The spec of a stack that can have resources: gcp:project must be set."""
        spec = self.spec()
        if not spec.project:
            raise UserError(
                f"gcp:project is not set for stack {self.stack}; nothing of it can exist"
            )
        return spec

    def environment_settings(self) -> EnvironmentSettings:
        """The stack's `setup`, `secrets` and `image` keys (gputrain reads them; the program
        does not)."""
        from infra.stackfile import GCP_PROJECT_KEY
        from scripts.job.environment import EnvironmentSettings

        typed = self.stack_file.settings  # shapes checked at load: `setup` a string, ...
        return EnvironmentSettings(
            setup=typed.setup,
            secrets=tuple(typed.secrets),
            image=typed.image.strip(),  # vertex: the job's container
            build=self.spec().build,
            project=self.stack_file.config.get(GCP_PROJECT_KEY) or None,
            source="gputrain:",
            backend_without_ssh="vertex" if typed.backend.strip() == "vertex" else None,
        )

    # ---- the backend's hooks: each takes the context, returns what it made

    def spec_for(self, ctx: StackContext[C]) -> ClusterSpec:
        """The spec `up` starts from (pure: nothing is written)."""
        return ctx.spec

    def prepare(self, ctx: StackContext[C]) -> P:
        """Preflight: prove the request can be created; what `create` needs. Nothing bills."""
        raise NotImplementedError

    def create(self, ctx: StackContext[C], prepared: P) -> AbstractContextManager[Any]:
        """`pulumi up`, then a session on what it made (a context: it closes what it opened)."""
        raise NotImplementedError

    def kept_message(self, ctx: StackContext[C]) -> str:
        """What `run --keep`/`up` say about a stack that stays up: what still bills, and until
        when."""
        raise NotImplementedError

    def ends_server_side(self, ctx: StackContext[C]) -> str:
        """What ends the stack's billed machines server-side, whatever becomes of gputrain: said
        where a teardown stops short."""
        raise NotImplementedError

    def before_destroy(self, ctx: StackContext[C]) -> None:
        """Teardown's first step (Vertex: cancel the stack's jobs and wait for them)."""

    def after_destroy(self, ctx: StackContext[C]) -> None:
        """Teardown's step after the destroy (GCE: clear the failover's picks)."""

    def leftovers(self, ctx: StackContext[C], *, kept: str | None = None) -> list[list[str]]:
        """Whatever of the stack still exists (but the bucket `kept` on purpose), printed loudly:
        one row per resource."""
        raise NotImplementedError

    # ---- the skeleton

    @contextmanager
    def provisioned(self, opts: RunOptions, guard: SignalGuard) -> Iterator[Session]:
        """check -> prepare -> confirm -> create -> session -> keep or tear down. Nothing is
        created before the prompt; once anything may exist, no failure, Ctrl-C or SIGTERM skips
        the teardown (unless the user keeps it)."""
        from infra.spec import require_deployable

        ctx = self.context(self.spec(), opts)
        ctx = ctx.at(self.spec_for(ctx))
        spec = ctx.spec
        planned = self.planned_build(opts)  # a missing Dockerfile: one line, first
        # pure: before the doctor asks Google anything
        check_spending_caps(spec, opts.budget, self.job_pools(spec))
        self.check_before_spending(spec, opts)
        require_deployable(spec)
        prepared = self.prepare(ctx)
        confirm(spec, yes=opts.yes)
        pending = self._local_build(planned)  # a Dockerfile that fails: nothing exists yet
        context = tempfile.TemporaryDirectory(prefix="gputrain-reconcile-")
        reconcile = self._reconciler_build(spec, Path(context.name))
        session: Session | None = None
        results_lost: dict[str, str] = {}  # nodes whose results SSH could not bring home
        failed: GputrainError | None = None  # said first, whatever the teardown then says
        try:
            if pending is not None:  # the repository and the image, before any GPU
                self._built = self._publish(spec, pending)
            if reconcile is not None:  # the reconcile job's image, which `up` names
                self._publish(spec, reconcile, build_in_config=True)
            context.cleanup()
            with self.create(ctx, prepared) as session:
                yield session
        except GputrainError as e:
            results_lost = results_missing(e)
            failed = e
            raise
        finally:
            context.cleanup()
            keep = session.keep if session is not None else opts.keep
            with guard.teardown(self.way_out(ctx)):
                if keep:
                    ui.say(self.kept_message(ctx))
                else:
                    if results_lost:
                        ui.warn(
                            f"results of {', '.join(results_lost)} not brought home over SSH: "
                            f"the stack's bucket is kept with what its watchdogs uploaded; "
                            f"`gputrain down --stack {self.stack}` brings it home, then deletes it"
                        )
                    try:
                        self.teardown(
                            spec,
                            keep_bucket=opts.keep_bucket or bool(results_lost),
                            keep_images=opts.keep_images,
                        )
                    except GputrainError as down:
                        if failed is None:
                            raise
                        both = GputrainError(f"{failed}; then {down}")
                        both.exit_code = failed.exit_code
                        raise both from down

    # ---- `build`: the image, before any GPU (scripts/targets/stack/image.py)

    def planned_build(self, opts: RunOptions) -> PlannedBuild | None:
        """`--build` or the stack's `build`, checked and hashed once per command."""
        if self._planned is None:
            from scripts.targets.stack.image import plan_stack_build

            built = plan_stack_build(
                self.spec(), self.stack_file.settings.image, opts, self.settings.root
            )
            self._planned = (built,)
        return self._planned[0]

    def built_image(self, opts: RunOptions) -> ImageRef | None:
        """The image `provisioned` built; on a stack that is up (`train`), built now if the
        registry lacks it. None: nothing to build."""
        if self._built is None:
            pending = self._local_build(self.planned_build(opts))
            if pending is not None:
                self._built = self._publish(self.spec(), pending)
        return self._built

    def _with_build(self, spec: ClusterSpec) -> ClusterSpec:
        """The spec with `--build`'s Dockerfile as its `build` (what the doctor asks for and the
        teardown looks after are the repository's)."""
        planned = self._planned[0] if self._planned else None
        if planned is None or spec.build:
            return spec
        return dataclasses.replace(spec, build=planned.context.dockerfile.as_posix())

    def _local_build(self, planned: PlannedBuild | None) -> PendingBuild | None:
        from scripts.job.image_build import local_build

        return local_build(planned, ui.say) if planned is not None else None

    def _publish(
        self, spec: ClusterSpec, pending: PendingBuild, *, build_in_config: bool = False
    ) -> ImageRef:
        from scripts.targets.stack.image import publish_stack_image

        return publish_stack_image(
            spec,
            pending,
            runner=self.runner,
            clients=self.clients,
            build_in_config=build_in_config or bool(self.spec().build),
        )

    def _reconciler_build(self, spec: ClusterSpec, dest: Path) -> PendingBuild | None:
        """Where the stack declares the reconcile job (infra/reconciler.py): its image, looked
        up and, if the registry lacks its tag, built here (a failure: nothing exists yet)."""
        from infra.reconciler import wanted

        if not wanted(spec.recover, spec.capacity, spec.job_reach):
            return None
        from scripts.targets.stack.image import plan_reconciler_build

        return self._local_build(plan_reconciler_build(spec, self.settings.root, dest))

    def check_before_spending(self, spec: ClusterSpec, opts: RunOptions) -> None:
        """Before anything is created: a money prompt someone can answer (or --yes), then
        `gputrain doctor`'s table, stopping on a failed row (unless --skip-preflight)."""
        if not opts.yes:
            require_terminal(spec)
        if not opts.skip_preflight:
            from scripts.doctor.run import require_doctor

            require_doctor(self.stack_file, self.doctor, self._with_build(spec))

    def up(self, opts: RunOptions) -> None:
        """Create and prove; it stays up. If that fails it is destroyed again."""
        with signal_guard() as guard, self.provisioned(opts, guard) as session:
            session.verify(fabric=True)
            session.keep = True

    def down(self, opts: RunOptions) -> None:
        spec = self.spec_with_project()
        with signal_guard() as guard, guard.teardown(self.way_out(self.context(spec, opts))):
            self.teardown(spec, keep_bucket=opts.keep_bucket, clear_stale_lock=True)

    def way_out(self, ctx: StackContext[C]) -> str:
        """What a user who stops waiting for the teardown (a second Ctrl-C) leaves behind."""
        return (
            f"what the teardown of stack {self.stack} had not destroyed yet stays: "
            f"{self.ends_server_side(ctx)}; `gputrain down --stack {self.stack}` destroys the "
            "rest (and clears the lock a stopped pulumi may leave)"
        )

    def teardown(
        self,
        spec: ClusterSpec,
        *,
        keep_bucket: bool = False,
        clear_stale_lock: bool = False,
        keep_images: bool = False,
    ) -> None:
        """The backend's first step, the bucket's results home and the own bucket emptied (or
        kept), refresh + destroy (retried), the backend's last step, then a sweep that must find
        nothing. `clear_stale_lock` (the user's `down`), or an update of ours that gputrain killed
        (its lock is ours): a lock left by an update whose process died is cleared with `pulumi
        cancel`, said out loud, and destroy goes on. `keep_images`
        (`run --keep-images`, never `down`): the image repository of `build` stays, the build
        cache of the next run."""
        from infra.image_build import REPOSITORY_TYPE, repository_id
        from scripts.targets.stack.bucket import BUCKET_TYPE
        from scripts.targets.stack.teardown import destroy_stack, end_teardown

        # asked first, always: after a kill of ours it lets pulumi start again (outputs, destroy)
        clear_stale_lock = self.runner.left_own_lock() or clear_stale_lock
        spec = self._with_build(spec)
        ctx = self.context(spec, RunOptions(keep_bucket=keep_bucket, keep_images=keep_images))
        images = keep_images and bool(spec.build)
        self.before_destroy(ctx)
        kept = self._settle_bucket(spec, keep_bucket)

        def settle_again() -> tuple[str, ...]:
            """A late writer (a node's last upload) refilled the bucket: home and empty it
            again; kept from then on when its results cannot come home."""
            nonlocal kept
            kept = self._settle_bucket(spec, False)
            return (BUCKET_TYPE,) if kept else ()

        failure = destroy_stack(
            self.runner,
            self.stack,
            attempts=self.clients.destroy_attempts,
            pause_s=self.clients.retry_pause_s,
            clear_stale_lock=clear_stale_lock,
            keep_types=((BUCKET_TYPE,) if kept else ()) + ((REPOSITORY_TYPE,) if images else ()),
            before_retry=None if kept else settle_again,
        )
        self.after_destroy(ctx)
        swept = dataclasses.replace(spec, build="") if images else spec  # the kept one aside
        try:
            leftovers = self.leftovers(ctx.at(swept), kept=kept.name if kept else None)
            unswept = None
        except GputrainError as e:  # no credentials, Google unreachable: say it with the rest
            leftovers, unswept = [], str(e)
        bound = self.ends_server_side(ctx)
        end_teardown(self.stack, failure, len(leftovers), kept, unswept=unswept, bound=bound)
        if images:
            ui.say(
                f"kept: the image repository {repository_id(self.stack)} (the build cache: an "
                f"unchanged context is not built again); `gputrain down --stack {self.stack}` "
                "removes it"
            )

    def _settle_bucket(self, spec: ClusterSpec, keep: bool) -> KeptBucket | None:
        """The bucket the destroy must leave alone, if any (see stack/bucket.py)."""
        from infra.outputs import parse_bucket
        from scripts.targets.stack.bucket import settle_bucket

        try:
            raw = self.runner.outputs()
        except Exception as e:  # no outputs, no bucket known to us: destroy decides
            ui.warn(f"down: could not read the outputs of stack {self.stack}: {e}")
            return None
        return settle_bucket(
            parse_bucket(raw),
            self.clients.storage(spec.project),
            stack=self.stack,
            target=self.name,
            runs_dir=self.settings.runs_dir,
            keep=keep,
        )

    # ---- plan

    def candidate_checks(self, ctx: StackContext[C]) -> Mapping[Candidate, Check] | None:
        """Preflight verdicts on a `gpus` stack's candidates; None where none can be had."""
        return None

    def plan(self) -> None:
        from infra.plan import HEADERS, build_plan

        spec = self.spec()
        check_spending_caps(spec, None, self.job_pools(spec))
        checks = self.candidate_checks(self.context(spec, RunOptions()))
        plan = build_plan(spec, checks)
        chosen = plan.candidates.chosen if plan.candidates else None
        if chosen is not None and (chosen.machine_type, chosen.zone) != (
            spec.machine_type,
            spec.zone,
        ):
            plan = build_plan(self.spec_at(chosen), checks)  # the cheapest that passes preflight
        ui.table(plan.title, HEADERS, [plan.row])
        if plan.candidates is not None:
            shown = plan.candidates
            known = "regions known to offer it on Vertex first, then " if spec.on_vertex else ""
            ui.table(
                f"candidates for gpus = {spec.gpus_request} "
                f"({'Spot' if spec.spot else 'on-demand'}; ranked: {known}fewest nodes, then $/h)",
                list(shown.headers),
                [list(r) for r in shown.rows],
            )
            if shown.footer:
                ui.say(shown.footer)
            if checks is None:
                ui.say(
                    "preflight: not checked here (needs gcp:project and Google credentials; "
                    f"`gputrain doctor --stack {spec.stack}`); `up` checks before creating"
                )
            if shown.chosen is None:
                ui.warn("no candidate passed preflight: see the reasons above")
        for line in plan.footer_lines():
            ui.say(line)
        if spec.budget is not None or spec.max_hourly_cost is not None:
            from scripts.run_plan import caps_line

            ui.say(caps_line(spec, self.job_pools(spec)))
        if spec.billing_budget is not None:
            from infra.billing import guard_line

            ui.say(guard_line(spec.billing_budget, spec.stack))
        self._plan_build(spec)

    def _plan_build(self, spec: ClusterSpec) -> None:
        """`build`: the image and whether `up` will build it."""
        if spec.build:
            from scripts.targets.stack.image import build_plan_lines

            planned = self.planned_build(RunOptions()) if spec.project else None
            for line in build_plan_lines(spec, planned):
                ui.say(line)


def require_terminal(spec: ClusterSpec) -> None:
    """Without a terminal nobody can answer the money prompt: a nohup or CI run must say --yes."""
    if sys.stdin.isatty():
        return
    from infra.offer_tables import money
    from infra.plan import build_plan

    plan = build_plan(spec)
    raise UserError(
        f"stdin is not a terminal, so nobody can confirm spending ~{money(plan.hourly_total)}/h "
        f"(at most {money(plan.worst_case)}) on stack {spec.stack}: pass --yes to proceed; "
        "nothing was created"
    )


def confirm(spec: ClusterSpec, *, yes: bool) -> None:
    """Ask before spending money (require_terminal made sure someone can answer)."""
    if yes:
        return
    from infra.plan import build_plan

    plan = build_plan(spec)
    shape = f"{spec.nodes} x {spec.machine_type} ({spec.gpus_per_node} x {spec.gpu_model} each)"
    if spec.on_vertex:
        what = f"run Vertex AI jobs of {shape}: {plan.cost} per job before Vertex cuts it off"
    else:
        what = f"create {shape}: {plan.cost} before the VMs delete themselves"
    ui.say(f"About to {what}.")
    if input("Proceed? [y/N] ").strip().lower() not in ("y", "yes"):
        raise UserError("cancelled; nothing was created")
