"""Vertex AI custom jobs, the pure parts: the CustomJob request body, what a job's state and error
mean for the user, the job's Cloud Logging lines with [replica] prefixes, and the code package
(an sdist of the working directory and the trainer) that `pythonPackageSpec` pip-installs.

No I/O except writing the sdist; the API calls live in scripts/targets/vertex/api.py.
"""

from __future__ import annotations

import datetime as dt
import glob
import gzip
import io
import re
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputrain_node import contract
from infra import catalog, vertex
from infra.base.errors import UserError
from infra.vertex_pools import (
    REDUCTION_SERVER_ENV,
    Chief,
    ReductionServer,
    is_reduction_server_image,
    reduction_server_image,
)
from scripts.job.sync import check_size, collect_sources

DEFAULT_PYTHON_MODULE = contract.VERTEX_ENTRY
CODE_PACKAGE = "gputrain_code"  # the working directory travels as this package's data, under files/
NODE_DIR = "node"  # under CODE_PACKAGE: gputrain's node package (the job's entry)
SDIST_NAME, SDIST_VERSION = "gputrain-job", "0"
SDIST_FILE = f"{SDIST_NAME}-{SDIST_VERSION}.tar.gz"  # what build_sdist writes
#: What pip installs with the package: the trainer's needs but torch, which the container brings
#: (a second torch would be a multi-GB download that may not match the container's CUDA).
#: pyproject's `train` extra without torch; a test holds them together.
TRAINER_REQUIREMENTS = ("numpy>=1.26", "google-cloud-storage>=2.14,<4", "tensorboard>=2.14,<3")
LOG_RESOURCE_TYPE = "ml_job"  # gcloud's `ai custom-jobs stream-logs` filters on it and job_id

# --------------------------------------------------------------------------------------------
# The request
# --------------------------------------------------------------------------------------------


def parent(project: str, region: str) -> str:
    return f"projects/{project}/locations/{region}"


def run_output_dir(bucket: str, run_id: str, prefix: str = "") -> str:
    """baseOutputDirectory: Vertex derives AIP_MODEL_DIR / AIP_CHECKPOINT_DIR from it. `prefix`
    ("" or "a/b/") is the stack's place in a shared bucket."""
    return f"gs://{bucket}/{prefix}runs/{run_id}/"


def staging_dir(bucket: str, run_id: str, prefix: str = "") -> str:
    return f"gs://{bucket}/{prefix}staging/{run_id}/"


def executor_image_for(region: str, image: str = vertex.DEFAULT_EXECUTOR_IMAGE) -> str:
    """The prebuilt images live in us-, europe- and asia-docker.pkg.dev; pull from the nearest."""
    if not image.startswith("us-docker.pkg.dev/vertex-ai/"):
        return image
    area = "europe" if region.startswith("europe") else "asia" if region.startswith("asia") else ""
    return image.replace("us-docker", f"{area}-docker", 1) if area else image


@dataclass(frozen=True)
class JobRequest:
    """What one CustomJob runs: plain values, already validated by the stack spec."""

    display_name: str
    region: str
    machine_type: str
    gpu_type: str | None  # catalog name; None = implied by machine_type
    gpu_count: int  # 0 = implied by machine_type
    nodes: int
    spot: bool
    max_run_duration_s: int
    output_dir: str  # gs://<bucket>/runs/<run-id>/
    package_uris: tuple[str, ...]
    python_module: str = DEFAULT_PYTHON_MODULE
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    service_account: str | None = None
    executor_image: str = vertex.DEFAULT_EXECUTOR_IMAGE
    boot_disk_gb: int | None = None  # None: Vertex's default (100 GB pd-ssd)
    image_uri: str | None = None  # a custom container (containerSpec) instead of the executor
    flex_start_wait_s: int = 0  # > 0: Flex-start (DWS) capacity, waiting at most this long
    chief: Chief | None = None  # pool 0's own machine; None: machine_type's
    reduction_server: ReductionServer | None = None  # worker pool 2; None: no pool 2
    restart_job_on_worker_restart: bool = False  # a restarted worker restarts the whole job


