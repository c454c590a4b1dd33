"""Container images on the sshd test bed, through the CLI: 2 test hosts whose `docker` is podman
pull the job's image from a real registry on the bridge (tests/support/container_bed.py);
requirements and `setup` run inside the image (cached on the node by the image's digest), then
gputrain's production `docker run` (host network and IPC, the run dir mounted) starts torchrun
inside it on both hosts and the two form one gloo DDP job; results and exit codes come home, a
stop removes the containers, `verify` runs nvidia-smi inside the image, a stack VM without
docker gets it installed (a fake apt-get that provides the shim) and the job in the image its
dataset, and a stack's `build:` Dockerfile
is built here, pushed, and a 2-node launch runs in it on the bed; and a Vertex AI user's own container, built
from their Dockerfile as it is and run from their gcloud config.yaml on the fake Vertex."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scripts.cli import main
from scripts.job.container import INSECURE_REGISTRIES_ENV, ImageRef
from scripts.job.image_build import REGISTRY_HOST_ENV
from scripts.job.launch import stop_job
from scripts.settings import Settings
from scripts.targets.session import close_all, connect
from tests.support.container_bed import IMAGE_MARK, ContainerBed
from tests.support.containers import Podman
from tests.support.fake_artifact_registry import FakeArtifactRegistry
from tests.support.gcs_emulator import GcsEmulator
from tests.support.stack_world import World, assert_torn_down
from tests.support.testbed import GpuConfig, TestBed, TestHost
from tests.support.vertex_world import BUCKET as VERTEX_BUCKET
from tests.support.vertex_world import PROJECT as VERTEX_PROJECT
from tests.support.vertex_world import World as VertexWorld
from tests.support.vertex_world import assert_torn_down as assert_vertex_torn_down
from tests.support.vertex_world import world_factory as vertex_world_factory
from tests.support.wheelhouse import PackageIndex, build_wheel

SETUP = f"{IMAGE_MARK}\npython -c 'import gputrain_probe; print(\"probe ok\")'"
#: A smaller DDP job: says whether it runs inside the image, all-reduces once, writes its rank.
INSIDE = """import os, torch, torch.distributed as dist
import gputrain_probe  # noqa: F401  (the environment built inside the image)
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)
print(f"inside={os.path.exists('/gputrain-image')} world={dist.get_world_size()} sum={t.item():g}")
open(os.path.join(os.environ["GPUTRAIN_OUT"], f"rank{dist.get_rank()}.txt"), "w").write("ok")
dist.destroy_process_group()
"""
#: Torch-free: the environment built inside the image, found again by a second run.
CACHED = """import importlib.metadata, os
import gputrain_probe  # noqa: F401
v = importlib.metadata.version("gputrain-probe")
print(f"inside={os.path.exists('/gputrain-image')} probe={v}", flush=True)
"""
#: Torch-free: where the subject is getting the image to the VMs (docker installed, the image
#: built), not DDP inside it (above): whether it runs inside the image, in torchrun's world of 2.
INSIDE_NO_TORCH = """import os
print(f"inside={os.path.exists('/gputrain-image')} world={os.environ['WORLD_SIZE']}", flush=True)
"""
#: Torch-free jobs for the failure and the stop (each rank of ddp_sum.py would pay torch's
#: import): rank 1 fails at once while rank 0 waits; a job that runs until it is stopped.
FAILS = "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(120)\n"
RUNS = "import time\nprint('running', flush=True)\ntime.sleep(300)\n"


@pytest.fixture
def cbed(tb: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ContainerBed]:
    bed = ContainerBed(tb, tmp_path / "containers")
    monkeypatch.setenv(INSECURE_REGISTRIES_ENV, bed.registry.host)
    try:
        yield bed
    finally:
        bed.close()


@pytest.fixture
def index(tb: TestBed, tmp_path: Path) -> Iterator[PackageIndex]:
    with PackageIndex(tmp_path / "index", host=tb.bridge_address) as idx:
        idx.add(build_wheel("gputrain-probe", tmp_path / "wheel"))
        yield idx


def _hosts_file(
    tb: TestBed, d: Path, hosts: list[TestHost], image: ImageRef, extra: str = "cpu: true\n"
) -> Path:
    return tb.hosts_file(d, hosts, f"image: {image.repository}:{image.tag}\n{extra}")


def _ready_s(out: str) -> float:
    """The environment step's seconds (its `... ready on N node(s) in X s` line)."""
    found = re.search(r"^environment \S+ \(.*\) ready on \d+ node\(s\) in ([0-9.]+) s", out, re.M)
    assert found, out
    return float(found[1])


