"""How the GCE target reaches Pulumi, the Compute API and (for `doctor`) Resource Manager and
Service Usage, and how long it waits for them. The one place their clients are built; tests point
them at the fake stack runner and the fake Google API servers."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.compute import ComputeApi
    from infra.gcs import StorageApi
    from infra.project_api import ProjectApi
    from scripts.targets.gce.stack import StackRunner


@dataclass
class GceClients:
    runner_for: Callable[[str, Path], StackRunner] | None = None  # (stack, project dir)
    compute_endpoint: str | None = field(
        default_factory=lambda: os.environ.get("GPUTRAIN_COMPUTE_ENDPOINT") or None
    )
    hostkey_deadline_s: float = 600.0  # until the guest agent publishes the VM's host keys
    destroy_attempts: int = 3
    retry_pause_s: float = 10.0  # between destroy attempts
    node_python: str = "python3"  # the interpreter with torch on the nodes (the DLVM's)
    admin_endpoint: str | None = field(  # Resource Manager + Service Usage
        default_factory=lambda: os.environ.get("GPUTRAIN_ADMIN_ENDPOINT") or None
    )
    public_address: Callable[[], str | None] | None = None  # None: scripts.doctor's lookup
    preemption_confirm_s: float = 60.0  # a node killed or lost: how long to ask "preempted?"
    autodown_s: float | None = None  # tests: a shorter autodown than the 1 min floor allows
    _compute: ComputeApi | None = field(default=None, init=False, repr=False)
    _storage: dict[str | None, StorageApi] = field(default_factory=dict, init=False, repr=False)

    def compute(self) -> ComputeApi:
        if self._compute is None:
            from infra.compute import ComputeApi

            self._compute = ComputeApi(self.compute_endpoint)
        return self._compute

    def compute_reachable(self) -> bool:
        """An endpoint (the fake in tests) or Application Default Credentials on disk: worth
        asking the Compute API. Checked without importing google.auth (`plan` stays fast)."""
        adc = Path.home() / ".config" / "gcloud" / "application_default_credentials.json"
        return bool(
            self.compute_endpoint
            or os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
            or adc.is_file()
        )

    def projects(self) -> ProjectApi:
        from infra.project_api import ProjectApi

        return ProjectApi(self.admin_endpoint)

    def storage(self, project: str | None) -> StorageApi:
        """Cloud Storage for the stack's bucket (STORAGE_EMULATOR_HOST redirects it)."""
        if project not in self._storage:
            from infra.gcs import StorageApi

            self._storage[project] = StorageApi(project)
        return self._storage[project]

    def runner(self, stack: str, root: Path) -> StackRunner:
        if self.runner_for is not None:
            return self.runner_for(stack, root)
        from scripts.targets.gce.stack import PulumiStackRunner

        return PulumiStackRunner(stack, root)
