"""`image` on `backend: vertex`: the CustomJob's pools carry `containerSpec.imageUri` instead of
`pythonPackageSpec`, our entry and the user's code reach every replica as the staged package read
from the bucket's /gcs/ mount; the fake Vertex runner starts each replica in that image (podman as
docker's CLI, the package from the storage emulator)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.job.launch import TRAINER_DIR
from scripts.targets.vertex.job import JobRequest, build_sdist, custom_job_body
from tests.support.containers import Podman, require_tools
from tests.support.fake_vertex import FakeVertex, RunContext
from tests.support.gcs_emulator import GcsEmulator
from tests.support.vertex_replicas import LocalReplicas

IMAGE = "us-docker.pkg.dev/p/r/train@sha256:" + "d" * 64
#: the image's python3: `-m pip install --target T PKG` unpacks the sdist (the real one builds it);
#: the entry reports how it was started and what it sees
FAKE_PYTHON = """#!/bin/sh
if [ "$2" = pip ]; then
  for a; do T=$P; P=$a; done; mkdir -p /tmp/gputrain-job && cd /tmp/gputrain-job && tar -xzf "$P"
  echo "pip installed $(basename "$P")"; exit 0
fi
echo "entry: $* task=$(echo "$CLUSTER_SPEC" | sed 's/.*"type": "\\([a-z0-9]*\\)".*/\\1/') mode=$MODE"
ls /tmp/gputrain-job/gputrain-job-0 | tr '\\n' ' '; echo
"""


def _request(package: str, image: str | None, nodes: int = 2) -> JobRequest:
    return JobRequest(
        display_name="gputrain-v-r1",
        region="us-central1",
        machine_type="g2-standard-8",
        gpu_type=None,
        gpu_count=0,
        nodes=nodes,
        spot=True,
        max_run_duration_s=3600,
        output_dir="gs://b/runs/r1/",
        package_uris=(package,),
        args=("-m", "mypkg.train", "--lr", "3e-4"),
        env={"MODE": "fast", "GPUTRAIN_RUN_ID": "r1"},
        image_uri=image,
    )


def test_the_job_body_names_the_image_and_the_staged_package() -> None:
    body = custom_job_body(_request("gs://b/staging/r1/gputrain-job-0.tar.gz", IMAGE))
    pools = body["jobSpec"]["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == [1, 1]
    for pool in pools:
        assert "pythonPackageSpec" not in pool
        spec = pool["containerSpec"]
        assert spec["imageUri"] == IMAGE
        assert (
            spec["command"][:2] == ["sh", "-c"]
            and "gputrain_node.vertex_entry" in spec["command"][2]
        )
        assert spec["args"] == ["-m", "mypkg.train", "--lr", "3e-4"]
        env = {e["name"]: e["value"] for e in spec["env"]}
        assert env["GPUTRAIN_PACKAGE"] == "/gcs/b/staging/r1/gputrain-job-0.tar.gz"
        assert env["MODE"] == "fast"
    plain = custom_job_body(_request("gs://b/staging/r1/gputrain-job-0.tar.gz", None))
    assert "containerSpec" not in plain["jobSpec"]["workerPoolSpecs"][0]


@pytest.fixture
def podman(tmp_path: Path) -> Iterator[Podman]:
    require_tools()
    p = Podman(tmp_path / "podman")
    yield p
    p.cleanup()


def test_fake_vertex_runs_the_replicas_in_the_image(
    podman: Podman, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    podman.import_image("localhost/gputrain-vx:1", {"/usr/bin/python3": FAKE_PYTHON})
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('mine')\n")
    with GcsEmulator() as gcs:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.url)
        archive, _ = build_sdist(work, tmp_path, trainer_dir=TRAINER_DIR, limit_mib=50)
        gcs.write("staging/r1/gputrain-job-0.tar.gz", archive.read_bytes())
        uri = f"gs://{gcs.bucket_name}/staging/r1/gputrain-job-0.tar.gz"
        body = custom_job_body(_request(uri, "localhost/gputrain-vx:1"))
        replicas = LocalReplicas(tmp_path / "replicas", docker=(str(podman.shim_dir / "docker"),))
        (tmp_path / "replicas").mkdir()
        with FakeVertex() as fake:  # its Cloud Logging receives the replicas' lines
            result = replicas(RunContext(fake, "7", body, threading.Event()))
            logged = [e["textPayload"] for e in fake.logs]
    assert result is None, replicas.outputs  # SUCCEEDED
    for task, pool in (("workerpool0-0", "workerpool0"), ("workerpool1-0", "workerpool1")):
        out = replicas.outputs[task]
        assert "pip installed gputrain-job-0.tar.gz" in out
        assert (
            f"entry: -m gputrain_node.vertex_entry -m mypkg.train --lr 3e-4 task={pool} mode=fast"
            in out
        )
        assert any("PKG-INFO" in line for line in out)  # the package's files, unpacked in there
    assert podman("ps", "-aq").stdout.strip() == ""
    assert sum("entry: -m gputrain_node.vertex_entry" in line for line in logged) == 2
