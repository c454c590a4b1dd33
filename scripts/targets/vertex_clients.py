"""How the Vertex target reaches Pulumi, Vertex AI, Cloud Logging, Cloud Storage and the Compute API
(for its preflight), and how long it waits for them. The one place their clients are built; tests
point them at the fake stack runner, tests/fake_vertex.py, the storage emulator and fake_compute."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.compute import ComputeApi
    from infra.gcs import StorageApi
    from scripts.targets.gce.stack import StackRunner
    from scripts.targets.vertex_api import VertexApi


def _env(name: str) -> Callable[[], str | None]:
    return lambda: os.environ.get(name) or None


@dataclass
class VertexClients:
    runner_for: Callable[[str, Path], StackRunner] | None = None  # (stack, project dir)
    vertex_endpoint: str | None = field(default_factory=_env("GPUTRAIN_VERTEX_ENDPOINT"))
    logging_endpoint: str | None = field(default_factory=_env("GPUTRAIN_LOGGING_ENDPOINT"))
    compute_endpoint: str | None = field(default_factory=_env("GPUTRAIN_COMPUTE_ENDPOINT"))
    poll_s: float = 15.0  # between GETs of a running job (and its new log lines)
    settle_s: float = 5.0  # Cloud Logging delivers a job's last lines a few seconds late
    cancel_timeout_s: float = 600.0  # from CancelCustomJob until the job has ended
    destroy_attempts: int = 3
    retry_pause_s: float = 10.0  # between destroy attempts
    _apis: dict[tuple[str, str], VertexApi] = field(default_factory=dict, init=False, repr=False)
    _storage: dict[str, StorageApi] = field(default_factory=dict, init=False, repr=False)
    _compute: ComputeApi | None = field(default=None, init=False, repr=False)

    def api(self, project: str, region: str) -> VertexApi:
        if (project, region) not in self._apis:
            from scripts.targets.vertex_api import VertexApi

            self._apis[project, region] = VertexApi(
                project,
                region,
                api_endpoint=self.vertex_endpoint,
                logging_endpoint=self.logging_endpoint,
            )
        return self._apis[project, region]

    def storage(self, project: str) -> StorageApi:
        """Cloud Storage for the stack's bucket (STORAGE_EMULATOR_HOST redirects it)."""
        if project not in self._storage:
            from infra.gcs import StorageApi

            self._storage[project] = StorageApi(project)
        return self._storage[project]

    def compute(self) -> ComputeApi:
        if self._compute is None:
            from infra.compute import ComputeApi

            self._compute = ComputeApi(self.compute_endpoint)
        return self._compute

    def runner(self, stack: str, root: Path) -> StackRunner:
        if self.runner_for is not None:
            return self.runner_for(stack, root)
        from scripts.targets.gce.stack import PulumiStackRunner

        return PulumiStackRunner(stack, root)
