"""`--hosts FILE`: existing machines over SSH, described in a small YAML file.

```yaml
user: ubuntu
identity_file: ~/.ssh/id_ed25519        # relative paths: against this file's directory
known_hosts: ~/.ssh/known_hosts          # optional (this default); keys are pinned from here
port: 22                                 # optional
python: /opt/conda/bin/python            # optional: the interpreter with torch on the hosts
setup: |                                 # optional: shell commands run once per node per hash
  pip install -e .
secrets: [WANDB_API_KEY]                 # optional: env vars of this machine the ranks get
image: us-docker.pkg.dev/P/R/train:v1    # optional: torchrun runs inside it on every host
gpus: {model: NVIDIA A100-SXM4-40GB, count: 8, min_memory_gb: 38}   # or: cpu: true
hosts:
  - address: 203.0.113.5                 # the first host is the head
    internal_address: 10.0.0.5           # optional: what the nodes use between them
    name: gpu-a                          # optional
    port: 2222                           # optional, per host
  - 203.0.113.6                          # just an address
```
Every bad input is one UserError line naming the field, the bad value and what is allowed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from infra.base.errors import UserError
from infra.base.records import Fleet, GpuExpectation, Node
from infra.datasets import Dataset, parse_datasets
from infra.keys import Checker, check_urls
from infra.secret_refs import parse_secrets
from scripts.job.environment import EnvironmentSettings
from scripts.settings import path_problem
from scripts.transport.ssh import KnownHosts

MAX_GPU_MEMORY_GB = 1024  # above any GPU made (B200: 180 GB)
MAX_GPUS_PER_HOST = 16
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"

_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def _names(value: Any) -> Any:
    """`secrets`: a list, or one name (also the JSON of a list) as a string; empty: none."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except ValueError:
            value = [value]
    return value


def _allowed(text: str) -> Any:
    """A field's 'what is allowed', read back for the one-line error."""
    return {"allowed": text}


_PORT = _allowed("expected a port number 1-65535")


