"""The run bucket under Pulumi mocks: the stack's own bucket and its settings, the nodes' grant on
that bucket only, an existing `bucket` used as is, and the names GCS would refuse."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from infra import keys
from infra.plan import build_plan
from infra.spec import ClusterSpec, SpecError, parse_spec, stack_bucket_name
from tests.support.pulumi_mocks import (
    ACCOUNT,
    IAM_MEMBER,
    TEST_PROJECT,
    GcpMocks,
    deployable_config,
    walk,
)

BUCKET = "gcp:storage/bucket:Bucket"
BUCKET_IAM = "gcp:storage/bucketIAMMember:BucketIAMMember"


def _spec(**overrides: str) -> ClusterSpec:
    return parse_spec(deployable_config("dev", **overrides), "dev")


def _nodes_member(m: GcpMocks) -> str:
    [sa] = m.of_type(ACCOUNT)
    return f"serviceAccount:{sa.inputs['accountId']}@{TEST_PROJECT}.iam.gserviceaccount.com"


@pulumi.runtime.test
def test_stack_bucket_settings(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = _spec(labels='["team=ml"]', bucketRetentionDays="7")
    cluster = GpuCluster(spec.stack, spec)

    def check(out: dict[str, Any]) -> None:
        [b] = mocks.of_type(BUCKET)
        x = b.inputs
        assert x["name"] == "gputrain-dev-gputrain-test-1" == out["bucket"]
        assert x["project"] == TEST_PROJECT and x["location"] == "US-CENTRAL1"
        assert x["uniformBucketLevelAccess"] is True
        assert x["publicAccessPrevention"] == "enforced"
        assert float(x["softDeletePolicy"]["retentionDurationSeconds"]) == 0  # soft delete off
        [rule] = x["lifecycleRules"]
        assert rule["action"] == {"type": "Delete"} and float(rule["condition"]["age"]) == 7
        assert x["labels"] == {
            "gputrain-stack": "dev",
            "gputrain-project": "gputrain",
            "team": "ml",
        }
        assert x["forceDestroy"] is False  # only `gputrain down` empties it, after downloading
        assert out["bucketPrefix"] == "" and out["bucketOwned"] is True

    return pulumi.Output.all(**cluster.exports()).apply(check)


@pulumi.runtime.test
def test_nodes_may_use_that_bucket_and_no_other(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = _spec()
    cluster = GpuCluster(spec.stack, spec)

    def check(_: Any) -> None:
        [grant] = mocks.of_type(BUCKET_IAM)
        assert grant.inputs == {
            "bucket": "gputrain-dev-gputrain-test-1",
            "role": "roles/storage.objectUser",
            "member": _nodes_member(mocks),
        }
        # Nothing project-wide about storage: the project roles stay logs and metrics.
        project_roles = [r.inputs["role"] for r in mocks.of_type(IAM_MEMBER)]
        assert not [r for r in project_roles if "storage" in r], project_roles

    return pulumi.Output.all(**cluster.exports()).apply(check)


@pulumi.runtime.test
def test_existing_bucket_is_used_as_is(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = _spec(bucket="gs://team-ckpts/gputrain/dev/")
    assert (spec.existing_bucket, spec.bucket_prefix) == ("team-ckpts", "gputrain/dev/")
    cluster = GpuCluster(spec.stack, spec)

    def check(out: dict[str, Any]) -> None:
        assert mocks.of_type(BUCKET) == []  # nothing created: `down` has nothing to delete
        [grant] = mocks.of_type(BUCKET_IAM)
        assert grant.inputs["bucket"] == "team-ckpts"
        assert grant.inputs["role"] == "roles/storage.objectUser"
        assert grant.inputs["member"] == _nodes_member(mocks)
        assert (out["bucket"], out["bucketPrefix"], out["bucketOwned"]) == (
            "team-ckpts",
            "gputrain/dev/",
            False,
        )

    return pulumi.Output.all(**cluster.exports()).apply(check)


def test_bucket_prefix_forms() -> None:
    assert _spec(bucket="gs://team-ckpts").bucket_prefix == ""
    assert _spec(bucket="gs://team-ckpts/").bucket_prefix == ""
    assert _spec(bucket="gs://team.ckpts_1/a/b").bucket_prefix == "a/b/"
    assert _spec().existing_bucket is None and _spec().bucket_retention_days == 30


@pytest.mark.parametrize(
    "value",
    [
        "team-ckpts",  # no scheme
        "s3://team-ckpts",
        "gs://",
        "gs://ab",  # too short
        "gs://" + "a" * 64,  # too long
        "gs://Team-Ckpts",  # upper case
        "gs://-ckpts",
        "gs://ckpts.",
        "gs://goog-ckpts",
        "gs://ckpts-google",
        "gs://ck..pts",
        "gs://192.168.1.1",
        "gs://ckpts//a",
        "gs://ckpts/a/../b",
        "gs://ckpt s",
    ],
)
def test_bad_bucket_is_one_line_naming_the_key(value: str) -> None:
    with pytest.raises(SpecError) as e:
        _spec(bucket=value)
    msg = str(e.value)
    assert msg.startswith(f"gputrain:bucket = {value!r}: allowed: gs://NAME[/PREFIX]")
    assert "\n" not in msg


def test_bucket_retention_days_with_an_existing_bucket_is_refused() -> None:
    """Its lifecycle rule goes on the stack's own bucket only: beside an existing bucket it
    would change nothing, so it is one line, not a setting silently without effect."""
    with pytest.raises(SpecError) as e:
        _spec(bucket="gs://my-bucket", bucketRetentionDays="5")
    assert str(e.value) == (
        "gputrain:bucketRetentionDays = '5': only used with the stack's own bucket; "
        "gputrain:bucket = 'gs://my-bucket' is an existing bucket, whose lifecycle rules stay "
        "its own: remove bucketRetentionDays"
    )
    assert _spec(bucketRetentionDays="5").bucket_retention_days == 5
    assert _spec(bucket="gs://my-bucket").existing_bucket == "my-bucket"


@pytest.mark.parametrize(
    "project",
    [
        "gputrain-test-1",
        "my-google-project",  # "google" is refused in bucket names
        "a-thirty-character-project-id1",  # 9 + 21 + 1 + 30 > 63
    ],
)
def test_stack_bucket_name_is_always_a_valid_name(project: str) -> None:
    name = stack_bucket_name("a-twenty-one-char-stk", project)
    assert keys.bucket_name_problem(name) is None, name
    assert name.startswith("gputrain-a-twenty-one-char-stk-")
    assert name == stack_bucket_name("a-twenty-one-char-stk", project)  # stable
    if project == "gputrain-test-1":
        assert name.endswith(project)


def test_plan_shows_the_bucket() -> None:
    own = build_plan(_spec()).footer_lines()
    assert any(
        line.startswith("Bucket: gs://gputrain-dev-gputrain-test-1/runs/<run-id>/")
        and "30 days" in line
        for line in own
    ), own
    theirs = build_plan(_spec(bucket="gs://team-ckpts/x")).footer_lines()
    assert any("gs://team-ckpts/x/runs/<run-id>/" in ln and "never" in ln for ln in theirs)


def test_no_storage_role_is_granted_project_wide() -> None:
    """The nodes' project roles (NodeIdentity) hold no storage role at all."""
    from infra.components.identity import NODE_ROLES

    assert not [r for r in walk(NODE_ROLES) if "storage" in r]
