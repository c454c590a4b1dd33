"""The GPU fabric on the nodes, over SSH: the idempotent setup (plugin, NCCL env file the launcher
sources) and `verify --fabric` (NICs, MTU, RDMA devices or the TCPXO daemon on every node, then a
short 2-node all-reduce). Pure rules live in scripts/verify/fabric_setup.py and scripts/verify/fabric_check.py;
this module only runs them on a fleet and says which node failed which check."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from gputrain_node import contract
from infra.base.records import Fleet
from infra.fabric import FabricExpectation, FabricKind, FabricPlan
from scripts import ui
from scripts.node_layout import NCCL_ENV_FILE
from scripts.parallel import parallel
from scripts.transport.base import Transport
from scripts.verify.fabric_check import (
    NCCL_ENV,
    PROBE_COMMAND,
    check_allreduce,
    check_probe,
    parse_probe,
)
from scripts.verify.fabric_setup import (
    SETUP_COMMAND,
    FabricSetupError,
    SetupReport,
    install_env_command,
    nccl_env,
    parse_setup_report,
    setup_script,
)
from scripts.verify.nodes import VerificationError

SETUP_TIMEOUT_S = 900.0  # apt, a DKMS build and two image pulls on a fresh node
PROBE_ENTRY = contract.HEALTHCHECK_ENTRY


@dataclass(frozen=True)
class FabricCheck:
    """What a target's nodes must have: the fabric kind, its expectation, the machine type."""

    kind: FabricKind
    machine_type: str
    expect: FabricExpectation

    @classmethod
    def of(cls, plan: FabricPlan | None) -> FabricCheck | None:
        """The check of a stack's fabric plan; None when the stack has no fabric."""
        if plan is None or not plan.enabled:
            return None
        return cls(plan.kind, plan.machine_type, plan.expectation())


def _fail(what: str, problems: dict[str, list[str]]) -> None:
    failing = {n: p for n, p in problems.items() if p}
    if failing:
        raise VerificationError(
            f"{what} failed on {len(failing)} of {len(problems)} node(s); nothing was trained:\n"
            + "\n".join(f"  {n}: {'; '.join(p)}" for n, p in failing.items())
        )


def setup_fabric(
    fleet: Fleet, transports: dict[str, Transport], kind: FabricKind
) -> dict[str, SetupReport]:
    """Run the series' setup as root on every node and write its NCCL env file there."""
    script = setup_script(kind).encode()

    def one(name: str) -> SetupReport:
        t = transports[name]
        r = t.run(SETUP_COMMAND, timeout=SETUP_TIMEOUT_S, stdin=script)
        report = parse_setup_report(r.stdout + r.stderr, name)
        w = t.run(install_env_command(), timeout=60, stdin=nccl_env(kind, report, name).encode())
        if not w.ok:
            detail = (w.stderr.strip() or w.stdout.strip() or f"exit {w.exit_code}")[:200]
            raise FabricSetupError(f"{name}: could not write ~/{NCCL_ENV_FILE} ({detail})")
        return report

    names = [n.name for n in fleet.nodes]
    with ui.status_lines() as status:
        for n in names:
            status.update(n, f"setting up the GPU network ({kind})")
        reports, errors = parallel(names, one)
    _fail("fabric setup", {n: [str(errors[n])] if n in errors else [] for n in names})
    return reports


def probe_fabric(
    fleet: Fleet,
    transports: dict[str, Transport],
    expect: FabricExpectation,
    primaries: dict[str, str] | None = None,
) -> dict[str, list[str]]:
    """Every node's NIC, MTU, RDMA and daemon problems (empty lists: fine)."""

    def one(name: str) -> list[str]:
        r = transports[name].run(PROBE_COMMAND, timeout=60)
        return check_probe(parse_probe(r.stdout), expect, (primaries or {}).get(name))

    names = [n.name for n in fleet.nodes]
    results, errors = parallel(names, one)
    return {n: [f"probe: could not run: {errors[n]}"] if n in errors else results[n] for n in names}


def allreduce_probe(
    fleet: Fleet,
    transports: dict[str, Transport],
    check: FabricCheck,
    results_dir: Path,
    run_id: str,
) -> list[str]:
    """A short all-reduce (A4) or all-gather (A3 Mega/Ultra: what their published figures
    measured) between the first two nodes under NCCL_DEBUG=INFO (gloo on CPU)."""
    from scripts.job.launch import launch_torchrun
    from scripts.job.records import Job

    two = dataclasses.replace(fleet, nodes=fleet.nodes[:2])
    entry = (  # the collective the published figure measured, up to its size (on GPUs)
        *PROBE_ENTRY,
        "--collective",
        check.expect.collective,
        "--gpu-max-bytes",
        str(check.expect.probe_bytes),
    )
    job = Job(run_id=run_id, entry=entry, env=dict(NCCL_ENV), max_duration_s=600)
    lines: list[str] = []
    try:
        launch_torchrun(
            two,
            {n.name: transports[n.name] for n in two.nodes},
            job,
            results_dir,
            on_line=lambda _node, line: lines.append(line),
        )
    except Exception as e:  # the probe's own failure is a finding, not a crash
        return [f"busbw: the all-reduce probe failed ({' '.join(str(e).split())[:300]})"]
    health = next(iter(sorted(results_dir.rglob("health.json"))), None)
    text = health.read_text() if health else None
    return check_allreduce("\n".join(lines), text, check.expect, check.machine_type)


def verify_fabric(
    fleet: Fleet,
    transports: dict[str, Transport],
    check: FabricCheck,
    results_dir: Path,
    run_id: str,
    primaries: dict[str, str] | None = None,
) -> None:
    """Probe every node, then the 2-node all-reduce; print one table; raise VerificationError
    naming each failing node and check, before any training starts."""
    problems = probe_fabric(fleet, transports, check.expect, primaries)
    if not any(problems.values()) and len(fleet.nodes) > 1:
        pair = f"{fleet.nodes[0].name}+{fleet.nodes[1].name}"
        problems[pair] = allreduce_probe(fleet, transports, check, results_dir, run_id)
    e = check.expect
    ui.table(
        f"GPU network verification ({check.kind}: {e.nics} NICs"
        + (f", MTU {e.mtu}" if e.mtu else "")
        + (f", {e.rdma_devices} RDMA devices" if e.rdma_devices else "")
        + ")",
        ["node", "status", "problems"],
        [[n, "PROBLEM" if p else "ok", "; ".join(p) or "-"] for n, p in problems.items()],
    )
    _fail("GPU network verification", problems)
