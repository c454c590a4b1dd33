"""The stack's own bucket at teardown: every run's results that exist only in the bucket come home
first (each run's small files and its newest complete checkpoint, into runs/<target>/<run-id>/),
then the bucket is emptied so `pulumi destroy` can delete it. With --keep-bucket — or when the
results could not be brought home — it is kept, and the user is told where.

The user's own `bucket` is never read, emptied or deleted here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.gcp.gcs import ObjectInfo, StorageApi, file_crc32c
from infra.outputs import BucketOutputs
from scripts import ui
from scripts.job.records import RUN_ID
from scripts.transport.safe_path import ALLOWED, SafeTree, unsafe_reason

BUCKET_TYPE = "gcp:storage/bucket:Bucket"  # what `destroy` keeps when the bucket is kept
CHECKPOINT = re.compile(r"(?:^|/)ckpt-(\d{8})\.pt$")
CHECKPOINTS = "checkpoints/"  # the reference trainer's, in a run (GPUTRAIN_CHECKPOINT_URI)
MANIFEST_SUFFIX = ".manifest.json"  # as the trainer writes them (trainer/storage.py)
# Empty, list again: a node still writing (a last mirror pass) is brought home, not deleted unseen;
# what is still coming after these rounds fails the destroy, whose retry settles again.
SETTLE_ROUNDS = 3


@dataclass(frozen=True)
class KeptBucket:
    """A bucket the destroy must leave alone: on purpose (--keep-bucket) or because its results
    could not be brought home (`problem`)."""

    name: str
    problem: str | None = None


@dataclass(frozen=True)
class Fetch:
    """One object to bring home: `relative` is its path under runs/<run-id>/."""

    run_id: str
    obj: ObjectInfo
    relative: str


def run_objects(
    objects: list[ObjectInfo], prefix: str, refused: list[str] | None = None
) -> dict[str, dict[str, ObjectInfo]]:
    """run id -> {path under runs/<run-id>/: object}, for objects under `<prefix>runs/`. A name
    that is no run id and safe path (safe_path: anything with the nodes' storage role names
    objects) is left out, and said in `refused` ("NAME: why"). Pure."""
    runs: dict[str, dict[str, ObjectInfo]] = {}
    base = f"{prefix}runs/"
    for o in objects:
        if not o.name.startswith(base):
            continue
        run_id, _, relative = o.name[len(base) :].partition("/")
        if not run_id or not relative or relative.endswith("/"):  # folder placeholders
            continue
        why = unsafe_reason(relative) if RUN_ID.match(run_id) else "not a run id"
        if why:
            if refused is not None:
                refused.append(f"{o.name!r}: {why}")
        elif not relative.rsplit("/", 1)[-1].startswith(".gputrain-"):
            runs.setdefault(run_id, {})[relative] = o
    return runs


def checkpoint_candidates(files: dict[str, ObjectInfo]) -> list[tuple[str, str]]:
    """(checkpoint, manifest) paths that both exist, newest step first. Pure."""
    found = []
    for relative in files:
        m = CHECKPOINT.search(relative)
        if m and is_checkpoint_file(relative) and relative + MANIFEST_SUFFIX in files:
            found.append((int(m.group(1)), relative))
    return [(rel, rel + MANIFEST_SUFFIX) for _, rel in sorted(found, reverse=True)]


def is_checkpoint_file(relative: str) -> bool:
    """The reference trainer's checkpoints (and manifests) under the run's checkpoints/: only the
    newest complete one comes home. A user's `ckpt-00000100.pt` anywhere else is a file."""
    relative = relative.removesuffix(MANIFEST_SUFFIX)
    return relative.startswith(CHECKPOINTS) and bool(CHECKPOINT.search(relative))


def home_path(relative: str) -> str:
    """Where an object of a run lives at home: the mirror's `out/<node>/X` is `<node>/X` and its
    `workdir/<node>/X` is `<node>/workdir/X` (as the SSH download lays them out); the watchdog's
    `<node>/X` and the rest are where they are. Pure."""
    top, _, rest = relative.partition("/")
    node, _, tail = rest.partition("/")
    if top == "out" and tail:
        return f"{node}/{tail}"
    if top == "workdir" and tail:
        return f"{node}/workdir/{tail}"
    return relative


def same_content(path: Path, obj: ObjectInfo) -> bool:
    """The file holds the object: its size, and its CRC32C where the listing gave one (an
    older checkpoint of the same name and size is not the newer one)."""
    if not path.is_file() or path.stat().st_size != obj.size:
        return False
    return obj.crc32c is None or file_crc32c(path) == obj.crc32c


def local_copy(run_dir: Path, relative: str, obj: ObjectInfo, nodes: frozenset[str]) -> Path | None:
    """An object already home: at its home path with the same content, or (a node's out dir)
    a file of the same name and content in that node's folder when it is one of `nodes` (never
    another node's file that happens to match, as every node's `model.bin` may)."""
    home = home_path(relative)
    exact = [run_dir / home, run_dir / relative]  # as the download or an earlier `down` put it
    for p in exact:
        if same_content(p, obj):
            return p
    node = home.split("/", 1)[0]
    where = run_dir / node if node in nodes else run_dir
    if where.is_dir():
        name = home.rsplit("/", 1)[-1]
        for p in where.rglob(name):
            if p not in exact and same_content(p, obj):
                return p
    return None


