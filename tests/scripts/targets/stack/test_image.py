"""`build:` through Cloud Build, with the real google-cloud-build client against our server on
the real REST paths: where no docker may build (GPUTRAIN_BUILDER=cloud), a targeted `up` makes
the repository and the stack's bucket, the context goes there as a tarball (the Cloud Storage
emulator), the Build runs docker build + push, progress is shown, the tarball is removed, and the
run gets the pushed digest; a failed build is one line with its log URL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.base.errors import GputrainError, UserError
from infra.components.registry import target_urns
from infra.gcp.cloudbuild import CloudBuildApi
from infra.image_build import cloud_build_request, read_context
from infra.spec import parse_spec
from infra.stackfile import load_stack_config
from scripts.job.image_build import BUILDER_ENV, REGISTRY_HOST_ENV, SOURCE_PREFIX
from scripts.settings import Settings
from scripts.targets.base import RunOptions
from scripts.targets.gce.clients import GceClients
from scripts.targets.gce.target import GceTarget
from tests.support import ROOT
from tests.support.containers import Registry, require_tools
from tests.support.fake_cloudbuild import FakeCloudBuild
from tests.support.fake_stack import FakeStackRunner
from tests.support.gcs_emulator import GcsEmulator
from tests.support.pulumi_mocks import TEST_PUBLIC_KEY

STACK = "cb"
PROJECT = "gputrain-test"


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    """An empty registry in the Artifact Registry repository's place (nothing built yet)."""
    require_tools()
    r = Registry(tmp_path / "registry")
    monkeypatch.setenv(REGISTRY_HOST_ENV, r.host)
    monkeypatch.setenv("GPUTRAIN_INSECURE_REGISTRIES", r.host)
    yield r
    r.stop()


@pytest.fixture
def cloud(gcs: GcsEmulator) -> Iterator[FakeCloudBuild]:
    def read_source(bucket: str, name: str) -> bytes | None:
        blob = gcs.client().bucket(bucket).blob(name)
        return bytes(blob.download_as_bytes()) if blob.exists() else None

    with FakeCloudBuild(read_source) as fake:
        yield fake


