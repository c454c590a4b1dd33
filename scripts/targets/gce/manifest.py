"""A stack run's manifest in the stack's bucket (`<prefix>runs/<run-id>/manifest.json`): what a
`gputrain reconcile` pass on another machine needs to relaunch the same run (entry, resume args,
`--env` pairs, its Secret Manager references, where its code bundle is, its environment plan,
image and datasets, which the relaunch prepares on the nodes as the first launch did), and the
recovery state every pass reads and writes (attempt, recoveries left, state, history, the last
pass).

Writes are fenced: each carries the lease token it was made under and is conditioned on the
manifest's generation as read, so a writer that lost the lease (scripts/targets/gce/lease.py)
cannot overwrite what the new holder wrote.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.base.errors import GputrainError, UserError
from scripts.targets.gce.lease import LeaseLost

if TYPE_CHECKING:
    from infra.gcp.gcs import StorageApi
    from infra.spec import ClusterSpec
    from scripts.job.autodown import RunBudget
    from scripts.job.records import Job
    from scripts.targets.gce.clients import GceClients

MANIFEST = "manifest.json"
CODE_BUNDLE = "code.tar.gz"
#: manifest states
RUNNING, RECOVERING, WAITING = "running", "recovering", "waiting for capacity"
FINISHED, FAILED, EXHAUSTED = "finished", "failed", "out of recoveries"
ENDED = (FINISHED, FAILED, EXHAUSTED)
HISTORY_KEPT = 50


@dataclass
class RunManifest:
    run_id: str
    stack: str
    entry: tuple[str, ...]
    env: dict[str, str]
    resume_args: tuple[str, ...] = ()
    max_restarts: int = 0
    secret_names: tuple[str, ...] = ()  # values never in the manifest
    # name -> projects/P/secrets/S/versions/V: the secrets a pass reads from Secret Manager itself
    secret_refs: dict[str, str] = field(default_factory=dict)
    not_relaunchable: str | None = None  # why a reconciler may not relaunch it (None: it may)
    code: str | None = None  # gs:// URI of the code bundle (the user's files, without trainer/)
    # what the relaunch prepares on the nodes, as the launch did (scripts/job/launch.py): the
    # environment plan (requirements + setup), the image at its digest, the datasets
    environment: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    datasets: list[dict[str, Any]] = field(default_factory=list)
    created_at: float = 0.0
    deadline: float = 0.0  # the stack's TTL from the first VM's start: never extended
    attempt: int = 1
    attempt_started_at: float = 0.0
    max_recoveries: int = 3
    recoveries_done: int = 0
    budget_usd: float | None = None  # the run's budget (--budget or the stack's): a relaunch's too
    started_at: float = 0.0  # where the run's spend counts from (its budget, its cost record)
    # its cost record as its launch knew it (scripts/cost/ledger.py launch_record: its zones, its
    # partial creates): a reconcile pass's relaunch goes on from it
    ledger: dict[str, Any] | None = None
    state: str = RUNNING
    history: list[dict[str, Any]] = field(default_factory=list)
    last_pass: dict[str, Any] = field(default_factory=dict)
    fence: int = 0  # the lease token of the last write
    generation: int = 0  # of the object as read (not stored)

    @property
    def recoveries_left(self) -> int:
        return max(0, self.max_recoveries - self.recoveries_done)

    def note(self, what: str, now: float | None = None, **fields: Any) -> None:
        """One line of the run's recovery history (newest last)."""
        self.history.append({"at": now or time.time(), "what": what, **fields})
        del self.history[:-HISTORY_KEPT]

    def to_json(self) -> bytes:
        d = dataclasses.asdict(self)
        d.pop("generation")
        d["recoveries_left"] = self.recoveries_left
        return json.dumps(d, indent=1).encode()

    @classmethod
    def parse(cls, data: bytes, generation: int) -> RunManifest:
        """The manifest as written; ValueError for what is not one (no JSON object, a history
        or an environment of the wrong type)."""
        d = json.loads(data)
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        for key in ("entry", "resume_args", "secret_names"):
            d[key] = tuple(d.get(key) or ())
        for key, kind in (("history", list), ("env", dict), ("secret_refs", dict)):
            if not isinstance(d.get(key, kind()), kind):
                raise ValueError(f"{key} is not a {kind.__name__}")
        if not isinstance(d.get("ledger") or {}, dict):
            raise ValueError("ledger is not a dict")
        return cls(**d, generation=generation)

    def job_parts(self) -> dict[str, Any]:
        """The Job fields the relaunch prepares on the nodes (environment, image, datasets), as
        the launch recorded them. Pure."""
        from infra.datasets import Dataset
        from scripts.job.container import ImageRef
        from scripts.job.environment import Environment

        env = self.environment
        return {
            "environment": None
            if env is None
            else Environment(**{**env, **{k: tuple(env[k]) for k in TUPLES if k in env}}),
            "image": None if self.image is None else ImageRef(**self.image),
            "datasets": tuple(Dataset(**d) for d in self.datasets),
        }


