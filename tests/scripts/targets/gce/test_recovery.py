"""The parts of spot recovery that need no test bed: how a preemption is recognised (through the
real Compute client and the fake server's operations), the log lines it reads, the one line it
prints, the summary rows, the --max-recoveries rule, and installing google-cloud-storage on a node
(the real shell, with a stub interpreter)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from infra.base.errors import GputrainError, UserError
from infra.gcp.compute import ComputeApi
from infra.outputs import StackOutputs, parse_bucket, parse_stack_outputs
from infra.spec import parse_spec
from scripts.cli import main
from scripts.job.node_scripts import STORAGE_PACKAGES, TRAINER_PACKAGES, build_install_command
from scripts.job.records import JobResult, NodeFailure, Recovery, TrainingError
from scripts.lifecycle import recovery_rows, summarize
from scripts.settings import Settings
from scripts.targets.base import RunOptions
from scripts.targets.gce.recovery import (
    NodeCloudState,
    RecoveringSession,
    StackNodes,
    checkpoint_uri,
    looks_stopped,
    preempted_nodes,
    recovery_line,
)
from scripts.targets.gce.target import recoveries_allowed
from scripts.transport.local import LocalTransport
from scripts.watch.telemetry import StepWatch
from tests.support import ROOT
from tests.support.fake_compute import FakeCompute
from tests.support.fake_stack import FakeStackRunner, sample_outputs
from tests.support.pulumi_mocks import deployable_config

ZONE = "us-central1-a"


def test_what_counts_as_preempted() -> None:
    states = [
        NodeCloudState("op", "RUNNING", "2026-11-23T10:00:00Z"),
        NodeCloudState("stopping", "STOPPING", None),
        NodeCloudState("terminated", "TERMINATED", None),
        NodeCloudState("gone", None, None),
        NodeCloudState("running", "RUNNING", None),
    ]
    found = preempted_nodes(states, ttl_over=False)
    assert sorted(found) == ["gone", "op", "stopping", "terminated"]
    assert found["op"].evidence == "compute.instances.preempted at 2026-11-23T10:00:00Z"
    assert found["gone"].evidence == "instance deleted"
    # At the end of maxRunDuration GCE deletes the VMs on purpose: only an operation counts.
    assert sorted(preempted_nodes(states, ttl_over=True)) == ["op"]


def _error(kind: str, code: int | None, root: tuple[str, ...] = ("boom",)) -> TrainingError:
    failure = NodeFailure("n1", kind, code, root)  # type: ignore[arg-type]
    result = JobResult("r", False, {"n0": 1, "n1": code}, 1.0, Path("."))
    return TrainingError("failed", failure=failure, result=result)


def test_a_stopped_looking_failure_is_worth_waiting_for_the_api() -> None:
    assert looks_stopped(_error("killed", None))
    assert looks_stopped(_error("lost", None))
    stopped = "[rank0]:preemption notice (metadata server): stopped at step 40 with a checkpoint"
    assert looks_stopped(_error("exited", 1, (stopped,)))
    assert not looks_stopped(_error("exited", 1, ("ValueError: nan loss",)))


def test_stack_nodes_read_the_compute_api() -> None:
    out = parse_stack_outputs(sample_outputs("dev", ZONE, nodes=2))
    with FakeCompute() as fake:
        for n in out.nodes:
            fake.add_instance(n.name, ZONE)
        fake.preempt_instance("dev-node-0", ZONE, delete_after_s=60)  # an earlier incarnation
        since = time.time() + 10  # this attempt began after it
        slept: list[float] = []
        nodes = StackNodes(
            ComputeApi(fake.url),
            out,
            spot=True,
            ttl_s=3600,
            recreate=lambda _cluster, _gone: (None, out),  # type: ignore[arg-type,return-value]
            sleep=slept.append,
        )
        assert nodes.states(since - 60)[0].preempted_at  # seen when asked about that time
        # The old operation is not this attempt's; the STOPPING instance still counts.
        found = nodes.preempted(since, wait_s=0)
        assert list(found) == ["dev-node-0"] and found["dev-node-0"].preempted_at is None
        fake.remove_instance("dev-node-0", ZONE)
        fake.add_instance("dev-node-0", ZONE)  # re-created: running again
        assert nodes.preempted(since, wait_s=0) == {} and slept == []
        assert nodes.job_env("r1") == {  # no bucket output
            "GPUTRAIN_WATCH_PREEMPTION": "1",
            "GPUTRAIN_WATCH_MAINTENANCE": "1",
        }


def test_a_stack_runs_cost_record_starts_where_its_budget_and_watchdog_record_do(
    tmp_path: Path,
) -> None:
    """The session bills from its nodes' start (after `up`), the start the head's budget and
    its cost record of a detached segment count from: the controller's record and the
    watchdog's of one segment are the same segment (scripts/cost/ledger.py)."""
    from infra.base.records import Fleet, Node
    from scripts.cost.ledger import launch_record, record_of
    from scripts.targets.gce.recovery import RecoveringSession

    out = parse_stack_outputs(sample_outputs("dev", ZONE, nodes=1))
    nodes = StackNodes(
        ComputeApi("http://127.0.0.1:9"), out, spot=True, ttl_s=3600,
        recreate=lambda _cluster, _gone: (None, out),  # type: ignore[arg-type,return-value]
        clock=lambda: 1_000_000.2504,
    )  # fmt: skip
    fleet = Fleet("stack-dev", (Node("dev-node-0", "head", "10.0.0.1"),))
    session = RecoveringSession(
        fleet, Settings(tmp_path, tmp_path / "runs"), nodes, max_recoveries=0, hourly_usd=2.0
    )
    spec = parse_spec(deployable_config("dev"), "dev")
    record = record_of(spec, session, "r1", None)
    assert record.start == launch_record("stack-dev", spec, nodes.created_at, ZONE)["start"]
    assert record.start == 1_000_000.25


