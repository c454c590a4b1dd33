"""Where a job runs: the `Target` protocol (base.py) with one module per target — `gce/` (a Pulumi
stack of VMs), `vertex.py` (a Pulumi stack whose jobs run on Vertex AI), `hosts.py` (a hosts
file), `local.py` (this machine) — sharing the SSH fleet session (session.py) where there are
machines."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scripts.settings import Settings
    from scripts.targets.base import Target
    from scripts.targets.gce.clients import GceClients
    from scripts.targets.vertex_clients import VertexClients


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
        from scripts.targets.gce.clients import GceClients

        gce = gce or GceClients()
        if stack_backend(settings, stack) == "vertex":
            from scripts.targets.vertex import VertexTarget
            from scripts.targets.vertex_clients import VertexClients

            return VertexTarget(stack, settings, vertex or VertexClients(), gce)
        from scripts.targets.gce.target import GceTarget

        return GceTarget(stack, settings, gce)
    if hosts:
        from scripts.targets.hosts import HostsTarget

        return HostsTarget(hosts, settings)
    from scripts.targets.local import LocalTarget

    return LocalTarget(settings)


def stack_backend(settings: Settings, stack: str) -> str:
    """The stack file's `backend` (gce, vertex), read and checked before anything else is. A
    stack file that cannot be read is the GCE target's to report, as it always was."""
    from infra.fields import ConfigReader
    from infra.stackfile import BACKENDS, SpecError, load_stack_config

    try:
        config = load_stack_config(settings.root, stack)
    except SpecError:
        return "gce"
    return ConfigReader(config).choice("backend", BACKENDS)
