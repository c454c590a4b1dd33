"""The stack's lease and the run's manifest against the real Cloud Storage emulator (with Cloud
Storage's `ifGenerationMatch`, which tests/support/gcs_emulator.py adds to it): one writer wins a
race, a writer that lost the lease is fenced out of the manifest, the code bundle round-trips."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.gcp.gcs import StorageApi
from scripts.job.records import Job
from scripts.targets.gce.lease import Lease, LeaseLost
from scripts.targets.gce.manifest import ControllerHold, Manifests, manifest_for
from tests.support.gcs_emulator import BUCKET, GcsEmulator


@pytest.fixture(scope="module")
def gcs() -> Iterator[GcsEmulator]:
    with GcsEmulator() as emulator:
        yield emulator


@pytest.fixture
def storage(gcs: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> StorageApi:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.url)
    return StorageApi("test")


def lease(
    storage: StorageApi, prefix: str, kind: str = "reconciler", ttl: float = 60, ago: float = 0
) -> Lease:
    """`ago`: the holder's clock runs that far behind (its lease is expired that long)."""
    return Lease(
        storage, BUCKET, prefix, kind=kind, run_id="r1", ttl_s=ttl, clock=lambda: time.time() - ago
    )


def test_the_precondition_is_honoured(storage: StorageApi) -> None:
    first = storage.write_if_generation(BUCKET, "pre/x", b"1", 0)
    assert first is not None
    assert storage.write_if_generation(BUCKET, "pre/x", b"2", 0) is None  # exists already
    assert storage.write_if_generation(BUCKET, "pre/x", b"2", first + 1) is None  # not that one
    second = storage.write_if_generation(BUCKET, "pre/x", b"3", first)
    assert second is not None and second != first
    assert storage.read_versioned(BUCKET, "pre/x") == (b"3", second)
    assert storage.read_versioned(BUCKET, "pre/none") is None


def test_a_live_holder_keeps_it_a_released_one_lets_go(storage: StorageApi) -> None:
    controller, reconciler = lease(storage, "a/", "controller"), lease(storage, "a/")
    assert controller.acquire() is None
    held = reconciler.acquire()
    assert held is not None and held.kind == "controller" and held.holder == controller.holder
    assert "the controller" in held.line(held.expires_at - 30) and "30 s more" in held.line(
        held.expires_at - 30
    )
    controller.renew()
    controller.release()
    assert reconciler.acquire() is None  # released: no TTL to wait out


def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced(storage: StorageApi) -> None:
    old = lease(storage, "b/", ttl=60, ago=120)  # taken 2 min ago for 1 min: expired
    assert old.acquire() is None
    new = lease(storage, "b/")
    assert new.acquire() is None  # expired: taken over
    with pytest.raises(LeaseLost):
        old.renew()
    manifests = Manifests(storage, BUCKET, "budget/")
    m = manifest_for(Job("r1", entry=("x.py",)), "s", max_recoveries=3, deadline=1e12, code=None)
    assert new.token is not None
    manifests.write(m, new.token)
    stale = manifests.load("r1")
    assert stale is not None
    stale.state = "finished"
    with pytest.raises(LeaseLost):  # the old holder's token is older than the last write's
        manifests.write(stale, 1)
    newer = manifests.load("r1")
    assert newer is not None and newer.state == "running"
    manifests.write(newer, new.token)
    with pytest.raises(LeaseLost):  # written meanwhile: the generation read is not the live one
        manifests.write(m, new.token)


def test_two_writers_started_together_exactly_one_wins(storage: StorageApi) -> None:
    for round_ in range(8):
        leases = [lease(storage, f"race{round_}/") for _ in range(4)]
        gate = threading.Barrier(len(leases))
        won: list[Lease] = []

        def go(mine: Lease, gate: threading.Barrier, won: list[Lease]) -> None:
            gate.wait()
            if mine.acquire() is None:
                won.append(mine)

        threads = [threading.Thread(target=go, args=(x, gate, won)) for x in leases]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, round_


