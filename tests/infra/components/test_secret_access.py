"""The stack's `secrets` under the Pulumi mocks: a Vertex stack grants its jobs' service account
`roles/secretmanager.secretAccessor` on exactly the Secret Manager secrets named, each on its own
(never project-wide); plain `NAME` secrets and GCE stacks (the controller reads the secrets there)
grant nothing; `gputrain doctor` asks for what the grant needs."""

from __future__ import annotations

import json
from typing import Any

import pulumi

from infra.permissions import required_permissions, roles_for, spec_resource_types
from infra.spec import parse_spec
from infra.stackfile import load_stack_config
from tests.support.program import expect_declares_nothing, run_main
from tests.support.pulumi_mocks import (
    IAM_MEMBER,
    ROOT,
    TEST_PROJECT,
    Registered,
    deployable_config,
    pulumi_mocks,
)

SECRET_IAM = "gcp:secretmanager/secretIamMember:SecretIamMember"
EMAIL = f"gputrain-vertex@{TEST_PROJECT}.iam.gserviceaccount.com"
SECRETS = [
    "HF_TOKEN=sm://hf-token",
    "HF_TOKEN_V2=sm://hf-token/2",  # a version of the same secret: one grant
    "WANDB_API_KEY",  # this machine's variable: nothing to grant (and refused on Vertex at run)
    "DB_PASSWORD=sm://projects/data-team/secrets/db-pass/versions/3",
]


def _vertex(secrets: list[str]) -> dict[str, str]:
    cfg = load_stack_config(ROOT, "vertex")
    cfg["gcp:project"] = TEST_PROJECT
    cfg["gputrain:secrets"] = json.dumps(secrets)  # as the Pulumi CLI passes an array
    return cfg


def _declared(config: dict[str, str], stack: str) -> list[Registered]:
    with pulumi_mocks({}, stack=stack) as m:

        @pulumi.runtime.test
        def run() -> Any:
            cluster = run_main(config, stack)["cluster"]
            return pulumi.Output.all(**cluster.exports())

        run()
        return list(m.resources)


def test_a_vertex_stack_grants_accessor_on_each_named_secret_only() -> None:
    resources = _declared(_vertex(SECRETS), "vertex")
    grants = sorted(
        (r.name, r.inputs["project"], r.inputs["secretId"], r.inputs["role"], r.inputs["member"])
        for r in resources
        if r.typ == SECRET_IAM
    )
    member = f"serviceAccount:{EMAIL}"
    accessor = "roles/secretmanager.secretAccessor"
    assert grants == [
        ("vertex-secret-data-team-db-pass", "data-team", "db-pass", accessor, member),
        ("vertex-secret-hf-token", TEST_PROJECT, "hf-token", accessor, member),
    ]
    # the only secret bindings: no project-wide role names Secret Manager, nor any other type
    project_roles = [r.inputs["role"] for r in resources if r.typ == IAM_MEMBER]
    assert project_roles == ["roles/logging.logWriter"]
    assert {r.typ for r in resources if "secretmanager" in r.typ} == {SECRET_IAM}
    # and `gputrain doctor` asks for what exactly these types need
    declared = {r.typ for r in resources if r.custom}
    assert declared == set(spec_resource_types(parse_spec(_vertex(SECRETS), "vertex")))


def test_plain_variables_and_gce_stacks_grant_nothing() -> None:
    plain = _declared(_vertex(["WANDB_API_KEY", "HF_TOKEN"]), "vertex")
    assert not [r for r in plain if "secretmanager" in r.typ]
    gce = deployable_config("dev", secrets=json.dumps(SECRETS))  # the controller reads them
    assert not [r for r in _declared(gce, "dev") if "secretmanager" in r.typ]
    # what a reconcile job would be granted, where the stack declares one
    assert parse_spec(gce, "dev").secret_access == (
        ("data-team", "db-pass"),
        (parse_spec(gce, "dev").project, "hf-token"),
    )


def test_doctor_asks_for_the_grant_only_when_there_is_one() -> None:
    with_grant = parse_spec(_vertex(SECRETS), "vertex")
    types = spec_resource_types(with_grant)
    assert SECRET_IAM in types
    needed = required_permissions(types, vertex=True)
    assert {"secretmanager.secrets.getIamPolicy", "secretmanager.secrets.setIamPolicy"} <= set(
        needed
    )
    assert "roles/secretmanager.admin" in roles_for(needed)
    without = spec_resource_types(parse_spec(_vertex(["WANDB_API_KEY"]), "vertex"))
    assert SECRET_IAM not in without


def test_a_bad_secret_entry_is_one_line_and_declares_nothing() -> None:
    message = expect_declares_nothing(_vertex(["HF_TOKEN=s3://bucket/key"]), "vertex")
    assert message.startswith("gputrain:secrets: 'HF_TOKEN=...' is not allowed"), message
