"""A user's CustomJobSpec file (`vertexJobSpec`: the YAML `gcloud ai custom-jobs create --config`
reads) checked against the rules the stack keys' pools have (infra/vertex_pools.py) and Vertex's
own, one line naming the file's field for the first problem; each pool's shape comes back for the
prices and the spending caps.

Pure: no I/O (scripts/targets/vertex/jobfile.py reads the file). Sources, read while building this:
- Vertex "Distributed training" (docs.cloud.google.com/vertex-ai/docs/training/
  distributed-training): pool 0 the primary (replicaCount 1), 1 workers, 2 parameter servers or
  Reduction Server, 3 evaluators; an empty pool is skipped.
- `gcloud ai custom-jobs create` reference: --config is "a YAML document containing a
  `CustomJobSpec`"; "keys with underscore are invalid".
- google-cloud-aiplatform 1.93.0 `aiplatform_v1/types/custom_job.py`: the CustomJobSpec fields.
- the pools' mounts: infra/vertex_mounts.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gputrain_node.contract import VERTEX_ENTRY, is_trainer_flags
from infra import catalog, vertex
from infra.base.errors import UserError
from infra.offers import MAX_NODES, price_table
from infra.vertex_mounts import check_mounts, check_nfs_network
from infra.vertex_pools import (
    PoolShape,
    is_reduction_server_image,
    reducer_bound,
    reducer_problem,
)

#: CustomJobSpec's fields in google-cloud-aiplatform 1.93.0 (the floor), as gcloud's YAML spells
#: them, and those a newer client brings (CLIENT_FIELDS_SINCE); WorkerPoolSpec's likewise.
JOB_SPEC_FIELDS = [
    "persistentResourceId",
    "workerPoolSpecs",
    "scheduling",
    "serviceAccount",
    "network",
    "reservedIpRanges",
    "pscInterfaceConfig",
    "baseOutputDirectory",
    "protectedArtifactLocationId",
    "tensorboard",
    "enableWebAccess",
    "enableDashboardAccess",
    "experiment",
    "experimentRun",
    "models",
]
POOL_FIELDS = [
    "containerSpec",
    "pythonPackageSpec",
    "machineSpec",
    "replicaCount",
    "nfsMounts",
    "lustreMounts",
    "diskSpec",
]
#: Fields the floor's aiplatform_v1 lacks, with the first release that has them (read in the
#: released aiplatform_v1/types/custom_job.py: 1.95.1 lacks psc_interface_config, 1.96.0 has it;
#: 1.135.0 lacks WorkerPoolSpec's lustre_mounts, 1.136.0 has it): the submission sends the file
#: through the installed client, which must know them.
CLIENT_FIELDS_SINCE = {"pscInterfaceConfig": "1.96.0"}
POOL_CLIENT_FIELDS_SINCE = {"lustreMounts": "1.136.0"}
#: PythonPackageSpec's fields Vertex requires (REST and client reference: "Required.").
PYTHON_PACKAGE_REQUIRED = ("executorImageUri", "packageUris", "pythonModule")

_ENUM_TO_ACCELERATOR = {enum: name for name, enum in vertex.ACCELERATOR_ENUMS.items()}


def _count(value: Any) -> int | None:
    """An int64 as REST JSON / YAML may write it (1 or "1")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
        return int(value)
    return None


def _underscored(value: Any, path: str) -> str | None:
    """The first key with an underscore (gcloud: "keys with underscore are invalid"), but in env
    values and the like, which are data."""
    if isinstance(value, dict):
        for k, v in value.items():
            if "_" in str(k):
                return f"{path}{k}"
            found = _underscored(v, f"{path}{k}.")
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, dict) and set(v) <= {"name", "value"}:
                continue  # an env entry: NAME_WITH_UNDERSCORES is its value, not a key
            found = _underscored(v, f"{path[:-1]}[{i}].")
            if found:
                return found
    return None


def job_spec_path(text: str) -> str:
    """`vertexJobSpec`: a file inside the project directory, relative to it (as `build` is), so
    a stack file never makes gputrain read a file elsewhere on the machine."""
    name = text.strip()
    if not name:
        return ""
    if (
        any(c in name for c in "\n\r\0")
        or name.startswith(("/", "~"))
        or ".." in name.replace("\\", "/").split("/")
    ):
        raise UserError(
            f"gputrain:vertexJobSpec = {text!r}: allowed: a CustomJobSpec YAML file inside the "
            "project directory, relative to it, without '..'"
        )
    return name


_WHAT = (
    "a CustomJobSpec mapping with workerPoolSpecs "
    "(what `gcloud ai custom-jobs create --config` reads)"
)


