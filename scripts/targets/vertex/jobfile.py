"""The job as a file, both ways: `plan --export FILE` writes the CustomJobSpec gputrain would
submit, in the YAML `gcloud ai custom-jobs create --config` reads; `vertexJobSpec: FILE` submits
a user's such file as it is, with what makes it this stack's run: the run's baseOutputDirectory
in the stack's bucket (results come home from there), the stack's service account (it holds the
bucket's grants) and, where the file has none, the stack's scheduling (the server-side timeout).
A file's own scheduling may not contradict the stack's (check_scheduling): the spending caps,
`plan`'s prices and the run's cost are reckoned at the stack's capacity for maxRunDuration.

A file gputrain exported carries its run id (GPUTRAIN_RUN_ID): read back, the same job is
submitted with the new run's id in its place, and the working directory is staged where it
points. Reading and writing the file is the only I/O here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from infra.base.errors import UserError
from infra.keys import format_duration
from infra.vertex_jobspec import CLIENT_FIELDS_SINCE, POOL_CLIENT_FIELDS_SINCE, check_job_spec
from infra.vertex_pools import PoolShape, is_reduction_server_image
from scripts.targets.vertex.job import parse_duration_s

RUN_ID_ENV = "GPUTRAIN_RUN_ID"
#: Scheduling.strategy as gputrain submits each capacity a Vertex stack may have (job.scheduling).
CAPACITY_STRATEGY = {"on-demand": "STANDARD", "spot": "SPOT", "flex-start": "FLEX_START"}
#: Scheduling.Strategy (aiplatform_v1 custom_job.py) by the capacity it buys: STRATEGY_UNSPECIFIED
#: "will default to STANDARD", ON_DEMAND is STANDARD's deprecated name; LOW_COST (deprecated,
#: "potential use of spot resources") is none of them. Proto JSON also takes the numbers.
STRATEGY_CAPACITY = {"STRATEGY_UNSPECIFIED": "on-demand", "ON_DEMAND": "on-demand",
                     "STANDARD": "on-demand", "SPOT": "spot", "FLEX_START": "flex-start"}  # fmt: skip
STRATEGY_NUMBERS = {0: "STRATEGY_UNSPECIFIED", 1: "ON_DEMAND", 2: "LOW_COST", 3: "STANDARD",
                    4: "SPOT", 6: "FLEX_START"}  # fmt: skip


def read_job_file(
    root: Path, name: str, *, capacity: str, max_run_duration_s: int
) -> tuple[Any, list[tuple[int, PoolShape]]]:
    """(the YAML document, its pools checked: check_job_spec, its scheduling: check_scheduling
    against the stack's `capacity` and maxRunDuration); one line naming the setting as written
    when it cannot be read or is no job. `name` is relative to the project directory
    (infra/vertex_jobspec.job_spec_path checked it)."""
    path = root / name
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(
            f"gputrain:vertexJobSpec = {name!r}: cannot read {path} ({type(e).__name__}); "
            "allowed: a CustomJobSpec YAML file, relative to the project directory"
        ) from None
    except yaml.YAMLError as e:
        detail = " ".join(str(e).split())
        raise UserError(f"gputrain:vertexJobSpec = {name!r}: not YAML: {detail}") from None
    where = f"gputrain:vertexJobSpec = {name!r}"
    shapes = check_job_spec(doc, where, spot=capacity == "spot")
    _vertex_reads(doc, where)
    check_scheduling(doc, where, capacity=capacity, max_run_duration_s=max_run_duration_s)
    return doc, shapes


def check_scheduling(
    doc: Mapping[str, Any], where: str, *, capacity: str, max_run_duration_s: int
) -> None:
    """The file's own scheduling, which wins over the stack's, may not buy dearer or longer: a
    strategy other than the stack's capacity's, or a timeout past maxRunDuration (the bound the
    budget is checked against; unset, Vertex's is 7 days) is one line. Null is unset: the
    stack's value is sent."""
    scheduling = doc.get("scheduling")
    if scheduling is None:
        return
    if not isinstance(scheduling, dict):
        raise UserError(f"{where}: scheduling: a YAML {type(scheduling).__name__}; allowed: a map")
    strategy = scheduling.get("strategy")
    name = str(strategy)
    if isinstance(strategy, int) and not isinstance(strategy, bool):
        name = STRATEGY_NUMBERS.get(strategy, name)
    bought = STRATEGY_CAPACITY.get(name)
    if strategy is not None and bought != capacity:
        raise UserError(
            f"{where}: scheduling.strategy = {strategy!r}: the stack's capacity is {capacity}, "
            "the mode the spending caps and prices are reckoned at; allowed: "
            f"{CAPACITY_STRATEGY[capacity]}, no strategy (the stack's is sent)"
            + (f", or gputrain:capacity {bought}" if bought else "")
        )
    timeout = scheduling.get("timeout")
    if timeout is None:
        return
    most = f"'{max_run_duration_s}s'"
    ttl = f"gputrain:maxRunDuration {format_duration(max_run_duration_s)}"
    seconds = parse_duration_s(timeout) if isinstance(timeout, str) else None
    if not seconds:  # none that Vertex reads as a duration, or 0
        raise UserError(
            f"{where}: scheduling.timeout = {timeout!r}: allowed: seconds as Vertex writes a "
            f"duration, more than 0 and at most {most} ({ttl}), or no timeout (the stack's is sent)"
        )
    if seconds > max_run_duration_s:
        raise UserError(
            f"{where}: scheduling.timeout = {timeout!r}: longer than {ttl}, the server-side bound "
            f"the budget is checked against; allowed: {most} or less, no timeout (the stack's is "
            "sent), or a longer maxRunDuration"
        )


def _vertex_reads(doc: Any, where: str) -> None:
    """The file as the submission reads it, after `up` (CustomJob.from_json): a value of the
    wrong type (scheduling: 5, args: a string) is one line now, not a traceback then."""
    try:
        text = json.dumps(doc)
    except (TypeError, ValueError) as e:  # YAML dates, times, binary: no JSON value
        raise UserError(
            f"{where}: {e}; allowed: strings, numbers, true/false, lists and maps (quote a date)"
        ) from None
    try:
        from google.cloud import aiplatform_v1
        from google.protobuf.json_format import ParseError
    except ImportError:  # the preflight names the missing client
        return
    _client_knows(doc, aiplatform_v1.CustomJobSpec.meta.fields, CLIENT_FIELDS_SINCE, where)
    pool_fields = aiplatform_v1.WorkerPoolSpec.meta.fields
    for i, pool in enumerate(doc["workerPoolSpecs"]):  # check_job_spec: maps, or empty
        at = f"{where}: workerPoolSpecs[{i}]"
        _client_knows(pool or {}, pool_fields, POOL_CLIENT_FIELDS_SINCE, at)
    try:
        aiplatform_v1.CustomJobSpec.from_json(text)
    except ParseError as e:
        detail = " ".join(str(e).split())
        raise UserError(f"{where}: not what Vertex reads: {detail}") from None


def _client_knows(
    doc: Mapping[str, Any], fields: Mapping[str, Any], newer: Mapping[str, str], where: str
) -> None:
    """A field Vertex has that the installed client (the floor is older) does not (`newer`: the
    fields with the release that brings them): one line naming that release, not the parser's
    list of every field it knows."""
    from importlib import metadata

    from scripts.targets.vertex.preflight import AIPLATFORM

    for field, since in newer.items():
        if field in doc and re.sub(r"(?<!^)(?=[A-Z])", "_", field).lower() not in fields:
            raise UserError(
                f"{where}: {field}: the installed {AIPLATFORM} {metadata.version(AIPLATFORM)} "
                f"cannot send it; allowed: {since} or newer (pip install '{AIPLATFORM}>={since}'), "
                "or a file without it"
            )


class _PlainDumper(yaml.SafeDumper):
    """Every pool written out in full: no &anchors / *aliases for pools that share a spec."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def write_job_file(path: Path, job_spec: Mapping[str, Any], *, force: bool) -> None:
    """The CustomJobSpec as gcloud's --config YAML; an existing file only with --force."""
    if os.path.exists(path) and not force:  # a name too long: not there; writing it says why
        raise UserError(f"--export {path}: the file exists; add --force to replace it")
    text = "# CustomJobSpec written by `gputrain plan --export`: gcloud ai custom-jobs create\n"
    text += "#   --region=REGION --display-name=NAME --config=THIS_FILE\n"
    try:
        body = yaml.dump(dict(job_spec), Dumper=_PlainDumper, sort_keys=False, width=100)
        path.write_text(text + body)
    except OSError as e:
        raise UserError(f"--export {path}: cannot write it ({e.strerror or e})") from None


def _pool_env(pool: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pool.get("containerSpec") or pool.get("pythonPackageSpec") or {}
    return list(spec.get("env") or [])


def exported_run_id(doc: Mapping[str, Any]) -> str | None:
    """The run id a gputrain export carries in pool 0's env; None for a user's own file."""
    pools = doc.get("workerPoolSpecs") or [{}]
    found = [e.get("value") for e in _pool_env(pools[0] or {}) if e.get("name") == RUN_ID_ENV]
    return str(found[0]) if found and found[0] else None


def job_spec_for_run(
    doc: Mapping[str, Any],
    *,
    run_id: str,
    output_dir: str,
    service_account: str,
    scheduling: Mapping[str, Any],
    image: str | None = None,
) -> dict[str, Any]:
    """The file's CustomJobSpec as this run submits it (see the module's docstring). `image`
    (the stack's `build`, at its digest) replaces containerSpec.imageUri of every pool but the
    Reduction Server's."""
    text = json.dumps(doc)
    old = exported_run_id(doc)
    if old and old != run_id:
        text = text.replace(old, run_id)
    spec: dict[str, Any] = json.loads(text)
    spec["baseOutputDirectory"] = {"outputUriPrefix": output_dir}
    spec["serviceAccount"] = service_account
    theirs = {k: v for k, v in (spec.get("scheduling") or {}).items() if v is not None}
    spec["scheduling"] = {**scheduling, **theirs}  # null is unset (proto JSON): the stack's
    if image:
        for pool in spec["workerPoolSpecs"]:
            container = (pool or {}).get("containerSpec")
            if container and not is_reduction_server_image(str(container.get("imageUri"))):
                container["imageUri"] = image
    return spec


def replaced_fields(doc: Mapping[str, Any], *, service_account: str, build: str) -> list[str]:
    """What the stack sets over the file, for `plan` to say."""
    out = []
    if build:
        out.append(
            "containerSpec.imageUri of every pool but the Reduction Server's (the image built "
            f"from {build})"
        )
    if doc.get("baseOutputDirectory"):
        out.append("baseOutputDirectory (the run's directory in the stack's bucket)")
    if doc.get("serviceAccount") not in (None, "", service_account):
        out.append(f"serviceAccount (the stack's {service_account}: it holds the bucket's grants)")
    return out
