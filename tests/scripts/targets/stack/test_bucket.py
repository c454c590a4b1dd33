"""`down` and the stack's own bucket, against a real Cloud Storage emulator: the runs' results that
are only in the bucket come home before it is emptied and deleted; `--keep-bucket` keeps it (and
the sweep lists it); a failed download keeps it too; the user's own bucket is never touched."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.gcp.gcs import ObjectInfo, StorageApi, StorageApiError
from scripts.cli import main
from scripts.settings import Settings
from scripts.targets.gce.clients import GceClients
from scripts.targets.stack.bucket import checkpoint_candidates, destroy_targets, run_objects
from tests.support import ROOT
from tests.support.fake_compute import FakeCompute
from tests.support.fake_stack import FakeStackRunner
from tests.support.gcs_emulator import GcsEmulator

BUCKET = "gputrain-lab-gputrain-test"


@dataclass
class Cloud:
    runs: Path
    runner: FakeStackRunner
    gcs: GcsEmulator
    settings: Settings
    gce: GceClients

    def main(self, *argv: str) -> int:
        return main(list(argv), self.settings, self.gce)

    def put(self, name: str, data: bytes) -> None:
        self.gcs.client().bucket(BUCKET).blob(name).upload_from_string(data)

    def put_checkpoint(
        self, run_id: str, step: int, data: bytes, *, manifest_size: int = 0
    ) -> None:
        """A checkpoint as the trainer uploads it: the object, then its manifest."""
        name = f"runs/{run_id}/checkpoints/ckpt-{step:08d}.pt"
        self.put(name, data)
        blob = self.gcs.client().bucket(BUCKET).get_blob(name)
        manifest = {"step": step, "size": manifest_size or len(data), "crc32c": blob.crc32c}
        self.put(name + ".manifest.json", json.dumps(manifest).encode())

    def names(self) -> list[str]:
        return sorted(b.name for b in self.gcs.client().list_blobs(BUCKET))

    def bucket_exists(self) -> bool:
        return bool(self.gcs.client().bucket(BUCKET).exists())


@pytest.fixture
def cloud(gcs: GcsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.lab.yaml").write_text(
        "config:\n  gcp:project: gputrain-test\n  gputrain:machineType: g2-standard-8\n"
    )
    with FakeCompute() as compute:
        runner = FakeStackRunner(stack_name="lab", compute=compute, bucket=BUCKET)
        gce = GceClients(
            runner_for=lambda s, r: runner, compute_endpoint=compute.url, retry_pause_s=0
        )
        settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
        runner.up()
        yield Cloud(tmp_path / "runs", runner, gcs, settings, gce)


def test_down_brings_results_home_then_deletes_the_bucket(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    # r1: only in the bucket; its newest checkpoint (30) is truncated against its manifest.
    cloud.put_checkpoint("r1", 20, b"twenty" * 100)
    cloud.put_checkpoint("r1", 30, b"thirty", manifest_size=5000)
    cloud.put("runs/r1/model/summary.json", b'{"final_loss": 2.5}')
    # r2: the run's nodes already brought its newest checkpoint home (runs/stack-lab/r2/<node>/).
    cloud.put_checkpoint("r2", 40, b"forty" * 10)
    home = cloud.runs / "stack-lab" / "r2" / "lab-node-0"
    home.mkdir(parents=True)
    (home / "ckpt-00000040.pt").write_bytes(b"forty" * 10)
    # r3: a Vertex run, already filed under its own target: its files go there.
    cloud.put("runs/r3/model/metrics.jsonl", b"{}\n")
    (cloud.runs / "vertex-lab" / "r3").mkdir(parents=True)

    assert cloud.main("down", "--stack", "lab") == 0
    out = capsys.readouterr().out
    r1 = cloud.runs / "stack-lab" / "r1"
    assert (r1 / "checkpoints" / "ckpt-00000020.pt").read_bytes() == b"twenty" * 100
    assert (r1 / "checkpoints" / "ckpt-00000020.pt.manifest.json").is_file()
    assert not (r1 / "checkpoints" / "ckpt-00000030.pt").exists()  # incomplete: not a result
    assert json.loads((r1 / "model" / "summary.json").read_text()) == {"final_loss": 2.5}
    assert not (cloud.runs / "stack-lab" / "r2" / "checkpoints").exists()  # home already
    assert (cloud.runs / "vertex-lab" / "r3" / "model" / "metrics.jsonl").read_text() == "{}\n"
    assert f"brought 4 file(s) home from gs://{BUCKET}" in out
    assert not cloud.bucket_exists()  # emptied, then deleted by destroy
    assert ("destroy",) in cloud.runner.calls


def test_keep_bucket_keeps_it_and_the_sweep_lists_it(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud.put_checkpoint("r1", 10, b"ten")
    assert cloud.main("down", "--stack", "lab", "--keep-bucket") == 0
    out = capsys.readouterr().out
    assert f"keeping gs://{BUCKET} (--keep-bucket)" in out
    assert ("destroy", "gcp:storage/bucket:Bucket") in cloud.runner.calls
    assert cloud.runner.existing == [] and cloud.bucket_exists()
    assert len(cloud.names()) == 2  # the checkpoint and its manifest are still there
    assert (cloud.runs / "stack-lab" / "r1" / "checkpoints" / "ckpt-00000010.pt").is_file()
    # The kept bucket still bills a little: the sweep says so.
    assert cloud.main("sweep", "--stack", "lab") == 1
    assert BUCKET in capsys.readouterr().out
    # A later `down` deletes it (its results are home already).
    assert cloud.main("down", "--stack", "lab") == 0
    assert not cloud.bucket_exists()
    assert cloud.main("sweep", "--stack", "lab") == 0


def test_a_failed_download_keeps_the_bucket_and_fails_loudly(
    cloud: Cloud, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud.put_checkpoint("r1", 10, b"ten")

    def refuse(self: StorageApi, bucket: str, name: str, dest: Path) -> None:
        raise StorageApiError(f"Cloud Storage objects.get gs://{bucket}/{name}: 403 Forbidden")

    monkeypatch.setattr(StorageApi, "download", refuse)
    assert cloud.main("down", "--stack", "lab") == 1
    err = capsys.readouterr().err
    assert f"bucket gs://{BUCKET} kept: its results could not be brought home" in err
    assert "403 Forbidden" in err and "gputrain down --stack lab" in err
    assert cloud.bucket_exists() and len(cloud.names()) == 2  # nothing lost
    assert cloud.runner.existing == []  # everything that bills by the hour is gone


def test_what_a_node_writes_while_the_bucket_empties_comes_home_first(
    cloud: Cloud, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's last mirror pass lands after `down` listed the bucket: the new object is brought
    home by the next listing, never deleted unseen."""
    cloud.put("runs/r1/out/lab-node-0/early.txt", b"early")
    download = StorageApi.download
    late = ["runs/r1/out/lab-node-1/late.txt"]

    def node_writes_meanwhile(self: StorageApi, bucket: str, name: str, dest: Path) -> None:
        for late_name in late:  # while the results come home, once
            cloud.put(late_name, b"written late")
        late.clear()
        download(self, bucket, name, dest)

    monkeypatch.setattr(StorageApi, "download", node_writes_meanwhile)
    assert cloud.main("down", "--stack", "lab") == 0
    out = capsys.readouterr().out
    r1 = cloud.runs / "stack-lab" / "r1"
    assert (r1 / "out" / "lab-node-0" / "early.txt").read_bytes() == b"early"
    assert (r1 / "out" / "lab-node-1" / "late.txt").read_bytes() == b"written late"
    assert "brought 1 more file(s) home, written as it emptied" in out
    assert f"emptied gs://{BUCKET} (2 object(s))" in out
    assert not cloud.bucket_exists() and ("destroy",) in cloud.runner.calls


