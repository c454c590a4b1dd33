"""`gputrain` commands beyond `run --stack`: the local target end to end, keygen, down/sweep/status
against the fake cloud, and the one-line errors for bad input (the hosts target and `gputrain ssh`
over real SSH: tests/testbed/test_cli_hosts.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest

from infra.base.errors import GputrainError
from infra.billing import guard_name
from infra.spec import parse_spec
from infra.stackfile import load_stack_config
from scripts.cli import main
from scripts.settings import Settings
from scripts.targets.gce.clients import GceClients
from tests.support import JOBS, ROOT
from tests.support.fake_compute import FakeCompute
from tests.support.fake_gcp_admin import FakeGcpAdmin
from tests.support.fake_pubsub import FakePubSub
from tests.support.fake_stack import FakeStackRunner

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
        (["run", "--local", "--env", "1X=2"], "--env 1X=...: name '1X' is not allowed"),
        (["run", "--local", "--env", "IFS=,"], "--env IFS=...: IFS is the shell's own variable"),
        (
            ["run", "--local", "--env", "PIP_INDEX_URL=https://me:tok3n@pypi.example/simple"],
            "--env PIP_INDEX_URL=...: the value is a URL with a password",
        ),
        (["run", "--local", "--env", "BASH_ENV=/x"], "--env BASH_ENV=...: BASH_ENV is the shell"),
        (["run", "--local", "--env", "F=a", "--env", "F=b"], "--env F: given twice; allowed: each"),
        (["run", "--local", "--secret", "H", "--secret", "H"], "--secret: H is given twice"),
        (["plan", "--stack", "nosuch"], "nosuch"),
        (["plan", "--local", "--force"], "plan --force: only with --export FILE"),
        (["plan", "--local", "--", "-m", "x"], "plan -- -m x: ENTRY is only used with --export"),
        (["run", "--hosts", "/nonexistent/hosts.yaml"], "/nonexistent/hosts.yaml"),
        (["ssh", "--local", "0"], "local target is this machine"),
        (["up", "--stack", "dev", "--wait-for-capacity", "ten"], "--wait-for-capacity = 'ten'"),
        (["up", "--stack", "dev", "--wait-for-capacity", "8d"], "allowed: 1m to 7d"),
        (["run", "--local", "--wait-for-capacity", "10m"], "--wait-for-capacity: only --stack"),
        (["train", "--hosts", "h.yaml", "--wait-for-capacity", "1h"], "--hosts and --local"),
        (["logs", "--local", "--runs-dir", "~nouser-gputrain/r"], "~nouser-gputrain is no user's"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    rc = main(argv, settings=Settings(root=tmp_path, runs_dir=tmp_path / "runs"))
    assert rc == 2
    err = capsys.readouterr().err
    assert needle in _one_line_error(err)
    assert "tok3n" not in err  # a password is never echoed


@pytest.mark.parametrize("restarts", ["101", "-1", "two"])
def test_max_restarts_out_of_range_is_refused_while_parsing(
    restarts: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not at launch, after verify, LAST_RUN and a ledger record (a stack's VMs made by then)."""
    argv = ["run", "--local", "--yes", f"--max-restarts={restarts}", "--", "train.py"]
    with pytest.raises(SystemExit) as done:
        main(argv, Settings(root=tmp_path, runs_dir=tmp_path / "runs"))
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --max-restarts: '{restarts}' is not allowed; use 0..100" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--local", "--max-restarts", "١"],
        ["up", "--stack", "dev", "--max-candidates", "٣"],
        ["run", "--stack", "dev", "--max-recoveries", "1_0"],
        ["run", "--local", "--wait", "٣٠"],
    ],
)
def test_numbers_on_the_command_line_take_ascii_digits_only(
    argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """int() and float() read '١' and '1_0' as numbers: the options refuse them (exit 2)."""
    with pytest.raises(SystemExit) as e:
        main(argv, settings=Settings(root=tmp_path, runs_dir=tmp_path / "runs"))
    assert e.value.code == 2
    assert f"argument {argv[-2]}: {argv[-1]!r} is not allowed; use " in capsys.readouterr().err


def test_version_and_help_texts(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"gputrain {version('gputrain')}\n"
    for command, default in (
        ("healthcheck", "-m gputrain_node.healthcheck"),
        ("run", "-m trainer.train --preset tiny"),
    ):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
        assert f"(default: {default})" in text
        assert "--max-restarts K torchrun restarts every worker up to K times" in text


def test_deploy_needs_the_missing_settings_before_anything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The shipped dev stack has no project/key yet: `up` refuses before any cloud call."""
    runner = FakeStackRunner(stack_name="dev")
    gce = GceClients(runner_for=lambda s, r: runner)
    assert main(["up", "--stack", "dev", "--yes"], Settings(ROOT, tmp_path), gce) == 2
    assert "gcp:project" in _one_line_error(capsys.readouterr().err)
    assert runner.calls == []


# ---------------------------------------------------------------- stack commands on the fake cloud


@dataclass
class Cli:
    """`gputrain` wired to a project directory and the fake cloud."""

    settings: Settings
    gce: GceClients

    def main(self, argv: list[str]) -> int:
        return main(argv, self.settings, self.gce)


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[tuple[FakeCompute, FakeStackRunner, Cli]]:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.lab.yaml").write_text(
        "config:\n  gcp:project: gputrain-test\n  gputrain:machineType: g2-standard-8\n"
        "  gputrain:zones: [us-central1-a, us-central1-b]\n"
    )
    compute = FakeCompute()
    compute.__enter__()
    runner = FakeStackRunner(stack_name="lab", compute=compute, zones=("us-central1-a",))
    gce = GceClients(runner_for=lambda s, r: runner, compute_endpoint=compute.url, retry_pause_s=0)
    yield compute, runner, Cli(Settings(root=tmp_path, runs_dir=tmp_path / "runs"), gce)
    compute.__exit__(None, None, None)


@pytest.mark.parametrize("command", ["up", "run"])
def test_without_a_terminal_spending_needs_yes(
    cloud: tuple[FakeCompute, FakeStackRunner, Cli],
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """A nohup/CI run without --yes is refused before any check or cloud call (exit 2)."""
    compute, runner, cli = cloud
    assert not sys.stdin.isatty()  # pytest's stdin, as under nohup or CI
    assert cli.main([command, "--stack", "lab"]) == 2
    err = _one_line_error(capsys.readouterr().err)
    assert "stdin is not a terminal" in err and "pass --yes to proceed" in err
    assert "$" in err and "nothing was created" in err
    assert runner.calls == [] and compute.requests == []


def test_keygen_stores_the_pair_once(
    cloud: tuple[FakeCompute, FakeStackRunner, Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    _, runner, cli = cloud
    assert cli.main(["keygen", "--stack", "lab"]) == 0
    public = runner.config["gputrain:sshPublicKey"]
    assert runner.secrets == {"gputrain:sshPrivateKey"}
    assert ("set_config", "gputrain:sshPrivateKey", "[secret]") in runner.calls
    private = paramiko.Ed25519Key.from_private_key(
        __import__("io").StringIO(runner.config["gputrain:sshPrivateKey"])
    )
    assert public.split()[1] == private.get_base64()
    assert "BEGIN OPENSSH PRIVATE KEY" not in capsys.readouterr().out
    # The spec accepts the stored key; a second keygen refuses to replace it silently.
    stack_file = cli.settings.root / "Pulumi.lab.yaml"
    stack_file.write_text(stack_file.read_text() + f"  gputrain:sshPublicKey: {public}\n")
    spec = parse_spec(load_stack_config(cli.settings.root, "lab"), "lab")
    assert spec.ssh_public_key == public
    assert cli.main(["keygen", "--stack", "lab"]) == 2
    assert "--force" in _one_line_error(capsys.readouterr().err)


def test_down_status_and_sweep(
    cloud: tuple[FakeCompute, FakeStackRunner, Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    compute, runner, cli = cloud
    runner.up()
    assert cli.main(["status", "--stack", "lab"]) == 0
    out = capsys.readouterr().out
    assert "lab-node-0" in out and "RUNNING" in out and ("59m" in out or "1h" in out)
    # A leak: destroy "succeeds" but an instance survives -> down and sweep fail loudly.
    runner.leak_on_destroy = {"lab-node-1"}
    assert cli.main(["down", "--stack", "lab"]) == 1
    captured = capsys.readouterr()
    assert "LEFT BEHIND" in captured.out and "lab-node-1" in captured.out
    assert "teardown of stack lab is incomplete" in captured.err
    assert cli.main(["sweep", "--stack", "lab"]) == 1
    compute.remove_instance("lab-node-1", "us-central1-a")
    compute.remove_resource("disks", "lab-node-1")
    assert cli.main(["sweep", "--stack", "lab"]) == 0
    assert "nothing carries the labels" in capsys.readouterr().out


def _lab_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """The CLI on stack `lab` of project gputrain-test, its Pulumi state a fake, no metadata
    server to find credentials on: what the credentials tests below ask Google with."""
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.lab.yaml").write_text("config:\n  gcp:project: gputrain-test\n")
    gce = GceClients(runner_for=lambda s, r: FakeStackRunner(stack_name=s), retry_pause_s=0)
    return Cli(Settings(tmp_path, tmp_path / "runs"), gce)


@pytest.mark.parametrize(
    "argv",
    [["status"], ["sweep"], ["cost", "--billing", "my-proj.billing.gcp_billing_export_v1_01"]],
)
def test_no_credentials_is_the_users_setup_one_line_and_exit_2(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No credentials at all: one line with the login, exit 2 as for a bad key file or `up`."""
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.delenv("GPUTRAIN_BIGQUERY_ENDPOINT", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no gcloud login
    cli = _lab_cli(tmp_path, monkeypatch)
    assert cli.main([*argv, "--stack", "lab"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert "client (DefaultCredentialsError: " in line and line.endswith(
        "run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["sweep"],
        ["cost", "--billing", "my-proj.billing.gcp_billing_export_v1_01"],
        ["reconcile"],
    ],
)
@pytest.mark.filterwarnings("ignore:Your application has authenticated using end user")
def test_an_expired_login_is_the_users_setup_one_line_and_exit_2(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A login whose refresh token Google refuses (expired or revoked): as no credentials, one
    line naming the refusal and the login to run, exit 2, no traceback."""
    monkeypatch.delenv("GPUTRAIN_BIGQUERY_ENDPOINT", raising=False)
    cli = _lab_cli(tmp_path, monkeypatch)
    with FakeGcpAdmin() as admin:
        admin.expired_login(monkeypatch, tmp_path)
        assert cli.main([*argv, "--stack", "lab"]) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert line.endswith(
        ": the credentials were refused (RefreshError: invalid_grant: Token has been expired or "
        "revoked.); run `gcloud auth application-default login` or set "
        "GOOGLE_APPLICATION_CREDENTIALS"
    )


@pytest.mark.parametrize("argv", [["status"], ["sweep"]])
@pytest.mark.filterwarnings("ignore:Your application has authenticated using end user")
def test_a_token_endpoints_error_page_is_no_expired_login(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Google's token endpoint behind a front end that answers an HTML 502 page has refused
    nothing: one line saying Google cannot be reached, exit 1, never a login to run."""
    cli = _lab_cli(tmp_path, monkeypatch)
    with FakeGcpAdmin() as admin:
        admin.expired_login(monkeypatch, tmp_path)
        admin.world.token_answer = (502, "<html><title>502 Bad Gateway</title></html>")
        assert cli.main([*argv, "--stack", "lab"]) == 1
    line = _one_line_error(capsys.readouterr().err)
    assert line.endswith(
        ": cannot reach it (RefreshError: <html><title>502 Bad Gateway</title></html>)"
    )
    assert "gcloud auth" not in line


def test_sweep_lists_the_budget_guard_a_failed_teardown_left(
    cloud: tuple[FakeCompute, FakeStackRunner, Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    """A `billingBudget` stack: its guard's topic, subscription and budget, asked of the stack's
    own clients (Pub/Sub, the Budget API on the stack file's billing account)."""
    _, _, cli = cloud
    account = "012345-6789AB-CDEF01"
    stack_file = cli.settings.root / "Pulumi.lab.yaml"
    stack_file.write_text(
        stack_file.read_text() + f"  gputrain:billingBudget: {{account: {account}, usd: 300}}\n"
    )
    with FakePubSub() as guard:
        gce = dataclasses.replace(cli.gce, pubsub_endpoint=guard.url, budgets_endpoint=guard.url)
        name = guard_name("lab")
        guard.listed["projects/gputrain-test/topics"] = [
            {"name": f"projects/gputrain-test/topics/{name}"}
        ]
        budget = {"name": f"billingAccounts/{account}/budgets/7", "displayName": name}
        guard.listed[f"billingAccounts/{account}/budgets"] = [budget]
        assert main(["sweep", "--stack", "lab"], cli.settings, gce) == 1
        out = capsys.readouterr().out
        assert f"projects/gputrain-test/topics/{name}" in out and budget["name"] in out
        guard.listed.clear()
        assert main(["sweep", "--stack", "lab"], cli.settings, gce) == 0


def test_destroy_is_retried(
    cloud: tuple[FakeCompute, FakeStackRunner, Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    _, runner, cli = cloud
    runner.up()
    runner.destroy_failures = 1
    assert cli.main(["down", "--stack", "lab"]) == 0
    assert runner.call_names().count("destroy") == 2
    assert runner.call_names().count("refresh") == 2
    assert runner.existing == []


def test_down_clears_a_stale_lock_with_pulumi_cancel_and_says_so(
    cloud: tuple[FakeCompute, FakeStackRunner, Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    """Our process died mid-update: its lock stays. `down` (the user's word that no update is
    running) cancels it once, says so, and destroys."""
    _, runner, cli = cloud
    runner.up()
    runner.locked = True
    assert cli.main(["down", "--stack", "lab"]) == 0
    assert "clearing the lock (pulumi cancel)" in capsys.readouterr().out
    names = runner.call_names()
    assert names.count("cancel") == 1 and "destroy" in names[names.index("cancel") :]
    assert runner.existing == [] and not runner.locked


def test_teardown_after_a_run_never_cancels_someone_elses_update(
    cloud: tuple[FakeCompute, FakeStackRunner, Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    from scripts.targets.gce.target import GceTarget

    _, runner, cli = cloud
    runner.up()
    runner.locked = True  # maybe a live update of another user: not ours to cancel
    spec = parse_spec(load_stack_config(cli.settings.root, "lab"), "lab")
    with pytest.raises(GputrainError, match="teardown of stack lab is incomplete: destroy failed"):
        GceTarget("lab", cli.settings, cli.gce).teardown(spec)
    assert "cancel" not in runner.call_names() and runner.call_names().count("refresh") == 3
    assert "destroy attempt 3 failed" in capsys.readouterr().err


# ---------------------------------------------------------------- the local target


def test_run_local_end_to_end(tmp_path: Path) -> None:
    """The README's main job, as a user runs it: the console script, a fresh directory. The node
    state (its code, environments, checkpoints) stays out of the project, in the user's state
    home, where the printed paths point; runs/ is ignored by git, said once."""
    env = {k: v for k, v in os.environ.items() if k != "GPUTRAIN_NODE_ROOT"}
    env["HOME"] = str(tmp_path / "home")
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
    node_root = Settings(root=tmp_path, runs_dir=tmp_path / "runs").local_node_root
    assert not node_root.is_relative_to(tmp_path)
    node_out = node_root / ".gputrain" / "runs" / run_id / "out"
    assert (tmp_path / "runs" / ".gitignore").read_text() == "*\n"
    assert r.stdout.count("git ignores it") == 1
    assert f"out {node_out}," in r.stdout  # the trainer's banner names where its checkpoints are
    assert list(node_out.glob("ckpt-*.pt"))
    assert not (tmp_path / "home" / ".cache" / "gputrain").exists()
    assert "floor 1.3863)" in r.stdout


def test_local_node_root_is_one_per_results_dir_outside_the_project_or_gputrain_node_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUTRAIN_NODE_ROOT", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    settings = Settings(root=tmp_path / "a", runs_dir=tmp_path / "a" / "runs")
    other = Settings(root=tmp_path / "b", runs_dir=tmp_path / "b" / "runs")
    assert settings.local_node_root.parent == tmp_path / "state" / "gputrain" / "local"
    assert settings.local_node_root.name.startswith("a-")
    assert settings.local_node_root != other.local_node_root  # every checkout its own
    monkeypatch.setenv("GPUTRAIN_NODE_ROOT", str(tmp_path / "elsewhere"))
    assert settings.local_node_root == tmp_path / "elsewhere"


def test_a_local_node_state_dir_that_cannot_be_made_is_one_line_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not mkdir's traceback after the run verified and recorded itself; `results` too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('trained')\n")
    monkeypatch.setenv("GPUTRAIN_NODE_ROOT", str(tmp_path / "train.py"))
    settings = Settings(tmp_path, tmp_path / "runs")
    for argv in (["run", "--local", "--yes", "--", "train.py"], ["results", "--local", "r1"]):
        assert main(argv, settings) == 2
        assert "train.py is not a directory" in _one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "runs").exists()


def test_two_local_runs_at_once_both_succeed(tmp_path: Path) -> None:
    """Each run its own rendezvous port and its own code dir on the shared node root (the second
    with --force: tests/scripts/test_orphans.py shows it refused without)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "ddp_sum.py").write_text((JOBS / "ddp_sum.py").read_text())
    env = {k: v for k, v in os.environ.items() if k != "GPUTRAIN_NODE_ROOT"}
    argv = [str(VENV_BIN / "gputrain"), "run", "--local", "--yes", "--env", "DDP_STEPS=12"]

    def start(steps_s: str, *extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*argv, *extra, "--env", f"DDP_STEP_S={steps_s}", "--", "ddp_sum.py", steps_s],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    first = start("0.2")
    assert first.stdout is not None
    seen = []
    for line in first.stdout:  # the second starts while the first trains
        seen.append(line)
        if "[rank0]:step 1 " in line:
            break
    second = start("0.5", "--force")  # beside a run still training: only when asked
    out_second, _ = second.communicate(timeout=240)
    out_first = "".join(seen) + first.communicate(timeout=240)[0]
    assert first.returncode == 0, out_first[-3000:]
    assert second.returncode == 0, out_second[-3000:]
    ports = {re.search(r"rendezvous on port (\d+)", o).group(1) for o in (out_first, out_second)}  # type: ignore[union-attr]
    assert len(ports) == 2
    local = work / "runs" / "local"
    results = sorted(local.rglob("result-rank0.json"))
    assert [json.loads(p.read_text())["argv"] for p in results] in (
        [["0.2"], ["0.5"]],
        [["0.5"], ["0.2"]],
    )
    assert all(json.loads(p.read_text())["world"] == 1 for p in results)
    # one node root for both runs, outside the project
    node_dot = Settings(root=work, runs_dir=work / "runs").local_node_root / ".gputrain"
    assert not [p.name for p in node_dot.iterdir() if p.name.startswith("code")]  # removed


def test_healthcheck_local_writes_health_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUTRAIN_NODE_ROOT", str(tmp_path / "node"))
    assert main(["healthcheck", "--local"], Settings(tmp_path, tmp_path / "runs")) == 0
    run_id = (tmp_path / "runs" / "local" / "LAST_RUN").read_text().strip()
    [health] = (tmp_path / "runs" / "local" / run_id).rglob("health.json")
    report = json.loads(health.read_text())
    assert report["overall"] == "PASS"
    assert {c["status"] for c in report["checks"]} <= {"PASS", "WARN"} and report["checks"]


def test_second_ctrl_c_during_teardown_is_reported_not_obeyed(
    capsys: pytest.CaptureFixture[str],
) -> None:

    from scripts.targets.base import Interrupted, signal_guard

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


def test_a_teardown_with_a_way_out_stops_waiting_only_at_a_second_ctrl_c_soon(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """teardown.md: a stack's teardown goes on at a Ctrl-C or SIGTERM; a second Ctrl-C within the
    window stops waiting, with what is left said."""
    from scripts.targets import base

    monkeypatch.setattr(base, "STOP_WINDOW_S", 0.3)
    with base.signal_guard() as guard, guard.teardown("what is left, and what ends it"):
        os.kill(os.getpid(), signal.SIGTERM)  # answered, never obeyed
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.6)  # past the window: the next one only offers again
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        with pytest.raises(base.StoppedWaiting) as stopped:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert str(stopped.value) == "stopped waiting: what is left, and what ends it"
    offer = (
        "warning: teardown is in progress and goes on; press Ctrl-C again within 0 s to stop "
        "waiting: what is left, and what ends it"
    )
    assert capsys.readouterr().err.splitlines() == [
        "warning: teardown is in progress and goes on",
        offer,
        offer,
    ]


def test_ctrl_c_on_a_local_run_brings_its_results_home(tmp_path: Path) -> None:
    """teardown.md: results before teardown, on Ctrl-C too (only cost.json, its ledger record and
    report.html came home)."""
    (tmp_path / "job.py").write_text(
        "import time\nprint('training', flush=True)\ntime.sleep(120)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GPUTRAIN_NODE_ROOT"}
    env["HOME"] = str(tmp_path / "home")
    controller = subprocess.Popen(
        [str(VENV_BIN / "gputrain"), "run", "--local", "--yes", "--", "job.py"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert controller.stdout is not None
    seen = []
    for line in controller.stdout:
        seen.append(line)
        if "[rank0]:training" in line:
            controller.send_signal(signal.SIGINT)
            break
    out = "".join(seen) + controller.communicate(timeout=120)[0]
    assert controller.returncode == 130, out[-3000:]
    run_id = (tmp_path / "runs" / "local" / "LAST_RUN").read_text().strip()
    results = tmp_path / "runs" / "local" / run_id
    assert "training" in (results / "local" / "torchrun.log").read_text()
    assert f"run {run_id}: stopped; results in {results}" in out


def test_a_second_ctrl_c_ends_the_download_and_says_where_the_results_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from scripts.job import download
    from scripts.job.records import Job
    from scripts.targets.base import Interrupted, RunOptions, SignalGuard
    from scripts.targets.local import LocalTarget

    def interrupted(*args: object, **kwargs: object) -> dict[str, str]:
        raise Interrupted(signal.SIGINT)

    monkeypatch.setenv("GPUTRAIN_NODE_ROOT", str(tmp_path / "node"))
    monkeypatch.setattr(download, "download_results", interrupted)
    target = LocalTarget(Settings(tmp_path, tmp_path / "runs"))
    results = tmp_path / "runs" / "r1"
    with (
        target.attached(RunOptions()) as session,
        pytest.raises(Interrupted),
        session._launching(Job(run_id="r1"), SignalGuard(), results),
    ):
        raise Interrupted(signal.SIGINT)
    err = capsys.readouterr().err
    assert "the results of local could not be brought home (local: interrupted again)" in err
    assert "`gputrain results r1` with the run's target tries again" in err


def test_the_parser_built_for_one_command_parses_and_helps_as_the_whole_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """main builds only the named command's arguments: that command's help and parse are the
    whole parser's, and `gputrain --help` still lists every command."""
    from scripts.cli import COMMANDS, _parser

    def helped(parser: object, argv: list[str]) -> str:
        with pytest.raises(SystemExit):
            parser.parse_args(argv)  # type: ignore[attr-defined]
        return capsys.readouterr().out

    for name in COMMANDS:
        assert helped(_parser(name), [name, "--help"]) == helped(_parser(), [name, "--help"])
    assert helped(_parser("run"), ["--help"]) == helped(_parser(), ["--help"])
    argv = ["run", "--stack", "dev", "--yes", "--env", "A=1", "--", "-m", "trainer.train"]
    assert vars(_parser("run").parse_args(argv)) == vars(_parser().parse_args(argv))


def test_a_sweep_that_cannot_look_does_not_hide_a_failed_destroy(
    cloud: tuple[FakeCompute, FakeStackRunner, Cli],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Destroy failed and the sweep cannot ask Google: the one line names both."""
    from scripts.targets.gce.target import GceTarget

    _, runner, cli = cloud
    runner.up()
    runner.destroy_failures = 3

    def no_client(*args: object, **kwargs: object) -> list[list[str]]:
        raise GputrainError("cannot build a Compute Engine client (DefaultCredentialsError: x)")

    monkeypatch.setattr(GceTarget, "leftovers", no_client)
    assert cli.main(["down", "--stack", "lab"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]  # after the destroy attempts' warnings
    assert "teardown of stack lab is incomplete: destroy failed" in err
    assert "the sweep could not look for what is left (cannot build a Compute Engine" in err


def test_a_failed_up_is_said_before_what_its_teardown_could_not_do(
    cloud: tuple[FakeCompute, FakeStackRunner, Cli],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`up` fails, then its teardown cannot sweep: Pulumi's error first, then the teardown's."""
    from scripts.targets.gce.target import GceTarget
    from tests.support.pulumi_mocks import TEST_PUBLIC_KEY, TEST_SOURCE_RANGE

    _, runner, cli = cloud
    stack_file = cli.settings.root / "Pulumi.lab.yaml"
    stack_file.write_text(
        stack_file.read_text() + f"  gputrain:sshPublicKey: {TEST_PUBLIC_KEY}\n"
        f"  gputrain:sshSourceRanges: [{TEST_SOURCE_RANGE}]\n"
    )
    runner.fail_other("us-central1-a")

    def no_client(*args: object, **kwargs: object) -> list[list[str]]:
        raise GputrainError("cannot build a Compute Engine client (DefaultCredentialsError: x)")

    monkeypatch.setattr(GceTarget, "leftovers", no_client)
    assert cli.main(["up", "--stack", "lab", "--yes", "--skip-preflight"]) == 1
    err = capsys.readouterr().err
    original, teardown = err.split("; then ", 1)
    assert "could not create the cluster: pulumi up failed" in original
    assert "g2-standard-99" in original and "the sweep could not look" not in original
    assert teardown.startswith("teardown of stack lab is incomplete: the sweep could not look")
