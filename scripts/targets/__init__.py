"""Where a job runs: the `Target` protocol (base.py) with one module per target — `gce/` (a Pulumi
stack), `hosts.py` (a hosts file), `local.py` (this machine) — sharing the SSH fleet session
(session.py) where there are machines."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scripts.settings import Settings
    from scripts.targets.base import Target
    from scripts.targets.gce.clients import GceClients


def open_target(
    *,
    stack: str | None,
    hosts: str | None,
    settings: Settings,
    gce: GceClients | None = None,
) -> Target:
    """The target the command line chose: --stack NAME, --hosts FILE, else --local."""
    if stack:
        from scripts.targets.gce.clients import GceClients
        from scripts.targets.gce.target import GceTarget

        return GceTarget(stack, settings, gce or GceClients())
    if hosts:
        from scripts.targets.hosts import HostsTarget

        return HostsTarget(hosts, settings)
    from scripts.targets.local import LocalTarget

    return LocalTarget(settings)
