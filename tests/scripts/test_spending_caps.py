"""Spending caps before anything is created: maxHourlyCost against the dearest rate of every
capacity rung and GPU candidate, a budget against rate x maxRunDuration; bad amounts one line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NoReturn

import pytest

from infra.base.errors import UserError
from infra.billing import parse_usd, usd_text
from infra.disk_prices import spec_disk_rate
from infra.spec import ClusterSpec, parse_spec
from scripts.cli import main
from scripts.run_plan import (
    BUDGET_INTERVAL_ENV,
    budget_interval_s,
    candidate_hourly,
    caps_line,
    cents_up,
    check_caps,
    exact_usd,
    worst_hourly,
)
from scripts.settings import Settings
from scripts.targets.gce.clients import GceClients
from tests.support.fake_compute import FakeCompute
from tests.support.pulumi_mocks import ROOT, deployable_config


def spec(**overrides: str) -> ClusterSpec:
    return parse_spec(deployable_config("dev", **overrides), "dev")


@pytest.mark.parametrize("bad", ["0", "-5", "abc", "nan", "inf", "1e999", "١٠٠", "1_000", "１"])
def test_a_bad_amount_is_one_line(bad: str) -> None:
    with pytest.raises(UserError, match=rf"gputrain:budget '{bad}': not an amount; allowed"):
        spec(budget=bad)
    with pytest.raises(UserError, match=r"gputrain:maxHourlyCost .*US dollars above 0"):
        spec(maxHourlyCost=bad)
    assert parse_usd("$12.5", "--budget") == 12.5 and parse_usd("", "gputrain:budget") is None


@pytest.mark.parametrize("key", ["budget", "maxHourlyCost"])
def test_a_blank_amount_is_refused_never_taken_as_no_budget(
    key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the key's default ("") is unset; an amount written blank is a mistake, said in one
    line, as is `--budget ""`."""
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.b.yaml").write_text(
        f"config:\n  gputrain:machineType: g2-standard-8\n  gputrain:{key}: '  '\n"
    )
    assert main(["plan", "--stack", "b"], Settings(root=tmp_path)) == 2
    assert capsys.readouterr().err.strip() == (
        f"gputrain: error: gputrain:{key} '  ': not an amount; allowed: US dollars above 0, "
        "e.g. 300 or 2.5"
    )
    with pytest.raises(UserError, match=r"^--budget '': not an amount; allowed: US dollars"):
        parse_usd("", "--budget", unset=False)


