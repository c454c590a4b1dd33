"""`verify`, before any training starts: every node has the GPUs that were asked for (nvidia-smi),
and a node whose VM has local NVMe SSDs has them mounted at /mnt/gputrain-scratch (its startup
script does it at boot; this waits a little for it; nodes without local SSD pass). And the GPU
fabric on the nodes, over SSH: the idempotent setup (plugin, NCCL env file the launcher sources)
and `verify --fabric` (NICs, MTU, RDMA devices or the TCPXO daemon on every node, then a short
2-node all-reduce). The fabric's pure rules live in scripts/verify/fabric_setup.py and
scripts/verify/fabric_check.py; this module only runs them on a fleet and says which node failed
which check."""

from __future__ import annotations

import dataclasses
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gputrain_node import contract
from infra.base.errors import GputrainError
from infra.base.records import Fleet, GpuExpectation
from infra.base.retry import GaveUp, NotReady, poll_until
from infra.fabric import FabricExpectation, FabricKind, FabricPlan
from infra.scratch import LOCAL_SSD_GLOB, SCRATCH_MOUNT
from scripts import ui
from scripts.job.node_scripts import (
    TRAINER_PACKAGES,
    Requirement,
    SectionResult,
    build_install_command,
    report_install,
)
from scripts.node_layout import NCCL_ENV_FILE
from scripts.parallel import parallel
from scripts.transport.base import CommandResult, Transport, TransportError
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

GPU_FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "driver_version",
    "ecc.errors.uncorrected.volatile.total",
    "pci.bus_id",
    "temperature.gpu",
    "utilization.gpu",
)
NVIDIA_SMI_QUERY = f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits"
# nvidia-smi from PATH, then the places images put it (appended: never shadows the node's own).
NODE_QUERY = (
    'PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/nvidia/bin:/var/lib/nvidia/bin" '
    f"{NVIDIA_SMI_QUERY}"
)


_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')


class DriverTooOld(Exception):
    """nvidia-smi answered, but cannot report a field we query: fails the node at once."""


class VerificationError(GputrainError):
    """One or more nodes do not have what was asked; the message lists every one and why."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_mib: int | None
    driver_version: str | None
    ecc_uncorrected: int | None  # None: unknown (N/A, ECC off, or not reported)
    pci_bus_id: str | None = None
    temperature_c: int | None = None


@dataclass(frozen=True)
class NodeReport:
    node: str
    ok: bool
    gpus: tuple[GpuInfo, ...] = ()
    problems: tuple[str, ...] = ()
    waited_s: float = 0.0
    torch: bool | None = None  # the interpreter on the node can import torch
    installed: SectionResult | None = None  # what the install step answered, when there was one
    notes: tuple[str, ...] = field(default=())


def _unknown(value: str) -> bool:
    return value.strip() in (
        "",
        "N/A",
        "[N/A]",
        "[Not Supported]",
        "Not Supported",
        "[Unknown Error]",
    )


def _int_or_none(value: str) -> int | None:
    if _unknown(value):
        return None
    try:
        return int(float(value.strip().split()[0]))
    except ValueError:
        return None


def parse_gpu_csv(text: str) -> list[GpuInfo]:
    """Rows of ``nvidia-smi --query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits``.
    Raises ValueError when the output is not that CSV (e.g. an error message)."""
    gpus = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        cells = [c.strip() for c in raw.split(",")]
        if len(cells) != len(GPU_FIELDS) or not cells[0].isdigit():
            raise ValueError(f"unexpected nvidia-smi line: {raw.strip()[:120]!r}")
        gpus.append(
            GpuInfo(
                index=int(cells[0]),
                name=cells[1],
                uuid=cells[2],
                memory_mib=_int_or_none(cells[3]),
                driver_version=None if _unknown(cells[4]) else cells[4],
                ecc_uncorrected=_int_or_none(cells[5]),
                pci_bus_id=None if _unknown(cells[6]) else cells[6],
                temperature_c=_int_or_none(cells[7]),
            )
        )
    return gpus


def check_gpus(gpus: list[GpuInfo], expect: GpuExpectation) -> list[str]:
    """Every way these GPUs differ from what was asked (empty: fine)."""
    problems: list[str] = []
    if expect.is_cpu:
        return problems
    if len(gpus) < expect.count:
        problems.append(f"found {len(gpus)} GPU(s), expected {expect.count}")
    elif len(gpus) > expect.count:
        problems.append(f"found {len(gpus)} GPU(s), expected {expect.count} (more than asked)")
    for g in gpus:
        if expect.model and g.name != expect.model:
            problems.append(f"GPU {g.index} is {g.name!r}, expected {expect.model!r}")
        if expect.min_memory_mib and (g.memory_mib or 0) < expect.min_memory_mib:
            problems.append(
                f"GPU {g.index} has {g.memory_mib if g.memory_mib is not None else 'unknown'} MiB, "
                f"expected at least {expect.min_memory_mib} MiB"
            )
        if g.ecc_uncorrected:
            problems.append(f"GPU {g.index} has {g.ecc_uncorrected} uncorrected ECC error(s)")
        if g.driver_version is None:
            problems.append(f"GPU {g.index}: driver version unknown")
    return problems


def torch_check_command(python: str) -> str:
    """Cheap check that the node's interpreter can import torch (find_spec, no import cost)."""
    code = "import importlib.util as u; print('torch', u.find_spec('torch') is not None)"
    return f"{shlex.quote(python)} -c {shlex.quote(code)}"


