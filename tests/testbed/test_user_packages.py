"""A user project whose own packages are named like gputrain's (`trainer/`, one of the most common
names in ML projects, and `gputrain_node/`) under `run --stack` on 2 test hosts: its trainer runs
its own packages (`-m trainer.train`, a module gputrain's copy has too), while gputrain's node
helpers (the out-dir mirror, the GPU sampler) run from gputrain's own copy on the node. Node 2 is
preempted once the bucket holds its state; the re-created node gets its out dir back and the
relaunch resumes from it, not from zero. (Both packages in one project: one preemption run.)"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from tests.support.stack_world import World, assert_torn_down, bucket_object, preempt_when

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(600)]

#: the user's package: a step counter that keeps its state in the out dir (GPUTRAIN_OUT)
INIT = 'OWNER = "user"  # gputrain never ships this file: the job imports the user\'s package\n'
TRAIN = '''"""The user's own training loop."""
import json, os, sys, time
from pathlib import Path

import gputrain_node
import trainer

for package in (trainer, gputrain_node):
    assert package.OWNER == "user", package.__file__
out = Path(os.environ["GPUTRAIN_OUT"])
state = out / "state.json"
start = 0
if "--from-state" in sys.argv and state.is_file():
    start = json.loads(state.read_text())["step"]
    print(f"resumed from step {start}", flush=True)
for step in range(start, 120):
    time.sleep(0.05)
    if step % 10 == 0:
        tmp = state.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": step}))
        os.replace(tmp, state)
        print(f"step {step}", flush=True)
'''


def test_a_users_packages_named_like_ours_keep_their_out_dir_through_a_preemption(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world(bucket=True)
    assert w.gcs is not None
    for package in ("trainer", "gputrain_node"):
        (w.dir / package).mkdir()
        (w.dir / package / "__init__.py").write_text(INIT)
    (w.dir / "trainer" / "train.py").write_text(TRAIN)

    def state() -> int | None:  # the step of node 2's state.json as the bucket holds it now
        found = bucket_object(w, "/out/e2e-node-1/state.json")
        return None if found is None else int(json.loads(found)["step"])

    t, preempted_at = preempt_when(w, "e2e-node-1", state, at_least=20)
    rc = w.run(
        "run", "--stack", "e2e", "--yes", "--skip-preflight",
        "--env", f"STORAGE_EMULATOR_HOST={w.gcs.url}", "--env", "GPUTRAIN_MIRROR_INTERVAL_S=0.3",
        "--resume-args", "--from-state", "--", "-m", "trainer.train",
    )  # fmt: skip
    t.join(timeout=5)
    out = capsys.readouterr().out
    assert rc == 0, out[-4000:]
    assert preempted_at, "the run ended before node 2's state reached the bucket: " + out[-3000:]
    split = out.index("e2e-node-1 preempted (compute.instances.preempted at")
    before, after = out[:split], out[split:]
    assert re.search(r"\[e2e-node-1\] \[rank\d\]:step 0\b", before)  # the first attempt: from 0
    # the re-created node got its out dir back and the user's loop resumed from it
    assert "e2e-node-1: restored 1 file(s) from gs://" in after
    resumed = re.search(r"\[e2e-node-1\] \[rank\d\]:resumed from step (\d+)", after)
    assert resumed and int(resumed.group(1)) >= preempted_at[0], after[-3000:]
    # both nodes' helpers ran from gputrain's own copy: the sampler too
    target = w.dir / "runs" / "stack-e2e"
    run_dir = target / (target / "LAST_RUN").read_text().strip()
    logs = list(run_dir.rglob("sampler.log"))
    assert logs and not [p for p in logs if "Error" in p.read_text()], [p.read_text() for p in logs]
    assert_torn_down(w)
