"""`build:` on the controller: the image named by its context hash, looked up in the stack's
registry, and — only when the registry lacks that tag — built and pushed: with the local docker
(or podman) when there is one, else with Cloud Build from a tarball in the stack's bucket. What
is built and named is infra/image_build.py's (pure); here are the thin adapters: the docker
subprocess and the Cloud Build / Cloud Storage clients.

Order (scripts/targets/stack/target.py): `plan_build` and `local_build` before anything is
created (a Dockerfile that does not build costs nothing), then the stack's repository, then
`publish`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infra.base.errors import UserError
from infra.image_build import (
    PLATFORM,
    BuildContext,
    cloud_build_request,
    context_tarball,
    read_context,
    registry_host,
    repository_id,
    write_context,
)
from scripts.job.container import ImageRef, find_image, registry_token

if TYPE_CHECKING:
    from infra.gcp.cloudbuild import CloudBuildApi
    from infra.gcp.gcs import StorageApi

#: The registry host images are pushed to instead of REGION-docker.pkg.dev (tests: a local one).
REGISTRY_HOST_ENV = "GPUTRAIN_REGISTRY_HOST"
#: docker, podman or cloud (Cloud Build); unset: docker, else podman, else Cloud Build.
BUILDER_ENV = "GPUTRAIN_BUILDER"
#: Where Cloud Build's source tarballs go in the bucket (deleted once the build ended).
SOURCE_PREFIX = "gputrain-builds/"
Say = Callable[[str], None]


@dataclass(frozen=True)
class PlannedBuild:
    context: BuildContext
    image: ImageRef  # the tag is the context hash; no digest yet
    setting: str  # how error lines name it: gputrain:build or --build
    stack: str

    @property
    def reference(self) -> str:
        return f"{self.image.repository}:{self.image.tag}"


@dataclass(frozen=True)
class PendingBuild:
    """What `publish` must still do: nothing (`found`), push a local build, or Cloud Build."""

    planned: PlannedBuild
    found: ImageRef | None = None  # the registry has the tag: no build
    built_with: str | None = None  # docker/podman: built here, to push


def image_conflict(build: str, image: str) -> UserError:
    return UserError(
        f"{build} and {image} are both set; set either build (a Dockerfile gputrain builds and "
        "pushes) or image (one that exists), not both; nothing was created"
    )


def plan_build(
    path: str, setting: str, *, base: Path, region: str, project: str, stack: str
) -> PlannedBuild:
    """The Dockerfile read and hashed; UserError for one that is not there. The context is the
    upload's: what .dockerignore leaves, less what the upload filter never sends (secrets,
    symbolic links): a build sees only those files (local_build and Cloud Build alike)."""
    from scripts import ui
    from scripts.job.sync import never_upload

    directory = (base / path).resolve().parent
    ctx = read_context(path, base, setting, lambda files: never_upload(files, directory))
    if ctx.skipped:
        shown = ", ".join(f"{rel} ({why})" for rel, why in ctx.skipped)
        ui.say(f"build: not sending {len(ctx.skipped)} file(s) to the build: {shown}")
    host = os.environ.get(REGISTRY_HOST_ENV) or registry_host(region)
    image = ImageRef(host, f"{project}/{repository_id(stack)}/{ctx.name}", ctx.tag)
    return PlannedBuild(ctx, image, setting, stack)


def local_builder() -> str | None:
    """docker first, else podman (same CLI); None: Cloud Build builds. GPUTRAIN_BUILDER picks
    one (`cloud`: Cloud Build even where docker is, e.g. on a laptop of another architecture)."""
    chosen = os.environ.get(BUILDER_ENV, "").strip()
    if chosen == "cloud":
        return None
    if chosen and (chosen not in ("docker", "podman") or not shutil.which(chosen)):
        raise UserError(
            f"{BUILDER_ENV}={chosen!r}: not allowed or not on PATH; allowed: docker, podman, "
            "cloud, or unset (docker, else podman, else Cloud Build)"
        )
    return chosen or next((t for t in ("docker", "podman") if shutil.which(t)), None)


def describe_build(planned: PlannedBuild, region: str) -> list[str]:
    """`plan`'s lines: the image, what it is built from, the repository, and whether `up` will
    build (the registry asked for the tag where it can be)."""
    ctx = planned.context
    try:
        found = find_image(planned.image)
        tool = local_builder()
    except UserError as e:
        will = f"at `up`, unless the registry has this tag (not checked here: {e})"
    else:
        if found is not None:
            will = f"none: the registry has this tag ({found.digest})"
        else:
            how = f"with {tool} here" if tool else "with Cloud Build: no docker or podman here"
            will = f"at `up` ({how}), before any GPU"
    return [
        f"image: {planned.reference}",
        f"  built from {ctx.dockerfile} ({len(ctx.files)} files in its directory; the tag is "
        "their content hash)",
        f"  repository: {repository_id(planned.stack)} in Artifact Registry ({region}); made by "
        "`up`, removed by a run's teardown unless `--keep-images` (the build cache) and by `down`",
        f"  build: {will}",
    ]


def local_build(planned: PlannedBuild, say: Say, *, tool: str | None = None) -> PendingBuild:
    """Before anything exists: the registry asked for the tag; if it lacks it and a docker (or
    podman) is here, `docker build` (a failure is one line, nothing created)."""
    found = find_image(planned.image)
    if found is not None:
        say(f"image {planned.reference}: in the registry already ({found.digest}); no build")
        return PendingBuild(planned, found=found)
    tool = tool or local_builder()
    if tool is None:
        return PendingBuild(planned)  # Cloud Build, once the repository exists
    ctx = planned.context
    say(f"image {planned.reference}: building with {tool} from {ctx.dockerfile}")
    import tempfile

    # docker reads a directory with .dockerignore only: it gets a copy of the checked context
    with tempfile.TemporaryDirectory(prefix="gputrain-context-") as tmp:
        write_context(ctx, Path(tmp))
        dockerfile = Path(tmp, ctx.dockerfile.relative_to(ctx.directory))
        _run(
            [
                tool,
                "build",
                "--platform",
                PLATFORM,
                "-f",
                str(dockerfile),
                "-t",
                planned.reference,
                tmp,
            ],
            f"{planned.setting} = {ctx.dockerfile}: `{tool} build` failed",
            say,
        )
    return PendingBuild(planned, built_with=tool)


def publish(
    pending: PendingBuild,
    say: Say,
    *,
    cloud_build: Callable[[], CloudBuildApi],
    storage: Callable[[], StorageApi],
    bucket: str,
    project: str,
    account: str,
    prefix: str = "",
) -> ImageRef:
    """Once the repository exists: push the local build, or run Cloud Build (its tarball in
    `bucket`, run as `account` of `project`: the stack's); the image at its digest."""
    planned = pending.planned
    if pending.found is not None:
        return pending.found
    if pending.built_with is not None:
        tool = pending.built_with
        _login(tool, planned.image)
        say(f"image {planned.reference}: pushing with {tool}")
        _run([tool, "push", planned.reference], f"`{tool} push {planned.reference}` failed", say)
        found = find_image(planned.image)
        if found is None:
            raise UserError(f"image {planned.reference}: pushed, but the registry does not have it")
    else:
        found = _cloud_build(
            planned, say, cloud_build(), storage(), bucket, prefix, project=project, account=account
        )
    say(f"image {planned.reference} is {found.digest}")
    return found


def _cloud_build(
    planned: PlannedBuild,
    say: Say,
    api: CloudBuildApi,
    storage: StorageApi,
    bucket: str,
    prefix: str,
    *,
    project: str,
    account: str,
) -> ImageRef:
    import tempfile

    ctx = planned.context
    name = f"{prefix}{SOURCE_PREFIX}{ctx.tag}.tar.gz"
    with tempfile.TemporaryDirectory(prefix="gputrain-build-") as tmp:
        tarball = Path(tmp) / "context.tar.gz"
        tarball.write_bytes(context_tarball(ctx))
        say(
            f"image {planned.reference}: Cloud Build builds it ({len(ctx.files)} files, "
            f"{tarball.stat().st_size // 1024} KiB via gs://{bucket}/{name}; no local docker or "
            f"podman, or {BUILDER_ENV}=cloud)"
        )
        storage.upload(bucket, name, tarball)
    try:
        body = cloud_build_request(
            planned.reference,
            bucket,
            name,
            stack=planned.stack,
            project=project,
            account=account,
            dockerfile=ctx.dockerfile.relative_to(ctx.directory).as_posix(),
        )
        state = api.follow(api.submit(body), say)
    finally:
        storage.delete_objects(bucket, [name])
    if state.digest:
        i = planned.image
        return ImageRef(i.registry, i.path, i.tag, state.digest)
    found = find_image(planned.image)
    if found is None:
        raise UserError(f"cloud build {state.id}: succeeded, but {planned.reference} is not there")
    return found


def _login(tool: str, image: ImageRef) -> None:
    """Artifact Registry takes the application-default credentials' token (on stdin, never in
    argv); other registries are the local docker's business."""
    token = registry_token(image)
    if token is None:
        return
    argv = [tool, "login", "-u", "oauth2accesstoken", "--password-stdin", image.registry]
    done = subprocess.run(argv, input=token, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"`{tool} login {image.registry}` failed: {last[0]}")


def _run(argv: list[str], failed: str, say: Say) -> None:
    """A docker command with its output shown indented as it comes; UserError with its last
    line when it fails."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    last = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip():
            last = line.strip()
            say(f"  {last}")
    if proc.wait() != 0:
        raise UserError(f"{failed} (exit {proc.returncode}): {last or 'no output'}")
