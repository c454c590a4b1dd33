"""A `--stack` world for end-to-end tests: a project directory, the fake Compute server, a
FakeStackRunner whose `up` brings sshd test hosts up as the cluster's VMs (and, after a
preemption, a NEW test host with a new host key for each VM it re-creates), optionally a Cloud
Storage emulator on the test bed's bridge for the stack's bucket, and `gputrain` wired to them.
The `world` fixture (tests/testbed/conftest.py) makes them.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scripts.cli import main
from scripts.settings import Settings
from scripts.targets.gce.clients import GceClients
from tests.support import JOBS, ROOT
from tests.support.fake_compute import FakeCompute, ssh_host_keys
from tests.support.fake_gcp_admin import FakeGcpAdmin, ready_for_doctor
from tests.support.fake_stack import FakeStackRunner
from tests.support.gcs_emulator import GcsEmulator
from tests.support.testbed import FabricFakes, GpuConfig, TestBed, TestHost

ZONES = ("us-central1-a", "us-central1-b", "us-central1-c")
BUCKET = "gputrain-e2e-gputrain-test"
#: a real training run short enough for the lifecycle tests
FAST_TRAIN = ("-m", "trainer.train", "--preset", "tiny", "--steps", "30", "--log-every", "10")

JOB = '''"""A job for the lifecycle tests: writes a marker, then sleeps, fails or finishes."""
import os, sys, time
from pathlib import Path
mode = sys.argv[1]
marker = Path(sys.argv[2])
out = Path(os.environ.get("GPUTRAIN_OUT", "out")); out.mkdir(parents=True, exist_ok=True)
(out / "summary.json").write_text('{"final_loss": 1.0, "steps": 1}')
marker.mkdir(parents=True, exist_ok=True)
(marker / f"pid-{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))
print("job started", mode, flush=True)
if mode == "sleep":
    time.sleep(120)
if mode == "crash" and os.environ.get("RANK") == "1":
    print("boom: rank 1 crashed on purpose", file=sys.stderr, flush=True)
    sys.exit(3)
'''


# the reference trainer, tiny and quick: 120 steps, a checkpoint every 10 (World.run_trainer)
TRAIN = ["--preset", "tiny", "--steps", "120", "--checkpoint-every", "10", "--log-every", "1"]
TRAIN += ["--eval-batches", "0"]


@dataclass
class World:
    """A project directory, the fake cloud and the settings and GCE clients wired to them."""

    dir: Path
    compute: FakeCompute
    runner: FakeStackRunner
    settings: Settings
    gce: GceClients
    bed: TestBed
    hosts: list[TestHost]
    marker: Path
    gcs: GcsEmulator | None = None
    node_hosts: dict[str, TestHost] = field(default_factory=dict)  # VM name -> its test host now

    def run(self, *argv: str) -> int:
        return main(list(argv), self.settings, self.gce)

    def run_job(self, mode: str, *options: str) -> int:
        """`gputrain run --stack e2e` with the test job (`done`, `crash` or `sleep`)."""
        return self.run(
            "run",
            "--stack",
            "e2e",
            "--yes",
            "--skip-preflight",
            *options,
            "--",
            "job.py",
            mode,
            str(self.marker),
        )

    def run_trainer(self, *options: str) -> int:
        """`gputrain run --stack e2e` with the reference trainer's TRAIN run, checkpoints in the
        stack's bucket (the storage emulator)."""
        assert self.gcs is not None
        return self.run(
            "run", "--stack", "e2e", "--yes", "--skip-preflight",
            "--env", f"STORAGE_EMULATOR_HOST={self.gcs.url}", *options,
            "--", "-m", "trainer.train", *TRAIN,
        )  # fmt: skip

    def run_steps(self, *options: str) -> int:
        """`run_trainer` with the trainer's torch-free stand-in (tests/support/jobs/steps.py):
        TRAIN's steps and checkpoints (in the stack's bucket, a relaunch starting from the
        newest) and its step lines, 20 a second; for recovery tests whose subject is the
        controller's handling, not the trainer's sums (each rank skips torch: ~3 CPU s)."""
        assert self.gcs is not None
        shutil.copy(JOBS / "steps.py", self.dir)
        steps, every = (TRAIN[TRAIN.index(flag) + 1] for flag in ("--steps", "--checkpoint-every"))
        return self.run(
            "run", "--stack", "e2e", "--yes", "--skip-preflight",
            "--env", f"STORAGE_EMULATOR_HOST={self.gcs.url}", *options,
            "--", "steps.py", steps, "0.05", every,
        )  # fmt: skip

    def checkpoints_in_bucket(self) -> list[int]:
        """Steps whose manifest is in the stack's bucket (their upload is complete)."""
        assert self.gcs is not None
        names = self.gcs.live_names(BUCKET, "runs/")  # polled: no client, no HTTP
        return sorted(
            int(n.rsplit("ckpt-", 1)[1][:8]) for n in names if n.endswith(".manifest.json")
        )

    def at_checkpoint(
        self, step: int, action: Callable[[], None], *, after_up: int = 1
    ) -> threading.Thread:
        """Runs `action` in a thread once the bucket holds a complete checkpoint at `step` or
        later (and the stack's `up` ran `after_up` times: 2 = after a recovery)."""

        def watch() -> None:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                ups = self.runner.call_names().count("up")
                if ups >= after_up and any(s >= step for s in self.checkpoints_in_bucket()):
                    action()
                    return
                # 10 looks a second act within a few of tiny's steps
                time.sleep(0.1)

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        return t

    def at_job_start(self, action: Callable[[], None], ranks: int = 2) -> threading.Thread:
        """Runs `action` in a thread once the test job (JOB, `run_job`) runs on `ranks` ranks
        (their pid files in the marker dir): for tests whose subject is not the trainer."""

        def watch() -> None:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                if len(list(self.marker.glob("pid-*"))) >= ranks:
                    action()
                    return
                time.sleep(0.1)

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        return t

    def preempt(self, node: str) -> None:
        """GCE takes a spot VM back: the Compute API says so (STOPPING, a preemption operation,
        then the VM is deleted) and every process on it dies without a word."""
        self.compute.preempt_instance(node, ZONES[0], delete_after_s=0.3)
        self.bed.kill_processes(self.node_hosts[node].name)


