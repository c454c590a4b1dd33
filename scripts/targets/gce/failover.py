"""Zone failover for `up`: classify GCE provisioning errors and walk the user's zones.

Stockouts move on to the next zone (zonesAvailable hints first, when they are in the user's list);
quota errors and anything else stop. Every failed attempt is destroyed before moving on: a VM can
exist, and bill, despite an error, and a multi-node cluster is all-or-nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from infra.base.errors import GputrainError
from infra.catalog import ZONE_NAME, quota_console_url
from infra.stackfile import qualify
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
) -> tuple[str, dict[str, Any]]:
    """Sets `gputrain:zone` and runs `up`, zone after zone, until a cluster exists.

    Returns (zone, outputs). On stockout (or a cluster with fewer than `expected_nodes` nodes):
    destroy, next zone. On quota or any other error: destroy, raise ProvisioningError with every
    attempt and the fix. Zones for which `preflight_ok` is False are skipped. A recovery passes
    `destroy_failed=False`: the stack holds the run's bucket and the surviving VMs, and the next
    zone's `up` replaces the VMs anyway (a failed recovery is destroyed by the run's teardown)."""
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
        try:
            outputs = runner.up(on_output)
        except StackError as e:
            failure = classify_provisioning_error(e.raw)
            outcome: str = failure.kind
        else:
            nodes = outputs.get("nodes") or []
            if expected_nodes is None or len(nodes) >= expected_nodes:
                say(f"{zone}: cluster created")
                return zone, outputs
            failure = ProvisioningFailure(
                "stockout",
                (),
                None,
                None,
                f"partial cluster: {len(nodes)} of {expected_nodes} nodes were created",
            )
            outcome = "partial"
        attempts.append(Attempt(zone, outcome, failure.summary))
        say(f"{zone}: {outcome}: {failure.summary}")
        if destroy_failed:
            destroy_attempt(runner, zone, attempts, failure, say, on_output)
        if failure.kind != "stockout":
            break
        hint = failure.zones_available
        if hint:
            say(f"{zone}: GCE suggests {', '.join(hint)}")
    raise ProvisioningError(_report(attempts, failure, zones, tried, project), attempts, failure)


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
    lines += [f"  {a.zone}: {a.outcome}: {a.detail}" for a in attempts]
    if zones:
        lines.append(f"fix: {fix}")
    return "\n".join(lines)