class GpusEntry(BaseModel):
    """`gpus:` — what every host must show (nvidia-smi's name, GPUs per host, memory)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: StrictStr = Field(
        pattern=r"\S",
        json_schema_extra=_allowed("expected the name nvidia-smi prints, e.g. 'NVIDIA L4'"),
    )
    count: StrictInt = Field(
        ge=1,
        le=MAX_GPUS_PER_HOST,
        json_schema_extra=_allowed(f"expected GPUs per host, 1-{MAX_GPUS_PER_HOST}"),
    )
    min_memory_gb: StrictInt | StrictFloat = Field(
        0,
        ge=0,
        le=MAX_GPU_MEMORY_GB,
        allow_inf_nan=False,
        json_schema_extra=_allowed(f"expected a number of GB, 0-{MAX_GPU_MEMORY_GB}"),
    )


class HostEntry(BaseModel):
    """One of `hosts:` (a bare address is `{address: ...}`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: StrictStr = Field(json_schema_extra=_allowed("expected an IP address or host name"))
    internal_address: StrictStr | None = Field(
        None, json_schema_extra=_allowed("expected an IP address or host name")
    )
    name: StrictStr | None = Field(
        None,
        pattern=_NAME.pattern,
        json_schema_extra=_allowed("expected letters, digits, '.', '_' or '-' (≤ 63)"),
    )
    port: StrictInt | None = Field(None, ge=1, le=65535, json_schema_extra=_PORT)


class HostsSettings(BaseModel):
    """A hosts file's keys, their YAML shapes and defaults, checked once at load; the rules
    between keys and what needs the disk (the key file, known_hosts) come after."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: StrictStr = Field(
        pattern=_USER.pattern,
        json_schema_extra=_allowed("expected a login name like 'ubuntu' (lower case, ≤ 32 chars)"),
    )
    identity_file: StrictStr = Field(
        pattern=r"\S", json_schema_extra=_allowed("expected the path of the SSH private key")
    )
    known_hosts: StrictStr = Field(
        DEFAULT_KNOWN_HOSTS, pattern=r"\S", json_schema_extra=_allowed("expected a file path")
    )
    port: StrictInt = Field(22, ge=1, le=65535, json_schema_extra=_PORT)
    python: StrictStr = Field(
        "python3",
        pattern=r"^[^\n]*\S[^\n]*$",
        json_schema_extra=_allowed("expected the path or name of the interpreter with torch"),
    )
    gpus: dict[StrictStr, Any] | None = Field(  # GpusEntry's keys, checked by it
        None, json_schema_extra=_allowed("expected a mapping {model, count, min_memory_gb}")
    )
    cpu: StrictBool | None = Field(
        None, json_schema_extra=_allowed("expected true (or give gpus: {model, count} instead)")
    )
    hosts: list[Any] = Field(
        min_length=1,
        json_schema_extra=_allowed("expected a non-empty list of hosts (the first is the head)"),
    )
    data: Any = None  # infra/datasets.py parse_datasets: its own one-line errors
    setup: StrictStr | None = Field(
        None, json_schema_extra=_allowed("expected shell commands (a string)")
    )
    secrets: Annotated[list[StrictStr], BeforeValidator(_names)] = Field(
        [],
        json_schema_extra=_allowed("expected a list like [WANDB_API_KEY, HF_TOKEN=sm://hf-token]"),
    )
    image: StrictStr | None = Field(
        None, json_schema_extra=_allowed("expected a container image (a string)")
    )
    notify: Any = None  # infra/keys.py check_urls: its own one-line errors


#: The keys each mapping takes, in the order its one-line errors list them.
TOP_KEYS = tuple(HostsSettings.model_fields)
HOST_KEYS = tuple(HostEntry.model_fields)
GPU_KEYS = tuple(GpusEntry.model_fields)

M = TypeVar("M", bound=BaseModel)


def _validated(w: _Checker, model: type[M], data: Mapping[str, Any], where: str = "") -> M:
    """`data` as `model`, or the first bad value's one line: '<where><field>: <value> is not
    allowed; <what the field allows>'."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = str(first["loc"][0])
        extra = model.model_fields[key].json_schema_extra
        assert isinstance(extra, dict)
        if first["type"] == "missing":
            raise w.plain(where + key, f"missing; {extra['allowed']}") from None
        raise w.fail(where + key, data.get(key), str(extra["allowed"])) from None


@dataclass(frozen=True)
class HostsFile:
    """The parsed file: the Fleet, where its host keys come from, and hosts not pinned yet."""

    fleet: Fleet
    known_hosts: Path
    unpinned: tuple[str, ...]  # node names with no key yet; only with trust_new_hosts
    datasets: tuple[Dataset, ...] = ()  # `data`: NAME: gs://BUCKET/PREFIX[:copy|:mount]
    environment: EnvironmentSettings = field(default_factory=EnvironmentSettings)
    notify: tuple[str, ...] = ()  # webhook URLs for run events (secrets: never printed in full)
    settings: HostsSettings | None = None  # the file's keys, typed: read and checked once


@dataclass(frozen=True)
class _Checker(Checker):
    """The hosts file's one-line errors: '<file>: <field>: <value> is not allowed; <allowed>'."""

    source: str = "hosts file"

    def plain(self, field: str, text: str) -> UserError:
        return UserError(f"{self.source}: {field}: {text}")


def _checker(source: str) -> _Checker:
    return _Checker(
        lambda field, value, allowed: (
            f"{source}: {field}: {_short(value)} is not allowed; {allowed}"
        ),
        UserError,
        source,
    )


def target_name(path: Path) -> str:
    """The target a hosts file names: results go to runs/hosts-<file stem>/."""
    return f"hosts-{path.stem}"


def load_hosts_file(path: Path, *, trust_new_hosts: bool = False) -> HostsFile:
    """Reads and checks a hosts file."""
    import yaml

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: hosts file not found") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: cannot read the hosts file ({type(e).__name__})") from None
    except OSError as e:  # a directory, no permission, a name too long
        raise UserError(f"{path}: cannot read the hosts file ({e.strerror})") from None
    from infra.stackfile import DuplicateKeyError, UniqueKeyLoader

    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # a key given twice: which one holds?
    except DuplicateKeyError as e:
        raise UserError(f"{path}: {e}; allowed: each key once") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "syntax error"
        raise UserError(f"{path}: not valid YAML{at}: {problem}") from None
    return parse_hosts(
        data,
        base_dir=path.resolve().parent,
        target=target_name(path),
        source=str(path),
        trust_new_hosts=trust_new_hosts,
    )


