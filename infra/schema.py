"""The stack file's `gputrain:` settings declared once, as a typed model (pydantic v2): the YAML
shapes each key takes and its default, and the rules of single keys: each takes the typed settings
and returns a checked value or a one-line SpecError naming the key, the bad value and what is
allowed. stackfile.DEFAULTS, the load-time type check and the reference page's types come from
here; Pulumi.yaml declares the same keys for the Pulumi CLI (a test holds the two together) and
infra/spec.py keeps the rules between keys.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, cast
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictStr, ValidationError

from infra.base.errors import GputrainError, UserError

DEFAULT_IMAGE_FAMILY = "pytorch-2-9-cu129-ubuntu-2204-nvidia-580"
FALLBACK_IMAGE_FAMILY = "common-cu129-ubuntu-2204-nvidia-580"
DEFAULT_IMAGE_PROJECT = "deeplearning-platform-release"
#: Prebuilt PyTorch GPU training container for Vertex AI (pythonPackageSpec.executorImageUri).
#: The tag is the newest one the facts sheet and public 2025 job configs show (PyTorch 2.4,
#: Python 3.10, CUDA 12); newer tags and this one's end of availability are unverified, hence
#: the `executorImage` setting.
DEFAULT_EXECUTOR_IMAGE = "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest"


def _whole(value: Any) -> Any:
    """A YAML integer, or the ASCII digits `pulumi config set` writes as a string."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        return int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("not a whole number")
    return value


