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


def test_a_vertex_stack_has_no_guard() -> None:
    """backend gce only: a Vertex job has no head watchdog to read the notifications."""
    from infra.spec import parse_spec
    from infra.stackfile import load_stack_config

    cfg = load_stack_config(ROOT, "vertex")
    cfg["gputrain:billingBudget"] = '{"account": "012345-6789AB-CDEF01", "usd": 9}'
    assert parse_spec(cfg, "vertex").billing_budget is None


def test_the_controller_and_status_name_the_guard(tmp_path: Path) -> None:
    """The guard's mark (watch/budget.json with `by`) is a budget stop named as the guard's."""
    import json

    from gputrain_node import contract
    from scripts.job.autodown import autodown_line, budget_reached
    from scripts.job.records import JobResult, NodeFailure, TrainingError

    stop = {"spent_usd": 5.25, "budget_usd": 5.0, "by": contract.GUARD_STOP, "at": 1.0}
    line = autodown_line({"stack": "dev", "run_id": "r1", "deleted_at": 60.0, "budget": stop})
    assert "(run r1, stopped at the stack's Cloud Billing budget: $5.25 of $5.00)" in line
    mark = tmp_path / "n0" / contract.BUDGET_MARK
    mark.parent.mkdir(parents=True)
    mark.write_text(json.dumps(stop))
    result = JobResult("r1", False, {"n0": 143}, 9.0, tmp_path)
    error = TrainingError("x", failure=NodeFailure("n0", "exited", 143, ()), result=result)
    reached = budget_reached(error, "n0", None, since=0.5)
    assert reached is not None and reached.what == "the stack's Cloud Billing budget"
    assert str(reached).startswith("run r1 stopped at the stack's Cloud Billing budget: $5.25")
    mark.write_text(json.dumps({"spent_usd": 2.0, "budget_usd": 2.04, "at": 1.0}))
    own = budget_reached(error, "n0", None, since=0.5)
    assert own is not None and own.what == "the budget"
    assert str(own).startswith("run r1 stopped at the budget: $2.00 of $2.04")


def test_arming_puts_the_guard_beside_the_heads_watchdog_only() -> None:
    """arm(): the guard's reader goes to the head with the watchdog (it imports it from its own
    directory); the workers get the watchdog alone; without a guard no node gets it."""
    from types import SimpleNamespace

    from scripts.job.autodown import GUARD_SOURCE, WATCHDOG_FILE, Autodown, arm
    from scripts.transport.base import CommandResult

    class Recording:
        def __init__(self) -> None:
            self.files: list[str] = []

        def run(self, cmd: str, timeout: float, stdin: bytes | None = None) -> CommandResult:
            if "cat > " in cmd:
                self.files.append(cmd.rsplit("/", 1)[-1])
            return CommandResult(0, "4242\n" if "watchdog.pid" in cmd else "", "")

    fleet = SimpleNamespace(python="python3", head=SimpleNamespace(name="n0"))
    nodes = (("n1", "z"), ("n0", "z"))
    for guard, head_files in (
        ("projects/p/subscriptions/gputrain-s-budget", [WATCHDOG_FILE, GUARD_SOURCE.name]),
        (None, [WATCHDOG_FILE]),
    ):
        transports = {"n0": Recording(), "n1": Recording()}
        plan = Autodown("s", "p", "gs://b/", nodes, None, guard=guard)
        arm(fleet, transports, plan, "r1", {})  # type: ignore[arg-type]
        assert transports["n0"].files == head_files
        assert transports["n1"].files == [WATCHDOG_FILE]
