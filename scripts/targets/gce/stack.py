"""The one adapter around `pulumi.automation`, and the shape of the stack's outputs.

Everything else talks to a `StackRunner`; tests use tests/fake_stack.FakeStackRunner because the
real runner drives the Pulumi CLI, which the test machines lack. `pulumi.automation` is imported
only inside PulumiStackRunner, so `gputrain --help` never pays for it.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict

from infra import catalog
from infra.base.errors import GputrainError
from infra.base.records import Fleet, GpuExpectation, Node
from infra.base.validate import Checker
from infra.stackfile import qualify

OnOutput = Callable[[str], None]
ZONE_CONFIG_KEY = qualify("zone")  # written by the zone failover, read by the program


def target_name(stack: str) -> str:
    """The target a stack is: results go to runs/stack-<name>/."""
    return f"stack-{stack}"


class StackError(GputrainError):
    """A Pulumi operation failed; `raw` keeps the CLI's full text (failover classifies it)."""

    def __init__(self, message: str, raw: str = "") -> None:
        super().__init__(message)
        self.raw = raw or message


class PulumiMissingError(StackError):
    """No Pulumi CLI on PATH: nothing to retry."""


class StackLockedError(StackError):
    """Another update holds the stack's lock."""


class StackRunner(Protocol):
    """What the lifecycle needs from Pulumi: one selected stack in the repository."""

    stack_name: str

    def set_config(self, key: str, value: str, *, secret: bool = False) -> None: ...
    def remove_config(self, key: str) -> None: ...
    def get_config(self, key: str) -> str | None: ...
    def up(self, on_output: OnOutput | None = None) -> dict[str, Any]: ...
    def outputs(self) -> dict[str, Any]: ...
    def refresh(self, on_output: OnOutput | None = None) -> None: ...
    def destroy(self, on_output: OnOutput | None = None, *, keep: Sequence[str] = ()) -> None: ...
    def cancel(self) -> None: ...


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

    def _stack(self) -> Any:
        if self._stack_obj is None:
            from pulumi import automation as auto

            opts = auto.LocalWorkspaceOptions(
                work_dir=str(self.work_dir),
                env_vars=self._env or None,
                pulumi_command=self._pulumi_command,
            )
            self._stack_obj = self._run(
                "stack select",
                lambda: auto.create_or_select_stack(
                    self.stack_name, work_dir=str(self.work_dir), opts=opts
                ),
            )
        return self._stack_obj

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

        stack = self._stack()
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

        stack = self._stack()
        try:
            return str(stack.get_config(key).value)
        except auto_errors.CommandError as e:
            if "not found" in str(e):
                return None
            raise StackError(
                f"pulumi config get {key} failed: {summarise_pulumi_error(str(e))}", str(e)
            ) from e

    def up(self, on_output: OnOutput | None = None) -> dict[str, Any]:
        stack = self._stack()
        result = self._run("up", lambda: stack.up(on_output=on_output, color="never"))
        return {k: v.value for k, v in result.outputs.items()}

    def outputs(self) -> dict[str, Any]:
        stack = self._stack()
        return {k: v.value for k, v in self._run("stack output", stack.outputs).items()}

    def refresh(self, on_output: OnOutput | None = None) -> None:
        stack = self._stack()
        self._run("refresh", lambda: stack.refresh(on_output=on_output, color="never"))

    def destroy(self, on_output: OnOutput | None = None, *, keep: Sequence[str] = ()) -> None:
        """`keep`: resource types to leave (a kept bucket): a targeted destroy of all the rest."""
        from scripts.targets.gce.bucket import destroy_targets

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


# ---- stack outputs -------------------------------------------------------------------------------


class NodeOutput(TypedDict):
    """One entry of the `nodes` stack output (camelCase, as Pulumi exports it)."""

    name: str  # instance name, e.g. "dev-node-0"
    zone: str
    internalIp: str
    externalIp: str | None  # None: reached through the head
    role: str  # "head" (exactly one, first) or "worker"
    id: NotRequired[str]  # GCE instance id: host-key pins are never reused across ids


class StackOutputsDict(TypedDict):
    """Everything `__main__.py` exports; `parse_stack_outputs` checks it."""

    project: str
    region: str
    zone: str
    nodes: list[NodeOutput]
    sshUser: str
    accelerator: str  # e.g. "nvidia-l4"
    gpusPerNode: int
    gpuModel: str  # as nvidia-smi prints it, e.g. "NVIDIA L4"
    gpuMemoryGb: float
    maxRunDurationSeconds: int  # the VM TTL
    hourlyPriceUsd: float | None  # the whole cluster; null: the price data has no figure
    image: NotRequired[str]  # the pinned boot image self-link