def test_a_retry_whose_bucket_cannot_be_emptied_keeps_it_and_says_why(
    cloud: Cloud, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first destroy fails after a node's late upload landed; the retry's settle cannot
    bring it home: the bucket is kept from then on, and the end says so, not "destroy failed"."""
    destroy = FakeStackRunner.destroy
    cloud.runner.destroy_failures = 1

    def late_upload_then_destroy(self: FakeStackRunner, *args: Any, **kwargs: Any) -> None:
        if self.destroy_failures:  # the attempt that fails: a node's last upload lands first
            cloud.put("runs/r1/out/lab-node-0/late.txt", b"late")
        destroy(self, *args, **kwargs)

    def refuse(self: StorageApi, bucket: str, name: str, dest: Path) -> None:
        raise StorageApiError(f"Cloud Storage objects.get gs://{bucket}/{name}: 503 Unavailable")

    monkeypatch.setattr(FakeStackRunner, "destroy", late_upload_then_destroy)
    monkeypatch.setattr(StorageApi, "download", refuse)
    assert cloud.main("down", "--stack", "lab") == 1
    err = capsys.readouterr().err
    assert f"bucket gs://{BUCKET} kept: its results could not be brought home" in err, err
    assert "still exist" not in err
    assert ("destroy", "gcp:storage/bucket:Bucket") in cloud.runner.calls  # the retry kept it
    assert cloud.names() == ["runs/r1/out/lab-node-0/late.txt"]  # nothing lost
    assert cloud.runner.existing == []


def hostile_names(outside: Path) -> list[str]:
    """What code with the nodes' storage role can name (objects.insert takes any UTF-8 name; the
    emulator refuses `..` parts on its own disk, so those are in the pure test below)."""
    return [
        f"runs/r1/{outside}/abs-escape",  # runs/r1//tmp/...: run_dir / "/tmp/..." is absolute
        f"runs/r1/model/{outside}/deep-escape",
        "runs/r1/sub\\escape-backslash",
        "runs/r1/term\x1b]52;c;ZXZpbA==\x07",
    ]


def test_down_writes_no_bucket_object_outside_the_results(
    cloud: Cloud, capsys: pytest.CaptureFixture[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each hostile name is left behind with one line; the run's plain files still come home."""
    outside = tmp_path_factory.mktemp("outside")
    cloud.put("runs/r1/model/summary.json", b"{}")
    hostile = hostile_names(outside)
    for name in hostile:
        cloud.put(name, b"pwned")
    assert cloud.main("down", "--stack", "lab") == 0
    home = cloud.runs / "stack-lab" / "r1"
    assert (home / "model" / "summary.json").read_bytes() == b"{}"
    assert list(outside.rglob("*")) == []
    written = [p for p in cloud.runs.rglob("*") if p.is_file() and b"pwned" in p.read_bytes()]
    assert written == []
    err = capsys.readouterr().err
    assert err.count("not bringing home") == len(hostile)
    assert "\x1b]52" not in err  # the name is shown escaped, never as a terminal sequence


