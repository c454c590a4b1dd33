"""The stack's settings as the Pulumi CLI would hand them to the program: every gputrain key with
its default, read from `Pulumi.yaml` + `Pulumi.<stack>.yaml` (no Pulumi CLI needed) or, inside
the program, from the engine. Loading only: infra/spec.py validates.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infra.keys import whole_range
from infra.schema import (
    ALLOWED,
    SettingTypeError,
    StackSettings,
    allowed,
    config_strings,
    kind,
    load_settings,
    names_nothing,
    scalar_text,
)
from infra.schema import BACKEND_ONLY_KEYS as BACKEND_ONLY_KEYS
from infra.schema import BACKENDS as BACKENDS
from infra.schema import DEFAULT_EXECUTOR_IMAGE as DEFAULT_EXECUTOR_IMAGE
from infra.schema import DEFAULT_IMAGE_FAMILY as DEFAULT_IMAGE_FAMILY
from infra.schema import DEFAULT_IMAGE_PROJECT as DEFAULT_IMAGE_PROJECT
from infra.schema import DEFAULTS as DEFAULTS
from infra.schema import FALLBACK_IMAGE_FAMILY as FALLBACK_IMAGE_FAMILY
from infra.schema import GCP_PROJECT_KEY as GCP_PROJECT_KEY
from infra.schema import NS as NS
from infra.schema import PROJECT as PROJECT
from infra.schema import PROJECT_LABEL as PROJECT_LABEL
from infra.schema import STACK_LABEL as STACK_LABEL
from infra.schema import SpecError as SpecError

#: Keys whose value is a map. Pulumi's project config types (string, integer, boolean, array)
#: cannot declare one, so Pulumi.yaml names them in a comment only.
MAP_KEYS: tuple[str, ...] = ("data", "chief", "reductionServer", "billingBudget")

#: Keys only the controller reads (the job's environment): the Pulumi program never sees them.
#: (`secrets` it reads: a Vertex stack grants its jobs' account access to the Secret Manager
#: secrets named there; names and references only, never a value.)
CONTROLLER_KEYS: tuple[str, ...] = (
    "setup", "image", "chief", "reductionServer", "vertexJobSpec", "billingExport", "budget",
    "maxHourlyCost", "restartJobOnWorkerRestart",
)  # fmt: skip

#: Keys the Pulumi program reads. sshPrivateKey is deliberately absent: it never enters it.
PROGRAM_KEYS: tuple[str, ...] = tuple(
    k for k in DEFAULTS if k not in ("sshPrivateKey", "notify") and k not in CONTROLLER_KEYS
)


#: Settings whose value is a secret: the only ones a stack file may hold as `secure:` values, and
#: the only ones it must not hold in plain text.
SECRET_KEYS = (NS + "sshPrivateKey",)


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names one key twice."""


class KeyNotANameError(yaml.YAMLError):
    """A mapping key that is a list, a mapping or a set (`? [a, b]`): no setting is named so."""

    def __init__(self, line: int, key: Any) -> None:
        shape = {"list": "list", "dict": "mapping"}.get(type(key).__name__, type(key).__name__)
        super().__init__(f"the key on line {line} is a {shape}; keys are names")
        self.problem = str(self)  # how the hosts file words a YAML error


class UniqueKeyLoader(yaml.SafeLoader):
    """Safe YAML refusing a key given twice in one mapping (PyYAML keeps the last silently) and
    a key that is no plain value (PyYAML's own check comes after ours, which cannot hash it)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, list | dict | set):
                raise KeyNotANameError(line, key)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise DuplicateKeyError(
                    f"duplicate key {key!r} on line {line} (first on line {seen[key]})"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


class StackYamlLoader(UniqueKeyLoader):
    """YAML as the Pulumi CLI reads it (YAML 1.2 core: `off`, `yes`, `1:30` stay strings, only
    true/false are booleans) and refusing a key given twice in one mapping, as the CLI does."""


StackYamlLoader.yaml_implicit_resolvers = {
    first: [
        (tag, rx)
        for tag, rx in resolvers
        if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _tag, _pattern, _first in (
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+.0123456789",
    ),
):
    StackYamlLoader.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))


def _go_integer(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int | float | str:
    """A plain integer as the CLI's YAML (go-yaml v3, resolve.go) reads it: Go's
    ParseInt(text, 0, 64), so a leading 0 is octal; what no 64-bit integer holds (`09`, 2**64)
    is a float if it reads as one, else the text. PyYAML raised ValueError on `09`."""
    text = str(loader.construct_scalar(node))
    digits = text.lstrip("+-")
    value: int | None
    try:
        if digits[:2] in ("0x", "0o"):
            value = int(digits[2:], 16 if digits[1] == "x" else 8)
        else:
            value = int(digits, 8 if len(digits) > 1 and digits[0] == "0" else 10)
    except ValueError:
        value = None
    if value is not None and text.startswith("-"):
        value = -value
    if value is not None and -(2**63) <= value < 2**64:
        return value
    try:
        return float(text)
    except ValueError:
        return text


StackYamlLoader.add_constructor("tag:yaml.org,2002:int", _go_integer)


def read_yaml(text: str) -> Any:
    """One YAML document the way the Pulumi CLI reads stack files (see StackYamlLoader)."""
    return yaml.load(text, Loader=StackYamlLoader)


def service_account_id(stack: str) -> str:
    """The account id of the stack's node service account (6-30 chars: stack names are <= 21)."""
    return f"gputrain-{stack}"