def test_a_runs_cost_record_says_what_its_cluster_ran_on_where_after_a_move(
    tmp_path: Path,
) -> None:
    """The record describes the cluster `up` made (the session's spec: a `gpus` fallback's
    candidate, a capacity list's rung), not the spec the plan read before `up`; a recovery that
    re-created the cluster in another zone adds that zone, in order, and what `up`'s partial
    creates billed before is in its estimate."""
    from infra.base.records import Fleet, Node
    from scripts.cost.ledger import record_of

    other = "us-central1-b"
    out = parse_stack_outputs(sample_outputs("dev", ZONE, nodes=1))
    moved = parse_stack_outputs(sample_outputs("dev", other, nodes=1))
    nodes = StackNodes(
        ComputeApi("http://127.0.0.1:9"), out, spot=True, ttl_s=3600,
        recreate=lambda out, gone: (None, moved),  # type: ignore[arg-type,return-value]
    )  # fmt: skip
    planned = parse_spec(deployable_config("dev", machineType="g2-standard-8"), "dev")
    made = parse_spec(deployable_config("dev", machineType="g2-standard-24", zone=other), "dev")
    session = RecoveringSession(
        Fleet("stack-dev", (Node("dev-node-0", "head", "10.0.0.1"),)),
        Settings(tmp_path, tmp_path / "runs"), nodes, max_recoveries=1, hourly_usd=2.0,
        spec=made, partial_usd=0.5,
    )  # fmt: skip
    assert record_of(planned, session, "r1", None).zones == (ZONE,)
    nodes.recreate({})  # GCE took nothing that still stands: `up` alone, in the other zone
    nodes.recreate({})  # again there: one zone once
    record = record_of(planned, session, "r1", None)
    assert record.zones == (ZONE, other) and record.machine == "g2-standard-24"
    assert record.partial_usd == 0.5 and record.estimated_usd == pytest.approx(2.0 / 60 + 0.5)


def test_checkpoints_go_under_the_runs_prefix_of_the_bucket() -> None:
    theirs = sample_outputs("dev", ZONE) | {"bucket": "b", "bucketPrefix": "t/", "bucketOwned": 0}

    def run_bucket(outputs: dict[str, Any]) -> str | None:
        bucket = parse_bucket(outputs)
        return bucket.uri if bucket else None

    assert checkpoint_uri(run_bucket(theirs), "r1") == "gs://b/t/runs/r1/checkpoints/"
    own = sample_outputs("dev", ZONE) | {"bucket": "b", "bucketPrefix": "", "bucketOwned": 1}
    assert checkpoint_uri(run_bucket(own), "r1") == "gs://b/runs/r1/checkpoints/"
    assert checkpoint_uri(run_bucket(sample_outputs("dev", ZONE)), "r1") is None


