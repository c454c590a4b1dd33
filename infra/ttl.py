"""A VM's server-side lifetime (`scheduling.maxRunDuration`, instanceTerminationAction DELETE):
how much of it is left, and the shorter one a VM a recovery re-creates gets (with the image the
cluster runs: Recreation). Pure.

Compute's "Limit the run time of a VM" (2026): a time limit is 30 s to 120 days; the VM's
terminationTimestamp is set when it enters RUNNING (the duration counts from its latest start).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.schema import SpecError

if TYPE_CHECKING:
    from infra.outputs import StackOutputs

#: A recovery's `up` (scripts/targets/gce/target.py `recreate`) tells the program, in the
#: pulumi process's environment, the run's deadline (Unix seconds: its TTL counted from its
#: launch), the zone its surviving VMs stand in and the boot image they run (its self link).
RECREATE_DEADLINE_ENV = "GPUTRAIN_RECREATE_DEADLINE"
RECREATE_ZONE_ENV = "GPUTRAIN_RECREATE_ZONE"
RECREATE_IMAGE_ENV = "GPUTRAIN_RECREATE_IMAGE"
GCE_MIN_RUN_S = 30  # the shortest time limit GCE takes


@dataclass(frozen=True)
class Recreation:
    """A recovery's `up`: a VM it creates lives only to the run's `deadline`, never a fresh
    maxRunDuration, and the VMs standing in `zone` keep theirs (infra/components/nodes.py);
    every VM boots `image`, the one the cluster runs, not the family's newer one (which would
    replace the survivors). None: a stack whose outputs do not record it (the family's)."""

    deadline: float
    zone: str
    image: str | None = None

    @classmethod
    def of(cls, cluster: StackOutputs, deadline: float) -> Recreation:
        """The re-creation of `cluster`'s lost VMs: its zone first, its image."""
        return cls(deadline, cluster.zone, cluster.image_self_link)

    def env(self) -> dict[str, str]:
        env = {RECREATE_DEADLINE_ENV: repr(self.deadline), RECREATE_ZONE_ENV: self.zone}
        return env | ({RECREATE_IMAGE_ENV: self.image} if self.image else {})

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Recreation | None:
        """What `env` wrote, in the program; None for any other `up`."""
        raw = environ.get(RECREATE_DEADLINE_ENV)
        if raw is None:
            return None
        try:
            deadline = float(raw)
        except ValueError:
            raise SpecError(
                f"{RECREATE_DEADLINE_ENV} = {raw!r}: allowed: Unix seconds (a recovery sets it)"
            ) from None
        zone, image = environ.get(RECREATE_ZONE_ENV, ""), environ.get(RECREATE_IMAGE_ENV)
        return cls(deadline, zone, image or None)

    def max_run_duration_s(self, now: float) -> int:
        """What is left to the deadline, in whole seconds, at least GCE's minimum."""
        return max(GCE_MIN_RUN_S, int(self.deadline - now))


def ttl_left_s(last_start: str | None, max_run_duration_s: int | None, now: float) -> float | None:
    """Seconds until GCE deletes the VM: the TTL counts from the latest start."""
    if not last_start or not max_run_duration_s:
        return None
    started = datetime.datetime.fromisoformat(last_start.replace("Z", "+00:00")).timestamp()
    return max(0.0, started + max_run_duration_s - now)