def check_job_spec(doc: Any, where: str, *, spot: bool = False) -> list[tuple[int, PoolShape]]:
    """A user's CustomJobSpec against Vertex's rules and ours, one line for the first problem
    (`where` names the file); returns (pool index, shape) for each pool that is set."""
    if not isinstance(doc, dict):
        raise UserError(f"{where}: a YAML {type(doc).__name__}; allowed: {_WHAT}")
    if "jobSpec" in doc:
        raise UserError(f"{where}: a whole CustomJob; allowed: {_WHAT} (its jobSpec alone)")
    underscored = _underscored(doc, "")
    if underscored:
        raise UserError(
            f"{where}: {underscored}: keys with underscores are invalid in gcloud's --config "
            "(write them camelCase, e.g. workerPoolSpecs)"
        )
    unknown = sorted(set(doc) - set(JOB_SPEC_FIELDS))
    if unknown:
        raise UserError(f"{where}: {unknown[0]}: not a CustomJobSpec field; allowed: {_WHAT}")
    pools = doc.get("workerPoolSpecs")
    if not isinstance(pools, list) or not pools or not isinstance(pools[0], dict) or not pools[0]:
        raise UserError(
            f"{where}: workerPoolSpecs[0] (the primary replica) is missing; allowed: {_WHAT}"
        )
    if len(pools) > 4:
        raise UserError(f"{where}: workerPoolSpecs has {len(pools)} pools; allowed: at most 4")
    shapes: list[tuple[int, PoolShape]] = []
    for i, pool in enumerate(pools):
        if pool not in (None, {}):  # an empty pool is skipped (the docs' way to skip pool 1)
            shapes.append((i, _check_pool(pool, i, f"{where}: workerPoolSpecs[{i}]", spot, shapes)))
    trainers = sum(s.replicas for i, s in shapes if i in (0, 1))
    if any(s.reducers for _, s in shapes) and trainers < 2:
        raise UserError(
            f"{where}: workerPoolSpecs[2] is a Reduction Server, but pools 0 and 1 hold 1 node; "
            "it only speeds up NCCL all-reduce between 2 or more GPU nodes"
        )
    check_nfs_network(doc, where)
    return shapes


def _file_words(at: str) -> vertex.ShapeWords:
    """A pool's machineSpec fields as the file spells them, for vertex_problem's line."""
    return vertex.ShapeWords(
        machine_type=f"{at}.machineSpec.machineType",
        gpu_type=f"{at}.machineSpec.acceleratorType",
        gpu_count=f"{at}.machineSpec.acceleratorCount",
        equals=" = ",
        enums=True,
    )


def _spec_map(pool: Mapping[str, Any], key: str, at: str) -> Mapping[str, Any]:
    """containerSpec, pythonPackageSpec or machineSpec: a map ({} where it is not set)."""
    value = pool.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{at}.{key}: a YAML {type(value).__name__}; allowed: a map")
    return value


def _as_written(value: Any) -> str:
    return " is missing" if value is None else f" = {value!r}"


def _check_code(pool: Mapping[str, Any], at: str) -> str:
    """The pool's code: containerSpec (imageUri) or pythonPackageSpec (the fields Vertex
    requires); returns the image it runs in."""
    if ("containerSpec" in pool) == ("pythonPackageSpec" in pool):
        raise UserError(f"{at}: set exactly one of containerSpec (imageUri) or pythonPackageSpec")
    if "containerSpec" in pool:
        image = _spec_map(pool, "containerSpec", at).get("imageUri")
        if not isinstance(image, str) or not image.strip():
            raise UserError(
                f"{at}.containerSpec.imageUri{_as_written(image)}: allowed: the URI of the image "
                "to run"
            )
        return image
    package = _spec_map(pool, "pythonPackageSpec", at)
    needs = "Vertex requires executorImageUri, packageUris and pythonModule"
    for field in PYTHON_PACKAGE_REQUIRED:
        value = package.get(field)
        if field == "packageUris":
            good = isinstance(value, list) and bool(value) and all(
                isinstance(u, str) and u.startswith("gs://") and len(u) > 5 for u in value
            )  # fmt: skip
            allowed = "a list of the package files' gs:// URIs"
        else:
            good = isinstance(value, str) and bool(value.strip())
            allowed = (
                "a prebuilt training container's URI"
                if field == "executorImageUri"
                else "the Python module to run, e.g. trainer.task"
            )
        if not good:
            raise UserError(
                f"{at}.pythonPackageSpec.{field}{_as_written(value)}: allowed: {allowed} ({needs})"
            )
    return str(package["executorImageUri"])