def test_an_amount_with_an_exponent_means_the_same_on_the_command_line_and_in_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One rule: YAML's `budget: 1e3` reaches the program as "1000", so '1e3' (quoted, or
    --budget 1e3) is 1000 too; amounts in messages are plain decimals, never 1e-07."""
    assert parse_usd("1e3", "--budget") == parse_usd("1000", "--budget") == 1000.0
    assert parse_usd("2.5E-1", "--budget") == 0.25
    assert spec(budget="1e3").budget == spec(budget="1000").budget == 1000.0
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    for written in ("1e3", "'1e3'"):
        (tmp_path / "Pulumi.e.yaml").write_text(
            f"config:\n  gputrain:machineType: g2-standard-8\n  gputrain:budget: {written}\n"
        )
        assert main(["plan", "--stack", "e"], Settings(root=tmp_path)) == 0
        assert "budget $1,000.00 per run" in capsys.readouterr().out
    argv = ["run", "--stack", "e", "--yes", "--skip-preflight", "--budget", "1e-7"]
    assert main(argv, Settings(root=tmp_path, runs_dir=tmp_path / "runs"), gce_nothing()) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("gputrain: error: --budget 0.0000001: 1 x g2-standard-8") and "e-" not in err
    )
    assert main(["run", "--stack", "e", "--budget", ""], Settings(root=tmp_path)) == 2
    assert capsys.readouterr().err.strip() == (
        "gputrain: error: --budget '': not an amount; allowed: US dollars above 0, e.g. 300 or 2.5"
    )


def test_the_hourly_cap_takes_the_dearest_capacity_rung() -> None:
    ladder = spec(machineType="g2-standard-8", nodes="2", capacity='["spot", "on-demand"]')
    assert ladder.price is not None and ladder.price.on_demand and ladder.price.spot
    dearest = (ladder.price.on_demand + spec_disk_rate(ladder, False).hourly) * 2
    assert worst_hourly(ladder) == pytest.approx(dearest)
    check_caps(spec(machineType="g2-standard-8", nodes="2", capacity='["spot", "on-demand"]',
                    maxHourlyCost=f"{dearest + 0.01}"), budget=None, budget_setting="x")  # fmt: skip
    cap = round(dearest - 0.01, 2)
    capped = spec(machineType="g2-standard-8", nodes="2", capacity='["spot", "on-demand"]',
                  maxHourlyCost=f"{cap}")  # fmt: skip
    with pytest.raises(UserError) as e:
        check_caps(capped, budget=None, budget_setting="x")
    assert str(e.value).startswith(f"gputrain:maxHourlyCost {usd_text(cap)}: 2 x ")
    assert f"costs up to ${exact_usd(dearest)}/h (disks included)" in str(e.value)
    assert "(spot/on-demand)" in str(e.value)


def test_below_the_cheapest_gpu_candidate_names_it() -> None:
    many = spec(gpus="L4:1", maxHourlyCost="0.01")
    rates = {c: candidate_hourly(many, c) for c in many.candidates}
    cheapest = min((c for c in rates if rates[c]), key=lambda c: rates[c] or 0)
    least = rates[cheapest] or 0
    assert least > (cheapest.hourly or 0)  # its VM's price and its boot disk's
    with pytest.raises(UserError) as e:
        check_caps(many, budget=None, budget_setting="x")
    text = str(e.value)
    assert text.startswith("gputrain:maxHourlyCost 0.01: below the cheapest candidate, ")
    assert f"{cheapest.machine_type} in {cheapest.zone} at ${exact_usd(least)}/h" in text
    assert text.endswith(f"allowed: at least {cents_up(least)}")
    check_caps(spec(gpus="L4:1", maxHourlyCost=cents_up(least)), budget=None, budget_setting="x")


def test_a_budget_is_held_by_max_run_duration() -> None:
    s = spec(machineType="g2-standard-8", maxRunDuration="6h")
    rate = worst_hourly(s)
    assert rate is not None
    check_caps(s, budget=rate * 6 + 0.01, budget_setting="--budget")
    with pytest.raises(UserError) as e:
        check_caps(s, budget=rate * 3, budget_setting="--budget")
    text = str(e.value)
    assert text.startswith(f"--budget {usd_text(rate * 3)}: 1 x g2-standard-8")
    assert (
        f"may cost ${exact_usd(rate * 6)}" in text
        and "gputrain:maxRunDuration to at most 3h" in text
    )
    fine = spec(machineType="g2-standard-8", maxRunDuration="2h", budget="1000",
                maxHourlyCost="1000")  # fmt: skip
    assert "budget $1,000.00 per run >= worst case" in caps_line(fine)


def test_the_caps_count_boot_disks_and_local_ssd_at_list_price(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A T4 node with 24 Local SSDs and a 2,000 GB pd-ssd boot disk: the VM is $0.23/h, its
    disks about $0.86/h more (Local SSD at its Spot price on a Spot VM); both caps count them,
    and `plan` says what the caps leave out where the table has no price."""
    from infra.disk_prices import HOURS_PER_MONTH, PER_GIB_MONTH

    ssd = spec(machineType="n1-standard-4", gpuType="T4", gpuCount="1", zones='["us-central1-a"]',
               localSsdCount="24", bootDiskGb="2000", bootDiskType="pd-ssd",
               maxRunDuration="10h")  # fmt: skip
    balanced, pd_ssd, local, local_spot = PER_GIB_MONTH["us-central1"]
    assert (pd_ssd, local_spot) == (0.17, 0.032)  # Google's US list: $34 for 200 GB a month
    disks = (2000 * pd_ssd + 24 * 375 * local_spot) / HOURS_PER_MONTH
    assert ssd.price is not None and ssd.price.spot is not None
    assert worst_hourly(ssd) == pytest.approx(ssd.price.spot + disks)
    assert disks > 0.85 and (worst_hourly(ssd) or 0) > 1.0 > 4 * (ssd.hourly_price or 0)
    on_demand = spec_disk_rate(ssd, False).hourly
    assert on_demand == pytest.approx((2000 * pd_ssd + 24 * 375 * local) / HOURS_PER_MONTH)
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.ssd.yaml").write_text(
        "config:\n  gputrain:machineType: n1-standard-4\n  gputrain:gpuType: T4\n"
        "  gputrain:gpuCount: 1\n  gputrain:zones: [us-central1-a]\n  gputrain:capacity: spot\n"
        "  gputrain:localSsdCount: 24\n  gputrain:bootDiskGb: 2000\n"
        "  gputrain:bootDiskType: pd-ssd\n  gputrain:maxRunDuration: 10h\n"
        "  gputrain:maxHourlyCost: 0.3\n  gputrain:budget: 3\n"
    )
    assert main(["plan", "--stack", "ssd"], Settings(root=tmp_path)) == 2
    assert capsys.readouterr().err.strip() == (
        "gputrain: error: gputrain:maxHourlyCost 0.3: 1 x n1-standard-4 (spot) costs up to "
        f"${exact_usd(worst_hourly(ssd) or 0)}/h (disks included); allowed: at least "
        f"{cents_up(worst_hourly(ssd) or 0)}, or a cheaper machine, capacity or node count"
    )
    a3 = spec(machineType="a3-highgpu-8g", zones='["us-central1-a"]', capacity="on-demand")
    bundled = 6000 * local / HOURS_PER_MONTH + 200 * pd_ssd / HOURS_PER_MONTH
    assert a3.price is not None and a3.price.on_demand is not None
    assert worst_hourly(a3) == pytest.approx(a3.price.on_demand + bundled)
    ultra = spec(machineType="a3-ultragpu-8g", zones='["us-central1-b"]', budget="5000",
                 bootDiskType="", maxRunDuration="6h")  # fmt: skip
    assert caps_line(ultra).endswith(
        "Not in them: hyperdisk-balanced boot disk, bundled Local SSD (size unknown) "
        "(no price known) and network traffic."
    )
    assert caps_line(spec(budget="100")).endswith(". Not in them: network traffic.")
    assert balanced == 0.1  # pd-balanced, every stack's default boot disk below A3