def test_step_watch_reads_the_trainer_lines() -> None:
    t = [100.0]
    watch = StepWatch(clock=lambda: t[0])
    watch.line("n0", "[rank0]:checkpoint /x/out/ckpt-00000020.pt")
    watch.line("n0", "[rank0]:step     23/300 | loss 2.1 | lr 1e-3 | ...")
    assert watch.reached == 23
    fired: list[int] = []
    watch.new_attempt(lambda: fired.append(1))
    assert watch.reached is None
    watch.line("n0", "[rank0]:trainer: preset tiny, ..., start step 20/300, restart 0")
    t[0] = 130.0
    watch.line("n0", "[rank0]:step     21/300 | loss 2.2 |")
    watch.line("n0", "[rank0]:step     22/300 | loss 2.2 |")
    assert (watch.start_step, watch.first_step_at, watch.reached, fired) == (20, 130.0, 22, [1])


def test_the_recovery_line_and_summary_rows() -> None:
    r = Recovery(("dev-node-1",), 1_700_000_000.0, 41.6, ZONE, 20, 3)
    line = recovery_line(r, 1, 3)
    assert line.startswith("recovery 1/3: dev-node-1 preempted at ")
    assert line.endswith(
        "training again 42 s later in us-central1-a, resumed from step 20 (3 step(s) trained again)"
    )
    unknown = Recovery(("dev-node-1",), 1_700_000_000.0, 5.0, ZONE, None, None)
    assert "resumed from an unknown step" in recovery_line(unknown, 2, 3)
    epochs = Recovery(("dev-node-1",), 1_700_000_000.0, 5.0, ZONE, 4, 1, unit="epoch")
    assert recovery_line(epochs, 1, 3).endswith("resumed from epoch 4 (1 epoch(s) trained again)")
    assert recovery_rows([r, r]) == [
        ["recoveries", "2 (dev-node-1, dev-node-1)"],
        ["downtime", "83 s"],
        ["steps repeated", "6"],
    ]
    assert recovery_rows([r, unknown])[2] == ["steps repeated", "unknown"]
    assert recovery_rows([]) == []


def test_summary_labels_steady_and_wall_figures_and_counts_lost_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "n0").mkdir()
    (tmp_path / "n0" / "summary.json").write_text(
        '{"final_loss": 1.43284, "loss_floor": 1.3862943611198906, "tokens_per_s": 56158.2,'
        ' "mfu": null, "wall_tokens_per_s": 32832.9, "wall_mfu": null}'
    )
    rec = Recovery(("dev-node-1",), 1_700_000_000.0, 41.0, ZONE, 20, 2)
    result = JobResult("r", True, {"n0": 0}, 1.0, tmp_path, recoveries=(rec,))
    summarize(result, hourly_usd=3.6, started=time.monotonic() - 100)
    out = capsys.readouterr().out
    assert "loss floor (synthetic data)  1.3863" in out
    assert "tokens/s (steady)" in out and "tokens/s (wall clock)" in out
    assert "recoveries" in out and "1 (dev-node-1)" in out
    assert "$0.10 at $3.60/h, 41 s of it recovering" in out


def test_max_recoveries_defaults_and_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spot = parse_spec(deployable_config("dev"), "dev")
    on_demand = parse_spec(deployable_config("dev", capacity="on-demand"), "dev")
    assert recoveries_allowed(RunOptions(), spot) == 3
    assert recoveries_allowed(RunOptions(), on_demand) == 3  # host errors end them too
    assert recoveries_allowed(RunOptions(max_recoveries=5), on_demand) == 5
    with pytest.raises(UserError, match=r"--max-recoveries -1: allowed 0..100"):
        recoveries_allowed(RunOptions(max_recoveries=-1), spot)
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    for argv in (["run", "--local", "--max-recoveries", "2"], ["run", "--local", "--keep-bucket"]):
        assert main(argv, settings) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("gputrain: error: --") and "only --stack targets" in err
        assert "\n" not in err


