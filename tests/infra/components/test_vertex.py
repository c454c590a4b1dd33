"""`backend: vertex` under Pulumi mocks and without Pulumi: no VMs or network, the jobs' service
account with least privilege, the stack bucket, the enabled API, the exports the controller reads;
the keys Vertex ignores; and bad Vertex configs as one line each with nothing declared."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from infra.offers import price_table
from infra.outputs import parse_vertex_outputs
from infra.plan import build_plan
from infra.spec import parse_spec, require_deployable
from infra.stackfile import load_stack_config
from tests.support.fake_stack import sample_vertex_outputs
from tests.support.program import expect_declares_nothing, run_main
from tests.support.pulumi_mocks import (
    ACCOUNT,
    FIREWALL,
    IAM_MEMBER,
    INSTANCE,
    NETWORK,
    POLICY,
    ROOT,
    SUBNET,
    TEST_PROJECT,
    deployable_config,
    pulumi_mocks,
)

BUCKET = "gcp:storage/bucket:Bucket"
BUCKET_IAM = "gcp:storage/bucketIAMMember:BucketIAMMember"
SERVICE = "gcp:projects/service:Service"
EMAIL = f"gputrain-vertex@{TEST_PROJECT}.iam.gserviceaccount.com"


def _vertex(**overrides: str) -> dict[str, str]:
    """The shipped vertex stack as a user deploys it: gcp:project set, nothing else."""
    cfg = load_stack_config(ROOT, "vertex")
    cfg["gcp:project"] = TEST_PROJECT
    for key, value in overrides.items():
        cfg[key if ":" in key else f"gputrain:{key}"] = value
    return cfg


def _program(config: dict[str, str]) -> tuple[list[Any], dict[str, Any]]:
    """Run __main__.py under mocks; (the declared resources, the stack outputs)."""
    with pulumi_mocks({}, stack="vertex") as m:
        got: dict[str, Any] = {}

        @pulumi.runtime.test
        def run() -> Any:
            cluster = run_main(config, "vertex")["cluster"]
            return pulumi.Output.all(**cluster.exports()).apply(got.update)

        run()
        return m.resources, got


def test_the_vertex_program_declares_no_vm_and_no_network() -> None:
    resources, _ = _program(_vertex())
    kinds = {r.typ for r in resources if r.custom}
    assert kinds == {SERVICE, ACCOUNT, IAM_MEMBER, BUCKET, BUCKET_IAM}
    assert not kinds & {INSTANCE, NETWORK, SUBNET, FIREWALL, POLICY}
    components = sorted(r.typ for r in resources if not r.custom)
    assert components == [
        "gputrain:infra:NodeIdentity",
        "gputrain:infra:StackBucket",
        "gputrain:infra:VertexStack",
    ]
    # `gputrain doctor` asks for exactly what these types need (infra/permissions.py)
    from infra.permissions import required_permissions, spec_resource_types

    spec = parse_spec(_vertex(), "vertex")
    assert set(spec_resource_types(spec)) == kinds
    needed = required_permissions(kinds, vertex=True)
    assert "serviceusage.services.enable" in needed and "aiplatform.customJobs.create" in needed
    assert "iam.serviceAccounts.actAs" in needed and "compute.instances.create" not in needed
    [api] = [r for r in resources if r.typ == SERVICE]
    assert api.inputs["service"] == "aiplatform.googleapis.com"
    assert api.inputs["project"] == TEST_PROJECT
    assert api.inputs["disableOnDestroy"] is False  # other stacks may still use the API


def test_the_jobs_account_writes_logs_and_uses_the_stack_bucket_only() -> None:
    resources, _ = _program(_vertex(labels='["team=ml"]'))
    [sa] = [r for r in resources if r.typ == ACCOUNT]
    assert sa.inputs["accountId"] == "gputrain-vertex" and sa.inputs["project"] == TEST_PROJECT
    member = f"serviceAccount:{EMAIL}"
    grants = [(r.inputs["role"], r.inputs["member"]) for r in resources if r.typ == IAM_MEMBER]
    assert grants == [("roles/logging.logWriter", member)]  # nothing else project-wide
    [bucket] = [r for r in resources if r.typ == BUCKET]
    assert bucket.inputs["name"] == f"gputrain-vertex-{TEST_PROJECT}"
    assert bucket.inputs["location"] == "US-CENTRAL1"
    assert bucket.inputs["uniformBucketLevelAccess"] is True
    assert bucket.inputs["publicAccessPrevention"] == "enforced"
    assert bucket.inputs["labels"] == {
        "gputrain-stack": "vertex",
        "gputrain-project": "gputrain",
        "team": "ml",
    }
    [grant] = [r for r in resources if r.typ == BUCKET_IAM]
    assert grant.inputs == {
        "bucket": f"gputrain-vertex-{TEST_PROJECT}",
        "role": "roles/storage.objectUser",
        "member": member,
    }


def test_the_exports_are_what_the_controller_reads() -> None:
    _, out = _program(_vertex())
    assert out == {
        "backend": "vertex",
        "stack": "vertex",
        "project": TEST_PROJECT,
        "region": "us-central1",
        "serviceAccount": EMAIL,
        "bucket": f"gputrain-vertex-{TEST_PROJECT}",
        "bucketPrefix": "",
        "bucketOwned": True,
        "machineType": "g2-standard-24",
        "accelerator": "nvidia-l4",
        "gpusPerNode": 2,
        "replicas": 2,
        "spot": True,
        "executorImage": "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest",
        "maxRunDuration": "3h",
        "maxRunDurationSeconds": 3 * 3600,
        "hourlyPricePerNodeUsd": out["hourlyPricePerNodeUsd"],
        "hourlyPriceUsd": round(out["hourlyPricePerNodeUsd"] * 2, 4),
        "priceAsOf": price_table().date,
        "nodeCount": 2,
        "gpusTotal": 4,
        "gpusRequest": "",
    }
    spec = parse_spec(_vertex(), "vertex")
    assert out["hourlyPricePerNodeUsd"] == round(spec.hourly_price_per_node, 4)
    # the fake stack runner answers the controller with the same shape
    assert set(sample_vertex_outputs("vertex", "us-central1")) == set(out)
    parsed = parse_vertex_outputs(out)
    assert (parsed.bucket, parsed.service_account) == (out["bucket"], EMAIL)


def test_an_existing_bucket_is_only_granted() -> None:
    resources, out = _program(_vertex(bucket="gs://team-runs/vertex/"))
    assert not [r for r in resources if r.typ == BUCKET]
    [grant] = [r for r in resources if r.typ == BUCKET_IAM]
    assert grant.inputs["bucket"] == "team-runs"
    assert (out["bucket"], out["bucketPrefix"], out["bucketOwned"]) == (
        "team-runs",
        "vertex/",
        False,
    )


# ---- the keys Vertex ignores ------------------------------------------------------------------


def test_vertex_needs_no_ssh_settings_and_names_what_it_ignores() -> None:
    # Values the GCE rules refuse: on Vertex they are not read at all.
    cfg = _vertex(
        sshSourceRanges='["0.0.0.0/0"]',
        placement="compact",
        nodes="1",
        bootDiskGb="5",
        imageFamily="Not An Image",
        publicIp="all",
    )
    spec = parse_spec(cfg, "vertex")
    require_deployable(spec)  # no sshPublicKey, no sshSourceRanges: nothing missing
    assert spec.on_vertex and spec.ssh_public_key is None
    assert spec.ignored == ("imageFamily", "bootDiskGb", "sshSourceRanges", "publicIp", "placement")
    plan = build_plan(spec)
    assert plan.ready and plan.missing == ()
    lines = plan.footer_lines()
    assert (
        "warning: ignored with backend vertex: imageFamily, bootDiskGb, sshSourceRanges, "
        "publicIp, placement" in lines
    )
    assert plan.row[3] == "us-central1 (Vertex AI)"


def test_gce_ignores_the_executor_image_and_still_needs_its_keys() -> None:
    spec = parse_spec(deployable_config("dev", executorImage="europe-docker.pkg.dev/x/y:1"), "dev")
    assert spec.backend == "gce" and spec.ignored == ("executorImage",)
    without_key = deployable_config("dev")
    del without_key["gputrain:sshPublicKey"]
    with pytest.raises(Exception, match="gputrain:sshPublicKey is not set"):
        require_deployable(parse_spec(without_key, "dev"))


def test_vertex_price_carries_the_training_premium_and_says_it_is_derived() -> None:
    gce = parse_spec(_vertex(backend="gce", **{"gputrain:sshSourceRanges": "[]"}), "vertex")
    vx = parse_spec(_vertex(), "vertex")
    assert vx.hourly_price_per_node == pytest.approx(gce.hourly_price_per_node * 1.15, rel=1e-3)
    plan = build_plan(vx)
    assert "Vertex training premium +15 %" in plan.price_note
    assert any("derived" in w and "Vertex training premium" in w for w in plan.warnings)
    assert "Vertex AI custom training quota needed in us-central1: 4 x NVIDIA_L4" in (
        plan.price_note
    )


def test_unverified_vertex_shapes_get_a_caveat_in_plan() -> None:
    b200_image = "us-docker.pkg.dev/my-proj/train/pytorch-2-7-cu128:latest"  # B200: >= 2.7
    spec = parse_spec(
        _vertex(machineType="a4-highgpu-8g", nodes="1", executorImage=b200_image), "vertex"
    )
    assert any("support for a4-highgpu-8g is unverified" in w for w in build_plan(spec).warnings)
    spec = parse_spec(_vertex(zones='["asia-east1-a"]'), "vertex")  # L4: known there
    assert not any("not among the regions" in w for w in build_plan(spec).warnings)
    spec = parse_spec(_vertex(machineType="a3-megagpu-8g", zones='["asia-east1-a"]'), "vertex")
    assert any(
        "asia-east1 is not among the regions known to offer nvidia-h100-mega-80gb" in w
        for w in build_plan(spec).warnings
    )


# ---- bad Vertex configs: one line each, nothing declared ------------------------------------

BAD_VERTEX: list[tuple[str, dict[str, str], str]] = [
    (
        "backend",
        _vertex(backend="sagemaker"),
        "gputrain:backend = 'sagemaker': allowed: gce, vertex",
    ),
    (
        "n1-too-small",
        _vertex(machineType="n1-standard-2", gpuType="nvidia-tesla-t4", gpuCount="1"),
        "gputrain:machineType 'n1-standard-2': Vertex AI custom training does not run it",
    ),
    (
        "n1-highcpu-8",
        _vertex(machineType="n1-highcpu-8", gpuType="nvidia-tesla-t4", gpuCount="1"),
        "gputrain:machineType 'n1-highcpu-8': Vertex AI custom training does not run it",
    ),
    (
        "a3-edge",
        _vertex(machineType="a3-edgegpu-8g"),
        "gputrain:machineType = 'a3-edgegpu-8g': A3 Edge is a serving product",
    ),
    (
        "unknown-machine",
        _vertex(machineType="g2-standard-5"),
        "gputrain:machineType = 'g2-standard-5': not a known machine type",
    ),
    (
        "spot-only",
        _vertex(machineType="a3-highgpu-2g", capacity="on-demand"),
        "gputrain:capacity = 'on-demand': a3-highgpu-2g is not offered as on-demand",
    ),
    (
        "b200-with-the-pytorch-2-4-container",
        _vertex(machineType="a4-highgpu-8g", zones='["us-central1-b"]'),
        "gputrain:executorImage = 'us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest'"
        ": PyTorch 2.4 / CUDA 12.1 has no Blackwell kernels",
    ),
    (
        "reservation-on-vertex",
        _vertex(machineType="a3-highgpu-8g", capacity="reservation", reservation="r"),
        "gputrain:capacity = 'reservation': not supported with backend vertex; allowed: on-demand",
    ),
    (
        "capacity-list-on-vertex",  # was: the first mode, the rest never tried
        _vertex(capacity='["spot", "flex-start"]'),
        'gputrain:capacity = \'["spot", "flex-start"]\': a list is not tried in order with '
        "backend vertex",
    ),
    (
        "gpu-on-g2",
        _vertex(gpuType="nvidia-tesla-t4"),
        "gputrain:gpuType = 'nvidia-tesla-t4': g2-standard-24 brings nvidia-l4",
    ),
    (
        "n1-without-gpu",
        _vertex(machineType="n1-standard-8"),
        "gputrain:gpuType is empty: n1-standard-8 needs an attached GPU",
    ),
    (
        "image-with-space",
        _vertex(executorImage="pytorch latest"),
        "gputrain:executorImage = 'pytorch latest': allowed: a container image like",
    ),
    (
        "image-is-a-bucket",
        _vertex(executorImage="gs://b/trainer.tar.gz"),
        "gputrain:executorImage = 'gs://b/trainer.tar.gz': allowed: a container image",
    ),
    (
        "timeout-too-short",
        _vertex(maxRunDuration="5m"),
        "gputrain:maxRunDuration = '5m': allowed: 10m to 120d",
    ),
    ("too-many-nodes", _vertex(nodes="65"), "gputrain:nodes = '65': allowed: 1..64"),
    (
        "zones-two-regions",
        _vertex(zones='["us-central1-a", "europe-west4-a"]'),
        "gputrain:zones = 'us-central1-a,europe-west4-a': all zones must be in one region",
    ),
    (
        "reserved-label",
        _vertex(labels='["gputrain-stack=x"]'),
        "gputrain:labels = 'gputrain-stack': gputrain-stack, gputrain-project are set by gputrain",
    ),
    (
        "typo",
        _vertex(**{"gputrain:executorimage": "x"}),
        "gputrain:executorimage: not a gputrain setting",
    ),
    (
        "bad-bucket",
        _vertex(bucket="gs://Bad_Bucket"),
        "gputrain:bucket = 'gs://Bad_Bucket': allowed: gs://NAME[/PREFIX]",
    ),
    ("bad-project", _vertex(**{"gcp:project": "X"}), "gcp:project = 'X': allowed: a GCP project"),
]


@pytest.mark.parametrize(
    ("config", "expected"), [c[1:] for c in BAD_VERTEX], ids=[c[0] for c in BAD_VERTEX]
)
def test_bad_vertex_config_is_one_line_and_declares_nothing(
    config: dict[str, str], expected: str
) -> None:
    message = expect_declares_nothing(config, "vertex")
    assert message.startswith(expected), message


def test_worker_pools_are_the_jobs_not_the_stacks() -> None:
    """chief, reductionServer and vertexJobSpec shape the job, which is no Pulumi resource: the
    program declares the same stack with or without them (they never reach it)."""
    pools = {
        "chief": '{"machineType": "g2-standard-8"}',
        "reductionServer": '{"replicas": 2}',
        "vertexJobSpec": "config.yaml",
    }
    spec = parse_spec(_vertex(**pools), "vertex")
    assert spec.reduction_server is not None and spec.reduction_server.replicas == 2
    assert spec.chief is not None and spec.chief.machine_type == "g2-standard-8"
    plain, plain_out = _program(_vertex())
    pooled, pooled_out = _program(_vertex(**pools))

    def declared(resources: list[Any]) -> list[tuple[str, str, str]]:  # registration order varies
        return sorted((r.typ, r.name, repr(sorted(r.inputs.items()))) for r in resources)

    assert declared(pooled) == declared(plain)
    assert pooled_out == plain_out
    # a gce stack ignores them, and `plan` names them
    gce = parse_spec(_vertex(backend="gce", **pools, sshSourceRanges='["10.0.0.0/8"]'), "vertex")
    assert gce.reduction_server is None and gce.chief is None and gce.vertex_job_spec == ""
    assert set(pools) <= set(gce.ignored)