def _replica_bound(i: int, reducers: bool, before: list[tuple[int, PoolShape]]) -> tuple[int, str]:
    """(the most replicas, what is allowed in words) for pool i: the stack's bounds, as
    `nodes` (the primary replica and the workers together) and `reductionServer.replicas`
    (beside the GPU nodes of pools 0 and 1) have them."""
    if reducers:
        trainers = [s for j, s in before if j in (0, 1)]
        return reducer_bound(sum(s.replicas for s in trainers), trainers[-1].machine_type)
    most = MAX_NODES - 1 if i == 1 else MAX_NODES
    whose = "with the primary replica, " if i == 1 else ""
    return most, f"1 to {most} ({whose}at most {MAX_NODES} nodes, as gputrain:nodes has)"


def _check_pool(
    pool: Any, i: int, at: str, spot: bool, before: list[tuple[int, PoolShape]]
) -> PoolShape:
    """One WorkerPoolSpec: its fields, code, replicas and machine (see check_job_spec);
    `before`: the pools checked so far."""
    if not isinstance(pool, dict):
        raise UserError(f"{at}: a YAML {type(pool).__name__}; allowed: a WorkerPoolSpec map")
    extra = sorted(set(pool) - set(POOL_FIELDS))
    if extra:
        raise UserError(
            f"{at}.{extra[0]}: not a WorkerPoolSpec field; allowed: {', '.join(POOL_FIELDS)}"
        )
    image = _check_code(pool, at)
    check_mounts(pool, at)
    reducers = i == 2 and is_reduction_server_image(image)
    replicas = _count(pool.get("replicaCount", 1))
    if i == 0 and replicas != 1:
        raise UserError(
            f"{at}.replicaCount = {pool.get('replicaCount')!r}: the primary replica's pool takes "
            "1; put the others in workerPoolSpecs[1]"
        )
    most, allowed = _replica_bound(i, reducers, before)
    if replicas is None or not 1 <= replicas <= most:
        raise UserError(f"{at}.replicaCount = {pool.get('replicaCount')!r}: allowed: {allowed}")
    machine = _spec_map(pool, "machineSpec", at)
    words = _file_words(at)
    machine_type = machine.get("machineType")
    if not isinstance(machine_type, str) or not machine_type.strip():
        raise UserError(
            f"{at}.machineSpec.machineType{_as_written(machine_type)}: allowed: the replicas' "
            "machine type, e.g. g2-standard-8 (n1-standard-8 in a pool 1 to 3 without GPUs)"
        )
    gpus = _count(machine.get("acceleratorCount", 0))
    if gpus is None or gpus < 0:
        raise UserError(
            f"{words.said(words.gpu_count, machine.get('acceleratorCount'))}: allowed: 0 or more"
        )
    enum = machine.get("acceleratorType")
    accelerator = None
    if enum not in (None, "", "ACCELERATOR_TYPE_UNSPECIFIED"):
        accelerator = _ENUM_TO_ACCELERATOR.get(str(enum))
        if accelerator is None:
            raise UserError(
                f"{words.said(words.gpu_type, enum)}: unknown; allowed: "
                f"{', '.join(vertex.ACCELERATOR_ENUMS.values())}"
            )
    if reducers:
        problem = reducer_problem(machine_type, gpus, words)
        if problem:
            raise UserError(problem)
        return PoolShape(machine_type, None, 0, replicas, reducers=True)
    if i == 2 and runs_entry(pool):
        raise UserError(
            f"{at}: runs gputrain's entry ({VERTEX_ENTRY}), which has no parameter-server role "
            "(its torchrun world is pools 0 and 1); allowed: your own container or "
            "pythonModule there, or these replicas in workerPoolSpecs[3] (ENTRY on its own)"
        )
    entry = entry_args(pool) if i == 3 else None
    if entry is not None and is_trainer_flags(entry):
        raise UserError(
            f"{at}: runs gputrain's entry ({VERTEX_ENTRY}) with ENTRY {entry!r}, which starts "
            "the reference trainer: it would train, into the chief's checkpoints; allowed for "
            "an evaluator: your own -m MODULE or script.py first in its args"
        )
    mt = catalog.machine_type(machine_type)
    if i > 0 and accelerator is None and not gpus and (mt is None or mt.accelerator is None):
        return _cpu_pool(pool, i, machine_type, replicas, words)
    if i == 0 and mt is not None and mt.accelerator is None and accelerator is None:
        problem = (
            f"{words.said(words.machine_type, machine_type)}: no GPU; allowed for the primary "
            "replica: a GPU machine type, or acceleratorType and acceleratorCount set (pools "
            "without GPUs: workerPoolSpecs[1] to [3])"
        )
    else:
        problem = vertex.vertex_problem(machine_type, accelerator, gpus, spot=spot, words=words)
    if problem or mt is None:
        raise UserError(str(problem))
    if mt.accelerator:
        accelerator, gpus = mt.accelerator, mt.gpus
    return PoolShape(mt.name, accelerator, gpus, replicas)


