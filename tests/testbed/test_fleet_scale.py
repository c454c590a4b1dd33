"""A fleet of 16 test hosts end to end (issue 26): connect, verify and launch a trivial job on all
of them at once, every node's result home; a second launch uploads nothing (the delta), and the
code went out as one bundle, not one per node."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from infra.base.records import GpuExpectation
from scripts.job.launch import launch_torchrun
from scripts.job.records import Job
from scripts.targets.session import close_all, connect
from scripts.transport.ssh import SshTransport
from scripts.verify.nodes import verify_gpus
from tests.support.testbed import GpuConfig, TestBed

HOSTS = 16


def test_sixteen_hosts_connect_verify_launch_and_bring_every_result_home(
    tb: TestBed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = tb.add_hosts(HOSTS, gpus=GpuConfig(count=2))
    fleet = dataclasses.replace(
        tb.fleet(hosts),
        expect=GpuExpectation(model="NVIDIA L4", count=2),
        python=tb.trivial_python(),
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('never run: the trivial job stands in')\n")
    (workdir / "data.txt").write_text("x" * 100_000)
    transports = connect(fleet, deadline_s=60)
    try:
        assert len(transports) == HOSTS
        for t in transports.values():  # AES-GCM: no per-packet HMAC in Python on this side
            assert isinstance(t, SshTransport) and t.cipher == "aes128-gcm@openssh.com"
        reports = verify_gpus(fleet, transports, deadline_s=60)
        assert [r.node for r in reports] == [h.name for h in hosts]
        assert all(r.ok and len(r.gpus) == 2 and r.torch for r in reports)

        lines: dict[str, list[str]] = {}
        capsys.readouterr()
        result = launch_torchrun(
            fleet,
            transports,
            Job(run_id="scale-1", workdir=workdir, entry=("train.py", "--steps", "1")),
            tmp_path / "results-1",
            on_line=lambda node, line: lines.setdefault(node, []).append(line),
        )
        said = capsys.readouterr().out
        assert result.ok and result.exit_codes == {h.name: 0 for h in hosts}
        for h in hosts:  # every node ran the job on itself, and its result came home
            home = tmp_path / "results-1" / h.name
            assert (home / "ok.txt").read_text().strip() == h.name
            assert f"trivial job on {h.name}" in (home / "torchrun.log").read_text()
            assert (home / "exitcode").read_text().split()[0] == "0"
            [job_line] = [ln for ln in lines[h.name] if "trivial job" in ln]
            assert f"--nnodes {HOSTS} " in job_line and job_line.endswith("train.py --steps 1")
        record = json.loads((tmp_path / "results-1" / "job.json").read_text())
        assert record["ok"] and len(record["exit_codes"]) == HOSTS
        assert re.search(
            rf"to {HOSTS} node\(s\) in [\d.]+ s \({HOSTS} node\(s\): \d+ changed", said
        )

        # the same code again: every node has it, nothing is sent, the run still completes
        launch_torchrun(
            fleet,
            transports,
            Job(run_id="scale-2", workdir=workdir, entry=("train.py",)),
            tmp_path / "results-2",
            on_line=lambda _n, _l: None,
        )
        said = capsys.readouterr().out
        assert f"({HOSTS} node(s): 0 changed, 0 removed)" in said
        assert all((tmp_path / "results-2" / h.name / "ok.txt").exists() for h in hosts)
    finally:
        close_all(transports)