def service_account_email(stack: str, project: str) -> str:
    return f"{service_account_id(stack)}@{project}.iam.gserviceaccount.com"


def qualify(key: str) -> str:
    """`nodes` -> `gputrain:nodes`; keys with a namespace stay as they are."""
    return key if ":" in key else NS + key


#: What a setting is called elsewhere -> its key: `plan`'s TTL column shows maxRunDuration.
KEY_ALIASES = {"ttl": "maxRunDuration"}


def meant_key(name: str) -> str | None:
    """The gputrain key a stranger most likely meant, qualified: the same name in another case
    (GPUS), with our namespace run into it (gputrain-gpus, gputrain.gpus), a name `plan` shows
    (ttl), else the nearest spelling; None when nothing is near."""
    bare = re.sub(r"^gputrain[-._:/]", "", name.strip(), flags=re.IGNORECASE).lower()
    folded = {k.lower(): k for k in DEFAULTS} | KEY_ALIASES
    near = difflib.get_close_matches(bare, list(folded), n=1)
    return NS + folded[near[0]] if near else None


@dataclass(frozen=True)
class StackSecrets:
    """What a stack file says about its secrets (nothing is decrypted)."""

    secure_keys: tuple[str, ...]  # keys stored as `secure:` values, e.g. gputrain:sshPrivateKey
    encrypted: bool  # an `encryptionsalt`: the passphrase provider holds (or held) a secret
    provider: str | None  # `secretsprovider`, e.g. gcpkms://...; None: the backend's default

    @property
    def any(self) -> bool:
        return bool(self.secure_keys) or self.encrypted


@dataclass(frozen=True)
class StackFile:
    """A stack's settings and what its file says of secrets, from one read of each file: every
    command reads it once and hands it on (backend choice, spec, doctor)."""

    stack: str
    config: dict[str, str]  # Pulumi.yaml defaults merged with Pulumi.<stack>.yaml
    secrets: StackSecrets
    settings: StackSettings  # the `gputrain:` keys typed (infra/schema.py), checked once


STACK_NAME = re.compile(r"^[a-z](?:[a-z0-9-]{0,19}[a-z0-9])?$")


def check_stack_name(stack: str) -> None:
    """A stack name names the VMs, the service account and its file: `../../x` or `A B` is one
    line here, before it is made into a path or a resource name."""
    if not STACK_NAME.match(stack):
        raise SpecError(
            f"stack = {stack!r}: allowed: 1-21 of a-z 0-9 -, starting with a letter "
            "(it names the VMs and the service account)"
        )


def read_stack_file(root: Path, stack: str) -> StackFile:
    """Pulumi.yaml defaults merged with Pulumi.<stack>.yaml, validated once into the typed
    settings (infra/schema.py) and as the CLI's strings (fully qualified keys).

    Secure (encrypted) values are skipped: only the CLI can decrypt them, and the program never
    needs the one we store (sshPrivateKey); `secrets` says which keys hold them.
    """
    check_stack_name(stack)
    project_file = root / "Pulumi.yaml"
    stack_file = root / f"Pulumi.{stack}.yaml"
    if not stack_file.is_file():
        known = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in root.glob("Pulumi.*.yaml"))
        raise SpecError(
            f"stack = {stack!r}: there is no {stack_file.name} in {root} (stacks: {', '.join(known) or 'none'})"
        )
    project = _config_section(_read_yaml(project_file, stack), project_file, stack)
    stack_doc = _read_yaml(stack_file, stack)
    stack_section = _config_section(stack_doc, stack_file, stack)
    check_stack_document(stack_doc, stack_file.name, stack)
    check_stack_section(stack_section, stack_file.name, stack)
    values: dict[str, Any] = {}  # qualified key -> YAML value: the project's, then the stack's
    for key, decl in project.items():
        if isinstance(decl, dict):
            if "secure" in decl:
                continue
            if "value" in decl:
                values[qualify(key)] = decl["value"]
            elif "default" in decl:
                values[qualify(key)] = decl["default"]
        else:
            values[qualify(key)] = decl
    for key, value in stack_section.items():
        if not (isinstance(value, dict) and "secure" in value):
            values[qualify(key)] = _as_the_cli_reads(qualify(key), value)
    given = {qualify(k) for k in stack_section}
    settings = typed_settings(values, given, stack_file.name, stack)
    return StackFile(stack, config_strings(values), _secrets_of(stack_doc), settings)