#: containerSpec's command: the staged sdist, read where Vertex mounts the bucket (/gcs/BUCKET/...),
#: installed as the executor would install it for pythonPackageSpec, then our entry with the job's
#: args ("$@"). The image brings python3 with torch, pip, setuptools and the trainer's
#: requirements (numpy, google-cloud-storage).
CONTAINER_COMMAND_SH = (
    "set -e; python3 -m pip install -q --no-deps --no-index --no-build-isolation "
    '--target /tmp/gputrain-job "$GPUTRAIN_PACKAGE"; export PYTHONPATH=/tmp/gputrain-job; '
    'exec python3 -m {module} "$@"'
)


def gcs_fuse_path(uri: str) -> str:
    """gs://BUCKET/PATH -> /gcs/BUCKET/PATH, where Vertex mounts Cloud Storage in every replica."""
    if not uri.startswith("gs://"):
        raise ValueError(f"not a gs:// URI: {uri!r}")
    return "/gcs/" + uri.removeprefix("gs://")


def machine_spec(machine_type: str, gpu_type: str | None, gpu_count: int) -> dict[str, Any]:
    """MachineSpec JSON; GPUs implied by A2/A3/A4/G2 types are spelled out, as Vertex wants."""
    mt = catalog.machine_type(machine_type)
    if mt is None:
        raise UserError(f"machineType {machine_type!r}: unknown")
    accel = mt.accelerator or gpu_type
    count = mt.gpus if mt.accelerator else gpu_count
    spec: dict[str, Any] = {"machineType": mt.name}
    if accel and count:
        spec |= {"acceleratorType": vertex.accelerator_enum(accel), "acceleratorCount": count}
    return spec


#: How long a Vertex Flex-start job waits for capacity when waitForCapacity is not set.
DEFAULT_FLEX_START_WAIT_S = 2 * 3600


def scheduling(req: JobRequest) -> dict[str, Any]:
    """The job's Scheduling: a server-side timeout and the strategy. Flex-start is
    `Scheduling.Strategy.FLEX_START` (it queues through the Dynamic Workload Scheduler, unlike a
    GCE Flex-start create here), bounded by `maxWaitDuration`. `restartJobOnWorkerRestart`
    (sent only when true, its default being false) restarts every replica when one restarts."""
    strategy = "FLEX_START" if req.flex_start_wait_s else "SPOT" if req.spot else "STANDARD"
    body: dict[str, Any] = {"timeout": f"{req.max_run_duration_s}s", "strategy": strategy}
    if req.flex_start_wait_s:
        body["maxWaitDuration"] = f"{req.flex_start_wait_s}s"
    if req.restart_job_on_worker_restart:
        body["restartJobOnWorkerRestart"] = True
    return body


def custom_job_body(req: JobRequest) -> dict[str, Any]:
    """The CustomJob as REST JSON (camelCase): pool 0 is the chief (1 replica, its own machine
    with `chief`), pool 1 the other nodes - 1 workers, pool 2 the Reduction Server's reducers
    when asked for; a server-side timeout; SPOT, STANDARD or FLEX_START scheduling."""
    problem = vertex.vertex_problem(req.machine_type, req.gpu_type, req.gpu_count, spot=req.spot)
    if problem:
        raise UserError(problem)
    if req.nodes < 1:
        raise UserError(f"nodes = {req.nodes}: allowed: 1 or more")
    if req.max_run_duration_s < 1:
        raise UserError(f"maxRunDuration = {req.max_run_duration_s}s: allowed: 1 s or more")
    reducer_env = REDUCTION_SERVER_ENV if req.reduction_server else {}
    env = [{"name": k, "value": v} for k, v in sorted({**reducer_env, **req.env}.items())]
    pool: dict[str, Any] = {
        "machineSpec": machine_spec(req.machine_type, req.gpu_type, req.gpu_count),
        "replicaCount": 1,
    }
    if req.image_uri:
        staged = {"name": "GPUTRAIN_PACKAGE", "value": gcs_fuse_path(req.package_uris[0])}
        pool["containerSpec"] = {
            "imageUri": req.image_uri,
            "command": [
                "sh", "-c", CONTAINER_COMMAND_SH.format(module=req.python_module), "gputrain",
            ],
            "args": list(req.args),
            "env": sorted([*env, staged], key=lambda e: e["name"]),
        }  # fmt: skip
    else:
        pool["pythonPackageSpec"] = {
            "executorImageUri": executor_image_for(req.region, req.executor_image),
            "packageUris": list(req.package_uris),
            "pythonModule": req.python_module,
            "args": list(req.args),
            "env": env,
        }
    if req.boot_disk_gb:
        pool["diskSpec"] = {"bootDiskType": "pd-ssd", "bootDiskSizeGb": req.boot_disk_gb}
    pools = [pool] + ([{**pool, "replicaCount": req.nodes - 1}] if req.nodes > 1 else [])
    if req.chief is not None:
        c = req.chief
        problem = vertex.vertex_problem(c.machine_type, c.gpu_type, c.gpu_count, spot=req.spot)
        if problem:
            raise UserError(f"chief.{problem}")
        pools[0] = {**pool, "machineSpec": machine_spec(c.machine_type, c.gpu_type, c.gpu_count)}
    if req.reduction_server is not None:
        if req.nodes < 2:
            raise UserError(f"reductionServer: the job has {req.nodes} node; allowed: 2 or more")
        pools.append(
            {
                "machineSpec": {"machineType": req.reduction_server.machine_type},
                "replicaCount": req.reduction_server.replicas,
                "containerSpec": {"imageUri": reduction_server_image(req.region)},
            }
        )
    job_spec: dict[str, Any] = {
        "workerPoolSpecs": pools,
        "scheduling": scheduling(req),
        "baseOutputDirectory": {"outputUriPrefix": req.output_dir},
    }
    if req.service_account:
        job_spec["serviceAccount"] = req.service_account
    return {"displayName": req.display_name, "labels": dict(req.labels), "jobSpec": job_spec}


