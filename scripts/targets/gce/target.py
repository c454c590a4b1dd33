"""`--stack NAME`: a Pulumi stack of GPU VMs on Compute Engine. Its session is the SSH fleet of the
stack's nodes, each pinned to the host keys its guest agent published. The skeleton (check ->
prepare -> confirm -> create -> keep or tear down) is StackTarget's; this module fills its hooks:
preflight of zones or `gpus` candidates, `pulumi up` with failover, host keys, the recovering
session, and what a sweep finds.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.base.errors import GputrainError, UserError
from infra.outputs import Key
from scripts import ui
from scripts.targets.base import RunOptions
from scripts.targets.gce.clients import GceClients
from scripts.targets.stack.clients import pulumi_line
from scripts.targets.stack.target import StackContext, StackTarget, pin

if TYPE_CHECKING:
    from infra.base.records import Fleet
    from infra.offer_tables import Check
    from infra.offers import Candidate
    from infra.outputs import StackOutputs
    from infra.spec import ClusterSpec
    from infra.ttl import Recreation
    from scripts.targets.gce.provision import Attempt, CapacityWait
    from scripts.targets.gce.recovery import RecoveringSession
    from scripts.targets.session import FleetSession

Context = StackContext[GceClients]

#: `prepare`'s answer: `pulumi up` down the zones or candidates that passed preflight; the spec of
#: what was created (a `gpus` stack pins its candidate), the raw stack outputs, and what partial
#: creates billed, the round's that made it too (USD; None: their price is unknown).
Provision = Callable[[], tuple["ClusterSpec", dict[str, Any], float | None]]


class GceTarget(StackTarget[GceClients, Provision]):
    # ---- commands that need no cluster

    def keygen(self, *, force: bool) -> None:
        from scripts.targets.gce.keys import store_new_keypair

        if self.spec().ssh_public_key and not force:
            raise UserError(
                f"gputrain:sshPublicKey is already set for stack {self.stack}; "
                "pass --force to replace it (running VMs keep the old key until the next up)"
            )
        store_new_keypair(self.runner, self.stack)
        ui.say(
            f"keygen: stored a new ed25519 key pair in stack {self.stack} (private key as a secret)"
        )

    def status(self) -> None:
        from infra.keys import format_duration
        from infra.ttl import ttl_left_s
        from scripts.targets.gce.autodown import say_last_autodown
        from scripts.targets.gce.manifest import say_recovery

        spec = self.spec_with_project()
        instances = self.clients.compute().list_stack_instances(spec.project or "", self.stack)
        say_last_autodown(spec, self.clients)
        say_recovery(spec, self.clients)
        if not instances:
            ui.say(f"status: stack {self.stack} has no instances (nothing is billing)")
            return
        now = time.time()
        rows = []
        for i in sorted(instances, key=lambda x: x["name"]):
            left = ttl_left_s(i.get("last_start"), i.get("max_run_duration_s"), now)
            when = "?" if left is None else format_duration(int(left))
            rows.append([i["name"], i["zone"], i["status"], when])
        ui.table(
            f"status: stack {self.stack}", ["node", "zone", "state", "deleted by GCE in"], rows
        )

    def reconcile(self, run_id: str | None, opts: RunOptions) -> str:
        """`gputrain reconcile`: one pass of recovery for the stack's run."""
        from scripts.notify import Notifier, run_notify_urls
        from scripts.targets.gce.reconcile import reconcile

        spec = self.spec()
        limit = None if opts.max_recoveries is None else recoveries_allowed(opts, spec)
        notifier = Notifier(list(run_notify_urls(opts.notify, spec.notify)), {"stack": self.stack})
        try:
            return reconcile(self, run_id, notifier=notifier, max_recoveries=limit)
        finally:
            notifier.close()

    def sweep(self) -> bool:
        leftovers = self.leftovers(self.context(self.spec(), RunOptions()))
        if not leftovers:
            ui.say(f"sweep: nothing carries the labels of stack {self.stack}")
        return bool(leftovers)

    def leftovers(self, ctx: Context, *, kept: str | None = None) -> list[list[str]]:
        """Whatever still carries the stack's labels or name prefix, printed loudly; a bucket
        kept on purpose is not a leftover."""
        from infra.gcp.sweep import sweep
        from infra.reconciler import wanted

        spec, clients = ctx.spec, ctx.clients
        project = spec.project
        if not project:
            raise UserError(f"gcp:project is not set for stack {spec.stack}")
        recovery = wanted(spec.recover, spec.capacity, spec.job_reach)  # its job and image
        found = sweep(
            project,
            spec.stack,
            api=clients.compute(),
            storage=clients.storage(project),
            registry=clients.artifact_registry() if spec.build or recovery else None,
            jobs=clients.reconcile_jobs() if recovery else None,
            region=spec.region,
            budget_reads=clients.budget_reads() if spec.billing_budget else None,
            billing_account=spec.billing_budget.account if spec.billing_budget else None,
        )
        rows = [
            [x.kind, x.name, x.location, x.matched_by]
            for x in found
            if not (x.kind == "bucket" and x.name == kept)
        ]
        if rows:
            headers = ["kind", "name", "where", "matched by"]
            ui.table(f"LEFT BEHIND by stack {spec.stack}", headers, rows)
        return rows

    def candidate_checks(self, ctx: Context) -> dict[Candidate, Check] | None:
        """`plan` on a `gpus` stack checks its candidates against the Compute API when there is
        a project and somewhere to ask (credentials, or GPUTRAIN_COMPUTE_ENDPOINT)."""
        spec, clients = ctx.spec, ctx.clients
        if not spec.candidates or not spec.project or not clients.compute_reachable():
            return None
        from scripts.targets.gce.preflight import check_candidates

        return check_candidates(spec, clients.compute())

    # ---- creating and destroying: StackTarget's skeleton, these hooks (verbs below)

    def spec_for(self, ctx: Context) -> ClusterSpec:
        """Every `up` starts at the top of a capacity list (written when that rung is tried)."""
        ladder = ctx.spec.capacity_ladder
        return pin(ctx.spec, ctx.stack_file.config, capacity=ladder[0]) if ladder else ctx.spec

    def prepare(self, ctx: Context) -> Provision:
        """Preflight the zones (or rank the `gpus` candidates that pass), read a reservation's
        mode; `create` walks them, waiting out stock-outs and stepping down a capacity list."""
        from scripts.targets.gce.preflight import passing_places, pin_reservation_bound

        spec, skip = ctx.spec, ctx.opts.skip_preflight
        where = passing_places(ctx, spec, skip=skip)
        if spec.capacity == "reservation":  # read anew on every `up`: the reservation may differ
            zone = spec.zones[0] if spec.candidates else where[0]
            spec = pin_reservation_bound(spec, ctx.runner, ctx.clients.compute(), zone)
        wait = capacity_wait(ctx.at(spec), "nothing is billing", where)
        made = lambda: create_down_the_ladder(ctx.at(spec), where, wait.failed)  # noqa: E731
        return lambda: (*wait.run(made, ui.say), wait.spent.usd)

    @contextmanager
    def create(self, ctx: Context, prepared: Provision) -> Iterator[FleetSession]:
        from scripts.targets.gce.keys import private_key_file
        from scripts.targets.gce.partial import cluster_created

        began = time.time()  # the VMs `up` makes bill from their creation, after this
        spec, outputs, partial_usd = prepared()
        opts = ctx.opts
        with (
            private_key_file(ctx.runner, ctx.stack) as key,
            stack_session(
                ctx.at(spec),
                outputs,
                key,
                keep=opts.keep,
                connect_deadline_s=opts.wait_s or ctx.settings.connect_deadline_s,
                started_at=cluster_created(ctx.clients.compute(), outputs, ctx.stack, began),
                partial_usd=partial_usd,
            ) as cluster,
        ):
            yield cluster

    def kept_message(self, ctx: Context) -> str:
        return (
            f"stack {ctx.stack} stays up; its VMs delete themselves after "
            f"{ctx.spec.max_run_duration}; `gputrain down --stack {ctx.stack}` ends it sooner"
        )

    def ends_server_side(self, ctx: Context) -> str:
        return (
            f"its VMs delete themselves {ctx.spec.max_run_duration} after they started "
            "(maxRunDuration)"
        )

    def after_destroy(self, ctx: Context) -> None:
        """The failover's picks are cleared: the next `up` ranks anew."""
        from scripts.targets.gce.provision import CANDIDATE_CONFIG_KEY, ZONE_CONFIG_KEY

        for key in (ZONE_CONFIG_KEY, CANDIDATE_CONFIG_KEY):
            try:
                ctx.runner.remove_config(key)
            except Exception as exc:
                ui.warn(f"could not clear {key}: {exc}")

    @contextmanager
    def attached(self, opts: RunOptions, *, for_run: bool = False) -> Iterator[FleetSession]:
        from infra.outputs import drift
        from scripts.targets.gce.keys import private_key_file

        ctx = self.context(self.spec(), opts)  # a broken stack file is still a one-line error
        outputs = ctx.runner.outputs()
        if not outputs.get(Key.NODES):
            raise UserError(
                f"stack {self.stack} has no cluster; run `gputrain up --stack {self.stack}`"
            )
        changed = drift(ctx.spec, outputs) if for_run else []
        if changed:  # the caps, the watchdog's rate and a recovery's `up` all read the file
            raise UserError(
                f"stack {self.stack}: the cluster that is up is not what its stack file says now "
                f"({'; '.join(changed)}), and the run's spending caps, budget and recoveries go "
                f"by the file; `gputrain up --stack {self.stack}` makes the cluster what the "
                "file says, or put the file back; nothing was started"
            )
        with (
            private_key_file(ctx.runner, ctx.stack) as key,
            stack_session(ctx, outputs, key, keep=True, connect_deadline_s=opts.wait_s) as session,
        ):
            yield session

    def recreated(
        self, spec: ClusterSpec, again: Recreation, budget: float | None
    ) -> dict[str, Any]:
        """`gputrain reconcile`'s re-creation: the controller's own refresh + up, with no
        waiting for capacity (a stock-out is the next pass's to retry), within the run's
        `budget` (None: the stack's), its deadline and image; the stack outputs."""
        opts = RunOptions(wait_for_capacity_s=0, budget=budget)
        return recreate(self.context(spec, opts), again)

    @contextmanager
    def session_for(
        self,
        spec: ClusterSpec,
        outputs: dict[str, Any],
        max_recoveries: int,
        started_at: float | None = None,
        budget: float | None = None,
        ledger: dict[str, Any] | None = None,
    ) -> Iterator[RecoveringSession]:
        """The session of a cluster `gputrain reconcile` re-created: pinned, kept (the run goes
        on without this process), its autodown as the stack declares it; `started_at`: the
        run's start (its budget, its cost record and its TTL count from there), `budget` its
        budget (None: the stack's), `ledger` its cost record as its launch knew it."""
        from scripts.targets.gce.keys import private_key_file

        ctx = self.context(spec, RunOptions(max_recoveries=max_recoveries, budget=budget))
        with private_key_file(self.runner, self.stack) as key:
            session = stack_session(
                ctx,
                outputs,
                key,
                keep=True,
                connect_deadline_s=self.settings.connect_deadline_s,
                started_at=started_at,
                ledger=ledger,
            )
            with session:
                yield session