def _as_the_cli_reads(key: str, value: Any) -> Any:
    """A stack file's value as the CLI hands it on: a number or boolean in a gputrain string
    key is its JSON text (schema.scalar_text: `budget: 100` is "100"), for the key's own rule
    to judge. Pulumi.yaml's defaults are not: the CLI checks those against `type:` as written."""
    name = key[len(NS) :]
    if (
        isinstance(value, bool | int | float)
        and key.startswith(NS)
        and name in StackSettings.model_fields
        and kind(name) in ("text", "text-or-texts")
    ):
        return scalar_text(value) or value  # NaN stays a float: the model refuses it
    return value


def stack_file_keys(root: Path, stack: str) -> frozenset[str]:
    """The keys Pulumi.<stack>.yaml sets (qualified); none without the file. Inside the program
    they tell a value the stack sets equal to Pulumi.yaml's default (`autodown: 10m`) from that
    default, which the engine hands on alike: `plan` tells them so (read_stack_file)."""
    check_stack_name(stack)
    path = root / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        return frozenset()
    return frozenset(qualify(k) for k in _config_section(_read_yaml(path, stack), path, stack))


def load_stack_config(root: Path, stack: str) -> dict[str, str]:
    """The merged settings alone (see read_stack_file)."""
    return read_stack_file(root, stack).config


def _read_yaml(path: Path, stack: str) -> Any:
    """A Pulumi YAML file, or a one-line SpecError naming the file (unreadable, not UTF-8, not
    YAML)."""
    try:
        return read_yaml(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"stack = {stack!r}: {path.name} is not UTF-8 text (byte {exc.start}); "
            "allowed: a UTF-8 YAML file"
        ) from exc
    except (OSError, yaml.YAMLError) as exc:
        detail = " ".join(str(exc).split())
        raise SpecError(f"stack = {stack!r}: cannot read {path.name}: {detail}") from exc