#: The machine types a pool without GPUs may have: the N1 types Vertex runs, which the price
#: data prices (infra/prices.csv: GPU machine types and the N1 hosts, no E2/N2/C2).
CPU_MACHINE_TYPES = next(o for o in vertex.OFFERS if o.pattern.startswith("n1-"))


def _cpu_pool(
    pool: Mapping[str, Any], i: int, machine_type: str, replicas: int, words: vertex.ShapeWords
) -> PoolShape:
    """Pool 1, 2 or 3 without GPUs (Vertex runs them: CPU workers, parameter servers,
    evaluators): a machine type the spending caps can price, and code that runs there."""
    said = words.said(words.machine_type, machine_type)
    allowed = f"allowed without GPUs: {CPU_MACHINE_TYPES.family}, or a GPU machine type"
    mt = catalog.machine_type(machine_type)
    if mt is None or not price_table().zones(mt.name):
        near = catalog.nearest_machine_types(machine_type)
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        raise UserError(
            f"{said}: not in gputrain's price data (infra/prices.csv), so plan and the spending "
            f"caps cannot price this pool{hint}; {allowed}"
        )
    if not re.fullmatch(CPU_MACHINE_TYPES.pattern, mt.name):
        raise UserError(f"{said}: Vertex AI custom training does not run it; {allowed}")
    if i == 1 and runs_entry(pool):
        raise UserError(
            f"{said}: no GPU, and the pool runs gputrain's entry ({VERTEX_ENTRY}), which joins "
            "pool 1 to the chief's torchrun world of GPU processes; allowed: a GPU machine "
            "type, or these replicas in workerPoolSpecs[3] (ENTRY on its own)"
        )
    return PoolShape(mt.name, None, 0, replicas)


#: gputrain's entry started as `-m MODULE` or `-mMODULE`, in words of their own or in a script
_STARTS_ENTRY = re.compile(rf"(?:^|\s)-m\s*{re.escape(VERTEX_ENTRY)}(?=[\s;&|'\"]|$)")
#: what a script (`sh -c SCRIPT NAME ARGS...`) gives the entry after it: nothing, or its ARGS
_SCRIPT_ARGS = ("", '"$@"', "$@")


def _container_words(pool: Mapping[str, Any]) -> list[str]:
    """The container's command line: containerSpec's command, then its args."""
    spec = pool.get("containerSpec") or {}
    return [str(w) for key in ("command", "args") if isinstance(spec.get(key), list)
            for w in spec[key]]  # fmt: skip


def runs_entry(pool: Mapping[str, Any]) -> bool:
    """Whether the pool's replicas start gputrain's entry: a `plan --export` pool's
    pythonModule, or its container's command line (command and args, a script's included)."""
    package = pool.get("pythonPackageSpec") or {}
    words = " ".join(_container_words(pool))
    return package.get("pythonModule") == VERTEX_ENTRY or bool(_STARTS_ENTRY.search(words))


def entry_args(pool: Mapping[str, Any]) -> list[str] | None:
    """The ENTRY gputrain's entry gets on the pool's replicas: pythonPackageSpec's args, the
    words after it on the container's command line, or a script's ARGS where the script ends with
    it and "$@" (an exported containerSpec's). None where the pool does not start the entry, or
    its own script gives it more (known on the replica only)."""
    package = pool.get("pythonPackageSpec") or {}
    if package.get("pythonModule") == VERTEX_ENTRY:
        args = package.get("args")
        return [str(a) for a in args] if isinstance(args, list) else []
    words = _container_words(pool)
    for i, word in enumerate(words):
        if word == "-m" and words[i + 1 : i + 2] == [VERTEX_ENTRY]:
            return words[i + 2 :]
        if word == f"-m{VERTEX_ENTRY}":
            return words[i + 1 :]
        started = _STARTS_ENTRY.search(word)
        if started:  # inside a script: `sh -c SCRIPT NAME ARGS...` gives it ARGS as "$@"
            rest = word[started.end() :].strip()
            return (words[i + 2 :] if rest else []) if rest in _SCRIPT_ARGS else None
    return None
