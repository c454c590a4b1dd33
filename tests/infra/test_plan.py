"""`gputrain plan`: the pure plan and the CLI command that prints it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import vertex
from infra.offers import price_table, vm_price
from infra.plan import HEADERS, build_plan, plan_stack
from infra.spec import parse_spec
from scripts.cli import main
from tests.support.pulumi_mocks import ROOT, deployable_config

SHIPPED = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))


@pytest.mark.parametrize("stack", SHIPPED)
def test_every_shipped_stack_plans(stack: str) -> None:
    """plan's figures come from infra/prices.csv: the zone's price (Vertex: the region's + 15 %)."""
    plan = plan_stack(ROOT, stack)
    spec = plan.spec
    gpu = spec.accelerator if spec.attach_gpus else None
    count = spec.gpus_per_node if gpu else 0
    if spec.on_vertex:  # a replica's price: Compute Engine's plus the training premium
        price = vertex.vertex_price(spec.machine_type, gpu, count, spec.region)
        assert price is not None and price.note.endswith(vertex.SURCHARGE_BASIS)
    else:
        price = vm_price(spec.machine_type, spec.zone, gpu, count)
    row = dict(zip(HEADERS, plan.row, strict=True))
    if (
        price is None or price.hourly(spec.spot) is None
    ):  # a4: no price in the data (tests/infra/test_catalog.py UNPRICED): never $0
        assert stack == "a4" and plan.hourly_per_node is None and plan.worst_case is None
        assert (row["$/h per node"], row["worst case $"]) == ("unknown", "unknown")
        return
    per_node = price.hourly(spec.spot)
    assert per_node is not None
    assert plan.hourly_per_node == pytest.approx(per_node)
    assert plan.hourly_total == pytest.approx(per_node * spec.nodes)
    assert plan.worst_case == pytest.approx(per_node * spec.nodes * spec.max_run_duration_s / 3600)
    assert row["nodes"] == str(spec.nodes) and row["machine type"] == spec.machine_type
    where = f"{spec.region} (Vertex AI)" if spec.on_vertex else spec.zone
    assert row["zone"] == where and row["TTL"] == spec.max_run_duration
    assert row["worst case $"] == f"${plan.worst_case:,.2f}"
    assert not plan.ready and len(plan.missing) == (1 if spec.on_vertex else 3)
    footer = "\n".join(plan.footer_lines())
    assert price_table().as_of in footer and price_table().source in footer
    assert (f"gputrain keygen --stack {stack}" in footer) != spec.on_vertex
    assert (plan.candidates is not None) == bool(spec.gpus_request)


def test_dev_plan_figures() -> None:
    plan = plan_stack(ROOT, "dev")
    row = dict(zip(HEADERS, plan.row, strict=True))
    assert row["GPUs per node"] == "2 x NVIDIA L4 (24 GB)"
    assert row["capacity"] == "spot" and row["TTL"] == "3h"
    # prices.csv: g2-standard-24 in us-central1-a, Spot 0.79862/h; 3 h -> 2.40
    assert (row["$/h per node"], row["$/h total"], row["worst case $"]) == (
        "$0.80",
        "$0.80",
        "$2.40",
    )
    assert "2 x PREEMPTIBLE_NVIDIA_L4_GPUS" in plan.price_note
    # its 200 GB pd-balanced boot disk at $0.10 per GiB-month, 730 hours: the caps count it,
    # and so does the run's cost estimate
    assert (
        "; boot disk and Local SSD $0.03/h per node more (in the spending caps and the cost "
        "estimate); network "
    ) in plan.price_note
    assert "disks and network extra" not in plan.price_note


def test_multi_node_worst_case_scales_with_nodes_and_ttl() -> None:
    one = build_plan(parse_spec(deployable_config("h100", nodes="1", placement="none"), "h100"))
    two = build_plan(parse_spec(deployable_config("h100", nodes="2", maxRunDuration="16h"), "h100"))
    assert two.worst_case == pytest.approx(one.worst_case * 4)


def test_plan_always_shows_the_ssh_exposure() -> None:
    unset = plan_stack(ROOT, "dev").footer_lines()
    assert "SSH exposure: port 22 on the head node, from nowhere yet" in unset[1]
    one = build_plan(parse_spec(deployable_config("dev"), "dev")).footer_lines()[1]
    assert one == (
        "SSH exposure: port 22 on the head node (public IP), from 203.0.113.7/32 (1 address); "
        "nodes reach each other by network tag"
    )
    world = deployable_config(
        "dev",
        sshSourceRanges='["0.0.0.0/1", "128.0.0.0/1"]',
        allowSshFromAnywhere="true",
        publicIp="all",
    )
    line = build_plan(parse_spec(world, "dev")).footer_lines()[1]
    assert "port 22 on every node" in line
    assert "(4,294,967,296 addresses, the whole IPv4 internet)" in line


def test_complete_stack_is_ready() -> None:
    plan = build_plan(parse_spec(deployable_config("dev"), "dev"))
    assert plan.ready and plan.footer_lines()[-1] == "Ready: pulumi up --stack dev"


def test_cli_plan_prints_table_and_next_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--stack", "dev", "--dir", str(ROOT)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "gputrain plan: stack dev"
    assert lines[1].split()[:2] == ["nodes", "machine"]
    assert lines[2].split()[:2] == ["1", "g2-standard-24"]
    assert "pulumi config set gcp:project YOUR_PROJECT_ID --stack dev" in out
    assert "gputrain keygen --stack dev" in out


def test_cli_plan_bad_config_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.bad.yaml").write_text(
        "config:\n  gputrain:machineType: n1-standard-8\n  gputrain:gpuType: nvidia-tesla-t4\n  gputrain:gpuCount: 8\n"
    )
    assert main(["plan", "--stack", "bad", "--dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        captured.err
        == "gputrain: error: gputrain:gpuCount = '8': allowed for nvidia-tesla-t4: 1, 2, 4\n"
    )


def test_cli_help_is_fast_and_plan_never_imports_pulumi() -> None:
    code = (
        # modules the interpreter starts with (e.g. the empty `google` namespace that
        # google-cloud-aiplatform's nspkg .pth creates) are not the CLI's doing
        # CPU seconds, not wall: under make test's load the wall clock is the machine's queue
        "import sys, time; t = time.process_time(); before = set(sys.modules)\n"
        "import scripts.cli as c\n"
        "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('HELP', time.process_time() - t, file=sys.stderr)\n"
        f"c.main(['plan', '--stack', 'dev', '--dir', {str(ROOT)!r}])\n"
        "print('HEAVY', sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('pulumi', 'pulumi_gcp', 'google', 'paramiko', 'torch')), file=sys.stderr)\n"
    )
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert time.perf_counter() - start < 5
    help_s = float(proc.stderr.split("HELP ")[1].split()[0])
    assert help_s < 0.5
    assert "HEAVY []" in proc.stderr
    assert "usage: gputrain" in proc.stdout and "g2-standard-24" in proc.stdout


def test_fabric_stacks_plan_their_capacity_network_and_cost_per_mode() -> None:
    a4 = plan_stack(ROOT, "a4")
    row = dict(zip(HEADERS, a4.row, strict=True))
    assert row["capacity"] == "reservation" and row["nodes"] == "2"
    assert "derived: a reservation bills at on-demand" in a4.price_note
    assert (
        "Quota: none used; the reservation my-a4-reservation must have 2 free VMs" in a4.price_note
    )
    assert a4.capacity_note.startswith(
        "Capacity: reservation my-a4-reservation (provisioningModel RESERVATION_BOUND"
    )
    assert "no placement policy (the capacity places the VMs densely itself)" in a4.capacity_note
    # no A4 price in the data: every mode says unknown, never $0
    assert "offered in: spot unknown, flex-start unknown, reservation unknown." in a4.capacity_note
    assert "3 VPCs and 10 subnets from 10.42.0.0/16" in a4.fabric_note
    assert ">= 341.5 GB/s" in a4.fabric_note
    mega = plan_stack(ROOT, "a3mega")
    assert "GPUDirect-TCPXO" in mega.fabric_note and "9 VPCs and 9 subnets" in mega.fabric_note
    assert "compact placement policy" in mega.capacity_note
    mega_price = vm_price("a3-megagpu-8g", mega.spec.zone)
    assert mega_price is not None and mega_price.spot and mega_price.on_demand
    assert (
        f"offered in: on-demand ${mega_price.on_demand:,.2f}, spot ${mega_price.spot:,.2f}, "
        f"flex-start <= ${mega_price.on_demand:,.2f}, reservation ${mega_price.on_demand:,.2f}."
    ) in mega.capacity_note
    footer = mega.footer_lines()
    assert footer.index(mega.capacity_note) < footer.index(mega.fabric_note)
    flex = build_plan(parse_spec(deployable_config("a3mega", capacity="flex-start"), "a3mega"))
    assert "upper bound of Flex-start (derived" in flex.price_note
    assert "PREEMPTIBLE_NVIDIA_H100_MEGA_GPUS" in flex.price_note
    assert plan_stack(ROOT, "h100").fabric_note == ""  # one NIC: a warning says what it costs


def test_flex_start_on_g2_is_priced_on_demand_not_as_an_upper_bound() -> None:
    """Flex-start is discounted on A2/A3/A4, not on G2 (Compute's Flex-start pricing)."""
    from infra.plan import build_plan
    from infra.spec import parse_spec
    from infra.stackfile import load_stack_config

    config = load_stack_config(ROOT, "dev") | {
        "gputrain:capacity": "flex-start",
        "gputrain:spot": "",
    }
    g2 = build_plan(parse_spec(config, "dev"))
    assert "on-demand (Flex-start is not discounted on G2)" in g2.price_note
    assert "flex-start <= " not in g2.capacity_note and "flex-start $" in g2.capacity_note


def test_plan_shows_the_capacity_list_its_worst_case_and_the_wait() -> None:
    from infra.plan import build_plan
    from infra.spec import parse_spec
    from infra.stackfile import load_stack_config

    config = load_stack_config(ROOT, "dev") | {
        "gputrain:capacity": '["spot", "on-demand"]',
        "gputrain:spot": "",
        "gputrain:waitForCapacity": "45m",
    }
    spec = parse_spec(config, "dev")
    note = build_plan(spec).capacity_note
    spot, demand = (spec.price.hourly(s) for s in (True, False)) if spec.price else (0, 0)
    worst = demand * spec.nodes * spec.max_run_duration_s / 3600
    assert f"Capacity list: spot ${spot:,.2f} -> on-demand ${demand:,.2f} per node/h" in note
    assert f"worst case at the dearest: ${worst:,.2f}." in note
    assert "retried for up to 45m (waitForCapacity)" in note


def test_rdma_stacks_default_to_the_accelerator_image_and_plan_says_why_and_what_verify_measures() -> (
    None
):
    """Google's NCCL page: gIB needs DOCA-OFED on standard OS images (DLVM); its accelerator
    images carry it. The published A3 Ultra figure is all_gather at 8 GB: verify measures that."""
    a4 = plan_stack(ROOT, "a4")
    assert (a4.spec.image_project, a4.spec.image_family) == (
        "ubuntu-os-accelerator-images",
        "ubuntu-accelerator-2204-amd64-with-nvidia-580",
    )
    assert "Node image: ubuntu-os-accelerator-images/" in a4.fabric_note
    assert "DOCA-OFED" in a4.fabric_note
    assert "measures all_reduce up to 8 GiB" in a4.fabric_note
    mega = plan_stack(ROOT, "a3mega")  # TCPXO: the DLVM default stays
    assert mega.spec.image_project == "deeplearning-platform-release"
    assert "measures all_gather up to 8 GiB" in mega.fabric_note
    from infra.spec import parse_spec
    from infra.stackfile import load_stack_config

    dlvm = load_stack_config(ROOT, "a4") | {
        "gputrain:imageFamily": "common-cu129-ubuntu-2204-nvidia-580"
    }
    warned = build_plan(parse_spec(dlvm, "a4")).warnings
    assert any("DOCA-OFED driver there, which gputrain does not install" in w for w in warned)
    ultra = parse_spec(
        load_stack_config(ROOT, "a4") | {"gputrain:machineType": "a3-ultragpu-8g"}, "a4"
    )
    assert ultra.fabric is not None
    expect = ultra.fabric.expectation()
    assert (expect.collective, expect.probe_bytes) == ("all_gather", 8 * 2**30)
