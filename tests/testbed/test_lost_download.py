"""Results that cannot come home, end to end over real SSH (the sshd test bed, `--hosts`): the
controller's download channel to a node is cut while that node's `tar` streams its results (the
node's per-connection sshd processes are killed, as a flaky link or a NAT drops a session). Once:
the download is tried again and the run succeeds with everything home. For good (its sshd stops
listening too): the run fails naming the node, its results stay on it, and `results` brings them
home once the node answers again."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.cli import main
from scripts.settings import Settings
from tests.support.testbed import TestBed, TestHost
from tests.support.testbed_faults import cut_during_download

JOB = """import os, pathlib
out = pathlib.Path(os.environ["GPUTRAIN_OUT"])
(out / "big.bin").write_bytes(os.urandom(96 << 20))  # a download that takes a while
(out / "summary.json").write_text('{"steps": 1}')
"""


@pytest.fixture
def lab(
    tb: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Settings, list[TestHost]]:
    hosts = tb.add_hosts(2)
    path = tb.hosts_file(tmp_path, hosts, "gpus: {model: NVIDIA L4, count: 1}\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text(JOB)
    return path, Settings(root=tmp_path, runs_dir=tmp_path / "runs", connect_deadline_s=20), hosts


def test_a_download_cut_once_is_tried_again(
    tb: TestBed, lab: tuple[Path, Settings, list[TestHost]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, settings, hosts = lab
    cut = cut_during_download(tb, hosts[1], for_good=False)
    rc = main(["run", "--hosts", str(path), "--", "job.py"], settings)
    cut.join(5)
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    assert f"{hosts[1].address}: downloading results failed" in out.err, out.err[-3000:]
    rid = (settings.runs_dir / "hosts-lab" / "LAST_RUN").read_text().strip()
    for h in hosts:
        assert (
            settings.runs_dir / "hosts-lab" / rid / h.address / "big.bin"
        ).stat().st_size == 96 << 20


def test_results_that_never_come_home_fail_the_run_and_stay_on_the_node(
    tb: TestBed, lab: tuple[Path, Settings, list[TestHost]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, settings, hosts = lab
    lost = hosts[1]
    cut = cut_during_download(tb, lost, for_good=True)
    try:
        rc = main(["run", "--hosts", str(path), "--", "job.py"], settings)
        cut.join(5)
        out = capsys.readouterr()
        assert rc == 1, out.err[-3000:]
        assert "results in" not in out.out
        assert f"the results of {lost.address} could not be brought home" in out.err, out.err
        rid = (settings.runs_dir / "hosts-lab" / "LAST_RUN").read_text().strip()
        on_node = lost.dir / "home" / ".gputrain" / "runs" / rid / "out" / "big.bin"
        assert on_node.stat().st_size == 96 << 20  # still there, as the line says
    finally:
        tb.start_sshd(lost.name)
    assert main(["results", "--hosts", str(path), rid], settings) == 0
    assert "results in" in capsys.readouterr().out
    home = settings.runs_dir / "hosts-lab" / rid / lost.address / "big.bin"
    assert home.stat().st_size == 96 << 20
