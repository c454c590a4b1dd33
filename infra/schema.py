"""The stack file's `gputrain:` settings declared once, as a typed model (pydantic v2): the YAML
shapes each key takes, its default and its name. stackfile.DEFAULTS, the load-time type check and
the reference page's types come from here; Pulumi.yaml declares the same keys for the Pulumi CLI
(a test holds the two together). infra/keys.py holds the rules of single keys, infra/spec.py
the rules between keys.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
)

from infra.base.errors import UserError

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
    "labels": "a list of key=value strings or a mapping of key: string or whole number",
    "mapping": "a mapping of setting: value",
    "datasets": "a mapping of NAME: gs://BUCKET/PREFIX (then :copy, the default, or :mount)",
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
    # StrictInt: a lax int took `spot: true` as the label spot=1
    labels: Texts | dict[StrictStr, StrictStr | StrictInt | None] = Field(
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
    data: dict[StrictStr, StrictStr] | None = Field(None, json_schema_extra=_kind("datasets"))
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


def scalar_text(value: bool | int | float) -> str | None:
    """A YAML boolean or number as the Pulumi CLI hands it to the program: its JSON text, a
    plain string (pulumi/pulumi sdk/go/common/resource/config/object.go, object.MarshalString:
    `case bool, int64, uint64, float64:` returns the value's JSON with object=false), so a
    `type: string` key takes `budget: 100` as "100". A float as Go's encoding/json writes it:
    1e3 is "1000", 1e-7 "1e-7"; None for NaN and infinities, which it refuses."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return None
    if value != 0 and not 1e-6 <= abs(value) < 1e21:  # Go's exponent form; Python's too
        return re.sub(r"e-0(\d)$", r"e-\1", repr(value))
    text = format(Decimal(repr(value)), "f")  # the shortest digits, no exponent
    return text.rstrip("0").rstrip(".") if "." in text else text


def config_string(value: Any) -> str:
    """A YAML value the way the Pulumi CLI hands it to the program (strings all the way)."""
    if isinstance(value, bool | int | float):
        return scalar_text(value) or str(value)
    if isinstance(value, list | dict):
        return json.dumps(value)
    return "" if value is None else str(value)


def names_nothing(value: Any) -> bool:
    """A text-or-texts value that is as good as unset: null, blank, or a list of blanks; so
    `gpus: ''` beside machineType is no second shape asked for."""
    texts = value if isinstance(value, list) else [value]
    return all(v is None or (isinstance(v, str) and not v.strip()) for v in texts)


def first_repeat(items: list[str]) -> str | None:
    """The first item a list names a second time (a zone, a capacity mode), or None."""
    return next((v for i, v in enumerate(items) if v in items[:i]), None)


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
