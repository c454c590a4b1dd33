"""Stack config -> validated, frozen ClusterSpec. The single parser of gputrain's settings.

Every bad value raises SpecError with one line: the key, the bad value and what is allowed.
Nothing here imports pulumi, so `gputrain plan` and the tests use it without the SDK.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, cast

import yaml

from infra import catalog
from infra.base.errors import UserError
from infra.base.records import GpuExpectation

PROJECT = "gputrain"
NS = f"{PROJECT}:"
GCP_PROJECT_KEY = "gcp:project"

DEFAULT_IMAGE_FAMILY = "pytorch-2-9-cu129-ubuntu-2204-nvidia-580"
FALLBACK_IMAGE_FAMILY = "common-cu129-ubuntu-2204-nvidia-580"
DEFAULT_IMAGE_PROJECT = "deeplearning-platform-release"

MIN_RUN_S = 10 * 60
MAX_RUN_S = 120 * 24 * 3600
MIN_BOOT_DISK_GB = 50
MAX_BOOT_DISK_GB = 65536
RESERVED_LABELS = ("gputrain-stack", "gputrain-project")

#: Every gputrain key with its default as the CLI would pass it (a string). Pulumi.yaml must
#: declare exactly these keys with the same defaults (a test holds the two together).
DEFAULTS: dict[str, str] = {
    "zones": '["us-central1-a", "us-central1-b", "us-central1-c"]',
    "zone": "",
    "machineType": "g2-standard-4",
    "gpuType": "",
    "gpuCount": "0",
    "nodes": "1",
    "spot": "true",
    "maxRunDuration": "6h",
    "imageFamily": DEFAULT_IMAGE_FAMILY,
    "imageProject": DEFAULT_IMAGE_PROJECT,
    "bootDiskGb": "200",
    "bootDiskType": "",
    "sshUser": "gputrain",
    "sshPublicKey": "",
    "sshPrivateKey": "",
    "sshSourceRanges": "[]",
    "allowSshFromAnywhere": "false",
    "publicIp": "head",
    "placement": "auto",
    "network": "",
    "labels": "[]",
}

#: Keys the Pulumi program reads. sshPrivateKey is deliberately absent: it never enters it.
PROGRAM_KEYS: tuple[str, ...] = tuple(k for k in DEFAULTS if k != "sshPrivateKey")


class SpecError(UserError):
    """A stack setting is invalid or missing; nothing has been declared or created."""


@dataclass(frozen=True)
class ClusterSpec:
    """Everything the cluster needs, validated: the only view of the stack config."""

    stack: str
    project: str | None
    zones: tuple[str, ...]
    zone: str
    region: str
    machine_type: str
    series: str
    accelerator: str
    gpus_per_node: int
    gpu_model: str
    gpu_memory_gb: int
    vcpus: int
    memory_gb: float
    nodes: int
    spot: bool
    max_run_duration_s: int
    image_family: str
    image_project: str
    boot_disk_gb: int
    boot_disk_type: str
    ssh_user: str
    ssh_public_key: str | None
    ssh_source_ranges: tuple[str, ...]
    allow_ssh_from_anywhere: bool
    public_ip: Literal["head", "all", "none"]
    placement: Literal["compact", "none"]
    network: str | None
    labels: Mapping[str, str]
    gvnic: bool
    attach_gpus: bool  # N1: GPUs go in guest_accelerators; A/G series bring their own

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"{self.stack}-node-{i}" for i in range(self.nodes))

    @property
    def max_run_duration(self) -> str:
        return format_duration(self.max_run_duration_s)

    @property
    def price(self) -> catalog.Price:
        mt = catalog.MACHINE_TYPES[self.machine_type]
        if self.attach_gpus:
            return catalog.price(mt, self.accelerator, self.gpus_per_node)
        return catalog.price(mt)

    @property
    def hourly_price_per_node(self) -> float:
        return self.price.hourly(self.spot)

    @property
    def gpu_quota_metric(self) -> str:
        return catalog.quota_metric(self.accelerator, self.spot)

    @property
    def cpu_quota_metric(self) -> str:
        return catalog.cpu_quota_metric(self.series, self.spot)

    def gpu_expectation(self) -> GpuExpectation:
        """What nvidia-smi must show on every node: model, count, >= 90 % of nominal memory."""
        min_mib = int(self.gpu_memory_gb * 1e9 / 2**20 * 0.9)
        return GpuExpectation(
            model=self.gpu_model, count=self.gpus_per_node, min_memory_mib=min_mib
        )


# --------------------------------------------------------------------------------------------
# Reading stack files (no Pulumi CLI)
# --------------------------------------------------------------------------------------------


def _as_config_string(value: Any) -> str:
    """A YAML value the way the Pulumi CLI hands it to the program."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return "" if value is None else str(value)