def test_renews_from_two_threads_at_once_never_fence_each_other(storage: StorageApi) -> None:
    """The controller's renew thread and its own renew at launch: one at a time, each on the
    token the other left (both on one token, one took the other for a rival)."""
    held = lease(storage, "both/")
    assert held.acquire() is None
    errors: list[BaseException] = []

    def renew_many() -> None:
        for _ in range(15):
            try:
                held.renew()
            except BaseException as e:
                errors.append(e)

    threads = [threading.Thread(target=renew_many) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and not held.lost.is_set()


def test_a_credentials_error_is_one_storage_line(storage: StorageApi) -> None:
    """A metadata server that does not answer (Cloud Run) is a StorageApiError, which the
    lease's thread and the passes handle, not an escape that ends the renewing unseen."""
    from google.auth.exceptions import TransportError

    from infra.gcp.gcs import StorageApiError

    def refused() -> None:
        raise TransportError("metadata server unreachable")

    with pytest.raises(
        StorageApiError, match=r"objects\.get x: cannot reach it \(TransportError: metadata server"
    ):
        storage._call("objects.get x", refused)


def test_the_controller_writes_the_manifest_and_the_code(
    storage: StorageApi, tmp_path: Path
) -> None:
    (tmp_path / "job.py").write_text("print('hi')\n")
    job = Job("r2", entry=("job.py", "--x"), env={"A": "1"}, resume_args=("--resume",))
    hold = ControllerHold(
        storage, f"gs://{BUCKET}/c/", "s", max_recoveries=2, deadline=9e9,
        budget_usd=5.0, started_at=123.0, ledger={"zones": ["us-central1-a"], "start": 123.0},
    )  # fmt: skip
    hold.start(job, {"job.py": tmp_path / "job.py", "trainer/train.py": tmp_path / "job.py"})
    again = ControllerHold(storage, f"gs://{BUCKET}/c/", "s", max_recoveries=2, deadline=9e9)
    with pytest.raises(Exception, match=r"the controller .* holds the lease"):
        again.start(job, {})
    hold.record(attempt=2)
    hold.release()
    manifests = Manifests(storage, BUCKET, "c/")
    m = manifests.find("s", None)
    assert (m.run_id, m.entry, m.env, m.resume_args) == (
        "r2",
        ("job.py", "--x"),
        {"A": "1"},
        ("--resume",),
    )
    assert (m.attempt, m.recoveries_done, m.recoveries_left) == (2, 1, 1)
    assert (m.budget_usd, m.started_at) == (5.0, 123.0)  # a reconciler's relaunch keeps them
    assert m.ledger == {"zones": ["us-central1-a"], "start": 123.0}  # and the cost record
    assert m.code is not None
    code = manifests.get_code(m.code, tmp_path / "out")
    assert sorted(p.name for p in code.iterdir()) == ["job.py"]  # not the trainer package
    with pytest.raises(Exception, match="no run with a manifest"):
        Manifests(storage, BUCKET, "none/").find("s", None)


def test_status_tells_the_recovery_history() -> None:
    from scripts.targets.gce.manifest import RunManifest, status_lines

    m = RunManifest("r9", "s", ("x.py",), {}, max_recoveries=3, recoveries_done=1, attempt=2)
    m.note("recovering", now=1000.0)
    m.note("recovered", now=1030.0)
    m.last_pass = {"at": 1030.0, "outcome": "recovered", "wall_s": 21.5}
    lines = status_lines(m, 1090.0)
    assert lines[0] == "run r9: running, attempt 2, recoveries 1/3 (2 left)"
    assert "last reconcile pass 60 s ago" in lines[1] and "recovered (21.5 s)" in lines[1]
    assert [ln.split()[-1] for ln in lines[2:]] == ["recovering", "recovered"]


def test_status_shows_the_newest_history_with_details_and_where_the_rest_is() -> None:
    """Each entry's details, its date when it is not today's, and where the whole history is."""
    from scripts.targets.gce.manifest import STATUS_HISTORY, RunManifest, status_lines

    m = RunManifest("r9", "s", ("x.py",), {}, max_recoveries=3)
    day = 86400.0
    for i in range(STATUS_HISTORY + 2):
        m.note("waiting for capacity", now=10 * day + 60.0 * i, zones=2)
    m.note("recovered", now=12 * day, attempt=2, relaunch_to_step_s=12.5)
    lines = status_lines(m, 12 * day + 60.0, "gs://b/runs/r9/manifest.json")
    history = [ln for ln in lines if ln.startswith("  ") and "last reconcile" not in ln]
    assert history[0] == "  (3 earlier entries: gs://b/runs/r9/manifest.json)"
    assert len(history) == 1 + STATUS_HISTORY
    yesterday = time.strftime("%Y-%m-%d", time.localtime(10 * day))
    assert history[1].startswith(f"  {yesterday} ") and history[1].endswith(
        "waiting for capacity (zones 2)"
    )
    recovered = time.strftime("%H:%M:%S", time.localtime(12 * day))
    assert history[-1] == f"  {recovered}  recovered (attempt 2, relaunch_to_step_s 12.5)"


def test_resume_finds_a_run_in_the_stacks_bucket(gcs: GcsEmulator, storage: StorageApi) -> None:
    """`train --resume RUN` on a stack asks the bucket (it imported a module that did not exist:
    every --resume on a stack with a bucket ended in ModuleNotFoundError)."""
    from scripts.targets.gce.autodown import bucket_has_run

    gcs.write("p/runs/20261127-101500-ab12/out/node-0/ckpt-00000010.pt", b"state")
    assert bucket_has_run(f"gs://{BUCKET}/p/", "test", "20261127-101500-ab12")
    assert not bucket_has_run(f"gs://{BUCKET}/p/", "test", "20261127-101500-cd34")
    assert not bucket_has_run(None, "test", "20261127-101500-ab12")


def test_a_reconcile_pass_ends_a_run_stopped_at_its_budget(
    gcs: GcsEmulator, storage: StorageApi
) -> None:
    """The head's end marker says the budget stopped the job: the pass records the end, deletes
    what autodown left and says `budget` (never a recovery, never `failed`)."""
    from scripts.targets.gce.reconcile import BUDGET, DONE, Pass

    manifests = Manifests(storage, BUCKET, "budget/")
    m = manifest_for(Job("r3"), "s", max_recoveries=3, deadline=9e9, code=None)
    held = Lease(storage, BUCKET, "budget/", kind="reconciler", run_id="r3", ttl_s=60)
    assert held.acquire() is None
    manifests.write(m, held.renew())
    marker = {"node": "s-node-0", "ended_at": time.time(), "exit_code": "1", "stopped_by": "budget"}
    blob = gcs.client().bucket(BUCKET).blob("budget/runs/r3/s-node-0/.gputrain-ended.json")
    blob.upload_from_string(json.dumps(marker))
    deleted: list[str] = []
    sent: list[tuple[str, dict[str, object]]] = []
    compute = SimpleNamespace(
        list_stack_instances=lambda project, stack: [{"name": "s-node-1", "zone": "z"}],
        delete_instance=lambda project, zone, name: deleted.append(name),
    )
    target = SimpleNamespace(stack="s", clients=SimpleNamespace(compute=lambda: compute))
    notifier = SimpleNamespace(send=lambda event, **kw: sent.append((event, kw)))
    step = Pass(target, None, manifests, manifests.find("s", "r3"), held, notifier)  # type: ignore[arg-type]
    out = SimpleNamespace(head=SimpleNamespace(name="s-node-0"), project="p")
    assert step.head_ended(out) == BUDGET  # type: ignore[arg-type]
    assert step.finish(out, BUDGET) == DONE  # type: ignore[arg-type]
    held.release()
    assert deleted == ["s-node-1"]
    assert sent == [("budget", {"detail": "stopped at its budget; 1 VM(s) deleted"})]
    again = manifests.find("s", "r3")
    assert (
        again.state == "failed" and again.history[-1]["what"] == "job ended: stopped at its budget"
    )
