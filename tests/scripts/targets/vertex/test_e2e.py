"""`gputrain ... --stack vtest` with `backend: vertex`, end to end and offline: the fake stack runner
is the Pulumi program (it makes the bucket in the storage emulator), tests/support/fake_vertex.py is
Vertex AI and Cloud Logging (the real aiplatform and logging clients talk to it), and its runner
"runs" each job like Vertex: the package pip-installed from the bucket, one real
`gputrain_node.vertex_entry` process per replica with its own CLUSTER_SPEC, gloo across them, outputs
and checkpoints written to the emulated bucket. Everything else is production code.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.containers import Podman, Registry, require_tools
from tests.support.fake_artifact_registry import FakeArtifactRegistry
from tests.support.vertex_world import (
    BUCKET,
    LONG_STEPS,
    PROJECT,
    TRAIN,
    World,
    assert_torn_down,
)


def test_run_trains_on_two_replicas_follows_logs_brings_results_home_and_destroys(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    rc = w.run("run", "--stack", "vtest", "--yes", "--", *TRAIN)
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-2000:]
    assert "doctor: stack vtest" in out and " fail " not in out  # the checks ran first, all passed
    run_id = w.run_dir.name

    # The CustomJob as it arrived, field by field (enums as the client sends them: numbers).
    [body] = w.created()
    labels = {"gputrain-stack": "vtest", "gputrain-project": "gputrain", "team": "ml"}
    assert body["displayName"] == f"gputrain-vtest-{run_id}"
    assert body["labels"] == {**labels, "gputrain-run": run_id}
    spec = body["jobSpec"]
    chief, worker = spec["workerPoolSpecs"]
    assert (chief["replicaCount"], worker["replicaCount"]) == ("1", "1")
    for pool in (chief, worker):
        assert pool["machineSpec"] == {
            "machineType": "g2-standard-8",
            "acceleratorType": 11,  # NVIDIA_L4
            "acceleratorCount": 1,
        }
        assert pool["pythonPackageSpec"] == {
            "executorImageUri": "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest",
            "packageUris": [f"gs://{BUCKET}/staging/{run_id}/gputrain-job-0.tar.gz"],
            "pythonModule": "gputrain_node.vertex_entry",
            "args": list(TRAIN),
            "env": [{"name": "GPUTRAIN_RUN_ID", "value": run_id}],
        }
    assert spec["scheduling"] == {"timeout": "3600s", "strategy": 4}  # SPOT
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": f"gs://{BUCKET}/runs/{run_id}/"}
    assert spec["serviceAccount"] == f"gputrain-vtest@{PROJECT}.iam.gserviceaccount.com"

    # Followed: state changes with times, both replicas' lines with their prefixes.
    assert "Vertex job" in out and ": RUNNING (" in out and ": SUCCEEDED (" in out
    assert "[chief] vertex: workerpool0[0] is node 0 of 2" in out
    assert "[worker-1] vertex: workerpool1[0] is node 1 of 2" in out
    log = (w.run_dir / "vertex.log").read_text()
    assert "[chief] " in log and "[worker-1] " in log

    # Results home: the model dir and the newest complete checkpoint; the loss fell.
    summary = json.loads((w.run_dir / "model" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["params_in_sync"] and summary["steps"] == 60
    assert summary["final_loss"] < summary["initial_loss"] - 1.5
    assert (w.run_dir / "model" / "metrics.jsonl").is_file()
    assert sorted(p.name for p in (w.run_dir / "checkpoints").iterdir()) == [
        "ckpt-00000060.pt",
        "ckpt-00000060.pt.manifest.json",
    ]
    record = json.loads((w.run_dir / "job.json").read_text())
    assert record["ok"] is True and record["run_id"] == run_id
    assert "run summary" in out and "final loss" in out and "estimated cost" in out
    assert_torn_down(w)
    # the cost ledger: the Vertex run's record (its copy in the bucket came home with `down`)
    assert w.run("cost", "--stack", "vtest", "--json") == 0
    (ledger,) = json.loads(capsys.readouterr().out)["runs"]
    assert ledger["run_id"] == run_id and ledger["backend"] == "vertex" and ledger["ok"]
    assert ledger["hourly_usd"] > 0 and ledger["estimated_usd"] > 0 and ledger["gpu_hours"] > 0


def test_a_module_of_the_working_directory_runs_and_a_failure_names_the_job_error(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """One job: rank 1 runs the module (it reads the working directory's data.txt), then fails.
    The module's success, followed and brought home, is test_up_status_train_logs_down's."""
    w = world()
    rc = w.run("run", "--stack", "vtest", "--yes", "--skip-preflight", "--", "-m", "jobs.answer",
               "crash")  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 1, out[-3000:] + err[-2000:]
    first = err.strip().splitlines()[0]
    assert (
        first.startswith("gputrain: error: Vertex job ")
        and " FAILED: INTERNAL The replica " in first
    )
    assert "workerpool1-0 exited with a non-zero status of 1" in first  # torchrun's
    assert "last log lines:" in err and "[worker-1]   exitcode  : 3" in err  # torchrun's summary
    log = (w.run_dir / "vertex.log").read_text()
    assert "[worker-1] answer 42 from rank 1" in log  # the module ran, in the working directory
    assert "[worker-1] boom: rank 1 failed on purpose" in log
    assert json.loads((w.run_dir / "job.json").read_text())["ok"] is False
    assert_torn_down(w)


def test_a_retried_job_gets_each_replicas_out_dir_back_and_resumes(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """Vertex runs a failed job again on new VMs: each replica's out dir (a trainer of yours)
    comes back from the bucket, and the second attempt gets --resume-args."""
    w = world()
    w.replicas.job_retries = 1
    rc = w.run("run", "--stack", "vtest", "--yes", "--skip-preflight", "--resume-args",
               "--resume", "--", "-m", "jobs.resume")  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-2000:]
    run_id = w.run_dir.name
    [body] = w.created()
    package = body["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]
    env = {e["name"]: e["value"] for e in package["env"]}
    uri = f"gs://{BUCKET}/runs/{run_id}/out/"
    assert env["GPUTRAIN_OUT_URI"] == uri and env["GPUTRAIN_RESUME_ARGS"] == '["--resume"]'
    assert "[chief] rank 0 lost its VM" in out, out[-3000:] + err[-2000:]
    assert f"[chief] vertex: attempt 2: restored 2 file(s) from {uri}chief/" in out
    assert "[chief] rank 0 attempt 2 resumed from step 3 of rank 0" in out
    assert "[worker-1] rank 1 attempt 2 resumed from step 3 of rank 1" in out
    # every replica's out dir came home from the bucket before it went
    for replica, rank in (("chief", 0), ("worker-1", 1)):
        state = w.run_dir / "out" / replica / "state.txt"
        assert state.read_text() == f"step 3 of rank {rank}"
    assert_torn_down(w)


def test_a_signal_cancels_the_job_waits_for_it_and_tears_down(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM once both replicas train; Ctrl-C's SIGINT takes the same handler (`signal_guard`:
    both raise `Interrupted`, tests/scripts/test_parallel.py), so this path is run once."""
    w = world()
    sig = signal.SIGTERM

    def fire() -> None:  # once both replicas train
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            lines = w.replicas.outputs.get("workerpool1-0", []) + w.replicas.outputs.get(
                "workerpool0-0", []
            )
            if sum("step" in ln and "loss" in ln for ln in lines) >= 2:
                os.kill(os.getpid(), sig)
                return
            time.sleep(0.1)

    t = threading.Thread(target=fire, daemon=True)
    t.start()
    started = time.monotonic()
    rc = w.run("run", "--stack", "vtest", "--yes", "--skip-preflight", "--", *LONG_STEPS)
    t.join(timeout=5)
    out, err = capsys.readouterr()
    assert rc == 130, out[-3000:] + err[-2000:]
    assert signal.Signals(sig).name in err
    assert time.monotonic() - started < 150
    assert "vertex: cancelling job" in out and ": CANCELLED (" in out
    assert w.job_states() == ["JOB_STATE_CANCELLED"]
    assert len(w.vertex.requests_to("POST", r":cancel$")) == 1
    # the chief's outputs so far came home before the bucket went
    assert (w.run_dir / "model" / "metrics.jsonl").is_file()
    assert_torn_down(w)


def test_up_status_train_logs_down(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """`up` leaves the small stack; `verify`, `train`, `status` and `logs` use it; `down` ends it."""
    w = world()
    assert w.run("up", "--stack", "vtest", "--yes") == 0
    out = capsys.readouterr().out
    assert "preflight (Vertex AI)" in out and "unknown: the Compute API does not report" in out
    assert "destroy" not in w.runner.call_names()
    assert w.run("verify", "--stack", "vtest") == 0
    assert f"bucket gs://{BUCKET}" in capsys.readouterr().out
    assert w.run("train", "--stack", "vtest", "--", "-m", "jobs.answer") == 0  # a module of yours
    out = capsys.readouterr().out  # followed: each replica's line with its prefix
    assert "[chief] answer 42 from rank 0" in out and "[worker-1] answer 42 from rank 1" in out
    assert w.run("status", "--stack", "vtest") == 0
    out = capsys.readouterr().out
    assert "SUCCEEDED" in out and w.run_dir.name in out
    assert w.run("logs", "--stack", "vtest") == 0  # the run's lines again, from Cloud Logging
    assert capsys.readouterr().out.count("answer 42 from rank") == 2
    assert w.run("ssh", "--stack", "vtest", "0") == 2
    assert "no SSH" in capsys.readouterr().err
    assert w.run("keygen", "--stack", "vtest") == 2
    assert w.run("down", "--stack", "vtest") == 0
    assert "sweep found nothing left" in capsys.readouterr().out
    assert (w.run_dir / "model" / "answer.txt").read_text() == "42"  # home; the bucket went
    assert w.run("sweep", "--stack", "vtest") == 0
    assert_torn_down(w)


def test_preflight_refuses_a_region_without_the_machine_and_creates_nothing(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    stack = w.settings.root / "Pulumi.vtest.yaml"
    stack.write_text(stack.read_text().replace("us-central1-a", "southamerica-east1-a"))
    rc = w.run("run", "--stack", "vtest", "--yes", "--", "-m", "jobs.answer")
    out, err = capsys.readouterr()
    assert rc == 1 and "preflight failed" in err
    assert "not among the regions known" in out or "not known in southamerica-east1" in out
    assert "up" not in w.runner.call_names() and w.created() == []


def test_no_terminal_and_no_yes_or_a_failed_doctor_row_creates_nothing(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world()
    rc = w.run("run", "--stack", "vtest", "--", "-m", "jobs.answer")  # pytest's stdin: no tty
    err = capsys.readouterr().err
    assert rc == 2 and "stdin is not a terminal" in err and "pass --yes" in err
    monkeypatch.delenv(
        "GOOGLE_APPLICATION_CREDENTIALS"
    )  # no credentials: the doctor's ADC row fails
    rc = w.run("run", "--stack", "vtest", "--yes", "--", "-m", "jobs.answer")
    out, err = capsys.readouterr()
    assert rc == 2 and "doctor: 1 problem(s)" in err and "credentials (ADC)" in err, out + err
    assert "up" not in w.runner.call_names() and w.created() == []


def test_datasets_on_vertex_copy_to_each_replica_and_mount_under_gcs(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """`copy`: each replica's vertex_entry downloads the prefix before torchrun and points the
    variable there; `mount`: the variable is Vertex's own /gcs/ path (not mounted here)."""
    w = world()
    w.gcs.write("ds/tiny/a.txt", b"from the bucket")
    Path("jobs/readdata.py").write_text(
        "import os\nfrom pathlib import Path\n"
        "train = Path(os.environ['GPUTRAIN_DATA_TRAIN'])\n"
        "print('data', os.environ['RANK'], (train / 'a.txt').read_text(), "
        "os.environ['GPUTRAIN_DATA_WEB'], flush=True)\n"
    )
    bucket = w.gcs.bucket_name
    rc = w.run(
        "run", "--stack", "vtest", "--yes",
        "--data", f"train=gs://{bucket}/ds/tiny", "--data", f"web=gs://{bucket}/ds:mount",
        "--", "-m", "jobs.readdata",
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-2000:]
    [body] = w.created()
    env = {
        e["name"]: e["value"]
        for e in body["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]["env"]
    }
    assert env["GPUTRAIN_DATA_COPY"] == f"train=gs://{bucket}/ds/tiny/:copy"
    assert env["GPUTRAIN_DATA_WEB"] == f"/gcs/{bucket}/ds"
    for rank in ("0", "1"):
        assert f"data {rank} from the bucket /gcs/{bucket}/ds" in out
    assert_torn_down(w)


#: the built image's python3: what Vertex's container command runs (pip, then our entry)
IMAGE_PYTHON = """#!/bin/sh
if [ "$2" = pip ]; then echo "pip in the image"; exit 0; fi
echo "entry in the built image: $(cat /built.txt) task=$(echo "$CLUSTER_SPEC" | sed 's/.*"type": "\\([a-z0-9]*\\)".*/\\1/')"
"""


def test_run_with_build_submits_the_built_image_and_the_replicas_run_in_it(
    world: Callable[..., World],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`run --build` on Vertex: the Dockerfile built and pushed (podman, a real registry) before
    the stack's `up`, the CustomJob's containerSpec.imageUri is the pushed digest, the fake
    Vertex runs each replica in that image; the run's teardown keeps the repository (the next
    run builds nothing), `down` removes it."""
    require_tools()
    podman = Podman(tmp_path / "podman")
    registry = Registry(tmp_path / "registry")
    try:
        podman.import_image("localhost/vx:1", {"/usr/bin/python3": IMAGE_PYTHON})
        podman.trust(registry.host)
        podman("push", "-q", "localhost/vx:1", f"docker://{registry.host}/vx:1")
        monkeypatch.setenv("PATH", f"{podman.shim_dir}:{os.environ['PATH']}")
        monkeypatch.setenv("GPUTRAIN_REGISTRY_HOST", registry.host)
        monkeypatch.setenv("GPUTRAIN_INSECURE_REGISTRIES", registry.host)
        with FakeArtifactRegistry(PROJECT) as artifacts:
            w = world(docker=(str(podman.shim_dir / "docker"),), artifacts=artifacts)
            (Path.cwd() / "img").mkdir()
            (Path.cwd() / "img" / "Dockerfile").write_text(
                f"FROM {registry.host}/vx:1\nCOPY built.txt /built.txt\n"
            )
            (Path.cwd() / "img" / "built.txt").write_text("made by gputrain\n")
            argv = ["run", "--stack", "vtest", "--yes", "--skip-preflight", "--keep-images"]
            argv += ["--build"]
            rc = w.run(*argv, "img/Dockerfile", "--", "-m", "jobs.answer")
            out, err = capsys.readouterr()
            assert rc == 0, out[-3000:] + err[-2000:]
            [body] = w.created()
            image = f"{registry.host}/{PROJECT}/gputrain-vtest/img@sha256:"
            for pool in body["jobSpec"]["workerPoolSpecs"]:
                assert pool["containerSpec"]["imageUri"].startswith(image)
            for task, pool in (("workerpool0-0", "workerpool0"), ("workerpool1-0", "workerpool1")):
                assert (
                    f"entry in the built image: made by gputrain task={pool}"
                    in (w.replicas.outputs[task])
                )
            names = w.runner.call_names()
            # the key set, the repository alone, then the stack, then the teardown
            assert names[:3] == ["set_config", "up-targets", "up"] and "destroy" in names
            # --keep-images: the run's teardown keeps the repository (the build cache); `down` not
            assert list(artifacts.repositories[(PROJECT, "us-central1")]) == ["gputrain-vtest"]
            assert "kept: the image repository gputrain-vtest (the build cache" in out
            assert "LEFT BEHIND" not in out
            argv.remove("--keep-images")  # again: no build, and this teardown removes it all
            rc = w.run(*argv, "img/Dockerfile", "--", "-m", "jobs.answer")
            out = capsys.readouterr().out
            assert rc == 0 and "in the registry already" in out and "building with" not in out
            assert artifacts.repositories[(PROJECT, "us-central1")] == {}
            assert "kept: the image repository" not in out and "LEFT BEHIND" not in out
    finally:
        registry.stop()
        podman.cleanup()