def _flag(value: Any) -> Any:
    """A YAML boolean, or true/false as `pulumi config set` writes it."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise ValueError("not true or false")
    return value


Whole = Annotated[int, BeforeValidator(_whole)]
Flag = Annotated[bool, BeforeValidator(_flag)]
Texts = list[StrictStr]

#: What each kind of value allows, as `plan`'s one-line errors and the reference page say it.
ALLOWED: dict[str, str] = {
    "text": "a string",
    "whole": "a whole number (ASCII digits)",
    "flag": "true or false",
    "texts": "a list of strings",
    "text-or-texts": "a string or a list of strings",
    "labels": "a list of key=value strings or a mapping",
    "mapping": "a mapping of setting: value",
    "datasets": "a mapping of NAME: gs://BUCKET/PATH (or NAME: {uri: ..., mode: ...})",
}


def _kind(name: str, lo: int | None = None, hi: int | None = None, unit: str = "") -> Any:
    """A field's kind, read back by allowed() and the reference page; a whole number's range
    (lo..hi, unit) is what the string loader names when the text is not a number."""
    return {"kind": name} if lo is None else {"kind": name, "range": [lo, hi, unit]}


class StackSettings(BaseModel):
    """Every `gputrain:` key of a stack file, its YAML shape and its default (None: unset)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: StrictStr | Texts = Field("L4:1", json_schema_extra=_kind("text-or-texts"))
    zones: Texts = Field([], json_schema_extra=_kind("texts"))
    regions: Texts = Field([], json_schema_extra=_kind("texts"))
    zone: StrictStr = Field("", json_schema_extra=_kind("text"))
    candidate: StrictStr = Field("", json_schema_extra=_kind("text"))
    machineType: StrictStr = Field("", json_schema_extra=_kind("text"))
    gpuType: StrictStr = Field("", json_schema_extra=_kind("text"))
    gpuCount: Whole = Field(0, json_schema_extra=_kind("whole"))
    nodes: Whole = Field(0, json_schema_extra=_kind("whole", 1, 64))
    spot: Flag | None = Field(None, json_schema_extra=_kind("flag"))
    capacity: StrictStr | Texts = Field("", json_schema_extra=_kind("text-or-texts"))
    reservation: StrictStr = Field("", json_schema_extra=_kind("text"))
    reservationBound: StrictStr = Field("", json_schema_extra=_kind("text"))
    capacityInUse: StrictStr = Field("", json_schema_extra=_kind("text"))
    waitForCapacity: StrictStr = Field("", json_schema_extra=_kind("text"))
    maxRunDuration: StrictStr = Field("6h", json_schema_extra=_kind("text"))
    imageFamily: StrictStr = Field(DEFAULT_IMAGE_FAMILY, json_schema_extra=_kind("text"))
    imageProject: StrictStr = Field(DEFAULT_IMAGE_PROJECT, json_schema_extra=_kind("text"))
    bootDiskGb: Whole = Field(200, json_schema_extra=_kind("whole", 50, 65536, " GB"))
    bootDiskType: StrictStr = Field("", json_schema_extra=_kind("text"))
    sshUser: StrictStr = Field("gputrain", json_schema_extra=_kind("text"))
    sshPublicKey: StrictStr = Field("", json_schema_extra=_kind("text"))
    sshPrivateKey: StrictStr = Field("", json_schema_extra=_kind("text"))
    sshSourceRanges: Texts = Field([], json_schema_extra=_kind("texts"))
    allowSshFromAnywhere: Flag = Field(False, json_schema_extra=_kind("flag"))
    publicIp: StrictStr = Field("head", json_schema_extra=_kind("text"))
    placement: StrictStr = Field("auto", json_schema_extra=_kind("text"))
    network: StrictStr = Field("", json_schema_extra=_kind("text"))
    labels: Texts | dict[StrictStr, StrictStr | int | None] = Field(
        [], json_schema_extra=_kind("labels")
    )
    bucket: StrictStr = Field("", json_schema_extra=_kind("text"))
    bucketRetentionDays: Whole = Field(30, json_schema_extra=_kind("whole", 1, 3650, " days"))
    backend: StrictStr = Field("gce", json_schema_extra=_kind("text"))
    executorImage: StrictStr = Field(DEFAULT_EXECUTOR_IMAGE, json_schema_extra=_kind("text"))
    chief: dict[StrictStr, Any] | None = Field(None, json_schema_extra=_kind("mapping"))
    reductionServer: dict[StrictStr, Any] | None = Field(None, json_schema_extra=_kind("mapping"))
    vertexJobSpec: StrictStr = Field("", json_schema_extra=_kind("text"))
    restartJobOnWorkerRestart: Flag = Field(False, json_schema_extra=_kind("flag"))
    gpuDirect: StrictStr = Field("auto", json_schema_extra=_kind("text"))
    subnetRange: StrictStr = Field("10.42.0.0/16", json_schema_extra=_kind("text"))
    localSsdCount: Whole = Field(0, json_schema_extra=_kind("whole", 0, 24))
    data: dict[StrictStr, StrictStr | dict[StrictStr, Any]] | None = Field(
        None, json_schema_extra=_kind("datasets")
    )
    setup: StrictStr = Field("", json_schema_extra=_kind("text"))
    secrets: Texts = Field([], json_schema_extra=_kind("texts"))
    image: StrictStr = Field("", json_schema_extra=_kind("text"))
    build: StrictStr = Field("", json_schema_extra=_kind("text"))
    stallTimeout: StrictStr = Field("", json_schema_extra=_kind("text"))
    autodown: StrictStr = Field("10m", json_schema_extra=_kind("text"))
    recover: StrictStr = Field("auto", json_schema_extra=_kind("text"))
    reconcileEvery: StrictStr = Field("2m", json_schema_extra=_kind("text"))
    notify: Texts = Field([], json_schema_extra=_kind("texts"))
    billingExport: StrictStr = Field("", json_schema_extra=_kind("text"))
    budget: StrictStr = Field("", json_schema_extra=_kind("text"))
    maxHourlyCost: StrictStr = Field("", json_schema_extra=_kind("text"))
    billingBudget: dict[StrictStr, Any] | None = Field(None, json_schema_extra=_kind("mapping"))


def kind(key: str) -> str:
    """The kind of value a key takes (a key of ALLOWED)."""
    extra = StackSettings.model_fields[key].json_schema_extra
    assert isinstance(extra, dict)
    return str(extra["kind"])


def allowed(key: str) -> str:
    """What a key allows, in words (the reference page and the one-line errors)."""
    return ALLOWED[kind(key)]