@dataclass(frozen=True)
class StackNode:
    name: str
    zone: str
    internal_ip: str
    external_ip: str | None
    role: str
    instance_id: str | None = None


@dataclass(frozen=True)
class StackOutputs:
    project: str
    region: str
    zone: str
    nodes: tuple[StackNode, ...]
    ssh_user: str
    accelerator: str
    gpus_per_node: int
    gpu_model: str
    gpu_memory_gb: float
    max_run_duration_s: int
    hourly_price: float | None
    image_self_link: str | None = None

    @property
    def head(self) -> StackNode:
        return next(n for n in self.nodes if n.role == "head")

    def to_fleet(
        self,
        stack: str,
        host_keys: Mapping[str, tuple[str, ...]],
        *,
        identity_file: Path | None,
        python: str = "python3",
    ) -> Fleet:
        """The Fleet to verify and train on; every node must come with pinned host keys, and
        every GPU must have the catalog's memory floor for its accelerator."""
        missing = [n.name for n in self.nodes if not host_keys.get(n.name)]
        if missing:
            raise GputrainError(
                f"no pinned SSH host keys for {', '.join(missing)}: refusing to connect"
            )
        return Fleet(
            target=target_name(stack),
            nodes=tuple(
                Node(
                    name=n.name,
                    role="head" if n.role == "head" else "worker",
                    internal_address=n.internal_ip,
                    address=n.external_ip,
                    user=self.ssh_user,
                    host_keys=tuple(host_keys[n.name]),
                )
                for n in self.nodes
            ),
            expect=GpuExpectation(
                model=self.gpu_model,
                count=self.gpus_per_node,
                min_memory_mib=catalog.ACCELERATORS[
                    str(catalog.canonical_accelerator(self.accelerator))
                ].min_memory_mib,
            ),
            identity_file=identity_file,
            python=python,
        )


#: "stack output nodes[1].role is 'boss'; expected head or worker".
OUT = Checker(lambda key, value, allowed: f"stack output {key} is {value!r}; {allowed}", StackError)
_IN_SYNC = "(is the stack program in sync with this gputrain?)"


def _need(
    outputs: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str = ""
) -> Any:
    names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
    return OUT.typed(where + key, outputs.get(key), kind, f"expected {names} {_IN_SYNC}")


def _whole(outputs: Mapping[str, Any], key: str) -> int:
    value = _need(outputs, key, (int, float))
    OUT.check(float(value) == int(value), key, value, "expected a whole number")
    return int(value)


def parse_stack_outputs(outputs: Mapping[str, Any]) -> StackOutputs:
    """Checked StackOutputs from the raw outputs dict (StackOutputsDict); StackError if malformed."""
    raw_nodes = OUT.typed("nodes", outputs.get("nodes"), list, "expected a non-empty list")
    nodes = []
    for i, raw in enumerate(raw_nodes):
        where = f"nodes[{i}]."
        OUT.typed(f"nodes[{i}]", raw, Mapping, "expected an object")
        ext = raw.get("externalIp")
        OUT.check(
            ext is None or (isinstance(ext, str) and ext != ""),
            where + "externalIp",
            ext,
            "expected a string or null",
        )
        role = OUT.one_of(
            where + "role",
            _need(raw, "role", str, where),
            ("head", "worker"),
            "expected head or worker",
        )
        nodes.append(
            StackNode(
                name=_need(raw, "name", str, where),
                zone=_need(raw, "zone", str, where),
                internal_ip=_need(raw, "internalIp", str, where),
                external_ip=ext,
                role=role,
                instance_id=str(raw["id"]) if raw.get("id") is not None else None,
            )
        )
    if [n.role for n in nodes].count("head") != 1 or nodes[0].role != "head":
        raise StackError("stack output nodes must list exactly one head, first")
    accelerator = _need(outputs, "accelerator", str)
    OUT.check(
        catalog.canonical_accelerator(accelerator) is not None,
        "accelerator",
        accelerator,
        f"expected one of {', '.join(catalog.ACCELERATORS)} {_IN_SYNC}",
    )
    return StackOutputs(
        project=_need(outputs, "project", str),
        region=_need(outputs, "region", str),
        zone=_need(outputs, "zone", str),
        nodes=tuple(nodes),
        ssh_user=_need(outputs, "sshUser", str),
        accelerator=accelerator,
        gpus_per_node=_whole(outputs, "gpusPerNode"),
        gpu_model=_need(outputs, "gpuModel", str),
        gpu_memory_gb=float(_need(outputs, "gpuMemoryGb", (int, float))),
        max_run_duration_s=_whole(outputs, "maxRunDurationSeconds"),
        hourly_price=_need(outputs, "hourlyPriceUsd", (int, float, type(None))),  # null: unknown
        image_self_link=outputs.get("image") or None,
    )