def verify_node(
    transport: Transport,
    expect: GpuExpectation,
    python: str,
    deadline_s: float,
    status: ui.StatusLines | None = None,
    install: Sequence[Requirement] = (),
) -> NodeReport:
    """Query nvidia-smi until it answers (the driver may still be installing) or the deadline;
    meanwhile the node's status line says why it waits. ``install``: first, in the same round
    trip, pip-install what the interpreter lacks of these (a probe where all is there)."""
    status = status or ui.StatusLines(tty=False)
    start = time.monotonic()
    name = transport.name
    # first round: the install probe, the torch check and the GPU query in one round trip
    marker, install_marker = "@@gputrain-nvidia-smi@@", "@@gputrain-install@@"
    prelude = (
        f'( {build_install_command(python, install)} ); echo "{install_marker}$?"; '
        if install
        else ""
    )
    r = transport.run(
        f'{prelude}{torch_check_command(python)}; echo "{marker}"; {NODE_QUERY}; echo "{marker}$?"',
        timeout=1800 if install else 60,  # torch's CUDA wheels are large
    )
    installed = None
    if install:
        install_out, _, after = r.stdout.partition(install_marker)
        rc, _, rest_out = after.partition("\n")
        installed = SectionResult(int(rc) if rc.isdigit() else 1, install_out)
        r = CommandResult(r.exit_code, rest_out, r.stderr)
    head, _, rest = r.stdout.partition(marker + "\n")
    smi_out, _, rc_text = rest.rpartition(marker)
    has_torch = "torch True" in head
    problems: list[str] = []
    if not has_torch:
        detail = (r.stderr.strip() or head.strip()).splitlines()
        problems.append(
            f"{python} cannot import torch ({detail[-1] if detail else f'exit {r.exit_code}'})"
        )
    first: list[CommandResult] = [
        CommandResult(
            int(rc_text.strip() or 1) if rc_text.strip().isdigit() else 1, smi_out, r.stderr
        )
    ]

    def query() -> list[GpuInfo]:
        """The GPUs, or NotReady(why) while nvidia-smi cannot list them yet."""
        smi = first.pop() if first else transport.run(NODE_QUERY, timeout=60)
        if not smi.ok:
            bad_field = _INVALID_FIELD.search(smi.stderr + smi.stdout)
            if bad_field:  # an answer, not a driver still starting: waiting cannot change it
                raise DriverTooOld(
                    f'nvidia-smi does not know the field "{bad_field.group(1)}" (its driver is '
                    "older than this query needs); use a newer driver or image"
                )
            out = (smi.stderr.strip() or smi.stdout.strip()).splitlines()
            raise NotReady(
                "nvidia-smi not found"
                if smi.exit_code == 127
                else f"nvidia-smi exit {smi.exit_code}: {out[-1] if out else ''}"
            )
        try:
            return parse_gpu_csv(smi.stdout)
        except ValueError as e:
            raise NotReady(str(e)) from e

    gpus: list[GpuInfo] = []
    try:
        gpus = poll_until(
            query,
            deadline_s=0
            if expect.is_cpu
            else deadline_s,  # no GPU needed: nvidia-smi may be absent
            delay=lambda _n, elapsed: min(2.0, max(0.2, elapsed / 4)),
            on_wait=lambda w: status.update(
                name, f"waiting for the GPU driver ({w.reason}), {w.left_s:.0f} s left"
            ),
        )
    except GaveUp as e:
        if not expect.is_cpu:
            problems.append(f"driver not ready after {deadline_s:.0f} s ({e.reason})")
    except DriverTooOld as e:
        problems.append(str(e))
    problems += check_gpus(gpus, expect)
    return NodeReport(
        name,
        ok=not problems,
        gpus=tuple(gpus),
        problems=tuple(problems),
        waited_s=time.monotonic() - start,
        torch=has_torch,
        installed=installed,
    )


