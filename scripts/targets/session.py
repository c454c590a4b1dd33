"""The session of every target made of machines (gce, hosts, local): connect with pinned host keys
on first use, verify GPUs, run torchrun jobs, follow logs, open OpenSSH shells. `connect` reaches
every node of a fleet in parallel with backoff until a deadline, with progress; workers without an
address of their own go through the head."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from infra.base.errors import GputrainError, UserError
from infra.base.records import Fleet, Node
from infra.base.retry import GaveUp, Waiting, poll_until
from scripts import ui
from scripts.job.records import Job, JobResult
from scripts.parallel import parallel
from scripts.settings import Settings
from scripts.targets.base import Footprint, Interrupted, SignalGuard
from scripts.transport.base import Transport
from scripts.transport.local import LocalTransport
from scripts.transport.ssh import HostKeyError, SshTransport, classify_connect_error

if TYPE_CHECKING:
    from infra.spec import ClusterSpec
    from scripts.job.container import ImageRef
    from scripts.notify import Notifier
    from scripts.verify.nodes import FabricCheck


class FleetSession:
    """`transports` connect lazily, so `ssh` (OpenSSH) never opens a paramiko connection and a
    subclass can swap the fleet (new VMs, new host keys) and connect again."""

    def __init__(
        self,
        fleet: Fleet,
        settings: Settings,
        *,
        record_new_keys: Path | None = None,  # hosts --trust-new-hosts: the known_hosts file
        hourly_usd: float | None = None,
        keep: bool = False,
        connect_deadline_s: float | None = None,  # default: settings.existing_wait_s
        fabric: FabricCheck | None = None,  # the GPU network a multi-node stack must prove
        stall_timeout_s: float | None = None,  # the stack's stallTimeout (--stall-timeout wins)
    ) -> None:
        self.fleet = fleet
        self.name = fleet.target
        self.settings = settings
        self.record_new_keys = record_new_keys
        self.hourly_usd = hourly_usd
        self.billed_since: float | None = time.time()  # the machines are up (or ours anyway)
        self.spec: ClusterSpec | None = None  # not a stack's (RecoveringSession's is)
        self.partial_usd: float | None = 0.0
        self.keep = keep
        self.connect_deadline_s = (
            settings.existing_wait_s if connect_deadline_s is None else connect_deadline_s
        )
        self.fabric = fabric
        self.stall_timeout_s = stall_timeout_s
        self.notifier: Notifier | None = None  # set by the lifecycle: preempted / recovered
        self._transports: dict[str, Transport] | None = None

    @property
    def node_count(self) -> int:
        return len(self.fleet.nodes)

    def footprint(self) -> Footprint:
        """The fleet's machines: this one (`--local`) or a hosts file's."""
        machine = "local" if self.fleet.local else "hosts"
        return Footprint(len(self.fleet.nodes), machine, self.fleet.expect.count)

    def ledger_bucket(self) -> tuple[Any, str, str] | None:
        """Machines that exist have no bucket of ours: the record stays in runs/."""
        return None

    @property
    def transports(self) -> dict[str, Transport]:
        if self._transports is None:
            if self.fleet.local:  # logs, results, stop: one line, not mkdir's traceback
                self.settings.check_local_node_root()
            self._transports = connect(
                self.fleet,
                deadline_s=self.connect_deadline_s,
                trust_new_hosts=self.record_new_keys,
                local_root=self.settings.local_node_root if self.fleet.local else None,
            )
        return self._transports

    def close(self) -> None:

        if self._transports is not None:
            close_all(self._transports)
            self._transports = None

    def __enter__(self) -> FleetSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def verify(self, fabric: bool = False) -> None:
        """The GPUs; with `fabric`, then the GPU network of a multi-node stack: node setup
        (idempotent) and `verify --fabric`, before any training."""
        from scripts.verify.nodes import verify_gpus

        verify_gpus(self.fleet, self.transports, deadline_s=self.settings.verify_deadline_s)
        from scripts.verify.nodes import verify_scratch

        verify_scratch(self.fleet, self.transports)  # local SSD, where the VM has any
        if not fabric or len(self.fleet.nodes) < 2:
            return
        if self.fabric is None:
            ui.say(f"{self.name}: no GPU network to set up or verify (one NIC per node)")
            return
        from scripts.settings import new_run_id
        from scripts.verify.nodes import setup_fabric, verify_fabric

        setup_fabric(self.fleet, self.transports, self.fabric.kind)
        run_id = f"verify-fabric-{new_run_id()}"
        verify_fabric(
            self.fleet,
            self.transports,
            self.fabric,
            self.settings.runs_dir / self.name / run_id,
            run_id,
        )

    def verify_image(self, image: ImageRef) -> None:
        """Every node can run the image (docker, the NVIDIA container toolkit: installed on
        the stack's own VMs) and nvidia-smi inside it sees the node's GPUs."""
        from scripts.job.image_node import ensure_image

        ensure_image(self.fleet, self.transports, image, verify=True)

    def run_job(self, job: Job, results_dir: Path, guard: SignalGuard) -> JobResult:
        from scripts.watch.monitor import watched_launch, with_stall_default

        with self._launching(job, guard, results_dir) as job:
            return watched_launch(
                self.fleet,
                self.transports,
                with_stall_default(job, self.stall_timeout_s),
                results_dir,
            )

    def run_detached(self, job: Job, guard: SignalGuard) -> float:
        """Start the job, return once it trains (`--detach`); stop it if that fails."""
        from scripts.job.detach import launch_detached

        with self._launching(job, guard) as job:
            return launch_detached(self.fleet, self.transports, job)

    @contextlib.contextmanager
    def _launching(
        self, job: Job, guard: SignalGuard, results_dir: Path | None = None
    ) -> Iterator[Job]:
        """The job as this session starts it (its GPU network; on this machine its own code dir:
        runs here share the node root, the run keeps a hard-linked snapshot). Failed or
        interrupted, it is stopped: nothing may keep running on machines that stay up; then,
        interrupted (Ctrl-C, SIGTERM), its results come home into `results_dir`."""
        from scripts.job.launch import stop_job

        transports = self.transports
        job = self.with_fabric(job)
        if self.fleet.local:
            job = dataclasses.replace(job, code_dir=f"{job.code_dir}-{job.run_id}")
        try:
            yield job
        except BaseException as e:
            with guard.teardown():
                stop_job(transports, job.run_id)
            if results_dir is not None and isinstance(e, Interrupted | KeyboardInterrupt):
                self._results_after_interrupt(job.run_id, results_dir)
            raise
        finally:
            if self.fleet.local:
                for t in transports.values():
                    t.run(f"rm -rf {shlex.quote(job.code_dir)}", timeout=120)

    def _results_after_interrupt(self, run_id: str, results_dir: Path) -> None:
        """What the stopped run left, brought home as at its end (teardown.md: results before
        teardown, on Ctrl-C too). Not shielded: a second Ctrl-C ends the download, and the line
        says where the results still are."""
        from scripts.job.download import download_results, not_home_message

        try:
            missing = download_results(self.transports, run_id, results_dir)
        except (Interrupted, KeyboardInterrupt):
            missing = {n: "interrupted again" for n in self.transports}
        if missing:
            ui.warn(not_home_message(run_id, missing, results_dir))
        else:
            ui.say(f"run {run_id}: stopped; results in {results_dir}")

    def with_fabric(self, job: Job) -> Job:
        """The job with the GPU network its image's containers get (a multi-node fabric stack's:
        the fabric setup prepared it on every node before)."""
        if job.image is None or self.fabric is None or len(self.fleet.nodes) < 2:
            return job
        return dataclasses.replace(job, fabric=self.fabric.kind)

    def has_run(self, run_id: str) -> bool:
        """The run's directory is on the head (`--resume`)."""
        from scripts.node_layout import run_dir

        head = self.transports[self.fleet.head.name]
        return head.run(f"test -d {shlex.quote(run_dir(run_id))}", timeout=30).ok

    def latest_run(self) -> str | None:
        """The newest run on the head (`logs` from a machine that did not start it)."""
        from scripts.node_layout import RUNS_DIR

        cmd = f"ls -1t {RUNS_DIR} 2>/dev/null | grep -v '^verify-' | head -n 1"
        found = self.transports[self.fleet.head.name].run(cmd, timeout=30).stdout.strip()
        return found or None

    def logs(self, run_id: str) -> None:
        """Follow a run's torchrun logs on every node (reattaches to a detached job). A run no
        node has is one line, as `top` says it (exit 2); a node without it, a warning."""
        from scripts.job.node_scripts import build_tail_command
        from scripts.node_layout import run_dir
        from scripts.parallel import parallel

        missing = 3  # the exit status of a node without the run's directory
        tail = f"test -d {shlex.quote(run_dir(run_id))} || exit {missing}; "
        tail += build_tail_command(run_id, 0)
        transports = self.transports

        def follow(name: str) -> int:
            return transports[name].stream(tail, lambda line: ui.say(f"[{name}] {line}"), None)

        codes, _ = parallel(list(transports), follow)
        lacking = [name for name, code in codes.items() if code == missing]
        if lacking and len(lacking) == len(transports):
            raise UserError(f"logs: run {run_id} does not exist on {self.name} (no node has it)")
        for name in lacking:
            ui.warn(f"[{name}] run {run_id} does not exist on this node")

    def running(self) -> dict[str, list[str]]:
        from scripts.job.node_scripts import build_running_command
        from scripts.parallel import parallel

        cmd = build_running_command()
        found, _ = parallel(
            list(self.transports), lambda n: self.transports[n].run(cmd, 30).stdout.split()
        )
        return {n: ids for n, ids in found.items() if ids}

    def results(self, run_id: str) -> Path:
        """Every node's results of the run (the same files a run brings home at its end)."""
        from scripts.job.download import ResultsNotHomeError, download_results, not_home_message

        self.require_run(run_id)
        results_dir = self.settings.made_results_dir(self.name, run_id)
        missing = download_results(self.transports, run_id, results_dir)
        if missing:  # never "results in ..." over a node's lost results
            raise ResultsNotHomeError(not_home_message(run_id, missing, results_dir), missing)
        return results_dir

    def stop(self, run_id: str) -> None:
        from scripts.job.launch import stop_job

        self.require_run(run_id)
        stop_job(self.transports, run_id)

    def require_run(self, run_id: str) -> None:
        """`results`/`stop` of a run the head never had (a typo, another target's id): one
        line, as `top` says it, before anything is made at home."""
        if not self.has_run(run_id):
            raise UserError(
                f"run {run_id} does not exist on {self.name} (its head has no directory for it)"
            )

    def ssh(self, node: str, command: Sequence[str]) -> int:
        """An interactive shell or one command on a node, with its host key pinned."""
        from scripts.transport.ssh import known_hosts_lines

        if self.fleet.local:
            raise UserError("ssh: the local target is this machine; no SSH needed")
        chosen = self.node(node)
        with tempfile.TemporaryDirectory(prefix="gputrain-ssh-") as d:
            known = Path(d) / "known_hosts"
            known.write_text("\n".join(known_hosts_lines(self.fleet)) + "\n")
            return subprocess.run(ssh_argv(self.fleet, chosen, known, command)).returncode

    def node(self, selector: str) -> Node:
        """A node by name or index."""
        names = [n.name for n in self.fleet.nodes]
        if re.fullmatch(r"[0-9]+", selector) and int(selector) < len(names):
            return self.fleet.nodes[int(selector)]
        if selector in names:
            return self.fleet.nodes[names.index(selector)]
        raise UserError(
            f"ssh: node {selector!r} is not in {self.name}; allowed: {', '.join(names)} "
            f"or 0..{len(names) - 1}"
        )


