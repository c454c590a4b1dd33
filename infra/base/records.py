"""The records every layer shares: the nodes a job runs on, wherever they came from (a GCP stack,
a hosts file, this machine), and what their GPUs must be."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Role = Literal["head", "worker"]


@dataclass(frozen=True)
class GpuExpectation:
    """What `verify_gpus` must find on every node; `count == 0` means CPU only (local/test runs)."""

    model: str | None = None  # as nvidia-smi prints it, e.g. "NVIDIA L4"
    count: int = 0
    min_memory_mib: int = 0

    @property
    def is_cpu(self) -> bool:
        return self.count == 0


@dataclass(frozen=True)
class Node:
    """One machine. `address` is where the controller connects; None means through the head."""

    name: str
    role: Role
    internal_address: str  # what the other nodes and the torchrun rendezvous use
    address: str | None = None
    port: int = 22
    user: str = "gputrain"
    host_keys: tuple[str, ...] = ()  # pinned OpenSSH public host keys: "ssh-ed25519 AAAA..."


@dataclass(frozen=True)
class Fleet:
    """Everything the fleet operations need to reach and check a set of nodes."""

    target: str  # "local", "hosts-<name>" or "stack-<name>": results go to runs/<target>/<run-id>/
    nodes: tuple[Node, ...]
    expect: GpuExpectation = field(default_factory=GpuExpectation)
    identity_file: Path | None = None  # the SSH private key (never logged, never in state)
    python: str = "python3"  # interpreter on the nodes that has torch
    local: bool = False  # this machine, no SSH
    install_trainer: bool = False  # our own VMs: pip-install torch/numpy where the image lacks them

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")