STUB_PYTHON = """#!/bin/sh
# A node's interpreter: the real one, seeing only the standard library and $dir/site, where a
# module exists once set up or pip-installed; pip exists when $dir/pip does, and installs when
# $dir/pip-works does.
dir=$(dirname "$0")
case "$*" in
  "-m pip --version") [ -f "$dir/pip" ] ;;
  "-m pip install"*)
    [ -f "$dir/pip" ] || { echo "No module named pip"; exit 1; }
    echo "$*" >> "$dir/pip.log"
    [ -f "$dir/pip-works" ] || { echo "ERROR: No matching distribution found"; exit 1; }
    for req in $*; do case "$req" in
      torch) m=torch ;; numpy) m=numpy ;; google-cloud-storage*) m=google/cloud/storage ;; *) m= ;;
    esac; [ -z "$m" ] || { mkdir -p "$dir/site/$m" && touch "$dir/site/$m/__init__.py"; }; done ;;
  *) PYTHONPATH="$dir/site" exec __PYTHON__ -S "$@" ;;
esac
"""
# Ubuntu's images have no pip: apt installs it (sudo without a password, as on GCE VMs).
STUB_SUDO = """#!/bin/sh
dir=$(dirname "$0")
echo "$*" >> "$dir/sudo.log"
case "$*" in *"install -y -qq python3-pip"*) touch "$dir/pip" ;; esac
"""


@pytest.mark.parametrize(
    ("case", "needs", "setup", "result", "pip_calls"),
    [
        ("present", STORAGE_PACKAGES, ["pip", "site/google/cloud/storage"], "present", []),
        ("installed", STORAGE_PACKAGES, ["pip", "pip-works"], "installed google-cloud-storage>=2.14,<4",
         ["google-cloud-storage>=2.14,<4"]),
        ("pip-fails", STORAGE_PACKAGES, ["pip"], None, ["google-cloud-storage>=2.14,<4"] * 2),
        ("torch-missing", TRAINER_PACKAGES, ["pip", "pip-works", "site/numpy"], "installed torch",
         ["torch"]),
        ("no-pip-ubuntu", TRAINER_PACKAGES, ["pip-works"], "installed torch numpy", ["torch numpy"]),
    ],
)  # fmt: skip
def test_node_packages_probe_and_install(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    needs: tuple[tuple[str, str], ...],
    setup: list[str],
    result: str | None,
    pip_calls: list[str],
) -> None:
    for name, text in (
        ("python3", STUB_PYTHON.replace("__PYTHON__", sys.executable)),
        ("sudo", STUB_SUDO),
    ):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    for name in setup:  # a flag file, or a module under site/
        if name.startswith("site/"):
            (tmp_path / name).mkdir(parents=True)
            (tmp_path / name / "__init__.py").touch()
        else:
            (tmp_path / name).touch()
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    cmd = build_install_command(str(tmp_path / "python3"), needs)
    r = LocalTransport("local", tmp_path / "node").run(cmd, 30)
    pip = tmp_path / "pip.log"
    calls = pip.read_text().splitlines() if pip.exists() else []
    # pip's arguments after the flags: the requirements it was asked for
    assert [c.split("--disable-pip-version-check")[-1].replace("--user", "").strip()
            for c in calls] == pip_calls  # fmt: skip
    if result is None:
        assert r.exit_code == 1 and "No matching distribution" in r.stdout
    else:
        assert r.ok and r.stdout.strip() == result, r.stdout + r.stderr
    sudo = tmp_path / "sudo.log"
    assert sudo.exists() == (case == "no-pip-ubuntu")  # apt only where pip is missing


def test_the_package_probe_finds_modules_without_importing_them(tmp_path: Path) -> None:
    """torch's import takes seconds on a GPU VM: the probe before every launch only looks."""
    python = tmp_path / "python3"
    python.write_text(STUB_PYTHON.replace("__PYTHON__", sys.executable))
    python.chmod(0o755)
    for mod in ("torch", "numpy"):
        (tmp_path / "site" / mod).mkdir(parents=True)
        (tmp_path / "site" / mod / "__init__.py").write_text(
            f"open({str(tmp_path / 'imported')!r}, 'a').write('{mod} ')\n"
        )
    r = LocalTransport("local", tmp_path / "node").run(
        build_install_command(str(python), TRAINER_PACKAGES), 30
    )
    assert r.ok and r.stdout.strip() == "present", r.stdout + r.stderr
    assert not (tmp_path / "imported").exists()


