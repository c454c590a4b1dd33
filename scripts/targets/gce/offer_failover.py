"""`up` on a `gpus` stack: walk the ranked candidates (another zone, region or machine type) until
one is created. A stockout blocks that machine type in that zone, a regional quota error the
region, a project-wide one (GPUS_ALL_REGIONS) or any other error ends the search. Each attempt that
fails is destroyed before the next (a VM can exist, and bill, despite an error).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from infra.catalog import GLOBAL_GPU_QUOTA_METRIC
from infra.offers import Candidate
from infra.placement import candidate_label
from infra.stackfile import qualify
from scripts.targets.gce.failover import (
    ZONE_CONFIG_KEY,
    Attempt,
    ProvisioningError,
    ProvisioningFailure,
    classify_provisioning_error,
    destroy_attempt,
)
from scripts.targets.stack.clients import OnOutput, StackError, StackRunner

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
        return (str(n), candidate_label(c), c.zone, self.outcome, self.detail)


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
) -> tuple[Candidate, dict[str, Any], list[Attempt]]:
    """Sets `gputrain:candidate` + `gputrain:zone` and runs `up`, down the ranked list, at most
    `max_candidates` attempts. Returns (the candidate created, outputs, every attempt). Raises
    ProvisioningError (its `attempts` are CandidateAttempts) when none could be created. A
    recovery passes `destroy_failed=False` (what survived stays; its teardown destroys the rest)."""
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
        try:
            outputs = runner.up(on_output)
        except StackError as e:
            failure = classify_provisioning_error(e.raw)
            outcome: str = failure.kind
        else:
            if len(outputs.get("nodes") or []) >= c.nodes:
                attempts.append(CandidateAttempt.of(c, "created", ""))
                return c, outputs, attempts
            made = len(outputs.get("nodes") or [])
            failure = ProvisioningFailure(
                "stockout", (), None, None, f"partial cluster: {made} of {c.nodes} nodes created"
            )
            outcome = "partial"
        attempts.append(CandidateAttempt.of(c, outcome, failure.summary))
        if destroy_failed:
            destroy_attempt(runner, c.zone, attempts, failure, say, on_output)
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
    report = _report(attempts, failure, len(candidates), max_candidates, destroyed=destroy_failed)
    raise ProvisioningError(report, attempts, failure)


def attempt_rows(attempts: Sequence[Attempt]) -> list[tuple[str, ...]]:
    """Rows under ATTEMPT_HEADERS (an attempt of the zone failover has no candidate)."""
    return [
        a.row(n) if isinstance(a, CandidateAttempt) else (str(n), "", a.zone, a.outcome, a.detail)
        for n, a in enumerate(attempts, 1)
    ]


def _report(
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
