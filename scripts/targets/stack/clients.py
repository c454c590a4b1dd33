"""The client bag every stack target carries: how it reaches Pulumi, Cloud Storage (the stack's
bucket), the Compute API, Cloud Build (`build:`) and, for `doctor`, Resource Manager and Service Usage — and how often it
retries a destroy. The one place their clients are built; tests point them at the fake stack
runner and the fake Google API servers. Each backend's bag adds its own (gce/, vertex/).

Pulumi is reached through the one adapter around `pulumi.automation` here (StackRunner, its errors,
and how Pulumi's own progress is shown). Everything else talks to a `StackRunner`; tests use
tests/support/fake_stack.FakeStackRunner because the real runner drives the Pulumi CLI, which the
test machines lack. `pulumi.automation` is imported only inside PulumiStackRunner, so
`gputrain --help` never pays for it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gputrain_node.contract import PUBSUB_ENDPOINT_ENV
from infra.base.errors import EXIT_BAD_INPUT, GputrainError

if TYPE_CHECKING:
    from infra.gcp.artifact_registry import ArtifactRegistryApi
    from infra.gcp.budget_reads import BudgetReadsApi
    from infra.gcp.cloud_run import ReconcileJobsApi
    from infra.gcp.cloudbuild import CloudBuildApi
    from infra.gcp.compute import ComputeApi
    from infra.gcp.gcs import StorageApi
    from infra.gcp.project_api import ProjectApi


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
    pubsub_endpoint: str | None = field(default_factory=from_env(PUBSUB_ENDPOINT_ENV))
    budgets_endpoint: str | None = field(
        default_factory=from_env("GPUTRAIN_BILLINGBUDGETS_ENDPOINT")
    )
    public_address: Callable[[], str | None] | None = None  # None: scripts.doctor's lookup
    destroy_attempts: int = 3
    build_poll_s: float = 5.0  # between reads of a Cloud Build build
    retry_pause_s: float = 10.0  # between destroy attempts
    _compute: ComputeApi | None = field(default=None, init=False, repr=False)
    _storage: dict[str | None, StorageApi] = field(default_factory=dict, init=False, repr=False)

    def runner(self, stack: str, root: Path) -> StackRunner:
        if self.runner_for is not None:
            return self.runner_for(stack, root)

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

    def budget_reads(self) -> BudgetReadsApi:
        """Pub/Sub topics and subscriptions, billing budgets (the sweep of `billingBudget`)."""
        from infra.gcp.budget_reads import BudgetReadsApi

        return BudgetReadsApi(self.pubsub_endpoint, self.budgets_endpoint)

    def storage(self, project: str | None) -> StorageApi:
        """Cloud Storage for the stack's bucket (STORAGE_EMULATOR_HOST redirects it)."""
        if project not in self._storage:
            from infra.gcp.gcs import StorageApi

            self._storage[project] = StorageApi(project)
        return self._storage[project]


OnOutput = Callable[[str], None]


class StackError(GputrainError):
    """A Pulumi operation failed; `raw` keeps the CLI's full text (failover classifies it)."""

    def __init__(self, message: str, raw: str = "") -> None:
        super().__init__(message)
        self.raw = raw or message


class PulumiMissingError(StackError):
    """No working Pulumi CLI on PATH: nothing to retry; the user's setup to fix (exit 2)."""

    exit_code = EXIT_BAD_INPUT


class StackMissingError(StackError):
    """The stack does not exist: a read never creates it (exit 2, `up` makes it)."""

    exit_code = EXIT_BAD_INPUT


class StackLockedError(StackError):
    """Another update holds the stack's lock."""


