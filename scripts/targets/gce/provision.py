"""`pulumi up` of a GCE stack until a cluster exists, or a clear reason why not.

Zone failover: GCE's provisioning errors classified, the user's zones walked. Stockouts move on to
the next zone (zonesAvailable hints first, when they are in the user's list); quota errors and
anything else stop. On a `gpus` stack the ranked candidates (another zone, region or machine type)
are walked instead: a stockout blocks that machine type in that zone, a regional quota error the
region, a project-wide one (GPUS_ALL_REGIONS) or any other error ends the search. Every failed
attempt is destroyed before the next: a VM can exist, and bill, despite an error, and a multi-node
cluster is all-or-nothing.

When every zone or candidate is stocked out, `--wait-for-capacity DURATION` keeps trying with
backoff instead of giving up (nothing of a failed attempt bills while it waits; one line per wait
says what was tried, what a partial create made and billed before its destroy, and when the next
try is; with a budget the wait stops before partial creates could spend what the run may not),
and `capacity: [spot, on-demand]` steps to the next mode after one mode's stock-outs, with one
line saying why and what it costs. Ctrl-C during a wait is the guard's Interrupted, as anywhere
else: the caller's teardown runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from infra.base.errors import GputrainError
from infra.catalog import GLOBAL_GPU_QUOTA_METRIC, ZONE_NAME, quota_console_url
from infra.keys import format_duration
from infra.offers import Candidate, candidate_label
from infra.stackfile import qualify
from scripts.targets.gce.partial import MadeVMs, PartialSpend, SpendRoom
from scripts.targets.stack.clients import OnOutput, StackError, StackRunner, summarise_pulumi_error

ZONE_CONFIG_KEY = qualify("zone")  # written by the zone failover, read by the program

FailureKind = Literal["stockout", "quota", "other"]

_QUOTA_NAMED = re.compile(r"Quota '([A-Za-z0-9_:\-]+)' exceeded")
_QUOTA_REGION = re.compile(r"exceeded\.?\s+Limit: [\d.]+ in region ([a-z]+-[a-z]+\d+)")
_QUOTA_CODE = re.compile(r"QUOTA_EXCEEDED|quotaExceeded", re.IGNORECASE)
_STOCKOUT = (
    re.compile(r"ZONE_RESOURCE_POOL_EXHAUSTED"),  # also ..._WITH_DETAILS
    re.compile(r"resource_availability"),
    re.compile(r"\bSTOCKOUT\b"),
    re.compile(r"does not have enough resources", re.IGNORECASE),
    re.compile(r"VM_MIN_COUNT_NOT_REACHED"),  # bulk insert short of its minimum: partial
)
_HINT_METADATA = re.compile(r"""zonesAvailable["']?\s*[:=]\s*["']?([a-z0-9,\- ]+)""")
_HINT_SENTENCE = re.compile(r"Consider trying your request in the ([a-z0-9,\- ]+?) zone\(s\)")


@dataclass(frozen=True)
class ProvisioningFailure:
    kind: FailureKind
    zones_available: tuple[str, ...]
    quota_metric: str | None
    region: str | None  # the quota's region; None for a global quota or when not a quota
    raw: str

    @property
    def summary(self) -> str:
        return summarise_pulumi_error(self.raw)


def classify_provisioning_error(text: str) -> ProvisioningFailure:
    """Stockout / quota / other, by the codes and reasons in the text, never by HTTP status.

    Quota wins when both appear: it will not go away in another zone of the same region."""
    named = _QUOTA_NAMED.search(text)
    if named or _QUOTA_CODE.search(text):
        metric = named.group(1) if named else None
        region_m = _QUOTA_REGION.search(text)
        return ProvisioningFailure(
            "quota", (), metric, region_m.group(1) if region_m else None, text
        )
    if any(p.search(text) for p in _STOCKOUT):
        return ProvisioningFailure("stockout", zones_available_hint(text), None, None, text)
    return ProvisioningFailure("other", (), None, None, text)


def zones_available_hint(text: str) -> tuple[str, ...]:
    """Zones GCE suggests in a stockout: the ErrorInfo metadata or the 'Consider trying' sentence."""
    found: list[str] = []
    for pattern in (_HINT_METADATA, _HINT_SENTENCE):
        for m in pattern.finditer(text):
            for zone in (z.strip() for z in m.group(1).split(",")):
                if ZONE_NAME.match(zone) and zone not in found:
                    found.append(zone)
    return tuple(found)


def zone_order(zones: Sequence[str], tried: Iterable[str], hint: Sequence[str] = ()) -> str | None:
    """The next zone to try: the first hinted zone that is in the user's list and untried, else
    the first untried zone of the list; None when all were tried."""
    done = set(tried)
    for zone in [*hint, *zones]:
        if zone in zones and zone not in done:
            return zone
    return None


@dataclass(frozen=True)
class Attempt:
    zone: str
    outcome: str  # "stockout", "quota", "other", "skipped (preflight)", "partial"
    detail: str
    # a failed `up` may have made VMs before it failed (a partial create): they bill until the
    # destroy, or go on billing when `left_up` (a recovery keeps them for the next try)
    vms: int = field(default=0, kw_only=True)
    vm_s: float = field(default=0.0, kw_only=True)  # their seconds together, to the destroy
    left_up: bool = field(default=False, kw_only=True)
    made: tuple[str, ...] = field(default=(), kw_only=True)  # their names (a recovery keeps them)

    @property
    def billed(self) -> str:
        """The tail of the attempt's report line: "; 1 VM made, billed 3m until destroyed"."""
        if not self.vms:
            return ""
        made = f"{self.vms} VM{'s' if self.vms > 1 else ''} made"
        until = "so far, left up for the next try" if self.left_up else "until destroyed"
        return f"; {made}, billed {format_duration(int(self.vm_s))} {until}"


class ProvisioningError(GputrainError):
    """`up` failed in every zone it could try, or stopped on quota or another error."""

    def __init__(
        self, message: str, attempts: Sequence[Attempt], failure: ProvisioningFailure | None
    ):
        super().__init__(message)
        self.attempts = tuple(attempts)
        self.failure = failure


def quota_fix(
    failure: ProvisioningFailure, zones: Sequence[str], tried: Iterable[str], project: str | None
) -> str:
    """How to get past a quota stop: the metric to raise, where, and other regions in the list."""
    metric = failure.quota_metric or "the GPU quota"
    where = f"in region {failure.region}" if failure.region else "globally"
    fix = f"request more {metric} {where} at {quota_console_url(project)}"
    if failure.region:
        done = set(tried)
        elsewhere = [z for z in zones if not z.startswith(failure.region + "-") and z not in done]
        if elsewhere:
            fix += (
                f"; or put a zone of another region first in your zones list "
                f"(it already has {', '.join(elsewhere)}), whose quota is separate"
            )
    return fix


def provision_with_failover(
    runner: StackRunner,
    zones: Sequence[str],
    *,
    preflight_ok: Callable[[str], bool] | None = None,
    on_event: Callable[[str], None] | None = None,
    on_output: OnOutput | None = None,
    expected_nodes: int | None = None,
    project: str | None = None,
    destroy_failed: bool = True,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    failed: list[Attempt] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Sets `gputrain:zone` and runs `up`, zone after zone, until a cluster exists.

    Returns (zone, outputs). On stockout (or a cluster with fewer than `expected_nodes` nodes):
    destroy, next zone. On quota or any other error: destroy, raise ProvisioningError with every
    attempt and the fix. Zones for which `preflight_ok` is False are skipped. A recovery passes
    `destroy_failed=False`: the stack holds the run's bucket and the surviving VMs, and the next
    zone's `up` replaces the VMs anyway (a failed recovery is destroyed by the run's teardown);
    and `env`, which every `up` gives the program (Recreation's). Each failed attempt, with
    what its partial create billed, is also appended to `failed` (CapacityWait's)."""
    say = on_event or (lambda _m: None)
    attempts: list[Attempt] = []
    tried: list[str] = []
    hint: tuple[str, ...] = ()
    failure: ProvisioningFailure | None = None
    while (zone := zone_order(zones, tried, hint)) is not None:
        tried.append(zone)
        if preflight_ok is not None and not preflight_ok(zone):
            attempts.append(Attempt(zone, "skipped (preflight)", "preflight checks failed"))
            say(f"{zone}: skipped, its preflight checks failed")
            continue
        say(f"{zone}: creating the cluster (pulumi up)")
        runner.set_config(ZONE_CONFIG_KEY, zone)
        made = MadeVMs(on_output, clock, failed)
        outputs, failure, outcome = _up_once(runner, expected_nodes, made, env)
        if failure is None:
            say(f"{zone}: cluster created")
            return zone, outputs
        attempts.append(Attempt(zone, outcome, failure.summary))
        say(f"{zone}: {outcome}: {failure.summary}")
        if destroy_failed:
            destroy_attempt(runner, zone, attempts, failure, say, on_output)
        attempts[-1] = made.billed(attempts[-1], left_up=not destroy_failed)
        if failure.kind != "stockout":
            break
        hint = failure.zones_available
        if hint:
            say(f"{zone}: GCE suggests {', '.join(hint)}")
    raise ProvisioningError(_report(attempts, failure, zones, tried, project), attempts, failure)


def _up_once(
    runner: StackRunner,
    nodes_wanted: int | None,
    seen: MadeVMs,
    env: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], ProvisioningFailure | None, str]:
    """One `pulumi up` (`env` in its environment): (outputs, None, "created"); or ({}, the
    failure, its kind), where a cluster with fewer than `nodes_wanted` nodes is a stockout whose
    outcome is "partial". `seen` passes Pulumi's lines on and counts the VMs made."""
    try:
        outputs = runner.up(seen, env=env)
    except StackError as e:
        failure = classify_provisioning_error(e.raw)
        return {}, failure, failure.kind
    made = len(outputs.get("nodes") or [])
    if nodes_wanted is None or made >= nodes_wanted:
        return outputs, None, "created"
    summary = f"partial cluster: {made} of {nodes_wanted} nodes were created"
    return {}, ProvisioningFailure("stockout", (), None, None, summary), "partial"


def destroy_attempt(
    runner: StackRunner,
    zone: str,
    attempts: list[Attempt],
    failure: ProvisioningFailure,
    say: Callable[[str], None],
    on_output: OnOutput | None,
) -> None:
    say(f"{zone}: destroying what was created")
    try:
        runner.destroy(on_output)
    except StackError as e:
        attempts.append(Attempt(zone, "destroy failed", str(e)))
        raise ProvisioningError(
            _report(attempts, failure, (), (), None)
            + f"\nresources of the failed attempt in {zone} may still exist: run "
            f"`gputrain down --stack {runner.stack_name}`",
            attempts,
            failure,
        ) from e


def _report(
    attempts: Sequence[Attempt],
    failure: ProvisioningFailure | None,
    zones: Sequence[str],
    tried: Sequence[str],
    project: str | None,
) -> str:
    if failure is not None and failure.kind == "quota":
        head = f"quota exceeded: {failure.quota_metric or 'unknown metric'}"
        fix = quota_fix(failure, zones, tried, project)
    elif failure is not None and failure.kind == "other":
        head = "pulumi up failed (not a capacity problem, so no other zone was tried)"
        fix = "fix the error above and run again"
    elif failure is None:
        head = "every zone failed its preflight checks"
        fix = "see the preflight table for each zone's fix"
    else:
        head = "no capacity in any of your zones"
        fix = "add zones to gputrain:zones, try later, or switch between spot and on-demand"
    lines = [f"could not create the cluster: {head}"]
    lines += [f"  {a.zone}: {a.outcome}: {a.detail}{a.billed}" for a in attempts]
    if zones:
        lines.append(f"fix: {fix}")
    return "\n".join(lines)


CANDIDATE_CONFIG_KEY = qualify("candidate")  # written here, read by the program
ATTEMPT_HEADERS = ("#", "machine type x nodes", "zone", "outcome", "reason")
DEFAULT_MAX_CANDIDATES = 5


@dataclass(frozen=True)
class CandidateAttempt(Attempt):
    """One `up` of one candidate: outcome "created", "stockout", "partial", "quota", "other" or
    "destroy failed", and why."""

    candidate: Candidate

    @classmethod
    def of(cls, c: Candidate, outcome: str, detail: str) -> CandidateAttempt:
        return cls(c.zone, outcome, detail, c)

    def row(self, n: int) -> tuple[str, ...]:
        c = self.candidate
        return (str(n), candidate_label(c), c.zone, self.outcome, self.detail + self.billed)


def _ends_search(failure: ProvisioningFailure) -> bool:
    """Quota for the whole project, a quota we cannot place, or not a capacity problem."""
    if failure.kind == "quota":
        global_quota = GLOBAL_GPU_QUOTA_METRIC in (failure.quota_metric or "") or (
            GLOBAL_GPU_QUOTA_METRIC in failure.raw
        )
        return global_quota or failure.region is None
    return failure.kind == "other"


def next_candidate(
    candidates: Sequence[Candidate],
    done: set[Candidate],
    blocked: set[tuple[str, str]],
    blocked_regions: set[str],
    prefer: Sequence[tuple[str, str]] = (),
) -> Candidate | None:
    """The best untried candidate not blocked; (machine type, zone) pairs in `prefer` (GCE's
    zonesAvailable hint for the machine type that just stocked out) come first. Pure."""
    open_ = [
        c
        for c in candidates
        if c not in done
        and (c.machine_type, c.zone) not in blocked
        and c.region not in blocked_regions
    ]
    for pair in prefer:
        hinted = next((c for c in open_ if (c.machine_type, c.zone) == pair), None)
        if hinted is not None:
            return hinted
    return open_[0] if open_ else None


def provision_candidates(
    runner: StackRunner,
    candidates: Sequence[Candidate],
    *,
    max_candidates: int = DEFAULT_MAX_CANDIDATES,
    on_event: Callable[[str], None] | None = None,
    on_output: OnOutput | None = None,
    destroy_failed: bool = True,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    failed: list[Attempt] | None = None,
) -> tuple[Candidate, dict[str, Any], list[Attempt]]:
    """Sets `gputrain:candidate` + `gputrain:zone` and runs `up`, down the ranked list, at most
    `max_candidates` attempts. Returns (the candidate created, outputs, every attempt). Raises
    ProvisioningError (its `attempts` are CandidateAttempts) when none could be created. A
    recovery passes `destroy_failed=False` (what survived stays; its teardown destroys the rest)
    and `env`, which every `up` gives the program (Recreation's). `failed`: as the zones'."""
    say = on_event or (lambda _m: None)
    attempts: list[Attempt] = []
    done: set[Candidate] = set()
    blocked: set[tuple[str, str]] = set()
    blocked_regions: set[str] = set()
    prefer: list[tuple[str, str]] = []
    failure: ProvisioningFailure | None = None
    while len(attempts) < max_candidates:
        c = next_candidate(candidates, done, blocked, blocked_regions, prefer)
        if c is None:
            break
        done.add(c)
        say(f"{candidate_label(c)} in {c.zone}: creating the cluster (pulumi up)")
        runner.set_config(CANDIDATE_CONFIG_KEY, candidate_label(c))
        runner.set_config(ZONE_CONFIG_KEY, c.zone)
        made = MadeVMs(on_output, clock, failed)
        outputs, failure, outcome = _up_once(runner, c.nodes, made, env)
        if failure is None:
            attempts.append(CandidateAttempt.of(c, "created", ""))
            return c, outputs, attempts
        attempts.append(CandidateAttempt.of(c, outcome, failure.summary))
        if destroy_failed:
            destroy_attempt(runner, c.zone, attempts, failure, say, on_output)
        attempts[-1] = made.billed(attempts[-1], left_up=not destroy_failed)
        if _ends_search(failure):
            say(f"{candidate_label(c)} in {c.zone}: {outcome}: {failure.summary}; stopping")
            break
        if failure.kind == "quota" and failure.region:
            blocked_regions.add(failure.region)
            why = f"quota in {failure.region} ({failure.quota_metric or 'unknown metric'})"
        else:
            blocked.add((c.machine_type, c.zone))
            why = f"{outcome} of {c.machine_type} in {c.zone}"
        prefer = [(c.machine_type, z) for z in failure.zones_available]
        after = next_candidate(candidates, done, blocked, blocked_regions, prefer)
        if after is None or len(attempts) >= max_candidates:
            say(f"{candidate_label(c)} in {c.zone}: {why}; no candidate left to try")
        else:
            say(f"{why}: trying {candidate_label(after)} in {after.zone} next")
    report = _candidates_report(
        attempts, failure, len(candidates), max_candidates, destroyed=destroy_failed
    )
    raise ProvisioningError(report, attempts, failure)


def attempt_rows(attempts: Sequence[Attempt]) -> list[tuple[str, ...]]:
    """Rows under ATTEMPT_HEADERS (an attempt of the zone failover has no candidate)."""
    return [
        a.row(n)
        if isinstance(a, CandidateAttempt)
        else (str(n), "", a.zone, a.outcome, a.detail + a.billed)
        for n, a in enumerate(attempts, 1)
    ]


def _candidates_report(
    attempts: Sequence[Attempt],
    failure: ProvisioningFailure | None,
    total: int,
    max_candidates: int,
    *,
    destroyed: bool,
) -> str:
    tried = len({a.candidate for a in attempts if isinstance(a, CandidateAttempt)})
    if failure is not None and failure.kind == "quota" and _ends_search(failure):
        head = f"quota exceeded for the whole project: {failure.quota_metric or 'unknown metric'}"
        fix = "request more GPUS_ALL_REGIONS quota (IAM & Admin > Quotas), or ask for fewer GPUs"
    elif failure is not None and failure.kind == "other":
        head = "pulumi up failed (not a capacity problem, so no other candidate was tried)"
        fix = "fix the error above and run again"
    else:
        head = f"no capacity in the {tried} candidate(s) tried, of {total}"
        fix = (
            f"raise --max-candidates (now {max_candidates}), allow more regions or zones, try "
            "later, or switch between spot and on-demand"
            if tried < total
            else "allow more regions or zones, ask for another GPU model, or try later"
        )
    lines = [f"could not create the cluster: {head}"]
    lines += [
        f"  #{n} {r[1]} in {r[2]}: {r[3]}: {r[4]}" for n, r in enumerate(attempt_rows(attempts), 1)
    ]
    lines.append(f"fix: {fix}")
    if destroyed:
        lines.append("nothing was left running: every failed attempt was destroyed")
    return "\n".join(lines)


T = TypeVar("T")

#: The first pause after a round of stock-outs, and the longest (GCE capacity moves in minutes).
FIRST_PAUSE_S = 30.0
MAX_PAUSE_S = 600.0


def stocked_out(error: ProvisioningError) -> bool:
    """Every zone or candidate tried ran out of capacity: worth trying again later (a quota
    or any other error is not)."""
    return error.failure is not None and error.failure.kind == "stockout"


def tried_text(attempts: Sequence[Attempt]) -> str:
    """What a round tried, once each, in order: `a3-highgpu-8g x 2 in us-central1-a, ...`."""

    seen: list[str] = []
    for a in attempts:
        if a.outcome.startswith("skipped") or a.outcome == "destroy failed":
            continue
        what = (
            f"{a.candidate.machine_type} x {a.candidate.nodes} in {a.zone}"
            if isinstance(a, CandidateAttempt)
            else a.zone
        )
        if what not in seen:
            seen.append(what)
    return ", ".join(seen) or "nothing"


def _no_rate(_attempt: Attempt) -> float | None:
    return None


@dataclass
class CapacityWait:
    """How long to keep trying (0: not at all), and the backoff between rounds. A round whose
    `up` made some VMs before it failed (a partial create) billed them: its line says so, and
    with `room` (a budget) the wait stops before another such round could pass it. `spent`
    counts them all, also those of the round that created the cluster (its provisioning's
    `failed` attempts: give it this wait's `failed`)."""

    limit_s: float
    first_pause_s: float = FIRST_PAUSE_S
    max_pause_s: float = MAX_PAUSE_S
    billing_note: str = "nothing is billing"
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    vm_hourly: Callable[[Attempt], float | None] = _no_rate  # USD/h of one VM an attempt made
    room: SpendRoom | None = None
    spent: PartialSpend = field(default_factory=PartialSpend)  # what its partial creates billed
    failed: list[Attempt] = field(default_factory=list)  # the round's failed attempts so far

    def run(self, attempt: Callable[[], T], say: Callable[[str], None]) -> T:
        """`attempt()` until it succeeds; after a round of stock-outs wait and try again until
        `limit_s` is spent. Any other failure, or the last stock-out, is raised as it came
        (its message says how long it waited and what partial creates billed)."""
        start, pause, round_ = self.clock(), self.first_pause_s, 1
        spent = self.spent = PartialSpend()
        while True:
            self.failed.clear()
            try:
                created = attempt()
            except ProvisioningError as e:
                if self.limit_s <= 0 or not stocked_out(e):
                    raise
                made = spent.add(e.attempts, self.vm_hourly)
                self._hold_the_budget(e, spent, round_)
                left = start + self.limit_s - self.clock()
                if left <= 0:
                    billed = f" ({spent.total})" if spent.vms else ""
                    raise ProvisioningError(
                        f"{e}\nwaited {format_duration(int(self.limit_s))} for capacity "
                        f"(--wait-for-capacity) over {round_} round(s); still none{billed}",
                        e.attempts,
                        e.failure,
                    ) from e
                delay = min(pause, left)
                next_at = time.strftime("%H:%M:%S", time.localtime(self.clock() + delay))
                say(
                    f"no capacity (round {round_}: {tried_text(e.attempts)} stocked out{made}); "
                    f"next try at {next_at} (in {delay:.0f} s), waiting up to "
                    f"{format_duration(max(1, int(left)))} more; {self.billing_note}; "
                    "Ctrl-C stops"
                )
                self.sleep(delay)
                pause, round_ = min(pause * 2, self.max_pause_s), round_ + 1
            else:
                if spent.add(self.failed, self.vm_hourly):
                    say(f"partial creates before the cluster was created billed {spent.amount}")
                return created

    def _hold_the_budget(self, e: ProvisioningError, spent: PartialSpend, round_: int) -> None:
        """With a budget, stop once another round like the dearest so far could take what
        the partial creates billed past the budget's room beside the run's worst case."""
        room = self.room
        if room is None or not spent.vms:
            return
        if spent.usd is not None and spent.usd + spent.dearest_round_usd <= room.usd:
            return
        why = (
            "their price is unknown"
            if spent.usd is None
            else f"another round like the dearest so far (${spent.dearest_round_usd:.2f}) could "
            f"pass {room.budget}, which leaves ${room.usd:.2f} beside the run's worst case "
            f"${room.worst_usd:.2f}"
        )
        raise ProvisioningError(
            f"{e}\nstopped waiting for capacity after {round_} round(s): its partial creates "
            f"billed ({spent.total}), and {why}",
            e.attempts,
            e.failure,
        ) from e


def step_line(mode: str, next_mode: str, costs: Callable[[str], float | None]) -> str:
    """The one line of a step down the capacity list: why, and what the next mode costs."""
    from infra.offer_tables import money

    before, after = costs(mode), costs(next_mode)
    change = ""
    if before and after:
        change = f" ({(after / before - 1) * 100:+.0f} % per hour)"
    return (
        f"no {mode} capacity anywhere tried: trying {next_mode} next, "
        f"{money(after)}/h instead of {money(before)}/h{change}"
    )


def down_the_ladder(
    ladder: Sequence[str],
    attempt: Callable[[str], T],
    say: Callable[[str], None],
    costs: Callable[[str], float | None],
) -> T:
    """`attempt(mode)` for each mode of the capacity list in order, stepping on only after a
    mode's stock-outs; the last mode's failure (its attempts include every mode's) is raised."""
    attempts: list[Attempt] = []
    for i, mode in enumerate(ladder):
        try:
            return attempt(mode)
        except ProvisioningError as e:
            attempts += e.attempts
            if not stocked_out(e) or i + 1 == len(ladder):
                raise ProvisioningError(str(e), attempts, e.failure) from e
            say(step_line(mode, ladder[i + 1], costs))
    raise AssertionError("an empty capacity list")  # parse_spec never makes one
