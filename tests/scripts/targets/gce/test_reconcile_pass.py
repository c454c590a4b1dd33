"""One reconcile pass's decisions (scripts/targets/gce/reconcile.py) against the real Cloud
Storage emulator and the fake Compute API, without the test bed: a crash is not a preemption
when autodown deleted the VMs, a finished run stays finished after the TTL, a relaunch that
fails is bounded, a refused secret bills nothing, and the run a pass looks after is the one
launched last. (The test bed's tests/testbed/test_laptop_closed.py runs whole passes.)"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from infra.base.errors import GputrainError, UserError
from infra.gcp.compute import ComputeApi
from infra.gcp.gcs import StorageApi
from infra.ttl import Recreation
from scripts.job.records import Job
from scripts.targets.gce import reconcile as reconcile_module
from scripts.targets.gce.lease import Lease
from scripts.targets.gce.manifest import Manifests, manifest_for
from scripts.targets.gce.reconcile import RELAUNCH_FAILED, reconcile
from tests.support.fake_compute import FakeCompute
from tests.support.fake_stack import sample_outputs
from tests.support.gcs_emulator import BUCKET, GcsEmulator

STACK, ZONE = "s", "us-central1-a"
HEAD, WORKER = f"{STACK}-node-0", f"{STACK}-node-1"


@pytest.fixture(scope="module")
def gcs() -> Iterator[GcsEmulator]:
    with GcsEmulator() as emulator:
        yield emulator


@dataclass
class Cloud:
    """The stack as a pass sees it: its bucket (the emulator), its VMs (the fake Compute API),
    its outputs, what it sent and what it re-created."""

    storage: StorageApi
    compute: FakeCompute
    prefix: str
    sent: list[str] = field(default_factory=list)
    recreated: list[str] = field(default_factory=list)  # the zone each re-creation tried first
    recreations: list[Recreation] = field(default_factory=list)  # what each gave its `up`

    @property
    def manifests(self) -> Manifests:
        return Manifests(self.storage, BUCKET, self.prefix)

    def launch(self, run_id: str, *, ago: float = 600.0, **job: Any) -> None:
        """What `run --detach` leaves: the run's manifest, launched `ago` seconds ago."""
        m = manifest_for(
            Job(run_id, entry=("train.py",), **job), STACK, max_recoveries=2,
            deadline=time.time() + 3600, code=None,
        )  # fmt: skip
        m.created_at -= ago
        m.attempt_started_at -= ago
        self.write(m)

    def write(self, m: Any) -> None:
        """The run's manifest written as a controller writes it: under the run's lease."""
        held = Lease(
            self.storage, BUCKET, self.prefix, kind="controller", run_id=m.run_id, ttl_s=60
        )
        assert held.acquire() is None
        self.manifests.write(m, held.token)
        held.release()

    def head_ended(self, run_id: str, code: str) -> None:
        marker = {"node": HEAD, "ended_at": time.time() - 30, "exit_code": code}
        name = f"{self.prefix}runs/{run_id}/{HEAD}/.gputrain-ended.json"
        self.storage.write_if_generation(BUCKET, name, json.dumps(marker).encode(), None)

    def target(self, spec: Any) -> Any:
        outputs = sample_outputs(STACK, ZONE, nodes=2, project=self.compute.project)

        def recreated(_spec: Any, again: Recreation, _budget: float | None) -> dict[str, Any]:
            self.recreated.append(again.zone)
            self.recreations.append(again)
            for name in (HEAD, WORKER):
                if (ZONE, name) not in self.compute.instances:
                    self.compute.add_instance(name, ZONE, labels={"gputrain-stack": STACK})
            return outputs

        api = ComputeApi(self.compute.url)
        return SimpleNamespace(
            stack=STACK,
            spec=lambda: spec,
            clients=SimpleNamespace(compute=lambda: api, storage=lambda project: self.storage),
            runner=SimpleNamespace(outputs=lambda: outputs),
            recreated=recreated,
        )

    def run_pass(self, **spec: Any) -> str:
        base = dict(project=self.compute.project, bucket_name=BUCKET, bucket_prefix=self.prefix)
        notifier = SimpleNamespace(send=lambda event, **kw: self.sent.append(event), base={})
        stack_spec = SimpleNamespace(
            **base, **{"spot": True, "automatic_restart": False, "budget": None} | spec
        )
        return reconcile(self.target(stack_spec), None, notifier=notifier)  # type: ignore[arg-type]


