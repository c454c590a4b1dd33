"""Datasets (`data`): the entries and their one-line errors, the job's variables, `--data` over the
stack's, and under Pulumi mocks the nodes' read-only grant on each dataset bucket and no other."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pulumi
import pytest

from infra.base.errors import UserError
from infra.datasets import (
    Dataset,
    data_env,
    merge_datasets,
    parse_data_flags,
    parse_dataset,
    parse_datasets,
    vertex_data_env,
)
from infra.spec import parse_spec
from infra.stackfile import load_stack_config
from tests.support.pulumi_mocks import (
    ACCOUNT,
    ROOT,
    TEST_PROJECT,
    GcpMocks,
    deployable_config,
    pulumi_mocks,
)

BUCKET_IAM = "gcp:storage/bucketIAMMember:BucketIAMMember"


def test_entries_and_their_defaults() -> None:
    assert parse_dataset("train", "gs://my-data/owt/v1/") == Dataset("train", "my-data", "owt/v1/")
    assert parse_dataset("t", "gs://my-data/a:mount") == Dataset("t", "my-data", "a/", "mount")
    assert parse_dataset("t", "gs://my-data") == Dataset("t", "my-data", "", "copy")
    d = parse_dataset("web_10B", "gs://b-1/x/y:copy")
    assert (d.uri, d.env_name, d.spec()) == (
        "gs://b-1/x/y/",
        "GPUTRAIN_DATA_WEB_10B",
        "web_10B=gs://b-1/x/y/:copy",
    )
    assert d.vertex_path == "/gcs/b-1/x/y"


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("train", "s3://bucket/x", "expected gs://BUCKET/PREFIX"),
        ("train", 42, "expected gs://BUCKET/PREFIX"),
        (
            "train",
            "gs://bucket/x:stream",
            "mode 'stream' in 'gs://bucket/x:stream' is not allowed; use copy or mount",
        ),
        ("train", "gs://Bad_Bucket/x", "bucket 'Bad_Bucket'"),
        ("train", "gs:///x", "bucket ''"),
        ("train", "gs://bucket/a/../b", "prefix 'a/../b'"),
        ("train", "gs://bkt/p ", "'gs://bkt/p ' is not allowed (space at its start or end)"),
        ("train", " gs://bkt/p", "' gs://bkt/p' is not allowed (space at its start or end)"),
        ("train", "gs://bkt/p :mount", "prefix 'p ' in 'gs://bkt/p :mount' is not allowed"),
        (
            "train",
            {"uri": "gs://bkt/p", "mode": "mount"},
            "data.train: a mapping is not allowed; expected one string gs://BUCKET/PREFIX",
        ),
        ("1st", "gs://bucket/x", "dataset name '1st' is not allowed"),
        ("has-dash", "gs://bucket/x", "dataset name 'has-dash'"),
    ],
)
def test_a_malformed_entry_is_one_line_naming_it(name: str, value: Any, says: str) -> None:
    with pytest.raises(UserError) as e:
        parse_dataset(name, value)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_names_that_share_a_variable_are_refused() -> None:
    with pytest.raises(UserError, match="'train' and 'TRAIN' would both be GPUTRAIN_DATA_TRAIN"):
        parse_datasets({"train": "gs://b-1/a", "TRAIN": "gs://b-1/b"})
    with pytest.raises(UserError, match="expected a map"):
        parse_datasets(["gs://b-1/a"])  # type: ignore[arg-type]


def test_flags_add_and_replace_the_targets_datasets() -> None:
    stack = parse_datasets({"train": "gs://b-1/a", "val": "gs://b-1/v"})
    flags = parse_data_flags(["train=gs://b-2/new:mount", "extra=gs://b-3/e"])
    merged = merge_datasets(stack, flags)
    assert [(d.name, d.bucket, d.mode) for d in merged] == [
        ("train", "b-2", "mount"),
        ("val", "b-1", "copy"),
        ("extra", "b-3", "copy"),
    ]
    with pytest.raises(UserError, match="--data 'nothing': expected NAME=gs://"):
        parse_data_flags(["nothing"])
    with pytest.raises(UserError, match=r"--data\.train: mode 'x'"):
        merge_datasets([], {"train": "gs://b-1/a:x"})


def test_the_jobs_variables() -> None:
    ds = parse_datasets({"train": "gs://b-1/a", "web": "gs://b-2/w:mount"})
    assert data_env(ds, "/d") == {
        "GPUTRAIN_DATA_DIR": "/d",
        "GPUTRAIN_DATA_TRAIN": "/d/train",
        "GPUTRAIN_DATA_WEB": "/d/web",
    }
    assert data_env([], "/d") == {}
    # Vertex: mount = its own /gcs/ path; copy = the replica's disk (vertex_entry copies it)
    assert vertex_data_env(ds) == {
        "GPUTRAIN_DATA_WEB": "/gcs/b-2/w",
        "GPUTRAIN_DATA_COPY": "train=gs://b-1/a/:copy",
    }
    assert vertex_data_env(ds[1:]) == {
        "GPUTRAIN_DATA_WEB": "/gcs/b-2/w",
        "GPUTRAIN_DATA_DIR": "/gcs",
    }
    assert vertex_data_env([]) == {}


def test_the_stack_key() -> None:
    data = json.dumps({"train": "gs://my-data/owt", "web": "gs://other-data/w:mount"})
    spec = parse_spec(deployable_config("dev", data=data), "dev")
    assert [d.spec() for d in spec.datasets] == [
        "train=gs://my-data/owt/:copy",
        "web=gs://other-data/w/:mount",
    ]
    assert parse_spec(deployable_config("dev"), "dev").datasets == ()
    with pytest.raises(UserError, match=r"data\.web: mode 'fast'"):
        parse_spec(deployable_config("dev", data='{"web": "gs://b-1/w:fast"}'), "dev")
    with pytest.raises(UserError, match="data: 'gs://b-1/w' is not allowed; expected a map"):
        parse_spec(deployable_config("dev", data="gs://b-1/w"), "dev")
    # the mode is part of the text: a {uri, mode} mapping is refused, one line naming the form
    with pytest.raises(
        UserError, match=r"gputrain:data = .*: allowed: a mapping of NAME: gs://BUCKET/PREFIX "
    ):
        parse_spec(deployable_config("dev", data='{"web": {"uri": "gs://b-1/w"}}'), "dev")
    with pytest.raises(UserError, match=r"data\.web: a mapping is not allowed; expected one str"):
        parse_dataset("web", {"uri": "gs://b-1/w"})  # a hosts file's data is read so


@pytest.fixture
def mocks() -> Iterator[GcpMocks]:
    with pulumi_mocks(load_stack_config(ROOT, "dev")) as m:
        yield m


@pulumi.runtime.test
def test_nodes_may_read_each_data_bucket_and_no_other(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    data = {"train": "gs://my-data/a", "val": "gs://my-data/b", "web": "gs://other-data/w:mount"}
    spec = parse_spec(deployable_config("dev", data=json.dumps(data)), "dev")
    cluster = GpuCluster(spec.stack, spec)

    def check(_: Any) -> None:
        [sa] = mocks.of_type(ACCOUNT)
        member = f"serviceAccount:{sa.inputs['accountId']}@{TEST_PROJECT}.iam.gserviceaccount.com"
        grants = sorted(
            (g.inputs["bucket"], g.inputs["role"], g.inputs["member"])
            for g in mocks.of_type(BUCKET_IAM)
        )
        assert grants == [
            ("gputrain-dev-gputrain-test-1", "roles/storage.objectUser", member),
            ("my-data", "roles/storage.objectViewer", member),  # once for two datasets
            ("other-data", "roles/storage.objectViewer", member),
        ]

    return pulumi.Output.all(**cluster.exports()).apply(check)


@pytest.mark.parametrize(
    "value",
    ["gs://user:hunter2@bucket/x", "gs://user:hunter2@bucket", "gs://hunter2@bucket/p:copy"],
)
def test_a_dataset_url_with_a_user_or_password_is_refused_without_echoing_it(value: str) -> None:
    with pytest.raises(UserError) as e:
        parse_dataset("D", value)
    message = str(e.value)
    assert "holds a user or password" in message and "hunter2" not in message
    assert "mode" not in message  # not read as gs://BUCKET/PREFIX:MODE
