"""`gputrain` commands beyond `run --stack`: the local and hosts targets end to end, keygen,
down/sweep/status against the fake cloud, ssh through OpenSSH with pinned keys, and the one-line
errors for bad input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from infra.spec import parse_spec
from infra.stackfile import load_stack_config
from scripts.cli import main
from scripts.lifecycle import Services, ttl_left_s
from tests.fake_compute import FakeCompute
from tests.fake_stack import FakeStackRunner
from tests.testbed import TestBed

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def _one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("gputrain: error: ")
    return lines[0]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run"], "choose a target: --stack NAME, --hosts FILE or --local"),
        (["down"], "choose a target: --stack NAME"),
        (["run", "--local", "--env", "1X=2"], "--env '1X=2'"),
        (["plan", "--stack", "nosuch"], "nosuch"),
        (["run", "--hosts", "/nonexistent/hosts.yaml"], "/nonexistent/hosts.yaml"),
        (["ssh", "--local", "0"], "local target is this machine"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    rc = main(argv, services=Services(root=tmp_path, runs_dir=tmp_path / "runs"))
    assert rc == 2
    assert needle in _one_line_error(capsys.readouterr().err)


def test_deploy_needs_the_missing_settings_before_anything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The shipped dev stack has no project/key yet: `up` refuses before any cloud call."""
    runner = FakeStackRunner(stack_name="dev")
    services = Services(root=ROOT, runs_dir=tmp_path, runner_for=lambda s, r: runner)
    assert main(["up", "--stack", "dev", "--yes"], services=services) == 2
    assert "gcp:project" in _one_line_error(capsys.readouterr().err)
    assert runner.calls == []


# ---------------------------------------------------------------- stack commands on the fake cloud


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[tuple[FakeCompute, FakeStackRunner, Services]]:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.lab.yaml").write_text(
        "config:\n  gcp:project: gputrain-test\n  gputrain:machineType: g2-standard-8\n"
        "  gputrain:zones: [us-central1-a, us-central1-b]\n"
    )
    compute = FakeCompute()
    compute.__enter__()
    runner = FakeStackRunner(stack_name="lab", compute=compute, zones=("us-central1-a",))
    services = Services(
        root=tmp_path,
        runs_dir=tmp_path / "runs",
        runner_for=lambda s, r: runner,
        compute_endpoint=compute.url,
        retry_pause_s=0,
    )
    yield compute, runner, services
    compute.__exit__(None, None, None)


def test_keygen_stores_the_pair_once(
    cloud: tuple[FakeCompute, FakeStackRunner, Services], capsys: pytest.CaptureFixture[str]
) -> None:
    _, runner, services = cloud
    assert main(["keygen", "--stack", "lab"], services=services) == 0
    public = runner.config["gputrain:sshPublicKey"]
    assert runner.secrets == {"gputrain:sshPrivateKey"}
    assert ("set_config", "gputrain:sshPrivateKey", "[secret]") in runner.calls
    private = paramiko.Ed25519Key.from_private_key(
        __import__("io").StringIO(runner.config["gputrain:sshPrivateKey"])
    )
    assert public.split()[1] == private.get_base64()
    assert "BEGIN OPENSSH PRIVATE KEY" not in capsys.readouterr().out
    # The spec accepts the stored key; a second keygen refuses to replace it silently.
    stack_file = services.root / "Pulumi.lab.yaml"
    stack_file.write_text(stack_file.read_text() + f"  gputrain:sshPublicKey: {public}\n")
    spec = parse_spec(load_stack_config(services.root, "lab"), "lab")
    assert spec.ssh_public_key == public
    assert main(["keygen", "--stack", "lab"], services=services) == 2
    assert "--force" in _one_line_error(capsys.readouterr().err)


def test_down_status_and_sweep(
    cloud: tuple[FakeCompute, FakeStackRunner, Services], capsys: pytest.CaptureFixture[str]
) -> None:
    compute, runner, services = cloud
    runner.up()
    assert main(["status", "--stack", "lab"], services=services) == 0
    out = capsys.readouterr().out
    assert "lab-node-0" in out and "RUNNING" in out and ("59m" in out or "1h" in out)
    # A leak: destroy "succeeds" but an instance survives -> down and sweep fail loudly.
    runner.leak_on_destroy = {"lab-node-1"}
    assert main(["down", "--stack", "lab"], services=services) == 1
    captured = capsys.readouterr()
    assert "LEFT BEHIND" in captured.out and "lab-node-1" in captured.out
    assert "teardown of stack lab is incomplete" in captured.err
    assert main(["sweep", "--stack", "lab"], services=services) == 1
    compute.remove_instance("lab-node-1", "us-central1-a")
    compute.remove_resource("disks", "lab-node-1")
    assert main(["sweep", "--stack", "lab"], services=services) == 0
    assert "nothing carries the labels" in capsys.readouterr().out


