"""Partial creates: an `up` that fails after making some of the cluster's VMs (the next one
stocked out) billed those VMs until its destroy. Here: which VMs an `up` made and for how long
(Pulumi's progress lines), what partial creates billed over a wait for capacity's rounds (the one
that made the cluster too: its attempts before the one that did), each VM's rate, and, with a
budget, how much of it a wait may spend beside the run's worst case; and when the cluster `up`
made began to bill (the Compute API's creation times).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from infra.base.errors import GputrainError
from infra.keys import format_duration

if TYPE_CHECKING:
    from infra.gcp.compute import ComputeApi
    from infra.offers import Candidate
    from infra.spec import ClusterSpec
    from scripts.targets.stack.clients import OnOutput

#: Pulumi's progress line for a VM it made: ` +  gcp:compute:Instance dev-node-0 created (38s)`
VM_CREATED = re.compile(r"\bgcp:compute:Instance\s+(\S+)\s+created\b")


class Made(Protocol):
    """An attempt of `up` (provision.Attempt) as far as its partial create goes: the VMs it
    made before it failed, their seconds together until the destroy (or until now, when they
    were left up for the next try)."""

    @property
    def zone(self) -> str: ...
    @property
    def vms(self) -> int: ...
    @property
    def vm_s(self) -> float: ...
    @property
    def left_up(self) -> bool: ...


A = TypeVar("A", bound=Made)


class MadeVMs:
    """The VMs one `up` reports made (Pulumi's progress lines, passed on to `on_output`), each
    with when: what a failed attempt billed before its destroy. `failed`: where the attempt as
    billed also goes (a capacity wait's count of its round, which a later attempt may win)."""

    def __init__(
        self,
        on_output: OnOutput | None,
        clock: Callable[[], float],
        failed: list[Any] | None = None,
    ) -> None:
        self.on_output, self.clock, self.failed = on_output, clock, failed
        self.at: dict[str, float] = {}

    def __call__(self, line: str) -> None:
        found = VM_CREATED.search(line)
        if found:
            self.at.setdefault(found.group(1), self.clock())
        if self.on_output is not None:
            self.on_output(line)

    def billed(self, attempt: A, *, left_up: bool) -> A:
        """`attempt` with the VMs made, their names and their seconds until now (their destroy,
        if any), a minute at least each, as Compute Engine charges a VM (the ledger's
        GCE_MINIMUM_S)."""
        from scripts.cost.ledger import GCE_MINIMUM_S

        now = self.clock()
        seconds = sum(max(GCE_MINIMUM_S, now - t) for t in self.at.values())
        changes: dict[str, Any] = {"vms": len(self.at), "vm_s": seconds, "left_up": left_up}
        changes["made"] = tuple(self.at)
        billed = dataclasses.replace(attempt, **changes)  # type: ignore[type-var]
        if self.failed is not None:
            self.failed.append(billed)
        return billed


@dataclass(frozen=True)
class SpendRoom:
    """With a budget: what a wait's partial creates may spend, the budget less the run's worst
    case (its rate x maxRunDuration, which the plan checked fits), so the run and the VMs made
    while waiting for it stay within the budget together."""

    usd: float
    budget: str  # the setting and its amount, e.g. "--budget 20"
    worst_usd: float


@dataclass
class PartialSpend:
    """What one wait's partial creates made and billed, round after round (the one that created
    the cluster too: its attempts before the one that did)."""

    vms: int = 0
    vm_s: float = 0.0
    usd: float | None = 0.0  # None: a VM's rate is unknown (or none was given)
    dearest_round_usd: float = 0.0

    def add(self, attempts: Sequence[Made], rate: Callable[[Any], float | None]) -> str:
        """Count a round's partial creates; what they billed, as part of the round's line."""
        made = [a for a in attempts if a.vms]
        if not made:
            return ""
        rates = [rate(a) for a in made]
        round_usd = sum(a.vm_s / 3600 * r for a, r in zip(made, rates, strict=True) if r)
        self.usd = None if self.usd is None or None in rates else self.usd + round_usd
        self.dearest_round_usd = max(self.dearest_round_usd, round_usd)
        self.vms += sum(a.vms for a in made)
        self.vm_s += sum(a.vm_s for a in made)
        each = ", ".join(
            f"{a.vms} VM{'s' if a.vms > 1 else ''} in {a.zone} for {format_duration(int(a.vm_s))}"
            for a in made
        )
        after = "left up for the next try" if any(a.left_up for a in made) else "then destroyed"
        return f"; its partial creates made and billed {each}, {after} ({self.total})"

    @property
    def amount(self) -> str:
        usd = f", about ${self.usd:.2f}" if self.usd is not None else ""
        return f"{self.vms} VM(s), {format_duration(int(self.vm_s))}{usd}"

    @property
    def total(self) -> str:
        return f"this wait so far: {self.amount}"


def vm_rate(spec: ClusterSpec) -> Callable[[Any], float | None]:
    """USD per hour of one VM an attempt made, as the caps count it (with its disks): a `gpus`
    candidate's own, else the stack's dearest capacity rung per node. Pure."""
    from scripts.run_plan import candidate_hourly, worst_hourly

    cluster = worst_hourly(spec)

    def rate(attempt: Any) -> float | None:
        candidate: Candidate | None = getattr(attempt, "candidate", None)
        if candidate is not None:
            total = candidate_hourly(spec, candidate)
            return None if total is None else total / candidate.nodes
        return None if cluster is None else cluster / spec.nodes

    return rate


def spend_room(
    spec: ClusterSpec,
    config: dict[str, str],
    given_budget: float | None,
    where: Sequence[Any],
) -> SpendRoom | None:
    """With a budget (--budget, else the stack's): the budget less the dearest worst case `up`
    may create (of the candidates in `where`, else the stack's); None without a budget."""
    from infra.billing import usd_text
    from infra.stackfile import NS
    from scripts.run_plan import worst_hourly
    from scripts.targets.stack.target import pin

    budget = given_budget if given_budget is not None else spec.budget
    if budget is None:
        return None
    setting = "--budget" if given_budget is not None else f"{NS}budget"
    shapes = [pin(spec, config, candidate=c) for c in where] if spec.candidates else [spec]
    rates = [worst_hourly(s) for s in shapes] or [worst_hourly(spec)]
    known = [r for r in rates if r is not None]
    # a price unknown: no room (the caps refused such a cluster before any wait)
    worst = max(known) * spec.max_run_duration_s / 3600 if len(known) == len(rates) else budget
    return SpendRoom(max(0.0, budget - worst), f"{setting} {usd_text(budget)}", worst)


def cluster_created(
    api: ComputeApi, outputs: dict[str, Any], stack: str, since: float
) -> float | None:
    """When the cluster `up` made began to bill: its first VM's creation (the Compute API's
    `creationTimestamp`; its disks bill from then, its vCPUs and GPUs from its start, moments
    later), never before `since`, when that `up` began (a VM that stood before it counts from
    there), nor after now; None, said, when the Compute API cannot tell."""
    from infra.gcp.compute import unix_time
    from infra.outputs import parse_stack_outputs
    from scripts import ui

    out = parse_stack_outputs(outputs)
    try:
        found = api.list_stack_instances(out.project, stack)
    except GputrainError as e:  # the Compute API's error, or no client: an estimate's matter
        ui.warn(f"could not read when the VMs were created ({e}): the run's cost counts from now")
        return None
    names = {n.name for n in out.nodes}
    made = [unix_time(i.get("created"), since) for i in found if i.get("name") in names]
    return min(time.time(), max(since, min(made))) if made else None