def _config_section(doc: Any, path: Path, stack: str) -> dict[str, Any]:
    """The `config:` mapping of a Pulumi YAML document, or a one-line SpecError naming the file
    and what is wrong (not a mapping, keys that are not strings)."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise SpecError(
            f"stack = {stack!r}: {path.name} is a YAML {type(doc).__name__}; "
            "allowed: a mapping with a config: section"
        )
    section = doc.get("config")
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise SpecError(
            f"stack = {stack!r}: config: in {path.name} is a YAML {type(section).__name__}; "
            "allowed: a mapping of setting: value"
        )
    for key in section:
        if not isinstance(key, str) or not key.strip():
            raise SpecError(
                f"stack = {stack!r}: config: in {path.name} has the key {key!r}; "
                "allowed: setting names like gputrain:nodes"
            )
    return section


#: A stack file's top-level keys: Pulumi's ProjectStack (pulumi/pulumi,
#: sdk/go/common/workspace/project.go). The CLI ignores any other key without a word.
STACK_FILE_KEYS = (
    "config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment",
    "mainEnvironment",
)  # fmt: skip


def check_stack_document(doc: Any, file: str, stack: str) -> None:
    """A top-level key Pulumi does not read (a setting outdented out of `config:`, or a file
    with no `config:` at all) is one line, not a setting silently left at its default."""
    for key in doc if isinstance(doc, dict) else ():
        if key in STACK_FILE_KEYS:
            continue
        name = str(key)
        near = difflib.get_close_matches(name, STACK_FILE_KEYS, n=1, cutoff=0.75)
        setting = meant_key(name)
        as_key = f", as {setting}" if setting not in (None, name) else ""
        hint = f"did you mean {near[0]}?" if near else f"put it under config:, indented{as_key}"
        raise SpecError(
            f"stack = {stack!r}: {file}: {name} is a top-level key, which Pulumi ignores; "
            f"{hint} (allowed at the top level: {', '.join(STACK_FILE_KEYS)})"
        )


#: Other providers' config keys named like one of ours: real settings of theirs, not ours
#: misplaced (pulumi-gcp's keys, sdk/python/pulumi_gcp/config/vars.py: project, region, zone, ...).
PROVIDER_KEYS = ("gcp:zone",)


def check_stack_section(section: dict[str, Any], file: str, stack: str) -> None:
    """What the Pulumi CLI would take but the stack cannot mean, one line each: a setting given
    twice (`gpus` and `gputrain:gpus`), a namespace that looks like ours misspelt, one of our
    settings under another namespace (`gcp:gpus`), `secure:` on a setting that is not a secret,
    a secret in plain text, and `gpus` written out beside `machineType` (equal to its default
    or not)."""
    where = f"stack = {stack!r}: {file}"
    spelt: dict[str, str] = {}  # qualified key -> how the file wrote it
    for key, value in section.items():
        full = qualify(key)
        if full in spelt:
            raise SpecError(
                f"{where}: {full} is given twice, as {spelt[full]} and as {key}; set it once"
            )
        spelt[full] = key
        namespace, name = full.split(":", 1)
        if namespace != PROJECT and difflib.get_close_matches(
            namespace, [PROJECT], n=1, cutoff=0.75
        ):
            raise SpecError(
                f"{where}: {key}: namespace {namespace!r} is not gputrain's; "
                f"did you mean {NS}{name}?"
            )
        if namespace != PROJECT and name in DEFAULTS and full not in PROVIDER_KEYS:
            raise SpecError(
                f"{where}: {key}: {name} is a gputrain setting, which namespace {namespace!r} "
                f"does not read; did you mean {NS}{name}?"
            )
        secure = isinstance(value, dict) and "secure" in value
        if secure and full not in SECRET_KEYS and (namespace == PROJECT or full == GCP_PROJECT_KEY):
            raise SpecError(
                f"{where}: {key} is a secure: (encrypted) value, but it is not a secret setting; "
                f"allowed: a plain value (only {', '.join(SECRET_KEYS)} is stored as a secret)"
            )
        if full in SECRET_KEYS and not secure and value not in (None, ""):
            raise SpecError(
                f"{where}: {key} is in plain text; allowed: a secret only (`gputrain keygen "
                f"--stack {stack}` stores it, or `pulumi config set --secret {key}`); "
                "remove the plain value and rotate the key"
            )
    gpus = section.get(NS + "gpus", section.get("gpus"))
    if not names_nothing(gpus) and section.get(NS + "machineType", section.get("machineType")):
        raise SpecError(
            f"{where}: gputrain:gpus and gputrain:machineType are both set; set either gpus or "
            "machineType (+ nodes), not both"
        )


def typed_settings(values: dict[str, Any], given: set[str], file: str, stack: str) -> StackSettings:
    """The typed model of the merged settings (infra/schema.py), validated once; a value whose
    YAML shape its key does not take is one line naming the file (the stack's where it set the
    key, else Pulumi.yaml), the key, the value and what the key takes. The model's fields_set
    is what the files set: a project default equal to the schema's is left to it."""
    ours = {k[len(NS) :]: v for k, v in values.items() if k.startswith(NS)}
    try:
        return load_settings(
            {
                k: v
                for k, v in ours.items()
                if ":" not in k and (NS + k in given or not _schema_default(k, v))
            }
        )
    except SettingTypeError as e:
        where = file if NS + e.key in given else "Pulumi.yaml"
        raise SpecError(
            f"stack = {stack!r}: {where}: {NS}{e.key} = {_shown(e.value)}: allowed: {e.allowed}"
        ) from None


def _schema_default(key: str, value: Any) -> bool:
    """Pulumi.yaml's default for a key is the schema's own (same type, same value)."""
    field = StackSettings.model_fields.get(key)
    return field is not None and type(value) is type(field.default) and value == field.default


def _shown(value: Any) -> str:
    """A value as the stack file wrote it, short: YAML's own spelling of lists and maps."""
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, list | dict) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _secrets_of(doc: Any) -> StackSecrets:
    doc = doc if isinstance(doc, dict) else {}
    config = doc.get("config")
    config = config if isinstance(config, dict) else {}
    secure = tuple(qualify(k) for k, v in config.items() if isinstance(v, dict) and "secure" in v)
    provider = doc.get("secretsprovider")
    return StackSecrets(
        secure, bool(doc.get("encryptionsalt")), str(provider) if provider else None
    )


