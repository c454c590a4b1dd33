"""Datasets on the sshd test bed: `run --stack` with `--data` copies a prefix of the Cloud Storage
emulator (on the bridge) to both nodes before torchrun; the job finds it at GPUTRAIN_DATA_TRAIN with
every byte right; a `train` on the kept cluster downloads nothing; a prefix that does not exist
stops the run with exit 2 before anything is created."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable

import pytest

from tests.support.stack_world import World, assert_torn_down

pytestmark = [pytest.mark.testbed]

DATA_JOB = '''"""Prints one digest over the dataset as the job sees it (rank 0 of each node)."""
import hashlib, os
from pathlib import Path
root = Path(os.environ["GPUTRAIN_DATA_TRAIN"])
assert os.environ["GPUTRAIN_DATA_DIR"] == str(root.parent), os.environ["GPUTRAIN_DATA_DIR"]
h = hashlib.sha256()
for p in sorted(q for q in root.rglob("*") if q.is_file()):
    h.update(str(p.relative_to(root)).encode() + b"\\0" + p.read_bytes())
print("dataset digest", h.hexdigest(), flush=True)
'''


def digest(objects: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for rel in sorted(objects):
        h.update(rel.encode() + b"\0" + objects[rel])
    return h.hexdigest()


def test_a_dataset_is_on_every_node_before_training_and_cached_after(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(bucket=True)
    assert w.gcs is not None
    objects = {f"shard-{i:02d}.bin": os.urandom(2000 + i) for i in range(24)}
    objects["big/all.bin"] = os.urandom(40 << 20)  # sliced (>= 32 MiB)
    for rel, data in objects.items():
        w.gcs.write(f"datasets/tiny/{rel}", data)
    (w.dir / "datajob.py").write_text(DATA_JOB)
    data = ["--data", f"train=gs://{w.gcs.bucket_name}/datasets/tiny"]
    env = ["--env", f"STORAGE_EMULATOR_HOST={w.gcs.url}"]
    common = ["--stack", "e2e", *env, *data]

    assert w.run("run", *common, "--yes", "--skip-preflight", "--keep", "--", "datajob.py") == 0
    out = capsys.readouterr().out
    assert f"data train: gs://{w.gcs.bucket_name}/datasets/tiny/, 25 object(s)" in out
    assert re.search(r"data on 2 node\(s\) in [\d.]+ s: e2e-node-0 40 MiB downloaded", out), out
    digests = re.findall(r"\[(e2e-node-\d)\] \[rank\d\]:dataset digest (\w+)", out)
    assert sorted(digests) == [("e2e-node-0", digest(objects)), ("e2e-node-1", digest(objects))]

    assert w.run("train", *common, "--", "datajob.py") == 0  # the kept cluster: all cached
    out = capsys.readouterr().out
    assert "e2e-node-0 0 MiB downloaded" in out and "e2e-node-1 0 MiB downloaded" in out
    assert out.count("25 object(s) cached") == 2
    assert w.run("down", "--stack", "e2e") == 0
    assert_torn_down(w)


def test_a_prefix_that_does_not_exist_is_refused_before_anything_is_created(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(bucket=True)
    assert w.gcs is not None
    bad = f"train=gs://{w.gcs.bucket_name}/no/such/prefix"
    assert w.run("run", "--stack", "e2e", "--yes", "--skip-preflight", "--data", bad) == 2
    err = capsys.readouterr().err
    assert f"data train (gs://{w.gcs.bucket_name}/no/such/prefix/): no objects under" in err
    assert len(err.strip().splitlines()) == 1
    assert "up" not in w.runner.call_names()
    assert w.run("run", "--stack", "e2e", "--yes", "--data", "x=gs://nobucket-here/p") == 2
    assert "bucket gs://nobucket-here does not exist" in capsys.readouterr().err
