"""`--stack NAME` with `backend: vertex`: Vertex AI custom jobs instead of VMs. The stack is small
(the API, the jobs' service account, the bucket) and needs no zone failover; a session submits and
follows jobs (vertex_session.py). Teardown cancels the stack's jobs and waits for them, brings the
bucket's results home, empties the stack's own bucket, destroys, and sweeps for anything left.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from infra.base.errors import UserError
from infra.stackfile import STACK_LABEL
from scripts import ui
from scripts.guard import SignalGuard, signal_guard
from scripts.targets.base import RunOptions
from scripts.targets.stack_target import StackTarget, confirm
from scripts.targets.vertex_clients import VertexClients
from scripts.targets.vertex_session import (
    RUN_LABEL,
    VertexOutputs,
    VertexSession,
    parse_vertex_outputs,
)

if TYPE_CHECKING:
    from infra.spec import ClusterSpec
    from scripts.settings import Settings
    from scripts.targets.gce.clients import GceClients


class VertexTarget(StackTarget[VertexClients]):
    """A stack of what Vertex AI jobs need; its sessions submit and follow the jobs."""

    def __init__(
        self, stack: str, settings: Settings, clients: VertexClients, doctor: GceClients
    ) -> None:
        super().__init__(stack, settings, clients)
        self.doctor = doctor  # `gputrain doctor`'s clients (Pulumi, ADC, the project's APIs, IAM)

    def _project(self) -> tuple[ClusterSpec, str]:
        spec = self._spec_with_project()
        return spec, str(spec.project)

    def _outputs(self) -> VertexOutputs | None:
        raw = self.runner.outputs()
        if isinstance(raw.get("nodes"), list):  # VMs: made while the file said backend gce
            raise UserError(
                f"stack {self.stack} is up with backend gce (it has VMs); "
                f"`gputrain down --stack {self.stack}` first, then use it with backend vertex"
            )
        return parse_vertex_outputs(raw) if raw else None

    def _spec_for(self, opts: RunOptions) -> ClusterSpec:
        """The spec, refusing the options that only mean something for VMs."""
        if opts.max_recoveries is not None:
            raise UserError(
                f"--max-recoveries {opts.max_recoveries}: stack {self.stack} runs on Vertex AI, "
                "where gputrain re-creates no VMs; allowed only for backend gce stacks"
            )
        return self.spec()

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
            left = (
                "-"
                if j.done or began is None
                else f"{max(0.0, (began - now).total_seconds() + spec.max_run_duration_s):.0f} s"
            )
            rows.append([j.job_id, j.labels.get(RUN_LABEL, "?"), j.short_state, left])
        ui.table(
            f"status: Vertex jobs of stack {self.stack}",
            ["job", "run", "state", "cut off by Vertex in"],
            rows,
        )

    def sweep(self) -> bool:
        leftovers = self._leftovers(self.spec())
        if not leftovers:
            ui.say(f"sweep: nothing of stack {self.stack} is left (no job running, no bucket)")
        return bool(leftovers)

    # ---- creating and destroying

    def down(self, opts: RunOptions) -> None:
        spec, _ = self._project()
        with signal_guard() as guard, guard.teardown():
            self.teardown(spec, keep_bucket=opts.keep_bucket, clear_stale_lock=True)

    @contextmanager
    def provisioned(self, opts: RunOptions, guard: SignalGuard) -> Iterator[VertexSession]:
        from infra.spec import require_deployable
        from scripts.targets.gce.teardown import pulumi_line
        from scripts.targets.vertex_preflight import preflight_region

        spec = self._spec_for(opts)
        self.check_before_spending(spec, opts, self.doctor)
        require_deployable(spec)
        if not opts.skip_preflight:
            preflight_region(spec, self.clients.compute())
        confirm(spec, yes=opts.yes)
        session: VertexSession | None = None
        try:
            ui.say(f"up: stack {self.stack}: the Vertex AI API, a service account, the bucket")
            outputs = parse_vertex_outputs(self.runner.up(on_output=pulumi_line))
            session = VertexSession(spec, outputs, self.clients, self.settings, keep=opts.keep)
            yield session
        finally:
            keep = session.keep if session is not None else opts.keep
            with guard.teardown():
                if keep:
                    ui.say(
                        f"stack {self.stack} stays up (its bucket and service account cost "
                        f"nothing while no job runs); `gputrain down --stack {self.stack}` ends it"
                    )
                else:
                    self.teardown(spec, keep_bucket=opts.keep_bucket)

    @contextmanager
    def attached(self, opts: RunOptions) -> Iterator[VertexSession]:
        spec = self._spec_for(opts)
        outputs = self._outputs()
        if outputs is None:
            raise UserError(f"stack {self.stack} is not up; run `gputrain up --stack {self.stack}`")
        yield VertexSession(spec, outputs, self.clients, self.settings)

    def teardown(
        self, spec: ClusterSpec, *, keep_bucket: bool = False, clear_stale_lock: bool = False
    ) -> None:
        """The stack's jobs cancelled (waited for), the bucket's results home and the own bucket
        emptied (or kept), destroy (retried), then a sweep that must find nothing."""
        from scripts.targets.gce.bucket import BUCKET_TYPE, settle_bucket
        from scripts.targets.gce.teardown import destroy_stack, end_teardown

        assert spec.project is not None  # down and provisioned checked it
        project = spec.project
        try:
            raw = self.runner.outputs()
        except Exception as e:  # no outputs, no bucket known to us: destroy decides
            ui.warn(f"down: could not read the outputs of stack {self.stack}: {e}")
            raw = {}
        bare = VertexOutputs(project, spec.region, "", "", "")
        VertexSession(spec, bare, self.clients, self.settings).cancel(None)
        kept = settle_bucket(
            raw,
            self.clients.storage(project),
            stack=self.stack,
            runs_dir=self.settings.runs_dir,
            keep=keep_bucket,
        )
        failure = destroy_stack(
            self.runner,
            self.stack,
            attempts=self.clients.destroy_attempts,
            pause_s=self.clients.retry_pause_s,
            clear_stale_lock=clear_stale_lock,
            keep_types=(BUCKET_TYPE,) if kept else (),
        )
        leftovers = self._leftovers(spec, kept=kept.name if kept else None)
        end_teardown(self.stack, failure, len(leftovers), kept)

    def _leftovers(self, spec: ClusterSpec, *, kept: str | None = None) -> list[list[str]]:
        """Jobs of the stack not ended, and buckets carrying its label (but one kept on purpose),
        printed loudly."""
        if not spec.project:
            raise UserError(f"gcp:project is not set for stack {self.stack}")
        api = self.clients.api(spec.project, spec.region)
        rows = [
            ["Vertex job", j.job_id, spec.region, j.short_state]
            for j in api.list_jobs({STACK_LABEL: self.stack})
            if not j.done
        ]
        rows += [
            ["bucket", b.name, b.location, f"label {STACK_LABEL}={self.stack}"]
            for b in self.clients.storage(spec.project).list_buckets(spec.project)
            if b.labels.get(STACK_LABEL) == self.stack and b.name != kept
        ]
        if rows:
            ui.table(f"LEFT BEHIND by stack {self.stack}", ["kind", "name", "where", "state"], rows)
        return rows
