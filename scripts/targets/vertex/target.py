"""`--stack NAME` with `backend: vertex`: Vertex AI custom jobs instead of VMs. The stack is small
(the API, the jobs' service account, the bucket) and needs no zone failover; a session submits and
follows jobs (session.py). It fills StackTarget's hooks: a regional preflight, `pulumi up` of the
small stack, the job session; teardown first cancels the stack's jobs and waits for them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.base.errors import UserError
from infra.outputs import Key, VertexOutputs, parse_vertex_outputs
from infra.stackfile import STACK_LABEL
from infra.vertex_pools import PoolShape, env_names
from scripts import ui
from scripts.targets.base import Capabilities, Feature, RunOptions
from scripts.targets.stack.clients import pulumi_line
from scripts.targets.stack.target import StackContext, StackTarget
from scripts.targets.vertex.clients import VertexClients
from scripts.targets.vertex.session import RUN_LABEL, VertexSession, server_side_bound

if TYPE_CHECKING:
    from infra.spec import ClusterSpec
    from scripts.job.records import Job
    from scripts.targets.vertex.job import JobStatus


def reduction_server_lines(
    hourly: float | None, total: float | None, spec: ClusterSpec, *, custom: bool
) -> list[str]:
    """What `plan` says of a Reduction Server pool: its price, when it pays, what it needs."""
    cost = "an unknown price" if hourly is None else f"${hourly:,.2f}/h"
    share = f" ({hourly / total:.0%} of the job)" if hourly and total else ""
    needs = (
        "your image must have NCCL >= 2.7 and the google-reduction-server package (Google's apt "
        "line in its Dockerfile)"
        if custom
        else f"{spec.executor_image} is a prebuilt PyTorch container (>= 1.4: it has the plugin)"
    )
    return [
        f"Reduction Server: worker pool 2 at {cost}{share}. It pays when NCCL all-reduce between "
        "the nodes bounds the step (multi-node data-parallel training of large models; Google "
        "measured up to 2x all-reduce bandwidth); small models or one node gain nothing.",
        f"  the training replicas use it through NCCL's reduction-server plugin: {needs}; "
        "NCCL_DEBUG=INFO in their env shows the plugin loading.",
    ]


Context = StackContext[VertexClients]


class VertexTarget(StackTarget[VertexClients, None]):
    """A stack of what Vertex AI jobs need; its sessions submit and follow the jobs."""

    running: tuple[JobStatus, ...] = ()  # the stack's jobs the last sweep found not ended

    def _project(self) -> tuple[ClusterSpec, str]:
        spec = self.spec_with_project()
        return spec, str(spec.project)

    def _outputs(self) -> VertexOutputs | None:
        raw = self.runner.outputs()
        if isinstance(raw.get(Key.NODES), list):  # VMs: made while the file said backend gce
            raise UserError(
                f"stack {self.stack} is up with backend gce (it has VMs); "
                f"`gputrain down --stack {self.stack}` first, then use it with backend vertex"
            )
        return parse_vertex_outputs(raw) if raw else None

    @property
    def capabilities(self) -> Capabilities:
        """Vertex AI runs the job on replicas of its own: gputrain has no VMs to log in to,
        re-create or delete; a detached job runs on server-side, `logs` follows it again."""
        on_vertex = f"stack {self.stack} runs on Vertex AI"
        return Capabilities(
            {
                Feature.RESUME: f"{on_vertex}, where gputrain keeps no run to resume (yet)",
                Feature.RECREATE_NODES: f"{on_vertex}, where gputrain re-creates no VMs; "
                "allowed only for backend gce stacks",
                Feature.AUTODOWN: f"{on_vertex}: a job's replicas end with it, nothing to delete",
                Feature.SSH: f"{on_vertex}, which gives no SSH to its replicas",
            }
        )

    # ---- commands that need no stack

    def keygen(self, *, force: bool) -> None:
        raise UserError(
            f"keygen: stack {self.stack} has backend vertex: Vertex AI runs the job, "
            "there are no VMs to log in to"
        )

    def status(self) -> None:
        spec, project = self._project()
        out = self._outputs()
        where = f"bucket gs://{out.bucket}, jobs run as {out.service_account}" if out else "not up"
        ui.say(f"status: stack {self.stack} (Vertex AI, {spec.region}): {where}")
        jobs = self.clients.api(project, spec.region).list_jobs({STACK_LABEL: self.stack})
        if not jobs:
            ui.say(f"status: stack {self.stack} has no Vertex jobs")
            return
        now = dt.datetime.now(dt.timezone.utc)
        rows = []
        for j in jobs:
            began = j.start_time or j.create_time
            bound = j.timeout_s or spec.max_run_duration_s  # a job file's may be shorter
            left = (
                "-"
                if j.done or began is None
                else f"{max(0.0, (began - now).total_seconds() + bound):.0f} s"
            )
            rows.append([j.job_id, j.labels.get(RUN_LABEL, "?"), j.short_state, left])
        ui.table(
            f"status: Vertex jobs of stack {self.stack}",
            ["job", "run", "state", "cut off by Vertex in"],
            rows,
        )

    def sweep(self) -> bool:
        leftovers = self.leftovers(self.context(self.spec(), RunOptions()))
        if not leftovers:
            ui.say(f"sweep: nothing of stack {self.stack} is left (no job running, no bucket)")
        return bool(leftovers)

    # ---- plan: the pools, priced; the job as a file

    def _file_pools(self, spec: ClusterSpec) -> tuple[dict[str, Any], list[tuple[int, PoolShape]]]:
        from scripts.targets.vertex.jobfile import read_job_file

        return read_job_file(
            self.settings.root,
            spec.vertex_job_spec,
            capacity=spec.capacity,
            max_run_duration_s=spec.max_run_duration_s,
        )

    def job_pools(self, spec: ClusterSpec) -> list[tuple[int, PoolShape]] | None:
        """With vertexJobSpec the file's pools are the job: the spending caps price them."""
        return self._file_pools(spec)[1] if spec.vertex_job_spec else None

    def _planned_outputs(self, spec: ClusterSpec) -> VertexOutputs:
        """What `up` will make: the stack's bucket and service account, by their names."""
        from infra.stackfile import service_account_id

        project = spec.project or "PROJECT"  # `plan` without gcp:project; export refuses it
        bucket = spec.bucket_name or f"BUCKET-OF-{self.stack}"
        account = f"{service_account_id(self.stack)}@{project}.iam.gserviceaccount.com"
        return VertexOutputs(project, spec.region, bucket, spec.bucket_prefix, account)

    def plan(self) -> None:
        """The stack's plan (or the file's pools instead of the stack's shape), each pool
        priced, what Reduction Server costs and when it pays, and whether this Python's Vertex
        client can send the job."""
        from infra.vertex_pools import POOL_HEADERS, pool_rows, price_pools, total_hourly
        from scripts.run_plan import caps_line, check_spending_caps
        from scripts.targets.vertex.jobfile import replaced_fields
        from scripts.targets.vertex.preflight import aiplatform_problem

        spec = self.spec()
        if spec.vertex_job_spec:
            doc, shapes = self._file_pools(spec)
            check_spending_caps(spec, None, shapes)  # the file's pools are what bills
            ui.say(
                f"plan: stack {self.stack} (Vertex AI, {spec.region}) submits "
                f"{spec.vertex_job_spec} as it is; machineType, gpus and nodes are not used"
            )
            account = self._planned_outputs(spec).service_account
            for field in replaced_fields(doc, service_account=account, build=spec.build):
                ui.say(f"  the stack sets {field}")
        else:
            super().plan()
            shapes = spec.vertex_pools()
        priced = price_pools(shapes, spec.region, spot=spec.spot)
        mode = "Spot" if spec.spot else "on-demand"
        ui.table(f"Vertex AI worker pools ({mode}, with the training premium)", POOL_HEADERS,
                 pool_rows(priced))  # fmt: skip
        if spec.chief is not None or spec.reduction_server is not None:
            ui.say(
                "the job's price is these pools' total (the first table prices every node alike)"
            )
        reducers = next((p for p in priced if p.shape.reducers), None)
        if reducers is not None:
            custom = bool(spec.build or spec.vertex_job_spec or self.environment_settings().image)
            for line in reduction_server_lines(
                reducers.hourly, total_hourly(priced), spec, custom=custom
            ):
                ui.say(line)
        if spec.vertex_job_spec and (spec.budget is not None or spec.max_hourly_cost is not None):
            ui.say(caps_line(spec, shapes))
        problem = aiplatform_problem()
        if problem:
            ui.warn(problem)

    def export_job(self, job: Job, path: Path, *, force: bool) -> None:
        """`plan --export FILE`: the CustomJobSpec the next run would submit (run id included:
        read back by `vertexJobSpec`, that run's id takes its place)."""
        from scripts.targets.vertex.jobfile import write_job_file

        spec = self.spec_with_project()  # the file names the stack's bucket and account
        if spec.build and not spec.vertex_job_spec:
            raise UserError(
                f"--export: stack {self.stack} has build: {spec.build}, whose image exists only "
                "once `up` built it; export after removing build (with image: REGISTRY/PATH:TAG)"
            )
        session = VertexSession(spec, self._planned_outputs(spec), self.clients, self.settings)
        body = session.job_body(job, stage=False)
        write_job_file(path, body["jobSpec"], force=force)
        ui.say(
            f"plan: wrote the CustomJobSpec to {path} (env names: "
            f"{', '.join(env_names(body['jobSpec'])) or 'none'}; secrets travel as references); "
            f"gcloud ai custom-jobs create --region={spec.region} --display-name=NAME "
            f"--config={path}"
        )

    # ---- creating and destroying: StackTarget's skeleton, these hooks

    def prepare(self, ctx: Context) -> None:
        from scripts.targets.vertex.preflight import aiplatform_problem

        spec = ctx.spec
        problem = aiplatform_problem()  # even with --skip-preflight: nothing would submit
        if problem:
            raise UserError(f"{problem}; nothing was created")
        if spec.vertex_job_spec:  # the file's pools, checked before anything is created
            _, shapes = self._file_pools(spec)
            ui.say(
                f"preflight: {spec.vertex_job_spec}: {len(shapes)} pool(s) of machine types "
                "Vertex runs; the stack's own machineType is not used, so not checked"
            )
        elif not ctx.opts.skip_preflight:
            from scripts.targets.vertex.preflight import preflight_region

            preflight_region(ctx.spec, ctx.clients.compute())

    @contextmanager
    def create(self, ctx: Context, prepared: None) -> Iterator[VertexSession]:
        ui.say(f"up: stack {ctx.stack}: the Vertex AI API, a service account, the bucket")
        outputs = parse_vertex_outputs(ctx.runner.up(on_output=pulumi_line))
        yield VertexSession(ctx.spec, outputs, ctx.clients, ctx.settings, keep=ctx.opts.keep)

    def kept_message(self, ctx: Context) -> str:
        return (
            f"stack {ctx.stack} stays up (its bucket and service account cost "
            f"nothing while no job runs); `gputrain down --stack {ctx.stack}` ends it"
        )

    def ends_server_side(self, ctx: Context) -> str:
        """The bound of the jobs the sweep found running (none yet: any the stack may have)."""
        bound = server_side_bound(ctx.spec, ctx.settings.root, self.running)
        return f"Vertex AI ends its jobs {bound}"

    @contextmanager
    def attached(self, opts: RunOptions, *, for_run: bool = False) -> Iterator[VertexSession]:
        spec = self.spec()  # each run's job is made from the file: nothing up to differ from it
        outputs = self._outputs()
        if outputs is None:
            raise UserError(f"stack {self.stack} is not up; run `gputrain up --stack {self.stack}`")
        yield VertexSession(spec, outputs, self.clients, self.settings)

    def before_destroy(self, ctx: Context) -> None:
        """The stack's jobs cancelled, and waited for, before their bucket is settled."""
        spec = ctx.spec
        assert spec.project is not None  # down and provisioned checked it
        bare = VertexOutputs(spec.project, spec.region, "", "", "")
        VertexSession(spec, bare, ctx.clients, ctx.settings).cancel(None)

    def leftovers(self, ctx: Context, *, kept: str | None = None) -> list[list[str]]:
        """Jobs of the stack not ended, and buckets carrying its label (but one kept on purpose),
        printed loudly."""
        spec, clients, stack = ctx.spec, ctx.clients, ctx.stack
        if not spec.project:
            raise UserError(f"gcp:project is not set for stack {stack}")
        api = clients.api(spec.project, spec.region)
        self.running = tuple(j for j in api.list_jobs({STACK_LABEL: stack}) if not j.done)
        rows = [["Vertex job", j.job_id, spec.region, j.short_state] for j in self.running]
        rows += [
            ["bucket", b.name, b.location, f"label {STACK_LABEL}={stack}"]
            for b in clients.storage(spec.project).list_buckets(spec.project)
            if b.labels.get(STACK_LABEL) == stack and b.name != kept
        ]
        if spec.build:
            from infra.gcp.sweep import repository_leftovers

            found = repository_leftovers(
                clients.artifact_registry(), spec.project, spec.region, stack
            )
            rows += [["repository", r.name, r.location, r.matched_by] for r in found]
        if rows:
            ui.table(f"LEFT BEHIND by stack {stack}", ["kind", "name", "where", "state"], rows)
        return rows