def _stack_file(bed: TestBed, nodes: int, settings: dict[str, str | None] | None = None) -> str:
    """The e2e stack file; `settings` replace (or, with None, drop) its gputrain keys."""
    public = bed.identity_file.with_suffix(".pub").read_text().strip()
    keys: dict[str, str | None] = {
        "machineType": "g2-standard-8",
        "spot": "true",
        **(settings or {}),
    }
    return (
        "config:\n"
        "  gcp:project: gputrain-test\n"
        f"  gputrain:zones: [{', '.join(ZONES)}]\n"
        f"  gputrain:nodes: {nodes}\n"
        + "".join(f"  gputrain:{k}: {v}\n" for k, v in keys.items() if v is not None)
        + "  gputrain:maxRunDuration: 1h\n"
        f"  gputrain:sshUser: {bed.user}\n"
        f"  gputrain:sshPublicKey: {public}\n"
        "  gputrain:sshPrivateKey: {secure: v1:bm9uY2U=:ZW5jcnlwdGVkIGtleQ==}\n"  # as keygen left it
        f"  gputrain:sshSourceRanges: [{bed.bridge_address}/32]\n"  # where SSH comes from
    )


def world_factory(
    tb: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., World]]:
    """Yields make(nodes=2, gpus=None, wrong_host_keys=False, bucket=False, settings=None,
    fabric=None, containers=None, artifacts=None) -> World; cleans up. `containers(host)`: the VMs are container
    hosts (tests/support/container_bed.py), each passed to it once made."""
    made: list[Any] = []
    markers: list[Path] = []
    admin = FakeGcpAdmin().__enter__()  # Resource Manager, Service Usage, the token endpoint
    made.append(admin)
    ready_for_doctor(monkeypatch, tmp_path / "operator", admin)  # docs' checklist, done

    def make(
        nodes: int = 2,
        gpus: GpuConfig | None = None,
        wrong_host_keys: bool = False,
        bucket: bool = False,
        settings: dict[str, str | None] | None = None,
        fabric: FabricFakes | None = None,
        containers: Callable[[TestHost], object] | None = None,
        artifacts: Any = None,
    ) -> World:
        (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
        (tmp_path / "Pulumi.e2e.yaml").write_text(_stack_file(tb, nodes, settings))
        (tmp_path / "job.py").write_text(JOB)
        # Written by the job as the test hosts' login user: a world-writable dir outside tmp_path.
        marker = Path(tempfile.mkdtemp(prefix="gputrain-e2e-")) / "marker"
        marker.parent.chmod(0o777)
        markers.append(marker.parent)
        compute = FakeCompute(host=tb.bridge_address)  # on the bridge: the nodes' watchdogs call it
        compute.__enter__()
        made.append(compute)
        gcs = None
        if bucket:  # on the bridge: the trainer on the test hosts reaches it there
            gcs = GcsEmulator(host=tb.bridge_address).__enter__()
            made.append(gcs)
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.url)
        hosts: list[TestHost] = []
        node_hosts: dict[str, TestHost] = {}

        def vm(name: str, zone: str, host: TestHost, role: str) -> dict[str, Any]:
            node_hosts[name] = host
            tb.set_hostname(host.name, name)  # so rank 0 is on the head, as on GCE
            return {
                "name": name,
                "zone": zone,
                "internalIp": host.address,
                "externalIp": host.address if role == "head" else None,
                "role": role,
                "hostKeys": (
                    [f"{k} {v}" for k, v in ssh_host_keys().items()]
                    if wrong_host_keys
                    else [host.host_key]
                ),
            }

        def new_host() -> TestHost:
            gpu = gpus or GpuConfig(model="NVIDIA L4", count=1)
            host = tb.add_host(gpus=gpu, fabric=fabric, containers=containers is not None)
            if containers is not None:
                containers(host)
            return host

        def node_factory(zone: str) -> list[dict[str, Any]]:
            """`pulumi up` in `zone`: the cluster's VMs are fresh sshd test hosts."""
            for _ in range(nodes):
                hosts.append(new_host())
            return [
                vm(f"e2e-node-{i}", zone, h, "head" if i == 0 else "worker")
                for i, h in enumerate(hosts[-nodes:])
            ]

        def node_replacer(zone: str, old: dict[str, Any]) -> dict[str, Any]:
            """`up` re-creates a preempted VM: the old host is gone, a new one (new address, new
            host key) takes its name."""
            gone = node_hosts.pop(old["name"])
            if gone.name in tb.hosts:
                tb.remove_host(gone.name)
            host = new_host()
            hosts.append(host)
            return vm(old["name"], zone, host, old["role"])

        runner = FakeStackRunner(
            stack_name="e2e",
            node_factory=node_factory,
            node_replacer=node_replacer,
            compute=compute,
            project="gputrain-test",
            ssh_user=tb.user,
            zones=ZONES,
            bucket=BUCKET if bucket else None,
        )
        runner.config["gputrain:sshPrivateKey"] = tb.identity_file.read_text()
        runner.artifacts = (
            artifacts  # `build`: Artifact Registry (tests/support/fake_artifact_registry)
        )
        run_settings = Settings(
            root=tmp_path, runs_dir=tmp_path / "runs", connect_deadline_s=60, verify_deadline_s=30
        )
        gce = GceClients(
            runner_for=lambda stack, root: runner,
            compute_endpoint=compute.url,
            hostkey_deadline_s=30,
            retry_pause_s=0,
            node_python=tb.python,
            preemption_confirm_s=2,
            admin_endpoint=admin.url,
            public_address=lambda: tb.bridge_address,  # the test bed's bridge: where SSH comes from
            artifacts_endpoint=artifacts.url if artifacts is not None else None,
        )
        monkeypatch.chdir(tmp_path)
        return World(
            tmp_path, compute, runner, run_settings, gce, tb, hosts, marker, gcs, node_hosts
        )

    yield make
    for server in made:
        server.__exit__(None, None, None)
    for m in markers:
        shutil.rmtree(m, ignore_errors=True)


