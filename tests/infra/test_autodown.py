"""Autodown's setting, the bound `plan` states, the IAM condition on the nodes' delete right (the
program under the SDK's mocks), and the CLI's one-line answers to bad or contradictory flags."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest

from infra.autodown import instance_condition, plan_line
from infra.keys import parse_autodown
from infra.plan import build_plan
from infra.spec import parse_spec
from infra.stackfile import SpecError, load_stack_config
from scripts.cli import main
from scripts.job.autodown import autodown_line, instances_of
from scripts.run_plan import resolve_autodown
from scripts.settings import Settings
from tests.support.pulumi_mocks import IAM_MEMBER, GcpMocks, deployable_config, pulumi_mocks

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "seconds"), [("10m", 600), ("1m", 60), ("1h30m", 5400), ("off", None), ("OFF", None)]
)
def test_autodown_takes_durations_of_a_minute_or_more_or_off(
    text: str, seconds: int | None
) -> None:
    assert parse_autodown(text) == seconds


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("30s", "below 1m"),
        ("59s", "below 1m"),
        ("ten", "allowed"),
        ("", "allowed"),
        ("-5m", "allowed"),
    ],
)
def test_a_bad_autodown_is_one_line_naming_the_key(text: str, why: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_autodown(text)
    message = str(e.value)
    assert message.startswith(f"gputrain:autodown {text!r}: ") and why in message
    assert "allowed: off or a duration of at least 1m" in message and "\n" not in message


def test_the_stack_key_is_validated_before_anything_is_declared() -> None:
    with pytest.raises(SpecError, match=r"^gputrain:autodown '30s': below 1m"):
        parse_spec(deployable_config("dev", autodown="30s"), "dev")
    assert parse_spec(deployable_config("dev"), "dev").autodown_s == 600  # the default
    assert parse_spec(deployable_config("dev", autodown="off"), "dev").autodown_s is None


def test_plan_states_the_bound_and_the_detached_spot_rule() -> None:
    spec = parse_spec(deployable_config("dev"), "dev")
    lines = build_plan(spec).footer_lines()
    [line] = [ln for ln in lines if ln.startswith("if this machine goes away")]
    assert "VMs deleted <= 10m after the job ends (autodown)" in line
    assert f"the TTL ({spec.max_run_duration}) bounds a job that never ends" in line
    assert "gputrain train --stack STACK --resume RUN" in line
    off = build_plan(dataclasses.replace(spec, autodown_s=None)).footer_lines()
    assert any("autodown is off" in ln for ln in off)
    vertex = parse_spec(load_stack_config(ROOT, "vertex") | {"gcp:project": "p-123456"}, "vertex")
    assert not any("goes away" in ln for ln in build_plan(vertex).footer_lines())
    assert plan_line(None, "3h").endswith("or `gputrain down`")


def test_the_condition_names_only_the_stacks_instances_and_their_disks() -> None:
    expr = instance_condition("proj-1", "dev")
    assert expr.startswith('resource.name.startsWith("projects/proj-1/zones/") && (')
    assert 'extract("/instances/{name}").startsWith("dev-node-")' in expr
    assert 'extract("/disks/{name}").startsWith("dev-node-")' in expr


@pytest.fixture
def mocks() -> Iterator[GcpMocks]:
    with pulumi_mocks(load_stack_config(ROOT, "dev")) as m:
        yield m


@pulumi.runtime.test
def test_without_autodown_the_nodes_may_delete_nothing(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = parse_spec(deployable_config("dev", autodown="off"), "dev")
    cluster = GpuCluster(spec.stack, spec)

    def check(_: object) -> None:
        bindings = [r.inputs for r in mocks.of_type(IAM_MEMBER)]
        assert bindings and not any("condition" in b for b in bindings)
        assert {b["role"] for b in bindings} == {
            "roles/logging.logWriter",
            "roles/monitoring.metricWriter",
        }

    return pulumi.Output.all(**cluster.exports()).apply(check)


def test_the_command_chooses_its_autodown() -> None:
    assert resolve_autodown(600, keep=False, flag=None) == 600
    assert resolve_autodown(600, keep=False, flag="1h") == 3600
    assert resolve_autodown(None, keep=False, flag="2m") == 120
    assert resolve_autodown(600, keep=True, flag=None) is None  # --keep: the cluster stays
    assert instances_of([("d-node-0", "z", "head"), ("d-node-1", "z", "worker")]) == (
        ("d-node-1", "z"),
        ("d-node-0", "z"),
    )
    line = autodown_line({"stack": "dev", "run_id": "r1", "job_ended_at": 0.0, "deleted_at": 60.0})
    assert line.startswith("VMs deleted by autodown at ") and " after the job ended at " in line
    assert "(run r1)" in line and "gputrain down --stack dev" in line
    stop = {"budget_usd": 2.04, "spent_usd": 2.011, "at": 50.0}
    line = autodown_line({"stack": "dev", "run_id": "r1", "deleted_at": 60.0, "budget": stop})
    assert "(run r1, stopped at its budget: $2.01 of $2.04)" in line


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "--stack", "dev", "--autodown", "30s"], "--autodown '30s': below 1m"),
        (["train", "--stack", "dev", "--autodown", "soon"], "--autodown 'soon': allowed: off or"),
        (["run", "--stack", "dev", "--autodown", "10m", "--keep"], "--autodown 10m with --keep"),
        (["run", "--local", "--autodown", "10m"], "--autodown 10m: only --stack targets"),
    ],
)
def test_bad_or_contradictory_flags_are_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    rc = main(argv, settings=Settings(root=tmp_path, runs_dir=tmp_path / "runs"))
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and err[0].startswith("gputrain: error: ")
    assert needle in err[0], err


def test_detach_with_keep_says_keep_wins(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from scripts import cli_options

    cli_options.check_run_flags(
        argparse.Namespace(stack="dev", autodown=None, detach=True, keep=True)
    )
    out = capsys.readouterr()
    said = (out.out + out.err).strip().splitlines()
    assert len(said) == 1 and "--detach with --keep: --keep wins" in said[0], said


def test_autodown_on_a_vertex_stack_is_one_line_before_anything_is_created(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for name in ("Pulumi.yaml", "Pulumi.vertex.yaml"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert (
        main(["run", "--stack", "vertex", "--yes", "--detach", "--autodown", "5m"], settings) == 2
    )
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [
        "gputrain: error: --autodown 5m: stack vertex runs on Vertex AI: a job's replicas end "
        "with it, nothing to delete"
    ]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("autodown", "ttl"), [("7h", "3h"), ("3h", "3h"), ("1d", "6h")])
def test_an_autodown_the_ttl_always_beats_is_refused_not_promised(autodown: str, ttl: str) -> None:
    config = deployable_config("dev") | {
        "gputrain:autodown": autodown,
        "gputrain:maxRunDuration": ttl,
    }
    with pytest.raises(SpecError) as e:
        parse_spec(config, "dev")
    message = str(e.value)
    assert message.startswith(f"gputrain:autodown {autodown!r}: not below gputrain:maxRunDuration")
    assert f"below {ttl}" in message and "\n" not in message


def test_an_autodown_below_the_ttl_is_kept() -> None:
    config = deployable_config("dev") | {"gputrain:autodown": "2h", "gputrain:maxRunDuration": "3h"}
    assert parse_spec(config, "dev").autodown_s == 7200


def _stack_file_spec(tmp_path: Path, body: str) -> Any:
    from infra.spec import stack_file_spec
    from infra.stackfile import read_stack_file

    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.s.yaml").write_text("config:\n  gputrain:maxRunDuration: 10m\n" + body)
    return stack_file_spec(read_stack_file(tmp_path, "s"))


@pytest.mark.parametrize("autodown", ["10m", "600s", "11m"])
def test_an_autodown_the_stack_sets_meets_the_ttl_however_it_is_spelt(
    tmp_path: Path, autodown: str
) -> None:
    """10m and 600s are one length: both are refused beside a 10m TTL (the text was compared
    with the default's, so `10m` passed and `600s` did not)."""
    with pytest.raises(SpecError) as e:
        _stack_file_spec(tmp_path, f"  gputrain:autodown: {autodown}\n")
    assert str(e.value).startswith(f"gputrain:autodown {autodown!r}: not below gputrain:maxRun")


def test_the_default_autodown_is_not_held_to_a_short_ttl(tmp_path: Path) -> None:
    """Unset, the default 10m stands beside a 10m TTL, in the file and in the program's strings
    (which carry Pulumi.yaml's defaults, so a value equal to the default reads as unset)."""
    assert _stack_file_spec(tmp_path, "").autodown_s == 600
    config = deployable_config("dev", maxRunDuration="10m")
    assert config["gputrain:autodown"] == "10m" and parse_spec(config, "dev").autodown_s == 600
    with pytest.raises(SpecError, match=r"^gputrain:autodown '600s': not below"):
        parse_spec(deployable_config("dev", maxRunDuration="10m", autodown="600s"), "dev")
