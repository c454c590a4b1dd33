"""`--hosts FILE`: existing machines over SSH, pinned to the host keys of a known_hosts file."""

from __future__ import annotations

from pathlib import Path

from infra.base.records import Fleet
from scripts.settings import Settings
from scripts.targets.base import Declared, RunOptions
from scripts.targets.machines import MachinesTarget


class HostsTarget(MachinesTarget):
    def __init__(self, path: str, settings: Settings) -> None:
        super().__init__(settings)
        from scripts.targets.hosts_file import target_name

        self.path = Path(path)
        self.name = target_name(self.path)

    def declared(self) -> Declared:
        """The hosts file's `data`, `setup`, `secrets`, `image` and `notify` (read once, before
        anything runs; host keys are checked when the session connects)."""
        from scripts.targets.hosts_file import load_hosts_file

        hosts = load_hosts_file(self.path, trust_new_hosts=True)
        return Declared(
            name=self.name,
            label=self.name,
            datasets=hosts.datasets,
            environment=hosts.environment,
            notify=hosts.notify,
        )

    def fleet(self, opts: RunOptions) -> tuple[Fleet, Path | None]:
        from scripts.targets.hosts_file import load_hosts_file

        hosts = load_hosts_file(self.path, trust_new_hosts=opts.trust_new_hosts)
        return hosts.fleet, hosts.known_hosts if opts.trust_new_hosts else None