# ---- the verbs: stateless, over one context (SkyPilot's sky/provision/gcp/instance.py)


def capacity_wait(ctx: Context, billing: str, where: list[Any] | None = None) -> CapacityWait:
    """Stock-outs waited out for --wait-for-capacity (else the stack's waitForCapacity), what
    partial creates bill said; `up`'s wait (`where`: the places it walks) also holds them to the
    budget, while a recovery's is held by the watchdog, which counts the whole cluster's rate."""
    from scripts.targets.gce.partial import spend_room, vm_rate
    from scripts.targets.gce.provision import CapacityWait

    given = ctx.opts.wait_for_capacity_s
    wait_s = ctx.spec.wait_for_capacity_s if given is None else given
    first, longest = ctx.clients.capacity_pause_s
    config = ctx.stack_file.config
    room = spend_room(ctx.spec, config, ctx.opts.budget, where) if where and wait_s > 0 else None
    rate = vm_rate(ctx.spec)
    return CapacityWait(wait_s, first, longest, billing_note=billing, vm_hourly=rate, room=room)


def create_down_the_ladder(
    ctx: Context, where: list[Any], failed: list[Attempt]
) -> tuple[ClusterSpec, dict[str, Any]]:
    """One round of `pulumi up` with failover; with a capacity list, mode after mode, each
    written to the stack's config (`capacityInUse`) before its `up`. Each failed attempt, with
    what its partial create billed, goes to `failed` (the capacity wait's, which counts them)."""
    spec = ctx.spec
    if not spec.capacity_ladder:
        return create_in(ctx, where, failed)
    from infra.disk_prices import cluster_hourly
    from infra.stackfile import NS
    from scripts.targets.gce.preflight import passing_places
    from scripts.targets.gce.provision import down_the_ladder

    config = ctx.stack_file.config
    places: dict[str, list[Any]] = {spec.capacity: where}

    def rung(mode: str) -> tuple[ClusterSpec, dict[str, Any]]:
        ctx.runner.set_config(NS + "capacityInUse", mode)  # the program reads it at `up`
        at = ctx.at(pin(spec, config, capacity=mode))
        if mode not in places:
            places[mode] = passing_places(ctx, at.spec, skip=ctx.opts.skip_preflight)
        return create_in(at, places[mode], failed)

    return down_the_ladder(
        spec.capacity_ladder,
        rung,
        ui.say,
        lambda m: cluster_hourly(pin(spec, config, capacity=m)),
    )