@pytest.fixture
def cloud(
    gcs: GcsEmulator, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Cloud]:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.url)
    with FakeCompute() as compute:
        for name in (HEAD, WORKER):
            compute.add_instance(name, ZONE, labels={"gputrain-stack": STACK})
        yield Cloud(StorageApi("test"), compute, f"{request.node.name[:40]}/")


def test_a_crash_whose_vms_autodown_deleted_is_not_recovered(cloud: Cloud) -> None:
    """The job exited 1 with no preemption and the head's watchdog deleted every VM: a spot VM
    gone without GCE's termination operation is autodown's doing, and a crash is a crash."""
    cloud.launch("r1")
    cloud.head_ended("r1", "1")
    for name in (HEAD, WORKER):
        cloud.compute.remove_instance(name, ZONE)
    assert cloud.run_pass() == "ended"
    assert cloud.recreated == [] and "preempted" not in cloud.sent
    m = cloud.manifests.load("r1")
    assert m is not None and m.state == "failed" and m.recoveries_done == 0


def test_a_worker_preempted_before_the_crash_is_still_recovered(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head failed because GCE took its peer: that termination operation makes it a
    preemption, whatever exit code the head's marker says."""
    cloud.launch("r1")
    cloud.compute.preempt_instance(WORKER, ZONE, delete_after_s=0.2)
    time.sleep(0.5)
    cloud.head_ended("r1", "1")
    relaunched: list[int] = []
    monkeypatch.setattr(
        reconcile_module.Pass, "relaunch", lambda self, outputs, job: relaunched.append(job.attempt)
    )
    assert cloud.run_pass() == "recovered"
    assert cloud.recreated == [ZONE] and relaunched == [2] and cloud.sent[0] == "preempted"
    m = cloud.manifests.load("r1")  # its new VM lives to the deadline the TTL check reads,
    assert m is not None  # on the image the stack outputs record (not the family's newer one)
    image = sample_outputs(STACK, ZONE)["image"]
    assert cloud.recreations == [Recreation(m.deadline, ZONE, image, (HEAD,))]  # it stands


def test_a_relaunch_carries_the_runs_cost_record_on_with_the_zones_it_ran_in(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's cost record as its launch made it (in the manifest) goes on to the relaunch's
    watchdog with the zones its cluster ran in, in order: where the launch had it, where the
    controller's own recovery moved it (the stack as the pass finds it), and where the pass
    re-created it; the manifest keeps it for the next pass. Nothing else of it changes."""
    other = "us-central1-b"
    cloud.launch("r1")
    m = cloud.manifests.load("r1")
    assert m is not None
    m.ledger = {"zones": ["europe-west4-a"], "hourly_usd": 2.0, "partial_usd": 0.5}
    cloud.write(m)
    cloud.compute.preempt_instance(WORKER, ZONE, delete_after_s=0.2)
    time.sleep(0.5)
    moved = sample_outputs(STACK, other, nodes=2, project=cloud.compute.project)
    monkeypatch.setattr(reconcile_module.Pass, "recreate", lambda self, out, lost: moved)
    given: list[Any] = []
    monkeypatch.setattr(
        reconcile_module.Pass, "relaunch", lambda self, outputs, job: given.append(self.m.ledger)
    )
    assert cloud.run_pass() == "recovered"
    expected = {"zones": ["europe-west4-a", ZONE, other], "hourly_usd": 2.0, "partial_usd": 0.5}
    assert given == [expected]
    kept = cloud.manifests.load("r1")
    assert kept is not None and kept.ledger == expected


def test_a_run_that_finished_stays_finished_after_the_ttl(cloud: Cloud) -> None:
    cloud.launch("r1")
    m = cloud.manifests.load("r1")
    assert m is not None
    m.deadline = time.time() - 1
    cloud.write(m)
    cloud.head_ended("r1", "0")
    assert cloud.run_pass() == "ended"
    after = cloud.manifests.load("r1")
    assert after is not None and after.state == "finished" and "failed" not in cloud.sent


def test_a_run_whose_budget_is_spent_is_not_recreated(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its --budget would be passed by the next interval (the head's rule, at the stack's rate
    from the run's start, as the relaunch gives it): the pass re-creates nothing, deletes what
    is left and says why, as past the TTL."""
    from infra.spec import parse_spec
    from scripts.run_plan import worst_hourly
    from tests.support.pulumi_mocks import deployable_config

    shape = parse_spec(deployable_config("dev"), "dev")
    rate = worst_hourly(shape)
    assert rate is not None
    cloud.launch("r1", ago=3600)
    m = cloud.manifests.load("r1")
    assert m is not None
    m.budget_usd, m.started_at = rate * 1.5, m.created_at  # an hour of 1.5 spent: 2 min ahead fit
    cloud.write(m)
    cloud.compute.preempt_instance(WORKER, ZONE, delete_after_s=0.2)
    time.sleep(0.5)
    monkeypatch.setattr(reconcile_module.Pass, "relaunch", lambda self, outputs, job: None)
    keys = ("capacity_ladder", "capacity", "on_vertex", "price", "nodes", "region", "machine_type")
    keys += ("boot_disk_type", "boot_disk_gb", "scratch")  # the disks the rate counts
    fields = {k: getattr(shape, k) for k in keys}
    assert cloud.run_pass(**fields) == "recovered"  # within it: recovered
    m = cloud.manifests.load("r1")
    assert m is not None
    m.budget_usd, m.state = rate * 1.02, "running"  # 2 min ahead would pass it
    cloud.write(m)
    cloud.compute.preempt_instance(WORKER, ZONE, delete_after_s=0.2)
    time.sleep(0.5)
    assert cloud.run_pass(**fields) == "ended"
    assert cloud.recreated == [ZONE] and cloud.sent[-1] == "failed"
    m = cloud.manifests.load("r1")
    assert m is not None and m.state == "failed"
    assert (
        m.history[-1]["what"] == f"its budget of ${rate * 1.02:.2f} is spent: not re-creating VMs"
    )
    assert cloud.compute.instances == {}


def test_a_relaunch_that_keeps_failing_spends_the_recoveries_then_deletes_the_vms(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass after a failed relaunch (or one that died mid-way) does not know which VMs
    stand untouched (its `up` may have moved some): its re-creation keeps no VM's TTL."""
    cloud.launch("r1")
    cloud.compute.preempt_instance(WORKER, ZONE, delete_after_s=0.2)
    time.sleep(0.5)

    def fails(self: Any, outputs: Any, job: Job) -> None:
        raise GputrainError("s-node-1: SSH: no route to host\nthe relaunch stops")

    monkeypatch.setattr(reconcile_module.Pass, "relaunch", fails)
    assert [cloud.run_pass() for _ in range(2)] == [RELAUNCH_FAILED, RELAUNCH_FAILED]
    m = cloud.manifests.load("r1")
    assert m is not None and (m.state, m.recoveries_done) == ("recovering", 2)
    assert m.history[-1]["error"] == "the relaunch stops"
    assert [again.keep for again in cloud.recreations] == [(HEAD,), ()]
    assert cloud.run_pass() == "ended"  # none left: the VMs go
    m = cloud.manifests.load("r1")
    assert m is not None and m.state == "out of recoveries"
    assert cloud.compute.instances == {}


def test_a_refused_secret_stops_the_pass_before_any_vm_is_made(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The secrets are read before the re-creation: a refusal bills nothing, and costs no
    recovery (the grant may come before the next pass)."""
    import scripts.job.environment as environment

    def refused(project: str, secret: str, version: str) -> str:
        raise UserError(f"Secret Manager: access to {secret} refused")

    monkeypatch.setattr(environment, "fetch_secret_manager", refused)
    cloud.launch("r1", secrets={"HF": "x"}, secret_refs={"HF": "projects/p/secrets/hf/versions/1"})
    cloud.compute.preempt_instance(WORKER, ZONE, delete_after_s=0.2)
    time.sleep(0.5)
    with pytest.raises(UserError, match="access to hf refused"):
        cloud.run_pass()
    assert cloud.recreated == [] and (ZONE, WORKER) not in cloud.compute.instances
    m = cloud.manifests.load("r1")
    assert m is not None and (m.state, m.recoveries_done) == ("recovering", 0)


def test_the_run_looked_after_is_the_one_launched_last(cloud: Cloud) -> None:
    """`train --resume A --detach` after B finished: A keeps its creation time, but it is the
    run launched last; an unreadable manifest is skipped with a warning."""
    cloud.launch("a", ago=7200)
    cloud.launch("b", ago=3600)
    resumed = cloud.manifests.load("a")
    assert resumed is not None
    resumed.attempt_started_at = time.time()
    cloud.write(resumed)
    name = f"{cloud.prefix}runs/c/manifest.json"
    cloud.storage.write_if_generation(BUCKET, name, b"[]", None)
    latest = cloud.manifests.latest()
    assert latest is not None and latest.run_id == "a"
    with pytest.raises(GputrainError, match="unreadable: not a JSON object"):
        cloud.manifests.load("c")