def test_host_errors_and_maintenance_count_on_any_capacity_a_vanished_vm_only_on_spot() -> None:
    states = [
        NodeCloudState("err", "TERMINATED", "2026-11-23T10:00:00Z", "compute.instances.hostError"),
        NodeCloudState(
            "mnt", "RUNNING", "2026-11-23T10:00:00Z", "compute.instances.terminateOnHostMaintenance"
        ),
        NodeCloudState("gone", None, None),
    ]
    assert sorted(preempted_nodes(states, ttl_over=False, spot=False)) == ["err", "mnt"]
    assert sorted(preempted_nodes(states, ttl_over=False)) == ["err", "gone", "mnt"]
    assert [s.cause for s in states] == [
        "lost to a host error",
        "terminated for host maintenance",
        "preempted",
    ]
    assert states[0].evidence == "compute.instances.hostError at 2026-11-23T10:00:00Z"


def test_an_on_demand_node_lost_to_a_host_error_is_found_and_waited_for() -> None:
    """The Compute API's hostError operation marks it; a VM GCE restarted (RUNNING again) is
    not waited for until deleted, as a preempted spot VM is, and stands: `up` re-creates no
    node (it keeps the restarted one as it is)."""
    out = parse_stack_outputs(sample_outputs("dev", ZONE, nodes=2))
    with FakeCompute() as fake:
        for n in out.nodes:
            fake.add_instance(n.name, ZONE)
        since = time.time() - 1
        gone: list[Any] = []

        def recreate(_cluster: StackOutputs, names: list[str]) -> tuple[str, StackOutputs]:
            gone.append(names)
            return "fleet", out

        nodes = StackNodes(
            ComputeApi(fake.url),
            out,
            spot=False,
            ttl_s=3600,
            recreate=recreate,  # type: ignore[arg-type]
            sleep=lambda _s: None,
        )
        assert nodes.preempted(since, wait_s=0) == {}
        fake.preempt_instance(
            "dev-node-1", ZONE, delete_after_s=60, kind="compute.instances.hostError"
        )
        found = nodes.preempted(since, wait_s=0)
        assert list(found) == ["dev-node-1"] and found["dev-node-1"].cause == "lost to a host error"
        fake.instances[(ZONE, "dev-node-1")].body["status"] = "RUNNING"  # automatic restart
        assert nodes.recreate(found) == "fleet" and gone == [[]]