def create_in(
    ctx: Context, where: list[Any], failed: list[Attempt]
) -> tuple[ClusterSpec, dict[str, Any]]:
    """`pulumi up` down the candidates or zones of one capacity mode."""
    if ctx.spec.candidates:
        return provision_candidates(ctx, where, failed)
    return ctx.spec, provision_zones(ctx, where, failed)


def stack_session(
    ctx: Context,
    outputs: dict[str, Any],
    key: Path,
    *,
    keep: bool,
    connect_deadline_s: float | None,
    started_at: float | None = None,
    partial_usd: float | None = 0.0,
    ledger: dict[str, Any] | None = None,
) -> RecoveringSession:
    """The stack's fleet, pinned; it re-creates preempted VMs (`recreate`). `started_at`: the
    run's start when it was earlier than this session (its VMs' creation during `up`, or a
    reconciler's relaunch, which gives the run's cost record as its launch knew it: `ledger`);
    `partial_usd`: what `up`'s partial creates billed for the run."""
    from infra.disk_prices import cluster_hourly
    from infra.outputs import parse_stack_outputs
    from infra.ttl import Recreation
    from scripts.targets.gce.autodown import stack_autodown
    from scripts.targets.gce.recovery import RecoveringSession, StackNodes
    from scripts.verify.nodes import FabricCheck

    spec, opts, clients = ctx.spec, ctx.opts, ctx.clients

    def recreated(cluster: StackOutputs, gone: Sequence[str]) -> tuple[Fleet, StackOutputs]:
        again = Recreation.of(cluster, nodes.deadline, gone)  # `nodes`: below
        out = parse_stack_outputs(recreate(ctx, again))
        return stack_fleet(ctx, out, key), out

    out = parse_stack_outputs(outputs)
    bucket = out.bucket.uri if out.bucket else None
    nodes = StackNodes(
        clients.compute(), out, spot=spec.spot, ttl_s=spec.max_run_duration_s, recreate=recreated,
        bucket=bucket, stack=spec.stack, automatic_restart=spec.automatic_restart,
    )  # fmt: skip
    if started_at is not None:
        nodes.created_at = started_at
    return RecoveringSession(
        stack_fleet(ctx, out, key), ctx.settings, nodes,
        max_recoveries=recoveries_allowed(opts, spec),
        hourly_usd=cluster_hourly(spec),  # the rate the budget and the watchdog count
        keep=keep, confirm_s=clients.preemption_confirm_s,
        connect_deadline_s=connect_deadline_s, fabric=FabricCheck.of(spec.fabric),
        stall_timeout_s=spec.stall_timeout_s,
        autodown=stack_autodown(
            spec, out, bucket, opts, clients, nodes.created_at, partial_usd, ledger
        ),
        spec=spec, partial_usd=partial_usd,
    )  # fmt: skip