def to_fetch(
    storage: StorageApi,
    bucket: str,
    prefix: str,
    run_dir_of: dict[str, Path],
    objects: list[ObjectInfo] | None = None,
) -> list[Fetch]:
    """What of each run in `run_dir_of` is not home yet: its small files and its newest complete
    checkpoint (the manifest's size and CRC32C must match the object, else the next older one).
    `objects`: the bucket's listing to judge (None: listed here)."""
    fetch: list[Fetch] = []
    refused: list[str] = []
    if objects is None:
        objects = storage.list_objects(bucket, f"{prefix}runs/")
    runs = run_objects(objects, prefix, refused)
    for name in refused:
        ui.warn(f"gs://{bucket}: not bringing home {name} ({ALLOWED})")
    for run_id, files in runs.items():
        run_dir = run_dir_of.get(run_id)
        if run_dir is None:
            continue
        # a node's folder: its watchdog put the job's exit code there (checkpoints/ has none)
        nodes = frozenset(
            r.split("/")[0] for r in files if r.count("/") == 1 and r.endswith("/exitcode")
        )
        for relative, obj in sorted(files.items()):
            if not is_checkpoint_file(relative) and not local_copy(run_dir, relative, obj, nodes):
                fetch.append(Fetch(run_id, obj, relative))
        for ckpt, manifest in checkpoint_candidates(files):
            obj = files[ckpt]
            try:
                meta = json.loads(storage.read(bucket, files[manifest].name))
                complete = int(meta["size"]) == obj.size and meta.get("crc32c") == obj.crc32c
            except (ValueError, KeyError, TypeError):
                complete = False
            if complete:
                if not local_copy(run_dir, ckpt, obj, nodes):
                    fetch += [Fetch(run_id, obj, ckpt), Fetch(run_id, files[manifest], manifest)]
                break
    return fetch


def run_dirs(runs_dir: Path, target: str, run_ids: list[str]) -> dict[str, Path]:
    """Where each run's results live: the target dir that has it already, else runs/<target>/."""
    out = {}
    for run_id in run_ids:
        existing = sorted(p for p in runs_dir.glob(f"*/{run_id}") if p.is_dir())
        out[run_id] = existing[0] if existing else runs_dir / target / run_id
    return out


def bring_home(
    storage: StorageApi,
    bucket: str,
    prefix: str,
    runs_dir: Path,
    target: str,
    objects: list[ObjectInfo],
) -> list[Path]:
    """Download what of the listing `objects` only the bucket has; the paths written."""
    dirs = run_dirs(runs_dir, target, sorted(run_objects(objects, prefix)))
    written = []
    for f in to_fetch(storage, bucket, prefix, dirs, objects):
        dest = SafeTree(dirs[f.run_id]).file(f.relative)
        storage.download(bucket, f.obj.name, dest)
        written.append(dest)
    return written


def settle_bucket(
    outputs: BucketOutputs | None,
    storage: StorageApi,
    *,
    stack: str,
    target: str,
    runs_dir: Path,
    keep: bool,
) -> KeptBucket | None:
    """Before destroy: results home (into runs/<target>/), then the stack's own bucket emptied —
    or kept (returned; None: destroy may delete it). The user's bucket is left alone."""
    if outputs is None or not outputs.owned:
        return None
    bucket, prefix = outputs.name, outputs.prefix
    try:
        if not storage.bucket_exists(bucket):
            return None
        listing = storage.list_objects(bucket)
        written = bring_home(storage, bucket, prefix, runs_dir, target, listing)
        if written:
            ui.say(f"down: brought {len(written)} file(s) home from gs://{bucket} into {runs_dir}")
        if keep:
            ui.say(
                f"down: keeping gs://{bucket} (--keep-bucket); `gputrain down --stack "
                f"{stack}` deletes it later, after bringing its results home"
            )
            return KeptBucket(bucket)
        gone = 0
        for _ in range(SETTLE_ROUNDS):  # only what was listed and judged is deleted
            gone += storage.delete_objects(bucket, listing)
            listing = storage.list_objects(bucket)
            if not listing:
                break
            late = bring_home(storage, bucket, prefix, runs_dir, target, listing)
            if late:
                ui.say(f"down: brought {len(late)} more file(s) home, written as it emptied")
        if gone:
            ui.say(f"down: emptied gs://{bucket} ({gone} object(s)); destroy deletes it")
        return None
    except Exception as e:  # nothing may be lost: the bucket outlives a failed download
        problem = f"its results could not be brought home ({e})"
        ui.warn(f"down: gs://{bucket}: {problem}; it is kept with everything in it")
        return KeptBucket(bucket, problem)


def destroy_targets(resources: Sequence[Mapping[str, Any]], keep_types: Sequence[str]) -> list[str]:
    """The URNs a targeted destroy names to remove everything but the resources of `keep_types`
    and the components above them (the stack itself and providers stay too). Pure."""
    parent = {r["urn"]: r.get("parent") for r in resources}
    keep: set[str] = set()
    for r in resources:
        if r.get("type") in keep_types:
            urn: str | None = r["urn"]
            while urn and urn not in keep:
                keep.add(urn)
                urn = parent.get(urn)
    return [
        r["urn"]
        for r in resources
        if r["urn"] not in keep
        and r.get("type") != "pulumi:pulumi:Stack"
        and not str(r.get("type", "")).startswith("pulumi:providers:")
    ]