#: Environment's tuple fields (JSON gives lists back)
TUPLES = ("sources", "pyproject_deps")


def manifest_name(prefix: str, run_id: str) -> str:
    return f"{prefix}runs/{run_id}/{MANIFEST}"


def not_relaunchable(job: Job) -> str | None:
    """What a reconciler on another machine could not give a relaunch: a secret whose value
    came from this machine's environment (it never leaves it). Pure."""
    from scripts.job.environment import machine_secrets_line

    return machine_secrets_line(job.secrets, job.secret_refs)


def not_recreating(deadline: float, budget: RunBudget | None, now: float) -> str | None:
    """Why a run's lost VMs are not re-created: its TTL is spent (a re-created VM lives no
    longer than the first), or its budget (the head would stop the relaunch at once). Pure."""
    if now >= deadline:
        return "the stack's TTL is spent: not re-creating VMs"
    if budget is not None and budget.reached(now):
        return f"its budget of ${budget.usd:.2f} is spent: not re-creating VMs"
    return None


def manifest_for(
    job: Job, stack: str, *, max_recoveries: int, deadline: float, code: str | None
) -> RunManifest:
    """The manifest a launch writes. Pure."""
    now = time.time()
    return RunManifest(
        run_id=job.run_id,
        stack=stack,
        entry=tuple(job.entry),
        env=dict(job.env),
        resume_args=tuple(job.resume_args),
        max_restarts=job.max_restarts,
        secret_names=tuple(sorted(job.secrets)),
        secret_refs={k: v for k, v in job.secret_refs.items() if k in job.secrets},
        not_relaunchable=not_relaunchable(job),
        code=code,
        environment=None
        if job.environment is None
        else dataclasses.asdict(dataclasses.replace(job.environment, force=False)),
        image=None if job.image is None else dataclasses.asdict(job.image),
        datasets=[dataclasses.asdict(d) for d in job.datasets],
        created_at=now,
        deadline=deadline,
        attempt=job.attempt,
        attempt_started_at=now,
        max_recoveries=max_recoveries,
    )