def provision_zones(ctx: Context, zones: list[str], failed: list[Attempt]) -> dict[str, Any]:
    """`pulumi up` with zone failover; the stack outputs."""
    from scripts.targets.gce.provision import provision_with_failover

    spec = ctx.spec
    if spec.capacity == "flex-start":
        from infra.capacity import FLEX_START_NO_QUEUE

        ui.say(f"up: {FLEX_START_NO_QUEUE} (--wait-for-capacity retries it)")
    zone, outputs = provision_with_failover(
        ctx.runner,
        zones,
        on_event=ui.say,
        on_output=pulumi_line,
        expected_nodes=spec.nodes,
        project=spec.project,
        failed=failed,
    )
    ui.say(f"up: cluster ready in {zone}")
    return outputs


def provision_candidates(
    ctx: Context, ranked: list[Candidate], failed: list[Attempt]
) -> tuple[ClusterSpec, dict[str, Any]]:
    """`pulumi up` down the ranked candidates; the spec of the one created, its outputs."""
    from scripts.targets.gce.provision import (
        ATTEMPT_HEADERS,
        ProvisioningError,
        attempt_rows,
        provision_candidates,
    )

    try:
        chosen, outputs, attempts = provision_candidates(
            ctx.runner,
            ranked,
            max_candidates=ctx.opts.max_candidates,
            on_event=ui.say,
            on_output=pulumi_line,
            failed=failed,
        )
    except ProvisioningError as e:
        ui.table("up: attempts", ATTEMPT_HEADERS, attempt_rows(e.attempts))
        raise
    if len(attempts) > 1:
        ui.table("up: attempts", ATTEMPT_HEADERS, attempt_rows(attempts))
    ui.say(f"up: cluster ready: {chosen.nodes} x {chosen.machine_type} in {chosen.zone}")
    return pin(ctx.spec, ctx.stack_file.config, candidate=chosen), outputs


