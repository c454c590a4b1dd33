"""Datasets in Cloud Storage that a job reads: `NAME: gs://BUCKET/PREFIX[:copy|:mount]` from the
stack file's `data` key, a hosts file's `data` key or `--data NAME=...`. Pure: parsing, validation
and the paths and variables the job sees; the copying and mounting live on the nodes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from gputrain_node import contract
from infra.base.errors import UserError

Mode = Literal["copy", "mount"]
MODES: tuple[Mode, ...] = ("copy", "mount")
DATA_DIR_ENV = contract.DATA_DIR_ENV
DATA_COPY_ENV = contract.DATA_COPY_ENV  # Vertex AI: the `copy` datasets each replica downloads
#: on every node, relative to its gputrain root: one directory per dataset (a link to the local
#: SSD's `gputrain-data` where one is mounted)
NODE_DATA_DIR = ".gputrain/data"
#: Vertex AI mounts every bucket the job may read under /gcs/ (Cloud Storage FUSE)
VERTEX_GCS_ROOT = "/gcs"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,39}$")
# Cloud Storage's bucket-name rule (3-63 of a-z 0-9 - _ ., letter or digit at both ends)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class Dataset:
    """One dataset: where it is and how it reaches the nodes."""

    name: str  # as given; the variable is GPUTRAIN_DATA_<NAME upper-cased>
    bucket: str
    prefix: str  # "" = the whole bucket; else a folder, always ending in "/"
    mode: Mode = "copy"

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"

    @property
    def env_name(self) -> str:
        return f"GPUTRAIN_DATA_{self.name.upper()}"

    @property
    def vertex_path(self) -> str:
        """Where Vertex AI's own Cloud Storage FUSE mount shows the prefix in every replica."""
        return f"{VERTEX_GCS_ROOT}/{self.bucket}/{self.prefix}".rstrip("/")

    def spec(self) -> str:
        """The one-token form the node-side module takes: NAME=gs://BUCKET/PREFIX:MODE."""
        return f"{self.name}={self.uri}:{self.mode}"


def parse_dataset(name: str, value: object, where: str = "data") -> Dataset:
    """One entry: NAME and gs://BUCKET[/PREFIX][:copy|:mount]; one line naming the setting, the
    bad value and what is allowed otherwise (UserError)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise UserError(
            f"{where}: dataset name {name!r} is not allowed; use a letter, then up to 39 "
            "letters, digits or '_' (it becomes GPUTRAIN_DATA_<NAME>)"
        )
    if isinstance(value, Mapping):  # e.g. {uri: ..., mode: ...}: the mode goes in the text
        raise UserError(
            f"{where}.{name}: a mapping is not allowed; expected one string gs://BUCKET/PREFIX, "
            "optionally followed by :copy (the default) or :mount (e.g. gs://b/data:mount)"
        )
    if isinstance(value, str) and value != value.strip():
        raise UserError(
            f"{where}.{name}: {value!r} is not allowed (space at its start or end); expected "
            "gs://BUCKET/PREFIX, optionally followed by :copy (the default) or :mount"
        )
    if not isinstance(value, str) or not value.startswith("gs://"):
        raise UserError(
            f"{where}.{name}: {value!r} is not allowed; expected gs://BUCKET/PREFIX, "
            "optionally followed by :copy (the default) or :mount"
        )
    rest = value[len("gs://") :]
    authority = rest.split("/", 1)[0]
    if "@" in authority:  # gs://user:password@bucket: never read as a mode, never echoed
        raise UserError(
            f"{where}.{name}: gs://…@{authority.rsplit('@', 1)[1]}/… holds a user or password; "
            "not allowed: the nodes reach Cloud Storage with their own credentials; expected "
            "gs://BUCKET/PREFIX, optionally followed by :copy (the default) or :mount"
        )
    mode: str = "copy"
    if ":" in rest:
        rest, mode = rest.rsplit(":", 1)
    if mode not in MODES:
        raise UserError(
            f"{where}.{name}: mode {mode!r} in {value!r} is not allowed; use copy or mount"
        )
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket) or bucket.startswith("goog") or "google" in bucket:
        raise UserError(
            f"{where}.{name}: bucket {bucket!r} in {value!r} is not a Cloud Storage bucket name "
            "(3-63 lowercase letters, digits, '-', '_', '.'; a letter or digit at both ends)"
        )
    prefix = prefix.strip("/")
    parts = prefix.split("/")
    if "//" in prefix or any(p in (".", "..") or p != p.strip() for p in parts if prefix):
        raise UserError(
            f"{where}.{name}: prefix {prefix!r} in {value!r} is not allowed; use a folder "
            "path without empty, '.' or '..' parts, nor a part with a space at its start or end"
        )
    return Dataset(name, bucket, f"{prefix}/" if prefix else "", mode)


def parse_datasets(entries: Mapping[str, object] | None, where: str = "data") -> list[Dataset]:
    """A `data` map; two names that differ only in case would share one variable: refused."""
    if entries is None:
        return []
    if not isinstance(entries, Mapping):
        raise UserError(
            f"{where}: expected a map NAME: gs://BUCKET/PREFIX[:copy|:mount], got {entries!r}"
        )
    found = [parse_dataset(str(k), v, where) for k, v in entries.items()]
    _no_clashes(found, where)
    return found


def parse_data_flags(items: Iterable[str]) -> dict[str, str]:
    """`--data NAME=gs://...` (repeatable) -> {NAME: value}; checked by `merge_datasets`."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise UserError(f"--data {item!r}: expected NAME=gs://BUCKET/PREFIX[:copy|:mount]")
        out[name] = value
    return out


