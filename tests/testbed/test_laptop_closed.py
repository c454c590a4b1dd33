"""Runs that finish with the laptop closed, on the sshd test bed: `gputrain run --stack --detach`
returns (the controller lets go of the stack's lease), GCE takes VMs away, and `gputrain
reconcile` passes — the production command, as the stack's Cloud Run job would run it — bring
the run back from its checkpoints in the bucket (the Cloud Storage emulator on the bridge), wait
out a stock-out with nothing billing, keep to one writer, leave a live controller alone, and
end a finished run: results in the bucket, VMs gone.

Scenarios share runs where one run can show several: (a) + (d) + (g) in one, (b) + (c) + (e) in
another, (f) in a third (one node, no trainer).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from infra.gcp.gcs import StorageApi
from infra.reconciler import job_name, run_uri
from infra.reconciler_image import image_reference
from scripts.targets.gce import lease as lease_module
from scripts.targets.gce import reconcile as reconcile_module
from scripts.targets.gce.manifest import MANIFEST, Manifests, RunManifest
from tests.support import JOBS, ROOT, wait_for
from tests.support.fake_cloud_run import TOKEN, FakeCloudRun
from tests.support.runner_proxy import serving
from tests.support.stack_world import BUCKET, ZONES, World
from tests.support.stack_world import TRAIN as STACK_TRAIN
from tests.support.wheelhouse import build_wheel

pytestmark = [pytest.mark.testbed, pytest.mark.filterwarnings("ignore:Unable to enable fault")]
TRAIN = ["-m", "trainer.train", "--preset", "tiny", "--steps", "60", "--checkpoint-every", "10"]
TRAIN += ["--log-every", "1", "--eval-batches", "0"]


def detach(w: World, *options: str, entry: tuple[str, ...] = tuple(TRAIN)) -> str:
    """The laptop's `run --detach`: it returns once the job trains, letting go of the lease."""
    assert w.gcs is not None
    rc = w.run(
        "run", "--stack", "e2e", "--yes", "--skip-preflight", "--detach", *options,
        "--env", f"STORAGE_EMULATOR_HOST={w.gcs.url}", "--", *entry,
    )  # fmt: skip
    assert rc == 0
    return (w.dir / "runs" / "stack-e2e" / "LAST_RUN").read_text().strip()


def manifest(rid: str) -> RunManifest:
    m = Manifests(StorageApi("gputrain-test"), BUCKET, "").load(rid)
    assert m is not None
    return m


def reconcile(w: World, capsys: pytest.CaptureFixture[str]) -> str:
    rc = w.run("reconcile", "--stack", "e2e")
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-2000:]
    return out


def head_log(w: World, rid: str) -> str:
    """The head's torchrun and watchdog logs (what a failing wait shows)."""
    d = w.node_hosts["e2e-node-0"].dir / "home" / ".gputrain" / "runs" / rid
    return "\n".join(
        f"--- {n}\n" + (d / n).read_text(errors="replace")[-1500:]
        for n in ("torchrun.log", "watchdog.log", "exitcode")
        if (d / n).is_file()
    )


def wait_end(w: World, rid: str) -> None:
    try:
        wait_for("the end", lambda: head_ended(w, rid), timeout=180)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{head_log(w, rid)}") from None


def names(w: World, prefix: str) -> list[str]:
    """What the stack's bucket holds under `prefix`."""
    assert w.gcs is not None
    client = w.gcs.client()
    if not client.bucket(BUCKET).exists():  # before `up` made it
        return []
    return [b.name for b in client.list_blobs(BUCKET, prefix=prefix)]


def head_ended(w: World, rid: str) -> bool:
    """The head's end marker says exit code 0 (its watchdog's upload at the job's end)."""
    assert w.gcs is not None
    blob = w.gcs.client().bucket(BUCKET).blob(f"runs/{rid}/e2e-node-0/.gputrain-ended.json")
    return bool(blob.exists()) and b'"exit_code": "0"' in blob.download_as_bytes()