def test_vertex_results_share_the_rule(
    cloud: Cloud, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from infra.outputs import VertexOutputs
    from scripts.targets.vertex.session import bring_home

    outside = tmp_path_factory.mktemp("outside")
    cloud.put("runs/r1/model/summary.json", b"{}")
    for name in hostile_names(outside):
        cloud.put(name, b"pwned")
    out = VertexOutputs("gputrain-test", "us-central1", BUCKET, "", "sa@x")
    results = tmp_path_factory.mktemp("results") / "r1"
    bring_home(StorageApi(), out, "r1", results)
    assert (results / "model" / "summary.json").read_bytes() == b"{}"
    assert list(outside.rglob("*")) == []
    assert [p.name for p in results.rglob("*") if p.is_file()] == ["summary.json"]


def test_object_names_that_escape_are_left_out_and_said() -> None:
    objs = [
        ObjectInfo("p/runs/r1/model/x.pt", 1),
        ObjectInfo("p/runs/r1/../../../.bashrc", 1),
        ObjectInfo("p/runs/r1/model/../../../../x", 1),
        ObjectInfo("p/runs/../escape/x", 1),
        ObjectInfo("p/runs/r1//home/u/.bashrc", 1),
        ObjectInfo("p/runs/r1/a\x00b", 1),
        ObjectInfo("p/runs/../..", 1),
        ObjectInfo("p/runs/r1/folder/", 0),  # a console's folder placeholder: nothing to fetch
    ]
    refused: list[str] = []
    assert run_objects(objs, "p/", refused) == {"r1": {"model/x.pt": objs[0]}}
    assert len(refused) == 6


def test_the_users_bucket_is_never_touched(cloud: Cloud) -> None:
    """As with `bucket: gs://...`: the stack did not create it, so it has no stack label."""
    cloud.runner._outputs["bucketOwned"] = False
    cloud.runner._created = [c for c in cloud.runner._created if c[0] != "bucket"]
    theirs = cloud.gcs.client().get_bucket(BUCKET)
    theirs.labels = {"team": "ml"}
    theirs.patch()
    cloud.put_checkpoint("r1", 10, b"ten")
    assert cloud.main("down", "--stack", "lab") == 0
    assert cloud.bucket_exists() and len(cloud.names()) == 2
    assert not (cloud.runs / "stack-lab" / "r1").exists()


def test_sweep_finds_a_labelled_bucket_of_this_stack_only(cloud: Cloud) -> None:
    from infra.gcp.compute import ComputeApi
    from infra.gcp.sweep import sweep

    other = cloud.gcs.client().create_bucket("gputrain-prod-gputrain-test")
    other.labels = {"gputrain-stack": "prod"}
    other.patch()
    api = ComputeApi(cloud.gce.compute_endpoint)
    found = [
        x
        for x in sweep("gputrain-test", "lab", api=api, storage=StorageApi())
        if x.kind == "bucket"
    ]
    assert [(x.name, x.matched_by) for x in found] == [(BUCKET, "label gputrain-stack=lab")]


def test_objects_per_run_and_complete_checkpoint_candidates() -> None:
    objs = [
        ObjectInfo("p/runs/a/checkpoints/ckpt-00000010.pt", 3),
        ObjectInfo("p/runs/a/checkpoints/ckpt-00000010.pt.manifest.json", 1),
        ObjectInfo("p/runs/a/checkpoints/ckpt-00000020.pt", 3),  # no manifest: unfinished
        ObjectInfo("p/runs/a/checkpoints/.gputrain-write-probe-7", 0),
        ObjectInfo("p/staging/a/code.tar.gz", 9),
        ObjectInfo("p/runs/b/model/summary.json", 2),
    ]
    runs = run_objects(objs, "p/")
    assert sorted(runs) == ["a", "b"]
    assert sorted(runs["a"]) == [
        "checkpoints/ckpt-00000010.pt",
        "checkpoints/ckpt-00000010.pt.manifest.json",
        "checkpoints/ckpt-00000020.pt",
    ]
    assert checkpoint_candidates(runs["a"]) == [
        ("checkpoints/ckpt-00000010.pt", "checkpoints/ckpt-00000010.pt.manifest.json")
    ]


def test_destroy_targets_spare_the_kept_type_and_its_parents() -> None:
    stack = "urn:pulumi:lab::gputrain::pulumi:pulumi:Stack::gputrain-lab"
    cluster = "urn:pulumi:lab::gputrain::gputrain:infra:GpuCluster::lab"
    comp = "urn:pulumi:lab::gputrain::gputrain:infra:GpuCluster$gputrain:infra:StackBucket::b"
    bucket = f"{comp}$gcp:storage/bucket:Bucket::gputrain-lab-p"
    grant = f"{comp}$gcp:storage/bucketIAMMember:BucketIAMMember::gputrain-lab-p-nodes"
    vm = "urn:pulumi:lab::gputrain::gputrain:infra:GpuCluster$gcp:compute/instance:Instance::vm"
    resources: list[dict[str, Any]] = [
        {"urn": stack, "type": "pulumi:pulumi:Stack"},
        {
            "urn": "urn:pulumi:lab::gputrain::pulumi:providers:gcp::default",
            "type": "pulumi:providers:gcp",
        },
        {"urn": cluster, "type": "gputrain:infra:GpuCluster", "parent": stack},
        {"urn": comp, "type": "gputrain:infra:StackBucket", "parent": cluster},
        {"urn": bucket, "type": "gcp:storage/bucket:Bucket", "parent": comp},
        {"urn": grant, "type": "gcp:storage/bucketIAMMember:BucketIAMMember", "parent": comp},
        {"urn": vm, "type": "gcp:compute/instance:Instance", "parent": cluster},
    ]
    assert destroy_targets(resources, ["gcp:storage/bucket:Bucket"]) == [grant, vm]


def test_a_run_another_machine_recorded_in_the_bucket_comes_home_into_the_ledger(
    cloud: Cloud, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's record goes into the stack's bucket (scripts/cost/ledger.py record_run); `down`
    on this machine brings it home and `gputrain cost` counts it."""
    from types import SimpleNamespace

    from scripts.cost.ledger import record_run
    from scripts.targets.base import Footprint

    elsewhere = tmp_path / "other-machine" / "runs" / "stack-lab" / "r9"
    session = SimpleNamespace(
        name="stack-lab",
        hourly_usd=3.0,
        billed_since=time.time() - 1800,  # its machines were up half an hour
        ledger_bucket=lambda: (StorageApi("gputrain-test"), BUCKET, ""),
        footprint=lambda: Footprint(2, "g2-standard-8", 1),
        spec=None,
        partial_usd=0.0,
    )
    record_run(None, session, "r9", elsewhere)  # type: ignore[arg-type]
    assert [n for n in cloud.names() if n.startswith("runs/r9/ledger-")]  # the segment's file
    assert cloud.main("down", "--stack", "lab") == 0
    capsys.readouterr()
    assert cloud.main("cost", "--stack", "lab", "--json") == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["run_id"] == "r9" and run["estimated_usd"] == pytest.approx(1.5, abs=0.01)


def test_a_stack_runs_record_and_its_watchdogs_count_the_rate_its_budget_counts(
    cloud: Cloud,
) -> None:
    """The session's rate (its run summary's estimate and its cost record) and the record the
    head's watchdog is given are the rate the caps and the budget count: the VMs with their boot
    disks, not the VMs alone; the watchdog's record starts in the cluster's zone."""
    from scripts.run_plan import worst_hourly
    from scripts.targets.base import RunOptions
    from scripts.targets.gce.target import GceTarget

    cloud.runner.set_config("gputrain:sshPrivateKey", "a key", secret=True)  # never used here
    target = GceTarget("lab", cloud.settings, cloud.gce)
    spec = target.spec()
    rate = worst_hourly(spec)
    assert rate is not None and spec.hourly_price is not None and rate > spec.hourly_price
    with target.attached(RunOptions()) as session:
        assert session.hourly_usd == rate
        assert session.watchdogs is not None
        ledger = session.watchdogs.plan.ledger
        assert ledger is not None and ledger["hourly_usd"] == rate
        assert ledger["zones"] == [cloud.runner.outputs()["zone"]]