def config_string(value: Any) -> str:
    """A YAML value the way the Pulumi CLI hands it to the program (strings all the way)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return "" if value is None else str(value)


#: Every key with its default as the CLI would pass it (a string).
DEFAULTS: dict[str, str] = {
    name: config_string(field.default) for name, field in StackSettings.model_fields.items()
}


def config_strings(values: Mapping[str, Any]) -> dict[str, str]:
    """YAML values (qualified keys) the way the Pulumi CLI hands them to the program."""
    return {key: config_string(value) for key, value in values.items()}


class SettingTypeError(ValueError):
    """A value whose YAML shape the key does not take: (key, value, what is allowed)."""

    def __init__(self, key: str, value: Any, allowed_text: str, line: str = "") -> None:
        super().__init__(key, value, allowed_text)
        self.key, self.value, self.allowed = key, value, allowed_text
        self.line = line  # the whole one-line message, where the kind words it its own way


def _known(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The values the model takes of a `gputrain:` mapping (unqualified keys): keys it does not
    know are left to parse_spec's "did you mean" line, unset (null) values to their defaults,
    and `secure:` values out (only the CLI decrypts them)."""
    return {
        k: v
        for k, v in settings.items()
        if k in StackSettings.model_fields
        and v is not None
        and not (isinstance(v, dict) and "secure" in v and k == "sshPrivateKey")
    }


def load_settings(settings: Mapping[str, Any]) -> StackSettings:
    """The typed settings, validated once: SettingTypeError for the first value whose YAML
    shape its key does not take (`setup: 5`, `secrets: NAME`, `nodes: ٣`)."""
    known = _known(settings)
    try:
        return StackSettings.model_validate(known)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = str(first["loc"][0])
        raise SettingTypeError(key, known[key], allowed(key)) from None


def whole_range(key: str) -> tuple[int, int, str]:
    """(lo, hi, unit) of a whole-number key that declares its range."""
    extra = StackSettings.model_fields[key].json_schema_extra
    assert isinstance(extra, dict)
    lo, hi, unit = cast(list[Any], extra["range"])
    return int(lo), int(hi), str(unit)


# ---- the keys' names and the one-line error form ------------------------------------------------

PROJECT = "gputrain"
NS = f"{PROJECT}:"
GCP_PROJECT_KEY = "gcp:project"
STACK_LABEL = "gputrain-stack"  # on every labelled resource of a stack: how sweeps find them
PROJECT_LABEL = "gputrain-project"

BACKENDS = ("gce", "vertex")

#: Keys only one backend reads. On the other they are ignored: not validated, not required, and
#: `plan` names them (Vertex AI runs no VMs of ours: no SSH, image, disk or network to set).
BACKEND_ONLY_KEYS: dict[str, tuple[str, ...]] = {
    "gce": (
        "sshUser",
        "sshPublicKey",
        "sshPrivateKey",
        "sshSourceRanges",
        "allowSshFromAnywhere",
        "publicIp",
        "placement",
        "network",
        "imageFamily",
        "imageProject",
        "bootDiskGb",
        "bootDiskType",
        "gpuDirect",
        "subnetRange",
        "billingBudget",
        "localSsdCount",
        "stallTimeout",
        "autodown",
        "recover",
        "reconcileEvery",
    ),
    "vertex": (
        "executorImage",
        "chief",
        "reductionServer",
        "vertexJobSpec",
        "restartJobOnWorkerRestart",
    ),
}


class SpecError(UserError):
    """A stack setting is invalid or missing; nothing has been declared or created."""


# Describe: (field, bad value, what is allowed) -> the one line the user reads. The stack config,
# a hosts file (scripts/targets/hosts_file.py) each word it their own way.
#: (field, bad value, what is allowed) -> the one line the user reads.
Describe = Callable[[str, Any, str], str]


@dataclass(frozen=True)
class Checker:
    """Raises `error(describe(field, value, allowed))` for the first value that does not fit."""

    describe: Describe
    error: Callable[[str], GputrainError]

    def fail(self, field: str, value: Any, allowed: str) -> GputrainError:
        """The error to raise for one bad value (returned, so callers write `raise c.fail(...)`)."""
        return self.error(self.describe(field, value, allowed))

    def check(self, ok: bool, field: str, value: Any, allowed: str) -> None:
        if not ok:
            raise self.fail(field, value, allowed)

    def typed(self, field: str, value: Any, kind: type | tuple[type, ...], allowed: str) -> Any:
        """`value` is a `kind` (a bool is never a number) and not empty."""
        is_bool = isinstance(value, bool) and bool not in (
            kind if isinstance(kind, tuple) else (kind,)
        )
        empty = value == "" or (isinstance(value, list | Mapping) and not value)
        self.check(isinstance(value, kind) and not is_bool and not empty, field, value, allowed)
        return value

    def integer(self, field: str, value: Any, lo: int, hi: int, allowed: str) -> int:
        """A whole number (not a bool, not a string) in lo..hi."""
        ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
        self.check(ok, field, value, allowed)
        return int(value)

    def matches(self, field: str, value: Any, pattern: re.Pattern[str], allowed: str) -> str:
        self.check(isinstance(value, str) and bool(pattern.match(value)), field, value, allowed)
        return str(value)

    def one_of(self, field: str, value: Any, options: Collection[Any], allowed: str = "") -> Any:
        self.check(value in options, field, value, allowed or f"allowed: {', '.join(options)}")
        return value

    def known_keys(
        self, mapping: Mapping[str, Any], keys: Collection[str], field: Callable[[str], str]
    ) -> None:
        """Every key of `mapping` is one of `keys`; the first stranger is named with its value."""
        unknown = [k for k in mapping if k not in keys]
        if unknown:
            k = unknown[0]
            raise self.fail(field(k), mapping[k], f"allowed keys: {', '.join(keys)}")


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


