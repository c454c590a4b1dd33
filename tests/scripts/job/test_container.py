"""Container images (scripts/job/container.py): references checked, tags resolved to digests by a
real registry (Debian's docker-registry), and a real local run through the launcher whose
torchrun command runs inside a tiny image under podman (as docker's CLI): environment by name,
the run dir mounted, secrets redacted, the container gone afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.base.errors import UserError
from scripts.job.container import (
    NCCL_ENV_IN_CONTAINER,
    ImageRef,
    build_docker_run,
    build_in_image_command,
    image_key,
    nccl_entry,
    parse_image,
    resolve_digest,
)
from scripts.job.environment import EnvironmentSetupError, plan_environment
from scripts.job.image_node import build_node_check_command
from scripts.job.launch import launch_torchrun
from scripts.job.records import Job, TrainingError
from scripts.targets.session import close_all, connect
from tests.support.containers import Podman, Registry, require_tools
from tests.support.local_fleet import local_fleet

#: the image's "python3": prints what it was started with, writes into the mounted out dir
FAKE_PYTHON = """#!/bin/sh
echo "in-container args: $1 $2 run=$GPUTRAIN_RUN_ID mode=$MODE token=$TOK pwd=$(pwd)"
mkdir -p "$GPUTRAIN_OUT" && echo inside > "$GPUTRAIN_OUT/marker.txt"
"""


def test_references() -> None:
    ref = parse_image("us-docker.pkg.dev/p/r/train:v1", "--image")
    assert ref == ImageRef("us-docker.pkg.dev", "p/r/train", "v1")
    assert parse_image("localhost:5000/a/b", "image").tag == "latest"
    pinned = parse_image("r.io/a@sha256:" + "a" * 64, "image")
    assert pinned.digest == "sha256:" + "a" * 64 and resolve_digest(pinned) is pinned
    # a registry host as distribution/reference's grammar has it: no empty label, no dash at
    # a label's end (such a host made the lookup raise UnicodeError: a traceback)
    for bad in (
        "ubuntu:22.04",
        "r.io/A/b",
        "r.io/a:b c",
        "",
        "../x",
        ".r.io/x",
        "r..io/x",
        "r-.io/x",
    ):
        with pytest.raises(UserError) as e:
            parse_image(bad, "gputrain:image")
        assert str(e.value).startswith(f"gputrain:image: {bad!r} is not allowed")
    long_label = parse_image("a" * 64 + ".io/x", "image")  # the grammar allows it, DNS does not
    with pytest.raises(UserError, match=r"cannot reach a{64}\.io"):
        resolve_digest(long_label)


def test_docker_run_passes_values_by_name_only() -> None:
    ref = ImageRef("r.io", "a/b", "v", "sha256:" + "b" * 64)
    cmd = build_docker_run(ref, name="gputrain-r1", gpus=True, env_names=["TOK", "MODE"])
    assert "--gpus all" in cmd and "--network host --ipc host" in cmd
    assert '-v "$RUN:$RUN" -w "$RUN/code"' in cmd and "-e TOK -e MODE" in cmd
    assert '--user "$(id -u):$(id -g)"' in cmd
    assert cmd.endswith("r.io/a/b@sha256:" + "b" * 64)
    assert "--gpus" not in build_docker_run(ref, name="n", gpus=False, env_names=[])
    assert "nvidia-container-toolkit" in build_node_check_command(gpus=True)
    assert "GPUTRAIN_DATA" not in cmd  # no datasets: nothing of theirs
    names = ["GPUTRAIN_DATA_DIR", "GPUTRAIN_DATA_TRAIN"]
    cmd = build_docker_run(ref, name="n", gpus=True, env_names=["TOK"], data_names=names)
    assert '-v "$GPUTRAIN_DATA_DIR:$GPUTRAIN_DATA_DIR:ro"' in cmd
    assert "-e TOK -e GPUTRAIN_DATA_DIR -e GPUTRAIN_DATA_TRAIN" in cmd


@pytest.fixture
def podman(tmp_path: Path) -> Iterator[Podman]:
    require_tools()
    p = Podman(tmp_path / "podman")
    yield p
    p.cleanup()


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    require_tools()
    r = Registry(tmp_path / "registry")
    yield r
    r.stop()


def _push(podman: Podman, registry: Registry) -> ImageRef:
    podman.import_image("localhost/gputrain-tiny:1", {"/usr/bin/python3": FAKE_PYTHON})
    target = f"{registry.host}/gputrain/tiny:1"
    podman.trust(registry.host)
    podman("push", "-q", "localhost/gputrain-tiny:1", f"docker://{target}")
    podman("rmi", "-f", "localhost/gputrain-tiny:1")  # the node must pull it
    return resolve_digest(parse_image(target, "--image"), insecure=True)


def test_registry_resolves_tags_and_refuses_missing_ones(
    podman: Podman, registry: Registry
) -> None:
    ref = _push(podman, registry)
    assert ref.digest is not None and ref.digest.startswith("sha256:")
    with pytest.raises(UserError) as e:
        resolve_digest(parse_image(f"{registry.host}/gputrain/tiny:nope", "i"), insecure=True)
    assert (
        str(e.value)
        == f"image {registry.host}/gputrain/tiny:nope: not found in {registry.host} (404)"
    )


def test_local_run_inside_the_image(
    podman: Podman, registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _push(podman, registry)
    monkeypatch.setenv("PATH", f"{podman.shim_dir}:{os.environ['PATH']}")
    fleet = local_fleet()
    ts = connect(fleet, deadline_s=10, local_root=tmp_path / "node")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print('unused: the image runs its own')\n")
    lines: list[str] = []
    job = Job(
        run_id="img-run",
        entry=("train.py",),
        env={"MODE": "fast"},
        workdir=tmp_path / "proj",
        include_trainer=False,
        secrets={"TOK": "tok-value-123"},
        image=ref,
    )
    try:
        res = launch_torchrun(
            fleet,
            ts,
            job,
            tmp_path / "results",
            on_line=lambda n, ln: lines.append(ln),
            settle_s=0.5,
        )
        assert res.ok, lines
        line = next(ln for ln in lines if "in-container" in ln)
        assert "args: -m torch.distributed.run run=img-run mode=fast token=*** pwd=" in line
        assert line.endswith("/.gputrain/runs/img-run/code")
        assert (next((tmp_path / "results").rglob("marker.txt"))).read_text() == "inside\n"
        assert podman("ps", "-aq").stdout.strip() == ""  # --rm: nothing left running
        # pulled once per node: the next start finds the digest there
        again = launch_torchrun(
            fleet, ts, Job(**{**job.__dict__, "run_id": "img-run2"}), tmp_path / "r2", settle_s=0.5
        )
        assert again.ok
    finally:
        close_all(ts)


def test_a_node_without_docker_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no docker there (the shim is not on it)
    if Path("/usr/bin/docker").exists():
        pytest.skip("this machine has docker")
    fleet = local_fleet()
    ts = connect(fleet, deadline_s=10, local_root=tmp_path / "node")
    job = Job(
        run_id="img-x",
        entry=("x.py",),
        workdir=tmp_path,
        include_trainer=False,
        image=ImageRef("r.io", "a", "v", "sha256:" + "c" * 64),
    )
    with pytest.raises(EnvironmentSetupError) as e:
        launch_torchrun(fleet, ts, job, tmp_path / "res")
    assert str(e.value).startswith("node local: cannot run the image r.io/a:v: missing: docker")
    close_all(ts)


def test_stopping_a_run_removes_its_container(
    podman: Podman, registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped from outside (the launcher's stop, as on a failure elsewhere or Ctrl-C):
    its container is signalled and then removed by name, whatever the docker CLI did."""
    import threading
    import time

    from scripts.job.launch import stop_job

    podman.import_image(
        "localhost/gputrain-sleepy:1",
        {"/usr/bin/python3": "#!/bin/sh\necho started; exec sleep 300\n"},
    )
    target = f"{registry.host}/gputrain/sleepy:1"
    podman.trust(registry.host)
    podman("push", "-q", "localhost/gputrain-sleepy:1", f"docker://{target}")
    ref = resolve_digest(parse_image(target, "--image"), insecure=True)
    monkeypatch.setenv("PATH", f"{podman.shim_dir}:{os.environ['PATH']}")
    fleet = local_fleet()
    ts = connect(fleet, deadline_s=10, local_root=tmp_path / "node")
    (tmp_path / "proj").mkdir()
    job = Job(
        run_id="img-stop",
        entry=("x.py",),
        workdir=tmp_path / "proj",
        include_trainer=False,
        image=ref,
    )
    lines: list[str] = []

    def stop_when_started() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end and "started" not in lines:
            time.sleep(0.1)
        assert podman("ps", "-q").stdout.strip()  # it runs
        stop_job(ts, "img-stop", grace_s=2)

    stopper = threading.Thread(target=stop_when_started, daemon=True)
    stopper.start()
    try:
        with pytest.raises(TrainingError):  # stopped from outside: a failed run
            launch_torchrun(
                fleet, ts, job, tmp_path / "res", on_line=lambda n, ln: lines.append(ln)
            )
    finally:
        stopper.join(timeout=60)
        close_all(ts)
    assert podman("ps", "-aq").stdout.strip() == ""


