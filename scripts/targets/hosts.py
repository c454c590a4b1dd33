"""`--hosts FILE`: existing machines over SSH, pinned to the host keys of a known_hosts file."""

from __future__ import annotations

from pathlib import Path

from infra.base.records import Fleet
from infra.datasets import Dataset
from scripts.job.environment import EnvironmentSettings
from scripts.settings import Settings
from scripts.targets.base import RunOptions
from scripts.targets.machines import MachinesTarget


class HostsTarget(MachinesTarget):
    def __init__(self, path: str, settings: Settings) -> None:
        super().__init__(settings)
        from scripts.targets.hosts_file import target_name

        self.path = Path(path)
        self.name = target_name(self.path)

    def datasets(self) -> tuple[Dataset, ...]:
        from scripts.targets.hosts_file import hosts_file_datasets

        return hosts_file_datasets(self.path)

    def notify_urls(self) -> tuple[str, ...]:
        from scripts.targets.hosts_file import load_hosts_file

        return load_hosts_file(self.path, trust_new_hosts=True).notify

    def fleet(self, opts: RunOptions) -> tuple[Fleet, Path | None]:
        from scripts.targets.hosts_file import load_hosts_file

        hosts = load_hosts_file(self.path, trust_new_hosts=opts.trust_new_hosts)
        return hosts.fleet, hosts.known_hosts if opts.trust_new_hosts else None

    def environment_settings(self) -> EnvironmentSettings:
        """The hosts file's `setup` and `secrets` (read before anything runs)."""
        from scripts.targets.hosts_file import load_hosts_file

        return load_hosts_file(self.path, trust_new_hosts=True).environment
