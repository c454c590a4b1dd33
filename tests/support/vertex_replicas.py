"""A `runner` for tests/support/fake_vertex.py that runs a CustomJob as Vertex would, on this machine: it
pip-installs the job's package from the (emulated) bucket, starts one process per replica of each
pool (a containerSpec: `docker run` of its image, the bucket at /gcs) with the environment Vertex
gives it (CLUSTER_SPEC, AIP_MODEL_DIR, AIP_CHECKPOINT_DIR, the pool's env, and for pools 0 and 1
MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK as Google's PyTorch samples read them), streams each
replica's output into the fake's Cloud Logging under its task name, and on a cancel — or once a
replica has failed, which fails the job — sends SIGTERM to every replica, as Vertex stops its
containers. Pool 2 with Google's reductionserver image runs a stand-in reducer that serves until
the training replicas end; what the replicas wrote under /gcs goes back to the bucket (Cloud
Storage FUSE).

This interpreter (its torch) plays the prebuilt PyTorch container; the code comes only from the
package: PYTHONPATH is the install target, never this checkout.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import alive
from tests.support.fake_vertex import RunContext, RunResult

# SIGTERM, then SIGKILL (a torchrun blocked in its exit barrier needs it). 30 s: GCE's time from
# the soft stop to the hard one, which Vertex's VMs live under. A cancelled chief takes ~2 s to
# stop and copy its outputs on a quiet machine, and under make test's load it overran 10 s once.
STOP_GRACE_S = 30.0


def chief_port(low: int = 20000, high: int = 32000) -> int:
    """MASTER_PORT: a port free now, the one after it too (a test job's own server: the retried
    job in vertex_world.py), both below the kernel's ephemeral ports (32768 and up, which every
    outgoing connection of the machine draws from, the even ones first): a port found by
    binding port 0 is one of those, and its neighbour may be some connection's local port by the
    time the job binds it."""
    for _ in range(1000):
        port = random.randrange(low, high - 1)
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("", port))
                second.bind(("", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no two free ports in {low}-{high}")


@dataclass
class LocalReplicas:
    """Call it with a RunContext (FakeVertex(runner=LocalReplicas(...)))."""

    root: Path  # each job gets a directory here: the package install and one disk per replica
    running: threading.Event = field(default_factory=threading.Event)  # every replica started
    pids: list[int] = field(default_factory=list)
    outputs: dict[str, list[str]] = field(default_factory=dict)  # task -> its lines
    docker: tuple[str, ...] = ()  # a `docker` CLI for containerSpec jobs (tests: the podman shim)
    job_retries: int = 0  # after a failure Vertex may run the whole job again, on new VMs
    written_back: bool = False  # a job's /gcs mount went back to the bucket

    def __call__(self, ctx: RunContext) -> RunResult:
        job_spec = ctx.job["jobSpec"]
        pools = [p or {} for p in job_spec["workerPoolSpecs"]]  # {}: a pool left empty
        container = pools[0].get("containerSpec")
        package = pools[0].get("pythonPackageSpec") or container
        work = Path(tempfile.mkdtemp(prefix=f"job-{ctx.job_id[-6:]}-", dir=self.root))
        site = work if container else self._install(package["packageUris"][0], work)
        if container:  # Vertex mounts the bucket at /gcs/: what the job reads from there
            for e in container.get("env") or []:
                if e["value"].startswith("/gcs/"):
                    self._download(
                        "gs://" + e["value"].removeprefix("/gcs/"), work / e["value"][1:]
                    )
        base = job_spec["baseOutputDirectory"]["outputUriPrefix"]
        mounted = _files(work / "gcs")
        try:
            for retry in range(self.job_retries + 1):
                port = chief_port()  # a new chief: a new address
                cluster = {
                    f"workerpool{i}": [
                        f"127.0.0.1:{port}" for _ in range(int(pool.get("replicaCount", 1)))
                    ]
                    for i, pool in enumerate(pools)
                    if pool
                }
                procs = self._start(pools, container, cluster, base, site, work, retry, port)
                outcome = self._wait(ctx, procs)
                if ctx.cancelled.is_set() or outcome is None or retry == self.job_retries:
                    return outcome
                ctx.log("", f"the job failed ({outcome[1]}); retrying it on new machines")
            return None
        finally:  # Cloud Storage FUSE: what the replicas wrote under /gcs/ is in the bucket
            self._write_back(work / "gcs", mounted)

    def _start(
        self,
        pools: list[dict[str, Any]],
        container: dict[str, Any] | None,
        cluster: dict[str, list[str]],
        base: str,
        site: Path,
        work: Path,
        retry: int,
        port: int,
    ) -> dict[str, subprocess.Popen[str]]:
        """One process per replica, each on a disk of its own (a retry: new disks, new VMs) with
        its own install of the package, as each Vertex VM has: nothing a replica writes beside
        its code reaches another, or the next attempt. Pool 2 with Google's reductionserver
        image runs a stand-in reducer (REDUCER)."""
        procs: dict[str, subprocess.Popen[str]] = {}
        trainers = sum(int(p.get("replicaCount", 1)) for p in pools[:2] if p)
        for i, pool in enumerate(pools):
            package = pool.get("pythonPackageSpec") or pool.get("containerSpec") or {}
            reducer = "reductionserver" in str(package.get("imageUri", ""))
            for index in range(int(pool.get("replicaCount", 1)) if pool else 0):
                task = f"workerpool{i}-{index}"
                disk = work / (f"{task}-retry{retry}" if retry else task)
                disk.mkdir()
                code = site
                if not (container or reducer):  # each VM installs the package on its own disk
                    code = disk / "site"
                    shutil.copytree(site, code, symlinks=True)
                env = {k: v for k, v in os.environ.items() if not k.startswith("GPUTRAIN_")}
                env.update({e["name"]: e["value"] for e in package.get("env", [])})
                if i < 2:  # what Google's PyTorch samples read (init_method="env://")
                    env.update(
                        MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port),
                        WORLD_SIZE=str(trainers),
                        RANK=str(index if i == 0 else 1 + index),
                    )
                env.update(
                    PYTHONPATH=str(code),
                    OMP_NUM_THREADS="1",
                    CLUSTER_SPEC=json.dumps(
                        {
                            "cluster": cluster,
                            "environment": "cloud",
                            "task": {"type": f"workerpool{i}", "index": index, "trial": ""},
                            "job": json.dumps({"python_module": package.get("pythonModule")}),
                        }
                    ),
                    AIP_MODEL_DIR=f"{base}model/",
                    AIP_CHECKPOINT_DIR=f"{base}checkpoints/",
                    AIP_TENSORBOARD_LOG_DIR=f"{base}logs/",
                )
                if reducer:
                    argv = [sys.executable, "-c", REDUCER, str(trainers)]
                elif not container:
                    argv = [sys.executable, "-m", package["pythonModule"], *package["args"]]
                else:  # in the image: host network, /gcs mounted, env by name
                    (work / "gcs").mkdir(exist_ok=True)
                    vertex_env = ("CLUSTER_SPEC", "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR",
                                  "AIP_TENSORBOARD_LOG_DIR", *(("MASTER_ADDR", "MASTER_PORT",
                                  "WORLD_SIZE", "RANK") if i < 2 else ()))  # fmt: skip
                    names = [x for n in vertex_env for x in ("-e", n)]
                    names += [x for e in package.get("env", []) for x in ("-e", e["name"])]
                    argv = [
                        *self.docker, "run", "--rm", "--network", "host",
                        "-v", f"{work / 'gcs'}:/gcs", *names, package["imageUri"],
                        *package.get("command", []), *package.get("args", []),
                    ]  # fmt: skip
                procs[task] = subprocess.Popen(
                    argv,
                    cwd=disk,
                    env=env,
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                self.pids.append(procs[task].pid)
        return procs

    def _wait(self, ctx: RunContext, procs: dict[str, subprocess.Popen[str]]) -> RunResult:
        """Until every replica ended; the first failure stops the others and fails the job."""
        readers = [
            threading.Thread(target=self._stream, args=(ctx, task, p), daemon=True)
            for task, p in procs.items()
        ]
        for r in readers:
            r.start()
        self.running.set()
        first_failure: tuple[str, int] | None = None
        trainers = {t: p for t, p in procs.items() if not t.startswith("workerpool2-")}
        while any(p.poll() is None for p in trainers.values()):
            failed = [(t, p.returncode) for t, p in procs.items() if p.poll()]
            if failed:  # a replica failed: Vertex fails the job and stops the others
                first_failure = failed[0]
            if ctx.cancelled.wait(0.2) or failed:
                self._stop(procs)
                break
        self._stop(procs)  # the reducers serve until the training replicas end
        for r in readers:
            r.join(timeout=10)
        if ctx.cancelled.is_set():
            return None  # the fake records CANCELLED
        first_failure = first_failure or next(
            ((t, p.returncode) for t, p in trainers.items() if p.returncode), None
        )
        if first_failure is None:
            return None
        task, code = first_failure
        return (
            "JOB_STATE_FAILED",
            f"The replica {task} exited with a non-zero status of {code}. "
            "To find out more about why your job exited please check the logs.",
        )

    def _write_back(self, mount: Path, before: dict[Path, float]) -> None:
        """Every file created or changed under the /gcs mount, uploaded to its bucket."""
        from google.cloud.storage import Client

        for path, mtime in _files(mount).items():
            if before.get(path) == mtime:
                continue
            bucket, _, name = str(path.relative_to(mount)).partition("/")
            Client().bucket(bucket).blob(name).upload_from_filename(str(path))
        self.written_back = True

    def _download(self, uri: str, to: Path) -> None:
        from google.cloud.storage import Client

        bucket, _, name = uri.removeprefix("gs://").partition("/")
        to.parent.mkdir(parents=True, exist_ok=True)
        Client().bucket(bucket).blob(name).download_to_filename(str(to))

    def _install(self, uri: str, work: Path) -> Path:
        """pip install the package from the bucket, as the executor image does (deps: ours),
        once per distinct package in this process: the install every replica copies onto its
        own disk (never run from, never written to)."""
        archive = work / uri.rsplit("/", 1)[-1]
        self._download(uri, archive)
        installed = _installs() / hashlib.sha256(archive.read_bytes()).hexdigest()
        if not installed.is_dir():
            part = Path(tempfile.mkdtemp(dir=installed.parent))  # jobs may run at once
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                 "--no-build-isolation", "--target", str(part / "site"), str(archive)],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
            with contextlib.suppress(OSError):  # unless another job's install got there first
                (part / "site").rename(installed)
            shutil.rmtree(part)
        return installed

    def _stream(self, ctx: RunContext, task: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        lines = self.outputs.setdefault(task, [])
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            ctx.log(task, line.rstrip("\n"))

    def _stop(self, procs: dict[str, subprocess.Popen[str]]) -> None:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@functools.cache
def _installs() -> Path:
    """Where each distinct package's first install stays (by its sha256) for the jobs after it
    in this process; removed when the process ends."""
    where = Path(tempfile.mkdtemp(prefix="gputrain-vertex-installs-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    return where


#: The stand-in for Google's reductionserver container: it serves until Vertex stops it once
#: the training replicas ended (the real one is a restricted image, not runnable here).
REDUCER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print(f'reduction server: serving {sys.argv[1]} training replicas', flush=True)\n"
    "while True: time.sleep(1)\n"
)


def _files(root: Path) -> dict[Path, float]:
    return {p: p.stat().st_mtime for p in root.rglob("*") if p.is_file()} if root.is_dir() else {}


def processes_under(directory: Path) -> list[int]:
    """Pids of the processes whose working directory is inside `directory` (ours, by /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = Path(os.readlink(proc / "cwd"))
        except OSError:
            continue
        if cwd.is_relative_to(directory) and alive(int(proc.name)):
            found.append(int(proc.name))
    return found