VERTEX = {"backend": "vertex", "machineType": "g2-standard-24", "nodes": "2", "gpus": "",
          "zones": '["us-central1-a"]', "maxRunDuration": "6h"}  # fmt: skip


@pytest.mark.parametrize(
    "pool",
    [{"reductionServer": '{"replicas": 64}'}, {"chief": '{"machineType": "a3-megagpu-8g"}'}],
)
def test_a_vertex_jobs_caps_are_checked_against_every_worker_pool(pool: dict[str, str]) -> None:
    """The chief's own machine and the reducers bill too: the caps take the pools' total, not
    nodes x the workers' price."""
    from infra.vertex_pools import price_pools, total_hourly

    job = spec(**VERTEX, **pool)
    total = total_hourly(price_pools(job.vertex_pools(), job.region, spot=job.spot))
    assert total is not None and job.hourly_price is not None and total > job.hourly_price + 1
    assert worst_hourly(job) == pytest.approx(total)
    fits = spec(
        **VERTEX, **pool, maxHourlyCost=f"{total + 0.01:.2f}", budget=f"{total * 6 + 0.01:.2f}"
    )
    check_caps(fits, budget=fits.budget, budget_setting="gputrain:budget")
    assert f">= ${total:,.2f}/h (dearest rate, every worker pool)" in caps_line(fits)
    assert f"worst case ${total * 6:,.2f}" in caps_line(fits) and "watchdog" not in caps_line(fits)
    with pytest.raises(UserError) as e:
        check_caps(spec(**VERTEX, **pool, maxHourlyCost="10"), budget=None, budget_setting="x")
    assert str(e.value).startswith("gputrain:maxHourlyCost 10: 1 x ")
    assert f"costs up to ${exact_usd(total)}/h" in str(e.value) and "(chief)" in str(e.value)
    with pytest.raises(UserError, match=r"^--budget 20: 1 x .* may cost \$"):
        check_caps(spec(**VERTEX, **pool), budget=20, budget_setting="--budget")


def test_a_vertex_job_files_pools_replace_the_stacks_shape_in_the_caps() -> None:
    from infra.vertex_pools import PoolShape

    job = spec(**VERTEX, maxHourlyCost="5")
    check_caps(job, budget=None, budget_setting="x")  # 2 x g2-standard-24: a few $/h
    pools = [(0, PoolShape("a3-highgpu-8g", "nvidia-h100-80gb", 8, 1))]
    with pytest.raises(UserError, match=r"^gputrain:maxHourlyCost 5: 1 x a3-highgpu-8g \(chief\)"):
        check_caps(job, budget=None, budget_setting="x", pools=pools)