def parse_hosts(
    data: Any,
    *,
    base_dir: Path,
    target: str,
    source: str = "hosts file",
    trust_new_hosts: bool = False,
) -> HostsFile:
    """Checks the loaded YAML and builds the HostsFile (reads identity_file and known_hosts)."""
    w = _checker(source)
    if data is None:
        raise w.plain(
            "top level",
            "the file is empty; expected a mapping with user, identity_file, hosts and gpus or cpu",
        )
    w.check(
        isinstance(data, Mapping),
        "top level",
        data,
        "expected a mapping with user, identity_file, hosts and gpus or cpu",
    )
    w.known_keys(data, TOP_KEYS, lambda k: f"key {k!r}")
    typed = _validated(w, HostsSettings, data)  # the shapes, once; then the rules between keys
    identity = _identity_file(w, typed.identity_file, base_dir)
    expect = _expectation(w, typed, data)
    nodes_spec = _hosts(w, typed.hosts, typed.port)
    user, python = typed.user, typed.python

    known_hosts = _resolve(typed.known_hosts, base_dir)
    keys_for = _known_hosts_lookup(w, known_hosts, trust_new_hosts)
    nodes: list[Node] = []
    unpinned: list[str] = []
    for i, (address, internal, name, host_port) in enumerate(nodes_spec):
        keys = keys_for(address, host_port)
        if not keys:
            if not trust_new_hosts:
                where = address if host_port == 22 else f"[{address}]:{host_port}"
                raise w.plain(
                    f"hosts[{i}].address",
                    f"no pinned host key for {where} in {known_hosts} (add it to known_hosts: "
                    "ssh-keyscan, then compare the fingerprint; or pass --trust-new-hosts)",
                )
            unpinned.append(name)
        nodes.append(
            Node(
                name=name,
                role="head" if i == 0 else "worker",
                internal_address=internal,
                address=address,
                port=host_port,
                user=user,
                host_keys=keys,
            )
        )
    fleet = Fleet(
        target=target,
        nodes=tuple(nodes),
        expect=expect,
        identity_file=identity,
        python=python.strip(),
    )
    parse_secrets(typed.secrets, f"{source}: secrets")  # their form, before any command connects
    datasets = tuple(parse_datasets(typed.data, f"{source}: data"))
    environment = EnvironmentSettings(
        setup=typed.setup or "",
        secrets=tuple(typed.secrets),
        image=(typed.image or "").strip(),
        source=f"{source}: ",
    )
    notify = typed.notify or []
    urls = check_urls(notify if isinstance(notify, list) else [notify], f"{source}: notify")
    return HostsFile(fleet, known_hosts, tuple(unpinned), datasets, environment, urls, typed)


# ---- fields ------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    """The value as the file wrote it: YAML's true/false/null, strings quoted, long ones cut."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    text = repr(value)
    limit = 200 if isinstance(value, str) else 60  # paths in full, lists and maps shortened
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _resolve(value: str, base_dir: Path) -> Path:
    path = Path(os.path.expanduser(value.strip()))
    return path if path.is_absolute() else base_dir / path


def _exists(w: _Checker, field: str, path: Path) -> bool:
    """Whether `path` exists; a path the system cannot look up is the field's error."""
    why = path_problem(path)
    if why is not None:
        raise w.fail(field, str(path), why)
    return path.exists()


def _identity_file(w: _Checker, value: str, base_dir: Path) -> Path:
    path = _resolve(value, base_dir)
    if not _exists(w, "identity_file", path):
        raise w.fail("identity_file", str(path), "the private key file does not exist")
    if not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file"
        raise w.fail("identity_file", str(path), f"it is {what}; give the private key file")
    try:
        head = path.read_bytes()[:64]
    except OSError as e:
        raise w.fail("identity_file", str(path), f"cannot read it ({e.strerror})") from None
    if head.startswith((b"ssh-", b"ecdsa-", b"sk-")):
        raise w.fail("identity_file", str(path), "it is a public key; give the private key file")
    import paramiko

    try:
        paramiko.PKey.from_path(path)
    except (paramiko.PasswordRequiredException, TypeError) as e:
        if isinstance(e, TypeError) and "password" not in str(e).lower():
            raise
        raise w.fail(
            "identity_file",
            str(path),
            "the key is encrypted (passphrase-protected) and gputrain cannot ask for the "
            "passphrase; give an unencrypted key for these hosts (ssh-keygen -p -N '' -f COPY)",
        ) from None
    except (paramiko.SSHException, ValueError, OSError) as e:
        raise w.fail(
            "identity_file", str(path), f"not a private key paramiko can read ({e})"
        ) from None
    return path


