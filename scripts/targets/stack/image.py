"""`build:` on a stack target: which Dockerfile (the command line's `--build`, else the stack's
`build`), checked before anything, and the image published once the stack's repository exists —
a targeted `pulumi up` of the repository alone (and, for Cloud Build, the stack's own bucket),
so no GPU is created before the image is in the registry. See scripts/job/image_build.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from infra.base.errors import UserError
from infra.stackfile import NS, service_account_email
from scripts import ui
from scripts.targets.base import RunOptions

if TYPE_CHECKING:
    from infra.spec import ClusterSpec
    from scripts.job.container import ImageRef
    from scripts.job.image_build import PendingBuild, PlannedBuild
    from scripts.targets.stack.clients import StackClients, StackRunner


def plan_stack_build(
    spec: ClusterSpec, stack_image: str, opts: RunOptions, root: Path
) -> PlannedBuild | None:
    """The Dockerfile to build (`--build` relative to this directory, the stack's `build`
    relative to the project directory) read and hashed; None: nothing to build. One line for
    `image` beside it, a missing Dockerfile or a stack without a project."""
    path = opts.build or spec.build
    if not path:
        return None
    setting = "--build" if opts.build else f"{NS}build"
    image = opts.image or stack_image.strip()
    if image:
        from scripts.job.image_build import image_conflict

        raise image_conflict(setting, "--image" if opts.image else f"{NS}image")
    base = Path.cwd() if opts.build else root
    if not spec.project:  # a bad path first: it is wrong whatever the project
        from infra.image_build import dockerfile_in_project

        dockerfile_in_project(path, base, setting)
        raise UserError(
            f"{setting}: gcp:project is not set for stack {spec.stack}; it names the registry"
        )
    from scripts.job.image_build import plan_build

    return plan_build(
        path,
        setting,
        base=base,
        region=spec.region,
        project=spec.project,
        stack=spec.stack,
    )


def build_plan_lines(spec: ClusterSpec, planned: PlannedBuild | None) -> list[str]:
    """`plan`'s lines about `build` (without a project nothing names the registry yet)."""
    if planned is None:
        return [f"image: built from {spec.build} at `up` (gcp:project names its registry)"]
    from scripts.job.image_build import describe_build

    return describe_build(planned, spec.region)


def publish_stack_image(
    spec: ClusterSpec,
    pending: PendingBuild,
    *,
    runner: StackRunner,
    clients: StackClients,
    build_in_config: bool,
) -> ImageRef:
    """The repository made (a targeted `up`: nothing else of the stack), then the push or the
    Cloud Build; the image at its digest. `build_in_config`: the stack file names `build`
    already (with `--build` alone the key is set first, so the program declares the
    repository, now and at every later `up`, and `down` removes it)."""
    from infra.components.registry import target_urns
    from scripts.job.image_build import publish
    from scripts.targets.stack.clients import pulumi_line

    if pending.found is not None:
        return pending.found
    if not build_in_config:
        runner.set_config(NS + "build", pending.planned.context.dockerfile.as_posix())
        ui.say(f"stack {spec.stack}: {NS}build set to {pending.planned.context.dockerfile}")
    cloud = pending.built_with is None
    ui.say(
        f"up: stack {spec.stack}: its image repository "
        f"{pending.planned.image.registry}/{spec.project}/gputrain-{spec.stack}"
        + (" and bucket, and the account Cloud Build runs as" if cloud else "")
        + ", before any GPU"
    )
    runner.up(on_output=pulumi_line, targets=target_urns(spec, with_bucket=cloud))
    assert spec.project is not None and spec.bucket_name is not None  # plan_stack_build checked
    project = spec.project
    return publish(
        pending,
        ui.say,
        cloud_build=lambda: clients.cloud_build(project),
        storage=lambda: clients.storage(project),
        bucket=spec.bucket_name,
        prefix=spec.bucket_prefix,
        project=project,
        account=service_account_email(spec.stack, project),
    )


def plan_reconciler_build(spec: ClusterSpec, root: Path, dest: Path) -> PlannedBuild:
    """The reconcile job's image (infra/reconciler_image.py): its context written under `dest`
    (what a local docker or Cloud Build gets) and its reference, the one the program names."""
    from infra.image_build import BuildContext, context_tag
    from infra.reconciler_image import context_entries, image_repository, write_context
    from scripts.job.container import ImageRef
    from scripts.job.image_build import REGISTRY_HOST_ENV, PlannedBuild

    assert spec.project is not None  # require_deployable ran
    entries = context_entries(root)
    write_context(entries, dest)
    files = tuple(sorted(rel for rel, _, _ in entries))
    ctx = BuildContext(dest / "Dockerfile", files, context_tag(entries))
    repository = image_repository(
        spec.region, spec.project, spec.stack, os.environ.get(REGISTRY_HOST_ENV)
    )
    host, path = repository.split("/", 1)
    image = ImageRef(host, path, ctx.tag)
    return PlannedBuild(ctx, image, f"{NS}recover", spec.stack)