#: "gputrain:nodes = '0': allowed: 1..64" — the stack config's way of saying what is wrong.
CHECK = Checker(
    lambda key, value, allowed: f"{key if ':' in key else NS + key} = {_shown(value)!r}: {allowed}",
    SpecError,
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


# ---- stallTimeout (and --stall-timeout): how long no rank may make a training step before
# gputrain dumps the stacks and stops the job ---------------------------------------------------

MIN_STALL_S = 30
MAX_STALL_S = 7 * 86400
AUTO_FLOOR_S = 600.0  # the default: the larger of 10 min and 10 x the slowest step seen
AUTO_STEPS = 10
STALL_ALLOWED = (
    "allowed: empty (auto: max(10m, 10 x the slowest step)), or 30s to 7d like 90s, 15m, 1h"
)


def parse_stall_timeout(text: str) -> int | None:
    """Seconds, or None for the automatic timeout ("" or "auto"); ValueError(what is allowed)
    for a malformed value or one outside 30 s..7 d. A bare number is seconds."""
    raw = text.strip()
    if raw in ("", "auto"):
        return None
    try:
        seconds = int(raw) if raw.isascii() and raw.isdigit() else parse_duration(raw)
    except ValueError:
        raise ValueError(STALL_ALLOWED) from None
    if not MIN_STALL_S <= seconds <= MAX_STALL_S:
        raise ValueError(STALL_ALLOWED)
    return seconds


def effective_timeout(explicit_s: float | None, slowest_step_s: float | None) -> float:
    """The timeout in force: the explicit one, else max(10 min, 10 x the slowest step)."""
    if explicit_s is not None:
        return explicit_s
    return max(AUTO_FLOOR_S, AUTO_STEPS * (slowest_step_s or 0.0))


def read_stall_timeout(raw: str) -> int | None:
    """The stack's `stallTimeout`; SpecError (one line naming the key) when it is not allowed."""
    try:
        return parse_stall_timeout(raw)
    except ValueError as e:
        raise CHECK.fail("stallTimeout", raw, str(e)) from None


# ---- notify (stack key, hosts-file key, --notify): webhook URLs, http(s) only, and secret — a
# webhook URL is its own credential, so messages show only `scheme://host/…` ---------------------

NOTIFY_ALLOWED = (
    "allowed: http://HOST/... or https://HOST/... (a Slack/Discord-style incoming webhook)"
)


def redact(url: str) -> str:
    """`scheme://host/…`: enough to tell webhooks apart, never a user, password, path or query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # a malformed IPv6 address: nothing of it is shown
        return "…"
    if parts.scheme and host:
        return f"{parts.scheme}://{host}/…"
    return f"{parts.scheme}:…" if parts.scheme.isalpha() else "…"


def check_urls(urls: Sequence[object], setting: str) -> tuple[str, ...]:
    """Every URL http(s) with a host; one line naming the setting (the URL redacted) if not."""
    for i, url in enumerate(urls):
        where = setting if len(urls) == 1 else f"{setting}[{i}]"
        if not isinstance(url, str):
            raise UserError(f"{where}: not a URL; {NOTIFY_ALLOWED}")
        try:
            parts = urlsplit(url.strip())
            host, _ = parts.hostname, parts.port
        except ValueError:  # "http://[::1/x", a port that is no number
            raise UserError(
                f"{where} {redact(url)}: not a valid URL (its host or port); {NOTIFY_ALLOWED}"
            ) from None
        if parts.scheme not in ("http", "https") or not host:
            raise UserError(f"{where} {redact(url)}: not an http(s) URL; {NOTIFY_ALLOWED}")
        if "@" in parts.netloc:  # user:password@ would be sent to every hop; say neither
            raise UserError(
                f"{where} {redact(url)}: a user or password in the URL is not allowed; {NOTIFY_ALLOWED} "
                "(the webhook's own secret goes in its path or query)"
            )
    return tuple(str(u).strip() for u in urls)


def parse_notify(raw: str, setting: str) -> tuple[str, ...]:
    """The stack key as the CLI passes it: a JSON list of strings (or one URL)."""
    raw = raw.strip()
    if not raw:
        return ()
    if not raw.startswith("["):
        return check_urls([raw], setting)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise UserError(f"{setting}: not a list of URLs; {NOTIFY_ALLOWED}") from None
    if not isinstance(value, list):
        raise UserError(f"{setting}: not a list of URLs; {NOTIFY_ALLOWED}")
    return check_urls(value, setting)


# ---- autodown: how long after the job's end, with the controller silent, the head's watchdog
# deletes the VMs (infra/autodown.py: the bound `plan` states, the nodes' IAM condition) ----------

AUTODOWN_DEFAULT = "10m"
AUTODOWN_MIN_S = 60  # a shorter silence is a blip of the network, not a controller that went away
AUTODOWN_ALLOWED = "allowed: off or a duration of at least 1m, like 10m, 30m, 1h (units d/h/m/s)"


def parse_autodown(
    text: str, setting: str = "gputrain:autodown", ttl_s: int | None = None
) -> int | None:
    """Seconds of silence after the job's end before the VMs are deleted; None for `off`. With
    the VMs' TTL (maxRunDuration): an autodown the TTL always comes first is refused, not
    promised."""
    value = text.strip()
    if value.lower() in ("off", "false", "none"):
        return None
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise SpecError(f"{setting} {text!r}: {AUTODOWN_ALLOWED}") from None
    if seconds < AUTODOWN_MIN_S:
        raise SpecError(f"{setting} {text!r}: below 1m; {AUTODOWN_ALLOWED}")
    if ttl_s is not None and seconds >= ttl_s:
        ttl = format_duration(ttl_s)
        raise SpecError(
            f"{setting} {text!r}: not below gputrain:maxRunDuration ({ttl}), which deletes the "
            f"VMs first; allowed: off or a duration from 1m to below {ttl}"
        )
    return seconds


def read_autodown(text: str, ttl_s: int) -> int | None:
    """The stack's `autodown`: one the user set must come before the TTL (the default may not,
    on a stack whose TTL is at most 10m: the TTL then deletes the VMs sooner still)."""
    return parse_autodown(text, ttl_s=None if text.strip() == AUTODOWN_DEFAULT else ttl_s)


# ---- build: a Dockerfile gputrain builds into the stack's registry (infra/image_build.py) ----------


def build_setting(build: str, image: str) -> str:
    """The `build` key, checked: a Dockerfile path, never beside `image` (one line, no build)."""
    build = build.strip()
    if not build:
        return ""
    if image.strip():
        raise SpecError(
            f"{NS}build = {build!r} and {NS}image = {image.strip()!r} are both set; set either "
            "build (a Dockerfile gputrain builds and pushes) or image (one that exists), not both"
        )
    if any(c in build for c in "\n\r\0") or build.endswith("/"):
        raise SpecError(f"{NS}build = {build!r}: allowed: the path of a Dockerfile")
    if build.startswith(("/", "~")) or ".." in build.replace("\\", "/").split("/"):
        raise SpecError(
            f"{NS}build = {build!r}: allowed: the path of a Dockerfile inside the project, "
            "relative to it, without '..' (its directory is the build context, sent as a whole)"
        )
    return build


# ---- every single key's rule, applied once --------------------------------------------------------

MIN_RUN_S = 10 * 60
MAX_RUN_S = 120 * 24 * 3600
_PROJECT_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_IMAGE_FAMILY_RE = re.compile(r"^[a-z][-a-z0-9]{0,62}$")
_IMAGE_PROJECT_RE = re.compile(r"^[a-z][-a-z0-9.:]{4,62}$")
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_NETWORK_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class CheckedKeys:
    """The values of the keys whose rules need no other key, each checked: what
    infra/spec.py builds the ClusterSpec on, with the rules between keys."""

    backend: Backend
    ignored: tuple[str, ...]  # the other backend's keys the stack sets (not read)
    settings: StackSettings  # without the other backend's keys: their defaults stand in
    max_run_duration_s: int
    image_family: str
    image_project: str
    boot_disk_gb: int
    ssh_user: str
    public_ip: Literal["head", "all", "none"]
    placement: str  # auto, compact or none: infra/spec.py weighs it against the machine
    network: str | None
    existing_bucket: str | None
    bucket_prefix: str
    ssh_public_key: str | None
    ssh_source_ranges: tuple[str, ...]
    labels: dict[str, str]
    bucket_retention_days: int
    stall_timeout_s: int | None
    notify: tuple[str, ...]
    build: str
    executor_image: str
    local_ssd_count: int


def check_keys(typed: StackSettings, project: str | None) -> CheckedKeys:
    """Every rule of one key, once, in the order `plan` reports them (the key, the bad value,
    what is allowed: one SpecError line); the other backend's keys are not read."""
    chosen, ignored, s = backend(typed)
    if project is not None:
        CHECK.matches(
            GCP_PROJECT_KEY, project, _PROJECT_RE, "allowed: a GCP project ID (6-30 of a-z 0-9 -)"
        )
    try:
        ttl = parse_duration(s.maxRunDuration)
    except ValueError:
        raise CHECK.fail(
            "maxRunDuration", s.maxRunDuration, "allowed: durations like 90m, 6h, 2d, 1h30m"
        ) from None
    if not MIN_RUN_S <= ttl <= MAX_RUN_S:
        raise CHECK.fail("maxRunDuration", s.maxRunDuration, "allowed: 10m to 120d")
    CHECK.matches(
        "imageFamily",
        s.imageFamily,
        _IMAGE_FAMILY_RE,
        "allowed: an image family name, e.g. " + DEFAULT_IMAGE_FAMILY,
    )
    CHECK.matches(
        "imageProject",
        s.imageProject,
        _IMAGE_PROJECT_RE,
        "allowed: a project ID, e.g. " + DEFAULT_IMAGE_PROJECT,
    )
    disk_gb = in_range(s, "bootDiskGb")
    CHECK.check(
        bool(_USER_RE.match(s.sshUser)) and s.sshUser != "root",
        "sshUser",
        s.sshUser,
        "allowed: a Linux user name (a-z 0-9 _ -, not root)",
    )
    public_ip = choice("publicIp", s.publicIp, ("head", "all", "none"))
    if public_ip == "none":
        # No node would be reachable from outside the VPC: refuse before anything is billed.
        raise CHECK.fail(
            "publicIp",
            public_ip,
            "no node would be reachable (the controller runs outside the VPC and no jump host "
            "is supported); allowed: head (workers via the head) or all",
        )
    placement = choice("placement", s.placement, ("auto", "compact", "none"))
    network = s.network or None
    if network is not None:
        CHECK.matches(
            "network", network, _NETWORK_RE, "allowed: an existing VPC name (a-z 0-9 -) or empty"
        )
    existing_bucket, bucket_prefix = bucket(s)
    return CheckedKeys(
        backend=chosen,
        ignored=ignored,
        settings=s,
        max_run_duration_s=ttl,
        image_family=s.imageFamily,
        image_project=s.imageProject,
        boot_disk_gb=disk_gb,
        ssh_user=s.sshUser,
        public_ip=cast(Literal["head", "all", "none"], public_ip),
        placement=placement,
        network=network,
        existing_bucket=existing_bucket,
        bucket_prefix=bucket_prefix,
        ssh_public_key=ssh_public_key(s),
        ssh_source_ranges=source_ranges(s, s.allowSshFromAnywhere),
        labels=labels(s),
        bucket_retention_days=in_range(s, "bucketRetentionDays"),
        stall_timeout_s=read_stall_timeout(s.stallTimeout) if chosen == "gce" else None,
        notify=check_urls(s.notify, f"{NS}notify"),
        build=build_setting(s.build, s.image),
        executor_image=executor_image(s),
        local_ssd_count=in_range(s, "localSsdCount"),
    )