def stack_config_from_pulumi() -> dict[str, str]:
    """Inside the Pulumi program: the same string mapping load_stack_config builds.

    Reads only the keys the program needs; sshPrivateKey is never read.
    """
    import pulumi
    from pulumi.runtime import config as runtime_config

    cfg = pulumi.Config(PROJECT)
    out: dict[str, str] = {}
    for key in PROGRAM_KEYS:
        value = cfg.get(key)
        if value is not None:
            out[NS + key] = value
    project = pulumi.Config("gcp").get("project")
    if project:
        out[GCP_PROJECT_KEY] = project
    # Keys in our namespace that are not settings (typos) must fail parse_spec, not be ignored.
    # Their values are not needed (and not read: a mistyped private-key key stays unread). The
    # listing is internal SDK state: the public API has none.
    passed = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    for key in passed:
        if key.startswith(NS) and key[len(NS) :] not in DEFAULTS:
            out[key] = ""
    return out


# ---- a Pulumi config's strings (as the CLI hands them to the program) as the typed settings --------


def _json(key: str, text: str, shape: type, allowed_text: str) -> Any:
    """JSON text of the given shape, or SettingTypeError naming what the key allows."""
    try:
        value = json.loads(text)
    except ValueError:
        raise SettingTypeError(key, text, allowed_text) from None
    if not isinstance(value, shape):
        raise SettingTypeError(key, text, allowed_text)
    return value


def _texts(key: str, text: str) -> list[str]:
    """A JSON array of strings (how the CLI passes lists) or comma-separated text."""
    if text.startswith("["):
        items = _json(key, text, list, ALLOWED["texts"])
        if not all(isinstance(v, str) for v in items):
            raise SettingTypeError(key, text, ALLOWED["texts"])
        return [v.strip() for v in items]
    return [v.strip() for v in text.split(",") if v.strip()]


def _from_string(key: str, raw: str) -> Any:
    """One Pulumi config string as the YAML value its key's kind takes (None: unset)."""
    text, what = raw.strip(), kind(key)
    if what == "text":
        return text
    if not text:
        return None
    if what == "texts":
        return _texts(key, text)
    if what == "labels":
        return _json(key, text, dict, ALLOWED[what]) if text.startswith("{") else _texts(key, text)
    if what == "text-or-texts":
        return _texts(key, text) if text.startswith("[") else text
    if what in ("mapping", "datasets"):
        try:
            return _json(key, text, dict, ALLOWED[what])
        except SettingTypeError as e:
            if what == "datasets":  # worded as the `data` key's own check words it
                e.line = f"{key}: {text!r} is not allowed; expected a map " + (
                    "NAME: gs://BUCKET/PREFIX[:copy|:mount]"
                )
            raise
    if what == "whole" and not re.fullmatch(r"[0-9]+", text):
        extra = StackSettings.model_fields[key].json_schema_extra
        if isinstance(extra, dict) and "range" in extra:
            lo, hi, unit = whole_range(key)
            raise SettingTypeError(key, text, f"a whole number {lo}..{hi}{unit}")
    return text  # a whole number or a flag: the model's own validators read the text


def load_config_strings(
    config: Mapping[str, str], ns: str, given: Collection[str] = ()
) -> StackSettings:
    """The typed settings of a Pulumi config (qualified keys, strings all the way, as the CLI
    hands them to the program), validated once: the string side of load_settings. Keys
    outside the namespace, or that the model does not know, are left to the caller. `given`:
    the keys the stack file sets (stack_file_keys)."""
    values = {  # a value equal to its default is left to it unless the stack file sets it: the
        # CLI hands on Pulumi.yaml's defaults too, so the model's fields_set is what the stack sets
        key[len(ns) :]: _from_string(key[len(ns) :], raw)
        for key, raw in config.items()
        if key.startswith(ns)
        and key[len(ns) :] in StackSettings.model_fields
        and (key in given or raw.strip() != DEFAULTS[key[len(ns) :]])
    }
    known = {k: v for k, v in values.items() if v is not None}
    try:
        return StackSettings.model_validate(known)
    except ValidationError as exc:
        key = str(exc.errors()[0]["loc"][0])
        raise SettingTypeError(key, config[ns + key].strip(), allowed(key)) from None