class StackRunner(Protocol):
    """What the lifecycle needs from Pulumi: one selected stack in the repository."""

    stack_name: str

    def set_config(self, key: str, value: str, *, secret: bool = False) -> None: ...
    def remove_config(self, key: str) -> None: ...
    def get_config(self, key: str) -> str | None: ...
    def up(
        self,
        on_output: OnOutput | None = None,
        *,
        targets: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> dict[str, Any]: ...
    def outputs(self) -> dict[str, Any]: ...
    def refresh(self, on_output: OnOutput | None = None) -> None: ...
    def destroy(self, on_output: OnOutput | None = None, *, keep: Sequence[str] = ()) -> None: ...
    def cancel(self) -> None: ...
    def left_own_lock(self) -> bool: ...


# Lines worth showing in a one-line summary of a failed Pulumi run, most specific first.
_SPECIFIC_ERRORS = (
    re.compile(r"Quota '[^']+' exceeded.*"),
    re.compile(r"googleapi: Error \d+: .*"),
    re.compile(r"Error code \d+, message: .*"),
    re.compile(r"The zone '[^']+' does not have enough resources available.*"),
    re.compile(r"error: (?!update failed).*"),
)


def summarise_pulumi_error(text: str) -> str:
    """The most telling line of a Pulumi failure (the GCE message, not 'update failed')."""
    lines = [ln.strip(" \t*") for ln in text.splitlines() if ln.strip(" \t*")]
    for pattern in _SPECIFIC_ERRORS:
        for ln in lines:
            m = pattern.search(ln)
            if m:
                return m.group(0)[:300]
    return (lines or ["(no output)"])[-1][:300]


PULUMI_VERSION_TIMEOUT_S = 30.0  # as `gputrain doctor`'s probe


def broken_cli(said: str) -> str:
    """The one line for a Pulumi CLI on PATH that does not answer `pulumi version` sanely."""
    return (
        f"the Pulumi CLI at {shutil.which('pulumi')} does not work (`pulumi version`: {said}); "
        "reinstall it (https://www.pulumi.com/docs/iac/download-install/)"
    )


class PulumiStackRunner:
    """StackRunner over the Pulumi CLI (Automation API, local program in `work_dir`)."""

    def __init__(
        self,
        stack_name: str,
        work_dir: Path,
        *,
        env: Mapping[str, str] | None = None,
        pulumi_command: Any = None,  # a PulumiCommand; tests pass a fake (Seam A)
    ) -> None:
        self.stack_name = stack_name
        self.work_dir = work_dir
        self._env = dict(env or {})
        self._pulumi_command = pulumi_command
        self._stack_obj: Any = None

    def _stack(self, *, create: bool = False) -> Any:
        """The selected stack; only a write (`create`: config set, up) makes a missing one, so
        a read never leaves stack state (or an encryption salt) in the user's backend."""
        if self._stack_obj is None:
            from pulumi import automation as auto

            command = self._pulumi_command or self._run("version", self._checked_command)
            self._pulumi_command = command  # its `release` after a kill (left_own_lock)
            opts = auto.LocalWorkspaceOptions(
                work_dir=str(self.work_dir),
                env_vars=self._env or None,
                pulumi_command=command,
            )
            open_stack = auto.create_or_select_stack if create else auto.select_stack
            self._stack_obj = self._run(
                "stack select",
                lambda: open_stack(self.stack_name, work_dir=str(self.work_dir), opts=opts),
            )
        return self._stack_obj

    def _checked_command(self) -> Any:
        """`pulumi version` with a time limit (the SDK's own check has none), then the SDK's
        check: a hanging or broken CLI is one line, not a hang or a traceback. Every pulumi after
        it runs in a session of its own, watched for silence (pulumi_process.py)."""
        from pulumi import automation as auto
        from pulumi.automation import errors as auto_errors

        from scripts.targets.stack.pulumi_process import WatchedPulumiCommand, pulumi_silence_s

        try:
            done = subprocess.run(
                ["pulumi", "version"],
                capture_output=True,
                env={**os.environ, **self._env},
                timeout=PULUMI_VERSION_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise PulumiMissingError(
                broken_cli(f"no answer in {PULUMI_VERSION_TIMEOUT_S:.0f}s"), str(e)
            ) from e
        text = (done.stdout + done.stderr).decode("utf-8", "replace")
        said = ([ln.strip() for ln in text.splitlines() if ln.strip()] or ["(no output)"])[-1]
        if done.returncode != 0:
            raise PulumiMissingError(broken_cli(f"exit {done.returncode}: {said[:200]}"), text)
        try:
            checked = auto.PulumiCommand()
        except (subprocess.CalledProcessError, auto_errors.InvalidVersionError, ValueError) as e:
            first = str(e).split(". ")[0].rstrip(".")  # not its hint to skip the check
            raise PulumiMissingError(broken_cli(f"{said[:200]}: {first}"), text) from e
        return WatchedPulumiCommand(checked.command, checked.version, pulumi_silence_s())

    def _run(self, what: str, fn: Callable[[], Any]) -> Any:
        from pulumi.automation import errors as auto_errors

        try:
            return fn()
        except FileNotFoundError as e:
            raise PulumiMissingError(
                "the Pulumi CLI is not installed or not on PATH "
                "(https://www.pulumi.com/docs/iac/download-install/)",
                str(e),
            ) from e
        except (subprocess.CalledProcessError, auto_errors.InvalidVersionError, OSError) as e:
            raise PulumiMissingError(broken_cli(str(e)[:200]), str(e)) from e
        except auto_errors.StackNotFoundError as e:
            raise StackMissingError(
                f"stack {self.stack_name} has no cluster; run `gputrain up --stack "
                f"{self.stack_name}`",
                str(e),
            ) from e
        except auto_errors.ConcurrentUpdateError as e:
            raise StackLockedError(
                f"stack {self.stack_name} is locked by another update. If another gputrain or "
                f"pulumi run is still working on it, wait for it. Only if our own process died "
                f"mid-update: `gputrain down --stack {self.stack_name}` clears the stale lock "
                "(pulumi cancel) and destroys",
                str(e),
            ) from e
        except auto_errors.CommandError as e:
            raw = str(e)
            raise StackError(
                f"pulumi {what} failed for stack {self.stack_name}: {summarise_pulumi_error(raw)}",
                raw,
            ) from e

    def set_config(self, key: str, value: str, *, secret: bool = False) -> None:
        from pulumi import automation as auto

        stack = self._stack(create=True)
        if secret:
            self._set_secret(key, value)
            return
        self._run(
            f"config set {key}", lambda: stack.set_config(key, auto.ConfigValue(value, False))
        )

    def _set_secret(self, key: str, value: str) -> None:
        """A secret never goes on a command line (any local user sees argv in `ps`): the CLI reads
        a value missing from its arguments from stdin when it is not interactive."""
        command = getattr(self._pulumi_command, "command", None) or "pulumi"
        argv = [command, "config", "set", key, "--secret", "--stack", self.stack_name]
        try:
            done = subprocess.run(
                [*argv, "--non-interactive"],
                input=value.encode(),
                capture_output=True,
                cwd=self.work_dir,
                env={**os.environ, **self._env},
                timeout=120,
            )
        except FileNotFoundError as e:
            raise PulumiMissingError(
                "the Pulumi CLI is not installed or not on PATH", str(e)
            ) from e
        if done.returncode != 0:
            raw = done.stderr.decode("utf-8", "replace") + done.stdout.decode("utf-8", "replace")
            raise StackError(
                f"pulumi config set {key} failed for stack {self.stack_name}: "
                f"{summarise_pulumi_error(raw)}",
                raw,
            )

    def remove_config(self, key: str) -> None:
        stack = self._stack()
        self._run(f"config rm {key}", lambda: stack.remove_config(key))

    def get_config(self, key: str) -> str | None:
        from pulumi.automation import errors as auto_errors

        try:
            stack = self._stack()
        except StackMissingError:
            return None  # as a stack without the key: the caller says what to run
        try:
            return str(stack.get_config(key).value)
        except auto_errors.CommandError as e:
            if "not found" in str(e):
                return None
            raise StackError(
                f"pulumi config get {key} failed: {summarise_pulumi_error(str(e))}", str(e)
            ) from e

    def up(
        self,
        on_output: OnOutput | None = None,
        *,
        targets: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """`targets`: only these URNs (a targeted update: the image repository before the rest).
        `env`: added to this `up`'s environment alone, which the program reads (a recovery's)."""
        stack = self._stack(create=True)
        chosen = list(targets) or None
        workspace = stack.workspace
        before = workspace.env_vars
        workspace.env_vars = {**before, **(env or {})}
        try:
            result = self._run(
                "up", lambda: stack.up(on_output=on_output, color="never", target=chosen)
            )
        finally:
            workspace.env_vars = before
        return {k: v.value for k, v in result.outputs.items()}

    def outputs(self) -> dict[str, Any]:
        """A stack that does not exist has none (each caller says "no cluster")."""
        try:
            stack = self._stack()
        except StackMissingError:
            return {}
        return {k: v.value for k, v in self._run("stack output", stack.outputs).items()}

    def refresh(self, on_output: OnOutput | None = None) -> None:
        stack = self._stack()
        self._run("refresh", lambda: stack.refresh(on_output=on_output, color="never"))

    def destroy(self, on_output: OnOutput | None = None, *, keep: Sequence[str] = ()) -> None:
        """`keep`: resource types to leave (a kept bucket): a targeted destroy of all the rest."""
        from scripts.targets.stack.bucket import destroy_targets

        stack = self._stack()
        state = self._run("stack export", stack.export_stack) if keep else None
        targets = destroy_targets(state.deployment.get("resources") or [], keep) if state else None
        if targets is None or targets:
            destroy = stack.destroy
            self._run(
                "destroy", lambda: destroy(on_output=on_output, color="never", target=targets)
            )

    def cancel(self) -> None:
        stack = self._stack()
        self._run("cancel", stack.cancel)

    def left_own_lock(self) -> bool:
        """gputrain killed a pulumi of ours in an update after it showed it held the lock
        (pulumi_process.py): a lock on the stack now is the one it left, ours to clear; pulumi
        may start again to clear it and destroy."""
        release = getattr(self._pulumi_command, "release", None)  # a test's command may lack it
        return bool(release and release())


def pulumi_line(line: str) -> None:
    """Pulumi's own progress, indented under ours."""
    if line.strip():
        from scripts import ui

        ui.say(f"  pulumi: {line.rstrip()}")
