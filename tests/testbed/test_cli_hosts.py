"""`gputrain` on the hosts target over real SSH (the sshd test bed): a run end to end, `gputrain ssh`
through OpenSSH with the pinned keys (also through the head to an isolated worker), and a changed
host key refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.cli import main
from scripts.settings import Settings
from tests.support import ROOT
from tests.support.testbed import TestBed, TestHost


def _hosts_file(tb: TestBed, tmp_path: Path, hosts: list[TestHost], known: str) -> Path:
    return tb.hosts_file(tmp_path, hosts, "gpus: {model: NVIDIA L4, count: 1}\n", known=known)


def test_run_hosts_end_to_end_and_ssh(
    tb: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tb.add_host(), tb.add_host()
    path = _hosts_file(tb, tmp_path, [a, b], "".join(f"{h.address} {h.host_key}\n" for h in (a, b)))
    monkeypatch.chdir(tmp_path)
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs", connect_deadline_s=30)
    (tmp_path / "job.py").write_text(
        "import os, socket\nprint('hello from', socket.gethostname(), os.environ['RANK'])\n"
    )
    assert main(["run", "--hosts", str(path), "--", "job.py"], settings) == 0
    out = capsys.readouterr().out
    assert "hello from" in out and "run summary" in out
    assert (tmp_path / "runs" / "hosts-lab" / "LAST_RUN").is_file()
    # the cost ledger has the run: 2 hosts of 1 GPU, nothing billed by gputrain
    assert main(["cost", "--hosts", str(path), "--json"], settings) == 0
    ledger = json.loads(capsys.readouterr().out)
    (record,) = ledger["runs"]
    assert record["target"] == "hosts-lab" and record["machine"] == "hosts" and record["ok"]
    assert record["nodes"] == 2 and record["gpus_per_node"] == 1 and record["gpu_hours"] > 0
    assert record["estimated_usd"] is None and ledger["total"]["unpriced_runs"] == 1
    # ssh: OpenSSH with only the pinned keys; the user's command arrives verbatim.
    assert ssh_echo(path, settings) == "a b;c"


def ssh_echo(path: Path, settings: Settings) -> str:
    """`gputrain ssh ... -- echo 'a b;c'` in a child, so OpenSSH's stdout can be read."""
    code = (
        "import sys; from pathlib import Path; from scripts.cli import main; "
        "from scripts.settings import Settings; "
        f"sys.exit(main(['ssh', '--hosts', {str(path)!r}, '1', '--', 'echo', 'a b;c'], "
        f"Settings(root=Path({str(settings.root)!r}))))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_hosts_with_a_changed_key_are_refused(
    tb: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    a = tb.add_host()
    wrong = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDr7tSOmfPVhXDiG0H2GpvjXXo8hKzpQ1wV3l1Zq9ZkT"
    path = _hosts_file(tb, tmp_path, [a], f"{a.address} {wrong}\n")
    monkeypatch.chdir(tmp_path)
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs", connect_deadline_s=10)
    assert main(["verify", "--hosts", str(path)], settings) == 1
    err = capsys.readouterr().err
    assert "SHA256:" in err and a.address in err


def test_ssh_argv_reaches_an_isolated_worker_through_the_head(tb: TestBed, tmp_path: Path) -> None:
    """The worker has no route from here: OpenSSH goes through the head, both keys pinned."""
    from scripts.targets.session import ssh_argv
    from scripts.transport.ssh import known_hosts_lines

    head = tb.add_host()
    worker = tb.add_host(isolated_behind=head.name)
    fleet = tb.fleet([head, worker], jump=True)
    known = tmp_path / "known_hosts"
    known.write_text("\n".join(known_hosts_lines(fleet)) + "\n")
    argv = ssh_argv(fleet, fleet.nodes[1], known, ["hostname"])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == worker.name
    # A wrong pin for the worker is refused even though the head is fine.
    known.write_text(f"{head.address} {head.host_key}\n{worker.address} {tb.add_host().host_key}\n")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "HOST IDENTIFICATION HAS CHANGED" in r.stderr.upper()