class FirstStep:
    """Watches the head's torchrun.log on its disk (the test host's node root) for the first
    training step, independently of the controller, every 20 ms; `at` is when it appeared.
    `skip`: run ids whose log is not looked at (earlier runs on the same cluster)."""

    def __init__(self, w: World, skip: tuple[str, ...] = ()) -> None:
        self.w, self.skip = w, skip
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _look(self) -> None:
        head = self.w.node_hosts.get("e2e-node-0")  # once `up` made it
        runs = head.dir / "home" / ".gputrain" / "runs" if head else None
        for log in runs.glob("*/torchrun.log") if runs else []:
            if log.parent.name in self.skip:
                continue
            try:
                if " | loss " in log.read_text(errors="replace"):
                    self.at = time.time()
            except OSError:
                pass

    def _watch(self) -> None:
        while not self._stop.is_set() and self.at is None:
            self._look()
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop watching; a step the controller saw between two looks is seen by a last one."""
        self._stop.set()
        self._thread.join(timeout=5)
        if self.at is None:
            self._look()


def assert_torn_down(w: World) -> None:
    """destroy ran and nothing of the stack is left in the (fake) project."""
    assert "destroy" in w.runner.call_names()
    assert w.runner.existing == []
    from infra.gcp.compute import ComputeApi
    from infra.gcp.gcs import StorageApi
    from infra.gcp.sweep import sweep

    storage = StorageApi() if w.gcs else None
    assert sweep("gputrain-test", "e2e", api=ComputeApi(w.compute.url), storage=storage) == []


def bucket_object(w: World, suffix: str) -> bytes | None:
    """The first object under the bucket's runs/ whose name ends with `suffix` (None: none yet,
    or no bucket before the stack's `up`)."""
    assert w.gcs is not None
    client = w.gcs.client()
    if not client.bucket(BUCKET).exists():
        return None
    for blob in client.list_blobs(BUCKET, prefix="runs/"):
        if blob.name.endswith(suffix):
            return bytes(blob.download_as_bytes())
    return None


def preempt_when(
    w: World, node: str, progress: Callable[[], int | None], at_least: int, within_s: float = 240
) -> tuple[threading.Thread, list[int]]:
    """A thread that preempts `node` once, after the first `up`, as soon as `progress()` (what
    the bucket holds of the node's state) reaches `at_least`; the list gets the progress seen."""
    seen: list[int] = []

    def watch() -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if w.runner.call_names().count("up") == 1:
                reached = progress()
                if reached is not None and reached >= at_least:
                    w.preempt(node)
                    seen.append(reached)
                    return
            time.sleep(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t, seen