@pytest.mark.parametrize(("inside", "ok"), [(2, True), (1, False)])
def test_gpu_nodes_see_their_gpus_inside_the_image(
    podman: Podman,
    registry: Registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    inside: int,
    ok: bool,
) -> None:
    """On a GPU node the image's own nvidia-smi (`--gpus all`) must see the expected GPUs before
    the run starts; else one line names the node and the count."""
    smi = "#!/bin/sh\n" + "echo 'NVIDIA L4, 23034 MiB'\n" * inside
    podman.import_image(
        "localhost/gputrain-gpu:1", {"/usr/bin/python3": FAKE_PYTHON, "/usr/bin/nvidia-smi": smi}
    )
    target = f"{registry.host}/gputrain/gpu:1"
    podman.trust(registry.host)
    podman("push", "-q", "localhost/gputrain-gpu:1", f"docker://{target}")
    ref = resolve_digest(parse_image(target, "--image"), insecure=True)
    toolkit = podman.shim_dir / "nvidia-ctk"  # a GPU host has the NVIDIA container toolkit
    toolkit.write_text("#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.17.0'\n")
    toolkit.chmod(0o755)
    monkeypatch.setenv("PATH", f"{podman.shim_dir}:{os.environ['PATH']}")
    fleet = local_fleet(2)
    ts = connect(fleet, deadline_s=10, local_root=tmp_path / "node")
    (tmp_path / "proj").mkdir()
    job = Job(
        run_id="img-gpu",
        entry=("x.py",),
        workdir=tmp_path / "proj",
        include_trainer=False,
        image=ref,
    )
    try:
        if ok:
            assert launch_torchrun(fleet, ts, job, tmp_path / "res", settle_s=0.5).ok
        else:
            with pytest.raises(EnvironmentSetupError) as e:
                launch_torchrun(fleet, ts, job, tmp_path / "res")
            assert str(e.value).startswith(
                f"node local: nvidia-smi inside {registry.host}/gputrain/gpu:1 sees 1 GPU(s), "
                "expected 2"
            )
    finally:
        close_all(ts)
    calls = podman.calls.read_text()
    assert f"run --rm --network none --gpus all {ref.pinned} nvidia-smi" in calls
    if ok:  # the run itself: GPUs, host network and IPC, two processes per node
        user = f"{os.getuid()}:{os.getgid()}"
        assert f"--network host --ipc host --user {user} -e HOME=/tmp --gpus all" in calls
        assert "--nproc-per-node 2" in calls


