"""A Vertex replica's out dir for a trainer other than ours (gputrain_node/vertex_mirror.py, started by
gputrain_node.vertex_entry) against the real Cloud Storage emulator: its files reach the bucket while it
runs and at a SIGTERM, a restart on a new disk gets them back with its attempt number and the
resume args, and the reference trainer gets no mirror."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputrain_node.vertex_entry import TRAINER, replica_outputs
from gputrain_node.vertex_mirror import (
    ATTEMPT_FILE,
    InputError,
    ReplicaOutputs,
    replica_name,
    resume_args,
)
from tests.support.gcs_emulator import GcsEmulator
from tests.support.trainer_helpers import child_env

JOB = """\
import os, sys, time
from pathlib import Path
out = Path(os.environ["GPUTRAIN_OUT"])
print(f"attempt {os.environ['GPUTRAIN_ATTEMPT']} args {sys.argv[1:]}", flush=True)
if "--resume" in sys.argv:
    state = (out / "ckpt" / "state.txt").read_text()
    (out / "done.txt").write_text(f"resumed from {state}")
    sys.exit(0)
(out / "ckpt").mkdir(parents=True, exist_ok=True)
(out / "ckpt" / "state.txt").write_text("step 3")
if "--hang" in sys.argv:
    print("ready", flush=True)
    time.sleep(600)
sys.exit(3)  # the VM is lost after step 3
"""


def test_replicas_are_named_as_their_log_lines() -> None:
    assert [replica_name(r) for r in (0, 1, 7)] == ["chief", "worker-1", "worker-7"]


def test_each_start_of_a_replica_is_counted_and_its_files_come_back(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    uri = f"gs://{gcs.bucket_name}/runs/r1/out/"
    said: list[str] = []
    first = ReplicaOutputs(tmp_path / "vm1", uri, "worker-1", client=gcs.client(), say=said.append)
    assert first.restore() == 1
    assert said == [f"attempt 1: the out dir is mirrored to {uri}worker-1/"]
    assert gcs.names("runs/r1/out/") == [f"runs/r1/out/worker-1/{ATTEMPT_FILE}"]  # sent at once
    (tmp_path / "vm1" / "model.bin").write_bytes(b"weights")
    first.mirror.run_once(final=True, settle_s=0.01)

    said.clear()
    again = ReplicaOutputs(tmp_path / "vm2", uri, "worker-1", client=gcs.client(), say=said.append)
    assert again.restore() == 2  # a new disk: everything from the bucket, the count too
    assert (tmp_path / "vm2" / "model.bin").read_bytes() == b"weights"
    assert said == [f"attempt 2: restored 2 file(s) from {uri}worker-1/"]
    assert again.restore() == 3  # the same disk once more: nothing to fetch, still counted
    chief = ReplicaOutputs(tmp_path / "vm3", uri, "chief", client=gcs.client(), say=lambda s: None)
    assert chief.restore() == 1  # another replica: its own prefix


def test_resume_args_and_interval_are_checked_in_one_line(tmp_path: Path) -> None:
    assert resume_args({}) == []
    assert resume_args({"GPUTRAIN_RESUME_ARGS": '["--init_from=resume", "a b"]'}) == [
        "--init_from=resume",
        "a b",
    ]
    with pytest.raises(InputError, match="GPUTRAIN_RESUME_ARGS '--resume': expected a JSON list"):
        resume_args({"GPUTRAIN_RESUME_ARGS": "--resume"})
    env = {"GPUTRAIN_OUT_URI": "gs://my-bucket/runs/r/out/", "GPUTRAIN_MIRROR_INTERVAL_S": "soon"}
    with pytest.raises(InputError, match="GPUTRAIN_MIRROR_INTERVAL_S 'soon': expected seconds"):
        replica_outputs(env, tmp_path, "chief", ("job.py",))
    with pytest.raises(InputError, match="GPUTRAIN_OUT_URI"):
        replica_outputs({"GPUTRAIN_OUT_URI": "/not/a/bucket"}, tmp_path, "chief", ("job.py",))
    # the reference trainer uploads its own checkpoints; no URI, no mirror
    assert (
        replica_outputs({"GPUTRAIN_OUT_URI": "gs://my-bucket/o/"}, tmp_path, "chief", TRAINER)
        is None
    )
    assert replica_outputs({}, tmp_path, "chief", ("job.py",)) is None


def _replica(tmp_path: Path, vm: str, gcs: GcsEmulator, *args: str) -> subprocess.Popen[str]:
    """One replica on a disk of its own (`vm`), the job's script in its working directory."""
    disk = tmp_path / vm
    disk.mkdir()
    (disk / "job.py").write_text(JOB)
    env = child_env(
        extra={
            "GPUTRAIN_OUT_URI": f"gs://{gcs.bucket_name}/runs/v1/out/",
            "GPUTRAIN_RESUME_ARGS": json.dumps(["--resume", "--from={out}"]),
            "GPUTRAIN_MIRROR_INTERVAL_S": "60",  # only the last pass or a flush sends anything
            "AIP_MODEL_DIR": f"gs://{gcs.bucket_name}/runs/v1/model/",
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "gputrain_node.vertex_entry", "job.py", *args],
        cwd=disk, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def test_a_restarted_replica_resumes_from_what_its_lost_disk_sent(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    first = _replica(tmp_path, "vm1", gcs)
    log = first.communicate(timeout=120)[0]
    assert first.returncode != 0, log
    assert "attempt 1 args []" in log
    assert "mirror: flushed" in log  # the last pass, though the job failed
    assert gcs.read("runs/v1/out/chief/ckpt/state.txt") == b"step 3"

    again = _replica(tmp_path, "vm2", gcs)  # Vertex starts it again on another VM
    log = again.communicate(timeout=120)[0]
    assert again.returncode == 0, log
    assert "vertex: attempt 2: restored 2 file(s) from gs://" in log
    assert f"attempt 2 args ['--resume', '--from={tmp_path / 'vm2' / 'out'}']" in log
    assert gcs.read("runs/v1/out/chief/done.txt") == b"resumed from step 3"
    # the chief's copy for AIP_MODEL_DIR: the out dir's files, not the start count
    assert gcs.names("runs/v1/model/") == ["runs/v1/model/done.txt"]


def test_a_sigterm_sends_what_the_job_wrote_before_the_replica_stops(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    proc = _replica(tmp_path, "vm1", gcs, "--hang")
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "ready" not in lines:
        lines.append(proc.stdout.readline().strip())
    assert "ready" in lines, lines
    proc.send_signal(signal.SIGTERM)  # Vertex stops the replica (a preemption, a cancel)
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0
    assert gcs.read("runs/v1/out/chief/ckpt/state.txt") == b"step 3", log