def _runs(host: TestHost) -> Path:
    return host.dir / "home" / ".gputrain" / "runs"


def test_hosts_two_node_run_inside_the_image(
    tb: TestBed,
    cbed: ContainerBed,
    index: PackageIndex,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = tb.add_host(containers=True), tb.add_host(containers=True)
    pods = [cbed.enable(h) for h in (a, b)]
    image = cbed.image("bed")
    proj = tmp_path / "proj"
    path = _hosts_file(tb, proj, [a, b], image)
    (proj / "inside.py").write_text(INSIDE)
    (proj / "cached.py").write_text(CACHED)
    (proj / "requirements.txt").write_text("gputrain-probe==1.0\n")
    monkeypatch.chdir(proj)
    settings = Settings(root=proj, runs_dir=proj / "runs", connect_deadline_s=30)
    pip = ["--env", f"PIP_INDEX_URL={index.url}", "--env", f"PIP_TRUSTED_HOST={tb.bridge_address}"]
    run = ["run", "--hosts", str(path), *pip, "--setup", SETUP]
    login = pwd.getpwnam(tb.user)
    ids = f"{login.pw_uid}:{login.pw_gid}"  # the SSH user's: what the run writes stays theirs

    assert main([*run, "--", "inside.py"], settings) == 0
    out = capsys.readouterr().out
    assert f"image {image.repository}:1 is {image.digest}" in out
    for node in (a.address, b.address):
        # the image's python builds the environment inside the container: the image's root
        assert f"[{node}] [requirements] Successfully installed gputrain-probe-1.0" in out
        assert f"[{node}] [setup] bed" in out and f"[{node}] [setup] probe ok" in out
    assert f"image {image.repository}:1 ({image.digest}) on 2 node(s)" in out
    assert "pulled" in out
    assert out.count("inside=True world=2 sum=3") == 2  # one gloo job across both containers
    for pod in pods:  # pulled once per node, then the environment and the run inside it
        calls = pod.calls.read_text().splitlines()
        assert sum(c.startswith(f"pull -q {image.pinned}") for c in calls) == 1
        env_run, job_run = (c for c in calls if c.startswith("run "))
        assert env_run.startswith("run --rm -i --name gputrain-") and "-env " in env_run
        assert f"--network host --ipc host --user {ids} -e HOME=/tmp" in job_run
        assert f"{image.pinned} ../../../envs/" in job_run
        assert "/bin/python -m torch.distributed.run --nnodes 2" in job_run
    first_s = _ready_s(out)
    # what the ranks wrote in the mounted run dir, on the node and home
    assert len(list(_runs(a).glob("*/**/rank*.txt")) + list(_runs(b).glob("*/**/rank*.txt"))) == 2
    results = max((proj / "runs" / "hosts-lab").glob("*/job.json")).parent
    assert set(json.loads((results / "job.json").read_text())["exit_codes"].values()) == {0}
    assert sorted(p.name for p in results.rglob("rank*.txt")) == ["rank0.txt", "rank1.txt"]
    first = sorted((proj / "runs" / "hosts-lab").glob("*/*/setup.log"))
    assert len(first) == 2 and all("probe ok" in p.read_text() for p in first)

    # the same image and hash: the environment is reused; the ranks run inside the image
    assert main([*run, "--", "cached.py"], settings) == 0
    out = capsys.readouterr().out
    assert out.count("skipped (cached)") == 2 and "Successfully installed" not in out
    cached_s = _ready_s(out)
    with capsys.disabled():  # the figure: the environment step inside the image, first vs cached
        print(f"\nenvironment inside the image: first {first_s:.1f} s, cached {cached_s:.1f} s")
    assert cached_s < first_s
    assert out.count("inside=True probe=1.0") == 2
    assert "present" in out  # the digest is on the nodes already: no second pull
    assert all(cbed.containers_on(h) == [] for h in (a, b))  # --rm: nothing left
    for pod in pods:  # the cached check ran inside the image too; no second pull
        calls = pod.calls.read_text().splitlines()
        assert sum(c.startswith("run --rm -i --name gputrain-") for c in calls) == 2
        assert sum(c.startswith("pull ") for c in calls) == 1


def test_a_failing_rank_and_a_stop_inside_the_image(
    tb: TestBed,
    cbed: ContainerBed,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = tb.add_host(containers=True), tb.add_host(containers=True)
    for h in (a, b):
        cbed.enable(h)
    image = cbed.image("ddp")
    proj = tmp_path / "proj"
    path = _hosts_file(tb, proj, [a, b], image)
    (proj / "fails.py").write_text(FAILS)
    (proj / "runs.py").write_text(RUNS)
    monkeypatch.chdir(proj)
    settings = Settings(root=proj, runs_dir=proj / "runs", connect_deadline_s=30)
    run = ["run", "--hosts", str(path)]

    # rank 1 (the worker's) fails: its exit code comes home, the head is stopped
    assert main([*run, "--", "fails.py"], settings) == 1
    captured = capsys.readouterr()
    assert "failed on node" in captured.err
    record = json.loads(max((proj / "runs" / "hosts-lab").glob("*/job.json")).read_text())
    assert sorted(record["exit_codes"].values()) != [0, 0]
    assert all(cbed.containers_on(h) == [] for h in (a, b))

    # a long job stopped from outside (as `gputrain stop` does): the containers are removed.
    # (The TERM reaches torchrun inside; rootless podman's CLI then takes longer than the grace
    # period to exit, so the stop ends with its SIGKILL: no exit code is recorded here.)
    fleet = tb.fleet([a, b])
    stopped: list[str] = []

    def stop_when_running() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            if all(cbed.containers_on(h) for h in (a, b)):
                ids = [p.name for p in _runs(a).iterdir()]
                ts = connect(fleet, deadline_s=30)
                try:
                    stopped.append(str(stop_job(ts, max(ids), grace_s=3)))
                finally:
                    close_all(ts)
                return
            time.sleep(0.5)

    stopper = threading.Thread(target=stop_when_running, daemon=True)
    stopper.start()
    assert main([*run, "--", "runs.py"], settings) == 1
    stopper.join(timeout=60)
    assert stopped, capsys.readouterr().out
    assert all(cbed.containers_on(h) == [] for h in (a, b))


def test_verify_runs_nvidia_smi_inside_the_image(
    tb: TestBed,
    cbed: ContainerBed,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    host = tb.add_host(containers=True, gpus=GpuConfig(model="NVIDIA L4", count=2))
    pod = cbed.enable(host)
    ctk = host.dir / "bin" / "nvidia-ctk"  # a GPU host has the NVIDIA container toolkit
    ctk.write_text("#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.17.8'\n")
    ctk.chmod(0o755)
    image = cbed.image("gpu", gpus=2)
    gpus = "gpus: {model: NVIDIA L4, count: 2}\n"
    path = _hosts_file(tb, tmp_path / "lab", [host], image, extra=gpus)
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs", connect_deadline_s=30)
    assert main(["verify", "--hosts", str(path)], settings) == 0
    out = capsys.readouterr().out
    assert f"image {image.repository}:1 ({image.digest}) verified 1 node(s)" in out
    assert "2 GPU(s) inside" in out
    assert f"run --rm --network none --gpus all {image.pinned} nvidia-smi" in pod.calls.read_text()

    one = cbed.image("gpu1", gpus=1)  # an image whose nvidia-smi sees fewer: one line, exit 1
    path = _hosts_file(tb, tmp_path / "lab", [host], one, extra=gpus)
    assert main(["verify", "--hosts", str(path)], settings) != 0
    err = capsys.readouterr().err
    assert f"nvidia-smi inside {one.repository}:1 sees 1 GPU(s), expected 2" in err


def test_stack_vm_without_docker_gets_it_installed_and_the_dataset(
    world: Callable[..., World],
    cbed: ContainerBed,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A fresh VM gets docker and the NVIDIA container toolkit installed; with `data:` too (one
    world for both), the dataset is copied to each VM as without an image, and the job inside
    the container finds it at $GPUTRAIN_DATA_<NAME> (the variables passed in, the data
    directory mounted read-only at the same path)."""
    image = cbed.image("stack", gpus=1, mark="stack")
    w = world(
        nodes=2,
        bucket=True,
        settings={"image": f"{image.repository}:1", "setup": json.dumps(IMAGE_MARK)},
        containers=lambda h: cbed.enable(h, docker=False),
    )
    assert w.gcs is not None
    objects = {f"shard-{i}.bin": os.urandom(1000 + i) for i in range(3)}
    for rel, data in objects.items():
        w.gcs.write(f"datasets/tiny/{rel}", data)
    (w.dir / "datajob.py").write_text(DATA_JOB)
    rc = w.run(
        "run", "--stack", "e2e", "--yes", "--skip-preflight",
        "--env", f"STORAGE_EMULATOR_HOST={w.gcs.url}",
        "--data", f"train=gs://{w.gcs.bucket_name}/datasets/tiny", "--", "datajob.py",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    for vm in ("e2e-node-0", "e2e-node-1"):
        assert f"{vm}: {image.repository}:1 needs docker and nvidia-container-toolkit" in out
        assert f"[{vm}] [install] installing docker.io" in out
        assert f"[{vm}] [install] done" in out
        assert f"[{vm}] [setup] stack" in out  # the stack's setup, inside the image
    want = hashlib.sha256()
    for rel in sorted(objects):
        want.update(rel.encode() + b"\0" + objects[rel])
    found = re.findall(
        r"\[(e2e-node-\d)\] \[rank\d\]:inside=True world=2 dataset digest (\w+)", out
    )
    assert sorted(found) == [(f"e2e-node-{i}", want.hexdigest()) for i in (0, 1)], out[-3000:]
    for host in w.hosts:
        calls = cbed.apt_log(host).read_text()
        assert "install --no-install-recommends docker.io acl" in calls
        assert "install nvidia-container-toolkit" in calls
        assert "nvidia-ctk runtime configure --runtime=docker" in calls
    assert_torn_down(w)


def test_a_stack_with_build_trains_two_nodes_in_the_image_it_built(
    world: Callable[..., World],
    cbed: ContainerBed,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`build: Dockerfile`: built on this machine (podman behind `docker`), pushed to the stack's
    repository (the bed's registry plays Artifact Registry's host), pulled by digest on both VMs,
    the 2-node launch and the stack's setup inside it; the run's teardown removes the
    repository."""
    base = cbed.image("base", gpus=1, mark="base")
    monkeypatch.setenv("PATH", f"{cbed.builder.shim_dir}:{os.environ['PATH']}")
    monkeypatch.setenv(REGISTRY_HOST_ENV, cbed.registry.host)
    with FakeArtifactRegistry("gputrain-test") as artifacts:
        w = world(
            nodes=2,
            settings={"build": "img/Dockerfile", "setup": json.dumps(IMAGE_MARK)},
            containers=lambda h: cbed.enable(h, docker=False),  # a fresh VM: installed
            artifacts=artifacts,
        )
        (w.dir / "img").mkdir()
        (w.dir / "img" / "Dockerfile").write_text(
            f"FROM {base.repository}:{base.tag}\nCOPY mark {IMAGE_MARK}\n"
        )
        (w.dir / "img" / "mark").write_text("#!/bin/sh\necho built from the dockerfile\n")
        (w.dir / "img" / "mark").chmod(0o755)
        (w.dir / "inside.py").write_text(INSIDE_NO_TORCH)
        rc = w.run("run", "--stack", "e2e", "--yes", "--skip-preflight", "--", "inside.py")
        out = capsys.readouterr().out
        assert rc == 0, out[-3000:]
        assert "building with" in out
        for vm in ("e2e-node-0", "e2e-node-1"):
            assert f"[{vm}] [setup] built from the dockerfile" in out  # the built image's file
        assert out.count("inside=True world=2") == 2
        assert artifacts.repositories[("gputrain-test", "us-central1")] == {}
    assert_torn_down(w)


#: The user's train.py, as Google's PyTorch samples write one: the rendezvous from the env Vertex
#: sets (init_method env://), the model to AIP_MODEL_DIR through the /gcs/ mount.
USER_TRAIN = """import os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
t = torch.tensor([rank + 1.0]); dist.all_reduce(t)
print(f"rank {rank} of {dist.get_world_size()}: all-reduce sum {t.item():g}", flush=True)
if rank == 0:
    model_dir = os.environ["AIP_MODEL_DIR"].replace("gs://", "/gcs/", 1)
    os.makedirs(model_dir, exist_ok=True)
    torch.save({"sum": t}, os.path.join(model_dir, "model.pt"))
dist.destroy_process_group()
"""
#: The user's config.yaml for `gcloud ai custom-jobs create --config` (their own image URI).
USER_CONFIG = """workerPoolSpecs:
  - machineSpec:
      machineType: g2-standard-8
      acceleratorType: NVIDIA_L4
      acceleratorCount: 1
    replicaCount: 1
    containerSpec:
      imageUri: us-central1-docker.pkg.dev/my-project/my-repo/train:latest
  - machineSpec:
      machineType: g2-standard-8
      acceleratorType: NVIDIA_L4
      acceleratorCount: 1
    replicaCount: 1
    containerSpec:
      imageUri: us-central1-docker.pkg.dev/my-project/my-repo/train:latest
"""


@pytest.fixture
def vertex_world(
    tmp_path: Path, gcs: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., VertexWorld]]:
    yield from vertex_world_factory(tmp_path, gcs, monkeypatch)


def test_vertex_runs_the_users_own_container_unchanged_from_their_gcloud_config(
    tb: TestBed,
    cbed: ContainerBed,
    vertex_world: Callable[..., VertexWorld],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The simplest documented custom container (FROM a PyTorch image, COPY train.py, WORKDIR,
    CMD) and the user's gcloud config.yaml: `build:` builds and pushes it, `vertexJobSpec:`
    submits their pools as they are; the fake Vertex runs both replicas in the image (a small
    base whose `python` is the bed's interpreter with torch stands in for the PyTorch image),
    the model comes home from the bucket, and nothing is left."""
    base = f"{cbed.registry.host}/pytorch/pytorch:standin"
    cbed.builder.import_image(
        "localhost/pytorch-standin:1",
        {"/usr/local/bin/python": f'#!/bin/sh\nexec {tb.python} "$@"\n'},
        {"/lib": "usr/lib", "/lib64": "usr/lib64"},
    )
    cbed.builder("push", "-q", "localhost/pytorch-standin:1", f"docker://{base}")
    machines = Podman(tmp_path / "vertex-machines", run_args=cbed.python_mounts())
    machines.trust(cbed.registry.host)
    monkeypatch.setenv("PATH", f"{cbed.builder.shim_dir}:{os.environ['PATH']}")
    monkeypatch.setenv(REGISTRY_HOST_ENV, cbed.registry.host)
    try:
        with FakeArtifactRegistry(VERTEX_PROJECT) as artifacts:
            w = vertex_world(docker=(str(machines.shim_dir / "docker"),), artifacts=artifacts)
            project = w.settings.root
            (project / "app").mkdir()
            (project / "app" / "Dockerfile").write_text(
                f'FROM {base}\nCOPY train.py /app/train.py\nWORKDIR /app\nCMD ["python", "train.py"]\n'
            )
            (project / "app" / "train.py").write_text(USER_TRAIN)
            (project / "config.yaml").write_text(USER_CONFIG)
            stack = project / "Pulumi.vtest.yaml"
            stack.write_text(
                stack.read_text()
                + "  gputrain:build: app/Dockerfile\n  gputrain:vertexJobSpec: config.yaml\n"
            )
            rc = w.run("run", "--stack", "vtest", "--yes", "--skip-preflight")
            out, err = capsys.readouterr()
            assert rc == 0, out[-3000:] + err[-2000:]
            [body] = w.created()
            pools = body["jobSpec"]["workerPoolSpecs"]
            built = f"{cbed.registry.host}/{VERTEX_PROJECT}/gputrain-vtest/app@sha256:"
            for pool in pools:  # their pools; only the image is the one built from their file
                assert set(pool["containerSpec"]) == {"imageUri"}  # no command, args, env
                assert pool["containerSpec"]["imageUri"].startswith(built)
                assert pool["machineSpec"]["machineType"] == "g2-standard-8"
            assert body["jobSpec"]["baseOutputDirectory"] == {
                "outputUriPrefix": f"gs://{VERTEX_BUCKET}/runs/{w.run_dir.name}/"
            }
            for rank in (0, 1):
                assert f"rank {rank} of 2: all-reduce sum 3" in out
            assert (w.run_dir / "model" / "model.pt").is_file()  # home from the bucket
            assert machines("ps", "-aq").stdout.split() == []  # --rm: no container left
            assert artifacts.repositories[(VERTEX_PROJECT, "us-central1")] == {}
        assert_vertex_torn_down(w)
    finally:
        machines.cleanup()


#: Rank 0 of each node: whether it runs in the image, and one digest over the dataset it sees.
DATA_JOB = """import hashlib, os
from pathlib import Path
root = Path(os.environ["GPUTRAIN_DATA_TRAIN"])
assert os.environ["GPUTRAIN_DATA_DIR"] == str(root.parent), os.environ["GPUTRAIN_DATA_DIR"]
h = hashlib.sha256()
for p in sorted(q for q in root.rglob("*") if q.is_file()):
    h.update(str(p.relative_to(root)).encode() + b"\\0" + p.read_bytes())
if os.environ.get("LOCAL_RANK", "0") == "0":
    inside, world = os.path.exists("/gputrain-image"), os.environ["WORLD_SIZE"]
    print(f"inside={inside} world={world} dataset digest", h.hexdigest(), flush=True)
"""
