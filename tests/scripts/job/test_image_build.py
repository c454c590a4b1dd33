"""`build:` with a real local build: podman behind the `docker` shim builds a Dockerfile
`FROM` a base image in a real registry (Debian's docker-registry on loopback, standing in for the
stack's Artifact Registry repository), pushes it once the stack's repository exists (a targeted
`up` of the fake stack), and the run gets it at its digest; the second time the registry has the
tag and nothing is built; a Dockerfile that fails to build is one line, exit 2, nothing created."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.components.registry import target_urns
from infra.spec import parse_spec
from infra.stackfile import load_stack_config
from scripts.cli import main
from scripts.job.container import parse_image, resolve_digest
from scripts.job.image_build import REGISTRY_HOST_ENV
from scripts.settings import Settings
from scripts.targets.base import RunOptions
from scripts.targets.gce.clients import GceClients
from scripts.targets.gce.target import GceTarget
from tests.support import ROOT
from tests.support.containers import Podman, Registry, require_tools
from tests.support.fake_artifact_registry import FakeArtifactRegistry
from tests.support.fake_compute import FakeCompute
from tests.support.fake_stack import FakeStackRunner
from tests.support.pulumi_mocks import TEST_PUBLIC_KEY

STACK = "bt"
PROJECT = "gputrain-test"


@dataclass
class UnbuiltProject:
    dir: Path
    podman: Podman
    runner: FakeStackRunner

    @property
    def settings(self) -> Settings:
        return Settings(root=self.dir, runs_dir=self.dir / "runs")

    def docker_calls(self) -> list[str]:
        calls = self.podman.calls
        return calls.read_text().splitlines() if calls.exists() else []


@dataclass
class Project(UnbuiltProject):
    registry: Registry  # holding the base image the Dockerfile is FROM

    def target(self) -> GceTarget:
        return GceTarget(STACK, self.settings, GceClients(runner_for=lambda s, r: self.runner))


def _project_dir(
    proj: Path, registry_host: str, podman: Podman, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's project at `proj`, its stack's `build:` a Dockerfile FROM the registry's base
    image; this process in it, with `podman`'s docker and that registry."""
    (proj / "docker").mkdir(parents=True)
    (proj / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (proj / f"Pulumi.{STACK}.yaml").write_text(
        "config:\n"
        f"  gcp:project: {PROJECT}\n"
        "  gputrain:machineType: g2-standard-8\n"
        "  gputrain:zones: [us-central1-a]\n"
        f"  gputrain:sshPublicKey: {TEST_PUBLIC_KEY}\n"
        "  gputrain:sshSourceRanges: [203.0.113.7/32]\n"
        "  gputrain:build: docker/Dockerfile\n"
    )
    (proj / "docker" / "Dockerfile").write_text(
        f"FROM {registry_host}/base:1\nCOPY app.txt /app/app.txt\n"
    )
    (proj / "docker" / "app.txt").write_text("the user's code\n")
    monkeypatch.setenv("PATH", f"{podman.shim_dir}:{os.environ['PATH']}")
    monkeypatch.setenv(REGISTRY_HOST_ENV, registry_host)
    monkeypatch.setenv("GPUTRAIN_INSECURE_REGISTRIES", registry_host)
    monkeypatch.chdir(proj)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    require_tools()
    podman = Podman(tmp_path / "podman")
    registry = Registry(tmp_path / "registry")
    try:
        podman.import_image("localhost/base:1", {"/usr/bin/hello": "#!/bin/sh\necho hi\n"})
        podman.trust(registry.host)
        podman("push", "-q", "localhost/base:1", f"docker://{registry.host}/base:1")
        _project_dir(tmp_path / "proj", registry.host, podman, monkeypatch)
        runner = FakeStackRunner(stack_name=STACK, project=PROJECT)
        yield Project(tmp_path / "proj", podman, runner, registry)
    finally:
        registry.stop()
        podman.cleanup()


@pytest.fixture
def refused_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[UnbuiltProject]:
    """The same project for a `--build` refused before anything: podman's docker (the shim logs
    every call it gets) with nothing in its storage, and a registry address nothing listens at
    (the discard port): a docker or registry call before the refusal fails loudly, and no
    registry process or base image is made for a test where none is used."""
    podman = Podman(tmp_path / "podman")
    try:
        _project_dir(tmp_path / "proj", "127.0.0.1:9", podman, monkeypatch)
        runner = FakeStackRunner(stack_name=STACK, project=PROJECT)
        yield UnbuiltProject(tmp_path / "proj", podman, runner)
    finally:
        shutil.rmtree(podman.root, ignore_errors=True)
        shutil.rmtree(podman.runroot, ignore_errors=True)


def test_built_pushed_once_then_found(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", STACK], project.settings) == 0
    out = capsys.readouterr().out
    assert f"image: {project.registry.host}/{PROJECT}/gputrain-{STACK}/docker:ctx-" in out
    assert "repository: gputrain-bt in Artifact Registry (us-central1)" in out
    assert "removed by a run's teardown unless `--keep-images`" in out  # as the teardown does
    assert "build: at `up` (with docker here), before any GPU" in out
    image = project.target().built_image(RunOptions())
    assert image is not None and image.digest is not None
    assert image.repository == f"{project.registry.host}/{PROJECT}/gputrain-{STACK}/docker"
    assert image.tag.startswith("ctx-")
    pushed = resolve_digest(parse_image(f"{image.repository}:{image.tag}", "t"), insecure=True)
    assert pushed.digest == image.digest  # what the run gets is what the registry holds
    calls = project.docker_calls()
    assert [c.split()[0] for c in calls] == ["build", "push"]
    # built from a copy of the checked context (docker itself would apply .dockerignore only)
    assert f"-t {image.repository}:{image.tag} " in calls[0] and "gputrain-context-" in calls[0]
    assert "--platform linux/amd64 " in calls[0]  # the nodes', whatever this machine is
    # the repository came first, alone: a targeted up, no GPU
    spec = parse_spec(load_stack_config(project.dir, STACK), STACK)
    assert project.runner.calls == [("up-targets", *target_urns(spec, with_bucket=False))]

    again = project.target().built_image(RunOptions())  # the next command: same context
    assert again == image
    assert project.docker_calls() == calls  # no build, no push
    assert project.runner.call_names() == ["up-targets"]  # nothing more made
    assert main(["plan", "--stack", STACK], project.settings) == 0
    assert f"build: none: the registry has this tag ({image.digest})" in capsys.readouterr().out

    (project.dir / "docker" / "app.txt").write_text("changed code\n")
    changed = project.target().built_image(RunOptions())
    assert changed is not None and changed.tag != image.tag and changed.digest != image.digest
    assert [c.split()[0] for c in project.docker_calls()] == ["build", "push", "build", "push"]


def test_a_dockerfile_that_fails_is_one_line_and_nothing_is_created(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    (project.dir / "docker" / "Dockerfile").write_text(
        f"FROM {project.registry.host}/base:1\nRUN echo compiling && exit 3\n"
    )
    gce = GceClients(runner_for=lambda s, r: project.runner)
    argv = ["up", "--stack", STACK, "--yes", "--skip-preflight"]
    assert main(argv, project.settings, gce) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gputrain: error: gputrain:build = ") and "\n" not in err
    assert "`docker build` failed (exit " in err
    assert project.runner.calls == []  # no repository, no VM: nothing was created


def test_build_beside_image_and_a_missing_dockerfile(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    gce = GceClients(runner_for=lambda s, r: project.runner)
    up = ["up", "--stack", STACK, "--yes", "--skip-preflight"]
    run = ["run", "--stack", STACK, "--yes", "--skip-preflight"]
    assert main([*run, "--image", f"{project.registry.host}/base:1"], project.settings, gce) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "gputrain: error: gputrain:build and --image are both set; set either build (a "
        "Dockerfile gputrain builds and pushes) or image (one that exists), not both; nothing "
        "was created"
    )
    assert main([*up, "--build", "nope/Dockerfile"], project.settings, gce) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gputrain: error: --build = 'nope/Dockerfile': no such file (")
    assert "\n" not in err
    assert project.runner.calls == [] and project.docker_calls() == []


def test_down_removes_the_repository_and_the_sweep_checks_it(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeCompute() as compute, FakeArtifactRegistry(PROJECT) as artifacts:
        project.runner.compute, project.runner.artifacts = compute, artifacts
        gce = GceClients(
            runner_for=lambda s, r: project.runner,
            compute_endpoint=compute.url,
            artifacts_endpoint=artifacts.url,
            retry_pause_s=0,
        )
        assert GceTarget(STACK, project.settings, gce).built_image(RunOptions()) is not None
        assert list(artifacts.repositories[(PROJECT, "us-central1")]) == [f"gputrain-{STACK}"]
        assert main(["down", "--stack", STACK], project.settings, gce) == 0
        assert artifacts.repositories[(PROJECT, "us-central1")] == {}
        assert "LEFT BEHIND" not in capsys.readouterr().out
        # one the destroy could not delete is named loudly
        artifacts.add(PROJECT, "us-central1", f"gputrain-{STACK}", {"gputrain-stack": STACK})
        assert main(["down", "--stack", STACK], project.settings, gce) != 0
        out = capsys.readouterr()
        assert "LEFT BEHIND by stack bt" in out.out and f"gputrain-{STACK}" in out.out


def test_the_build_sees_the_upload_filters_context_and_no_link_out(
    project: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """docker reads .dockerignore only: secrets, keys and links (to a file or a folder outside)
    never reach the build; the image's own listing of its context proves it."""
    ctx = project.dir / "docker"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0\n")
    (ctx / "Dockerfile").write_text(
        f"FROM {project.registry.host}/base:1\nCOPY . /ctx/\nRUN find /ctx | sort\n"
    )
    (ctx / ".env").write_text("DB_PASSWORD=hunter2\n")
    (ctx / "id_ed25519").write_text("k\n")
    (ctx / ".netrc").write_text("machine h login u password p\n")
    (ctx / "sa.json").write_text('{"type": "service_account", "private_key": "k"}')
    (ctx / "token.json").write_text('{"refresh_token": "1//0gLongRefresh", "client_id": "c"}')
    (ctx / "passwd").symlink_to(outside / "passwd")
    (ctx / "etc").symlink_to(outside)
    image = project.target().built_image(RunOptions())
    assert image is not None
    out = capsys.readouterr().out
    listed = {ln.strip() for ln in out.splitlines() if ln.strip().startswith("/ctx")}
    assert listed == {"/ctx", "/ctx/Dockerfile", "/ctx/app.txt"}, out
    assert "build: not sending 7 file(s) to the build: " in out
    for name in (".env", "id_ed25519", ".netrc", "sa.json", "token.json", "passwd", "etc"):
        assert f"{name} (" in out
    assert "hunter2" not in out


@pytest.mark.parametrize(
    "build", ["../Dockerfile", "/etc/passwd", "docker/../../x/Dockerfile", "linked/Dockerfile"]
)
def test_a_build_outside_the_project_is_one_line(
    refused_project: UnbuiltProject,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    build: str,
) -> None:
    project = refused_project
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "Dockerfile").write_text("FROM scratch\n")
    (project.dir / "linked").symlink_to(elsewhere)  # inside by name, outside in fact
    gce = GceClients(runner_for=lambda s, r: project.runner)
    up = ["up", "--stack", STACK, "--yes", "--skip-preflight", "--build", build]
    assert main(up, project.settings, gce) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gputrain: error: --build = {build!r}: ") and "\n" not in err
    assert "outside the project" in err
    assert project.runner.calls == [] and project.docker_calls() == []