def _qualify(key: str) -> str:
    return key if ":" in key else NS + key


def load_stack_config(root: Path, stack: str) -> dict[str, str]:
    """Pulumi.yaml defaults merged with Pulumi.<stack>.yaml: fully qualified keys, string values.

    Secure (encrypted) values are skipped: only the CLI can decrypt them, and the program never
    needs the one we store (sshPrivateKey).
    """
    project_file = root / "Pulumi.yaml"
    stack_file = root / f"Pulumi.{stack}.yaml"
    if not stack_file.is_file():
        known = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in root.glob("Pulumi.*.yaml"))
        raise SpecError(
            f"stack = {stack!r}: there is no {stack_file.name} in {root} (stacks: {', '.join(known) or 'none'})"
        )
    try:
        project = yaml.safe_load(project_file.read_text()) or {}
        stack_doc = yaml.safe_load(stack_file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        detail = " ".join(str(exc).split())
        raise SpecError(
            f"stack = {stack!r}: cannot read Pulumi.yaml or {stack_file.name}: {detail}"
        ) from exc
    merged: dict[str, str] = {}
    for key, decl in (project.get("config") or {}).items():
        if isinstance(decl, dict):
            if "secure" in decl:
                continue
            if "value" in decl:
                merged[_qualify(key)] = _as_config_string(decl["value"])
            elif "default" in decl:
                merged[_qualify(key)] = _as_config_string(decl["default"])
        else:
            merged[_qualify(key)] = _as_config_string(decl)
    for key, value in (stack_doc.get("config") or {}).items():
        if isinstance(value, dict) and "secure" in value:
            continue
        merged[_qualify(key)] = _as_config_string(value)
    return merged


# --------------------------------------------------------------------------------------------
# Small parsers
# --------------------------------------------------------------------------------------------

_DURATION_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def parse_duration(text: str) -> int:
    """Seconds in "90m", "6h", "2d", "1h30m" (units d/h/m/s, largest first); ValueError if not."""
    m = _DURATION_RE.match(text.strip())
    if not text.strip() or m is None or not any(m.groups()):
        raise ValueError(text)
    return sum(int(g) * mult for g, (_, mult) in zip(m.groups(), _UNITS, strict=True) if g)


def format_duration(seconds: int) -> str:
    """The shortest d/h/m/s form of a duration, e.g. 5400 -> "1h30m"."""
    parts = []
    for unit, mult in _UNITS:
        q, seconds = divmod(seconds, mult)
        if q:
            parts.append(f"{q}{unit}")
    return "".join(parts) or "0s"


def _err(key: str, value: object, allowed: str) -> SpecError:
    shown = value if isinstance(value, str) else json.dumps(value)
    return SpecError(f"{_qualify(key)} = {shown!r}: {allowed}")


def _bool(cfg: Mapping[str, str], key: str) -> bool:
    raw = cfg.get(NS + key, DEFAULTS[key]).strip()
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise _err(key, raw, "allowed: true or false")


def _int(cfg: Mapping[str, str], key: str, lo: int, hi: int, what: str = "") -> int:
    raw = cfg.get(NS + key, DEFAULTS[key]).strip()
    try:
        value = int(raw)
    except ValueError:
        raise _err(key, raw, f"allowed: a whole number {lo}..{hi}{what}") from None
    if not lo <= value <= hi:
        raise _err(key, raw, f"allowed: {lo}..{hi}{what}")
    return value


def _str(cfg: Mapping[str, str], key: str) -> str:
    return cfg.get(NS + key, DEFAULTS[key]).strip()


def _choice(cfg: Mapping[str, str], key: str, options: tuple[str, ...]) -> str:
    raw = _str(cfg, key)
    if raw not in options:
        raise _err(key, raw, f"allowed: {', '.join(options)}")
    return raw


def _list(cfg: Mapping[str, str], key: str) -> list[str]:
    """A list of strings: JSON array (how the CLI passes arrays) or a comma-separated string."""
    raw = cfg.get(NS + key, DEFAULTS[key]).strip()
    if not raw:
        return []
    if raw.startswith("["):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise _err(key, raw, "allowed: a list of strings") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _err(key, raw, "allowed: a list of strings")
        return [v.strip() for v in value]
    return [v.strip() for v in raw.split(",") if v.strip()]


_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_STACK_RE = re.compile(r"^[a-z](?:[a-z0-9-]{0,19}[a-z0-9])?$")
_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_NETWORK_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
)


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _zones(cfg: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
    zones = _list(cfg, "zones")
    if not zones:
        raise _err("zones", "[]", "allowed: one or more zones of one region, e.g. [us-central1-a]")
    for z in zones:
        if not _ZONE_RE.match(z):
            raise _err("zones", z, "allowed: zone names like us-central1-a")
    regions = sorted({region_of(z) for z in zones})
    if len(regions) > 1:
        raise _err(
            "zones", ",".join(zones), f"all zones must be in one region, got {', '.join(regions)}"
        )
    if len(set(zones)) != len(zones):
        raise _err("zones", ",".join(zones), "each zone may appear once")
    zone = _str(cfg, "zone") or zones[0]
    if zone not in zones:
        raise _err("zone", zone, f"allowed: one of zones ({', '.join(zones)}) or empty")
    return tuple(zones), zone


def _ssh_public_key(cfg: Mapping[str, str]) -> str | None:
    raw = _str(cfg, "sshPublicKey")
    if not raw:
        return None
    shown = raw if len(raw) <= 40 else raw[:37] + "..."
    parts = raw.split()
    if "PRIVATE KEY" in raw:
        raise SpecError(
            "gputrain:sshPublicKey holds a PRIVATE key; allowed: an OpenSSH public key line "
            "(run `gputrain keygen --stack NAME`)"
        )
    if "\n" in raw or len(parts) < 2 or parts[0] not in _KEY_TYPES:
        raise _err(
            "sshPublicKey",
            shown,
            f"allowed: an OpenSSH public key line ({', '.join(_KEY_TYPES)} AAAA...)",
        )
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except binascii.Error:
        raise _err("sshPublicKey", shown, "the key data is not base64") from None
    if blob[4 : 4 + len(parts[0])] != parts[0].encode():
        raise _err("sshPublicKey", shown, f"the key data does not encode a {parts[0]} key")
    return raw


def _source_ranges(cfg: Mapping[str, str], anywhere: bool) -> tuple[str, ...]:
    out = []
    for r in _list(cfg, "sshSourceRanges"):
        try:
            net = ipaddress.ip_network(r, strict=True)
        except ValueError:
            raise _err("sshSourceRanges", r, "allowed: IPv4 CIDRs like 203.0.113.7/32") from None
        if net.version != 4:
            raise _err(
                "sshSourceRanges", r, "allowed: IPv4 CIDRs only (the nodes have IPv4 addresses)"
            )
        if net.prefixlen == 0 and not anywhere:
            raise _err(
                "sshSourceRanges",
                r,
                "SSH open to the whole internet is refused; use your address/32, "
                "or set gputrain:allowSshFromAnywhere true",
            )
        out.append(str(net))
    return tuple(out)


def _labels(cfg: Mapping[str, str]) -> dict[str, str]:
    raw = cfg.get(NS + "labels", DEFAULTS["labels"]).strip()
    pairs: list[tuple[str, str]] = []
    if raw.startswith("{"):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            raise _err("labels", raw, "allowed: a list of key=value strings") from None
        pairs = [(str(k), "" if v is None else str(v)) for k, v in obj.items()]
    else:
        for item in _list(cfg, "labels"):
            if "=" not in item:
                raise _err("labels", item, "allowed: key=value strings")
            k, v = item.split("=", 1)
            pairs.append((k.strip(), v.strip()))
    labels: dict[str, str] = {}
    for k, v in pairs:
        if not _LABEL_KEY_RE.match(k):
            raise _err("labels", k, "label keys: lowercase letter first, then a-z 0-9 _ - (max 63)")
        if not _LABEL_VALUE_RE.match(v):
            raise _err("labels", f"{k}={v}", "label values: a-z 0-9 _ - only (max 63)")
        if k in RESERVED_LABELS:
            raise _err("labels", k, f"{', '.join(RESERVED_LABELS)} are set by gputrain")
        labels[k] = v
    if len(labels) > 60:
        raise _err("labels", f"{len(labels)} labels", "allowed: at most 60")
    return labels


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------


def _gpus(cfg: Mapping[str, str], mt: catalog.MachineType) -> tuple[str, int, bool]:
    """(accelerator, count, attach) for the machine type, validating gpuType/gpuCount."""
    gpu_type_raw = _str(cfg, "gpuType")
    count_raw = _str(cfg, "gpuCount") or "0"
    try:
        count = int(count_raw)
    except ValueError:
        raise _err(
            "gpuCount", count_raw, "allowed: a whole number (0 = implied by machineType)"
        ) from None
    gpu_type = catalog.canonical_accelerator(gpu_type_raw) if gpu_type_raw else None
    if gpu_type_raw and gpu_type is None:
        raise _err("gpuType", gpu_type_raw, f"allowed: {', '.join(catalog.ACCELERATORS)}")
    if mt.accelerator is not None:
        if gpu_type is not None and gpu_type != mt.accelerator:
            raise _err(
                "gpuType",
                gpu_type_raw,
                f"{mt.name} brings {mt.accelerator}; leave gpuType empty or set that",
            )
        if count not in (0, mt.gpus):
            raise _err(
                "gpuCount",
                count_raw,
                f"{mt.name} has {mt.gpus} x {mt.accelerator}; use 0 (implied) or {mt.gpus}",
            )
        return mt.accelerator, mt.gpus, False
    # N1: the GPU is attached.
    if gpu_type is None:
        raise SpecError(
            f"gputrain:gpuType is empty: {mt.name} needs an attached GPU: {', '.join(catalog.N1_GPUS)}"
        )
    gpu = catalog.N1_GPUS.get(gpu_type)
    if gpu is None:
        raise _err(
            "gpuType", gpu_type_raw, f"{mt.name} (N1) can attach: {', '.join(catalog.N1_GPUS)}"
        )
    if count not in gpu.caps:
        raise _err(
            "gpuCount", count_raw, f"allowed for {gpu_type}: {', '.join(map(str, gpu.counts))}"
        )
    max_vcpu, max_mem = gpu.caps[count]
    if mt.vcpus > max_vcpu or mt.memory_gb > max_mem:
        raise _err(
            "machineType",
            mt.name,
            f"{count} x {gpu_type} allows at most {max_vcpu} vCPUs and {max_mem} GB "
            f"({mt.name} has {mt.vcpus} vCPUs, {mt.memory_gb:g} GB)",
        )
    return gpu_type, count, True


def parse_spec(config: Mapping[str, str], stack: str) -> ClusterSpec:
    """Validate a fully qualified string config (see load_stack_config) into a ClusterSpec.

    Missing gcp:project, sshPublicKey and sshSourceRanges are accepted here so that `plan`
    works on the shipped stack files; `require_deployable` refuses them before `pulumi up`.
    """
    if not _STACK_RE.match(stack):
        raise SpecError(
            f"stack = {stack!r}: allowed: 1-21 of a-z 0-9 -, starting with a letter "
            "(it names the VMs and the service account)"
        )
    unknown = sorted(k for k in config if k.startswith(NS) and k[len(NS) :] not in DEFAULTS)
    if unknown:
        nearest = [
            n for k in unknown for n in difflib.get_close_matches(k[len(NS) :], DEFAULTS, n=1)
        ]
        hint = f"; did you mean {', '.join(nearest)}?" if nearest else ""
        raise SpecError(
            f"{unknown[0]}: not a gputrain setting; allowed: {', '.join(DEFAULTS)}{hint}"
        )

    project = config.get(GCP_PROJECT_KEY, "").strip() or None
    if project is not None and not re.match(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$", project):
        raise _err(GCP_PROJECT_KEY, project, "allowed: a GCP project ID (6-30 of a-z 0-9 -)")
    zones, zone = _zones(config)

    mt_name = _str(config, "machineType")
    mt = catalog.machine_type(mt_name)
    if mt is None:
        near = catalog.nearest_machine_types(mt_name)
        hint = f"nearest: {', '.join(near)}" if near else "see infra/catalog.py for the list"
        raise _err("machineType", mt_name, f"not a known machine type; {hint}")
    if not mt.orderable:
        raise _err(
            "machineType", mt_name, "A3 Edge is a serving product, not orderable for training"
        )
    accelerator, gpus, attach = _gpus(config, mt)

    nodes = _int(config, "nodes", 1, 64)
    spot = _bool(config, "spot")
    if mt.spot_only and not spot:
        raise _err("spot", "false", f"{mt.name} is offered only as Spot (set gputrain:spot true)")

    ttl_raw = _str(config, "maxRunDuration")
    try:
        ttl = parse_duration(ttl_raw)
    except ValueError:
        raise _err(
            "maxRunDuration", ttl_raw, "allowed: durations like 90m, 6h, 2d, 1h30m"
        ) from None
    if not MIN_RUN_S <= ttl <= MAX_RUN_S:
        raise _err("maxRunDuration", ttl_raw, "allowed: 10m to 120d")

    image_family = _str(config, "imageFamily")
    image_project = _str(config, "imageProject")
    if not re.match(r"^[a-z][-a-z0-9]{0,62}$", image_family):
        raise _err(
            "imageFamily",
            image_family,
            "allowed: an image family name, e.g. " + DEFAULT_IMAGE_FAMILY,
        )
    if not re.match(r"^[a-z][-a-z0-9.:]{4,62}$", image_project):
        raise _err(
            "imageProject", image_project, "allowed: a project ID, e.g. " + DEFAULT_IMAGE_PROJECT
        )

    disk_gb = _int(config, "bootDiskGb", MIN_BOOT_DISK_GB, MAX_BOOT_DISK_GB, " GB")
    disk_type = _str(config, "bootDiskType") or catalog.default_boot_disk_type(mt)
    if disk_type not in catalog.boot_disk_types(mt):
        raise _err(
            "bootDiskType",
            disk_type,
            f"allowed for {mt.name}: {', '.join(catalog.boot_disk_types(mt))}",
        )

    ssh_user = _str(config, "sshUser")
    if not _USER_RE.match(ssh_user) or ssh_user == "root":
        raise _err("sshUser", ssh_user, "allowed: a Linux user name (a-z 0-9 _ -, not root)")
    anywhere = _bool(config, "allowSshFromAnywhere")
    public_ip = cast(
        Literal["head", "all", "none"], _choice(config, "publicIp", ("head", "all", "none"))
    )
    placement_raw = _choice(config, "placement", ("auto", "compact", "none"))
    if placement_raw == "compact" and not mt.compact_placement:
        raise _err(
            "placement",
            "compact",
            f"{mt.series.upper()} does not support compact placement; use none",
        )
    if placement_raw == "compact" and nodes < 2:
        raise _err("placement", "compact", "compact placement needs nodes >= 2; use none or auto")
    placement: Literal["compact", "none"] = (
        "compact"
        if placement_raw == "compact"
        or (placement_raw == "auto" and nodes > 1 and mt.compact_placement)
        else "none"
    )
    network = _str(config, "network") or None
    if network is not None and not _NETWORK_RE.match(network):
        raise _err("network", network, "allowed: an existing VPC name (a-z 0-9 -) or empty")

    acc = catalog.ACCELERATORS[accelerator]
    return ClusterSpec(
        stack=stack,
        project=project,
        zones=zones,
        zone=zone,
        region=region_of(zone),
        machine_type=mt.name,
        series=mt.series,
        accelerator=accelerator,
        gpus_per_node=gpus,
        gpu_model=acc.model,
        gpu_memory_gb=acc.memory_gb,
        vcpus=mt.vcpus,
        memory_gb=mt.memory_gb,
        nodes=nodes,
        spot=spot,
        max_run_duration_s=ttl,
        image_family=image_family,
        image_project=image_project,
        boot_disk_gb=disk_gb,
        boot_disk_type=disk_type,
        ssh_user=ssh_user,
        ssh_public_key=_ssh_public_key(config),
        ssh_source_ranges=_source_ranges(config, anywhere),
        allow_ssh_from_anywhere=anywhere,
        public_ip=public_ip,
        placement=placement,
        network=network,
        labels=MappingProxyType(_labels(config)),
        gvnic=mt.gvnic,
        attach_gpus=attach,
    )


# --------------------------------------------------------------------------------------------
# Before `pulumi up`
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MissingSetting:
    """A setting `pulumi up` needs that the stack does not have yet, and how to set it."""

    key: str
    why: str
    command: str


def missing_settings(spec: ClusterSpec) -> list[MissingSetting]:
    """What must still be set before `pulumi up`, in the order to set it."""
    s = spec.stack
    out = []
    if spec.project is None:
        out.append(
            MissingSetting(
                GCP_PROJECT_KEY,
                "the GCP project to create the VMs in",
                f"pulumi config set gcp:project YOUR_PROJECT_ID --stack {s}",
            )
        )
    if spec.ssh_public_key is None:
        out.append(
            MissingSetting(
                NS + "sshPublicKey",
                "the SSH key pair for the nodes (the private half is stored as a secret)",
                f"gputrain keygen --stack {s}",
            )
        )
    if not spec.ssh_source_ranges:
        out.append(
            MissingSetting(
                NS + "sshSourceRanges",
                "where SSH may come from (your address/32)",
                f"pulumi config set --path 'gputrain:sshSourceRanges[0]' YOUR.IP.ADD.RESS/32 --stack {s}",
            )
        )
    return out


def require_deployable(spec: ClusterSpec) -> None:
    """Refuse, with one line, a spec that `plan` accepts but `pulumi up` cannot deploy."""
    missing = missing_settings(spec)
    if missing:
        m = missing[0]
        raise SpecError(f"{m.key} is not set ({m.why}); run: {m.command}")


def spec_warnings(spec: ClusterSpec) -> list[str]:
    """Things that are allowed but worth knowing before money is spent."""
    out = []
    mt = catalog.MACHINE_TYPES[spec.machine_type]
    if spec.series == "g2" and spec.image_project == DEFAULT_IMAGE_PROJECT:
        out.append(
            "G2 on a Deep Learning VM image: the 2026 docs say unsupported, public scripts say it "
            "works; if boot fails, use imageProject ubuntu-os-accelerator-images"
        )
    known = catalog.KNOWN_ZONES.get(spec.accelerator)
    if known is not None:
        unknown = [z for z in spec.zones if z not in known]
        if unknown:
            out.append(
                f"{', '.join(unknown)} not among the zones known to offer {spec.accelerator} "
                f"({', '.join(sorted(known))}); the preflight checks"
            )
    if mt.nics != "1" and spec.nodes > 1:
        out.append(
            f"{mt.name} reaches full inter-node bandwidth with {mt.nics}; gputrain attaches one "
            "gVNIC, so multi-node traffic runs over TCP on that NIC"
        )
    if not spec.price.confirmed:
        out.append(
            f"the price of {mt.name} is derived ({spec.price.basis}), not a published figure"
        )
    return out