@pytest.mark.parametrize("kind", ["rdma", "tcpxo"])
def test_a_fabric_stack_gives_the_container_its_gpu_network(kind: str) -> None:
    """GPUDirect: the NCCL env file mounted and sourced inside (before the command), the RDMA
    devices (gIB) or the aperture devices (TCPXO) and the plugin's libraries read-only."""
    ref = ImageRef("r.io", "a/b", "v", "sha256:" + "e" * 64)
    cmd = build_docker_run(ref, name="n", gpus=True, env_names=[], fabric=kind)
    assert f'-v "$NCCL_ENV_FILE:{NCCL_ENV_IN_CONTAINER}:ro"' in cmd
    expected = {
        "rdma": ["--device /dev/infiniband", "--ulimit memlock=-1", "--cap-add IPC_LOCK",
                 "-v /usr/local/gib:/usr/local/gib:ro"],
        "tcpxo": ["-v /dev/aperture_devices:/dev/aperture_devices",
                  "-v /var/lib/tcpxo/lib64:/var/lib/tcpxo/lib64:ro"],
    }[kind]  # fmt: skip
    assert all(arg in cmd for arg in expected)
    assert "/dev/infiniband" not in cmd if kind == "tcpxo" else "aperture" not in cmd
    assert cmd.endswith(
        f"{ref.pinned} sh -c '. {NCCL_ENV_IN_CONTAINER}; exec \"$@\"' gputrain-nccl"
    )
    plain = build_docker_run(ref, name="n", gpus=True, env_names=[])
    assert "NCCL_ENV_FILE" not in plain and plain.endswith(ref.pinned)


