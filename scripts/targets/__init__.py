"""Where a job runs: the `Target` protocol (base.py) with one module or folder per target —
`gce/` (a Pulumi stack of VMs), `vertex/` (a Pulumi stack whose jobs run on Vertex AI), both on
what every stack target shares (`stack/`), `hosts.py` (a hosts file), `local.py` (this machine) —
sharing the SSH fleet session (session.py) where there are machines."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scripts.settings import Settings
    from scripts.targets.base import Target
    from scripts.targets.gce.clients import GceClients
    from scripts.targets.vertex.clients import VertexClients


def open_target(
    *,
    stack: str | None,
    hosts: str | None,
    settings: Settings,
    gce: GceClients | None = None,
    vertex: VertexClients | None = None,
) -> Target:
    """The target the command line chose: --stack NAME (its `backend` picks GCE or Vertex AI),
    --hosts FILE, else --local."""
    if stack:
        from infra.keys import CHECK
        from infra.stackfile import BACKENDS, read_stack_file
        from scripts.targets.gce.clients import GceClients

        gce = gce or GceClients()
        stack_file = read_stack_file(settings.root, stack)  # once: typed, checked, handed on
        if CHECK.one_of("backend", stack_file.settings.backend.strip(), BACKENDS) == "vertex":
            from scripts.targets.vertex import VertexTarget
            from scripts.targets.vertex.clients import VertexClients

            clients = vertex or VertexClients()
            return VertexTarget(stack, settings, clients, stack_file=stack_file, doctor=gce)
        from scripts.targets.gce.target import GceTarget

        return GceTarget(stack, settings, gce, stack_file=stack_file)
    if hosts:
        from scripts.targets.hosts import HostsTarget

        return HostsTarget(hosts, settings)
    from scripts.targets.local import LocalTarget

    return LocalTarget(settings)
