"""A `backend: vertex` stack world, offline: the fake stack runner is the Pulumi program (it makes
the bucket in the storage emulator), tests/support/fake_vertex.py is Vertex AI and Cloud Logging,
its runner starts one real `gputrain_node.vertex_entry` process per replica. Shared by the end-to-end
tests in tests/scripts/targets/vertex/ (their `world` fixture is in that folder's conftest)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.spec import stack_bucket_name
from infra.vertex_pools import REDUCTION_SERVER_IMAGE
from scripts.cli import main
from scripts.settings import Settings
from scripts.targets.gce.clients import GceClients
from scripts.targets.vertex.clients import VertexClients
from tests.support import alive
from tests.support.fake_artifact_registry import FakeArtifactRegistry
from tests.support.fake_compute import FakeCompute
from tests.support.fake_gcp_admin import FakeGcpAdmin, ready_for_doctor
from tests.support.fake_stack import FakeStackRunner
from tests.support.fake_vertex import FakeVertex
from tests.support.gcs_emulator import GcsEmulator
from tests.support.pulumi_mocks import ROOT
from tests.support.vertex_replicas import LocalReplicas, processes_under

PROJECT = "gputrain-test"
BUCKET = stack_bucket_name("vtest", PROJECT)
LONG_STEPS = ("-m", "jobs.steps", "100000", "0.05")  # steps until cancelled
TRAIN = ("-m", "trainer.train", "--preset", "tiny", "--device", "cpu", "--steps", "60",
         "--log-every", "10", "--checkpoint-every", "30", "--eval-batches", "2")  # fmt: skip
STACK_FILE = f"""\
config:
  gcp:project: {PROJECT}
  gputrain:backend: vertex
  gputrain:zones: [us-central1-a]
  gputrain:machineType: g2-standard-8
  gputrain:nodes: 2
  gputrain:spot: true
  gputrain:maxRunDuration: 1h
  gputrain:labels: [team=ml]
  gputrain:sshSourceRanges: [0.0.0.0/0]
