"""`gputrain reconcile --stack S [--run ID]`: one idempotent pass of spot recovery, runnable
anywhere that reaches the stack's bucket, its Pulumi state and the nodes' SSH (the laptop, or a
Cloud Run job started by Cloud Scheduler while the laptop is closed).

The pass reads the run's manifest (scripts/targets/gce/manifest.py), takes the stack's lease
(lease.py; a live controller or another pass holds it: nothing to do) and then does one of:
- the job ended (the head's end marker in the bucket): its results are in the bucket (the
  watchdogs put them there); VMs autodown missed are deleted; the state is recorded;
- every VM runs and nothing was taken away: exit (seconds);
- GCE took VMs away (the detection of recovery.py): re-create them through the same `refresh` +
  `up` as the controller's recovery, pin the new host keys, verify, relaunch the same run with
  `--resume` (its resume args) through the launch's own node steps (environment, image, data,
  with its Secret Manager secrets read here), wait for its first resumed step, notify
  `recovered`;
- no capacity anywhere: delete what is left (nothing bills), record "waiting for capacity"; the
  next pass tries again, until --max-recoveries or the stack's TTL (counted from the first
  launch, never renewed) is spent.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputrain_node.contract import ENDED_MARKER
from infra.base.errors import GputrainError
from scripts import ui
from scripts.targets.gce.lease import RECONCILER_TTL_S, Lease, LeaseLost
from scripts.targets.gce.manifest import (
    ENDED,
    EXHAUSTED,
    FAILED,
    FINISHED,
    RECOVERING,
    RUNNING,
    WAITING,
    Manifests,
    RunManifest,
)

if TYPE_CHECKING:
    from infra.outputs import StackOutputs
    from infra.spec import ClusterSpec
    from scripts.job.autodown import RunBudget
    from scripts.job.records import Job
    from scripts.notify import Notifier
    from scripts.targets.gce.recovery import NodeCloudState, StackNodes

#: what one pass did (its `last_pass.outcome` and the command's last line)
LEASED, ADVANCING, DONE, RECOVERED = "leased elsewhere", "running", "ended", "recovered"
RELAUNCH_FAILED = "relaunch failed"  # counted as a recovery: the next pass tries again
BUDGET = "budget"  # head_ended: the head's watchdog stopped the job at the run's budget


def stack_file_from_environment(root: Path, stack: str, environ: Mapping[str, str]) -> bool:
    """In the stack's Cloud Run job: the stack file the program handed the job (its text, in
    GPUTRAIN_STACK_FILE) written into the project directory, where the pass and its Pulumi CLI
    read it. A project that has the file keeps it. Whether it was written."""
    from infra.reconciler import STACK_FILE_ENV
    from infra.stackfile import check_stack_name

    text = environ.get(STACK_FILE_ENV)
    check_stack_name(stack)
    path = root / f"Pulumi.{stack}.yaml"
    if not text or path.exists():
        return False
    path.write_text(text)
    path.chmod(0o600)
    return True


def reconcile(
    target: Any,  # GceTarget (which imports this module)
    run_id: str | None,
    *,
    notifier: Notifier,
    max_recoveries: int | None = None,
) -> str:
    """One pass; its outcome."""
    spec = target.spec()
    if not spec.project or not spec.bucket_name:
        raise GputrainError(
            f"reconcile: stack {target.stack} has no project or bucket: nothing to reconcile"
        )
    storage = target.clients.storage(spec.project)
    manifests = Manifests(storage, spec.bucket_name, spec.bucket_prefix)
    manifest = manifests.find(target.stack, run_id)
    notifier.base |= {"run_id": manifest.run_id}
    if manifest.state in ENDED:
        ui.say(f"reconcile: run {manifest.run_id} is {manifest.state}: nothing to do")
        return DONE
    lease = Lease(
        storage,
        spec.bucket_name,
        spec.bucket_prefix,
        kind="reconciler",
        run_id=manifest.run_id,
        ttl_s=RECONCILER_TTL_S,
    )
    held = lease.acquire()
    if held is not None:
        ui.say(f"reconcile: {held.line(time.time())}: leaving run {manifest.run_id} to it")
        return LEASED
    lease.keep_renewing()
    started = time.time()
    try:
        manifest = manifests.find(target.stack, manifest.run_id)  # as of the lease
        if max_recoveries is not None:
            manifest.max_recoveries = max_recoveries
        step = Pass(target, spec, manifests, manifest, lease, notifier)
        outcome = step.run()
        if lease.token is not None and not lease.lost.is_set():
            manifest.last_pass = {
                "at": started,
                "wall_s": round(time.time() - started, 3),
                "by": lease.holder,
                "outcome": outcome,
            }
            manifests.write(manifest, lease.token)
        ui.say(f"reconcile: run {manifest.run_id}: {outcome} ({manifest.state})")
        return outcome
    except LeaseLost as e:
        ui.warn(f"reconcile: {e}: this pass stops")
        return LEASED
    finally:
        lease.release()


class Pass:
    """One pass over one run, holding the lease."""

    def __init__(
        self,
        target: Any,  # GceTarget (which imports this module)
        spec: ClusterSpec,
        manifests: Manifests,
        manifest: RunManifest,
        lease: Lease,
        notifier: Notifier,
    ) -> None:
        self.target, self.spec, self.manifests, self.m = target, spec, manifests, manifest
        self.lease, self.notifier = lease, notifier
        self.compute = target.clients.compute()
        self.recreated: dict[str, Any] = {}  # the stack outputs after a re-creation

    def save(self) -> None:
        if self.lease.lost.is_set() or self.lease.token is None:
            raise LeaseLost("the lease was taken over")
        self.manifests.write(self.m, self.lease.token)

    def run(self) -> str:
        from infra.outputs import parse_stack_outputs

        out = parse_stack_outputs(self.target.runner.outputs())
        if self.m.state in (WAITING, RECOVERING):  # the last pass deleted what was left (no
            # capacity) or died mid-way: `up` re-creates what is missing (this attempt's
            # preemption records name VMs that may stand again), relaunch on all of it
            return self.recover(out, {n.name: None for n in out.nodes})
        ended = self.head_ended(out)
        # autodown may have run already; a run stopped at its budget is never recovered
        if ended in ("0", BUDGET):
            return self.finish(out, ended)
        if time.time() >= self.m.deadline:  # a re-created VM lives no longer than the first
            return self.give_up(out, "the stack's TTL is spent")
        lost = self.lost(out)
        if ended is not None:  # the job ended by itself: a VM gone without GCE's termination
            # operation was deleted by autodown after the end, not taken away (a crash is a crash)
            lost = {n: s for n, s in lost.items() if s is not None and s.preempted_at}
        if ended is not None and not lost:
            return self.finish(out, ended)
        if not lost:
            self.m.state = RUNNING
            return ADVANCING
        return self.recover(out, lost)

    # ---- what the cloud and the bucket say

    def head_ended(self, out: StackOutputs) -> str | None:
        """The head's exit code when its end marker for this attempt is in the bucket; BUDGET
        when its watchdog stopped the job at the run's budget."""
        head = out.head.name
        name = f"{self.manifests.prefix}runs/{self.m.run_id}/{head}/{ENDED_MARKER}"
        found = self.manifests.storage.read_versioned(self.manifests.bucket, name)
        if found is None:
            return None
        try:
            marker = json.loads(found[0])
        except ValueError:
            return None
        if float(marker.get("ended_at") or 0) < self.m.attempt_started_at - 1:
            return None  # an earlier attempt's
        if marker.get("stopped_by") == "budget":
            return BUDGET
        return str(marker.get("exit_code"))

    def nodes(self, out: StackOutputs) -> StackNodes:
        """recovery.py's view of the stack's VMs: its detection, its wait and re-creation
        (the controller's own `refresh` + `up`, with no waiting for capacity: a stock-out is
        the next pass's to retry). The TTL counts from the first launch."""
        from infra.outputs import parse_stack_outputs
        from infra.ttl import Recreation
        from scripts.targets.gce.recovery import StackNodes

        def recreate(cluster: StackOutputs, gone: Sequence[str]) -> tuple[Any, StackOutputs]:
            # its new VMs live to the deadline not_recreating checks, on the cluster's image
            again = Recreation.of(cluster, self.m.deadline, gone)
            self.recreated = self.target.recreated(self.spec, again, self.m.budget_usd)
            return None, parse_stack_outputs(self.recreated)

        nodes = StackNodes(
            self.compute, out, spot=self.spec.spot, ttl_s=out.max_run_duration_s,
            recreate=recreate, automatic_restart=self.spec.automatic_restart,
        )  # fmt: skip
        nodes.created_at = self.m.created_at
        return nodes

    def budget(self) -> RunBudget | None:
        """The run's budget as its relaunch gives it to the head (session_for)."""
        from scripts.targets.base import RunOptions
        from scripts.targets.gce.autodown import run_budget

        started = self.m.started_at or self.m.created_at or time.time()  # as relaunch's
        before = (self.m.ledger or {}).get("partial_usd")  # what `up`'s partial creates billed
        return run_budget(self.spec, RunOptions(budget=self.m.budget_usd), started, before)

    def lost(self, out: StackOutputs) -> dict[str, NodeCloudState | None]:
        """The nodes GCE took away during this attempt."""
        return dict(self.nodes(out).preempted(self.m.attempt_started_at, wait_s=0))

    # ---- outcomes

    def finish(self, out: StackOutputs, code: str) -> str:
        """The job ended: its results are in the bucket (the watchdogs' upload, their markers);
        VMs that are still there are deleted (autodown's job, done again if it was missed)."""
        left = self.delete_vms(out)
        self.m.state = FINISHED if code == "0" else FAILED
        how = "stopped at its budget" if code == BUDGET else f"exit code {code}"
        self.m.note(f"job ended: {how}", vms_deleted=left)
        self.save()
        if left:  # autodown did not get to it: tell what the watchdog would have
            event = {"0": "finished", BUDGET: "budget"}.get(code, "failed")
            self.notifier.send(event, detail=f"{how}; {len(left)} VM(s) deleted")
        ui.say(
            f"reconcile: run {self.m.run_id} ended ({how}); results in "
            f"{self.manifests.uri}runs/{self.m.run_id}/; "
            + (f"deleted {', '.join(left)}" if left else "no VM left")
        )
        return DONE

    def give_up(self, out: StackOutputs, why: str, state: str = FAILED) -> str:
        left = self.delete_vms(out)
        self.m.state = state
        self.m.note(why, vms_deleted=left)
        self.save()
        self.notifier.send("failed", root_cause=why)
        ui.warn(f"reconcile: run {self.m.run_id}: {why}; its checkpoints stay in the bucket")
        return DONE

    def recover(self, out: StackOutputs, lost: dict[str, NodeCloudState | None]) -> str:
        from scripts.targets.gce.manifest import not_recreating
        from scripts.targets.gce.provision import ProvisioningError, stocked_out

        now = time.time()
        names = sorted(lost)
        if self.m.recoveries_left <= 0:
            return self.give_up(
                out,
                f"{', '.join(names)} taken away and --max-recoveries {self.m.max_recoveries} "
                "allows no more recoveries",
                EXHAUSTED,
            )
        if why := not_recreating(self.m.deadline, self.budget(), now):
            return self.give_up(out, why)
        if self.m.not_relaunchable:
            return self.give_up(out, f"cannot relaunch it here: {self.m.not_relaunchable}")
        if self.m.state == RUNNING:
            evidence = "; ".join(f"{n}: {s.evidence}" for n, s in lost.items() if s is not None)
            self.notifier.send("preempted", detail=evidence or ", ".join(names))
            ui.say(f"reconcile: run {self.m.run_id}: {evidence}; recovering")
        self.m.state = RECOVERING
        self.m.note("recovering", nodes=names)
        self.save()
        with tempfile.TemporaryDirectory(prefix="gputrain-reconcile-") as tmp:
            # its code and secrets before any VM: a refused secret or a missing bundle bills
            # nothing (the next pass tries again, as the grant may come)
            job = self.relaunched_job(Path(tmp) / "code")
            try:
                outputs = self.recreate(out, lost)
            except ProvisioningError as e:
                if not stocked_out(e):
                    raise
                left = self.delete_vms(out)
                self.m.state = WAITING
                self.m.note(WAITING, vms_deleted=left)
                self.save()
                ui.say(
                    f"reconcile: run {self.m.run_id}: no capacity in any zone; {len(left)} "
                    "VM(s) deleted, nothing bills; the next pass tries again"
                )
                return WAITING
            self.carry_ledger(out, outputs)
            try:
                self.relaunch(outputs, job)
            except LeaseLost:
                raise
            except Exception as e:  # bounded: each failed relaunch spends a recovery
                return self.relaunch_failed(e)
        return RECOVERED

    def relaunch_failed(self, error: Exception) -> str:
        """A relaunch that failed on the re-created VMs counts as a recovery: the next pass
        tries again (`up` keeps the VMs), and once none is left gives up and deletes them."""
        why = (str(error).strip().splitlines() or [type(error).__name__])[-1][:300]
        self.m.recoveries_done += 1
        self.m.note(RELAUNCH_FAILED, error=why)
        self.save()
        ui.warn(
            f"reconcile: run {self.m.run_id}: the relaunch failed ({why}); recovery "
            f"{self.m.recoveries_done}/{self.m.max_recoveries} spent, "
            + (
                "the next pass tries again"
                if self.m.recoveries_left
                else "the next pass deletes the VMs"
            )
        )
        return RELAUNCH_FAILED

    def recreate(self, out: StackOutputs, lost: dict[str, NodeCloudState | None]) -> dict[str, Any]:
        """Wait until GCE has deleted the lost VMs, then re-create the cluster; its outputs. A
        node of unknown state (None: the last pass deleted it, or died mid-way) is re-created
        as one lost: an `up` of that pass may have moved it."""
        self.nodes(out).recreate(lost)
        return self.recreated

    def carry_ledger(self, before: StackOutputs, outputs: dict[str, Any]) -> None:
        """The run's cost record as its launch made it goes on to the relaunch's watchdog with
        the zones its cluster ran in, in order: where it was (a controller's recovery may have
        moved it since the launch) and where it is now."""
        from infra.outputs import parse_stack_outputs
        from scripts.cost.ledger import with_zone

        if self.m.ledger:
            moved = with_zone(self.m.ledger, before.zone)
            self.m.ledger = with_zone(moved, parse_stack_outputs(outputs).zone)

    def relaunched_job(self, workdir: Path) -> Job:
        """The run's next attempt as its launch made it: its code bundle into `workdir`, its
        Secret Manager secrets read by this pass."""
        from scripts.job.environment import read_secret_references
        from scripts.job.records import Job

        if self.m.code:
            self.manifests.get_code(self.m.code, workdir)
        else:
            workdir.mkdir()
        return Job(
            run_id=self.m.run_id,
            entry=self.m.entry,
            env=self.m.env,
            max_restarts=self.m.max_restarts,
            workdir=workdir,
            resume_args=self.m.resume_args,
            attempt=self.m.attempt + 1,
            # prepared on the re-created nodes as the first launch did: the environment
            # (requirements, its torch pin, setup), the image's pull, the datasets' fetch
            **self.m.job_parts(),
            secrets=read_secret_references(self.m.secret_refs),
            secret_refs=self.m.secret_refs,
        )

    def relaunch(self, outputs: dict[str, Any], job: Job) -> None:
        """The same run on the new cluster, from its checkpoints; returns at its first step."""
        from scripts.job.launch import stop_job
        from scripts.targets.base import signal_guard

        with (
            signal_guard() as guard,
            self.target.session_for(
                self.spec,
                outputs,
                self.m.max_recoveries,
                started_at=self.m.started_at or self.m.created_at or None,
                budget=self.m.budget_usd,
                ledger=self.m.ledger,
            ) as session,
        ):
            session.holds_lease = False  # this pass holds it (a reconciler's lease)
            session.verify(fabric=True)
            stop_job(session.transports, job.run_id)  # the survivors' old attempt
            began = time.time()
            self.m.attempt, self.m.attempt_started_at = job.attempt, began
            session.run_detached(job, guard)
            session.keep = True
        downtime = time.time() - began
        self.m.recoveries_done += 1
        self.m.state = RUNNING
        line = (
            f"recovery {self.m.recoveries_done}/{self.m.max_recoveries}: run {self.m.run_id} "
            f"trains again (attempt {self.m.attempt}), first resumed step {downtime:.1f} s "
            "after the relaunch"
        )
        self.m.note("recovered", attempt=self.m.attempt, relaunch_to_step_s=round(downtime, 2))
        self.save()
        self.notifier.send("recovered", detail=line)
        ui.say(f"reconcile: {line}")

    def delete_vms(self, out: StackOutputs) -> list[str]:
        """Every VM of the stack still there, deleted (workers first): nothing bills."""
        project = out.project
        there = self.compute.list_stack_instances(project, self.target.stack)
        names = sorted((i["name"], i["zone"]) for i in there)
        head = out.head.name
        for name, zone in sorted(names, key=lambda nz: nz[0] == head):
            self.compute.delete_instance(project, zone, name)
        return [n for n, _ in names]
