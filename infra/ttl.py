"""A VM's server-side lifetime (`scheduling.maxRunDuration`, instanceTerminationAction DELETE):
how much of it is left. Pure.

Compute's "Limit the run time of a VM" (2026): the VM's terminationTimestamp is set when it
enters RUNNING (the duration counts from its latest start).
"""

from __future__ import annotations

import datetime


def ttl_left_s(last_start: str | None, max_run_duration_s: int | None, now: float) -> float | None:
    """Seconds until GCE deletes the VM: the TTL counts from the latest start."""
    if not last_start or not max_run_duration_s:
        return None
    started = datetime.datetime.fromisoformat(last_start.replace("Z", "+00:00")).timestamp()
    return max(0.0, started + max_run_duration_s - now)
