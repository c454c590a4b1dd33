"""A VM's server-side lifetime (`scheduling.maxRunDuration`, instanceTerminationAction DELETE):
how much of it is left, and the shorter one a VM a recovery re-creates gets (with the image the
cluster runs: Recreation). Pure.

Compute's "Limit the run time of a VM" (2026): a time limit is 30 s to 120 days; the VM's
terminationTimestamp is set when it enters RUNNING (the duration counts from its latest start).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.schema import SpecError

if TYPE_CHECKING:
    from infra.outputs import StackOutputs

#: A recovery's `up` (scripts/targets/gce/target.py `recreate`) tells the program, in the
#: pulumi process's environment, the run's deadline (Unix seconds: its TTL counted from its
#: launch), the zone its surviving VMs stand in, the boot image they run (its self link) and
#: the names of the VMs that stand there untouched (comma-separated).
RECREATE_DEADLINE_ENV = "GPUTRAIN_RECREATE_DEADLINE"
RECREATE_ZONE_ENV = "GPUTRAIN_RECREATE_ZONE"
RECREATE_IMAGE_ENV = "GPUTRAIN_RECREATE_IMAGE"
RECREATE_KEEP_ENV = "GPUTRAIN_RECREATE_KEEP"
GCE_MIN_RUN_S = 30  # the shortest time limit GCE takes


@dataclass(frozen=True)
class Recreation:
    """A recovery's `up`: a VM it creates or replaces lives only to the run's `deadline`, never
    a fresh maxRunDuration, and the VMs `keep` names, which stand untouched in `zone`, keep
    theirs (infra/components/nodes.py): a replacement would take a kept value from the state
    (pulumi/pulumi#2657), so only VMs that no `up` moved are named. Every VM boots `image`, the
    one the cluster runs, not the family's newer one (which would replace the survivors).
    None: a stack whose outputs do not record it (the family's)."""

    deadline: float
    zone: str
    image: str | None = None
    keep: tuple[str, ...] = ()

    @classmethod
    def of(cls, cluster: StackOutputs, deadline: float, lost: Collection[str]) -> Recreation:
        """The re-creation of `cluster`'s `lost` VMs: its zone first, its image; the others
        stand untouched there."""
        keep = tuple(n.name for n in cluster.nodes if n.name not in lost and n.zone == cluster.zone)
        return cls(deadline, cluster.zone, cluster.image_self_link, keep)

    def env(self) -> dict[str, str]:
        env = {RECREATE_DEADLINE_ENV: repr(self.deadline), RECREATE_ZONE_ENV: self.zone}
        env[RECREATE_KEEP_ENV] = ",".join(self.keep)
        return env | ({RECREATE_IMAGE_ENV: self.image} if self.image else {})

    def keeps(self, name: str, zone: str) -> bool:
        """VM `name`, declared in `zone`, keeps the maxRunDuration it stands with."""
        return zone == self.zone and name in self.keep

    def after(self, tried: Iterable[tuple[str, Sequence[str]]]) -> Recreation:
        """The next round's, after a round of `up`s failed: (its zone, the VMs it made), in
        order. One in another zone replaced the VMs that stood (a VM's zone is ForceNew), maybe
        only some: none is known to stand untouched from then on. Ones in `zone` alone left
        them, and the VMs they made stand there with what was left then."""
        keep = list(self.keep)
        for zone, made in tried:
            if zone != self.zone:
                return dataclasses.replace(self, keep=())
            keep += [name for name in made if name not in keep]
        return dataclasses.replace(self, keep=tuple(keep))

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
        keep = tuple(n for n in environ.get(RECREATE_KEEP_ENV, "").split(",") if n)
        return cls(deadline, zone, image or None, keep)

    def max_run_duration_s(self, now: float) -> int:
        """What is left to the deadline, in whole seconds, at least GCE's minimum."""
        return max(GCE_MIN_RUN_S, int(self.deadline - now))


def ttl_left_s(last_start: str | None, max_run_duration_s: int | None, now: float) -> float | None:
    """Seconds until GCE deletes the VM: the TTL counts from the latest start (as the Compute
    API writes it; one that does not parse counts from `now`)."""
    from infra.gcp.compute import unix_time  # the API's times; lazy: the program imports this

    if not last_start or not max_run_duration_s:
        return None
    return max(0.0, unix_time(last_start, now) + max_run_duration_s - now)
