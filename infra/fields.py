"""The rules of single stack settings: each takes the typed settings (infra/schema.py) and returns
a checked value or a one-line SpecError naming the key, the bad value and what is allowed.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from typing import Any, Literal, cast

from infra import catalog
from infra.base.validate import Checker
from infra.schema import StackSettings, whole_range
from infra.stackfile import (
    BACKEND_ONLY_KEYS,
    BACKENDS,
    DEFAULTS,
    PROJECT_LABEL,
    STACK_LABEL,
    SpecError,
    qualify,
)


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


#: "gputrain:nodes = '0': allowed: 1..64" — the stack config's way of saying what is wrong.
CHECK = Checker(
    lambda key, value, allowed: f"{qualify(key)} = {_shown(value)!r}: {allowed}", SpecError
)


# ---- durations ------------------------------------------------------------------------------

#: ASCII digits only: `\d` (and int()) would also take other scripts' digits, e.g. "٣h".
_DURATION_RE = re.compile(r"^(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$")
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


# ---- generic readers --------------------------------------------------------------------------


def choice(key: str, value: str, options: tuple[str, ...]) -> str:
    """A text setting that must be one of `options`."""
    if value not in options:
        raise CHECK.fail(key, value, f"allowed: {', '.join(options)}")
    return value


def in_range(s: StackSettings, key: str) -> int:
    """A whole-number setting within the range its field declares (infra/schema.py)."""
    value: int = getattr(s, key)
    lo, hi, unit = whole_range(key)
    if not lo <= value <= hi:
        raise CHECK.fail(key, str(value), f"allowed: {lo}..{hi}{unit}")
    return value


# ---- the settings with rules of their own ---------------------------------------------------

Backend = Literal["gce", "vertex"]


def backend(s: StackSettings) -> tuple[Backend, tuple[str, ...], StackSettings]:
    """(the backend, the other backend's keys the stack sets, the settings without them).
    The other backend's keys are not read: their defaults stand in, and `plan` names them."""
    chosen = cast(Backend, choice("backend", s.backend, BACKENDS))
    fields = StackSettings.model_fields
    other = [
        k for k in fields for b, keys in BACKEND_ONLY_KEYS.items() if b != chosen and k in keys
    ]
    ignored = tuple(k for k in other if getattr(s, k) != fields[k].default)
    return chosen, ignored, s.model_copy(update={k: fields[k].default for k in other})


_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
RESERVED_LABELS = (STACK_LABEL, PROJECT_LABEL)
_KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
)


