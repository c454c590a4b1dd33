"""The session of a Vertex AI stack: nothing to connect to. A job is the working directory and the
trainer packaged as an sdist, staged in the stack's bucket, submitted as a CustomJob, followed to
its end (state changes with times, the replicas' log lines with [replica] prefixes) and brought
home from the bucket. A failure, Ctrl-C or SIGTERM cancels the job and waits until Vertex says it
ended, so nothing keeps billing.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from infra import vertex
from infra.base.errors import GputrainError, UserError
from infra.datasets import vertex_data_env
from infra.disk_prices import cluster_hourly
from infra.gcp.gcs import StorageApi
from infra.keys import format_duration
from infra.outputs import VertexOutputs
from infra.spec import ClusterSpec
from infra.stackfile import PROJECT, PROJECT_LABEL, STACK_LABEL
from infra.vertex_pools import PoolShape, price_pools, total_hourly
from scripts import ui
from scripts.job.data_io import vertex_output_env
from scripts.job.download import write_job_record
from scripts.job.environment import secret_refs_env
from scripts.job.launch import TRAINER_DIR
from scripts.job.records import Job, JobResult, NodeFailure, TrainingError, validate_job
from scripts.settings import Settings
from scripts.targets.base import Footprint, SignalGuard
from scripts.targets.stack.bucket import to_fetch
from scripts.targets.stack.target import target_name
from scripts.targets.vertex.clients import VertexClients
from scripts.targets.vertex.environment import environment_env
from scripts.targets.vertex.job import (
    DEFAULT_FLEX_START_WAIT_S,
    SDIST_FILE,
    SECRETS_REQUIREMENT,
    JobRequest,
    JobStatus,
    build_sdist,
    custom_job_body,
    describe_pools,
    failure_message,
    gcs_fuse_path,
    parse_duration_s,
    run_output_dir,
    scheduling,
    staging_dir,
    state_line,
)
from scripts.targets.vertex.jobfile import job_spec_for_run, read_job_file
from scripts.transport.safe_path import SafeTree

if TYPE_CHECKING:
    from scripts.job.container import ImageRef
    from scripts.notify import Notifier
    from scripts.targets.vertex.api import Followed
    from scripts.transport.base import Transport

RUN_LABEL = "gputrain-run"  # on every job: how a run's job is found again (logs, a lost create)
JOB_RECORD = "vertex-job.json"  # runs/<target>/<run-id>/: which job a run was
LOG_FILE = "vertex.log"  # runs/<target>/<run-id>/: every log line the controller saw


def run_label(run_id: str) -> str:
    """A run id as a label value (lowercase a-z 0-9 _ -, at most 63)."""
    return re.sub(r"[^a-z0-9_-]", "_", run_id.lower())[:63]


def stack_labels(spec: ClusterSpec) -> dict[str, str]:
    """The labels every job of the stack carries (as its resources do), the user's included."""
    return {STACK_LABEL: spec.stack, PROJECT_LABEL: PROJECT, **spec.labels}


def server_side_bound(spec: ClusterSpec, root: Path, jobs: Sequence[JobStatus | None]) -> str:
    """When Vertex ends the last of `jobs` (None: one whose resource was not seen), with where
    that comes from: the scheduling.timeout each was submitted with, as Vertex reports it; for
    one not seen, the bound a job of the stack is submitted with now (_submitted_bound)."""
    bounds = [
        (j.timeout_s, "the scheduling.timeout each was submitted with")
        for j in jobs
        if j is not None and j.timeout_s
    ]
    if not jobs or len(bounds) < len(jobs):
        bounds.append(_submitted_bound(spec, root))
    seconds, source = max(bounds)
    return f"{format_duration(math.ceil(seconds))} after they started at the latest ({source})"