def test_destroy_is_retried(
    cloud: tuple[FakeCompute, FakeStackRunner, Services], capsys: pytest.CaptureFixture[str]
) -> None:
    _, runner, services = cloud
    runner.up()
    runner.destroy_failures = 1
    assert main(["down", "--stack", "lab"], services=services) == 0
    assert runner.call_names().count("destroy") == 2
    assert runner.call_names().count("refresh") == 2
    assert runner.existing == []


def test_ttl_left_counts_from_the_latest_start() -> None:
    now = time.time()
    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now - 600))
    assert ttl_left_s(started, 3600, now) == pytest.approx(3000, abs=1)
    assert ttl_left_s(started, 60, now) == 0
    assert ttl_left_s(None, 3600, now) is None


# ---------------------------------------------------------------- local and hosts targets


def test_run_local_end_to_end(tmp_path: Path) -> None:
    """The README's main job, as a user runs it: the console script, a fresh directory."""
    env = {**os.environ, "GPUTRAIN_NODE_ROOT": str(tmp_path / "node")}
    t = time.monotonic()
    r = subprocess.run(
        [str(VENV_BIN / "gputrain"), "run", "--local", "--yes"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - t
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert elapsed < 120
    assert "run summary" in r.stdout and "loss floor" in r.stdout
    run_id = (tmp_path / "runs" / "local" / "LAST_RUN").read_text().strip()
    [summary] = (tmp_path / "runs" / "local" / run_id).rglob("summary.json")
    data = json.loads(summary.read_text())
    assert data["final_loss"] < data["initial_loss"] - 1.0
    assert data["mfu"] is None


def _hosts_file(tb: TestBed, tmp_path: Path, hosts: list[object], known: str) -> Path:
    (tmp_path / "known_hosts").write_text(known)
    path = tmp_path / "lab.yaml"
    path.write_text(
        f"user: {tb.user}\nidentity_file: {tb.identity_file}\nknown_hosts: known_hosts\n"
        f"python: {tb.python}\ngpus: {{model: NVIDIA L4, count: 1}}\nhosts:\n"
        + "".join(f"  - address: {h.address}\n" for h in hosts)  # type: ignore[attr-defined]
    )
    return path


def test_run_hosts_end_to_end_and_ssh(
    tb: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tb.add_host(), tb.add_host()
    path = _hosts_file(tb, tmp_path, [a, b], "".join(f"{h.address} {h.host_key}\n" for h in (a, b)))
    monkeypatch.chdir(tmp_path)
    services = Services(root=tmp_path, runs_dir=tmp_path / "runs", connect_deadline_s=30)
    (tmp_path / "job.py").write_text(
        "import os, socket\nprint('hello from', socket.gethostname(), os.environ['RANK'])\n"
    )
    assert main(["run", "--hosts", str(path), "--", "job.py"], services=services) == 0
    out = capsys.readouterr().out
    assert "hello from" in out and "run summary" in out
    assert (tmp_path / "runs" / "hosts-lab" / "LAST_RUN").is_file()
    # ssh: OpenSSH with only the pinned keys; the user's command arrives verbatim.
    assert ssh_echo(path, services) == "a b;c"


def ssh_echo(path: Path, services: Services) -> str:
    """`gputrain ssh ... -- echo 'a b;c'` in a child, so OpenSSH's stdout can be read."""
    code = (
        "import sys; from pathlib import Path; from scripts.cli import main; "
        "from scripts.lifecycle import Services; "
        f"sys.exit(main(['ssh', '--hosts', {str(path)!r}, '1', '--', 'echo', 'a b;c'], "
        f"services=Services(root=Path({str(services.root)!r}))))"
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
    services = Services(root=tmp_path, runs_dir=tmp_path / "runs", connect_deadline_s=10)
    assert main(["verify", "--hosts", str(path)], services=services) == 1
    err = capsys.readouterr().err
    assert "SHA256:" in err and a.address in err


def test_ssh_argv_reaches_an_isolated_worker_through_the_head(tb: TestBed, tmp_path: Path) -> None:
    """The worker has no route from here: OpenSSH goes through the head, both keys pinned."""
    from scripts.lifecycle import ssh_argv
    from scripts.transport.hostkeys import known_hosts_lines

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


def test_healthcheck_local_writes_health_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUTRAIN_NODE_ROOT", str(tmp_path / "node"))
    services = Services(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["healthcheck", "--local"], services=services) == 0
    run_id = (tmp_path / "runs" / "local" / "LAST_RUN").read_text().strip()
    [health] = (tmp_path / "runs" / "local" / run_id).rglob("health.json")
    report = json.loads(health.read_text())
    assert report["overall"] == "PASS"
    assert {c["status"] for c in report["checks"]} <= {"PASS", "WARN"} and report["checks"]


def test_second_ctrl_c_during_teardown_is_reported_not_obeyed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import signal

    from scripts.guard import Interrupted, signal_guard

    with signal_guard() as guard:
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        with guard.teardown():
            os.kill(os.getpid(), signal.SIGINT)  # must not interrupt the teardown
            time.sleep(0.2)
            finished = True
    assert finished and guard.received == [signal.SIGTERM, signal.SIGINT]
    assert "teardown is in progress" in capsys.readouterr().err