def _expectation(w: _Checker, typed: HostsSettings, data: Mapping[str, Any]) -> GpuExpectation:
    has_gpus, cpu = "gpus" in data, typed.cpu
    if has_gpus and "cpu" in data:
        raise w.plain("gpus/cpu", "both are given; give either gpus: {model, count} or cpu: true")
    if not has_gpus:
        if cpu is True:
            return GpuExpectation()
        if "cpu" in data:
            raise w.fail("cpu", cpu, "expected true (or give gpus: {model, count} instead)")
        raise w.plain("gpus/cpu", "neither is given; give gpus: {model, count} or cpu: true")
    if typed.gpus is None:
        raise w.fail("gpus", None, "expected a mapping {model, count, min_memory_gb}")
    w.known_keys(typed.gpus, GPU_KEYS, lambda k: f"gpus.{k}")
    gpus = _validated(w, GpusEntry, typed.gpus, "gpus.")
    mib = int(gpus.min_memory_gb * 1024)
    return GpuExpectation(model=gpus.model.strip(), count=gpus.count, min_memory_mib=mib)


def _address(w: _Checker, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise w.fail(field, value, "expected an IP address or host name")
    text = value.strip()
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if re.fullmatch(r"[\d.]+", text) or not _HOSTNAME.match(text):
        hint = ""
        if "@" in text:
            hint = " (put the login name in `user`)"
        elif ":" in text:
            hint = " (put the port in `port`)"
        raise w.fail(field, text, f"expected an IP address or host name{hint}")
    return text


def _hosts(w: _Checker, hosts: list[Any], default_port: int) -> list[tuple[str, str, str, int]]:
    """(address, internal address, name, port) per host, checked and de-duplicated."""
    out: list[tuple[str, str, str, int]] = []
    seen_addr: dict[tuple[str, int], int] = {}
    seen_name: dict[str, int] = {}
    for i, entry in enumerate(hosts):
        field = f"hosts[{i}]"
        if isinstance(entry, str):
            entry = {"address": entry}
        if not isinstance(entry, Mapping):
            raise w.fail(field, entry, "expected an address or a mapping with address")
        w.known_keys(entry, HOST_KEYS, lambda k: f"{field}.{k}")  # noqa: B023 (used at once)
        host = _validated(w, HostEntry, entry, f"{field}.")
        address = _address(w, f"{field}.address", host.address)
        internal = (
            _address(w, f"{field}.internal_address", host.internal_address)
            if host.internal_address is not None
            else address
        )
        port = default_port if host.port is None else host.port
        name = host.name or (address if _NAME.match(address) else f"host-{i}")
        if (address, port) in seen_addr:
            raise w.fail(
                f"{field}.address", address, f"it duplicates hosts[{seen_addr[(address, port)]}]"
            )
        if name in seen_name and host.name is None:  # named after its address, as another
            raise w.plain(
                field,
                f"hosts[{seen_name[name]}] and this host would both be named {name!r} (their "
                "address); give each a `name`",
            )
        if name in seen_name:
            raise w.fail(f"{field}.name", name, f"it duplicates hosts[{seen_name[name]}]")
        seen_addr[(address, port)] = i
        seen_name[name] = i
        out.append((address, internal, name, port))
    return out


def _known_hosts_lookup(w: _Checker, path: Path, trust_new_hosts: bool) -> Any:
    """A function (address, port) -> pinned "type base64" keys, from an OpenSSH known_hosts file
    (hashed entries too). Absent file: allowed only with trust_new_hosts (it will be created)."""
    if not _exists(w, "known_hosts", path):
        if trust_new_hosts:
            return lambda _address, _port: ()
        raise w.fail(
            "known_hosts",
            str(path),
            "the file does not exist; create it with the hosts' keys (ssh-keyscan, then compare "
            "the fingerprints) or pass --trust-new-hosts to pin them on first connect",
        )
    if not path.is_file() or not os.access(path, os.R_OK):
        raise w.fail("known_hosts", str(path), "expected a readable known_hosts file")
    import paramiko

    try:
        return KnownHosts(path).keys_for
    except (OSError, paramiko.SSHException, ValueError) as e:
        raise w.fail("known_hosts", str(path), f"cannot parse it ({e})") from None