def test_the_environment_is_keyed_by_the_image_digest(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("tiktoken\n")
    env = plan_environment(tmp_path)
    assert env is not None
    a = ImageRef("r.io", "a", "v", "sha256:" + "1" * 64)
    b = ImageRef("r.io", "a", "v", "sha256:" + "2" * 64)
    keys = {env.for_python(image_key(a)).key, env.for_python(image_key(b)).key}
    assert len(keys | {env.for_python("python3").key}) == 3


def test_nccl_env_and_scripts_run_inside_the_image(
    podman: Podman, registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For real under podman: the fabric's env file sourced inside (its library dir before the
    image's own LD_LIBRARY_PATH; /dev/null where the node has none), and a node script run
    inside the image from its stdin, the node state mounted, its exit status kept."""
    import subprocess

    podman.import_image("localhost/gputrain-env:1", {"/gputrain-image": "#!/bin/sh\necho in\n"})
    podman("tag", "localhost/gputrain-env:1", f"{registry.host}/gputrain/env:1")
    podman.trust(registry.host)
    podman("push", "-q", f"{registry.host}/gputrain/env:1")
    ref = resolve_digest(parse_image(f"{registry.host}/gputrain/env:1", "i"), insecure=True)
    monkeypatch.setenv("PATH", f"{podman.shim_dir}:{os.environ['PATH']}")
    nccl = tmp_path / "nccl.env"
    nccl.write_text(
        "export NCCL_NET=gIB\nexport LD_LIBRARY_PATH=/usr/local/gib/lib64${LD_LIBRARY_PATH:+:"
        "$LD_LIBRARY_PATH}\n"
    )
    entry = " ".join(nccl_entry())
    show = "sh -c 'echo net=$NCCL_NET lib=$LD_LIBRARY_PATH'"
    for env_file, expected in (
        (nccl, "net=gIB lib=/usr/local/gib/lib64:/img"),
        ("/dev/null", "net= lib=/img"),
    ):
        cmd = (
            f'docker run --rm -e LD_LIBRARY_PATH=/img -v "$NCCL_ENV_FILE:{NCCL_ENV_IN_CONTAINER}:ro" '
            f"{ref.pinned} {entry} {show}"
        )
        r = subprocess.run(
            ["sh", "-c", cmd],
            capture_output=True,
            text=True,
            env={**os.environ, "NCCL_ENV_FILE": str(env_file)},
        )
        assert r.stdout.strip() == expected, r.stderr

    root = tmp_path / "root"
    root.mkdir()
    script = 'echo "secret=$TOK" > "$ROOT/.gputrain/seen"; /gputrain-image; exit 3'
    cmd = build_in_image_command(
        ref, f"ROOT=$(pwd)\nexport TOK=v1\n{script}", name="e1", gpus=False
    )
    r = subprocess.run(["sh", "-c", cmd], cwd=root, capture_output=True, text=True)
    assert r.returncode == 3 and r.stdout.strip() == "in", r.stderr
    assert (root / ".gputrain" / "seen").read_text() == "secret=v1\n"
    assert "v1" not in podman.calls.read_text()  # the script came on stdin, not in argv
