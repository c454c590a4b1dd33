"""scripts/targets/stack/clients.py: the Automation API adapter through Seam A (a fake PulumiCommand
that records the argv the SDK sends) and the error mapping; and FakeStackRunner against the
production readers (the stack outputs contract itself: tests/infra/test_outputs.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pulumi.automation import CommandResult, PulumiCommand
from pulumi.automation._cmd import VersionInfo

from infra.outputs import parse_stack_outputs
from scripts.targets.stack.clients import (
    PulumiStackRunner,
    StackError,
    StackLockedError,
    summarise_pulumi_error,
)
from tests.support.fake_stack import sample_outputs, stockout_text

HISTORY = [
    {
        "kind": "update",
        "startTime": "2026-04-20T10:00:00.000Z",
        "endTime": "2026-04-20T10:04:00.000Z",
        "message": "",
        "environment": {},
        "config": {},
        "result": "succeeded",
        "resourceChanges": {"create": 5},
    }
]


class FakePulumi(PulumiCommand):
    """Stands in for the Pulumi CLI binary: records argv, answers like the CLI would."""

    def __init__(self, outputs: dict[str, Any], fail: dict[str, CommandResult] | None = None):
        self.command = "pulumi"
        self.version = VersionInfo.parse("3.272.0")
        self.calls: list[list[str]] = []
        self.envs: list[dict[str, str]] = []  # each call's environment beyond gputrain's own
        self.outputs = outputs
        self.fail = fail or {}

    def run(
        self,
        args: list[str],
        cwd: str,
        additional_env: Any,
        on_output: Any = None,
        on_error: Any = None,
    ) -> CommandResult:
        from pulumi.automation.errors import create_command_error

        argv = [a for a in args if a != "--non-interactive"]
        self.calls.append(argv)
        self.envs.append(dict(additional_env))
        self.cwd = cwd
        verb = argv[0] if argv[0] not in ("stack", "config") else " ".join(argv[:2])
        if verb in self.fail:
            raise create_command_error(self.fail[verb])
        if verb == "up" and on_output:
            for line in ("Updating (dev)", " +  gcp:compute:Instance dev-node-0 created (41s)"):
                on_output(line)
        if verb == "stack output":
            return CommandResult(json.dumps(self.outputs), "", 0)
        if verb == "stack history":
            return CommandResult(json.dumps(HISTORY), "", 0)
        return CommandResult("", "", 0)


@pytest.fixture
def work_dir(tmp_path: Path) -> Path:
    (tmp_path / "Pulumi.yaml").write_text("name: gputrain\nruntime: python\n")
    return tmp_path


def test_up_sends_the_expected_argv_and_parses_outputs(work_dir: Path) -> None:
    outputs = sample_outputs("dev", "us-central1-b", nodes=2)
    cli = FakePulumi(outputs)
    runner = PulumiStackRunner("dev", work_dir, pulumi_command=cli)
    runner.set_config("gputrain:zone", "us-central1-b")
    lines: list[str] = []
    got = runner.up(lines.append)
    assert cli.calls[:3] == [
        ["stack", "select", "--stack", "dev"],
        ["config", "set", "gputrain:zone", "--plaintext", "--stack", "dev", "--", "us-central1-b"],
        [
            "up",
            "--yes",
            "--skip-preview",
            "--color",
            "never",
            "--exec-kind",
            "auto.local",
            "--stack",
            "dev",
        ],
    ]
    assert Path(cli.cwd) == work_dir
    assert lines[0] == "Updating (dev)"
    assert got == outputs
    parsed = parse_stack_outputs(got)
    assert [n.name for n in parsed.nodes] == ["dev-node-0", "dev-node-1"]
    assert parsed.zone == "us-central1-b" and parsed.head.external_ip is not None


FAKE_PULUMI_CLI = """#!/bin/sh
# A stand-in for the Pulumi CLI: records argv and stdin of every call, answers like the CLI.
stdin=$(if [ -t 0 ]; then :; else cat; fi)
"__PY__" -c 'import json, sys; print(json.dumps({"argv": sys.argv[2:], "stdin": sys.argv[1]}))' "$stdin" "$@" >> "__LOG__"
case "$1" in version) echo "v3.272.0";; esac
exit 0
"""


@pytest.fixture
def pulumi_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `pulumi` first on PATH; returns the JSON-lines log of its calls."""
    import sys

    bin_dir, log = tmp_path / "fake-bin", tmp_path / "pulumi-calls.jsonl"
    bin_dir.mkdir()
    script = bin_dir / "pulumi"
    script.write_text(
        FAKE_PULUMI_CLI.replace("__PY__", sys.executable).replace("__LOG__", str(log))
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def _calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_secret_config_goes_through_stdin_never_argv(work_dir: Path, pulumi_cli: Path) -> None:
    cli = FakePulumi({})
    cli.command = str(pulumi_cli.parent / "fake-bin" / "pulumi")
    runner = PulumiStackRunner("dev", work_dir, pulumi_command=cli)
    runner.set_config("gputrain:sshPrivateKey", "-----BEGIN\nsecret body\n", secret=True)
    runner.destroy()
    runner.refresh()
    assert not any("secret body" in " ".join(c) for c in cli.calls)
    [call] = _calls(pulumi_cli)
    assert call == {
        "argv": [
            "config",
            "set",
            "gputrain:sshPrivateKey",
            "--secret",
            "--stack",
            "dev",
            "--non-interactive",
        ],
        "stdin": "-----BEGIN\nsecret body",  # $(cat) drops the final newline, as the CLI does
    }
    verbs = [c[0] for c in cli.calls]
    assert "destroy" in verbs and "refresh" in verbs
    assert cli.calls.count(["stack", "select", "--stack", "dev"]) == 1  # selected once


def test_keygen_never_puts_the_private_key_on_a_command_line(
    work_dir: Path, pulumi_cli: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real adapter and the real Automation API against a fake CLI: every process keygen
    starts is recorded with its argv and stdin."""
    from scripts.cli import main
    from scripts.settings import Settings
    from tests.support.pulumi_mocks import ROOT

    (work_dir / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (work_dir / "Pulumi.dev.yaml").write_text("config:\n  gcp:project: gputrain-test\n")
    settings = Settings(root=work_dir, runs_dir=work_dir / "runs")
    assert main(["keygen", "--stack", "dev"], settings) == 0
    calls = _calls(pulumi_cli)
    [secret] = [c for c in calls if "gputrain:sshPrivateKey" in c["argv"]]
    private = secret["stdin"]
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    body = [ln for ln in private.splitlines() if ln and not ln.startswith("-----")]
    for c in calls:
        argv = " ".join(c["argv"])
        assert "PRIVATE KEY" not in argv and not any(ln in argv for ln in body), c["argv"]
    [public] = [c for c in calls if "gputrain:sshPublicKey" in c["argv"]]
    assert public["argv"][-1].startswith("ssh-ed25519 ") and "--plaintext" in public["argv"]
    assert "PRIVATE KEY" not in capsys.readouterr().out


def test_an_ups_env_reaches_that_up_alone(work_dir: Path) -> None:
    """A recovery's run deadline goes to its `up` (whose program reads it) and the reads the
    SDK makes inside it, never to the commands after it, a failed `up` included."""
    key = "GPUTRAIN_RECREATE_DEADLINE"
    cli = FakePulumi(sample_outputs("dev", "us-central1-b", nodes=2))
    runner = PulumiStackRunner("dev", work_dir, pulumi_command=cli)
    runner.up(env={key: "1767225600.0"})
    first = len(cli.calls)
    runner.outputs()
    runner.up()
    cli.fail = {"up": CommandResult("", "error: update failed", 255)}
    with pytest.raises(StackError):
        runner.up(env={key: "1767225601.0"})
    runner.refresh()
    seen = [(c[0], e.get(key)) for c, e in zip(cli.calls, cli.envs, strict=True)]
    assert ("up", "1767225600.0") in seen[:first]
    assert [s for s in seen[first:] if s[1] is not None] == [("up", "1767225601.0")]
    assert {("refresh", None), ("up", None)} <= set(seen[first:])


def test_failed_up_keeps_the_raw_text_and_summarises_the_gce_message(work_dir: Path) -> None:
    stderr = stockout_text("p", "us-central1-b", "dev-node-0", ("us-central1-a",))
    cli = FakePulumi({}, fail={"up": CommandResult("Updating (dev)", stderr, 255)})
    runner = PulumiStackRunner("dev", work_dir, pulumi_command=cli)
    with pytest.raises(StackError) as err:
        runner.up()
    assert "zonesAvailable" in err.value.raw
    msg = str(err.value)
    assert msg.startswith("pulumi up failed for stack dev: ")
    assert "does not have enough resources available" in msg and "\n" not in msg


def test_lock_conflict_says_when_to_cancel(work_dir: Path) -> None:
    locked = CommandResult(
        "", "error: [409] Conflict: Another update is currently in progress.", 255
    )
    cli = FakePulumi({}, fail={"up": locked})
    runner = PulumiStackRunner("dev", work_dir, pulumi_command=cli)
    with pytest.raises(
        StackLockedError, match=r"Only if our own process died.*gputrain down --stack dev"
    ):
        runner.up()


def test_missing_config_is_none(work_dir: Path) -> None:
    missing = CommandResult(
        "", "error: configuration key 'gputrain:zone' not found for stack 'dev'", 255
    )
    cli = FakePulumi({}, fail={"config get": missing})
    runner = PulumiStackRunner("dev", work_dir, pulumi_command=cli)
    assert runner.get_config("gputrain:zone") is None


def test_summarise_prefers_the_gce_line() -> None:
    text = "error: update failed\n  * googleapi: Error 403: Quota 'X' exceeded.  Limit: 0.0 in region r., quotaExceeded"
    assert summarise_pulumi_error(text).startswith("Quota 'X' exceeded.")
    assert (
        summarise_pulumi_error("error: update failed\nerror: program crashed")
        == "error: program crashed"
    )
    assert summarise_pulumi_error("") == "(no output)"


# ---- FakeStackRunner: the GCP side end to end (what the lifecycle tests build on) -------------------


def test_fake_runner_up_host_keys_fleet_destroy_sweep() -> None:
    from infra.gcp.compute import ComputeApi, fetch_host_keys
    from infra.gcp.sweep import sweep
    from tests.support.fake_compute import FakeCompute, ssh_host_keys
    from tests.support.fake_stack import FakeStackRunner, sample_nodes

    testbed_keys = {f"dev-node-{i}": ssh_host_keys() for i in range(2)}

    def factory(zone: str) -> list[dict[str, Any]]:
        nodes = sample_nodes("dev", zone, 2)
        for n in nodes:  # known_hosts-style lines, as a test bed would hand them over
            n["hostKeys"] = [f"{t} {b}" for t, b in testbed_keys[n["name"]].items()]
        return nodes

    with FakeCompute() as fake:
        api = ComputeApi(fake.url)
        runner = FakeStackRunner(
            "dev",
            node_factory=factory,
            compute=fake,
            project=fake.project,
            zones=("us-east1-c",),
            host_keys_publish_after=1,
        )
        runner.set_config("gputrain:sshPrivateKey", "-----BEGIN OPENSSH", secret=True)
        assert runner.get_config("gputrain:sshPrivateKey") == "-----BEGIN OPENSSH"
        outputs = parse_stack_outputs(runner.up())
        assert outputs.zone == "us-east1-c" and "hostKeys" not in runner.outputs()["nodes"][0]
        assert all(n.instance_id for n in outputs.nodes)
        pins = {
            n.name: fetch_host_keys(
                fake.project, n.zone, n.name, deadline_s=5, poll_s=0.01, api=api
            )
            for n in outputs.nodes
        }
        assert set(pins["dev-node-1"]) == {
            f"{t} {b}" for t, b in testbed_keys["dev-node-1"].items()
        }
        fleet = outputs.to_fleet("dev", pins, identity_file=None)
        assert [n.host_keys for n in fleet.nodes] == [pins["dev-node-0"], pins["dev-node-1"]]
        # 2 VMs, 2 disks, net, subnet, 2 firewalls, the service account and its 2 role bindings
        assert len(sweep(fake.project, "dev", api=api)) == 11

        runner.leak_on_destroy = {"dev-node-1"}
        runner.destroy()
        left = sweep(fake.project, "dev", api=api)
        assert {(x.kind, x.name) for x in left} == {
            ("instance", "dev-node-1"),
            ("disk", "dev-node-1"),
        }
        assert runner.outputs() == {} and runner.existing == []
        assert ("set_config", "gputrain:sshPrivateKey", "[secret]") in runner.calls
        assert runner.call_names() == [
            "set_config",
            "get_config",
            "up",
            "outputs",
            "destroy",
            "outputs",
        ]


def test_fake_runner_refresh_forgets_vms_the_ttl_deleted() -> None:
    from tests.support.fake_compute import FakeCompute
    from tests.support.fake_stack import FakeStackRunner

    with FakeCompute() as fake:
        runner = FakeStackRunner("dev", compute=fake, project=fake.project)
        runner.up()
        fake.remove_instance("dev-node-1", "us-central1-a")  # maxRunDuration fired
        runner.refresh()
        assert runner.existing == ["dev-node-0"]
        runner.destroy_failures = 1
        with pytest.raises(StackError, match="destroy failed"):
            runner.destroy()
        runner.destroy()
        assert runner.existing == [] and not fake.instances


def test_destroy_keeping_a_type_names_every_other_resource(work_dir: Path) -> None:
    """`down --keep-bucket` through the real adapter: the state is exported, and destroy targets
    every resource but the bucket and the components above it."""
    stack_urn = "urn:pulumi:dev::gputrain::pulumi:pulumi:Stack::gputrain-dev"
    bucket = f"{stack_urn.rsplit('::', 2)[0]}::gcp:storage/bucket:Bucket::b"
    vm = f"{stack_urn.rsplit('::', 2)[0]}::gcp:compute/instance:Instance::dev-node-0"
    state = {
        "version": 3,
        "deployment": {
            "resources": [
                {"urn": stack_urn, "type": "pulumi:pulumi:Stack"},
                {"urn": bucket, "type": "gcp:storage/bucket:Bucket", "parent": stack_urn},
                {"urn": vm, "type": "gcp:compute/instance:Instance", "parent": stack_urn},
            ]
        },
    }

    class Exporting(FakePulumi):
        def run(self, args: list[str], *rest: Any, **kw: Any) -> CommandResult:
            if args[:2] == ["stack", "export"]:
                self.calls.append(args)
                return CommandResult(json.dumps(state), "", 0)
            return super().run(args, *rest, **kw)

    cli = Exporting({})
    PulumiStackRunner("dev", work_dir, pulumi_command=cli).destroy(
        lambda line: None, keep=["gcp:storage/bucket:Bucket"]
    )
    [destroy] = [c for c in cli.calls if c[0] == "destroy"]
    assert [destroy[i + 1] for i, a in enumerate(destroy) if a == "--target"] == [vm]
    assert not [a for a in destroy if a.startswith("--parallel")]  # on_output is no parallelism


# ---- a Pulumi CLI that does not work, a stack that does not exist: the real adapter + a fake CLI


def _fake_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """A `pulumi` shell script first on PATH running `body`; returns the log of its argv."""
    bin_dir, log = tmp_path / "broken-bin", tmp_path / "broken-calls.log"
    bin_dir.mkdir()
    script = bin_dir / "pulumi"
    script.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n{body}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    log.touch()
    return log


def _project(work_dir: Path) -> Any:
    from scripts.settings import Settings
    from tests.support.pulumi_mocks import ROOT

    (work_dir / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (work_dir / "Pulumi.dev.yaml").write_text("config:\n  gcp:project: gputrain-test\n")
    return Settings(root=work_dir, runs_dir=work_dir / "runs")


NO_STACK = """case "$1" in version) echo v3.272.0; exit 0;; esac
case "$*" in *"stack select"*) echo "error: no stack named 'dev' found" >&2; exit 255;; esac
echo '{}'"""


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ('echo "pulumi: cannot load libc" >&2; exit 1', "exit 1: pulumi: cannot load libc"),
        ("echo 'not a version'", "not a version: Could not parse the Pulumi CLI version"),
    ],
)
@pytest.mark.parametrize("command", ["keygen", "logs", "stop X"])
def test_a_broken_cli_is_one_line_with_exit_2(
    work_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    body: str,
    said: str,
    command: str,
) -> None:
    from scripts.cli import main

    settings = _project(work_dir)
    _fake_cli(tmp_path, monkeypatch, body)
    assert main([*command.split(), "--stack", "dev"], settings) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert f"does not work (`pulumi version`: {said})" in line, line


def test_a_hanging_cli_is_one_line_not_a_hang(
    work_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scripts.targets.stack import clients

    monkeypatch.setattr(clients, "PULUMI_VERSION_TIMEOUT_S", 0.5)
    _fake_cli(tmp_path, monkeypatch, "exec sleep 30")
    with pytest.raises(clients.PulumiMissingError, match=r"`pulumi version`: no answer in 0s"):
        PulumiStackRunner("dev", work_dir).outputs()


def test_down_stops_at_a_broken_cli_without_retrying(
    work_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scripts.targets.stack.teardown import destroy_stack

    log = _fake_cli(tmp_path, monkeypatch, "exit 1")  # a pause of an hour would fail the run
    failure = destroy_stack(PulumiStackRunner("dev", work_dir), "dev", attempts=3, pause_s=3600)
    assert failure is not None and "does not work (`pulumi version`: exit 1" in failure.reason
    assert log.read_text().splitlines() == ["version"]  # the sweep after it still looks


def test_a_read_never_creates_the_stack(
    work_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from scripts.cli import main

    settings = _project(work_dir)
    log = _fake_cli(tmp_path, monkeypatch, NO_STACK)
    for command in (["logs"], ["ssh", "0"]):
        assert main([command[0], "--stack", "dev", *command[1:]], settings) == 2, command
        err = capsys.readouterr().err.splitlines()
        assert err[-1] == "gputrain: error: stack dev has no cluster; run `gputrain up --stack dev`"
    main(["down", "--stack", "dev"], settings)  # nothing to destroy; the sweep still looks
    out, err = capsys.readouterr()
    assert "down: stack dev has no Pulumi state: nothing to destroy" in out
    assert "the sweep could not look for what is left" in err  # no credentials here
    assert not [c for c in log.read_text().splitlines() if "init" in c]
    assert main(["keygen", "--stack", "dev"], settings) == 0  # a write makes the stack
    assert "--non-interactive stack init dev" in log.read_text().splitlines()


def test_keygen_without_a_passphrase_stores_nothing(
    work_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from scripts.cli import main

    settings = _project(work_dir)
    log = _fake_cli(
        tmp_path,
        monkeypatch,
        """case "$1" in version) echo v3.272.0; exit 0;; esac
case "$*" in *--secret*) echo "error: constructing secrets manager of type \\"passphrase\\": \
unable to find either PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE" >&2; exit 255;; esac""",
    )
    assert main(["keygen", "--stack", "dev"], settings) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "needs PULUMI_CONFIG_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE_FILE) set" in line
    assert not [c for c in log.read_text().splitlines() if "sshPublicKey" in c]