def ssh_argv(fleet: Fleet, node: Node, known_hosts: Path, command: Sequence[str]) -> list[str]:
    """OpenSSH argv for one node: pinned keys only (our known_hosts file, strict checking),
    through the head (ProxyCommand, pinned too) when the node has no address of its own. Pure."""

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


class ConnectError(GputrainError):
    """Some nodes could not be reached before their deadline."""


def _connect_node(
    transport: SshTransport, deadline_s: float, status: ui.StatusLines
) -> SshTransport:
    """One node, retried with backoff through refused connections, resets and a login key not
    yet installed, until the deadline; a host key that is not the pinned one is refused at once.
    While it waits, the node's status line says why and how long is left."""
    start = time.monotonic()
    waited: list[Waiting] = []

    def waiting(w: Waiting) -> None:
        waited.append(w)
        status.update(transport.name, f"waiting for SSH ({w.reason}), {w.left_s:.0f} s left")

    try:
        poll_until(
            transport.connect_once,
            deadline_s=deadline_s,
            retry_on=(Exception,),
            fatal=(HostKeyError,),
            reason=classify_connect_error,
            on_wait=waiting,
        )
    except GaveUp as e:
        host, port = transport.target
        status.update(transport.name, f"not reachable ({e.reason})", final=True)
        raise ConnectError(
            f"node {transport.name} ({host}:{port}): not reachable within {deadline_s:.0f} s "
            f"(last: {e.reason}); --wait SECONDS waits longer"
        ) from e
    if waited:
        status.update(
            transport.name, f"connected after {time.monotonic() - start:.1f} s", final=True
        )
    return transport


