"""The client bag every stack target carries: how it reaches Pulumi, Cloud Storage (the stack's
bucket), the Compute API, Cloud Build (`build:`) and, for `doctor`, Resource Manager and Service Usage — and how often it
retries a destroy. The one place their clients are built; tests point them at the fake stack
runner and the fake Google API servers. Each backend's bag adds its own (gce/, vertex/)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.gcp.artifact_registry import ArtifactRegistryApi
    from infra.gcp.cloud_run import ReconcileJobsApi
    from infra.gcp.cloudbuild import CloudBuildApi
    from infra.gcp.compute import ComputeApi
    from infra.gcp.gcs import StorageApi
    from infra.gcp.project_api import ProjectApi
    from scripts.targets.stack.runner import StackRunner


def from_env(name: str) -> Callable[[], str | None]:
    """A field default read when the bag is made: an endpoint override (tests, emulators)."""
    return lambda: os.environ.get(name) or None


@dataclass
class StackClients:
    runner_for: Callable[[str, Path], StackRunner] | None = None  # (stack, project dir)
    compute_endpoint: str | None = field(default_factory=from_env("GPUTRAIN_COMPUTE_ENDPOINT"))
    admin_endpoint: str | None = field(  # Resource Manager + Service Usage
        default_factory=from_env("GPUTRAIN_ADMIN_ENDPOINT")
    )
    cloudbuild_endpoint: str | None = field(
        default_factory=from_env("GPUTRAIN_CLOUDBUILD_ENDPOINT")
    )
    artifacts_endpoint: str | None = field(
        default_factory=from_env("GPUTRAIN_ARTIFACTREGISTRY_ENDPOINT")
    )
    run_endpoint: str | None = field(default_factory=from_env("GPUTRAIN_RUN_ENDPOINT"))
    scheduler_endpoint: str | None = field(default_factory=from_env("GPUTRAIN_SCHEDULER_ENDPOINT"))
    public_address: Callable[[], str | None] | None = None  # None: scripts.doctor's lookup
    destroy_attempts: int = 3
    build_poll_s: float = 5.0  # between reads of a Cloud Build build
    retry_pause_s: float = 10.0  # between destroy attempts
    _compute: ComputeApi | None = field(default=None, init=False, repr=False)
    _storage: dict[str | None, StorageApi] = field(default_factory=dict, init=False, repr=False)

    def runner(self, stack: str, root: Path) -> StackRunner:
        if self.runner_for is not None:
            return self.runner_for(stack, root)
        from scripts.targets.stack.runner import PulumiStackRunner

        return PulumiStackRunner(stack, root)

    def compute(self) -> ComputeApi:
        if self._compute is None:
            from infra.gcp.compute import ComputeApi

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
        from infra.gcp.project_api import ProjectApi

        return ProjectApi(self.admin_endpoint)

    def cloud_build(self, project: str) -> CloudBuildApi:
        from infra.gcp.cloudbuild import CloudBuildApi

        return CloudBuildApi(project, self.cloudbuild_endpoint, poll_s=self.build_poll_s)

    def artifact_registry(self) -> ArtifactRegistryApi:
        from infra.gcp.artifact_registry import ArtifactRegistryApi

        return ArtifactRegistryApi(self.artifacts_endpoint)

    def reconcile_jobs(self) -> ReconcileJobsApi:
        """Cloud Run and Cloud Scheduler jobs (the sweep of laptop-closed recovery)."""
        from infra.gcp.cloud_run import ReconcileJobsApi

        return ReconcileJobsApi(self.run_endpoint, self.scheduler_endpoint)

    def storage(self, project: str | None) -> StorageApi:
        """Cloud Storage for the stack's bucket (STORAGE_EMULATOR_HOST redirects it)."""
        if project not in self._storage:
            from infra.gcp.gcs import StorageApi

            self._storage[project] = StorageApi(project)
        return self._storage[project]