def zones(s: StackSettings, default: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """(the zones in preference order, the zone to use now); `default` when none are listed."""
    listed = list(s.zones) or list(default)
    if not listed:
        raise CHECK.fail(
            "zones", "[]", "allowed: one or more zones of one region, e.g. [us-central1-a]"
        )
    for z in listed:
        if not catalog.ZONE_NAME.match(z):
            raise CHECK.fail("zones", z, "allowed: zone names like us-central1-a")
    regions = sorted({catalog.region_of(z) for z in listed})
    if len(regions) > 1:
        raise CHECK.fail(
            "zones", ",".join(listed), f"all zones must be in one region, got {', '.join(regions)}"
        )
    if len(set(listed)) != len(listed):
        raise CHECK.fail("zones", ",".join(listed), "each zone may appear once")
    zone = s.zone or listed[0]
    if zone not in listed:
        raise CHECK.fail("zone", zone, f"allowed: one of zones ({', '.join(listed)}) or empty")
    return tuple(listed), zone


# registry host[:port]/path[:tag | @sha256:digest], as Artifact Registry and gcr.io name images
_IMAGE_URI_RE = re.compile(
    r"^[a-z0-9.-]+(?::\d+)?/[a-z0-9._-]+(?:/[a-z0-9._-]+)*(?::\w[\w.-]{0,127}|@sha256:[0-9a-f]{64})?$"
)


def executor_image(s: StackSettings) -> str:
    """Vertex's training container: an image reference, never a shell word or a gs:// path."""
    image = s.executorImage
    CHECK.matches(
        "executorImage",
        image,
        _IMAGE_URI_RE,
        "allowed: a container image like " + DEFAULTS["executorImage"],
    )
    return image


def ssh_public_key(s: StackSettings) -> str | None:
    raw = s.sshPublicKey
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
        raise CHECK.fail(
            "sshPublicKey",
            shown,
            f"allowed: an OpenSSH public key line ({', '.join(_KEY_TYPES)} AAAA...)",
        )
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except binascii.Error:
        raise CHECK.fail("sshPublicKey", shown, "the key data is not base64") from None
    if blob[4 : 4 + len(parts[0])] != parts[0].encode():
        raise CHECK.fail("sshPublicKey", shown, f"the key data does not encode a {parts[0]} key")
    return raw


def source_ranges(s: StackSettings, anywhere: bool) -> tuple[str, ...]:
    out = []
    for r in s.sshSourceRanges:
        try:
            net = ipaddress.ip_network(r, strict=True)
        except ValueError:
            raise CHECK.fail(
                "sshSourceRanges", r, "allowed: IPv4 CIDRs like 203.0.113.7/32"
            ) from None
        if net.version != 4:
            raise CHECK.fail(
                "sshSourceRanges", r, "allowed: IPv4 CIDRs only (the nodes have IPv4 addresses)"
            )
        if net.prefixlen == 0 and not anywhere:
            raise CHECK.fail(
                "sshSourceRanges",
                r,
                "SSH open to the whole internet is refused; use your address/32, "
                "or set gputrain:allowSshFromAnywhere true",
            )
        out.append(str(net))
    covered = covered_addresses(out)
    if covered > MAX_SSH_ADDRESSES and not anywhere:
        raise CHECK.fail(
            "sshSourceRanges",
            ", ".join(out),
            f"together these cover {covered:,} addresses, more than a /8 "
            f"({MAX_SSH_ADDRESSES:,}); narrow them to your address/32, or set "
            "gputrain:allowSshFromAnywhere true",
        )
    return tuple(out)


MAX_SSH_ADDRESSES = 2**24  # a /8: a wider union of SSH sources needs allowSshFromAnywhere


IPV4_ADDRESSES = 2**32


def covered_addresses(ranges: list[str] | tuple[str, ...]) -> int:
    """How many IPv4 addresses the union of these CIDRs covers (overlaps counted once)."""
    nets = [ipaddress.IPv4Network(r) for r in ranges]
    return sum(n.num_addresses for n in ipaddress.collapse_addresses(nets))


def whole_internet(ranges: list[str] | tuple[str, ...]) -> bool:
    """The ranges together cover every IPv4 address (one /0, or halves such as two /1s)."""
    return bool(ranges) and covered_addresses(ranges) == IPV4_ADDRESSES


def labels(s: StackSettings) -> dict[str, str]:
    pairs: list[tuple[str, str]] = []
    if isinstance(s.labels, dict):
        pairs = [(str(k), "" if v is None else str(v)) for k, v in s.labels.items()]
    else:
        for item in s.labels:
            if "=" not in item:
                raise CHECK.fail("labels", item, "allowed: key=value strings")
            k, v = item.split("=", 1)
            pairs.append((k.strip(), v.strip()))
    out: dict[str, str] = {}
    for k, v in pairs:
        if not _LABEL_KEY_RE.match(k):
            raise CHECK.fail(
                "labels", k, "label keys: lowercase letter first, then a-z 0-9 _ - (max 63)"
            )
        if not _LABEL_VALUE_RE.match(v):
            raise CHECK.fail("labels", f"{k}={v}", "label values: a-z 0-9 _ - only (max 63)")
        if k in RESERVED_LABELS:
            raise CHECK.fail("labels", k, f"{', '.join(RESERVED_LABELS)} are set by gputrain")
        out[k] = v
    if len(out) > 60:
        raise CHECK.fail("labels", f"{len(out)} labels", "allowed: at most 60")
    return out


def gpus(s: StackSettings, mt: catalog.MachineType) -> tuple[str, int, bool]:
    """(accelerator, count, attach) for the machine type, validating gpuType/gpuCount."""
    gpu_type_raw, count = s.gpuType, s.gpuCount
    count_raw = str(count)
    gpu_type = catalog.canonical_accelerator(gpu_type_raw) if gpu_type_raw else None
    if gpu_type_raw and gpu_type is None:
        raise CHECK.fail("gpuType", gpu_type_raw, f"allowed: {', '.join(catalog.ACCELERATORS)}")
    if mt.accelerator is not None:
        if gpu_type is not None and gpu_type != mt.accelerator:
            raise CHECK.fail(
                "gpuType",
                gpu_type_raw,
                f"{mt.name} brings {mt.accelerator}; leave gpuType empty or set that",
            )
        if count not in (0, mt.gpus):
            raise CHECK.fail(
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
        raise CHECK.fail(
            "gpuType", gpu_type_raw, f"{mt.name} (N1) can attach: {', '.join(catalog.N1_GPUS)}"
        )
    if count not in gpu.caps:
        raise CHECK.fail(
            "gpuCount", count_raw, f"allowed for {gpu_type}: {', '.join(map(str, gpu.counts))}"
        )
    max_vcpu, max_mem = gpu.caps[count]
    if mt.vcpus > max_vcpu or mt.memory_gb > max_mem:
        raise CHECK.fail(
            "machineType",
            mt.name,
            f"{count} x {gpu_type} allows at most {max_vcpu} vCPUs and {max_mem} GB "
            f"({mt.name} has {mt.vcpus} vCPUs, {mt.memory_gb:g} GB)",
        )
    return gpu_type, count, True


# ---- Cloud Storage ------------------------------------------------------------------------------

# GCS bucket names: 3-63 of a-z 0-9 - _ ., a letter or digit at both ends (the dotted form longer
# than 63 needs domain verification and is not accepted). The trainer checks its --checkpoint-uri
# with the same rule (trainer/storage.py): it runs on the nodes without infra/.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{1,61}[a-z0-9]$")
_BUCKET_RULE = (
    "allowed: gs://NAME[/PREFIX] with NAME 3-63 of a-z 0-9 - _ . starting and ending with a "
    "letter or digit, not starting with 'goog', without 'google'; or empty for the stack's own"
)


def bucket_name_problem(name: str) -> str | None:
    """Why `name` is not a valid GCS bucket name, or None. Pure."""
    if not _BUCKET_RE.match(name):
        return "not 3-63 of a-z 0-9 - _ . starting and ending with a letter or digit"
    if name.startswith("goog") or "google" in name:
        return "'goog' as prefix and 'google' anywhere are reserved by Google"
    if ".." in name or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        return "no '..' and not an IP address"
    return None


def bucket(s: StackSettings) -> tuple[str | None, str]:
    """(an existing bucket's name or None for the stack's own, the prefix: "" or "a/b/")."""
    raw = s.bucket
    if not raw:
        return None, ""
    name, _, prefix = raw.removeprefix("gs://").partition("/")
    parts = prefix.rstrip("/").split("/") if prefix.rstrip("/") else []
    if (
        not raw.startswith("gs://")
        or bucket_name_problem(name)
        or any(p in ("", ".", "..") or not p.isprintable() for p in parts)
    ):
        raise CHECK.fail("bucket", raw, _BUCKET_RULE)
    return name, "".join(p + "/" for p in parts)


def stack_bucket_name(stack: str, project: str) -> str:
    """The name of a stack's own bucket: `gputrain-<stack>-<project>` (unique: project IDs are),
    or with a hash of the project where that breaks a naming rule (length, 'google'). Pure."""
    import hashlib

    name = f"gputrain-{stack}-{project}"
    if bucket_name_problem(name):
        name = f"gputrain-{stack}-{hashlib.sha256(project.encode()).hexdigest()[:12]}"
    return name