def recreate(ctx: Context, again: Recreation) -> dict[str, Any]:
    """After a preemption: `refresh` (the preempted VMs are gone), then `up` in the cluster's
    zone first, then the rest of the failover order, never destroying what survived; all
    stocked out: wait for capacity as `up` does. Each `up` re-creates VMs as `again` says, a
    later round's as what the failed ones left standing says (Recreation.after)."""
    from scripts.targets.gce.provision import ProvisioningError

    ctx.runner.refresh(on_output=None)
    rounds = [again]

    def once() -> dict[str, Any]:
        try:
            return recreate_once(ctx, rounds[-1])
        except ProvisioningError as e:
            rounds.append(rounds[-1].after((a.zone, a.made) for a in e.attempts))
            raise

    return capacity_wait(ctx, "the surviving VM(s) stay up and bill").run(once, ui.say)


def recreate_once(ctx: Context, again: Recreation) -> dict[str, Any]:
    from scripts.targets.gce.manifest import not_recreating
    from scripts.targets.gce.provision import provision_with_failover

    if why := not_recreating(again.deadline, None, time.time()):  # a wait outlived it
        raise GputrainError(why)
    spec, zone, env = ctx.spec, again.zone, again.env()
    if spec.candidates:  # same shape (the run's GPUs per node and nodes): its zone first
        from scripts.targets.gce.provision import provision_candidates

        # stable: ranked; its zone once per round (blocked after a stock-out), before any other
        order = sorted(recovery_candidates(ctx), key=lambda c: c.zone != zone)
        _, outputs, _ = provision_candidates(
            ctx.runner,
            order,
            max_candidates=len(order),
            on_event=ui.say,
            on_output=pulumi_line,
            destroy_failed=False,
            env=env,
        )
        return outputs
    _, outputs = provision_with_failover(
        ctx.runner,
        [zone, *(z for z in spec.zones if z != zone)],
        on_event=ui.say,
        on_output=pulumi_line,
        expected_nodes=spec.nodes,
        project=spec.project,
        destroy_failed=False,
        env=env,
    )
    return outputs


def recovery_candidates(ctx: Context) -> list[Candidate]:
    """Where a recovery may re-create the run's cluster: its shape (GPUs per node, nodes) at
    its own rate, the one its budget's watchdog and its cost record count the whole run at (a
    dearer one would pass them, a cheaper one count the time before it short), within the caps
    as `up`'s fallback is; the others said once."""
    from infra.disk_prices import cluster_hourly
    from infra.offer_tables import money
    from scripts.run_plan import worst_hourly
    from scripts.targets.gce.preflight import within_caps

    spec, config = ctx.spec, ctx.stack_file.config
    same, other, worst, rate = [], [], worst_hourly(spec), cluster_hourly(spec)
    for c in spec.candidates:
        if (c.machine_type, c.nodes) == (spec.machine_type, spec.nodes):
            at = pin(spec, config, candidate=c)
            if (worst_hourly(at), cluster_hourly(at)) == (worst, rate):
                same.append(c)
            else:
                other.append(f"{c.zone} at {money(cluster_hourly(at))}/h")
    if other:
        ui.say(
            f"recovery: not re-creating in {', '.join(other)}: the run's budget and cost record "
            f"count at its {money(rate)}/h"
        )
    return within_caps(ctx, spec, same)


def stack_fleet(ctx: Context, out: StackOutputs, key_file: Path) -> Fleet:
    """Nodes from the stack outputs, each pinned to the host keys its guest agent published."""
    from infra.gcp.compute import fetch_host_keys

    clients = ctx.clients
    api = clients.compute()
    keys = {
        n.name: fetch_host_keys(
            out.project,
            n.zone,
            n.name,
            deadline_s=clients.hostkey_deadline_s,
            api=api,
            on_progress=ui.say,
        )
        for n in out.nodes
    }
    fleet = out.to_fleet(ctx.name, keys, identity_file=key_file, python=clients.node_python)
    return dataclasses.replace(fleet, install_trainer=True)  # our VMs: the image may lack torch


def recoveries_allowed(opts: RunOptions, spec: ClusterSpec) -> int:
    """--max-recoveries (checked by the run plan), by default 3 on any capacity."""
    from scripts.run_plan import recoveries_allowed as allowed

    return allowed(opts.max_recoveries)