def test_a_node_gce_will_not_restart_is_deleted_after_a_host_error_and_recreated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A spot (or flex-start, or compact-placed) VM that a host error ends stays TERMINATED:
    GCE neither restarts nor deletes it, and `up` would keep it. The recovery deletes it through
    the Compute API, waits until it is gone, then re-creates the cluster; a stack whose VMs GCE
    restarts waits instead (the test above)."""
    out = parse_stack_outputs(sample_outputs("dev", ZONE, nodes=2))
    with FakeCompute() as fake:
        for n in out.nodes:
            fake.add_instance(n.name, ZONE)
        recreated: list[tuple[StackOutputs, list[str]]] = []

        def recreate(cluster: StackOutputs, gone: list[str]) -> tuple[str, StackOutputs]:
            assert (ZONE, "dev-node-1") not in fake.instances  # gone before `up`
            recreated.append((cluster, gone))
            return "fleet", out

        nodes = StackNodes(
            ComputeApi(fake.url),
            out,
            spot=True,
            ttl_s=3600,
            recreate=recreate,  # type: ignore[arg-type]
            sleep=lambda _s: None,
            automatic_restart=False,
        )
        since = time.time() - 1
        fake.preempt_instance(
            "dev-node-1", ZONE, delete_after_s=3600, kind="compute.instances.hostError"
        )
        fake.instances[(ZONE, "dev-node-1")].body["status"] = "TERMINATED"  # and it stays so
        found = nodes.preempted(since, wait_s=0)
        assert found["dev-node-1"].cause == "lost to a host error"
        assert nodes.recreate(found, gone_deadline_s=30) == "fleet"
        assert recreated == [(out, ["dev-node-1"])]
        assert [(zone, name) for zone, name, _ in fake.deletes] == [(ZONE, "dev-node-1")]
        assert "dev-node-1: lost to a host error, left TERMINATED" in capsys.readouterr().out


def test_the_end_of_recoveries_names_what_gce_did_to_each_node() -> None:
    at = "2026-11-23T10:00:00Z"
    assert NodeCloudState("n1", None, at).ended("n1") == "GCE preempted n1"
    err = NodeCloudState("n2", "TERMINATED", at, "compute.instances.hostError")
    assert err.ended("n2") == "a host error ended n2"
    mnt = NodeCloudState("n3", None, at, "compute.instances.terminateOnHostMaintenance")
    assert mnt.ended("n3") == "host maintenance ended n3"


def test_a_preemption_is_counted_once_whatever_gces_clock_says() -> None:
    """GCE's clock 10 minutes ahead of ours: the first preemption's operation is newer than the
    relaunch by our clock; once a recovery counted it, the re-created VM running under the same
    name is not preempted again — a new operation is."""
    out = parse_stack_outputs(sample_outputs("dev", ZONE, nodes=2))
    with FakeCompute() as fake:
        fake.clock_offset_s = 600.0
        for n in out.nodes:
            fake.add_instance(n.name, ZONE)
        nodes = StackNodes(
            ComputeApi(fake.url),
            out,
            spot=True,
            ttl_s=3600,
            recreate=lambda _cluster, _gone: ("fleet", out),  # type: ignore[arg-type,return-value]
            sleep=lambda _s: None,
        )
        fake.preempt_instance("dev-node-1", ZONE, delete_after_s=60)
        first = nodes.preempted(time.time(), wait_s=0)
        assert first["dev-node-1"].preempted_at  # the operation
        fake.remove_instance("dev-node-1", ZONE)
        fake.add_instance("dev-node-1", ZONE)  # re-created, running; the relaunch begins
        relaunch = time.time()
        assert nodes.preempted(relaunch, wait_s=0) == {}
        fake.preempt_instance("dev-node-1", ZONE, delete_after_s=60)
        again = nodes.preempted(relaunch, wait_s=0)
        assert again["dev-node-1"].preempted_at != first["dev-node-1"].preempted_at


@pytest.mark.parametrize(
    ("ttl_s", "budget", "why"),
    [
        (600, None, "the stack's TTL is spent: not re-creating VMs"),
        (36000, (10.0, 3600.0, 0.0), "its budget of $10.00 is spent: not re-creating VMs"),
        # $15 of training and $6 `up`'s partial creates billed before it: past $20
        (36000, (20.0, 15.0, 6.0), "its budget of $20.00 is spent: not re-creating VMs"),
    ],
)
def test_the_controller_recovers_no_run_past_its_ttl_or_its_budget(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ttl_s: int,
    budget: tuple[float, float, float] | None,
    why: str,
) -> None:
    """A node preempted after the run's TTL (counted from its first launch, as a reconcile
    pass counts it: none of it is left for a re-created VM), or once its budget is spent
    (--budget $10 at $10/h, an hour in: the head would stop the relaunch at once; or what
    `up`'s partial creates billed before the run takes it past): the controller re-creates
    nothing and says why in one line."""
    import scripts.watch.monitor as monitor
    from scripts.job.autodown import Autodown, RunBudget
    from scripts.job.records import Job
    from scripts.targets.base import SignalGuard
    from scripts.targets.gce.recovery import RecoveringSession, RecoveryError

    out = parse_stack_outputs(sample_outputs("dev", ZONE, nodes=2))
    keys = {n.name: ("ssh-ed25519 KEY",) for n in out.nodes}
    recreated: list[StackOutputs] = []

    def recreate(cluster: StackOutputs) -> tuple[Any, StackOutputs]:
        recreated.append(cluster)
        return None, out

    with FakeCompute() as fake:
        for n in out.nodes:
            fake.add_instance(n.name, ZONE)
        nodes = StackNodes(
            ComputeApi(fake.url), out, spot=True, ttl_s=ttl_s, recreate=recreate,
            sleep=lambda _s: None,
        )  # fmt: skip
        nodes.created_at = time.time() - 3600  # the run's first launch, an hour ago
        autodown = None
        if budget is not None:
            usd, rate, before = budget
            plan = RunBudget(
                usd, rate, started_at=nodes.created_at, interval_s=120, before_usd=before
            )
            autodown = Autodown("dev", out.project, "gs://b/", (), None, budget=plan)
        session = RecoveringSession(
            out.to_fleet("stack-dev", keys, identity_file=None),
            Settings(root=tmp_path, runs_dir=tmp_path / "runs"),
            nodes,
            max_recoveries=3,
            confirm_s=0,
            autodown=autodown,
        )
        session._transports = {}  # nothing to connect to: the launch below fails at once
        monkeypatch.setattr(session, "_arm", lambda job: None)

        def launch(*args: Any, **kwargs: Any) -> None:
            fake.preempt_instance("dev-node-1", ZONE, delete_after_s=60)
            raise _error("killed", None)

        monkeypatch.setattr(monitor, "watched_launch", launch)
        with pytest.raises(RecoveryError) as caught:
            session.run_job(Job("r1", entry=("train.py",)), tmp_path / "results", SignalGuard())
    assert recreated == []
    message = str(caught.value)
    assert message.startswith("run r1: GCE preempted dev-node-1 (compute.instances.preempted at")
    assert f" and {why}. Its newest checkpoint is in " in message and "\n" not in message


def _stack_target(
    tmp_path: Path, fake: FakeCompute, zones: str = f"{ZONE}, us-central1-b"
) -> tuple[Any, FakeStackRunner]:
    """A 2-node g2 stack of a 1 h maxRunDuration (the fake runner's) over the fake runner."""
    from scripts.targets.gce.clients import GceClients
    from scripts.targets.gce.target import GceTarget

    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.dev.yaml").write_text(
        f"config:\n  gcp:project: {fake.project}\n  gputrain:machineType: g2-standard-8\n"
        f"  gputrain:nodes: 2\n  gputrain:zones: [{zones}]\n  gputrain:maxRunDuration: 1h\n"
    )
    runner = FakeStackRunner("dev", compute=fake, project=fake.project)
    clients = GceClients(runner_for=lambda s, r: runner, compute_endpoint=fake.url)
    clients.capacity_pause_s = (0.01, 0.01)
    return GceTarget("dev", Settings(root=tmp_path), clients), runner


def test_a_recovery_gives_the_vm_it_recreates_what_is_left_of_the_runs_ttl(
    tmp_path: Path, fake: FakeCompute
) -> None:
    """The controller's recovery hands the `up` that re-creates the preempted VM its run's
    deadline (the one not_recreating checks) and names the survivor, which alone keeps its
    maxRunDuration (test_cluster.py: what the program declares for it): the program gives the
    new VM what is left, and GCE deletes it by that deadline. A plain `up` passes nothing."""
    from infra.ttl import Recreation
    from scripts.targets.gce.target import stack_session

    target, runner = _stack_target(tmp_path, fake)
    spec = target.spec()
    outputs = runner.up()  # the launch: every VM the full TTL
    ctx = target.context(spec, RunOptions(wait_for_capacity_s=0))
    session = stack_session(ctx, outputs, tmp_path / "key", keep=True, connect_deadline_s=1)
    session.nodes.created_at = time.time() - 2400  # launched 40 min ago: 20 min of its hour left
    fake.remove_instance("dev-node-1", ZONE)  # GCE deleted the preempted VM
    session.nodes.recreate({"dev-node-1": NodeCloudState("dev-node-1", None, "2026-04-20")})
    image = outputs["image"]  # the one the cluster runs (the next test)
    deadline = session.nodes.deadline
    assert runner.up_env == [{}, Recreation(deadline, ZONE, image, ("dev-node-0",)).env()]
    given = Recreation.from_env(runner.up_env[1])  # what the program reads
    assert given is not None and given.keeps("dev-node-0", ZONE)
    assert not given.keeps("dev-node-1", ZONE)
    assert given.max_run_duration_s(time.time()) == pytest.approx(1200, abs=10)


def test_a_wait_for_capacity_keeps_no_vm_once_an_up_in_another_zone_moved_some(
    tmp_path: Path, fake: FakeCompute
) -> None:
    """Round 1 tries the survivor's zone (stocked out), then us-central1-b, whose `up` moves the
    cluster: it makes dev-node-0 there, then stocks out. Round 2 tries the first zone again:
    its `up` replaces that VM back, and a replacement would take a kept (ignored) maxRunDuration
    from the state, round 1's; so it names no VM to keep, and every VM gets what is left."""
    from infra.ttl import Recreation
    from scripts.targets.gce.target import recreate

    target, runner = _stack_target(tmp_path, fake)
    outputs = parse_stack_outputs(runner.up())
    fake.remove_instance("dev-node-1", ZONE)  # preempted
    runner.fail_stockout(ZONE, times=1)
    runner.fail_partial("us-central1-b", created=1)
    ctx = target.context(target.spec(), RunOptions(wait_for_capacity_s=600))
    recreate(ctx, Recreation.of(outputs, time.time() + 1800, ["dev-node-1"]))
    ups = [c[1] for c in runner.calls if c[0] == "up"]
    assert ups == [ZONE, ZONE, "us-central1-b", ZONE]
    given = [Recreation.from_env(env) for env in runner.up_env[1:]]
    assert [g.keep for g in given if g is not None] == [("dev-node-0",), ("dev-node-0",), ()]


def test_a_wait_for_capacity_in_one_zone_keeps_the_vms_its_rounds_made(
    tmp_path: Path, fake: FakeCompute
) -> None:
    """With the survivors' zone alone, no `up` moves a VM: a later round keeps the survivor and
    the VM an earlier round made there before it failed (round 1's `up` gave it what was
    left), rather than replace it."""
    from infra.ttl import Recreation
    from scripts.targets.gce.target import recreate

    target, runner = _stack_target(tmp_path, fake, zones=ZONE)
    outputs = parse_stack_outputs(runner.up())
    fake.remove_instance("dev-node-1", ZONE)
    runner.fail_partial(ZONE, created=1)  # makes dev-node-1, then fails
    ctx = target.context(target.spec(), RunOptions(wait_for_capacity_s=600))
    recreate(ctx, Recreation.of(outputs, time.time() + 1800, ["dev-node-1"]))
    given = [Recreation.from_env(env) for env in runner.up_env[1:]]
    assert [g.keep for g in given if g is not None] == [
        ("dev-node-0",),
        ("dev-node-0", "dev-node-1"),
    ]


def test_both_recoveries_recreate_vms_on_the_image_the_cluster_runs(
    tmp_path: Path, fake: FakeCompute
) -> None:
    """The stack outputs record the image the cluster was created on; the image family may
    point at a newer one by the time GCE takes a VM. The controller's recovery and a reconcile
    pass's re-creation (GceTarget.recreated) both hand the recorded image to their `up`
    (GPUTRAIN_RECREATE_IMAGE), so the program keeps it for every VM: the family's newer one
    would replace the survivors and give the new VM another driver and CUDA than its peers."""
    from infra.ttl import RECREATE_IMAGE_ENV, Recreation
    from scripts.targets.gce.target import stack_session

    target, runner = _stack_target(tmp_path, fake)
    spec = target.spec()
    outputs = runner.up()
    running = outputs["image"]
    assert running.endswith("-v20260416")
    ctx = target.context(spec, RunOptions(wait_for_capacity_s=0))
    session = stack_session(ctx, outputs, tmp_path / "key", keep=True, connect_deadline_s=1)
    fake.remove_instance("dev-node-1", ZONE)
    session.nodes.recreate({"dev-node-1": NodeCloudState("dev-node-1", None, "2026-04-20")})
    assert [env.get(RECREATE_IMAGE_ENV) for env in runner.up_env] == [None, running]
    fake.remove_instance("dev-node-1", ZONE)  # again, and a reconcile pass re-creates it
    again = Recreation.of(parse_stack_outputs(runner.outputs()), time.time() + 600, ["dev-node-1"])
    target.recreated(spec, again, None)
    assert runner.up_env[-1][RECREATE_IMAGE_ENV] == running


def test_no_recovery_recreates_a_vm_past_the_runs_deadline(
    tmp_path: Path, fake: FakeCompute
) -> None:
    """A wait for capacity that outlives the run's TTL ends there: nothing is created."""
    from infra.ttl import Recreation
    from scripts.targets.gce.target import recreate

    target, runner = _stack_target(tmp_path, fake)
    ctx = target.context(target.spec(), RunOptions(wait_for_capacity_s=0))
    with pytest.raises(GputrainError, match=r"^the stack's TTL is spent: not re-creating VMs$"):
        recreate(ctx, Recreation(time.time() - 1, ZONE))
    assert "up" not in runner.call_names()