def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    proj = tmp_path / "proj"
    (proj / "img").mkdir(parents=True)
    (proj / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (proj / f"Pulumi.{STACK}.yaml").write_text(
        f"config:\n  gcp:project: {PROJECT}\n  gputrain:machineType: g2-standard-8\n"
        f"  gputrain:sshPublicKey: {TEST_PUBLIC_KEY}\n  gputrain:sshSourceRanges: [203.0.113.7/32]\n"
        "  gputrain:build: img/Dockerfile\n"
    )
    (proj / "img" / "Dockerfile").write_text("FROM python:3.11\nCOPY . /app\n")
    (proj / "img" / "train.py").write_text("print('train')\n")
    monkeypatch.chdir(proj)
    monkeypatch.setenv(BUILDER_ENV, "cloud")  # podman is on this machine: Cloud Build anyway
    return proj


def test_cloud_build_builds_pushes_and_cleans_up(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    registry: Registry,
    cloud: FakeCloudBuild,
    gcs: GcsEmulator,
) -> None:
    proj = _project(tmp_path, monkeypatch)
    spec = parse_spec(load_stack_config(proj, STACK), STACK)
    assert spec.bucket_name is not None
    runner = FakeStackRunner(stack_name=STACK, project=PROJECT, bucket=spec.bucket_name)
    clients = GceClients(
        runner_for=lambda s, r: runner, cloudbuild_endpoint=cloud.url, build_poll_s=0.01
    )
    settings = Settings(root=proj, runs_dir=proj / "runs")
    image = GceTarget(STACK, settings, clients).built_image(RunOptions())

    assert image is not None and image.digest is not None and image.tag.startswith("ctx-")
    # the repository and the bucket first, alone (a targeted up), then the build
    assert runner.calls == [("up-targets", *target_urns(spec, with_bucket=True))]
    [(build_id, build)] = cloud.builds.items()
    ctx = read_context("img/Dockerfile", proj, "b")
    assert cloud.sources[build_id] == list(ctx.files) == ["Dockerfile", "train.py"]
    reference = f"{image.repository}:{image.tag}"
    account = f"gputrain-{STACK}@{PROJECT}.iam.gserviceaccount.com"
    expected = cloud_build_request(
        reference, spec.bucket_name, f"{SOURCE_PREFIX}{ctx.tag}.tar.gz", stack=STACK,
        project=PROJECT, account=account,
    )  # fmt: skip
    sent = {k: build[k] for k in expected if k != "options"}  # what the client sent, as Google
    assert sent == {k: v for k, v in expected.items() if k != "options"}  # reads it
    # as the stack's own account (the default one has no rights here), logging to Cloud Logging
    assert build["serviceAccount"] == f"projects/{PROJECT}/serviceAccounts/{account}"
    assert build["options"]["logging"] == "CLOUD_LOGGING_ONLY"
    assert build["results"]["images"][0]["digest"] == image.digest
    # the tarball is gone again; the bucket stays the stack's
    assert not list(gcs.client().list_blobs(spec.bucket_name, prefix=SOURCE_PREFIX))
    out = capsys.readouterr().out
    for status in ("queued", "working", "success"):
        assert f"cloud build {build_id}: {status}" in out
    assert f"image {reference}: Cloud Build builds it (2 files, " in out
    assert cloud.requests[0] == f"POST /v1/projects/{PROJECT}/builds"
    assert f"GET /v1/projects/{PROJECT}/builds/{build_id}" in cloud.requests


def test_a_failed_cloud_build_is_one_line_with_its_log(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    registry: Registry,
    cloud: FakeCloudBuild,
) -> None:
    proj = _project(tmp_path, monkeypatch)
    spec = parse_spec(load_stack_config(proj, STACK), STACK)
    runner = FakeStackRunner(stack_name=STACK, project=PROJECT, bucket=spec.bucket_name)
    clients = GceClients(
        runner_for=lambda s, r: runner, cloudbuild_endpoint=cloud.url, build_poll_s=0.01
    )
    cloud.fail_next = (
        'Build step 0 "gcr.io/cloud-builders/docker" failed: step exited with non-zero status: 1'
    )
    target = GceTarget(STACK, Settings(root=proj, runs_dir=proj / "runs"), clients)
    with pytest.raises(UserError) as e:
        target.built_image(RunOptions())
    [build_id] = cloud.builds
    assert str(e.value) == (
        f'cloud build {build_id} ended FAILURE: Build step 0 "gcr.io/cloud-builders/docker" '
        "failed: step exited with non-zero status: 1; log: https://console.cloud.google.com/"
        f"cloud-build/builds/{build_id}?project=1234"
    )


def test_the_adapter_on_a_missing_source(cloud: FakeCloudBuild) -> None:
    api = CloudBuildApi(PROJECT, cloud.url, poll_s=0.01)
    body = cloud_build_request(
        "r.io/p/r/i:ctx-1", "nobucket", "none.tar.gz", stack="x", project=PROJECT, account="a@b"
    )
    lines: list[str] = []
    with pytest.raises(UserError, match=r"ended FAILURE: failed to fetch source: gs://nobucket"):
        api.follow(api.submit(body), lines.append)
    assert [ln.split(": ")[1].split(" ")[0] for ln in lines] == ["queued", "working", "failure"]


def test_a_build_with_its_own_account_but_no_logging_option_is_refused(
    cloud: FakeCloudBuild,
) -> None:
    """The fake holds Google's rule (user-specified service accounts: logs go to Cloud Logging or
    a bucket of the user's), so the request's `options.logging` is what lets the build start."""
    api = CloudBuildApi(PROJECT, cloud.url, poll_s=0.01)
    body = cloud_build_request(
        "r.io/p/r/i:ctx-1", "nobucket", "none.tar.gz", stack="x", project=PROJECT, account="a@b"
    )
    with pytest.raises(GputrainError, match="CLOUD_LOGGING_ONLY / NONE logging options"):
        api.submit({k: v for k, v in body.items() if k != "options"})


def test_a_runs_teardown_keeps_the_repository_and_what_holds_it() -> None:
    """The targeted destroy of a run's teardown (stack/bucket.destroy_targets): everything but
    the repository and its component; `down` (nothing kept) names them too."""
    from infra.image_build import REPOSITORY_TYPE
    from scripts.targets.stack.bucket import destroy_targets

    stack = "urn:pulumi:dev::gputrain::pulumi:pulumi:Stack::gputrain-dev"
    registry = "urn:pulumi:dev::gputrain::gputrain:infra:ImageRegistry::dev-registry"
    repo = f"urn:pulumi:dev::gputrain::gputrain:infra:ImageRegistry${REPOSITORY_TYPE}::gputrain-dev"
    cluster = "urn:pulumi:dev::gputrain::gputrain:infra:GpuCluster::dev"
    reader = (
        "urn:pulumi:dev::gputrain::gputrain:infra:GpuCluster$gcp:artifactregistry/"
        "repositoryIamMember:RepositoryIamMember::gputrain-dev-reader"
    )
    resources = [
        {"urn": stack, "type": "pulumi:pulumi:Stack"},
        {"urn": registry, "type": "gputrain:infra:ImageRegistry", "parent": stack},
        {"urn": repo, "type": REPOSITORY_TYPE, "parent": registry},
        {"urn": cluster, "type": "gputrain:infra:GpuCluster", "parent": stack},
        {"urn": reader, "type": "x", "parent": cluster},
    ]
    assert destroy_targets(resources, [REPOSITORY_TYPE]) == [cluster, reader]
    assert destroy_targets(resources, []) == [registry, repo, cluster, reader]


def test_the_reconcile_jobs_image_goes_through_cloud_build_as_the_program_names_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    registry: Registry,
    cloud: FakeCloudBuild,
    gcs: GcsEmulator,
) -> None:
    """Laptop-closed recovery on (a gs:// state, KMS secrets): before `up`, the controller builds
    the reconcile job's image from gputrain's own files and a generated Dockerfile through the
    same path as `build:` (here Cloud Build, as the stack's account), under the tag the program
    computes for the job; the stack file's `build` stays unset."""
    from infra.reconciler_image import image_reference
    from infra.stackfile import read_stack_file

    proj = _project(tmp_path, monkeypatch)
    text = (
        (proj / f"Pulumi.{STACK}.yaml")
        .read_text()
        .replace("  gputrain:build: img/Dockerfile\n", "")
    )
    key = "projects/p/locations/global/keyRings/r/cryptoKeys/k"
    (proj / f"Pulumi.{STACK}.yaml").write_text(f"secretsprovider: gcpkms://{key}\n{text}")
    monkeypatch.setenv("PULUMI_BACKEND_URL", "gs://state")
    stack_file = read_stack_file(proj, STACK)
    spec = parse_spec(stack_file.config, STACK)
    runner = FakeStackRunner(stack_name=STACK, project=PROJECT, bucket=spec.bucket_name)
    clients = GceClients(
        runner_for=lambda s, r: runner, cloudbuild_endpoint=cloud.url, build_poll_s=0.01
    )
    settings = Settings(root=ROOT, runs_dir=proj / "runs")  # gputrain's own project files
    target = GceTarget(STACK, settings, clients, stack_file=stack_file)
    spec = target.spec()
    assert spec.job_reach is not None and spec.job_reach.missing is None
    pending = target._reconciler_build(spec, tmp_path / "context")
    assert pending is not None and pending.found is None  # the registry lacks it
    image = target._publish(spec, pending, build_in_config=True)

    named = image_reference(ROOT, spec.region, PROJECT, STACK)  # what the program names
    assert f"{image.repository}:{image.tag}".split("/", 1)[1] == named.split("/", 1)[1]
    assert runner.calls == [("up-targets", *target_urns(spec, with_bucket=True))]
    [(build_id, build)] = cloud.builds.items()
    files = cloud.sources[build_id]
    assert "Dockerfile" in files and "__main__.py" in files and "scripts/cli.py" in files
    assert not [f for f in files if "__pycache__" in f or f.startswith((".venv", "tests/"))]
    assert build["serviceAccount"].endswith(f"gputrain-{STACK}@{PROJECT}.iam.gserviceaccount.com")
    assert "gputrain:build" not in runner.config
    assert f"Cloud Build builds it ({len(files)} files" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("build", "why"),
    [("../Dockerfile", "is outside the project"), ("img/Nothing", "no such file")],
)
def test_a_bad_build_path_is_named_before_a_missing_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build: str, why: str
) -> None:
    """--build's path is wrong whatever the project: it is the line, not 'gcp:project is not
    set' (which a user would fix only to meet the path's problem next)."""
    from scripts.targets.stack.image import plan_stack_build

    proj = _project(tmp_path, monkeypatch)
    config = load_stack_config(proj, STACK)
    del config["gcp:project"]
    spec = parse_spec(config, STACK)
    with pytest.raises(UserError) as e:
        plan_stack_build(spec, "", RunOptions(build=build), proj)
    assert str(e.value).startswith(f"--build = {build!r}: ") and why in str(e.value)
    with pytest.raises(UserError) as e:
        plan_stack_build(spec, "", RunOptions(build="img/Dockerfile"), proj)
    assert (
        str(e.value) == f"--build: gcp:project is not set for stack {STACK}; it names the registry"
    )