def test_plan_refuses_and_run_takes_budget_only_on_a_stack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.dev.yaml").write_text(
        "config:\n  gcp:project: gputrain-test\n  gputrain:machineType: g2-standard-8\n"
        "  gputrain:maxHourlyCost: '0.05'\n"
    )
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["plan", "--stack", "dev"], settings) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "gputrain:maxHourlyCost 0.05: 1 x g2-standard-8" in err
    (tmp_path / "Pulumi.cap.yaml").write_text(
        "config:\n  gcp:project: gputrain-test\n  gputrain:machineType: g2-standard-8\n"
    )
    argv = ["run", "--stack", "cap", "--yes", "--skip-preflight", "--budget", "0.01"]
    assert main(argv, settings, gce_nothing()) == 2  # refused before anything is asked or made
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("gputrain: error: --budget 0.01: 1 x g2-standard-8")
    assert main(["run", "--local", "--budget", "5"], settings) == 2
    assert "--budget 5: only --stack targets" in capsys.readouterr().err
    assert main(["run", "--stack", "dev", "--budget", "zero"], settings) == 2
    assert "--budget 'zero': not an amount" in capsys.readouterr().err
    # how far ahead the head's budget rule looks: a bad knob is one line, nothing made
    argv[-1] = "1000"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(BUDGET_INTERVAL_ENV, "soon")
        assert main(argv, settings, gce_nothing()) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "gputrain: error: GPUTRAIN_BUDGET_INTERVAL_S 'soon': allowed: seconds from 0 to 86400"
    )


@pytest.mark.parametrize("raw", ["-1", "abc", "nan", "1e9", "١٠", "1_0"])
def test_a_bad_budget_interval_is_one_line(raw: str) -> None:
    with pytest.raises(UserError, match=rf"^GPUTRAIN_BUDGET_INTERVAL_S '{raw}': allowed"):
        budget_interval_s(raw)
    assert budget_interval_s(None) == budget_interval_s(" ") == 120.0
    assert budget_interval_s("30") == 30.0


def gce_nothing() -> GceClients:
    """Clients whose every use fails the test: the caps come before any Google or Pulumi call."""

    def refuse(*_: object) -> NoReturn:
        raise AssertionError("a Google or Pulumi client was used before the caps were checked")

    return GceClients(runner_for=refuse, compute_endpoint="http://127.0.0.1:9", retry_pause_s=0)


def test_a_minimum_the_message_allows_is_rounded_up_not_down() -> None:
    """$2.0434 worst case: "at least 2.04" would be refused again; 2.05 passes."""
    assert [cents_up(x) for x in (2.0434, 0.28184, 2.04, 0.3, 0.0)] == [
        "2.05", "0.29", "2.04", "0.30", "0.00",
    ]  # fmt: skip
    assert [exact_usd(x) for x in (2.0434, 0.28184, 2.04, 0.3, 0.0, 6.2232000000001)] == [
        "2.0434", "0.2819", "2.04", "0.30", "0.00", "6.2232",
    ]  # fmt: skip


def test_a_refused_rate_is_shown_to_the_digit_its_minimum_is_rounded_up_from() -> None:
    """1 + 2 x a2-highgpu-1g on Spot is $6.2232/h: "costs up to $6.22/h; allowed: at least 6.23"
    read as if 6.22 were enough. The rate and the worst case are shown as the check saw them,
    the minimum still rounded up (6.22 refused, 6.23 passes)."""
    from infra.vertex_pools import PoolShape

    a100 = ("a2-highgpu-1g", "nvidia-tesla-a100", 1)
    pools = [(0, PoolShape(*a100, 1)), (1, PoolShape(*a100, 2))]
    hourly = {**VERTEX, "maxRunDuration": "1h", "spot": "true"}
    job = spec(**hourly, maxHourlyCost="6.22")
    rate = worst_hourly(job, pools)
    assert rate is not None and round(rate, 2) < rate < 6.23
    with pytest.raises(UserError) as e:
        check_caps(job, budget=None, budget_setting="x", pools=pools)
    shown = re.search(r"costs up to \$([0-9.]+)/h; allowed: at least ([0-9.]+),", str(e.value))
    assert shown is not None and float(shown[1]) == pytest.approx(rate, abs=1e-9)
    assert shown[2] == "6.23"
    with pytest.raises(UserError) as e:
        check_caps(spec(**hourly), budget=6.22, budget_setting="--budget", pools=pools)
    worst = re.search(r"at \$([0-9.]+)/h .* may cost \$([0-9.]+); allowed: a budget of at least "
                      r"([0-9.]+),", str(e.value))  # fmt: skip
    assert worst is not None and float(worst[1]) == float(worst[2]) == pytest.approx(rate)
    assert worst[3] == "6.23"
    check_caps(spec(**hourly, maxHourlyCost="6.23"), budget=6.23, budget_setting="x", pools=pools)


