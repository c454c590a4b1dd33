"""Thin adapter over google-cloud-compute: the reads preflight, host-key pinning and sweep need.

Every call returns plain dataclasses, so the rules that judge them (infra/preflight.py, the
host-key parser below) are pure and tested without a server. `google.cloud.compute_v1` costs
about 1.2 s to import, so it is imported inside the methods, never at module level.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import functools
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from infra.base.errors import GputrainError
from infra.base.retry import GaveUp, NotReady, every, poll_until
from infra.gcp.api import GoogleApiError, build_client, call
from infra.gcp.api import message as _message
from infra.stackfile import STACK_LABEL

HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa")  # what gcloud accepts, in order
PREEMPTED = "compute.instances.preempted"  # the zone operation GCE records when it takes a VM back
HOST_ERROR = "compute.instances.hostError"  # ... when a host failure terminated the VM
HOST_MAINTENANCE = "compute.instances.terminateOnHostMaintenance"  # ... maintenance stopped it
#: GCE's own terminations of a VM (system events, `user: system`): what a recovery looks for.
TERMINATIONS = (PREEMPTED, HOST_ERROR, HOST_MAINTENANCE)


ComputeApiError = GoogleApiError  # a Compute API call failed (see infra/gcp/api.py)


# ---- plain results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineTypeInfo:
    name: str
    guest_cpus: int
    memory_mb: int
    accelerators: tuple[tuple[str, int], ...]  # (guestAcceleratorType, guestAcceleratorCount)


@dataclass(frozen=True)
class AcceleratorTypeInfo:
    name: str
    maximum_cards_per_instance: int
    deprecated_state: str | None = None  # DEPRECATED / OBSOLETE / DELETED, None when current


@dataclass(frozen=True)
class Quota:
    metric: str
    limit: float
    usage: float

    @property
    def available(self) -> float:
        return self.limit - self.usage


@dataclass(frozen=True)
class Termination:
    """A system-event operation by which GCE ended a VM: preempted, a host error, maintenance."""

    instance: str
    at: str  # the operation's insertTime (RFC 3339)
    kind: str = PREEMPTED  # one of TERMINATIONS


@dataclass(frozen=True)
class ImageInfo:
    name: str
    self_link: str
    disk_size_gb: int
    deprecated_state: str | None = None
    replacement: str | None = None


# ---- the client --------------------------------------------------------------------------------


class ComputeApi:
    """Builds google-cloud-compute clients lazily; `api_endpoint` ("http://127.0.0.1:PORT") points
    them at a fake server with anonymous credentials, otherwise Application Default Credentials."""

    def __init__(self, api_endpoint: str | None = None) -> None:
        self.api_endpoint = api_endpoint
        self._clients: dict[str, Any] = {}
        self._no_credentials: ComputeApiError | None = None  # asked once, not per call

    def _client(self, name: str) -> Any:
        if self._no_credentials is not None:
            raise self._no_credentials
        if name not in self._clients:
            from google.cloud import compute_v1

            try:
                client = build_client(
                    getattr(compute_v1, name), "Compute Engine", self.api_endpoint
                )
            except ComputeApiError as e:
                self._no_credentials = e
                raise
            self._clients[name] = client
        return self._clients[name]

    def _call(self, what: str, fn: Callable[[], Any], *, not_found: Any = ...) -> Any:
        """Runs one API call; NotFound returns `not_found` when given, other errors become one line."""
        return call(f"Compute API {what}", fn, not_found=not_found)

    # -- reads for preflight

    def machine_type(self, project: str, zone: str, name: str) -> MachineTypeInfo | None:
        mt = self._call(
            f"machineTypes.get {zone}/{name}",
            lambda: self._client("MachineTypesClient").get(
                project=project, zone=zone, machine_type=name
            ),
            not_found=None,
        )
        if mt is None:
            return None
        return MachineTypeInfo(
            name=mt.name,
            guest_cpus=mt.guest_cpus,
            memory_mb=mt.memory_mb,
            accelerators=tuple(
                (a.guest_accelerator_type, a.guest_accelerator_count) for a in mt.accelerators
            ),
        )

    def accelerator_types(self, project: str, zone: str) -> list[AcceleratorTypeInfo]:
        def fetch() -> list[AcceleratorTypeInfo]:
            pager = self._client("AcceleratorTypesClient").list(project=project, zone=zone)
            return [
                AcceleratorTypeInfo(
                    a.name,
                    a.maximum_cards_per_instance,
                    a.deprecated.state if a.deprecated and a.deprecated.state else None,
                )
                for a in pager
            ]

        return list(self._call(f"acceleratorTypes.list {zone}", fetch))

    def region_quotas(self, project: str, region: str) -> dict[str, Quota] | None:
        """METRIC (upper case) -> quota; None when the region does not exist."""
        region_obj = self._call(
            f"regions.get {region}",
            lambda: self._client("RegionsClient").get(project=project, region=region),
            not_found=None,
        )
        return None if region_obj is None else _quota_map(region_obj.quotas)

    def project_quotas(self, project: str) -> dict[str, Quota]:
        proj = self._call(
            f"projects.get {project}", lambda: self._client("ProjectsClient").get(project=project)
        )
        return _quota_map(proj.quotas)

    def image_from_family(self, project: str, family: str) -> ImageInfo | None:
        img = self._call(
            f"images.getFromFamily {project}/{family}",
            lambda: self._client("ImagesClient").get_from_family(project=project, family=family),
            not_found=None,
        )
        if img is None:
            return None
        dep = img.deprecated if "deprecated" in img else None
        return ImageInfo(
            name=img.name,
            self_link=img.self_link,
            disk_size_gb=int(img.disk_size_gb),
            deprecated_state=(dep.state or None) if dep else None,
            replacement=(dep.replacement or None) if dep else None,
        )

    # -- host keys

    def guest_attributes(
        self, project: str, zone: str, instance: str, query_path: str
    ) -> list[tuple[str, str, str]] | None:
        """(namespace, key, value) items; None while the guest agent has not published them."""
        from google.api_core import exceptions as gexc

        client = self._client("InstancesClient")
        request = {"project": project, "zone": zone, "instance": instance, "query_path": query_path}
        try:
            ga = client.get_guest_attributes(request=request)
        except gexc.NotFound as e:
            # Both 404s carry reason notFound; only the message tells "not published yet"
            # (resource 'hostkeys/' of type 'Guest Attribute') from "no such instance".
            if "Guest Attribute" in _message(e):
                return None
            raise ComputeApiError(
                f"instance {instance} not found in zone {zone} (deleted, or its TTL fired?)"
            ) from e
        except gexc.GoogleAPICallError as e:
            raise ComputeApiError(
                f"Compute API getGuestAttributes {zone}/{instance}: {e.code} {_message(e)}"
            ) from e
        return [(i.namespace, i.key, i.value) for i in ga.query_value.items]

    def instance_status(self, project: str, zone: str, instance: str) -> str | None:
        """PROVISIONING, RUNNING, STOPPING, TERMINATED...; None when the instance is gone."""
        request = {"project": project, "zone": zone, "instance": instance}
        get = self._client("InstancesClient").get
        inst = self._call(
            f"instances.get {zone}/{instance}", lambda: get(request=request), not_found=None
        )
        return None if inst is None else str(inst.status)

    def delete_instance(self, project: str, zone: str, instance: str) -> None:
        """Delete a VM (a GPU fault during training: the stack's next `up` re-creates it); one
        that is gone already (autodown got there first) is deleted."""
        request = {"project": project, "zone": zone, "instance": instance}
        delete = self._client("InstancesClient").delete
        what = f"instances.delete {zone}/{instance}"
        op = self._call(what, lambda: delete(request=request), not_found=None)
        if op is not None:
            self._call(what, lambda: op.result(timeout=300), not_found=None)

    def terminations(
        self, project: str, zone: str, kinds: Iterable[str] = TERMINATIONS
    ) -> list[Termination]:
        """The zone's operations of these types (GCE keeps them for a while), one filtered
        list per type."""

        def fetch(kind: str) -> list[Termination]:
            request = {"project": project, "zone": zone, "filter": f'operationType = "{kind}"'}
            return [
                Termination(op.target_link.rsplit("/", 1)[-1], op.insert_time, kind)
                for op in self._client("ZoneOperationsClient").list(request=request)
                if op.operation_type == kind
            ]

        found: list[Termination] = []
        for kind in kinds:
            found += self._call(f"zoneOperations.list {zone}", functools.partial(fetch, kind))
        return found

    # -- listings for sweep and status

    def list_stack_instances(self, project: str, stack: str) -> list[dict[str, Any]]:
        """Instances labelled gputrain-stack=<stack>, filtered server-side (for `status`)."""
        pager = self._call(
            "instances.aggregatedList",
            lambda: self._client("InstancesClient").aggregated_list(
                request={"project": project, "filter": f'labels.{STACK_LABEL} = "{stack}"'}
            ),
        )
        return [
            {
                "name": i.name,
                "zone": i.zone.rsplit("/", 1)[-1],
                "status": i.status,
                "id": str(i.id),
                "labels": dict(i.labels),
                "created": i.creation_timestamp or None,
                "last_start": i.last_start_timestamp or None,
                "max_run_duration_s": int(i.scheduling.max_run_duration.seconds) or None,
            }
            for _, scoped in self._call("instances.aggregatedList", lambda: list(pager))
            for i in scoped.instances
        ]

    def _aggregated(self, client: str, field: str, project: str) -> Iterator[tuple[str, Any]]:
        def fetch() -> list[tuple[str, Any]]:
            pager = self._client(client).aggregated_list(request={"project": project})
            return [(item, scope) for scope, scoped in pager for item in getattr(scoped, field)]

        for item, scope in self._call(f"{client}.aggregatedList", fetch):
            yield item, scope.split("/", 1)[-1]

    def _global(self, client: str, project: str) -> Iterator[tuple[str, Any]]:
        items = self._call(
            f"{client}.list", lambda: list(self._client(client).list(project=project))
        )
        for item in items:
            yield item, "global"

    def stack_resource_candidates(self, project: str) -> Iterator[tuple[str, Any, str]]:
        """(kind, resource, location) for every resource kind a stack creates, unfiltered."""
        for kind, client, field in (
            ("instance", "InstancesClient", "instances"),
            ("disk", "DisksClient", "disks"),
            ("address", "AddressesClient", "addresses"),
            ("subnetwork", "SubnetworksClient", "subnetworks"),
            ("resource-policy", "ResourcePoliciesClient", "resource_policies"),
        ):
            for item, location in self._aggregated(client, field, project):
                yield kind, item, location
        for kind, client in (
            ("address", "GlobalAddressesClient"),
            ("firewall", "FirewallsClient"),
            ("network", "NetworksClient"),
        ):
            for item, location in self._global(client, project):
                yield kind, item, location


def unix_time(rfc3339: str | None, default: float) -> float:
    """A time as the Compute API writes it (RFC 3339: `insertTime`, `creationTimestamp`) as
    unix time; `default` for none or one that does not parse. Pure."""
    if not rfc3339:
        return default
    try:
        return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def _quota_map(quotas: Iterable[Any]) -> dict[str, Quota]:
    return {q.metric.upper(): Quota(q.metric, float(q.limit), float(q.usage)) for q in quotas}


# ---- host keys ---------------------------------------------------------------------------------


def parse_host_key_items(
    items: Iterable[tuple[str, str, str]],
) -> tuple[tuple[str, ...], list[str]]:
    """Guest-attribute items -> (pinned "type base64" keys in HOST_KEY_TYPES order, rejections).

    Like gcloud: keep namespace "hostkeys" with an accepted key type, take `value.split()[0]`;
    stricter than gcloud: the base64 must round-trip and the blob must name the same key type."""
    found: dict[str, str] = {}
    rejected: list[str] = []
    for namespace, key, value in items:
        if namespace != "hostkeys" or key not in HOST_KEY_TYPES:
            continue
        blob = value.split()[0] if value.split() else ""
        problem = _host_key_problem(key, blob)
        if problem:
            rejected.append(f"{key}: {problem}")
        else:
            found[key] = blob
    return tuple(f"{k} {found[k]}" for k in HOST_KEY_TYPES if k in found), rejected


def _host_key_problem(key_type: str, blob: str) -> str | None:
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        return "not valid base64"
    if not raw or base64.b64encode(raw).decode() != blob:
        return "base64 does not round-trip"
    if len(raw) < 4:
        return "truncated key blob"
    (n,) = struct.unpack(">I", raw[:4])
    inner = raw[4 : 4 + n].decode("ascii", "replace")
    if inner != key_type:
        return f"blob is a {inner!r} key"
    return None


def fetch_host_keys(
    project: str,
    zone: str,
    instance: str,
    *,
    deadline_s: float = 300.0,
    poll_s: float = 6.0,
    api: ComputeApi | None = None,
    on_progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, ...]:
    """Polls the VM's `hostkeys/` guest attributes until its SSH host keys are published.

    Done when ssh-ed25519 is there, or when a non-empty set is the same on two polls in a row
    (the agent PUTs the keys one by one). The default 6 s poll stays under GCE's ~10 queries/min
    per VM. Raises GputrainError at the deadline: never connect without pinned keys."""
    api = api or ComputeApi()
    say = on_progress or (lambda _m: None)
    seen: list[tuple[str, ...]] = []  # the keys of each poll
    rejected: list[str] = []

    def published() -> tuple[str, ...]:
        items = api.guest_attributes(project, zone, instance, "hostkeys/")
        if items is None:
            raise NotReady("not published yet")
        keys, rejected[:] = parse_host_key_items(items)
        for r in rejected:
            say(f"{instance}: ignoring published host key {r}")
        if keys and (any(k.startswith("ssh-ed25519 ") for k in keys) or seen[-1:] == [keys]):
            return keys
        seen.append(keys)
        raise NotReady("only part of the keys so far")

    try:
        keys = poll_until(
            published,
            deadline_s=deadline_s,
            delay=every(poll_s),
            on_wait=lambda w: say(
                f"{instance}: waiting for SSH host keys in guest attributes ({w.elapsed_s:.0f}s)"
            ),
            clock=clock,
            sleep=sleep,
        )
    except GaveUp as e:
        why = (
            f"only rejected keys were published ({'; '.join(rejected)})"
            if rejected
            else "the guest agent has not published them (was enable-guest-attributes=TRUE set at creation?)"
        )
        raise GputrainError(
            f"no SSH host keys for {instance} in {zone} after {e.elapsed_s:.0f}s and {e.attempts} "
            f"queries: {why}; refusing to connect without pinned keys"
        ) from e
    say(f"{instance}: pinned {len(keys)} host key(s) from guest attributes")
    return keys