def merge_datasets(configured: Iterable[Dataset], flags: Mapping[str, str]) -> tuple[Dataset, ...]:
    """The target's datasets with `--data` entries added or replacing those of the same name."""
    merged = {d.name.upper(): d for d in configured}
    for name, value in flags.items():
        d = parse_dataset(name, value, "--data")
        merged[d.name.upper()] = d
    result = tuple(merged.values())
    _no_clashes(result, "data")
    return result


def data_env(datasets: Iterable[Dataset], data_dir: str) -> dict[str, str]:
    """The variables a job on machines of ours sees: every dataset under `data_dir`. Pure."""
    found = list(datasets)
    if not found:
        return {}
    env = {DATA_DIR_ENV: data_dir}
    env.update({d.env_name: f"{data_dir}/{d.name}" for d in found})
    return env


def data_env_names(datasets: Iterable[Dataset]) -> list[str]:
    """The names `data_env` sets (none without datasets): what a container is passed. Pure."""
    return list(data_env(datasets, ""))


def vertex_data_env(datasets: Iterable[Dataset]) -> dict[str, str]:
    """On Vertex AI: a `mount` dataset is its path under Vertex's own /gcs/ mount; the `copy`
    ones go in DATA_COPY_ENV, and every replica's Vertex entry (the node package's) downloads them to its disk
    before torchrun (and sets their variables and GPUTRAIN_DATA_DIR there). Pure."""
    found = list(datasets)
    env = {d.env_name: d.vertex_path for d in found if d.mode == "mount"}
    copies = [d.spec() for d in found if d.mode == "copy"]
    if copies:
        env[DATA_COPY_ENV] = " ".join(copies)
    elif found:
        env[DATA_DIR_ENV] = VERTEX_GCS_ROOT
    return env


def data_buckets(datasets: Iterable[Dataset]) -> list[str]:
    """Each bucket a dataset names, once, in order (the nodes may read these, nothing else)."""
    return list(dict.fromkeys(d.bucket for d in datasets))


def _no_clashes(found: Iterable[Dataset], where: str) -> None:
    seen: dict[str, str] = {}
    for d in found:
        other = seen.setdefault(d.env_name, d.name)
        if other != d.name:
            raise UserError(
                f"{where}: datasets {other!r} and {d.name!r} would both be {d.env_name}; rename one"
            )