def _submitted_bound(spec: ClusterSpec, root: Path) -> tuple[float, str]:
    """The vertexJobSpec file's scheduling.timeout (it may be shorter than maxRunDuration, never
    longer: check_scheduling), else maxRunDuration, which gputrain sends in its place."""
    if spec.vertex_job_spec:
        from scripts.targets.vertex.jobfile import read_job_file

        try:
            doc, _ = read_job_file(
                root,
                spec.vertex_job_spec,
                capacity=spec.capacity,
                max_run_duration_s=spec.max_run_duration_s,
            )
        except GputrainError:  # not readable now: the stack's bound holds all the same
            doc = {}
        timeout = parse_duration_s((doc.get("scheduling") or {}).get("timeout"))
        if timeout:
            return timeout, f"scheduling.timeout in {spec.vertex_job_spec}"
    return float(spec.max_run_duration_s), "maxRunDuration, sent as their scheduling.timeout"


def bring_home(storage: StorageApi, out: VertexOutputs, run_id: str, results_dir: Path) -> None:
    """The run's files in the bucket (runs/<run-id>/: model/, checkpoints/...) into results_dir:
    every small file and the newest complete checkpoint, as `down` brings runs home."""
    fetch = to_fetch(storage, out.bucket, out.bucket_prefix, {run_id: results_dir})
    tree = SafeTree(results_dir)  # the one rule of every download path
    for f in fetch:
        storage.download(out.bucket, f.obj.name, tree.file(f.relative))
    if fetch:
        ui.say(f"vertex: brought {len(fetch)} file(s) of run {run_id} home into {results_dir}")


