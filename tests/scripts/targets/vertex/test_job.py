"""Vertex AI, the pure parts: which shapes Vertex runs (one-line errors), the enum map checked
against the real client's enum, the CustomJob body checked against the real CustomJob schema, job
state/error text, log prefixes and de-duplication, and the sdist installed offline with pip."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from infra import catalog, vertex
from infra.base.errors import UserError
from scripts.targets.vertex import job as vj
from tests.support import ROOT

# ---- which shapes Vertex runs -------------------------------------------------------------------

BAD_SHAPES = [
    # (machine type, gpu type, gpu count, spot, words the one-line error must contain)
    ("a2-hihgpu-1g", None, 0, False, ["machineType 'a2-hihgpu-1g'", "did you mean a2-highgpu-1g"]),
    ("a3-edgegpu-8g", None, 0, False, ["machineType 'a3-edgegpu-8g'", "serving", "allowed:"]),
    ("n1-standard-2", "nvidia-tesla-t4", 1, False, ["machineType 'n1-standard-2'", "allowed:"]),
    ("n1-highcpu-8", "nvidia-tesla-t4", 1, False, ["machineType 'n1-highcpu-8'", "n1-highcpu-16"]),
    (
        "a3-highgpu-2g",
        None,
        0,
        False,
        ["machineType 'a3-highgpu-2g'", "set gputrain:capacity spot"],
    ),
    ("g2-standard-8", "tpu-v5", 0, False, ["gpuType 'tpu-v5'", "nvidia-l4"]),
    ("g2-standard-8", "nvidia-tesla-t4", 0, False, ["gpuType 'nvidia-tesla-t4'", "nvidia-l4"]),
    ("a3-megagpu-8g", None, 4, False, ["gpuCount 4", "use 0 (implied) or 8"]),
    ("n1-standard-8", None, 0, False, ["gpuType is empty", "nvidia-tesla-t4"]),
    ("n1-standard-8", "nvidia-l4", 1, False, ["gpuType 'nvidia-l4'", "nvidia-tesla-v100"]),
    ("n1-standard-8", "nvidia-tesla-t4", 3, False, ["gpuCount 3", "1, 2, 4"]),
    ("n1-standard-96", "nvidia-tesla-v100", 1, False, ["machineType 'n1-standard-96'", "12 vCPUs"]),
]


@pytest.mark.parametrize(("mt", "gpu", "count", "spot", "words"), BAD_SHAPES)
def test_vertex_rejects_shapes_in_one_line(
    mt: str, gpu: str | None, count: int, spot: bool, words: list[str]
) -> None:
    problem = vertex.vertex_problem(mt, gpu, count, spot=spot)
    assert problem is not None and "\n" not in problem
    for word in words:
        assert word in problem


@pytest.mark.parametrize(
    ("mt", "gpu", "count", "spot"),
    [
        ("a2-highgpu-8g", None, 0, False),
        ("a2-ultragpu-1g", "nvidia-a100-80gb", 1, False),
        ("a3-highgpu-8g", None, 8, False),
        ("a3-megagpu-8g", None, 0, True),
        ("a3-highgpu-2g", None, 0, True),
        ("g2-standard-24", "nvidia-l4", 2, False),
        ("n1-standard-8", "nvidia-tesla-t4", 1, False),
        ("n1-highmem-16", "nvidia-tesla-v100", 4, False),
        ("n1-standard-4", "nvidia-tesla-p100", 1, False),
        ("n1-standard-16", "nvidia-tesla-p4", 2, False),
    ],
)
def test_vertex_runs_listed_shapes(mt: str, gpu: str | None, count: int, spot: bool) -> None:
    assert vertex.vertex_problem(mt, gpu, count, spot=spot) is None


def test_every_catalog_accelerator_has_a_real_vertex_enum() -> None:
    from google.cloud.aiplatform_v1.types import AcceleratorType

    assert set(vertex.ACCELERATOR_ENUMS) == set(catalog.ACCELERATORS)
    for name, enum in vertex.ACCELERATOR_ENUMS.items():
        assert getattr(AcceleratorType, enum).name == enum
        assert vertex.accelerator_enum(name) == enum
    assert vertex.accelerator_enum("nvidia-a100-40gb") == "NVIDIA_TESLA_A100"  # catalog alias
    with pytest.raises(KeyError):
        vertex.accelerator_enum("nvidia-tesla-k80")


def test_every_offer_matches_catalog_machine_types_and_only_unverified_ones_get_a_caveat() -> None:
    for offer in vertex.OFFERS:
        assert any(vertex.vertex_offer(name) is offer for name in catalog.MACHINE_TYPES), offer
    assert vertex.vertex_caveat("a3-megagpu-8g") is None
    caveat = vertex.vertex_caveat("a4-highgpu-8g")
    assert caveat is not None and "unverified" in caveat and "training clusters" in caveat
    assert vertex.vertex_offer("a3-edgegpu-8g") is None


def test_vertex_price_adds_the_derived_training_premium() -> None:
    from infra.offers import vm_price

    p = vertex.vertex_price("a2-highgpu-1g", None, 0, "us-central1")
    base = vm_price("a2-highgpu-1g", "us-central1-a")
    assert p is not None and base is not None and base.on_demand and base.spot
    assert (p.on_demand, p.spot) == (round(base.on_demand * 1.15, 4), round(base.spot * 1.15, 4))
    assert "derived" in p.note and vertex.SURCHARGE_BASIS in p.note
    n1 = vertex.vertex_price("n1-standard-8", "nvidia-tesla-t4", 1, "us-central1")
    t4 = vm_price("n1-standard-8", "us-central1-a", "nvidia-tesla-t4", 1)
    assert n1 is not None and t4 is not None and t4.on_demand
    assert n1.on_demand == round(t4.on_demand * 1.15, 4)
    assert vertex.vertex_price("a2-highgpu-1g", None, 0, "mars-north1") is None  # unknown, not 0


# ---- the request body ---------------------------------------------------------------------------


def _request(**kw: object) -> vj.JobRequest:
    base: dict[str, object] = dict(
        display_name="gputrain-dev-r1",
        region="us-central1",
        machine_type="g2-standard-24",
        gpu_type=None,
        gpu_count=0,
        nodes=3,
        spot=False,
        max_run_duration_s=7200,
        output_dir=vj.run_output_dir("bkt", "r1"),
        package_uris=(vj.staging_dir("bkt", "r1") + "gputrain-job-0.tar.gz",),
        args=("--steps", "100"),
        env={"B": "2", "A": "1"},
        labels={"gputrain-stack": "dev"},
    )
    base.update(kw)
    return vj.JobRequest(**base)  # type: ignore[arg-type]


def test_body_has_a_chief_pool_and_a_worker_pool_and_parses_as_a_real_custom_job() -> None:
    from google.cloud import aiplatform_v1

    body = vj.custom_job_body(_request())
    chief, workers = body["jobSpec"]["workerPoolSpecs"]
    assert chief["replicaCount"] == 1 and workers["replicaCount"] == 2
    assert chief["machineSpec"] == {
        "machineType": "g2-standard-24",
        "acceleratorType": "NVIDIA_L4",
        "acceleratorCount": 2,
    }
    pkg = chief["pythonPackageSpec"]
    assert pkg["pythonModule"] == "gputrain_node.vertex_entry"
    assert pkg["packageUris"] == ["gs://bkt/staging/r1/gputrain-job-0.tar.gz"]
    assert pkg["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert body["jobSpec"]["scheduling"] == {"timeout": "7200s", "strategy": "STANDARD"}
    assert body["jobSpec"]["baseOutputDirectory"] == {"outputUriPrefix": "gs://bkt/runs/r1/"}
    assert "serviceAccount" not in body["jobSpec"] and "diskSpec" not in chief
    # strict parse: a misspelt field or enum in our body would raise here
    job = aiplatform_v1.CustomJob.from_json(json.dumps(body))
    assert job.job_spec.worker_pool_specs[1].replica_count == 2
    assert job.job_spec.scheduling.strategy == aiplatform_v1.Scheduling.Strategy.STANDARD


def test_one_node_spot_body_has_one_pool_spot_strategy_disk_and_service_account() -> None:
    body = vj.custom_job_body(
        _request(
            nodes=1,
            spot=True,
            machine_type="n1-standard-8",
            gpu_type="nvidia-tesla-t4",
            gpu_count=1,
            boot_disk_gb=200,
            service_account="job@p.iam.gserviceaccount.com",
            region="europe-west4",
        )
    )
    (pool,) = body["jobSpec"]["workerPoolSpecs"]
    assert pool["machineSpec"]["acceleratorType"] == "NVIDIA_TESLA_T4"
    assert pool["diskSpec"] == {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 200}
    assert body["jobSpec"]["scheduling"]["strategy"] == "SPOT"
    assert body["jobSpec"]["serviceAccount"] == "job@p.iam.gserviceaccount.com"
    image = pool["pythonPackageSpec"]["executorImageUri"]
    assert image.startswith("europe-docker.pkg.dev/vertex-ai/training/pytorch-gpu")


def test_executor_image_follows_region_only_for_googles_images() -> None:
    assert vj.executor_image_for("asia-east1").startswith("asia-docker.pkg.dev/")
    assert vj.executor_image_for("us-east4") == vertex.DEFAULT_EXECUTOR_IMAGE
    mine = "europe-west4-docker.pkg.dev/p/r/img:1"
    assert vj.executor_image_for("asia-east1", mine) == mine


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"machine_type": "a3-edgegpu-8g"}, "machineType 'a3-edgegpu-8g'"),
        ({"nodes": 0}, "nodes = 0"),
        ({"max_run_duration_s": 0}, "maxRunDuration"),
    ],
)
def test_body_refuses_what_vertex_would_refuse(kw: dict[str, object], words: str) -> None:
    with pytest.raises(UserError, match=words):
        vj.custom_job_body(_request(**kw))


# ---- state and error ----------------------------------------------------------------------------


def test_parse_job_and_failure_message() -> None:
    status = vj.parse_job(
        {
            "name": "projects/123/locations/us-central1/customJobs/42",
            "state": "JOB_STATE_FAILED",
            "createTime": "2026-04-20T10:00:00.123456789Z",
            "startTime": "2026-04-20T10:00:41Z",
            "endTime": "2026-04-20T11:00:00.5+00:00",
            "error": {"code": 3, "message": "Machine type a3-megagpu-8g is not supported."},
        }
    )
    assert (status.job_id, status.short_state, status.done, status.succeeded) == (
        "42",
        "FAILED",
        True,
        False,
    )
    assert status.create_time == dt.datetime(2026, 4, 20, 10, 0, 0, 123456, tzinfo=dt.timezone.utc)
    text = vj.failure_message(status, ["[chief] boom", "[worker-1] bye"])
    assert text.splitlines() == [
        "Vertex job 42 FAILED: INVALID_ARGUMENT Machine type a3-megagpu-8g is not supported.",
        "last log lines:",
        "  [chief] boom",
        "  [worker-1] bye",
    ]
    seen = dt.datetime(2026, 4, 20, 10, 0, 41, tzinfo=dt.timezone.utc)
    assert vj.state_line(status, seen) == "10:00:41 Vertex job 42: FAILED (41 s after create)"
    running = vj.parse_job(
        {"name": "projects/1/locations/l/customJobs/7", "state": "JOB_STATE_RUNNING"}
    )
    assert not running.done and vj.failure_message(running).endswith("no error reported")


# ---- logs ---------------------------------------------------------------------------------------


def _line(sec: float, insert_id: str, task: str = "workerpool0-0", text: str = "x") -> vj.LogLine:
    t = dt.datetime(2026, 4, 20, 10, 0, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=sec)
    return vj.LogLine(t, insert_id, task, text)


def test_replica_prefixes() -> None:
    lines = [
        _line(0, "a", "workerpool0-0", "step 1\nstep 2"),
        _line(1, "b", "workerpool1-0", "w"),
        _line(2, "c", "workerpool1-2", "w3"),
        _line(3, "d", "", "Job is running."),
        _line(4, "e", "workerpool2-0", "reducer"),
    ]
    assert vj.format_log_lines(lines, reducers=True) == [
        "[chief] step 1",
        "[chief] step 2",
        "[worker-1] w",
        "[worker-3] w3",
        "[vertex] Job is running.",
        "[reducer-0] reducer",
    ]
    # a pool 2 that is no Reduction Server runs parameter servers, as the submit line says
    ps = vj.format_log_lines([_line(5, "f", "workerpool2-1", "ps"), _line(6, "g", "workerpool3-0",
                             "eval")], reducers=False)  # fmt: skip
    assert ps == ["[parameter-server-1] ps", "[evaluator-0] eval"]


def test_the_submit_line_names_pool_2_by_what_it_runs() -> None:
    """Pool 2 is Vertex's parameter servers or Reduction Server: a CPU pool of the user's own
    image beside one GPU node was announced as "reducers"."""
    from infra.vertex_pools import REDUCTION_SERVER_IMAGE

    def pool(machine: str, image: str, replicas: int = 1) -> dict[str, object]:
        return {"machineSpec": {"machineType": machine}, "replicaCount": replicas,
                "containerSpec": {"imageUri": image}}  # fmt: skip

    chief = pool("g2-standard-8", "r/p/train:1")
    servers = {"workerPoolSpecs": [chief, {}, pool("n1-standard-8", "r/p/ps:1", 2)]}
    assert vj.describe_pools(servers) == (
        "1 x g2-standard-8 (chief) + 2 x n1-standard-8 (parameter servers)"
    )
    reducers = {"workerPoolSpecs": [chief, {}, pool("n1-highcpu-16", REDUCTION_SERVER_IMAGE)]}
    assert vj.describe_pools(reducers).endswith("+ 1 x n1-highcpu-16 (reducers)")


def test_log_cursor_asks_again_with_lookback_and_never_repeats_a_line() -> None:
    cursor = vj.LogCursor(since=_line(0, "").timestamp, lookback=dt.timedelta(seconds=10))
    assert cursor.filter("42") == (
        'resource.type="ml_job" AND resource.labels.job_id="42" '
        'AND timestamp>="2026-04-20T09:59:50.000000Z"'
    )
    first = cursor.take([_line(1, "a"), _line(5, "b"), _line(5, "b")])
    assert [e.insert_id for e in first] == ["a", "b"]
    # the next poll returns the same entries again plus a late one (older than b) and a new one
    second = cursor.take([_line(1, "a"), _line(3, "late"), _line(5, "b"), _line(9, "c")])
    assert [e.insert_id for e in second] == ["late", "c"]
    assert 'timestamp>="2026-04-20T09:59:59.000000Z"' in cursor.filter("42")
    assert cursor.take([_line(9, "c")]) == []
    # entries without insertId are keyed by time, task and text
    assert len(cursor.take([_line(10, ""), _line(10, "")])) == 1


# ---- the code package ---------------------------------------------------------------------------


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "__init__.py").write_text("")
    (work / "train.py").write_text("print('hi')\n")
    (work / "data.csv").write_text("a,b\n1,2\n")
    (work / "odd[1]").mkdir()
    (work / "odd[1]" / "f.txt").write_text("y")
    (work / ".gitignore").write_text("big.bin\n")
    (work / "big.bin").write_bytes(b"\0" * 1024)
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    return work


def test_sdist_installs_offline_and_brings_the_trainer_and_the_workdir(tmp_path: Path) -> None:
    work = _workdir(tmp_path)
    archive, code_bytes = vj.build_sdist(
        work, tmp_path / "out", trainer_dir=ROOT / "trainer", limit_mib=200
    )
    assert archive.name == "gputrain-job-0.tar.gz" and code_bytes > 0
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "gputrain-job-0/setup.py" in names and "gputrain-job-0/PKG-INFO" in names
    assert "gputrain-job-0/gputrain_code/files/big.bin" not in names  # .gitignore respected
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
         "--no-deps", "--target", str(target), str(archive)],
        check=True,
    )  # fmt: skip
    code = target / "gputrain_code" / "files"
    [meta] = target.glob("gputrain_job-0*-info/METADATA")
    requires = [
        ln.split(": ", 1)[1] for ln in meta.read_text().splitlines() if "Requires-Dist" in ln
    ]
    assert requires == ["numpy>=1.26", "google-cloud-storage<4,>=2.14", "tensorboard<3,>=2.14"]
    assert (code / "train.py").read_text() == "print('hi')\n"
    assert (code / "data.csv").exists() and (code / "odd[1]" / "f.txt").exists()
    assert (code / "trainer" / "train.py").exists()  # the trainer travels with the code
    env = {**os.environ, "PYTHONPATH": str(target)}
    # gputrain_node.vertex_entry comes from branch trainer-ckpt; the packaged trainer.train must resolve
    out = subprocess.run(
        [sys.executable, "-m", "trainer.train", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "usage: python -m trainer.train" in out
    where = subprocess.run(
        [sys.executable, "-c", "import trainer, gputrain_code; print(trainer.__file__); "
         "print(gputrain_code.ROOT)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert where == [str(target / "trainer" / "__init__.py"), str(code)]


def test_sdist_is_reproducible_and_keeps_the_upload_size_limit(tmp_path: Path) -> None:
    work = _workdir(tmp_path)
    a, _ = vj.build_sdist(work, tmp_path / "a", trainer_dir=ROOT / "trainer", limit_mib=200)
    b, _ = vj.build_sdist(work, tmp_path / "b", trainer_dir=ROOT / "trainer", limit_mib=200)
    assert a.read_bytes() == b.read_bytes()
    (work / "weights.pt").write_bytes(b"\0" * 300_000)
    with pytest.raises(UserError, match=r"above the limit of 0.2 MiB; biggest files: weights.pt"):
        vj.build_sdist(work, tmp_path / "c", trainer_dir=ROOT / "trainer", limit_mib=0.2)


def test_the_package_requires_the_trainer_extra_without_torch() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    train = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert tuple(r for r in train["train"] if not r.startswith("torch")) == vj.TRAINER_REQUIREMENTS


def test_flex_start_body_uses_the_flex_start_strategy_with_a_max_wait() -> None:
    """Vertex `Scheduling.Strategy.FLEX_START` queues through DWS, bounded by maxWaitDuration;
    the body parses strictly as a real CustomJob (a wrong enum or field would raise)."""
    from google.cloud import aiplatform_v1

    body = vj.custom_job_body(_request(flex_start_wait_s=1800))
    assert body["jobSpec"]["scheduling"] == {
        "timeout": "7200s",
        "strategy": "FLEX_START",
        "maxWaitDuration": "1800s",
    }
    job = aiplatform_v1.CustomJob.from_json(json.dumps(body))
    assert job.job_spec.scheduling.strategy == aiplatform_v1.Scheduling.Strategy.FLEX_START
    assert job.job_spec.scheduling.max_wait_duration.total_seconds() == 1800


def test_restart_job_on_worker_restart_is_sent_only_when_asked_and_parses() -> None:
    """`restartJobOnWorkerRestart: true` -> Scheduling.restartJobOnWorkerRestart; false (the
    default) leaves the field out, as a proto3 bool false would travel anyway."""
    from google.cloud import aiplatform_v1

    assert "restartJobOnWorkerRestart" not in vj.scheduling(_request())
    body = vj.custom_job_body(_request(restart_job_on_worker_restart=True))
    assert body["jobSpec"]["scheduling"]["restartJobOnWorkerRestart"] is True
    job = aiplatform_v1.CustomJob.from_json(json.dumps(body))
    assert job.job_spec.scheduling.restart_job_on_worker_restart is True
