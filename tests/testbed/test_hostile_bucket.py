"""A bucket object cannot write outside the results: code on a node (here the job itself; as well
a requirement's install script or a Vertex job: anything with the nodes' storage role) names
objects in the stack's bucket whose names are absolute or hold backslashes or terminal escapes;
`down` brings the run's plain files home and none of those, each named in one warning."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.stack_world import BUCKET, World, assert_torn_down

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(600)]

HOSTILE_JOB = '''"""Writes what the nodes' storage role allows: any object name in the stack's bucket."""
import os, sys
from pathlib import Path
from google.cloud import storage

outside, run = sys.argv[1], os.environ["GPUTRAIN_RUN_ID"]
out = Path(os.environ["GPUTRAIN_OUT"]); out.mkdir(parents=True, exist_ok=True)
(out / "summary.json").write_text('{"steps": 1}')
bucket = storage.Client().bucket(os.environ["THE_BUCKET"])
for name in (
    f"runs/{run}/{outside}/abs-escape",  # runs/RUN//tmp/...: absolute once joined to a path
    f"runs/{run}/model/{outside}/deep-escape",
    f"runs/{run}/sub\\\\backslash-escape",
    f"runs/{run}/title\\x1b]0;pwned\\x07",
    f"runs/{run}/model/plain.txt",
):
    bucket.blob(name).upload_from_string(b"pwned" if "escape" in name else b"plain")
print("hostile objects written", flush=True)
'''


def test_down_writes_no_hostile_object_name_outside_the_results(
    world: Callable[..., World],
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    w = world(bucket=True)
    assert w.gcs is not None
    outside = tmp_path_factory.mktemp("outside")
    (w.dir / "hostile.py").write_text(HOSTILE_JOB)
    code = w.run(
        "run", "--stack", "e2e", "--yes", "--skip-preflight", "--keep",
        "--env", f"STORAGE_EMULATOR_HOST={w.gcs.url}", "--env", f"THE_BUCKET={BUCKET}",
        "--", "hostile.py", str(outside),
    )  # fmt: skip
    assert code == 0
    rid = (w.dir / "runs" / "stack-e2e" / "LAST_RUN").read_text().strip()
    names = {b.name for b in w.gcs.client().list_blobs(BUCKET, prefix=f"runs/{rid}/")}
    assert f"runs/{rid}/{outside}/abs-escape" in names  # the node did write them
    capsys.readouterr()
    assert w.run("down", "--stack", "e2e") == 0
    err = capsys.readouterr().err
    assert list(outside.rglob("*")) == []
    home = w.dir / "runs" / "stack-e2e" / rid
    assert (home / "model" / "plain.txt").read_bytes() == b"plain"
    pwned = [p for p in w.dir.rglob("*") if p.is_file() and p.read_bytes() == b"pwned"]
    assert pwned == []
    assert err.count("not bringing home") == 4, err
    assert "\x1b]0" not in err
    assert_torn_down(w)
