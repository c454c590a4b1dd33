"""`build:` under Pulumi mocks: the whole program declares the stack's Docker repository (its
region, its labels) and reader on that repository only for the nodes' / the Vertex jobs' service
account; nothing without `build`; and the URNs the controller's targeted `up` names are the
ones the program registers."""

from __future__ import annotations

import re
import runpy
from typing import Any

import pulumi
import pytest

from infra.components.registry import READER_TYPE, REPOSITORY_TYPE, target_urns
from infra.spec import parse_spec
from infra.stackfile import load_stack_config
from tests.support import ROOT
from tests.support.pulumi_mocks import (
    ACCOUNT,
    IAM_MEMBER,
    TEST_PROJECT,
    GcpMocks,
    deployable_config,
    pulumi_mocks,
    walk,
)


def _program(stack: str, **overrides: str) -> tuple[GcpMocks, dict[str, Any]]:
    """Runs __main__.py under mocks; the mocks and the program's globals (the URNs resolved)."""
    cfg = deployable_config(stack, **overrides)
    found: dict[str, Any] = {}
    with pulumi_mocks(load_stack_config(ROOT, stack), stack=stack) as mocks:

        @pulumi.runtime.test
        def program() -> Any:
            pulumi.runtime.set_all_config(cfg, secret_keys=["gputrain:sshPrivateKey"])
            ns = runpy.run_path(str(ROOT / "__main__.py"))
            found.update(ns)
            exports = pulumi.Output.all(**ns["cluster"].exports())
            resources = _resources(ns)
            urns = [r.urn for r in resources]
            return pulumi.Output.all(exports, *urns).apply(
                lambda v: found.update(urns=dict(zip(v[1:], resources, strict=True)))
            )

        program()
    return mocks, found


def _resources(ns: dict[str, Any]) -> list[pulumi.Resource]:
    """Every resource the program declared, reached from the components it made."""
    seen: dict[int, pulumi.Resource] = {}

    def visit(obj: Any, depth: int) -> None:
        if depth > 4 or id(obj) in seen:
            return
        if isinstance(obj, pulumi.Resource):
            seen[id(obj)] = obj
            values = list(vars(obj).values())
        elif isinstance(obj, list | tuple):
            values = list(obj)
        else:
            return
        for v in values:
            visit(v, depth + 1)

    for v in (ns.get("registry"), ns["cluster"]):
        visit(v, 0)
    return list(seen.values())


def _member(mocks: GcpMocks) -> str:
    [sa] = mocks.of_type(ACCOUNT)
    return f"serviceAccount:{sa.inputs['accountId']}@{TEST_PROJECT}.iam.gserviceaccount.com"


def test_build_declares_the_repository_and_a_reader_on_it_only() -> None:
    mocks, _ = _program("dev", build="docker/Dockerfile", labels='["team=ml"]')
    [repo] = mocks.of_type(REPOSITORY_TYPE)
    assert repo.inputs["format"] == "DOCKER"
    assert repo.inputs["repositoryId"] == "gputrain-dev"
    assert repo.inputs["location"] == "us-central1"  # the stack's region
    assert repo.inputs["project"] == TEST_PROJECT
    assert repo.inputs["labels"] == {
        "gputrain-stack": "dev",
        "gputrain-project": "gputrain",
        "team": "ml",
    }
    reader, writer = sorted(mocks.of_type(READER_TYPE), key=lambda r: r.inputs["role"])
    assert reader.inputs == {
        "project": TEST_PROJECT,
        "location": "us-central1",
        "repository": "gputrain-dev",
        "role": "roles/artifactregistry.reader",
        "member": _member(mocks),
    }
    # Cloud Build runs as the stack's account: it pushes to this repository, and only this one
    assert writer.inputs == {**reader.inputs, "role": "roles/artifactregistry.writer"}
    # nothing project-wide about Artifact Registry
    roles = [r.inputs["role"] for r in mocks.of_type(IAM_MEMBER)]
    assert not [r for r in roles if "artifactregistry" in r], roles


def test_vertex_jobs_account_reads_the_repository() -> None:
    mocks, _ = _program("vertex", build="Dockerfile")
    [repo] = mocks.of_type(REPOSITORY_TYPE)
    for grant in mocks.of_type(READER_TYPE):  # reader, and writer for Cloud Build
        assert grant.inputs["member"] == _member(mocks)
        assert grant.inputs["repository"] == repo.inputs["repositoryId"] == "gputrain-vertex"


def test_no_build_no_repository() -> None:
    mocks, found = _program("dev")
    assert found["registry"] is None
    assert not mocks.of_type(REPOSITORY_TYPE) and not mocks.of_type(READER_TYPE)
    assert "artifactregistry" not in " ".join(
        str(v) for r in mocks.resources for v in walk(r.inputs)
    )


@pytest.mark.parametrize("stack", ["dev", "vertex"])
def test_the_targeted_up_names_what_the_program_registers(stack: str) -> None:
    """Pulumi's `--target` globs (`**` any text) matched against every URN the program makes:
    exactly the repository, and with the bucket the components above it and the bucket."""
    _, found = _program(stack, build="Dockerfile")
    # The SDK's mock monitor puts the root stack's type into its children's URNs; the engine does
    # not (a top-level resource's URN has no parent type), so the mocks' extra part goes.
    urns = {u.replace("::pulumi:pulumi:Stack$", "::"): r for u, r in found["urns"].items()}
    spec = parse_spec(deployable_config(stack, build="Dockerfile"), stack)

    def chosen(with_bucket: bool) -> list[str]:
        globs = [_glob(t) for t in target_urns(spec, with_bucket=with_bucket)]
        return sorted(
            type(r).__name__ for u, r in urns.items() if any(g.fullmatch(u) for g in globs)
        )

    assert chosen(False) == ["ImageRegistry", "Repository"]
    top = "VertexStack" if stack == "vertex" else "GpuCluster"
    # Cloud Build: also what the build runs as (the stack's account, its log writer role, its
    # access to the bucket, its writer grant on the repository)
    assert chosen(True) == sorted(
        [
            "Bucket",
            top,
            "ImageRegistry",
            "Repository",
            "StackBucket",
            "NodeIdentity",
            "Account",
            "IAMMember",
            "BucketIAMMember",
            "RepositoryIamMember",
        ]
    )  # fmt: skip (one IAMMember: the log writer role; one grant on the repository: writer)


def _glob(target: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in target.split("**")))


@pytest.mark.parametrize("stack", ["dev", "vertex"])
def test_the_doctor_asks_for_what_the_build_program_declares(stack: str) -> None:
    from infra.permissions import required_permissions, spec_resource_types

    mocks, _ = _program(stack, build="Dockerfile")
    declared = {r.typ for r in mocks.resources if r.custom}
    spec = parse_spec(deployable_config(stack, build="Dockerfile"), stack)
    assert declared == set(spec_resource_types(spec))
    needed = required_permissions(declared, builder="local")
    assert "artifactregistry.repositories.setIamPolicy" in needed
    assert "artifactregistry.repositories.uploadArtifacts" in needed