class VertexSession:
    """Jobs on one Vertex stack that exists (its bucket and service account)."""

    def __init__(
        self,
        spec: ClusterSpec,
        outputs: VertexOutputs,
        clients: VertexClients,
        settings: Settings,
        *,
        keep: bool = False,
    ) -> None:
        self.spec, self.out, self.clients, self.settings = spec, outputs, clients, settings
        self.name = target_name(spec.stack)
        self.hourly_usd: float | None = cluster_hourly(spec)  # the job's pools, once known
        self.billed_since: float | None = None  # the job's start, once Vertex says it ran
        self.partial_usd: float | None = 0.0  # nothing bills before the job runs
        self.keep = keep
        self.notifier: Notifier | None = None  # nothing is preempted under us
        self.api = clients.api(outputs.project, outputs.region)
        self.jobs_seen: dict[str, JobStatus] = {}  # each job's latest resource: its own timeout

    def verify(self, fabric: bool = False) -> None:
        """What can be proven before a job: the stack's bucket answers, Vertex offers the shape
        in the region. The GPUs are Vertex's to provide: there is no SSH to look at them."""
        if not self.clients.storage(self.out.project).bucket_exists(self.out.bucket):
            raise GputrainError(
                f"verify: bucket gs://{self.out.bucket} of stack {self.spec.stack} does not exist; "
                f"run `gputrain up --stack {self.spec.stack}`"
            )
        # that Vertex runs the shape at all, parse_spec checked (vertex_problem)
        regions = vertex.vertex_regions(self.spec.accelerator)
        known = regions is None or self.out.region in regions
        shape = (
            f"the pools of {self.spec.vertex_job_spec}"
            if self.spec.vertex_job_spec
            else f"{self.spec.nodes} x {self.spec.machine_type} "
            f"({'a region known to offer' if known else 'region not known to offer'} "
            f"{self.spec.accelerator})"
        )
        ui.say(
            f"verify: stack {self.spec.stack} on Vertex AI in {self.out.region}: bucket "
            f"gs://{self.out.bucket}, jobs run as {self.out.service_account}; {shape}. "
            "Vertex provides the GPUs; there is no SSH to check them"
        )

    # ---- a job

    def run_job(self, job: Job, results_dir: Path, guard: SignalGuard) -> JobResult:
        """Package, stage, submit, follow, bring home. Any failure or signal cancels the job."""
        validate_job(job)
        if job.max_restarts:
            ui.warn("--max-restarts is not applied on Vertex AI (its replicas run torchrun once)")
        if job.environment is not None and job.environment.force:
            ui.warn("--force-setup changes nothing on Vertex AI: every job's replicas are new")
        started = time.monotonic()
        created: JobStatus | None = None
        try:
            created = self._submit(job, results_dir)
            with (results_dir / LOG_FILE).open("a") as log:
                followed = self._follow(created.name, log)
        except BaseException:
            with guard.teardown():  # nothing may keep running: cancel, wait, then re-raise
                self.cancel(created.name if created else None, job.run_id)
            raise
        bring_home(self.clients.storage(self.out.project), self.out, job.run_id, results_dir)
        status = followed.status
        result = JobResult(
            job.run_id,
            status.succeeded,
            {"vertex": 0 if status.succeeded else None},
            time.monotonic() - started,
            results_dir,
            None if status.succeeded else f"vertex job {status.job_id}",
            () if status.succeeded else followed.last_lines,
        )
        write_job_record(result)
        if not status.succeeded:
            failure = NodeFailure(result.failed_node or "vertex", "exited", None, result.root_cause)
            raise TrainingError(
                failure_message(status, followed.last_lines) + f"\nlogs and results: {results_dir}",
                failure=failure,
                result=result,
            )
        return result

    def _submit(self, job: Job, results_dir: Path) -> JobStatus:
        """Stage and create the job; which job the run is, recorded in results_dir."""
        results_dir.mkdir(parents=True, exist_ok=True)
        body = self.job_body(job, stage=True)
        created = self.api.create_job(body)
        self.jobs_seen[created.name] = created
        (results_dir / JOB_RECORD).write_text(
            json.dumps({"name": created.name, "run_id": job.run_id}, indent=2) + "\n"
        )
        ui.say(
            f"vertex: job {created.job_id} submitted: {describe_pools(body['jobSpec'])}, "
            f"cut off after {body['jobSpec']['scheduling'].get('timeout', '?')}"
        )
        return created

    def run_detached(self, job: Job, guard: SignalGuard) -> float:
        """`--detach`: submit the job and return; Vertex runs it to its end with nothing of
        ours alive (its scheduling.timeout bounds it). A failed or interrupted submit cancels
        whatever was created. The seconds it took to submit."""
        validate_job(job)
        started = time.monotonic()
        try:
            created = self._submit(job, self.settings.results_dir(self.name, job.run_id))
        except BaseException:
            with guard.teardown():  # the create may have gone through unseen: find it by label
                self.cancel(None, job.run_id)
            raise
        ui.say(
            f"vertex: job {created.name} is {created.short_state}; Vertex AI runs it to its end "
            "on its own"
        )
        return time.monotonic() - started

    def job_body(self, job: Job, *, stage: bool) -> dict[str, Any]:
        """The CustomJob this run submits: the stack keys' job, or the `vertexJobSpec` file's.
        `stage`: upload the working directory where the job reads it (else only name it)."""
        if not self.spec.vertex_job_spec:
            package = self._stage(job) if stage else self.package_uri(job.run_id)
            self._price(self.spec.vertex_pools())
            return custom_job_body(self._request(job, package))
        doc, shapes = read_job_file(
            self.settings.root,
            self.spec.vertex_job_spec,
            capacity=self.spec.capacity,
            max_run_duration_s=self.spec.max_run_duration_s,
        )
        self._price(shapes)
        package = self.package_uri(job.run_id)
        job_spec = job_spec_for_run(
            doc,
            run_id=job.run_id,
            output_dir=run_output_dir(self.out.bucket, job.run_id, self.out.bucket_prefix),
            service_account=self.out.service_account,
            scheduling=scheduling(self._request(job, package)),
            image=job.image.pinned if job.image is not None else None,
        )
        text = json.dumps(job_spec)
        if stage and (package in text or gcs_fuse_path(package) in text):
            self._stage(job)  # an export of gputrain's own job: its code where it points
        labels = {**stack_labels(self.spec), RUN_LABEL: run_label(job.run_id)}
        name = f"gputrain-{self.spec.stack}-{job.run_id}"[:128]
        return {"displayName": name, "labels": labels, "jobSpec": job_spec}

    def _price(self, shapes: list[tuple[int, PoolShape]]) -> None:
        """The job's $/h: every pool's replicas (the summary's cost)."""
        priced = price_pools(shapes, self.out.region, spot=self.spec.spot)
        self.hourly_usd = total_hourly(priced)

    def footprint(self) -> Footprint:
        """The job's shape as the stack asks for it (Vertex's replicas, not machines of ours)."""
        return Footprint(self.spec.nodes, self.spec.machine_type, self.spec.gpus_per_node)

    def ledger_bucket(self) -> tuple[Any, str, str]:
        """(storage, bucket, prefix) where the run's cost-ledger record goes (scripts/cost)."""
        return self.clients.storage(self.out.project), self.out.bucket, self.out.bucket_prefix

    def package_uri(self, run_id: str) -> str:
        """Where _stage puts the run's code package."""
        return staging_dir(self.out.bucket, run_id, self.out.bucket_prefix) + SDIST_FILE

    def _stage(self, job: Job) -> str:
        """The sdist of the working directory + trainer, in gs://<bucket>/staging/<run-id>/."""
        with tempfile.TemporaryDirectory(prefix="gputrain-sdist-") as tmp:
            archive, size = build_sdist(
                job.workdir or Path.cwd(),
                Path(tmp),
                trainer_dir=TRAINER_DIR,
                limit_mib=job.max_upload_mib,
                extra_requires=(SECRETS_REQUIREMENT,) if job.secret_refs else (),
            )
            uri = self.package_uri(job.run_id)
            assert archive.name == SDIST_FILE
            storage = self.clients.storage(self.out.project)
            storage.upload(self.out.bucket, uri.split("/", 3)[3], archive)
        ui.say(f"vertex: staged {size / 2**20:.1f} MiB of code as {uri}")
        return uri

    def _request(self, job: Job, package: str) -> JobRequest:
        spec = self.spec
        gpu = spec.accelerator if spec.attach_gpus else None
        return JobRequest(
            display_name=f"gputrain-{spec.stack}-{job.run_id}"[:128],
            region=self.out.region,
            machine_type=spec.machine_type,
            gpu_type=gpu,
            gpu_count=spec.gpus_per_node if gpu else 0,
            nodes=spec.nodes,
            spot=spec.spot,
            max_run_duration_s=spec.max_run_duration_s,
            output_dir=run_output_dir(self.out.bucket, job.run_id, self.out.bucket_prefix),
            package_uris=(package,),
            args=tuple(job.entry),
            env={
                **vertex_data_env(job.datasets),
                **vertex_output_env(f"gs://{self.out.bucket}/{self.out.bucket_prefix}", job),
                **job.env,
                "GPUTRAIN_RUN_ID": job.run_id,
                **secret_refs_env(job.secret_refs),
                **environment_env(job.environment),
            },
            labels={**stack_labels(spec), RUN_LABEL: run_label(job.run_id)},
            service_account=self.out.service_account,
            executor_image=spec.executor_image,
            image_uri=job.image.pinned if job.image is not None else None,
            flex_start_wait_s=(spec.wait_for_capacity_s or DEFAULT_FLEX_START_WAIT_S)
            if spec.capacity == "flex-start"
            else 0,
            chief=spec.chief,
            reduction_server=spec.reduction_server,
            restart_job_on_worker_restart=spec.restart_job_on_worker_restart,
        )

    def _follow(self, name: str, log: IO[str] | None = None) -> Followed:
        def lines(batch: list[str]) -> None:
            if log is not None:
                log.write("".join(f"{line}\n" for line in batch))
                log.flush()
            for line in batch:
                ui.say(line)

        return self.api.follow(
            name,
            on_state=self._state,
            on_lines=lines,
            poll_s=self.clients.poll_s,
            settle_s=self.clients.settle_s,
        )

    def _state(self, status: JobStatus, seen: dt.datetime) -> None:
        """A state the job reached, said; its start (Vertex's startTime, when it first ran: not
        the queue before) is where the run's cost counts from."""
        self.jobs_seen[status.name] = status
        if status.start_time is not None and self.billed_since is None:
            self.billed_since = status.start_time.timestamp()
        ui.say(state_line(status, seen))

    def cancel(self, name: str | None, run_id: str | None = None) -> None:
        """Cancel a job (or, when its create may have gone through unseen, the run's jobs found by
        label) and wait until each has ended; a failure here is loud, never silent, and names
        when Vertex ends them all the same."""
        names = [] if name is None else [name]
        try:
            if name is None:
                labels = {STACK_LABEL: self.spec.stack}
                if run_id is not None:
                    labels[RUN_LABEL] = run_label(run_id)
                listed = [j for j in self.api.list_jobs(labels) if not j.done]
                self.jobs_seen.update((j.name, j) for j in listed)
                names = [j.name for j in listed]
            for n in names:
                ui.say(f"vertex: cancelling job {n.rsplit('/', 1)[-1]} and waiting until it ends")
                self.api.cancel_and_wait(
                    n,
                    poll_s=min(5.0, self.clients.poll_s),
                    timeout_s=self.clients.cancel_timeout_s,
                    on_state=self._state,
                )
        except Exception as e:
            bound = server_side_bound(
                self.spec, self.settings.root, [self.jobs_seen.get(n) for n in names]
            )
            ui.warn(
                f"could not cancel the Vertex job(s) of stack {self.spec.stack}: {e}; Vertex ends "
                f"them {bound}"
            )

    # ---- what does not need a new job

    def logs(self, run_id: str) -> None:
        """Follow a run's job: its states and every log line so far, then on until it ends;
        then its results home (a detached run's way back). A job that did not succeed: its
        failure, as `run` would say it."""
        followed = self._follow(self._job_of(run_id))
        results_dir = self.results(run_id)
        status = followed.status
        if not status.succeeded:
            raise GputrainError(
                failure_message(status, followed.last_lines) + f"\nlogs and results: {results_dir}"
            )
        ui.say(f"run {run_id}: Vertex job {status.job_id} {status.short_state}; results in "
               f"{results_dir}")  # fmt: skip

    def _job_of(self, run_id: str) -> str:
        path = self.settings.runs_dir / self.name / run_id / JOB_RECORD
        if path.is_file():
            return str(json.loads(path.read_text())["name"])
        found = self.api.list_jobs({STACK_LABEL: self.spec.stack, RUN_LABEL: run_label(run_id)})
        if not found:
            raise UserError(f"logs: no Vertex job of stack {self.spec.stack} has run id {run_id}")
        return found[0].name

    def running(self) -> dict[str, list[str]]:
        jobs = self.api.list_jobs({STACK_LABEL: self.spec.stack})
        ids = [j.labels.get(RUN_LABEL, j.job_id) for j in jobs if not j.done]
        return {"vertex": ids} if ids else {}

    def results(self, run_id: str) -> Path:
        results_dir = self.settings.made_results_dir(self.name, run_id)  # LAST_RUN: the newest
        bring_home(self.clients.storage(self.out.project), self.out, run_id, results_dir)
        return results_dir

    def stop(self, run_id: str) -> None:
        self.cancel(None, run_id)

    @property
    def node_count(self) -> int | None:
        return None  # Vertex's replicas, not machines of ours

    def latest_run(self) -> str | None:
        """The run of the stack's newest job (another machine's `run`), by its label."""
        jobs = self.api.list_jobs({STACK_LABEL: self.spec.stack})
        dated = [(j.create_time, j) for j in jobs if j.create_time is not None]
        newest = max(dated, key=lambda pair: pair[0], default=None)
        return newest[1].labels.get(RUN_LABEL) if newest else None

    # What the target's Capabilities say Vertex lacks (the run plan refuses it first).

    def has_run(self, run_id: str) -> bool:
        raise self._lacks(f"--resume {run_id}")

    def verify_image(self, image: ImageRef) -> None:
        raise self._lacks("verify: an image on the nodes")

    @property
    def transports(self) -> dict[str, Transport]:
        raise self._lacks("SSH to the nodes")

    def _lacks(self, what: str) -> UserError:
        return UserError(f"{what}: stack {self.spec.stack} runs on Vertex AI (no SSH, no VMs)")

    def ssh(self, node: str, command: Sequence[str]) -> int:
        raise UserError(
            f"ssh: stack {self.spec.stack} runs on Vertex AI, which gives no SSH to its replicas; "
            f"`gputrain logs --stack {self.spec.stack}` follows a job's logs"
        )
