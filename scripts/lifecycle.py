"""The whole lifecycle: plan -> preflight -> up (zone failover) -> host keys -> verify -> train ->
collect -> destroy -> sweep. Every step after the first resource exists runs under a teardown that
no failure, Ctrl-C or SIGTERM can skip.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.base.errors import GputrainError, UserError
from infra.base.records import Fleet, GpuExpectation, Node
from scripts import ui
from scripts.guard import SignalGuard, signal_guard

if TYPE_CHECKING:
    from infra.compute import ComputeApi
    from infra.spec import ClusterSpec
    from infra.sweep import Leftover
    from scripts.job.records import JobResult
    from scripts.stack import StackRunner
    from scripts.transport.base import Transport

ROOT = Path(__file__).resolve().parent.parent


def find_project_root(start: Path | None = None) -> Path:
    """The Pulumi project: the nearest directory upwards with Pulumi.yaml, else this checkout."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "Pulumi.yaml").is_file():
            return d
    return ROOT


LAST_RUN = "LAST_RUN"  # runs/<target>/LAST_RUN: the id `gputrain logs` follows by default


@dataclass
class Services:
    """The I/O edges of the lifecycle, swappable in tests (fake Pulumi, fake Compute endpoint)."""

    root: Path = field(default_factory=find_project_root)
    runs_dir: Path = field(default_factory=lambda: Path.cwd() / "runs")
    runner_for: Callable[[str, Path], StackRunner] | None = None
    compute_endpoint: str | None = field(
        default_factory=lambda: os.environ.get("GPUTRAIN_COMPUTE_ENDPOINT") or None
    )
    connect_deadline_s: float = 900.0
    verify_deadline_s: float = 900.0
    hostkey_deadline_s: float = 600.0
    destroy_attempts: int = 3
    retry_pause_s: float = 10.0
    node_python: str = "python3"  # interpreter with torch on GCP nodes (the DLVM's)

    def compute(self) -> ComputeApi:
        from infra.compute import ComputeApi

        return ComputeApi(self.compute_endpoint)

    def runner(self, stack: str) -> StackRunner:
        if self.runner_for is not None:
            return self.runner_for(stack, self.root)
        from scripts.stack import PulumiStackRunner

        return PulumiStackRunner(stack, self.root)


@dataclass(frozen=True)
class Target:
    """Where a job runs: a Pulumi stack on GCP, machines from a hosts file, or this machine."""

    kind: str  # "stack" | "hosts" | "local"
    value: str = ""


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


# ---------------------------------------------------------------- stack: spec, plan, keys


def load_spec(stack: str, services: Services) -> ClusterSpec:
    from infra.spec import parse_spec
    from infra.stackfile import load_stack_config

    return parse_spec(load_stack_config(services.root, stack), stack)


def show_plan(spec: ClusterSpec) -> None:
    from infra.plan import HEADERS, build_plan

    plan = build_plan(spec)
    ui.table(plan.title, HEADERS, [plan.row])
    for line in plan.footer_lines():
        ui.say(line)


def keygen(stack: str, services: Services, *, force: bool) -> None:
    """Create the stack's SSH key pair once and store it in the stack config (private: secret)."""
    from scripts.keys import generate_ssh_keypair

    spec = load_spec(stack, services)
    if spec.ssh_public_key and not force:
        raise UserError(
            f"gputrain:sshPublicKey is already set for stack {stack}; "
            "pass --force to replace it (running VMs keep the old key until the next up)"
        )
    private, public = generate_ssh_keypair(f"gputrain-{stack}")
    runner = services.runner(stack)
    runner.set_config("gputrain:sshPublicKey", public)
    runner.set_config("gputrain:sshPrivateKey", private, secret=True)
    ui.say(f"keygen: stored a new ed25519 key pair in stack {stack} (private key as a secret)")


@contextmanager
def private_key_file(runner: StackRunner, stack: str) -> Iterator[Path]:
    """The stack's private key in a 0600 file of a 0700 temp dir, removed afterwards."""
    pem = runner.get_config("gputrain:sshPrivateKey")
    if not pem:
        raise UserError(
            f"gputrain:sshPrivateKey is not set for stack {stack}; run `gputrain keygen --stack {stack}`"
        )
    d = Path(tempfile.mkdtemp(prefix="gputrain-key-"))
    path = d / "id_ed25519"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w") as f:
            f.write(pem if pem.endswith("\n") else pem + "\n")
        yield path
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- stack: preflight, up, down