def connect(
    fleet: Fleet,
    *,
    deadline_s: float,
    trust_new_hosts: Path | None = None,
    local_root: Path | None = None,
    connect_timeout: float = 10.0,
    probe_after_s: float = 15.0,
) -> dict[str, Transport]:
    """A transport per node name. All nodes in parallel; workers without an address go through
    the head (its connection first). Raises HostKeyError / ConnectError naming every bad node."""
    if fleet.local:
        if local_root is None:
            raise ConnectError(f"{fleet.target}: a local fleet needs its node root")
        return {n.name: LocalTransport(n.name, local_root) for n in fleet.nodes}
    head = fleet.head
    by_name: dict[str, SshTransport] = {}

    def make(node: Node, via: SshTransport | None) -> SshTransport:
        return SshTransport(
            node,
            fleet.identity_file,
            via=via,
            trust_new_hosts=trust_new_hosts,
            connect_timeout=connect_timeout,
            probe_after_s=probe_after_s,
        )

    if head.address is None:
        raise ConnectError(f"node {head.name}: the head needs an address the controller can reach")
    head_t = make(head, None)
    by_name[head.name] = head_t
    for node in fleet.nodes:
        if node.name != head.name:
            by_name[node.name] = make(node, head_t if node.address is None else None)

    head_ready = threading.Event()
    head_failed: list[BaseException] = []

    def run(name: str) -> SshTransport:
        t = by_name[name]
        if t.via is not None:
            head_ready.wait()
            if head_failed:
                raise ConnectError(f"node {name}: not reachable because the head is not")
        try:
            return _connect_node(t, deadline_s, status)
        except BaseException as e:
            if t is head_t:
                head_failed.append(e)
            raise
        finally:
            if t is head_t:
                head_ready.set()

    start = time.monotonic()
    with ui.status_lines() as status:
        results, errors = parallel(list(by_name), run)
    if errors:
        for t in results.values():
            t.close()
        lines = [str(e) for e in errors.values()]
        cls = (
            HostKeyError
            if any(isinstance(e, HostKeyError) for e in errors.values())
            else ConnectError
        )
        raise cls("\n".join(lines))
    ui.say(f"connected to {len(results)} node(s) in {time.monotonic() - start:.1f} s")
    return dict(results)


def close_all(transports: dict[str, Transport]) -> None:
    for t in transports.values():
        with contextlib.suppress(Exception):
            t.close()
