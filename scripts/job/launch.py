"""Run one job on a connected fleet: upload the code, start torchrun detached on every node, follow
it to the end, bring the results home. Returns a JobResult or raises TrainingError naming the node
that failed first and how (job/records.py), so a caller (a spot recovery) can decide what to do.

Per node the launch is four round trips on one SSH connection, whatever the fleet's size:
prepare (its code manifest; on the head a free port; the storage client when needed), upload +
start (one bundle on stdin), follow (the log, then the exit code), download. Whatever can be done
once is done once on this machine: the file list, the hashes, run.sh and each distinct tar.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from gputrain_node import contract
from infra.base.records import Fleet
from infra.datasets import data_env_names
from scripts import ui
from scripts.job.container import (
    IMAGE_PYTHON,
    RUN_ENV_NAMES,
    build_docker_run,
    build_in_image_command,
    container_name,
    image_key,
)
from scripts.job.data_io import OUT_URI_ENV, prepare_outputs, stage_data
from scripts.job.download import (
    ResultsNotHomeError,
    download_results,
    not_home_message,
    write_job_record,
)
from scripts.job.environment import ENVS_DIR, NAMES_ENV, redacting, secret_stdin
from scripts.job.environment_node import prepare_environment
from scripts.job.follow import LineSink, follow_job, say_line
from scripts.job.image_node import ensure_image
from scripts.job.node_scripts import (
    STORAGE_PACKAGES,
    UNPACK_FAILED,
    SectionResult,
    build_install_command,
    build_node_command,
    build_sections_command,
    build_stop_command,
    build_upload_and_start_command,
    parse_sections,
    report_install,
    run_dir,
)
from scripts.job.records import CHECKPOINT_URI_ENV, Job, JobResult, TrainingError, validate_job
from scripts.job.sync import (
    CodeBundle,
    check_size,
    collect_sources,
    read_manifest_command,
    unpack_command,
)
from scripts.parallel import parallel
from scripts.transport.base import Transport, TransportError
from scripts.transport.tar import ZSTD_PROBE, Codec

TRAINER_DIR = Path(__file__).resolve().parent.parent.parent / "trainer"


def launch_torchrun(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    job: Job,
    results_dir: Path,
    *,
    on_line: LineSink = say_line,
    reconnect_deadline_s: float = 120.0,
    stop_grace_s: float = 10.0,
    settle_s: float = 2.0,
) -> JobResult:
    """Upload, start detached on every node, stream prefixed logs until all end; on the first
    failure stop the others and raise TrainingError (results are still downloaded)."""
    validate_job(job)
    on_line = redacting(on_line, job.secrets.values())
    start = time.monotonic()
    job = start_job(fleet, transports, job, on_line=on_line, stop_grace_s=stop_grace_s)

    stopped: dict[str, str] = {}  # node -> how its stop went ("error: ..." when it failed)
    stoppers: list[threading.Thread] = []

    def stop(names: list[str]) -> None:
        t = threading.Thread(
            target=_stop_quietly,
            args=(transports, job.run_id, names, stop_grace_s, stopped),
            daemon=True,
        )
        t.start()
        stoppers.append(t)

    outcome = follow_job(
        transports,
        job,
        stop,
        on_line=on_line,
        reconnect_deadline_s=reconnect_deadline_s,
        settle_s=settle_s,
    )
    for t in stoppers:  # a stop of an unreachable node ends with its own timeout
        t.join(timeout=stop_grace_s + 30)
    duration = time.monotonic() - start
    names = [n.name for n in fleet.nodes]
    exit_codes = {n: outcome.states[n].exit_code for n in names}
    failure = outcome.failure
    missing = download_results(transports, job.run_id, results_dir)
    lost = f"\n{not_home_message(job.run_id, missing, results_dir, len(names))}" if missing else ""
    ok = failure is None and all(c == 0 for c in exit_codes.values())
    result = JobResult(
        job.run_id,
        ok,
        exit_codes,
        duration,
        results_dir,
        failure.node if failure else None,
        failure.root_cause if failure else (),
    )
    write_job_record(result, missing)
    if failure is not None:
        stop_text = _stop_summary(stopped, failure.node, exit_codes)
        stop_text = f"; {stop_text}" if stop_text else ""
        error = TrainingError(
            f"run {job.run_id} failed on node {failure.node} ({failure.code_text})"
            f"{stop_text}. Root cause:\n"
            + "\n".join(f"  {ln}" for ln in failure.root_cause)
            + f"\nlogs and results: {results_dir}{lost}",
            failure=failure,
            result=result,
        )
        error.results_missing = missing
        raise error
    if not ok:
        bad = {n: c for n, c in exit_codes.items() if c != 0}
        node = next(iter(bad))
        error = TrainingError(
            f"run {job.run_id} did not complete ({', '.join(f'{n}={c}' for n, c in bad.items())}); "
            f"results: {results_dir}{lost}",
            failure=outcome.states[node].failure(),
            result=result,
        )
        error.results_missing = missing
        raise error
    if missing:
        raise ResultsNotHomeError(
            f"run {job.run_id} completed on {len(names)} node(s) in {duration:.1f} s, but "
            + not_home_message(job.run_id, missing, results_dir, len(names)),
            missing,
        )
    from scripts.watch.world import not_distributed_warning

    if (alone := not_distributed_warning(results_dir, len(names), job.run_id)) is not None:
        ui.warn(alone)
    ui.say(
        f"run {job.run_id} completed on {len(names)} node(s) in {duration:.1f} s; "
        f"results in {results_dir}"
    )
    return result


def start_job(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    job: Job,
    *,
    on_line: LineSink = say_line,
    stop_grace_s: float = 10.0,
) -> Job:
    """Everything before the job runs, the same for an attached and a detached start (a
    reconcile pass's relaunch too): the nodes prepared, the datasets staged, the out dirs and
    rank 0's files back from the bucket on a relaunch, the image and environment, the code
    uploaded and the job started. The job as started (its c10d port)."""
    files = collect_code(job)
    prepared = prepare_nodes(fleet, transports, job)
    stage_job_data(fleet, transports, job)
    prepare_outputs(fleet, transports, job)
    if job.rdzv_port is None:  # every run its own c10d store, also beside another run
        job = dataclasses.replace(job, rdzv_port=prepared.rdzv_port)
    job, prepared = prepare_image_and_environment(
        fleet, transports, job, files, prepared, on_line=on_line
    )
    upload_and_start(fleet, transports, job, files, prepared, stop_grace_s=stop_grace_s)
    return job


def stage_job_data(fleet: Fleet, transports: Mapping[str, Transport], job: Job) -> None:
    """The job's datasets on every node before its start (attached or detached)."""
    stage_data(
        fleet,
        transports,
        job.datasets,
        env=job.env,
        install_gcsfuse=fleet.install_trainer,  # our own VMs; yours are yours
    )


def prepare_image_and_environment(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    job: Job,
    files: Mapping[str, Path],
    prepared: PreparedNodes,
    *,
    on_line: LineSink = say_line,
) -> tuple[Job, PreparedNodes]:
    """Before the start, in this order: the image on every node (docker, the toolkit, the
    digest), then the requirements and setup (inside the image when there is one). Returns the
    job keyed to its environment and the nodes as they are now (their manifests)."""
    if job.image is not None:
        ensure_image(fleet, transports, job.image)
    if job.environment is None:
        return job, prepared
    # requirements, then setup: once per node per content hash
    # built from the uploaded code, so the code goes first (the start then sends nothing)
    prepared = upload_code(fleet, transports, job, files, prepared)
    # with an image: built by the image's python, inside it, keyed by its digest too
    image = job.image
    python = IMAGE_PYTHON if image else fleet.python
    environment = job.environment.for_python(image_key(image) if image else python)
    job = dataclasses.replace(job, environment=environment)
    wrap = None
    if image is not None:
        name = f"{container_name(job.run_id)}-env"
        gpus = not fleet.expect.is_cpu

        def wrap(names: Sequence[str], script: str) -> str:
            return build_in_image_command(image, script, name=name, gpus=gpus, env_names=names)

    prepare_environment(
        [n.name for n in fleet.nodes],
        transports,
        environment,
        python=python,
        code_dir=job.code_dir,
        run_dir=run_dir(job.run_id),
        extra_env=job.env,
        on_line=on_line,
        wrap=wrap,
        secrets=job.secrets,
    )
    return job, prepared


def collect_code(job: Job) -> dict[str, Path]:
    """The files the nodes get (relative path -> local file), once per launch, size-checked:
    the working directory (with the reference trainer where it has no `trainer/`), and always
    gputrain's own copy of its node package under LIB_DIR, which no user file can take."""
    packages = {"trainer": TRAINER_DIR} if job.include_trainer else {}
    if job.workdir is None:
        files = {}
        for name, pkg in packages.items():
            files.update({f"{name}/{k}": v for k, v in collect_sources(pkg).items()})
        base = TRAINER_DIR
    else:
        files = collect_sources(job.workdir, packages)
        base = job.workdir
    files.update(node_lib_files())
    check_size(files, job.max_upload_mib, base)
    return files


def node_lib_files() -> dict[str, Path]:
    """gputrain's copy on the node (contract.LIB_DIR/<package>/...): the node package and the
    reference trainer it builds on, Python sources only."""
    sources = {contract.PACKAGE: contract.PACKAGE_DIR, "trainer": TRAINER_DIR}
    assert tuple(sources) == contract.LIB_PACKAGES
    return {
        f"{contract.LIB_DIR}/{name}/{p.relative_to(src).as_posix()}": p
        for name, src in sources.items()
        for p in sorted(src.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


@dataclasses.dataclass(frozen=True)
class PreparedNodes:
    manifests: Mapping[str, str]  # node -> its code manifest as read (the upload's delta)
    rdzv_port: int | None  # a free port on the head, when the job has none
    codecs: Mapping[str, Codec]  # node -> how its code bundle is compressed (zstd if it has it)


def prepare_nodes(fleet: Fleet, transports: Mapping[str, Transport], job: Job) -> PreparedNodes:
    """One round trip per node before the upload: the node's code manifest; on the head a free
    port for the run's c10d store; with gs:// checkpoints the storage client (a probe where it is
    there, else pip); whether it has zstd. More per-node checks belong here as sections."""
    head = fleet.head.name
    gs_env = any(job.env.get(k, "").startswith("gs://") for k in (CHECKPOINT_URI_ENV, OUT_URI_ENV))
    needs_storage = gs_env or any(d.mode == "copy" for d in job.datasets)
    why_storage = "gs:// checkpoints, outputs or datasets"

    def one(name: str) -> dict[str, SectionResult]:
        sections = {"manifest": read_manifest_command(job.code_dir), "zstd": ZSTD_PROBE}
        if name == head and job.rdzv_port is None:
            sections["port"] = free_port_command(fleet.python)
        if needs_storage:
            sections["packages"] = build_install_command(fleet.python, STORAGE_PACKAGES)
        r = transports[name].run(
            build_sections_command(sections), timeout=1800 if needs_storage else 60
        )
        got = parse_sections(r.stdout)
        if set(got) != set(sections):
            raise TransportError(f"node {name}: could not prepare: {r.stderr.strip() or r.stdout}")
        if "port" in got and not (got["port"].ok and got["port"].output.isdigit()):
            raise TransportError(
                f"node {name}: could not pick a free port: {got['port'].output.strip()}"
            )
        if "packages" in got:
            report_install(fleet.python, STORAGE_PACKAGES, why_storage, name, got["packages"])
        return got

    names = [n.name for n in fleet.nodes]
    results, errors = parallel(names, one)
    if errors:
        raise TransportError("\n".join(str(e) for e in errors.values()))
    port = results[head].get("port")
    return PreparedNodes(
        {n: results[n]["manifest"].output for n in names},
        int(port.output) if port else None,
        {n: "zstd" if results[n]["zstd"].ok else "gzip" for n in names},
    )


def upload_and_start(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    job: Job,
    files: Mapping[str, Path],
    prepared: PreparedNodes,
    *,
    stop_grace_s: float = 10.0,
) -> None:
    """One round trip per node: the code it lacks and the run's run.sh (the same on every node:
    c10d assigns ranks) in one bundle, unpacked and started detached. The bundle's hashes and
    tars are made once for the fleet. If any node fails, the others are stopped again."""
    names = [n.name for n in fleet.nodes]
    nproc = job.nproc_per_node or (1 if fleet.expect.is_cpu else fleet.expect.count)
    container = ""
    if job.image is not None:
        env = job.environment
        container = build_docker_run(
            job.image,
            name=container_name(job.run_id),
            gpus=not fleet.expect.is_cpu,
            env_names=[*RUN_ENV_NAMES, *job.env, *job.secrets, NAMES_ENV],
            env_dir=f"{ENVS_DIR}/{env.key}" if env is not None else None,
            data_names=data_env_names(job.datasets),
            fabric=job.fabric,
        )
    python = fleet.python
    if job.environment is not None:
        python = job.environment.python_rel
    elif job.image is not None:
        python = IMAGE_PYTHON
    script = build_node_command(
        job,
        nnodes=len(names),
        nproc_per_node=nproc,
        head_address=fleet.head.internal_address,
        python=python,
        container=container,
        host_python=fleet.python,
    )
    bundle = CodeBundle(files, run_script=script)
    secrets = secret_stdin(job.secrets)  # before the bundle, on the same stdin, never on disk
    started = time.monotonic()

    def one(name: str) -> tuple[str, str]:
        plan, codec = bundle.plan(prepared.manifests[name]), prepared.codecs[name]
        cmd = build_upload_and_start_command(
            job.run_id, job.code_dir, node=name, secrets=bool(job.secrets), codec=codec
        )
        r = transports[name].run(cmd, 600, stdin=secrets + bundle.payload(plan, codec))
        if r.exit_code == UNPACK_FAILED:
            raise TransportError(f"node {name}: upload failed: {r.stderr.strip()}")
        if not r.ok or not r.stdout.strip().isdigit():
            raise TransportError(f"node {name}: could not start: {r.stderr.strip() or r.stdout}")
        return f"{len(plan.send)} changed, {len(plan.delete)} removed", r.stdout.strip()

    results, errors = parallel(names, one)
    if errors:
        stop_job(transports, job.run_id, grace_s=stop_grace_s)
        raise TransportError("\n".join(str(e) for e in errors.values()))
    sent = Counter(results[n][0] for n in names)
    total = sum(p.stat().st_size for p in files.values())
    ui.say(
        f"uploaded {len(files)} file(s), {total / 1048576:.1f} MiB, to {len(names)} node(s) in "
        f"{time.monotonic() - started:.1f} s ("
        + ", ".join(f"{k} node(s): {what}" for what, k in sent.items())
        + ")"
    )
    ui.say(
        f"run {job.run_id} started on {len(names)} node(s), rendezvous on port {job.rdzv_port} "
        f"({', '.join(f'{n}: pgid {results[n][1]}' for n in names)})"
    )


def upload_code(
    fleet: Fleet,
    transports: Mapping[str, Transport],
    job: Job,
    files: Mapping[str, Path],
    prepared: PreparedNodes,
) -> PreparedNodes:
    """The code alone, ahead of the start (the environment is built from it); returns the nodes
    with each one's manifest as it is now, so the start's bundle carries run.sh only."""
    bundle = CodeBundle(files)

    def one(name: str) -> None:
        plan, codec = bundle.plan(prepared.manifests[name]), prepared.codecs[name]
        cmd = unpack_command(job.code_dir, codec=codec)
        r = transports[name].run(cmd, 600, stdin=bundle.payload(plan, codec))
        if not r.ok:
            raise TransportError(f"node {name}: upload failed: {r.stderr.strip()}")

    names = [n.name for n in fleet.nodes]
    _, errors = parallel(names, one)
    if errors:
        raise TransportError("\n".join(str(e) for e in errors.values()))
    now = json.dumps(bundle.manifest, sort_keys=True)
    return dataclasses.replace(prepared, manifests={n: now for n in names})


def free_port_command(python: str) -> str:
    """At the head: a TCP port nothing listens on now (where the c10d store will listen)."""
    code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    return f"{shlex.quote(python)} -I -S -c {shlex.quote(code)}"  # the standard library only


def stop_job(
    transports: Mapping[str, Transport],
    run_id: str,
    *,
    grace_s: float = 10.0,
    only: list[str] | None = None,
) -> dict[str, str]:
    """Stop the run on every node (or `only` these): TERM, then SIGKILL after grace_s."""
    names = only if only is not None else list(transports)
    if not names:
        return {}
    cmd = build_stop_command(run_id, grace_s)

    def one(name: str) -> str:
        r = transports[name].run(cmd, timeout=grace_s + 15)
        return r.stdout.strip() or f"exit {r.exit_code}"

    results, errors = parallel(names, one)
    out = {**results, **{n: f"error: {e}" for n, e in errors.items()}}
    ui.say(f"stop {run_id}: " + ", ".join(f"{n} {out[n]}" for n in names))
    return out


def _stop_quietly(
    transports: Mapping[str, Transport],
    run_id: str,
    names: list[str],
    grace_s: float,
    outcomes: dict[str, str],
) -> None:
    try:
        outcomes.update(stop_job(transports, run_id, grace_s=grace_s, only=names))
    except Exception as e:
        outcomes.update({n: f"error: {e}" for n in names})
        ui.warn(f"stopping run {run_id}: {e}")


def _stop_summary(
    outcomes: Mapping[str, str], failed: str, exit_codes: Mapping[str, int | None] | None = None
) -> str:
    """What the stop did, never more: which nodes stopped, which could not be stopped, and which
    had ended by themselves before any stop (with their exit codes)."""
    bad = {n: o.removeprefix("error: ") for n, o in outcomes.items() if o.startswith("error:")}
    done = [n for n, o in outcomes.items() if not o.startswith("error:") and n != failed]
    ended = {n: c for n, c in (exit_codes or {}).items() if n != failed and n not in outcomes}
    parts = [f"stopped {', '.join(done)}"] if done else []
    if ended:
        codes = ", ".join(f"{n} exit code {'none' if c is None else c}" for n, c in ended.items())
        parts.append(f"the other node(s) had ended already ({codes})")
    parts += [
        f"could NOT stop the job on {n} ({why}): it may still be running there"
        for n, why in bad.items()
    ]
    alone = exit_codes is not None and len(exit_codes) == 1  # nothing else to say
    return "; ".join(parts) or ("" if alone else "no other node to stop")
