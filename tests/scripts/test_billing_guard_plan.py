"""`plan` with `billingBudget`: the guard and what `up` needs for it, in one line; a bad value
is one line on stderr, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.cli import main
from scripts.settings import Settings
from tests.support import ROOT


def _project(tmp_path: Path, value: str) -> Settings:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.s.yaml").write_text(f"config:\n  gputrain:billingBudget: {value}\n")
    return Settings(root=tmp_path, runs_dir=tmp_path / "runs")


def test_plan_says_what_the_guard_does_and_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _project(tmp_path, "{account: 012345-6789AB-CDEF01, usd: 400}")
    assert main(["plan", "--stack", "s"], settings) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "Billing budget guard" in x)
    assert "$400.00 on billing account 012345-6789AB-CDEF01 for the label gputrain-stack=s" in line
    assert "Pub/Sub topic gputrain-s-budget" in line
    assert "Billing Account Costs Manager or Administrator" in line
    assert "billing.budgets.create" in line and "roles/pubsub.admin" in line


def test_plan_without_the_guard_says_nothing_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.s.yaml").write_text("config: {}\n")
    assert main(["plan", "--stack", "s"], Settings(root=tmp_path, runs_dir=tmp_path / "r")) == 0
    assert "Billing budget guard" not in capsys.readouterr().out


def test_a_bad_guard_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = _project(tmp_path, "{account: my-account, usd: 400}")
    assert main(["plan", "--stack", "s"], settings) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gputrain:billingBudget.account 'my-account'" in err[0], err


def test_the_heads_watchdog_is_told_the_guards_subscription() -> None:
    import json

    from infra.spec import parse_spec
    from scripts.job.autodown import Autodown
    from scripts.targets.gce.autodown import guard_subscription
    from tests.support.pulumi_mocks import deployable_config

    guarded = parse_spec(
        deployable_config("dev", billingBudget='{"account": "012345-6789AB-CDEF01", "usd": 9}'),
        "dev",
    )
    sub = guard_subscription(guarded, "my-proj")
    assert sub == "projects/my-proj/subscriptions/gputrain-dev-budget"
    assert guard_subscription(parse_spec(deployable_config("dev"), "dev"), "my-proj") is None
    plan = Autodown("dev", "my-proj", "gs://b/", (("n1", "z"), ("n0", "z")), 600.0, guard=sub)
    assert json.loads(plan.config("r1", "n0", {}))["guard"] == sub
