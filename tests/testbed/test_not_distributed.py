"""A multi-node job that is not distributed is caught: on two test hosts, a Lightning-style
stand-in (what Trainer(num_nodes=1) does under torchrun: one device, no process group) trains
two independent copies and the run warns in one line with the usual fix; a job whose ranks join
one gloo group does not warn."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scripts.job.launch import launch_torchrun
from scripts.job.records import Job
from scripts.targets.session import close_all, connect
from tests.support import JOBS
from tests.support.testbed import TestBed

pytestmark = pytest.mark.testbed

#: Lightning's SingleDeviceStrategy in short: torch.distributed imported, no group joined. (Its
#: SGD step by hand: torch.optim's step() would import torch._dynamo, ~1 CPU s a rank.)
ALONE = """import os, torch, torch.distributed as dist
torch.manual_seed(int(os.environ["RANK"]))
model = torch.nn.Linear(4, 1)
for step in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    model.zero_grad(); loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    print(f"step {step} loss {loss.item():.4f} world {dist.get_world_size() if dist.is_initialized() else 1}")
"""


def test_ranks_that_never_join_a_group_are_warned_about(
    tb: TestBed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = [tb.add_host(), tb.add_host()]
    fleet = tb.fleet(hosts)
    work = tmp_path / "proj"
    work.mkdir()
    (work / "alone.py").write_text(ALONE)
    shutil.copy(JOBS / "ddp_sum.py", work / "ddp_sum.py")
    ts = connect(fleet, deadline_s=10)
    try:
        job = Job(run_id="alone", entry=("alone.py",), workdir=work)
        assert launch_torchrun(fleet, ts, job, tmp_path / "alone").ok
        err = capsys.readouterr().err
        [line] = [ln for ln in err.splitlines() if "never joined one process group" in ln]
        assert line.startswith("warning: run alone ran on 2 nodes but its 2 rank(s) never")
        assert "Lightning: Trainer(num_nodes=<nodes>" in line and "Accelerate:" in line
        assert sorted(p.read_text() for p in (tmp_path / "alone").glob("*/watch/world/*")) == [
            "0",
            "0",
        ]

        ddp = Job(run_id="ddp", entry=("ddp_sum.py",), env={"DDP_STEPS": "2"}, workdir=work)
        assert launch_torchrun(fleet, ts, ddp, tmp_path / "ddp").ok
        assert "never joined one process group" not in capsys.readouterr().err
        assert sorted(p.read_text() for p in (tmp_path / "ddp").glob("*/watch/world/*")) == [
            "2",
            "2",
        ]
    finally:
        close_all(ts)