def describe_pools(job_spec: Mapping[str, Any]) -> str:
    """`1 x a2-highgpu-1g (chief) + 3 x a2-highgpu-1g (workers) + 4 x n1-highcpu-16 (reducers)`;
    pool 2 without Google's Reduction Server image is parameter servers."""
    roles = ("chief", "workers", "reducers" if runs_reducers(job_spec) else "parameter servers",
             "evaluators")  # fmt: skip
    return " + ".join(
        f"{pool.get('replicaCount', 1)} x {pool['machineSpec']['machineType']} ({roles[i]})"
        for i, pool in enumerate(job_spec.get("workerPoolSpecs") or [])
        if pool and i < len(roles)
    )


def runs_reducers(job_spec: Mapping[str, Any]) -> bool:
    """Pool 2 runs Google's Reduction Server image; a pool 2 without it is parameter servers."""
    pools = job_spec.get("workerPoolSpecs") or []
    pool = (pools[2] if len(pools) > 2 else None) or {}
    return is_reduction_server_image(str((pool.get("containerSpec") or {}).get("imageUri")))


# --------------------------------------------------------------------------------------------
# State and error
# --------------------------------------------------------------------------------------------

FINAL_STATES = frozenset(
    f"JOB_STATE_{s}" for s in ("SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED", "PARTIALLY_SUCCEEDED")
)
_RPC_NAMES = (  # google.rpc.Code, by number
    "OK CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND ALREADY_EXISTS "
    "PERMISSION_DENIED RESOURCE_EXHAUSTED FAILED_PRECONDITION ABORTED OUT_OF_RANGE "
    "UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS UNAUTHENTICATED"
)
_RPC_CODES = _RPC_NAMES.split()


def parse_time(text: str | None) -> dt.datetime | None:
    """RFC 3339 as Google writes it ("...T10:00:00.123456789Z"), to microseconds, UTC."""
    if not text:
        return None
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    if not m:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    base, frac, zone = m.groups()
    iso = f"{base}.{(frac or '0')[:6].ljust(6, '0')}{'+00:00' if zone == 'Z' else zone}"
    return dt.datetime.fromisoformat(iso).astimezone(dt.timezone.utc)


