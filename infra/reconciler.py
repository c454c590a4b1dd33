"""Recovery with the laptop closed, as the stack declares it: `recover` (auto, always, never) and
`reconcileEvery` (how often Cloud Scheduler starts the stack's Cloud Run job that runs
`gputrain reconcile`), whether a stack gets that job, its schedule and what it costs. Pure.
"""

from __future__ import annotations

from infra.fields import format_duration, parse_duration
from infra.stackfile import SpecError

RECOVER = ("auto", "always", "never")
DEFAULT_EVERY = "2m"
MIN_EVERY_S = 60  # Cloud Scheduler's unix-cron has a granularity of one minute
EVERY_ALLOWED = "allowed: 1m to 59m in whole minutes, or whole hours up to 24h, like 2m, 5m, 1h"
#: Cloud Run jobs, Tier 1 regions, instance-based: $0.00001800 per vCPU-second and $0.00000200
#: per GiB-second beyond the free tier (cloud.google.com/run/pricing, as of 2026-11).
VCPU_SECOND_USD = 0.000018
GIB_SECOND_USD = 0.000002
JOB_CPU, JOB_MEMORY_GIB = 1.0, 0.5  # the job's limits: 1 vCPU, 512 MiB
#: The job's execution is billed from container start to exit, rounded up to 100 ms: an idle
#: pass (0.6 s with the interpreter's start, bench/laptop_closed.py on the test bed) plus an
#: allowance for the container's start on Cloud Run (not measured here).
IDLE_PASS_S = 5.0


def job_name(stack: str) -> str:
    """The stack's Cloud Run job (and its Scheduler job)."""
    return f"{stack}-reconcile"


def run_uri(project: str, region: str, job: str) -> str:
    """Cloud Run Admin API v2 `jobs.run`: what the Scheduler job POSTs to."""
    return f"https://run.googleapis.com/v2/projects/{project}/locations/{region}/jobs/{job}:run"


def parse_recover(text: str, setting: str = "gputrain:recover") -> str:
    value = text.strip().lower() or "never"
    if value not in RECOVER:
        raise SpecError(
            f"{setting} {text!r}: allowed: auto (when the VMs can be preempted: spot or "
            "flex-start), always, never"
        )
    return value


def parse_every(text: str, setting: str = "gputrain:reconcileEvery") -> int:
    """Seconds between passes: whole minutes, at least one."""
    try:
        seconds = parse_duration(text.strip() or DEFAULT_EVERY)
    except ValueError:
        raise SpecError(f"{setting} {text!r}: {EVERY_ALLOWED}") from None
    if seconds < MIN_EVERY_S:
        raise SpecError(f"{setting} {text!r}: below 1m; {EVERY_ALLOWED}")
    minutes = seconds // 60
    if seconds % 60 or (minutes >= 60 and (minutes % 60 or minutes > 1440)):
        raise SpecError(f"{setting} {text!r}: not a cron step; {EVERY_ALLOWED}")
    return seconds


def wanted(recover: str, capacity: str) -> bool:
    """Whether the stack declares the reconciler: `auto` only where GCE may take VMs away by
    design (spot, flex-start); host errors on other capacity are the laptop's to recover."""
    if recover == "never":
        return False
    return recover == "always" or capacity in ("spot", "flex-start")


def schedule(every_s: int) -> str:
    """Cloud Scheduler's unix-cron for every N minutes (hours when N is a multiple of 60)."""
    minutes = every_s // 60
    if minutes < 60:
        return f"*/{minutes} * * * *"
    hours = minutes // 60
    return "0 0 * * *" if hours >= 24 else f"0 */{hours} * * *"


def idle_cost_per_day(every_s: int, pass_s: float = IDLE_PASS_S) -> float:
    """USD a day of passes with nothing to do (list price, before the free tier)."""
    per_second = JOB_CPU * VCPU_SECOND_USD + JOB_MEMORY_GIB * GIB_SECOND_USD
    return 86400 / every_s * pass_s * per_second


def plan_line(recover: str, capacity: str, every_s: int) -> str:
    """What `plan` says about it."""
    if not wanted(recover, capacity):
        why = "recover: never" if recover == "never" else f"{capacity} VMs are not preempted"
        return f"laptop-closed recovery: off ({why}; `recover: always` turns it on)"
    return (
        f"laptop-closed recovery: a Cloud Run job runs `gputrain reconcile` every "
        f"{format_duration(every_s)} (Cloud Scheduler); idle about "
        f"${idle_cost_per_day(every_s):.3f}/day at list price, before Cloud Run's free tier"
    )