def verify_gpus(
    fleet: Fleet, transports: dict[str, Transport], *, deadline_s: float
) -> list[NodeReport]:
    """Check every node in parallel, print a per-node table, raise if any node is not right.
    On the stack's own VMs an image without PyTorch gets it first, in the same round trip (a
    probe where it is there); a node where pip fails is named with pip's last lines."""
    install = TRAINER_PACKAGES if fleet.install_trainer else ()

    def one(name: str) -> NodeReport:
        return verify_node(
            transports[name], fleet.expect, fleet.python, deadline_s, status, install
        )

    names = [n.name for n in fleet.nodes]
    with ui.status_lines() as status:
        results, errors = parallel(names, one)
    if install:
        failed = []
        for name, report in results.items():
            if report.installed is not None:
                try:
                    why = "the image has no PyTorch"
                    report_install(fleet.python, install, why, name, report.installed)
                except TransportError as err:
                    failed.append(str(err))
        if failed:
            raise TransportError("\n".join(failed))
    for name, e in errors.items():
        results[name] = NodeReport(name, ok=False, problems=(f"could not check: {e}",))
    reports = [results[n] for n in names]
    expected = (
        "cpu"
        if fleet.expect.is_cpu
        else f"{fleet.expect.count} x {fleet.expect.model or 'any GPU'}"
    )
    rows = []
    for rep in reports:
        models = sorted({g.name for g in rep.gpus})
        mem = sorted({g.memory_mib for g in rep.gpus if g.memory_mib is not None})
        rows.append(
            [
                rep.node,
                "ok" if rep.ok else "PROBLEM",
                f"{len(rep.gpus)} x {', '.join(models)}" if rep.gpus else "-",
                f"{mem[0]} MiB" if mem else "-",
                next((g.driver_version for g in rep.gpus if g.driver_version), "-"),
                "; ".join(rep.problems) or "-",
            ]
        )
    ui.table(
        f"GPU verification (expected per node: {expected})",
        ["node", "status", "gpus", "memory", "driver", "problems"],
        rows,
    )
    failing = [r for r in reports if not r.ok]
    if failing:
        raise VerificationError(
            f"{len(failing)} of {len(reports)} node(s) failed verification:\n"
            + "\n".join(f"  {r.node}: {'; '.join(r.problems)}" for r in failing)
        )
    return reports


def build_scratch_probe(
    wait_s: int = 120, mount: str = SCRATCH_MOUNT, devices: str = LOCAL_SSD_GLOB
) -> str:
    """Prints `none`, `mounted <size>` or `not-mounted <disks>`. Pure."""
    tries = max(1, wait_s // 2)
    return (
        f"DEVS=$(ls {devices} 2>/dev/null | grep -v -- -part | wc -l); "
        '[ "$DEVS" -gt 0 ] || { echo none; exit 0; }; '
        f"i=0; while ! mountpoint -q {mount} && [ $i -lt {tries} ]; do sleep 2; i=$((i+1)); done; "
        f"if mountpoint -q {mount}; then echo mounted $(df -h --output=size {mount} | tail -1); "
        'else echo not-mounted "$DEVS"; fi'
    )


def scratch_verdict(node: str, output: str) -> str | None:
    """None when the node passes; else why not. Pure."""
    word, _, rest = output.strip().partition(" ")
    if word in ("none", "mounted"):
        return None
    if word == "not-mounted":
        return (
            f"node {node}: its {rest} local SSD(s) are not mounted at {SCRATCH_MOUNT} (the "
            "startup script assembles them at boot: `sudo journalctl -u google-startup-scripts` "
            "on the node says why)"
        )
    return f"node {node}: could not check its local SSD: {output.strip() or 'no answer'}"


def verify_scratch(fleet: Fleet, transports: Mapping[str, Transport]) -> None:
    probe = build_scratch_probe()

    def one(name: str) -> str:
        return transports[name].run(probe, 180).stdout

    names = [n.name for n in fleet.nodes]
    results, errors = parallel(names, one)
    bad = [scratch_verdict(n, results.get(n, str(errors.get(n, "")))) for n in names]
    if any(bad):
        raise GputrainError("\n".join(b for b in bad if b))
    sizes = {
        n: results[n].split(" ", 1)[1].strip() for n in names if results[n].startswith("mounted")
    }
    if sizes:
        ui.say(
            f"local SSD mounted at {SCRATCH_MOUNT}: "
            + ", ".join(f"{n} {s}" for n, s in sizes.items())
        )


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
