"""Pulumi SDK mocks for GCE, and the per-test isolation the SDK needs (see the offline-testing notes).

The mocks echo inputs back as state (wire names, camelCase) and add the computed fields the
program reads: instance IPs, self links, service-account emails and the getImage invoke.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.runtime.mocks import MockMonitor

from infra.spec import parse_spec
from infra.stackfile import DEFAULTS, PROJECT, load_stack_config
from scripts.targets.gce.keys import generate_ssh_keypair
from tests.support import ROOT

INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"
NETWORK = "gcp:compute/network:Network"
SUBNET = "gcp:compute/subnetwork:Subnetwork"
ACCOUNT = "gcp:serviceaccount/account:Account"
IAM_MEMBER = "gcp:projects/iAMMember:IAMMember"
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
GET_IMAGE = "gcp:compute/getImage:getImage"
#: Resource types GCE lets us label (the rest have no labels field).
LABELABLE = (INSTANCE,)

TEST_PROJECT = "gputrain-test-1"
# One real key pair per test session, made the way `gputrain keygen` makes it.
TEST_PRIVATE_KEY, TEST_PUBLIC_KEY = generate_ssh_keypair("gputrain-test")
TEST_SOURCE_RANGE = "203.0.113.7/32"


@dataclass(frozen=True)
class Registered:
    """One resource the program declared, as the engine received it."""

    typ: str
    name: str
    inputs: dict[str, Any]
    custom: bool


class GcpMocks(pulumi.runtime.Mocks):
    """Records every declared resource and invoke; knows the image families in `images`."""

    def __init__(self, images: Mapping[str, int] | None = None) -> None:
        # family -> disk_size_gb; any other family is "not found", like the real API
        self.images = dict(
            images
            if images is not None
            else {
                "pytorch-2-9-cu129-ubuntu-2204-nvidia-580": 50,
                "common-cu129-ubuntu-2204-nvidia-580": 50,
                # Ubuntu accelerator (ubuntu-os-accelerator-images): A3 Ultra/A4 RDMA's default
                "ubuntu-accelerator-2204-amd64-with-nvidia-580": 50,
            }
        )
        self.resources: list[Registered] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.ignore_changes: dict[str, tuple[str, ...]] = {}  # name -> as the engine gets it
        self._lock = threading.Lock()

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = dict(args.inputs)
        with self._lock:
            self.resources.append(Registered(args.typ, args.name, inputs, bool(args.custom)))
        state = dict(inputs)
        project = inputs.get("project", "unset-project")
        if args.typ == INSTANCE:
            m = re.search(r"-node-(\d+)$", args.name)
            index = int(m.group(1)) if m else 0
            nics = []
            for nic in inputs.get("networkInterfaces", []):
                nic = dict(nic)
                nic["networkIp"] = f"10.42.0.{index + 2}"
                nic["accessConfigs"] = [
                    {**ac, "natIp": f"203.0.113.{index + 10}"}
                    for ac in nic.get("accessConfigs", [])
                ]
                nics.append(nic)
            state["networkInterfaces"] = nics
            state["instanceId"] = str(1000 + index)
        if args.typ == ACCOUNT:
            state["email"] = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
        if args.custom:
            state.setdefault("name", args.name)
            state["selfLink"] = (
                f"https://www.googleapis.com/compute/v1/projects/{project}/{args.typ}/{args.name}"
            )
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> Any:
        call_args = dict(args.args)
        with self._lock:
            self.calls.append((args.token, call_args))
        if args.token == GET_IMAGE:
            family, project = call_args.get("family"), call_args.get("project")
            if family not in self.images:
                return {}, [
                    (
                        "family",
                        f"The resource 'projects/{project}/global/images/family/{family}' was not found",
                    )
                ]
            name = f"{family}-v20260416"
            return {
                "name": name,
                "family": family,
                "project": project,
                "diskSizeGb": self.images[family],
                "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/global/images/{name}",
            }
        return {}

    # Queries for assertions -----------------------------------------------------------------

    def of_type(self, typ: str) -> list[Registered]:
        return sorted((r for r in self.resources if r.typ == typ), key=lambda r: r.name)

    def instances(self) -> list[Registered]:
        return self.of_type(INSTANCE)


class RecordingMonitor(MockMonitor):
    """The SDK's mock monitor, which also keeps each resource's `ignoreChanges` (an option
    `Mocks.new_resource` is not shown) in `mocks.ignore_changes`."""

    mocks: GcpMocks

    def RegisterResource(self, request: Any) -> Any:
        self.mocks.ignore_changes[request.name] = tuple(request.ignoreChanges)
        return super().RegisterResource(request)


@contextmanager
def pulumi_mocks(
    config: Mapping[str, str],
    stack: str = "dev",
    mocks: GcpMocks | None = None,
    secret_keys: list[str] | None = None,
) -> Iterator[GcpMocks]:
    """A fresh event loop, reset runtime, mocks (preview=False) and the given stack config."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    pulumi.runtime.settings.reset_options()
    m = mocks or GcpMocks()
    pulumi.runtime.set_mocks(
        m, project=PROJECT, stack=stack, preview=False, monitor=RecordingMonitor(m)
    )
    pulumi.runtime.set_all_config(dict(config), secret_keys=secret_keys)
    try:
        yield m
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def deployable_config(stack: str, **overrides: str) -> dict[str, str]:
    """A shipped stack file's config plus what a user sets before `pulumi up`, plus overrides.

    Overrides use short keys (`nodes="2"`) for gputrain keys, full keys for others. Overriding
    the machine shape of a `gpus` stack rewrites it with `machineType`, as a user would.
    """
    cfg = load_stack_config(ROOT, stack)
    shaped = {"machineType", "nodes", "gpuType", "gpuCount"} & set(overrides)
    if shaped and "gpus" not in overrides and cfg.get("gputrain:gpus") != DEFAULTS["gpus"]:
        cfg["gputrain:machineType"] = parse_spec(cfg, stack).machine_type
        cfg["gputrain:gpus"] = DEFAULTS["gpus"]
    cfg["gcp:project"] = TEST_PROJECT
    cfg["gputrain:sshPublicKey"] = TEST_PUBLIC_KEY
    cfg["gputrain:sshSourceRanges"] = f'["{TEST_SOURCE_RANGE}"]'
    cfg["gputrain:sshPrivateKey"] = TEST_PRIVATE_KEY  # present, as after keygen; must stay unread
    for key, value in overrides.items():
        cfg[key if ":" in key else f"gputrain:{key}"] = value
    return cfg


def walk(value: Any) -> Iterator[Any]:
    """Every leaf value inside nested dicts/lists (for 'is X anywhere in the inputs' checks)."""
    if isinstance(value, Mapping):
        for v in value.values():
            yield from walk(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from walk(v)
    else:
        yield value