def parse_duration_s(text: str | None) -> float | None:
    """A Duration as Google writes it in JSON ("3600s", "0.5s": nanoseconds at most), in
    seconds; None if absent or not one."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]{1,9})?)s", text or "")
    return float(m.group(1)) if m else None


def format_time(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class JobStatus:
    """One GET of a CustomJob, reduced to what the controller acts on and prints."""

    name: str  # projects/<number>/locations/<region>/customJobs/<id>
    state: str  # JOB_STATE_*
    create_time: dt.datetime | None = None
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    error_code: int = 0
    error_message: str = ""
    display_name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float | None = None  # its scheduling.timeout: Vertex ends it that long after start
    reducers: bool = False  # its pool 2 is a Reduction Server (else parameter servers, if any)

    @property
    def job_id(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def short_state(self) -> str:
        return self.state.removeprefix("JOB_STATE_")

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == "JOB_STATE_SUCCEEDED"


def parse_job(body: Mapping[str, Any]) -> JobStatus:
    """From the CustomJob REST JSON (what GET returns)."""
    error = body.get("error") or {}
    return JobStatus(
        name=body["name"],
        state=body.get("state", "JOB_STATE_UNSPECIFIED"),
        create_time=parse_time(body.get("createTime")),
        start_time=parse_time(body.get("startTime")),
        end_time=parse_time(body.get("endTime")),
        error_code=int(error.get("code", 0)),
        error_message=error.get("message", ""),
        display_name=body.get("displayName", ""),
        labels=dict(body.get("labels") or {}),
        timeout_s=parse_duration_s(
            ((body.get("jobSpec") or {}).get("scheduling") or {}).get("timeout")
        ),
        reducers=runs_reducers(body.get("jobSpec") or {}),
    )


def state_line(status: JobStatus, seen_at: dt.datetime) -> str:
    """One line per state change, e.g. `10:00:41 Vertex job 123: RUNNING (41 s after create)`."""
    line = f"{seen_at.astimezone(dt.timezone.utc):%H:%M:%S} Vertex job {status.job_id}: "
    line += status.short_state
    if status.create_time:
        line += f" ({(seen_at - status.create_time).total_seconds():.0f} s after create)"
    return line


def failure_message(status: JobStatus, last_lines: Sequence[str] = ()) -> str:
    """Why a job ended without success: its state, the API's error, then the last log lines."""
    code = _RPC_CODES[status.error_code] if 0 < status.error_code < len(_RPC_CODES) else ""
    detail = " ".join(p for p in (code, status.error_message.strip()) if p) or "no error reported"
    text = f"Vertex job {status.job_id} {status.short_state}: {detail}"
    if last_lines:
        text += "\nlast log lines:\n" + "\n".join(f"  {line}" for line in last_lines)
    return text


# --------------------------------------------------------------------------------------------
# Logs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogLine:
    """One Cloud Logging entry of the job (possibly several lines of text)."""

    timestamp: dt.datetime
    insert_id: str
    task: str  # resource.labels.task_name, e.g. workerpool0-0; "" for service messages
    text: str
    severity: str = "DEFAULT"


def replica_label(task: str, *, reducers: bool) -> str:
    """workerpool0-0 -> chief, workerpool1-i -> worker-<i+1> (its torchrun node rank),
    workerpool2-i -> reducer-i (`reducers`: a Reduction Server) or parameter-server-i,
    workerpool3-i -> evaluator-i: each replica by its pool's role, as describe_pools names it."""
    m = re.fullmatch(r"workerpool([0-3])-(\d+)", task)
    if not m:
        return task or "vertex"
    pool, index = int(m[1]), int(m[2])
    if pool == 0:
        return "chief"
    if pool == 1:
        return f"worker-{index + 1}"
    role = ("reducer" if reducers else "parameter-server", "evaluator")[pool - 2]
    return f"{role}-{index}"


def format_log_lines(lines: Iterable[LogLine], *, reducers: bool) -> list[str]:
    """Each line with its replica's label; `reducers`: the job's pool 2 is a Reduction Server."""
    return [
        f"[{replica_label(e.task, reducers=reducers)}] {part}"
        for e in lines
        for part in e.text.splitlines() or [""]
    ]


@dataclass
class LogCursor:
    """Where the last poll ended. Each poll asks again from `lookback` before the newest entry seen
    (Cloud Logging may deliver an entry after later ones) and drops insertIds already taken."""

    since: dt.datetime | None = None
    lookback: dt.timedelta = dt.timedelta(seconds=30)
    _seen: dict[str, dt.datetime] = field(default_factory=dict)

    def filter(self, job_id: str) -> str:
        parts = [f'resource.type="{LOG_RESOURCE_TYPE}"', f'resource.labels.job_id="{job_id}"']
        if self.since is not None:
            parts.append(f'timestamp>="{format_time(self.since - self.lookback)}"')
        return " AND ".join(parts)

    def take(self, entries: Iterable[LogLine]) -> list[LogLine]:
        """The entries not taken before, oldest first; moves the cursor past them."""
        new = []
        for e in entries:
            key = e.insert_id or f"{format_time(e.timestamp)}|{e.task}|{e.text}"
            if key not in self._seen:
                self._seen[key] = e.timestamp
                new.append(e)
        if new:
            newest = max(e.timestamp for e in new)
            self.since = newest if self.since is None else max(self.since, newest)
        if self.since is not None:
            horizon = self.since - self.lookback
            self._seen = {k: t for k, t in self._seen.items() if t >= horizon}
        return sorted(new, key=lambda e: e.timestamp)