def _train_on_an_edited_stack(
    tmp_path: Path,
    fake: FakeCompute,
    monkeypatch: pytest.MonkeyPatch,
    *,
    up: str,
    now: str,
    recorded: dict[str, Any],
    budget: str,
    nodes: int = 1,
) -> int:
    """`train --budget` on stack g after `up` made `nodes` g2-standard-8 VMs from the stack file
    keys `up` (YAML lines under `config:`) and recorded `recorded` among its outputs, and the
    file was then edited to say `now`; the exit status."""
    from tests.support.fake_stack import FakeStackRunner, default_node_factory

    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "job.py").write_text("print('hi')\n")
    base = (
        "config:\n  gcp:project: gputrain-test\n  gputrain:machineType: g2-standard-8\n"
        "  gputrain:zones: [us-central1-a]\n  gputrain:maxRunDuration: 1h\n"
    )
    stack_file = tmp_path / "Pulumi.g.yaml"
    stack_file.write_text(base + up)
    runner = FakeStackRunner(
        "g", compute=fake, project=fake.project, node_factory=default_node_factory("g", nodes)
    )
    runner.up()
    runner._outputs |= recorded
    stack_file.write_text(base + now)
    monkeypatch.chdir(tmp_path)
    clients = GceClients(runner_for=lambda s, r: runner, compute_endpoint=fake.url, retry_pause_s=0)
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    return main(["train", "--stack", "g", "--budget", budget, "--", "job.py"], settings, clients)


def test_train_refuses_a_cluster_its_stack_file_no_longer_describes(
    tmp_path: Path,
    fake: FakeCompute,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`up` made 4 on-demand nodes; the file now says 1 spot node, so a $2.10 budget passes
    the plan against the file though the cluster costs about ten times as much. The run is
    refused in one line before anything starts: its caps, its watchdog's rate and a
    recovery's `up` read the file."""
    status = _train_on_an_edited_stack(
        tmp_path,
        fake,
        monkeypatch,
        up="  gputrain:nodes: 4\n  gputrain:capacity: on-demand\n",
        now="  gputrain:nodes: 1\n  gputrain:capacity: spot\n",
        recorded={"nodeCount": 4, "spot": False, "machineType": "g2-standard-8"},
        budget="2.1",
        nodes=4,
    )
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "gputrain: error: stack g: the cluster that is up is not what its stack file says now "
        "(nodes: 4 up, 1 in the file; capacity: not spot up, spot in the file), and the run's "
        "spending caps, budget and recoveries go by the file; `gputrain up --stack g` makes the "
        "cluster what the file says, or put the file back; nothing was started"
    )
    assert not (tmp_path / "runs" / "stack-g").exists()  # no run was started


def test_train_refuses_a_cluster_whose_disks_the_stack_file_no_longer_describes(
    tmp_path: Path,
    fake: FakeCompute,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`up` gave the node a 2,000 GB pd-ssd boot disk and a Local SSD; the file now says the
    default disks, so a budget that covers the file's node but not the cluster's passes the
    plan. The outputs record the disks: the run is refused in one line naming each."""
    disks = {"bootDiskType": "pd-ssd", "bootDiskGb": "2000", "localSsdCount": "1"}
    shape = {"nodes": "1", "capacity": "spot"}  # g2-standard-8 for 1h, as the file says
    on = {"machineType": "g2-standard-8", "maxRunDuration": "1h", **shape}
    up, now = spec(**on, **disks), spec(**on)
    cluster_rate, file_rate = worst_hourly(up), worst_hourly(now)
    assert cluster_rate is not None and file_rate is not None
    budget = f"{(cluster_rate + file_rate) / 2:.2f}"  # for 1h: the file's node, not the cluster's
    check_caps(now, budget=float(budget), budget_setting="--budget")
    with pytest.raises(UserError, match="may cost"):
        check_caps(up, budget=float(budget), budget_setting="--budget")
    status = _train_on_an_edited_stack(
        tmp_path,
        fake,
        monkeypatch,
        up="".join(f"  gputrain:{k}: {v}\n" for k, v in (shape | disks).items()),
        now="".join(f"  gputrain:{k}: {v}\n" for k, v in shape.items()),
        recorded={"bootDiskType": "pd-ssd", "bootDiskGb": 2000, "localSsdCount": 1},
        budget=budget,
    )
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "gputrain: error: stack g: the cluster that is up is not what its stack file says now "
        "(bootDiskType: pd-ssd up, pd-balanced in the file; bootDiskGb: 2000 up, 200 in the "
        "file; localSsdCount: 1 up, 0 in the file), and the run's spending caps"
    )
    assert "\n" not in err and not (tmp_path / "runs" / "stack-g").exists()
