"""The rules of single stack keys, on the typed settings of infra/schema.py: each returns a
checked value or raises a one-line SpecError naming the key, the bad value and what is allowed,
and check_keys applies them all once (infra/spec.py keeps the rules between keys). Checker is
that one-line form, which the hosts file (scripts/targets/hosts_file.py) words its own way.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from infra.base.errors import GputrainError, UserError
from infra.schema import (
    BACKEND_ONLY_KEYS,
    BACKENDS,
    DEFAULT_IMAGE_FAMILY,
    DEFAULT_IMAGE_PROJECT,
    DEFAULTS,
    GCP_PROJECT_KEY,
    NS,
    PROJECT_LABEL,
    STACK_LABEL,
    SpecError,
    StackSettings,
)


def whole_range(key: str) -> tuple[int, int, str]:
    """(lo, hi, unit) of a whole-number key that declares its range."""
    extra = StackSettings.model_fields[key].json_schema_extra
    assert isinstance(extra, dict)
    lo, hi, unit = cast(list[Any], extra["range"])
    return int(lo), int(hi), str(unit)


#: (field, bad value, what is allowed) -> the one line the user reads; the stack config and a
#: hosts file (scripts/targets/hosts_file.py) each word it their own way.
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
_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
              "ssh-rsa")  # fmt: skip


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
            try:  # 1.2.3.5/24: the network, or the one address, was meant
                lax = ipaddress.ip_network(r, strict=False)
                why = f"host bits set (the network: {lax}; the address: {r.split('/')[0]}/32); "
            except ValueError:
                why = ""
            raise CHECK.fail(
                "sshSourceRanges", r, why + "allowed: IPv4 CIDRs like 203.0.113.7/32"
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
        if k in out:  # the list form: `[team=ml, team=dl]` would keep the last silently
            raise CHECK.fail(
                "labels", f"{k}={out[k]}, {k}={v}", "given twice; allowed: each label key once"
            )
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


# ---- autodown: how long after the job's end, with the controller silent, the head's watchdog
# deletes the VMs (infra/autodown.py: the bound `plan` states, the nodes' IAM condition) ----------

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


def read_autodown(text: str, ttl_s: int, given: bool) -> int | None:
    """The stack's `autodown`: one the stack sets must come before the TTL, however it is spelt
    (10m, 600s); the default, unset, may not, on a stack whose TTL is at most 10m: the TTL then
    deletes the VMs sooner still."""
    return parse_autodown(text, ttl_s=ttl_s if given else None)


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
    boot_disk_gb: int
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
    if existing_bucket and "bucketRetentionDays" in s.model_fields_set:
        raise CHECK.fail(  # its lifecycle rule goes on the stack's own bucket only
            "bucketRetentionDays",
            str(s.bucketRetentionDays),
            f"only used with the stack's own bucket; gputrain:bucket = {s.bucket!r} is an "
            "existing bucket, whose lifecycle rules stay its own: remove bucketRetentionDays",
        )
    return CheckedKeys(
        backend=chosen,
        ignored=ignored,
        settings=s,
        max_run_duration_s=ttl,
        boot_disk_gb=disk_gb,
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