def confirm(spec: ClusterSpec, *, yes: bool) -> None:
    """Ask before spending money, on a terminal only."""
    if yes or not sys.stdin.isatty():
        return
    from infra.plan import build_plan

    plan = build_plan(spec)
    ui.say(
        f"About to create {spec.nodes} x {spec.machine_type} ({spec.gpus_per_node} x "
        f"{spec.gpu_model} each): ~${plan.hourly_total:.2f}/h, "
        f"at most ${plan.worst_case:.2f} before the VMs delete themselves."
    )
    answer = input("Proceed? [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise UserError("cancelled; nothing was created")


def provision(spec: ClusterSpec, runner: StackRunner, zones: Sequence[str]) -> dict[str, object]:
    """`pulumi up` with zone failover; returns the stack outputs."""
    from scripts.failover import provision_with_failover

    zone, outputs = provision_with_failover(
        runner,
        list(zones),
        on_event=ui.say,
        on_output=_pulumi_line,
        expected_nodes=spec.nodes,
        project=spec.project,
    )
    ui.say(f"up: cluster ready in {zone}")
    return outputs


def _pulumi_line(line: str) -> None:
    """Pulumi's own progress, indented under ours."""
    if line.strip():
        ui.say(f"  pulumi: {line.rstrip()}")


def fleet_from_stack(
    spec: ClusterSpec, outputs: dict[str, object], key_file: Path, services: Services
) -> Fleet:
    """Nodes from the stack outputs, each pinned to the host keys its guest agent published."""
    from infra.compute import fetch_host_keys
    from scripts.stack import parse_stack_outputs

    out = parse_stack_outputs(outputs)
    api = services.compute()
    keys = {
        n.name: fetch_host_keys(
            out.project,
            n.zone,
            n.name,
            deadline_s=services.hostkey_deadline_s,
            api=api,
            on_progress=ui.say,
        )
        for n in out.nodes
    }
    return out.to_fleet(spec.stack, keys, identity_file=key_file, python=services.node_python)


def teardown(spec: ClusterSpec, runner: StackRunner, services: Services) -> None:
    """refresh + destroy, retried; then the sweep must find nothing carrying the stack's labels."""
    from scripts.stack import PulumiMissingError

    last: Exception | None = None
    for attempt in range(1, services.destroy_attempts + 1):
        try:
            ui.say(f"down: destroying stack {spec.stack} (attempt {attempt})")
            runner.refresh(on_output=None)
            runner.destroy(on_output=_pulumi_line)
            last = None
            break
        except PulumiMissingError:
            raise
        except Exception as exc:
            last = exc
            ui.warn(f"destroy attempt {attempt} failed: {exc}")
            if attempt < services.destroy_attempts:
                time.sleep(services.retry_pause_s)
    try:
        runner.remove_config("gputrain:zone")
    except Exception as exc:
        ui.warn(f"could not clear gputrain:zone: {exc}")
    leftovers = sweep(spec, services)
    if last is not None or leftovers:
        raise GputrainError(
            f"teardown of stack {spec.stack} is incomplete: "
            + (f"destroy failed ({last}); " if last else "")
            + (f"{len(leftovers)} resource(s) still exist (listed above)" if leftovers else "")
            + f". Run `gputrain down --stack {spec.stack}` again or delete them in the console."
        )
    ui.say(f"down: stack {spec.stack} destroyed; sweep found nothing left")


def sweep(spec: ClusterSpec, services: Services) -> list[Leftover]:
    """List whatever still carries the stack's labels or name prefix; print it loudly."""
    from infra.sweep import sweep as list_leftovers

    if not spec.project:
        raise UserError(f"gcp:project is not set for stack {spec.stack}")
    leftovers = list_leftovers(spec.project, spec.stack, api=services.compute())
    if leftovers:
        ui.table(
            f"LEFT BEHIND by stack {spec.stack}",
            ["kind", "name", "where", "matched by"],
            [[x.kind, x.name, x.location, x.matched_by] for x in leftovers],
        )
    return leftovers


# ---------------------------------------------------------------- fleets for hosts and local


def fleet_for_local() -> Fleet:
    """This machine: GPUs if nvidia-smi finds some, else CPU."""
    count = 0
    if shutil.which("nvidia-smi"):
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if r.returncode == 0:
            count = len([x for x in r.stdout.splitlines() if x.strip()])
    node = Node(name="local", role="head", internal_address="127.0.0.1", address="127.0.0.1")
    return Fleet(
        target="local",
        nodes=(node,),
        expect=GpuExpectation(count=count),
        python=sys.executable,
        local=True,
    )


def fleet_for_hosts(path: str, *, trust_new_hosts: bool) -> tuple[Fleet, Path | None]:
    """The hosts file's fleet, and the known_hosts file to record new keys in (if trusted)."""
    from scripts.hosts import load_hosts_file

    hosts = load_hosts_file(Path(path), trust_new_hosts=trust_new_hosts)
    return hosts.fleet, hosts.known_hosts if trust_new_hosts else None


# ---------------------------------------------------------------- fleet steps


@contextmanager
def connected(
    fleet: Fleet, services: Services, *, record_new_keys: Path | None = None
) -> Iterator[dict[str, Transport]]:
    """Transports to every node (pinned host keys), open for verify, launch and collect."""
    from scripts.connect import close_all, connect

    transports = connect(
        fleet, deadline_s=services.connect_deadline_s, trust_new_hosts=record_new_keys
    )
    try:
        yield transports
    finally:
        close_all(transports)


def verify(fleet: Fleet, transports: dict[str, Transport], services: Services) -> None:
    from scripts.verify import verify_gpus

    verify_gpus(fleet, transports, deadline_s=services.verify_deadline_s)


def train(
    fleet: Fleet,
    transports: dict[str, Transport],
    opts: RunOptions,
    services: Services,
    guard: SignalGuard,
) -> JobResult:
    """Upload, launch torchrun everywhere, stream, collect; stop the job on any interruption."""
    from scripts.job.launch import launch_torchrun, stop_job
    from scripts.job.records import DEFAULT_ENTRY, Job

    job = Job(
        run_id=new_run_id(),
        entry=opts.entry or DEFAULT_ENTRY,
        env=opts.env,
        max_restarts=opts.max_restarts,
        workdir=Path.cwd(),
    )
    target_dir = services.runs_dir / fleet.target
    target_dir.mkdir(parents=True, exist_ok=True)
    (target_dir / LAST_RUN).write_text(job.run_id + "\n")
    try:
        return launch_torchrun(fleet, transports, job, target_dir / job.run_id)
    except BaseException:
        # Failed or interrupted: nothing may keep running on machines that stay up.
        with guard.teardown():
            stop_job(transports, job.run_id)
        raise


def summarize(result: JobResult, *, hourly_usd: float | None, started: float) -> None:
    """The closing lines of a run: loss vs floor, throughput, where results are, cost."""
    elapsed = time.monotonic() - started
    summary: dict[str, Any] = _find_summary(result.results_dir) or {}
    rows: list[list[object]] = []
    for key, label, fmt in (
        ("final_loss", "final loss", "{:.3f}"),
        ("loss_floor", "loss floor (synthetic data)", "{:.3f}"),
        ("tokens_per_s", "tokens/s", "{:,.0f}"),
        ("mfu", "MFU", "{:.1%}"),
    ):
        if isinstance(summary.get(key), int | float):
            rows.append([label, fmt.format(summary[key])])
    rows += [["results", str(result.results_dir)], ["elapsed", f"{elapsed:.0f} s"]]
    if hourly_usd is not None:
        cost = hourly_usd * elapsed / 3600
        rows.append(["estimated cost", f"${cost:.2f} at ${hourly_usd:.2f}/h"])
    ui.table("run summary", ["", ""], rows)


def _find_summary(results_dir: Path) -> dict[str, Any] | None:
    for p in sorted(results_dir.rglob("summary.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


# ---------------------------------------------------------------- whole commands


@dataclass
class RunOptions:
    entry: tuple[str, ...] = ()
    keep: bool = False
    yes: bool = False
    skip_preflight: bool = False
    trust_new_hosts: bool = False
    env: dict[str, str] = field(default_factory=dict)
    max_restarts: int = 0
    create: bool = True  # `run` on a stack creates and destroys it; `train` uses what is up


def run_on_fleet(
    fleet: Fleet, opts: RunOptions, services: Services, record_new_keys: Path | None = None
) -> JobResult:
    """hosts/local (or a stack that is up): connect -> verify -> train -> collect."""
    started = time.monotonic()
    with (
        signal_guard() as guard,
        connected(fleet, services, record_new_keys=record_new_keys) as transports,
    ):
        verify(fleet, transports, services)
        result = train(fleet, transports, opts, services, guard)
    summarize(result, hourly_usd=None, started=started)
    return result


def run_on_stack(stack: str, opts: RunOptions, services: Services) -> JobResult | None:
    """The whole lifecycle on GCP; teardown in a `finally` unless --keep."""
    return _new_cluster(stack, opts, services, run_job=True)


def up(stack: str, opts: RunOptions, services: Services) -> None:
    """Create the cluster and prove it; if that fails it is destroyed again."""
    _new_cluster(stack, opts, services, run_job=False)


def _new_cluster(
    stack: str, opts: RunOptions, services: Services, *, run_job: bool
) -> JobResult | None:
    """preflight -> confirm -> up -> host keys -> verify [-> train], then teardown in a
    `finally`: `run` keeps the cluster only with --keep, `up` only once it is proven."""
    from infra.spec import require_deployable
    from scripts.targets.gce.preflight import preflight_zones

    started = time.monotonic()
    spec = load_spec(stack, services)
    require_deployable(spec)
    with signal_guard() as guard:
        zones = (
            list(spec.zones) if opts.skip_preflight else preflight_zones(spec, services.compute())
        )
        confirm(spec, yes=opts.yes)
        runner = services.runner(stack)
        result: JobResult | None = None
        keep = opts.keep and run_job
        try:
            outputs = provision(spec, runner, zones)
            with private_key_file(runner, stack) as key:
                fleet = fleet_from_stack(spec, outputs, key, services)
                with connected(fleet, services) as transports:
                    verify(fleet, transports, services)
                    if run_job:
                        result = train(fleet, transports, opts, services, guard)
            keep = keep or not run_job
        finally:
            with guard.teardown():
                if keep:
                    ui.say(
                        f"stack {stack} stays up; its VMs delete themselves after "
                        f"{spec.max_run_duration}; `gputrain down --stack {stack}` ends it sooner"
                    )
                else:
                    teardown(spec, runner, services)
    if result is not None:
        summarize(result, hourly_usd=spec.hourly_price_per_node * spec.nodes, started=started)
    return result


def down_stack(stack: str, services: Services) -> None:
    spec = load_spec(stack, services)
    if not spec.project:
        raise UserError(f"gcp:project is not set for stack {stack}; nothing of it can exist")
    with signal_guard() as guard, guard.teardown():
        teardown(spec, services.runner(stack), services)


def plan(target: Target, services: Services) -> None:
    if target.kind == "stack":
        show_plan(load_spec(target.value, services))
        return
    fleet = (
        fleet_for_local()
        if target.kind == "local"
        else fleet_for_hosts(target.value, trust_new_hosts=False)[0]
    )
    expect = (
        "cpu"
        if fleet.expect.is_cpu
        else f"{fleet.expect.count} x {fleet.expect.model or 'any GPU'}"
    )
    ui.table(
        f"plan: {fleet.target}",
        ["node", "role", "address", "internal address", "expected GPUs"],
        [
            [n.name, n.role, n.address or "(via head)", n.internal_address, expect]
            for n in fleet.nodes
        ],
    )
    ui.say("cost: nothing is created; these machines are yours")


@contextmanager
def existing_fleet(
    target: Target, opts: RunOptions, services: Services
) -> Iterator[tuple[Fleet, Path | None]]:
    """The fleet of a target that exists already (a stack that is up, hosts, this machine), and
    the known_hosts file to record first-seen keys in (hosts with --trust-new-hosts only)."""
    if target.kind == "local":
        yield fleet_for_local(), None
    elif target.kind == "hosts":
        yield fleet_for_hosts(target.value, trust_new_hosts=opts.trust_new_hosts)
    else:
        spec = load_spec(target.value, services)
        runner = services.runner(target.value)
        outputs = runner.outputs()
        if not outputs:
            raise UserError(
                f"stack {target.value} has no cluster; run `gputrain up --stack {target.value}`"
            )
        with private_key_file(runner, target.value) as key:
            yield fleet_from_stack(spec, outputs, key, services), None


def verify_target(target: Target, opts: RunOptions, services: Services) -> None:
    with (
        existing_fleet(target, opts, services) as (fleet, record),
        connected(fleet, services, record_new_keys=record) as transports,
    ):
        verify(fleet, transports, services)


def run(target: Target, opts: RunOptions, services: Services) -> JobResult | None:
    """`run` and `train`: on a stack, `run` is the whole lifecycle; elsewhere the same job path."""
    if target.kind == "stack" and opts.create:
        return run_on_stack(target.value, opts, services)
    with existing_fleet(target, opts, services) as (fleet, record):
        return run_on_fleet(fleet, opts, services, record)


def logs(target: Target, run_id: str | None, opts: RunOptions, services: Services) -> None:
    """Follow a run's torchrun logs on every node (reattaches to a detached job)."""
    from scripts.job.node_scripts import build_tail_command
    from scripts.parallel import parallel

    with existing_fleet(target, opts, services) as (fleet, record):
        if run_id is None:
            last = services.runs_dir / fleet.target / LAST_RUN
            if not last.is_file():
                raise UserError(f"logs: no run recorded for {fleet.target}; pass --run RUN_ID")
            run_id = last.read_text().strip()
        tail = build_tail_command(run_id, 0)
        with connected(fleet, services, record_new_keys=record) as transports:

            def follow(name: str) -> int:
                return transports[name].stream(tail, lambda line: ui.say(f"[{name}] {line}"), None)

            parallel([n.name for n in fleet.nodes], follow)


def sweep_stack(stack: str, services: Services) -> list[Leftover]:
    leftovers = sweep(load_spec(stack, services), services)
    if not leftovers:
        ui.say(f"sweep: nothing carries the labels of stack {stack}")
    return leftovers


# ---------------------------------------------------------------- status, ssh


def ttl_left_s(last_start: str | None, max_run_duration_s: int | None, now: float) -> float | None:
    """Seconds until GCE deletes the VM: the TTL counts from the latest start. Pure."""
    if not last_start or not max_run_duration_s:
        return None
    import datetime

    started = datetime.datetime.fromisoformat(last_start.replace("Z", "+00:00")).timestamp()
    return max(0.0, started + max_run_duration_s - now)


def status(stack: str, services: Services) -> None:
    from infra.fields import format_duration

    spec = load_spec(stack, services)
    if not spec.project:
        raise UserError(f"gcp:project is not set for stack {stack}")
    instances = services.compute().list_stack_instances(spec.project, stack)
    if not instances:
        ui.say(f"status: stack {stack} has no instances (nothing is billing)")
        return
    now = time.time()
    rows = []
    for i in sorted(instances, key=lambda x: x["name"]):
        left = ttl_left_s(i.get("last_start"), i.get("max_run_duration_s"), now)
        rows.append(
            [i["name"], i["zone"], i["status"], "?" if left is None else format_duration(int(left))]
        )
    ui.table(f"status: stack {stack}", ["node", "zone", "state", "deleted by GCE in"], rows)


def ssh_argv(fleet: Fleet, node: Node, known_hosts: Path, command: Sequence[str]) -> list[str]:
    """OpenSSH argv for one node: pinned keys only (our known_hosts file, strict checking),
    through the head (ProxyCommand, pinned too) when the node has no address of its own. Pure."""
    import shlex

    def base(n: Node) -> list[str]:
        opts = [
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ServerAliveInterval=15",
            "-p",
            str(n.port),
        ]
        if fleet.identity_file:
            opts = ["-i", str(fleet.identity_file), *opts]
        return opts

    argv = ["ssh", *base(node)]
    if node.address is None:
        head = fleet.head
        proxy = ["ssh", *base(head), "-W", "%h:%p", f"{head.user}@{head.address}"]
        argv += ["-o", "ProxyCommand=" + shlex.join(proxy)]
    argv.append(f"{node.user}@{node.address or node.internal_address}")
    if command:
        # One argument is a shell line (as with ssh); several are a command whose arguments
        # must arrive verbatim, so each is quoted for the remote shell.
        argv += ["--", command[0] if len(command) == 1 else shlex.join(command)]
    return argv


def ssh(
    target: Target, selector: str, command: Sequence[str], opts: RunOptions, services: Services
) -> int:
    """An interactive shell or one command on a node, with its host key pinned."""
    if target.kind == "local":
        raise UserError("ssh: the local target is this machine; no SSH needed")
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    with existing_fleet(target, opts, services) as (fleet, _):
        names = [n.name for n in fleet.nodes]
        if selector.isdigit() and int(selector) < len(names):
            node = fleet.nodes[int(selector)]
        elif selector in names:
            node = fleet.nodes[names.index(selector)]
        else:
            raise UserError(
                f"ssh: node {selector!r} is not in {fleet.target}; allowed: {', '.join(names)} "
                f"or 0..{len(names) - 1}"
            )
        with tempfile.TemporaryDirectory(prefix="gputrain-ssh-") as d:
            known = Path(d) / "known_hosts"
            from scripts.transport.hostkeys import known_hosts_lines

            known.write_text("\n".join(known_hosts_lines(fleet)) + "\n")
            return subprocess.run(ssh_argv(fleet, node, known, command)).returncode