# --------------------------------------------------------------------------------------------
# The code package
# --------------------------------------------------------------------------------------------

_SETUP_PY = """\
# Generated by gputrain: the working directory as package data of {code}, the trainer importable.
from setuptools import setup

setup(
    name={name!r},
    version={version!r},
    python_requires=">=3.10",
    packages={packages!r},
    package_dir={package_dir!r},
    package_data={{{code!r}: {data!r}}},
    include_package_data=False,
    install_requires={requires!r},
)
"""


SECRETS_REQUIREMENT = "google-cloud-secret-manager>=2.20,<3"  # the entry reads the job's secrets


def build_sdist(
    workdir: Path,
    out_dir: Path,
    *,
    trainer_dir: Path,
    limit_mib: float,
    extra_requires: tuple[str, ...] = (),
) -> tuple[Path, int]:
    """gputrain-job-0.tar.gz with the same files and size limit as the SSH upload; pip-installing
    it gives `python -m trainer.*`, gputrain's node package (the job's entry: gputrain's own
    copy, under gputrain_code/node/, whatever the working directory holds) and the working
    directory under gputrain_code/files/. Byte-for-byte reproducible. Returns (archive, bytes
    of code)."""
    files = collect_sources(workdir, {"trainer": trainer_dir})
    total = check_size(files, limit_mib, workdir)
    trainer_pkgs = sorted(
        rel.rsplit("/", 1)[0].replace("/", ".")
        for rel in files
        if rel.startswith("trainer/") and rel.endswith("/__init__.py")
    )
    if "trainer" not in trainer_pkgs:
        raise UserError(f"trainer package: {trainer_dir} has no __init__.py")
    setup_py = _SETUP_PY.format(
        code=CODE_PACKAGE,
        name=SDIST_NAME,
        version=SDIST_VERSION,
        packages=[CODE_PACKAGE, *trainer_pkgs, contract.PACKAGE],
        package_dir={
            **{p: f"{CODE_PACKAGE}/files/{p.replace('.', '/')}" for p in trainer_pkgs},
            contract.PACKAGE: f"{CODE_PACKAGE}/{NODE_DIR}",
        },
        data=[f"files/{glob.escape(rel)}" for rel in sorted(files)],
        requires=[*TRAINER_REQUIREMENTS, *extra_requires],
    )
    pkg_info = f"Metadata-Version: 2.1\nName: {SDIST_NAME}\nVersion: {SDIST_VERSION}\n"
    init = '"""gputrain job code; the working directory is ROOT."""\nfrom pathlib import Path\n\n'
    init += 'ROOT = Path(__file__).resolve().parent / "files"\n'
    # gputrain's reference trainer travels only when the working directory has no `trainer/`:
    # the entry then runs `-m trainer.train` as the user's own code (gputrain_node.vertex_entry)
    reference = files.get("trainer/__init__.py") == trainer_dir / "__init__.py"
    init += f"REFERENCE_TRAINER = {reference}\n"
    root = f"{SDIST_NAME}-{SDIST_VERSION}"
    members: list[tuple[str, bytes | Path]] = [
        (f"{root}/PKG-INFO", pkg_info.encode()),
        (f"{root}/setup.py", setup_py.encode()),
        (f"{root}/{CODE_PACKAGE}/__init__.py", init.encode()),
        *((f"{root}/{CODE_PACKAGE}/files/{rel}", files[rel]) for rel in sorted(files)),
        *(
            (f"{root}/{CODE_PACKAGE}/{NODE_DIR}/{p.name}", p)
            for p in sorted(contract.PACKAGE_DIR.glob("*.py"))
        ),
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / f"{root}.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, src in members:
            data = src.read_bytes() if isinstance(src, Path) else src
            mode = (src.stat().st_mode & 0o755) | 0o644 if isinstance(src, Path) else 0o644
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    with gzip.GzipFile(archive, "wb", mtime=0) as gz:
        gz.write(buf.getvalue())
    return archive, total