"""
#: A CustomJobSpec file Vertex runs: 1 + 3 x a3-highgpu-8g and 8 Reduction Server nodes.
JOB_SPEC = {
    "workerPoolSpecs": [
        {
            "machineSpec": {"machineType": "a3-highgpu-8g"},
            "replicaCount": 1,
            "containerSpec": {"imageUri": "us-docker.pkg.dev/p/r/train:1"},
        },
        {
            "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
            "replicaCount": 3,
            "containerSpec": {"imageUri": "us-docker.pkg.dev/p/r/train:1"},
        },
        {
            "machineSpec": {"machineType": "n1-highcpu-16"},
            "replicaCount": 8,
            "containerSpec": {"imageUri": REDUCTION_SERVER_IMAGE},
        },
    ]
}  # fmt: skip


def job_spec_with(path: str, value: Any) -> Any:
    """JOB_SPEC with the value at a dotted path (list indexes as numbers) set."""
    doc = json.loads(json.dumps(JOB_SPEC))
    *keys, last = path.split(".")
    node = doc
    for k in keys:
        node = node[int(k)] if k.isdigit() else node[k]
    node[int(last) if last.isdigit() else last] = value
    return doc


JOBS = {  # the user's working directory: a module and a script, beside a data file
    "data.txt": "41\n",
    "jobs/__init__.py": "",
    # the trainer's torch-free stand-in (step lines, metrics.jsonl, summary.json), where a test's
    # subject is the job's control (a cancel, a detach), not training
    "jobs/steps.py": (ROOT / "tests" / "support" / "jobs" / "steps.py").read_text(),
    "jobs/answer.py": (
        "import os, sys, time\nfrom pathlib import Path\n"
        "rank = os.environ['RANK']\n"
        "n = int(Path('data.txt').read_text()) + 1\n"
        "print(f'answer {n} from rank {rank}', flush=True)\n"
        "out = Path(os.environ['GPUTRAIN_OUT']); out.mkdir(parents=True, exist_ok=True)\n"
        "(out / 'answer.txt').write_text(str(n))\n"
        "if sys.argv[1:] == ['crash'] and rank == '1':\n"
        "    print('boom: rank 1 failed on purpose', flush=True); sys.exit(3)\n"
    ),
    "jobs/resume.py": (  # a trainer of yours: resumes from its out dir with --resume
        "import os, socket, sys, time\nfrom pathlib import Path\n"
        "out, rank = Path(os.environ['GPUTRAIN_OUT']), os.environ['RANK']\n"
        "attempt = os.environ['GPUTRAIN_ATTEMPT']\n"
        "if '--resume' in sys.argv:\n"
        "    print(f'rank {rank} attempt {attempt} resumed from '\n"
        "          + (out / 'state.txt').read_text(), flush=True)\n"
        "    sys.exit(0)\n"
        "out.mkdir(parents=True, exist_ok=True)\n"
        "(out / 'state.txt').write_text(f'step 3 of rank {rank}')\n"
        "# both saved (rank 1 tells rank 0 over TCP, no torch); then the chief's VM is lost\n"
        "chief = (os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']) + 1)\n"
        "if rank == '0':\n"
        "    with socket.create_server(('', chief[1])) as server:\n"
        "        server.settimeout(60)\n"
        "        server.accept()[0].recv(1)\n"
        "    print('rank 0 lost its VM', flush=True); os._exit(3)\n"
        "deadline = time.monotonic() + 60\n"
        "while True:\n"
        "    try:\n"
        "        socket.create_connection(chief, timeout=5).sendall(b'.'); break\n"
        "    except OSError:\n"
        "        if time.monotonic() > deadline: raise\n"
        "        time.sleep(0.1)\n"
    ),
}


@dataclass
class World:
    dir: Path
    vertex: FakeVertex
    replicas: LocalReplicas
    runner: FakeStackRunner
    compute: FakeCompute
    gcs: GcsEmulator
    settings: Settings
    clients: VertexClients
    doctor: GceClients

    def run(self, *argv: str) -> int:
        return main(list(argv), self.settings, self.doctor, vertex=self.clients)

    @property
    def run_dir(self) -> Path:
        target = self.dir / "runs" / "stack-vtest"
        return target / (target / "LAST_RUN").read_text().strip()

    def created(self) -> list[dict[str, object]]:
        return list(self.vertex.requests_to("POST", r"/customJobs$"))

    def job_states(self) -> list[str]:
        return [str(job.body["state"]) for job in self.vertex.jobs.values()]


def world_factory(
    tmp_path: Path, gcs: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., World]]:
    """The `world` fixture of tests/scripts/targets/vertex (its conftest): make() -> World."""
    made: list[tuple[FakeVertex, FakeCompute]] = []
    admin = FakeGcpAdmin().__enter__()  # Resource Manager, Service Usage, the token endpoint
    ready_for_doctor(monkeypatch, tmp_path / "operator", admin)  # docs' checklist, done

    def make(docker: tuple[str, ...] = (), artifacts: FakeArtifactRegistry | None = None) -> World:
        project = tmp_path / "project"
        project.mkdir()
        (project / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
        (project / "Pulumi.vtest.yaml").write_text(STACK_FILE)
        work = tmp_path / "work"
        for rel, text in JOBS.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        monkeypatch.chdir(work)  # what `run` packages
        (tmp_path / "replicas").mkdir()
        replicas = LocalReplicas(tmp_path / "replicas", docker=docker)
        vertex = FakeVertex(project=PROJECT, runner=replicas).start()
        compute = FakeCompute().__enter__()
        made.append((vertex, compute))
        runner = FakeStackRunner(
            stack_name="vtest",
            project=PROJECT,
            backend="vertex",
            bucket=BUCKET,
            artifacts=artifacts,
        )
        clients = VertexClients(
            runner_for=lambda stack, root: runner,
            vertex_endpoint=vertex.url,
            logging_endpoint=vertex.url,
            compute_endpoint=compute.url,
            artifacts_endpoint=artifacts.url if artifacts else None,
            poll_s=0.3,
            settle_s=0.5,
            retry_pause_s=0,
        )
        settings = Settings(root=project, runs_dir=tmp_path / "runs")
        doctor = GceClients(compute_endpoint=compute.url, admin_endpoint=admin.url)
        return World(tmp_path, vertex, replicas, runner, compute, gcs, settings, clients, doctor)

    yield make
    admin.__exit__(None, None, None)
    for vertex, compute in made:
        vertex.stop()
        compute.__exit__(None, None, None)


def assert_torn_down(w: World) -> None:
    """destroy ran, the bucket is gone, no job of the stack runs and no replica is left."""
    assert "destroy" in w.runner.call_names()
    assert BUCKET not in [b.name for b in w.gcs.client().list_buckets()]
    assert all(s in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
               for s in w.job_states())  # fmt: skip
    assert not [pid for pid in w.replicas.pids if alive(pid)]
    assert processes_under(w.dir / "replicas") == []
