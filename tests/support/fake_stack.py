"""FakeStackRunner: the StackRunner protocol in memory, for lifecycle and failover tests.

`up()` "creates" the cluster through a pluggable node factory (the lifecycle tests plug in the
sshd test bed), registers every resource in the fake Compute server (so sweep sees it until
`destroy`), and can be scripted to fail like GCE does through Pulumi: stockout (with and without
a zonesAvailable hint), quota, partial multi-node, anything else. Error texts follow the shapes
in gcp-gpu-facts.md §5 as the Pulumi CLI prints them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.image_build import REPOSITORY_TYPE
from infra.stackfile import STACK_LABEL
from infra.ttl import Recreation
from scripts.targets.gce.provision import ZONE_CONFIG_KEY
from scripts.targets.stack.bucket import BUCKET_TYPE
from scripts.targets.stack.clients import OnOutput, StackError, StackLockedError
from tests.support.fake_artifact_registry import FakeArtifactRegistry
from tests.support.fake_compute import FakeCompute, region_of, ssh_host_keys

NodeFactory = Callable[[str], list[dict[str, Any]]]  # zone -> nodes in the NodeOutput shape
TTL_S = 3600  # the stacks' maxRunDuration here: every VM a plain `up` creates gets it


# ---- error texts, as `pulumi up` prints a failed GCE create -------------------------------------


def _diagnostics(node: str, detail: str) -> str:
    return (
        f" +  gcp:compute:Instance {node} creating (0s)\n"
        f" +  gcp:compute:Instance {node} **creating failed** error: 1 error occurred:\n"
        "Diagnostics:\n"
        f"  gcp:compute:Instance ({node}):\n"
        "    error: 1 error occurred:\n"
        f"    \t* {detail}\n\n"
        "  pulumi:pulumi:Stack (gputrain-dev):\n"
        "    error: update failed\n"
    )


def stockout_text(project: str, zone: str, node: str, hint: tuple[str, ...] = ()) -> str:
    """ZONE_RESOURCE_POOL_EXHAUSTED as the provider reports it; with `hint`, the 2024+ form with
    state:STOCKOUT, the 'Consider trying…' sentence and the ErrorInfo zonesAvailable metadata."""
    detail = (
        "Error waiting to create Instance: Error waiting for Creating Instance: Error code 8, "
        f"message: The zone 'projects/{project}/zones/{zone}' does not have enough resources "
        "available to fulfill the request.  '(resource type:compute)'."
    )
    if hint:
        detail += (
            " (state:STOCKOUT, attachment:nvidia-l4:1, vmType:g2-standard-8) A g2-standard-8 VM "
            f"instance with 1 nvidia-l4 accelerator(s) is currently unavailable in the {zone} "
            f"zone. Consider trying your request in the {', '.join(hint)} zone(s) which currently "
            "has/have capacity to accommodate your request.\n    \tDetails:\n    \t"
            '[{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "domain": '
            '"compute.googleapis.com", "metadatas": {"attachment": "nvidia-l4:1", "vmType": '
            f'"g2-standard-8", "zone": "{zone}", "zonesAvailable": "{",".join(hint)}"}}, '
            '"reason": "resource_availability"}]'
        )
    return _diagnostics(node, detail)


def quota_text(node: str, metric: str, region: str | None) -> str:
    where = f"in region {region}" if region else "globally"
    return _diagnostics(
        node,
        f"Error creating instance: googleapi: Error 403: Quota '{metric}' exceeded.  "
        f"Limit: 0.0 {where}., quotaExceeded",
    )


def other_text(node: str, zone: str) -> str:
    return _diagnostics(
        node,
        "Error creating instance: googleapi: Error 400: Invalid value for field "
        f"'resource.machineType': 'zones/{zone}/machineTypes/g2-standard-99'. Machine type with "
        f"name 'g2-standard-99' does not exist in zone '{zone}'., invalid",
    )


# ---- outputs -------------------------------------------------------------------------------------


def sample_outputs(
    stack: str, zone: str, *, nodes: int = 2, project: str = "gputrain-test"
) -> dict[str, Any]:
    """Stack outputs in the StackOutputsDict shape for a g2-standard-8 cluster (facts §1.3, §10)."""
    return {
        "project": project,
        "region": region_of(zone),
        "zone": zone,
        "nodes": sample_nodes(stack, zone, nodes),
        "sshUser": "gputrain",
        "accelerator": "nvidia-l4",
        "gpusPerNode": 1,
        "gpuModel": "NVIDIA L4",
        "gpuMemoryGb": 24,
        "maxRunDurationSeconds": TTL_S,
        "hourlyPriceUsd": round(0.854 * nodes, 3),
        "image": "https://www.googleapis.com/compute/v1/projects/deeplearning-platform-"
        "release/global/images/pytorch-2-9-cu129-ubuntu-2204-nvidia-580-v20260416",
    }


def sample_vertex_outputs(
    stack: str, region: str, *, project: str = "gputrain-test", bucket: str = ""
) -> dict[str, Any]:
    """What infra/components/vertex.py exports, for a 2-replica g2-standard-8 stack."""
    return {
        "backend": "vertex",
        "stack": stack,
        "project": project,
        "region": region,
        "serviceAccount": f"gputrain-{stack}@{project}.iam.gserviceaccount.com",
        "bucket": bucket or f"gputrain-{stack}-{project}",
        "bucketPrefix": "",
        "bucketOwned": True,
        "machineType": "g2-standard-8",
        "accelerator": "nvidia-l4",
        "gpusPerNode": 1,
        "replicas": 2,
        "spot": True,
        "executorImage": "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest",
        "maxRunDuration": "1h",
        "maxRunDurationSeconds": TTL_S,
        "nodeCount": 2,
        "gpusTotal": 2,
        "gpusRequest": "",
        "hourlyPricePerNodeUsd": 0.982,
        "hourlyPriceUsd": 1.964,
        "priceAsOf": "2026-11-23",
    }


def sample_nodes(stack: str, zone: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"{stack}-node-{i}",
            "zone": zone,
            "internalIp": f"10.128.0.{10 + i}",
            "externalIp": "203.0.113.10" if i == 0 else None,
            "role": "head" if i == 0 else "worker",
        }
        for i in range(count)
    ]


def default_node_factory(stack: str, count: int = 2) -> NodeFactory:
    return lambda zone: sample_nodes(stack, zone, count)


# ---- the fake runner -----------------------------------------------------------------------------


@dataclass
class Failure:
    """A scripted `up` failure: after creating `created` nodes, raise `text`."""

    text: str
    created: int = 0
    times: int = 1
    capacity: str | None = None  # only while gputrain:capacityInUse is this mode


@dataclass
class FakeStackRunner:
    """StackRunner in memory. Every call is appended to `calls` as a tuple, e.g.
    ("set_config", "gputrain:zone", "us-central1-b"), ("up", "us-central1-b"), ("destroy",)."""

    stack_name: str = "dev"
    node_factory: NodeFactory | None = None
    # (zone, the node's last output) -> the VM that replaces it when `up` finds it gone
    node_replacer: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
    compute: FakeCompute | None = None
    project: str = "gputrain-test"
    ssh_user: str = "gputrain"
    zones: tuple[str, ...] = ("us-central1-a",)  # the default zone is zones[0], as in the spec
    host_keys_publish_after: int = 0  # getGuestAttributes 404s before the keys appear
    config: dict[str, str] = field(default_factory=dict)
    secrets: set[str] = field(default_factory=set)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    up_env: list[dict[str, str]] = field(default_factory=list)  # each `up`'s `env` (a recovery's)
    failures: dict[str, Failure] = field(default_factory=dict)  # zone -> scripted failure
    destroy_failures: int = 0  # the next N destroys raise
    leak_on_destroy: set[str] = field(default_factory=set)  # instance names destroy leaves behind
    locked: bool = False  # an update whose process died holds the lock until `cancel`
    own_lock: bool = False  # that update was ours, killed by gputrain (left_own_lock)
    # With a storage emulator (STORAGE_EMULATOR_HOST): `up` creates this bucket, labelled, and
    # `destroy` deletes it — refusing while it holds objects, as the provider does without
    # force_destroy. None: the stack has no bucket (as stacks made before there was one).
    bucket: str | None = None
    # "vertex": the program of a `backend: vertex` stack: `up` makes the bucket (and, in the
    # real program, the API and the service account) and returns the Vertex outputs; no VMs.
    backend: str = "gce"
    # `build`: the fake Artifact Registry the stack's repository appears in (for the sweep)
    artifacts: FakeArtifactRegistry | None = None
    _outputs: dict[str, Any] = field(default_factory=dict, init=False)
    _created: list[tuple[str, str, str]] = field(
        default_factory=list, init=False
    )  # kind, name, scope

    # -- scripting

    def fail_stockout(
        self,
        zone: str,
        *,
        zones_available: tuple[str, ...] = (),
        times: int = 1,
        capacity: str | None = None,
    ) -> None:
        """`capacity`: only that mode of a capacity list is stocked out (capacityInUse)."""
        node = f"{self.stack_name}-node-0"
        self.failures[zone] = Failure(
            stockout_text(self.project, zone, node, zones_available), times=times,
            capacity=capacity,
        )  # fmt: skip

    def fail_quota(
        self, zone: str, metric: str = "NVIDIA_L4_GPUS", *, region: str | None = ""
    ) -> None:
        """region "" = the zone's region; None = a global quota (GPUS_ALL_REGIONS)."""
        reg = region_of(zone) if region == "" else region
        self.failures[zone] = Failure(quota_text(f"{self.stack_name}-node-0", metric, reg))

    def fail_partial(self, zone: str, *, created: int = 1, text: str | None = None) -> None:
        """Creates `created` nodes, then the next one fails (a stockout unless `text` is given)."""
        node = f"{self.stack_name}-node-{created}"
        self.failures[zone] = Failure(text or stockout_text(self.project, zone, node), created)

    def fail_other(self, zone: str) -> None:
        self.failures[zone] = Failure(other_text(f"{self.stack_name}-node-0", zone))

    # -- StackRunner

    def set_config(self, key: str, value: str, *, secret: bool = False) -> None:
        self.calls.append(("set_config", key, value if not secret else "[secret]"))
        self.config[key] = value
        if secret:
            self.secrets.add(key)

    def remove_config(self, key: str) -> None:
        self.calls.append(("remove_config", key))
        self.config.pop(key, None)
        self.secrets.discard(key)

    def get_config(self, key: str) -> str | None:
        self.calls.append(("get_config", key))
        return self.config.get(key)

    def up(
        self,
        on_output: OnOutput | None = None,
        *,
        targets: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        zone = self.config.get(ZONE_CONFIG_KEY, self.zones[0])
        say = on_output or (lambda _line: None)
        if targets:  # `build`: the image repository (and the bucket) alone, as the program has them
            self.calls.append(("up-targets", *targets))
            self._create_repository(region_of(zone), say)
            if any(":Bucket::" in t for t in targets):
                self._create_bucket(say)
            return dict(self._outputs)
        self.calls.append(("up", zone))
        self.up_env.append(dict(env or {}))
        recreation = Recreation.from_env(env or {})  # as the program: what is left of the TTL
        ttl_s = TTL_S if recreation is None else recreation.max_run_duration_s(time.time())
        say(f"Updating ({self.stack_name}):")
        if self.backend == "vertex":
            self._create_bucket(say)
            self._outputs = sample_vertex_outputs(
                self.stack_name, region_of(zone), project=self.project, bucket=self.bucket or ""
            )
            return dict(self._outputs)
        self._create_network(say)
        self._create_bucket(say)
        previous = self._outputs.get("nodes") if self._outputs.get("zone") == zone else None
        standing = set(self.existing) if previous else set()
        if standing:  # an update: VMs that still exist stay as they are, missing ones come anew
            nodes = [
                n if n["name"] in standing else self._replacement(zone, n) for n in previous or []
            ]
        else:
            nodes = (self.node_factory or default_node_factory(self.stack_name))(zone)
        to_create = [n for n in nodes if n["name"] not in standing]
        failure = self.failures.get(zone)
        in_use = self.config.get("gputrain:capacityInUse")
        if failure and failure.capacity is not None and failure.capacity != in_use:
            failure = None
        if failure and failure.times > 0:
            failure.times -= 1
            for node in to_create[: failure.created]:
                self._create_node(node, say, ttl_s)
            for line in failure.text.splitlines():
                say(line)
            raise StackError(
                f"pulumi up failed for stack {self.stack_name}",
                f"code: 255\n stderr: {failure.text}",
            )
        created = {n["name"]: self._create_node(n, say, ttl_s) for n in to_create}
        public_nodes = [created.get(n["name"], n) for n in nodes]
        self._drop_instances_outside(zone)  # a zone change replaced them
        self._outputs = sample_outputs(
            self.stack_name, zone, nodes=len(nodes), project=self.project
        )
        self._outputs["nodes"] = public_nodes
        self._outputs["sshUser"] = self.ssh_user
        if self.bucket:
            self._outputs |= {"bucket": self.bucket, "bucketPrefix": "", "bucketOwned": True}
        say(f"Resources:\n    + {len(to_create)} VM(s) created")
        return dict(self._outputs)

    def outputs(self) -> dict[str, Any]:
        self.calls.append(("outputs",))
        return dict(self._outputs)

    def refresh(self, on_output: OnOutput | None = None) -> None:
        self.calls.append(("refresh",))
        self._check_lock()
        if self.compute:  # drop what no longer exists (e.g. the TTL deleted a VM)
            self._created = [
                c
                for c in self._created
                if c[0] != "instance" or (c[2], c[1]) in self.compute.instances
            ]

    def destroy(self, on_output: OnOutput | None = None, *, keep: Sequence[str] = ()) -> None:
        self.calls.append(("destroy", *keep))
        self._check_lock()
        if self.destroy_failures > 0:
            self.destroy_failures -= 1
            raise StackError(
                f"pulumi destroy failed for stack {self.stack_name}: error: deleting "
                "urn:pulumi:dev::gputrain::gcp:compute/network:Network::dev-net: resource is in use",
                "error: The network resource 'projects/p/global/networks/dev-net' is already "
                "being used by 'projects/p/global/firewalls/dev-ssh', resourceInUseByAnotherResource",
            )
        say = on_output or (lambda _line: None)
        kept = []
        for kind, name, scope in reversed(self._created):
            if kind == "bucket" and (BUCKET_TYPE in keep or not self._delete_bucket(name)):
                kept.append((kind, name, scope))
                continue
            if kind == "repository" and REPOSITORY_TYPE in keep:
                kept.append((kind, name, scope))
                continue
            say(f" -  gcp:compute:{kind} {name} deleted")
            if kind == "repository" and self.artifacts is not None:
                self.artifacts.remove(self.project, scope, name)
            if self.compute and name not in self.leak_on_destroy:
                if kind == "instance":
                    self.compute.remove_instance(name, scope)
                elif kind == "serviceAccount":
                    self.compute.remove_service_account(name)
                elif kind == "iamBinding":
                    self.compute.remove_role_binding(*name.split(" ", 1))
                elif kind == "repository":
                    pass  # Artifact Registry, not Compute
                elif kind != "bucket":
                    self.compute.remove_resource(kind, name)
        self._created = kept
        self._outputs = {k: v for k, v in self._outputs.items() if kept and k.startswith("bucket")}
        left = [c for c in kept if c[0] == "bucket"]
        if left and BUCKET_TYPE not in keep:
            raise StackError(
                f"pulumi destroy failed for stack {self.stack_name}: error: deleting "
                f"urn:pulumi:{self.stack_name}::gputrain::gcp:storage/bucket:Bucket::{left[0][1]}",
                f"error: Error trying to delete bucket {left[0][1]} containing objects without "
                "`force_destroy` set to true",
            )

    def cancel(self) -> None:
        self.calls.append(("cancel",))
        self.locked = False

    def left_own_lock(self) -> bool:
        own, self.own_lock = self.own_lock, False
        return own

    def _check_lock(self) -> None:
        """As PulumiStackRunner maps the CLI's ConcurrentUpdateError."""
        if self.locked:
            raise StackLockedError(
                f"stack {self.stack_name} is locked by another update",
                "error: [409] Conflict: Another update is currently in progress.",
            )

    # -- helpers

    def call_names(self) -> list[str]:
        return [c[0] for c in self.calls]

    @property
    def existing(self) -> list[str]:
        """Names of the instances this stack currently holds."""
        return [name for kind, name, _ in self._created if kind == "instance"]

    def _create_network(self, say: OnOutput) -> None:
        region = region_of(self.config.get(ZONE_CONFIG_KEY, self.zones[0]))
        s = self.stack_name
        for kind, name, kwargs in (
            ("networks", f"{s}-net", {}),
            ("subnetworks", f"{s}-subnet", {"region": region, "network": f"{s}-net"}),
            ("firewalls", f"{s}-internal", {"network": f"{s}-net"}),
            ("firewalls", f"{s}-ssh", {"network": f"{s}-net"}),
        ):
            if any(c[1] == name for c in self._created):
                continue
            if self.compute:
                self.compute.add_resource(kind, name, **kwargs)
            self._created.append((kind, name, "global"))
            say(f" +  gcp:compute:{kind} {name} created (2s)")
        self._create_identity(say)

    def _create_identity(self, say: OnOutput) -> None:
        """The nodes' service account and its two project roles, as NodeIdentity declares them."""
        from infra.components.identity import NODE_ROLES
        from infra.stackfile import service_account_id

        account_id = service_account_id(self.stack_name)
        email = f"{account_id}@{self.project}.iam.gserviceaccount.com"
        if any(c[1] == email for c in self._created):
            return
        if self.compute:
            self.compute.add_service_account(account_id)
        self._created.append(("serviceAccount", email, "project"))
        for role in NODE_ROLES:
            binding = f"roles/{role} serviceAccount:{email}"
            if self.compute:
                self.compute.add_role_binding(*binding.split(" ", 1))
            self._created.append(("iamBinding", binding, "project"))
        say(f" +  gcp:serviceaccount:Account {account_id} created (1s)")

    def _replacement(self, zone: str, node: dict[str, Any]) -> dict[str, Any]:
        """A VM `up` re-creates (after a preemption): a new instance, new host keys."""
        if self.node_replacer is not None:
            return self.node_replacer(zone, node)
        return {k: v for k, v in node.items() if k not in ("id", "hostKeys")}

    def _drop_instances_outside(self, zone: str) -> None:
        for c in [c for c in self._created if c[0] == "instance" and c[2] != zone]:
            self._created.remove(c)
            if self.compute:
                self.compute.remove_instance(c[1], c[2])

    def _create_repository(self, region: str, say: OnOutput) -> None:
        """The stack's Docker repository (infra/components/registry.py), in its region."""
        from infra.image_build import repository_id

        name = repository_id(self.stack_name)
        if any(c[0] == "repository" for c in self._created):
            return
        self._created.append(("repository", name, region))
        if self.artifacts is not None:
            self.artifacts.add(self.project, region, name, {STACK_LABEL: self.stack_name})
        say(f" +  gcp:artifactregistry:Repository {name} created (3s)")

    def _create_bucket(self, say: OnOutput) -> None:
        if not self.bucket or any(c[0] == "bucket" for c in self._created):
            return
        from google.cloud import storage

        client = storage.Client(project=self.project)
        b = client.bucket(self.bucket)
        if not b.exists():
            b = client.create_bucket(self.bucket)
        b.labels = {STACK_LABEL: self.stack_name}  # the emulator drops labels on insert
        b.patch()
        self._created.append(("bucket", self.bucket, "global"))
        say(f" +  gcp:storage:Bucket {self.bucket} created (1s)")

    def _delete_bucket(self, name: str) -> bool:
        """False (and still there) while it holds objects."""
        from google.cloud import storage

        b = storage.Client(project=self.project).bucket(name)
        if any(True for _ in b.list_blobs(max_results=1)):
            return False
        b.delete()
        return True

    def _create_node(self, node: dict[str, Any], say: OnOutput, ttl_s: int) -> dict[str, Any]:
        public = {k: v for k, v in node.items() if k != "hostKeys"}
        keys = _host_key_map(node.get("hostKeys")) or ssh_host_keys()
        if self.compute:
            body = self.compute.add_instance(
                node["name"],
                node["zone"],
                labels={STACK_LABEL: self.stack_name},
                internal_ip=node["internalIp"],
                external_ip=node.get("externalIp"),
                host_keys=keys,
                publish_after=self.host_keys_publish_after,
                max_run_duration_s=ttl_s,
            )
            public.setdefault("id", body["id"])
        self._created.append(("instance", node["name"], node["zone"]))
        say(f" +  gcp:compute:Instance {node['name']} created (38s)")
        return public


def _host_key_map(keys: Any) -> dict[str, str]:
    """A node's optional `hostKeys`: {type: base64} or ["type base64", ...] (known_hosts style)."""
    if not keys:
        return {}
    if isinstance(keys, dict):
        return dict(keys)
    return dict(line.split()[:2] for line in keys)
