"""`--stack NAME`: a Pulumi stack of GPU VMs on Compute Engine. Its session is the SSH fleet of the
stack's nodes, each pinned to the host keys its guest agent published. The skeleton (check ->
prepare -> confirm -> create -> keep or tear down) is StackTarget's; this module fills its hooks:
preflight of zones or `gpus` candidates, `pulumi up` with failover, host keys, the recovering
session, and what a sweep finds.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.base.errors import GputrainError, UserError
from infra.outputs import Key
from scripts import ui
from scripts.targets.base import RunOptions
from scripts.targets.gce.clients import GceClients
from scripts.targets.stack.runner import pulumi_line
from scripts.targets.stack.target import StackTarget, check_spending_caps

if TYPE_CHECKING:
    from infra.base.records import Fleet
    from infra.offer_tables import Check
    from infra.offers import Candidate
    from infra.outputs import StackOutputs
    from infra.spec import ClusterSpec
    from scripts.targets.gce.capacity_wait import CapacityWait
    from scripts.targets.gce.recovery import RecoveringSession
    from scripts.targets.session import FleetSession

#: `prepare`'s answer: `pulumi up` down the zones or candidates that passed preflight; the spec of
#: what was created (a `gpus` stack pins its candidate) and the raw stack outputs.
Provision = Callable[[], tuple["ClusterSpec", dict[str, Any]]]


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
        from infra.fields import format_duration
        from scripts.targets.gce.autodown import say_last_autodown

        spec = self.spec_with_project()
        instances = self.clients.compute().list_stack_instances(spec.project or "", self.stack)
        say_last_autodown(spec, self.clients)
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

    def sweep(self) -> bool:
        leftovers = self.leftovers(self.spec())
        if not leftovers:
            ui.say(f"sweep: nothing carries the labels of stack {self.stack}")
        return bool(leftovers)

    def leftovers(self, spec: ClusterSpec, *, kept: str | None = None) -> list[list[str]]:
        """Whatever still carries the stack's labels or name prefix, printed loudly; a bucket
        kept on purpose is not a leftover."""
        from infra.gcp.sweep import sweep

        project = spec.project
        if not project:
            raise UserError(f"gcp:project is not set for stack {spec.stack}")
        found = sweep(
            project,
            spec.stack,
            api=self.clients.compute(),
            storage=self.clients.storage(project),
            registry=self.clients.artifact_registry() if spec.build else None,
            region=spec.region,
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

    def candidate_checks(self, spec: ClusterSpec) -> dict[Candidate, Check] | None:
        """`plan` on a `gpus` stack checks its candidates against the Compute API when there is
        a project and somewhere to ask (credentials, or GPUTRAIN_COMPUTE_ENDPOINT)."""
        if not spec.candidates or not spec.project or not self.clients.compute_reachable():
            return None
        from scripts.targets.gce.preflight import check_candidates

        return check_candidates(spec, self.clients.compute())

    # ---- creating and destroying: StackTarget's skeleton, these hooks

    def spec_for(self, opts: RunOptions) -> ClusterSpec:
        spec = self.spec()
        if spec.capacity_ladder:  # every `up` starts at the top of the capacity list
            spec = self._use_capacity(spec.capacity_ladder[0])
        recoveries_allowed(opts, spec)  # a bad --max-recoveries is refused before anything
        self._wait_s = self._wait_for_capacity(opts, spec)
        return spec

    def prepare(self, spec: ClusterSpec, opts: RunOptions) -> Provision:
        """Preflight the zones (or rank the `gpus` candidates that pass), read a reservation's
        mode; `create` walks them, waiting out stock-outs and stepping down a capacity list."""
        where = self._where(spec, skip=opts.skip_preflight)
        if spec.capacity == "reservation":  # read anew on every `up`: the reservation may differ
            from scripts.targets.gce.preflight import pin_reservation_bound

            zone = spec.zones[0] if spec.candidates else where[0]
            spec = pin_reservation_bound(spec, self.runner, self.clients.compute(), zone)
        return lambda: self._capacity_wait("nothing is billing").run(
            lambda: self._create(spec, where, opts), ui.say
        )

    _wait_s = 0  # --wait-for-capacity / waitForCapacity of this command

    @staticmethod
    def _wait_for_capacity(opts: RunOptions, spec: ClusterSpec) -> int:
        given = opts.wait_for_capacity_s
        return spec.wait_for_capacity_s if given is None else given

    def _capacity_wait(self, billing: str) -> CapacityWait:
        from scripts.targets.gce.capacity_wait import CapacityWait

        first, longest = self.clients.capacity_pause_s
        return CapacityWait(self._wait_s, first, longest, billing_note=billing)

    def _where(self, spec: ClusterSpec, *, skip: bool) -> list[Any]:
        """The ranked candidates (a `gpus` stack) or zones that pass preflight, in order."""
        if spec.candidates:
            return list(self._passing_candidates(spec, skip=skip))
        from scripts.targets.gce.preflight import preflight_zones

        return list(spec.zones) if skip else preflight_zones(spec, self.clients.compute())

    def _spec_for_capacity(self, capacity: str) -> ClusterSpec:
        """The spec with `capacityInUse` set (a rung of the capacity list)."""
        from infra.spec import parse_spec
        from infra.stackfile import NS

        return parse_spec(self.stack_file.config | {NS + "capacityInUse": capacity}, self.stack)

    def _use_capacity(self, capacity: str) -> ClusterSpec:
        """Write `capacityInUse` for the program; this command's stack file and spec say it too
        (so a `gpus` candidate is pinned in this mode)."""
        from infra.stackfile import NS

        self.runner.set_config(NS + "capacityInUse", capacity)
        config = self.stack_file.config | {NS + "capacityInUse": capacity}
        self._stack_file = dataclasses.replace(self.stack_file, config=config)
        self._spec = self._spec_for_capacity(capacity)
        return self._spec

    def _create(
        self, spec: ClusterSpec, where: list[Any], opts: RunOptions
    ) -> tuple[ClusterSpec, dict[str, Any]]:
        """One round of `pulumi up` with failover; with a capacity list, mode after mode."""
        if not spec.capacity_ladder:
            return self._create_in(spec, where, opts)
        from scripts.targets.gce.capacity_wait import down_the_ladder

        places: dict[str, list[Any]] = {spec.capacity: where}

        def rung(mode: str) -> tuple[ClusterSpec, dict[str, Any]]:
            s = self._use_capacity(mode)
            if mode not in places:
                places[mode] = self._where(s, skip=opts.skip_preflight)
            return self._create_in(s, places[mode], opts)

        return down_the_ladder(
            spec.capacity_ladder,
            rung,
            ui.say,
            lambda m: self._spec_for_capacity(m).hourly_price,
        )

    def _create_in(
        self, spec: ClusterSpec, where: list[Any], opts: RunOptions
    ) -> tuple[ClusterSpec, dict[str, Any]]:
        if spec.candidates:
            return self._provision_candidates(spec, where, opts.max_candidates)
        return spec, self._provision(spec, where)

    @contextmanager
    def create(
        self, spec: ClusterSpec, prepared: Provision, opts: RunOptions
    ) -> Iterator[FleetSession]:
        from scripts.targets.gce.keys import private_key_file

        spec, outputs = prepared()
        with (
            private_key_file(self.runner, self.stack) as key,
            self._session(
                spec,
                outputs,
                key,
                recoveries_allowed(opts, spec),
                keep=opts.keep,
                connect_deadline_s=opts.wait_s or self.settings.connect_deadline_s,
                opts=opts,
            ) as cluster,
        ):
            yield cluster

    def kept_message(self, spec: ClusterSpec) -> str:
        return (
            f"stack {self.stack} stays up; its VMs delete themselves after "
            f"{spec.max_run_duration}; `gputrain down --stack {self.stack}` ends it sooner"
        )

    def after_destroy(self, spec: ClusterSpec) -> None:
        """The failover's picks are cleared: the next `up` ranks anew."""
        from scripts.targets.gce.failover import ZONE_CONFIG_KEY
        from scripts.targets.gce.offer_failover import CANDIDATE_CONFIG_KEY

        for key in (ZONE_CONFIG_KEY, CANDIDATE_CONFIG_KEY):
            try:
                self.runner.remove_config(key)
            except Exception as exc:
                ui.warn(f"could not clear {key}: {exc}")

    @contextmanager
    def attached(self, opts: RunOptions) -> Iterator[FleetSession]:
        from scripts.targets.gce.keys import private_key_file

        spec = self.spec()  # a broken stack file is still a one-line error
        if opts.budget is not None:  # `train --budget`: the stack's own was checked at `up`
            check_spending_caps(spec, opts)
        max_recoveries = recoveries_allowed(opts, spec)
        self._wait_s = self._wait_for_capacity(opts, spec)
        outputs = self.runner.outputs()
        if not outputs.get(Key.NODES):
            raise UserError(
                f"stack {self.stack} has no cluster; run `gputrain up --stack {self.stack}`"
            )
        with (
            private_key_file(self.runner, self.stack) as key,
            self._session(
                spec,
                outputs,
                key,
                max_recoveries,
                keep=True,
                connect_deadline_s=opts.wait_s,
                opts=opts,
            ) as session,
        ):
            yield session

    def _session(
        self,
        spec: ClusterSpec,
        outputs: dict[str, Any],
        key: Path,
        max_recoveries: int,
        *,
        keep: bool,
        connect_deadline_s: float | None,
        opts: RunOptions,
    ) -> RecoveringSession:
        """The stack's fleet, pinned; it re-creates preempted VMs through this target."""
        from infra.outputs import parse_stack_outputs
        from scripts.targets.gce.autodown import stack_autodown
        from scripts.targets.gce.recovery import RecoveringSession, StackNodes
        from scripts.verify.fabric import FabricCheck

        def recreate(zone: str) -> tuple[Fleet, StackOutputs]:
            out = parse_stack_outputs(self._recreate(spec, zone))
            return self._fleet(out, key), out

        out = parse_stack_outputs(outputs)
        nodes = StackNodes(
            self.clients.compute(),
            out,
            spot=spec.spot,
            ttl_s=spec.max_run_duration_s,
            recreate=recreate,
            bucket=out.bucket.uri if out.bucket else None,
        )
        return RecoveringSession(
            self._fleet(out, key),
            self.settings,
            nodes,
            max_recoveries=max_recoveries,
            hourly_usd=spec.hourly_price,
            keep=keep,
            confirm_s=self.clients.preemption_confirm_s,
            connect_deadline_s=connect_deadline_s,
            fabric=FabricCheck.of(spec.fabric),
            stall_timeout_s=spec.stall_timeout_s,
            autodown=stack_autodown(
                spec, out, out.bucket.uri if out.bucket else None, opts, self.clients
            ),
        )

    def _provision(self, spec: ClusterSpec, zones: list[str]) -> dict[str, Any]:
        """`pulumi up` with zone failover; the stack outputs."""
        from scripts.targets.gce.failover import provision_with_failover

        if spec.capacity == "flex-start":
            from infra.capacity import FLEX_START_NO_QUEUE

            ui.say(f"up: {FLEX_START_NO_QUEUE} (--wait-for-capacity retries it)")
        zone, outputs = provision_with_failover(
            self.runner,
            zones,
            on_event=ui.say,
            on_output=pulumi_line,
            expected_nodes=spec.nodes,
            project=spec.project,
        )
        ui.say(f"up: cluster ready in {zone}")
        return outputs

    def _passing_candidates(self, spec: ClusterSpec, *, skip: bool) -> list[Candidate]:
        """The ranked candidates that pass preflight (all of them with --skip-preflight), after
        printing the candidate table; a one-line error when none passes."""
        if skip:
            return list(spec.candidates)
        from infra.offer_tables import candidate_table
        from scripts.targets.gce.preflight import check_candidates

        checks = check_candidates(spec, self.clients.compute())
        shown = candidate_table(spec.candidates, spec.max_run_duration_s, checks)
        ui.table(f"candidates for gpus = {spec.gpus_request}", shown.headers, shown.rows)
        passing = [c for c in spec.candidates if c in checks and checks[c].ok]
        if not passing:
            raise GputrainError(
                f"preflight failed for every candidate checked ({len(checks)}; see the reasons "
                "above); nothing was created"
            )
        return passing

    def _provision_candidates(
        self, spec: ClusterSpec, ranked: list[Candidate], max_candidates: int
    ) -> tuple[ClusterSpec, dict[str, Any]]:
        """`pulumi up` down the ranked candidates; the spec of the one created, its outputs."""
        from scripts.targets.gce.failover import ProvisioningError
        from scripts.targets.gce.offer_failover import (
            ATTEMPT_HEADERS,
            attempt_rows,
            provision_candidates,
        )

        try:
            chosen, outputs, attempts = provision_candidates(
                self.runner,
                ranked,
                max_candidates=max_candidates,
                on_event=ui.say,
                on_output=pulumi_line,
            )
        except ProvisioningError as e:
            ui.table("up: attempts", ATTEMPT_HEADERS, attempt_rows(e.attempts))
            raise
        if len(attempts) > 1:
            ui.table("up: attempts", ATTEMPT_HEADERS, attempt_rows(attempts))
        ui.say(f"up: cluster ready: {chosen.nodes} x {chosen.machine_type} in {chosen.zone}")
        return self.spec_at(chosen), outputs

    def _recreate(self, spec: ClusterSpec, zone: str) -> dict[str, Any]:
        """After a preemption: `refresh` (the preempted VMs are gone), then `up` in the cluster's
        zone first, then the rest of the failover order, never destroying what survived; all
        stocked out: wait for capacity as `up` does."""
        self.runner.refresh(on_output=None)
        return self._capacity_wait("the surviving VM(s) stay up and bill").run(
            lambda: self._recreate_once(spec, zone), ui.say
        )

    def _recreate_once(self, spec: ClusterSpec, zone: str) -> dict[str, Any]:
        from scripts.targets.gce.failover import provision_with_failover

        if spec.candidates:  # same shape (the run's GPUs per node and nodes): its zone first
            from scripts.targets.gce.offer_failover import provision_candidates

            same = [
                c
                for c in spec.candidates
                if (c.machine_type, c.nodes) == (spec.machine_type, spec.nodes)
            ]
            order = sorted(same, key=lambda c: c.zone != zone)  # stable: then the ranked order
            _, outputs, _ = provision_candidates(
                self.runner,
                order,
                max_candidates=len(order),
                on_event=ui.say,
                on_output=pulumi_line,
                destroy_failed=False,
            )
            return outputs
        _, outputs = provision_with_failover(
            self.runner,
            [zone, *(z for z in spec.zones if z != zone)],
            on_event=ui.say,
            on_output=pulumi_line,
            expected_nodes=spec.nodes,
            project=spec.project,
            destroy_failed=False,
        )
        return outputs

    def _fleet(self, out: StackOutputs, key_file: Path) -> Fleet:
        """Nodes from the stack outputs, each pinned to the host keys its guest agent published."""
        from infra.gcp.compute import fetch_host_keys

        keys = {
            n.name: fetch_host_keys(
                out.project,
                n.zone,
                n.name,
                deadline_s=self.clients.hostkey_deadline_s,
                api=self.clients.compute(),
                on_progress=ui.say,
            )
            for n in out.nodes
        }
        fleet = out.to_fleet(
            self.name, keys, identity_file=key_file, python=self.clients.node_python
        )
        return dataclasses.replace(fleet, install_trainer=True)  # our VMs: the image may lack torch


def recoveries_allowed(opts: RunOptions, spec: ClusterSpec) -> int:
    """--max-recoveries, by default 3 on any capacity: spot VMs are preempted, and host errors and
    maintenance terminate on-demand and reserved VMs too (recovered the same way)."""
    n = opts.max_recoveries
    if n is None:
        return 3
    if not 0 <= n <= 100:
        raise UserError(f"--max-recoveries {n}: allowed 0..100")
    return n


def ttl_left_s(last_start: str | None, max_run_duration_s: int | None, now: float) -> float | None:
    """Seconds until GCE deletes the VM: the TTL counts from the latest start. Pure."""
    if not last_start or not max_run_duration_s:
        return None
    import datetime

    started = datetime.datetime.fromisoformat(last_start.replace("Z", "+00:00")).timestamp()
    return max(0.0, started + max_run_duration_s - now)