CHILD = ROOT / "tests" / "support" / "controller_child.py"
#: the image the program names for the stack's reconcile job (infra/reconciler_image.py)
IMAGE = image_reference(ROOT, "us-central1", "gputrain-test", "e2e")


@contextmanager
def reconcile_job(w: World, state: Path) -> Iterator[FakeCloudRun]:
    """The stack's Cloud Run job and its Cloud Scheduler job, created through their REST APIs;
    each `tick()` starts an execution whose container (`gputrain reconcile --stack e2e`, the
    production CLI) runs in its own process. Its stack is the test's runner, served to it (what
    the Pulumi CLI and state backend are to the real job): a pass re-creates VMs through it."""
    with serving(w.runner) as address:
        state.write_text(
            json.dumps(
                {
                    "outputs": {},
                    "config": {},
                    "runner": address,
                    "clients": {"retry_pause_s": 0, "preemption_confirm_s": 2},
                    "root": str(w.dir),
                    "runs": str(w.dir / "runs"),
                    "compute": w.compute.url,
                    "python": w.bed.python,
                    "autodown_s": None,
                    "argv": [],
                }
            )
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with FakeCloudRun({IMAGE: [sys.executable, str(CHILD), str(state)]}, env) as run:
            base, job = "projects/gputrain-test/locations/us-central1", job_name("e2e")

            def post(path: str, body: dict[str, object]) -> None:
                request = urllib.request.Request(
                    run.url + path,
                    data=json.dumps(body).encode(),
                    method="POST",
                    headers={
                        "Authorization": f"Bearer {TOKEN}",
                        "Content-Type": "application/json",
                    },
                )
                urllib.request.urlopen(request, timeout=10).close()

            container = {"image": IMAGE, "args": ["reconcile", "--stack", "e2e"]}
            post(
                f"/v2/{base}/jobs?jobId={job}",
                {"template": {"template": {"containers": [container]}}},
            )
            target = {"uri": run_uri("gputrain-test", "us-central1", job), "httpMethod": "POST"}
            post(f"/v1/{base}/jobs", {"name": f"{base}/jobs/{job}", "httpTarget": target})
            yield run
            assert all(a == f"Bearer {TOKEN}" for m, p, a in run.requests if p.endswith(":run"))


def test_a_preempted_worker_comes_back_one_reconciler_acts_and_the_end_is_kept(
    world: Callable[..., World],
    uninterrupted: dict[str, object],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(a) a worker preempted, recovered by the stack's Cloud Run job (a Scheduler tick, the
    production `gputrain reconcile` in its own process), (d) two executions started together
    (the Scheduler fired twice): one acts, (g) the job finishes with no controller: results in
    the bucket, VMs gone. The losses after recovery are an uninterrupted run's."""
    w = world(bucket=True)
    # its requirements.txt: a wheel in the project, installed on every node; the re-created
    # node gets it from the pass before the relaunch
    (w.dir / "wheels").mkdir()
    shutil.copy(build_wheel("gputrain-probe", w.marker.parent / "wheel"), w.dir / "wheels")
    (w.dir / "requirements.txt").write_text("--no-index\n--find-links wheels\ngputrain-probe\n")
    assert w.gcs is not None  # and a dataset, fetched onto the re-created node too
    w.gcs.write("datasets/tiny/shard-00.bin", b"tokens")
    data = f"shards=gs://{w.gcs.bucket_name}/datasets/tiny"
    # as a trainer that resumes only when told: the first attempt starts over, the relaunch
    # gets --resume-args (the reference trainer takes the last --resume). The stack world's
    # TRAIN, whose uninterrupted run the session fixture makes once for the recovery tests.
    entry = ("-m", "trainer.train", *STACK_TRAIN, "--resume", "never")
    rid = detach(w, "--resume-args", "--resume auto", "--data", data, entry=entry)
    m = manifest(rid)
    assert (m.state, m.attempt, m.recoveries_left, m.entry) == ("running", 1, 3, entry)
    assert m.resume_args == ("--resume", "auto")
    assert m.code == f"gs://{BUCKET}/runs/{rid}/code.tar.gz" and "STORAGE_EMULATOR_HOST" in m.env
    assert m.not_relaunchable is None and m.environment is not None and m.datasets
    capsys.readouterr()
    assert "running" in reconcile(w, capsys)  # every VM up, nothing taken: exits at once
    ups = w.runner.call_names().count("up")

    wait_for("a checkpoint", lambda: any(s >= 10 for s in w.checkpoints_in_bucket()))
    old_key = w.node_hosts["e2e-node-1"].host_key
    w.preempt("e2e-node-1")
    with reconcile_job(w, w.marker.parent / "state.json") as run:
        start = time.time()
        executions = [*run.tick(), *run.tick()]  # two passes at once
        done = [run.wait(e, timeout=240) for e in executions]
        took = time.time() - start
        out = "\n".join(run.output[e] for e in executions)
        assert [d["succeededCount"] for d in done] == [1, 1], out[-3000:]
        installed = out.find("[e2e-node-1] [requirements] Successfully installed gputrain-probe")
        assert -1 < installed < out.find("trains again (attempt 2)"), out[-3000:]
        assert "[e2e-node-0] [setup] environment" in out and "skipped (cached)" in out
        assert -1 < out.find("data on 2 node(s)") < out.find("trains again"), out[-3000:]
        node_1 = w.node_hosts["e2e-node-1"].dir  # the new VM's
        assert b"tokens" in [p.read_bytes() for p in node_1.rglob("shard-00.bin")]
        assert out.count("holds the lease") + out.count("was taken over") == 1, out[-3000:]
        assert w.runner.call_names().count("up") == ups + 1  # one re-creation, not two
        assert w.node_hosts["e2e-node-1"].host_key != old_key  # a new VM, its new key pinned
        m = manifest(rid)
        assert (m.state, m.attempt, m.recoveries_done) == ("running", 2, 1), m.history
        print(f"laptop closed: Scheduler tick -> first resumed step {took:.1f} s (own process)")

        wait_end(w, rid)
        [execution] = run.tick()  # no controller lives
        done = [run.wait(execution)]
        out = run.output[execution]
    assert done[0]["succeededCount"] == 1 and "ended (exit code 0)" in out, out[-3000:]
    assert not w.compute.instances  # nothing billing
    assert w.gcs is not None
    assert f"runs/{rid}/e2e-node-0/summary.json" in names(w, f"runs/{rid}/")
    assert manifest(rid).state == "finished"
    # resumed from its checkpoint through --resume-args, and ended as if never interrupted
    blob = w.gcs.client().bucket(BUCKET).blob(f"runs/{rid}/e2e-node-0/summary.json")
    summary = json.loads(blob.download_as_bytes())
    ref = uninterrupted  # TRAIN never interrupted (tests/testbed/conftest.py)
    assert int(summary["resumed_from"]) >= 10, summary
    assert summary["final_loss"] == ref["final_loss"]
    assert summary["param_checksums"] == ref["param_checksums"]
    assert "nothing to do" in reconcile(w, capsys)  # idempotent
    assert w.run("status", "--stack", "e2e") == 0  # from any machine that reads the bucket
    out = capsys.readouterr().out
    assert f"status: run {rid}: finished, attempt 2, recoveries 1/3" in out, out
    assert "last reconcile pass" in out and "recovered" in out


def test_head_and_worker_lost_a_stockout_and_a_killed_reconciler(
    world: Callable[..., World],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(b) head and worker preempted, (c) every zone stocked out for two passes (nothing bills
    between them), then capacity returns, (e) that pass killed after re-creating the VMs: the
    next pass, once the dead one's lease expires, finishes the recovery. The job is the
    trainer's torch-free stand-in checkpointing into its out dir as a third-party trainer does:
    both re-created VMs are bare, so the relaunch resumes only from what the pass brought back
    from the bucket (the head's out dir, and the worker's filled from it). The reconciler is the
    subject here; (a) holds the trainer's sums to an uninterrupted run's."""
    w = world(bucket=True)
    shutil.copy(JOBS / "steps.py", w.dir)
    rid = detach(w, "--env", "STEPS_OUT_CHECKPOINT=1", entry=("steps.py", "60", "0.05", "10"))
    mirrored, gcs = f"runs/{rid}/out/e2e-node-0/steps-ckpt.txt", w.gcs
    assert gcs is not None
    wait_for("a mirrored checkpoint", lambda: mirrored in gcs.live_names(BUCKET, "runs/"))
    for zone in ZONES:
        w.runner.fail_stockout(zone, times=2)
    w.preempt("e2e-node-1")
    w.preempt("e2e-node-0")
    capsys.readouterr()
    for _ in range(2):
        out = reconcile(w, capsys)
        assert "no capacity in any zone" in out, out[-3000:]
        assert not w.compute.instances  # between passes nothing bills
        assert manifest(rid).state == "waiting for capacity"

    class Killed(BaseException):
        """The pass's process dies: no cleanup, its lease left to expire."""

    def die(self: object, outputs: object, job: object) -> None:
        raise Killed

    with pytest.MonkeyPatch.context() as dying:
        dying.setattr(reconcile_module.Pass, "relaunch", die)
        dying.setattr(reconcile_module, "RECONCILER_TTL_S", 8.0)
        dying.setattr(lease_module.Lease, "release", lambda self: self._stop.set())
        with pytest.raises(Killed):
            w.run("reconcile", "--stack", "e2e")
    assert len(w.compute.instances) == 2 and manifest(rid).state == "recovering"
    capsys.readouterr()
    assert "holds the lease" in reconcile(w, capsys)  # the dead pass's lease still runs
    time.sleep(8.5)  # the dead pass's lease expires
    out = reconcile(w, capsys)
    assert "trains again (attempt 2)" in out, out[-3000:]
    starts = re.findall(r"\[(e2e-node-\d)\].*steps\.py: start step (\d+)/60", out)
    assert {node for node, _ in starts} == {"e2e-node-0", "e2e-node-1"}, out[-3000:]
    assert all(int(step) >= 10 for _, step in starts), starts  # not from 0: restored
    m = manifest(rid)
    assert (m.state, m.recoveries_done) == ("running", 1)
    assert [h["what"] for h in m.history].count("waiting for capacity") == 2
    wait_end(w, rid)
    assert "ended (exit code 0)" in reconcile(w, capsys)
    assert not w.compute.instances


def test_a_live_controller_is_left_alone(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """(f) the laptop's controller follows its run and holds the lease: a pass changes nothing."""
    w = world(nodes=1, bucket=True)
    assert w.gcs is not None
    finish = w.marker.parent / "finish"
    (w.dir / "wait.py").write_text(
        "import pathlib, time\nprint('waiting', flush=True)\n"
        f"while not pathlib.Path({str(finish)!r}).exists(): time.sleep(0.1)\n"
    )
    rc: list[int] = []
    t = threading.Thread(
        target=lambda: rc.append(
            w.run(
                "run",
                "--stack",
                "e2e",
                "--yes",
                "--skip-preflight",
                "--env",
                f"STORAGE_EMULATOR_HOST={w.gcs.url if w.gcs else ''}",
                "--",
                "wait.py",
            )
        )
    )
    t.start()
    try:
        wait_for(  # the code bundle goes first: a pass before the manifest finds no run
            "the run's manifest",
            lambda: any(n.endswith(f"/{MANIFEST}") for n in names(w, "runs/")),
            120,
        )
        calls = len(w.runner.calls)
        out = reconcile(w, capsys)
        assert "the controller" in out and "holds the lease" in out, out[-2000:]
        touched = [c[0] for c in w.runner.calls[calls:] if c[0] in ("up", "refresh", "outputs")]
        assert touched == []  # not even the stack's outputs read
    finally:
        finish.touch()
        t.join(timeout=120)
    assert rc == [0]