class Manifests:
    """The stack's run manifests in its bucket."""

    def __init__(self, storage: StorageApi, bucket: str, prefix: str) -> None:
        self.storage, self.bucket, self.prefix = storage, bucket, prefix

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"

    def load(self, run_id: str) -> RunManifest | None:
        found = self.storage.read_versioned(self.bucket, manifest_name(self.prefix, run_id))
        if found is None:
            return None
        try:
            return RunManifest.parse(*found)
        except (ValueError, TypeError) as e:
            raise GputrainError(f"{self.uri}runs/{run_id}/{MANIFEST} is unreadable: {e}") from e

    def latest(self) -> RunManifest | None:
        """The run of the stack launched last (its newest attempt: a `train --resume` of an old
        run is the one to look after, not a newer run that has ended); an unreadable manifest
        is one warning, not the end of every run's recovery."""
        from scripts import ui

        found = []
        for o in self.storage.list_objects(self.bucket, f"{self.prefix}runs/"):
            if not o.name.endswith("/" + MANIFEST):
                continue
            try:
                manifest = self.load(o.name.split("/")[-2])
            except GputrainError as e:
                ui.warn(f"{e}: skipped")
                continue
            if manifest is not None:
                found.append(manifest)
        return max(
            found, key=lambda m: (m.attempt_started_at or m.created_at, m.created_at), default=None
        )

    def find(self, stack: str, run_id: str | None) -> RunManifest:
        """`--run ID` or the newest run; one line when there is none."""
        manifest = self.load(run_id) if run_id else self.latest()
        if manifest is None:
            what = f"run {run_id}" if run_id else "no run"
            raise UserError(
                f"reconcile: stack {stack} has {what} with a manifest in {self.uri}runs/ (a run "
                f"started with `gputrain run --stack {stack}` writes one)"
                if not run_id
                else f"reconcile --run {run_id}: no manifest at {self.uri}runs/{run_id}/{MANIFEST}"
            )
        return manifest

    def write(self, manifest: RunManifest, token: int) -> None:
        """Fenced: only under a lease token at least as new as the last write's, and only over
        the generation read. LeaseLost otherwise (another writer acted meanwhile)."""
        current = self.load(manifest.run_id)
        if current is not None and (
            current.fence > token or current.generation != manifest.generation
        ):
            raise LeaseLost(
                f"run {manifest.run_id}: its manifest was written by a newer lease holder"
            )
        manifest.fence = token
        generation = self.storage.write_if_generation(
            self.bucket,
            manifest_name(self.prefix, manifest.run_id),
            manifest.to_json(),
            manifest.generation,
        )
        if generation is None:
            raise LeaseLost(f"run {manifest.run_id}: its manifest changed under this writer")
        manifest.generation = generation

    def put_code(self, run_id: str, files: Mapping[str, Path]) -> str:
        """The user's files (not the trainer package, which every gputrain has) as one tar.gz."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for rel, path in sorted(files.items()):
                tar.add(str(path), arcname=rel, recursive=False)
        name = f"{self.prefix}runs/{run_id}/{CODE_BUNDLE}"
        self.storage.write_if_generation(self.bucket, name, buf.getvalue(), None)
        return f"gs://{self.bucket}/{name}"

    def get_code(self, uri: str, dest: Path) -> Path:
        """The bundle unpacked into `dest` (the relaunch's workdir)."""
        bucket, _, name = uri.removeprefix("gs://").partition("/")
        data = self.storage.read(bucket, name)
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():  # plain files under dest only (what put_code wrote)
                path = (dest / member.name).resolve()
                if not member.isfile() or not path.is_relative_to(dest.resolve()):
                    raise GputrainError(f"{uri}: {member.name!r} is not a file of the bundle")
                source = tar.extractfile(member)
                assert source is not None
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(source.read())
                path.chmod(member.mode & 0o755 | 0o600)
        return dest


class ControllerHold:
    """The laptop controller's side: at launch it takes the stack's lease (renewed while it
    lives, so no reconciler acts under it) and writes the run's manifest and code bundle; a
    relaunch after its own recovery and the run's end are recorded; `release` lets go (after
    `--detach` at once: the reconcilers take over)."""

    def __init__(
        self,
        storage: StorageApi,
        bucket_uri: str,
        stack: str,
        *,
        max_recoveries: int,
        deadline: float,
        budget_usd: float | None = None,
        started_at: float = 0.0,
        ledger: dict[str, Any] | None = None,
    ) -> None:
        from scripts.targets.gce.lease import CONTROLLER_TTL_S, Lease

        self.budget_usd, self.started_at, self.ledger = budget_usd, started_at, ledger
        bucket, _, prefix = bucket_uri.removeprefix("gs://").partition("/")
        self.manifests = Manifests(storage, bucket, prefix)
        self.stack, self.max_recoveries, self.deadline = stack, max_recoveries, deadline
        self._lease_of = lambda run_id: Lease(
            storage, bucket, prefix, kind="controller", run_id=run_id, ttl_s=CONTROLLER_TTL_S
        )
        self.lease: Any = None
        self.manifest: RunManifest | None = None

    def start(self, job: Job, code_files: Mapping[str, Path]) -> None:
        """Lease, code bundle, manifest; a live reconciler holding the lease is one line."""
        lease = self._lease_of(job.run_id)
        held = lease.acquire()
        if held is not None:
            raise GputrainError(
                f"stack {self.stack}: {held.line(time.time())}; wait for it (or "
                f"`gputrain down --stack {self.stack}`) before starting another run"
            )
        self.lease = lease
        lease.keep_renewing()
        user_files = {k: v for k, v in code_files.items() if not k.startswith("trainer/")}
        code = self.manifests.put_code(job.run_id, user_files) if user_files else None
        fresh = manifest_for(
            job, self.stack, max_recoveries=self.max_recoveries, deadline=self.deadline, code=code
        )
        fresh.budget_usd, fresh.started_at = self.budget_usd, self.started_at
        fresh.ledger = self.ledger
        old = self.manifests.load(job.run_id)  # `--resume RUN`: its history goes on
        if old is not None:
            fresh.history, fresh.generation = old.history, old.generation
            fresh.created_at = old.created_at
        fresh.note(f"launched attempt {job.attempt} from {lease.holder}")
        self.manifest = fresh
        self.manifests.write(fresh, lease.renew())

    def record(self, *, state: str | None = None, attempt: int | None = None, **note: Any) -> None:
        """A relaunch (attempt, recoveries) or the end; best effort: the run matters more."""
        m, lease = self.manifest, self.lease
        if m is None or lease is None or lease.token is None:
            return
        if attempt is not None:
            m.attempt, m.attempt_started_at = attempt, time.time()
            m.recoveries_done += 1
        if state is not None:
            m.state = state
        m.note(state or f"relaunched attempt {attempt}", **note)
        try:
            self.manifests.write(m, lease.token)
        except GputrainError as e:
            from scripts import ui

            ui.warn(f"could not record run {m.run_id} in its manifest: {e}")

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None


#: How many of the newest history entries `status` shows; the manifest keeps HISTORY_KEPT.
STATUS_HISTORY = 5


def status_lines(m: RunManifest, now: float, where: str = "") -> list[str]:
    """`status`: the run's recovery state, its last pass and newest history (with each entry's
    details; the date where it is not today's), and where the rest of it is (`where`, the
    manifest's gs:// path). Pure."""
    today = time.strftime("%Y-%m-%d", time.localtime(now))

    def at(t: object) -> str:
        if not isinstance(t, int | float):
            return "?"
        day, clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)).split()
        return clock if day == today else f"{day} {clock}"

    def entry(h: dict[str, Any]) -> str:
        details = ", ".join(f"{k} {v}" for k, v in h.items() if k not in ("at", "what"))
        return f"  {at(h.get('at'))}  {h.get('what')}" + (f" ({details})" if details else "")

    lines = [
        f"run {m.run_id}: {m.state}, attempt {m.attempt}, recoveries {m.recoveries_done}/"
        f"{m.max_recoveries} ({m.recoveries_left} left)"
    ]
    if m.last_pass:
        p = m.last_pass
        ago = now - float(p.get("at") or now)
        lines.append(
            f"  last reconcile pass {ago:.0f} s ago at {at(p.get('at'))}: {p.get('outcome')} "
            f"({p.get('wall_s')} s)"
        )
    earlier = len(m.history) - STATUS_HISTORY
    if earlier > 0:
        lines.append(f"  ({earlier} earlier entries" + (f": {where})" if where else ")"))
    lines += [entry(h) for h in m.history[-STATUS_HISTORY:]]
    return lines


def say_recovery(spec: ClusterSpec, clients: GceClients) -> None:
    """`status`: the newest run's manifest (laptop-closed recovery), when the bucket has one."""
    if not spec.bucket_name or not spec.project:
        return
    from scripts import ui

    try:
        storage = clients.storage(spec.project)
        if not storage.bucket_exists(spec.bucket_name):
            return
        manifest = Manifests(storage, spec.bucket_name, spec.bucket_prefix).latest()
    except GputrainError as e:  # status is a report: one line
        ui.warn(f"status: could not read the run's manifest: {e}")
        return
    if manifest is None:
        return
    where = f"gs://{spec.bucket_name}/{manifest_name(spec.bucket_prefix, manifest.run_id)}"
    for line in status_lines(manifest, time.time(), where):
        ui.say(f"status: {line}")
