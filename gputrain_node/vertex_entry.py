"""Vertex AI's `pythonModule`: `python -m gputrain_node.vertex_entry [ENTRY]` on every replica.

ENTRY is what `gputrain run -- ENTRY` names, as torchrun takes it: `-m MODULE [args]` (any module
in the job's package: the trainer, the health check, the user's own), `SCRIPT.py [args]` (a file
of the working directory the package carries), or just trainer flags (`--preset tiny`: the
reference trainer). The processes start in that working directory, as they do on GCE.

Vertex starts one container per replica and describes the job in CLUSTER_SPEC: pools `workerpool0`
(the chief, one replica) and `workerpool1` (the other workers), each a list of `host:port`, and this
replica's `task {type, index}`. That gives the node count and this node's rank; the chief's address
(or MASTER_ADDR/MASTER_PORT where Vertex sets them) is the rendezvous. Static rendezvous keeps the
chief at global rank 0, the one rank that writes to the bucket. A replica of `workerpool3` (an
evaluator, a job file's pool 3) runs its ENTRY on its own, outside the trainers' world.
AIP_CHECKPOINT_DIR becomes the checkpoint URI; the chief copies summary.json and metrics.jsonl
to AIP_MODEL_DIR at the end.
Before torchrun every replica installs the job's requirements and runs its `setup`
(gputrain_node/vertex_setup.py); its secrets (read first: a refused one fails at once) join the
environment torchrun inherits only after setup. An entry other than the reference trainer gets
its out dir mirrored to the bucket and back on a restart (gputrain_node/vertex_mirror.py).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from gputrain_node.contract import (
    ATTEMPT_ENV,
    CHECKPOINT_URI_ENV,
    MIRROR_INTERVAL_ENV,
    OUT_ENV,
    OUT_URI_ENV,
    SECRET_ENDPOINT_ENV,
    SECRET_REFS_ENV,
    is_trainer_flags,
)
from gputrain_node.fetch_data import FetchError, copy_on_vertex
from gputrain_node.mirror_out import Target
from gputrain_node.vertex_mirror import (
    ATTEMPT_FILE,
    InputError,
    ReplicaOutputs,
    replica_name,
    resume_args,
)
from gputrain_node.vertex_setup import SETUP_LOG, SetupFailed, prepare

TRAINER_POOLS = ("workerpool0", "workerpool1")  # pool 2 is for reduction servers, 3 for evaluators
EVALUATOR_POOL = "workerpool3"  # its replicas run ENTRY each on its own, outside torchrun's world
OUTPUTS = ("summary.json", "metrics.jsonl")  # first; then every other file of the out dir
TRAINER = ("-m", "trainer.train")
BARRIER_GRACE_S = 3.0  # after a stop signal: how long torchrun may outlive all its workers
CHECKPOINT_FILE = "ckpt-"  # local checkpoint copies: the bucket has them under AIP_CHECKPOINT_DIR
#: GCS bucket names (the dotted 222-character form is not used here).
BUCKET = re.compile(r"^[a-z0-9][a-z0-9_.-]{1,61}[a-z0-9]$")


def parse_gs_uri(value: str, setting: str) -> Target:
    """`gs://BUCKET[/PREFIX]`; anything else is one line naming the setting."""
    bucket, _, prefix = value.removeprefix("gs://").partition("/")
    if (
        not value.startswith("gs://")
        or not BUCKET.match(bucket)
        or bucket.startswith("goog")
        or "google" in bucket
        or "//" in prefix
    ):
        raise InputError(
            f"{setting} {value}: must be gs://BUCKET[/PREFIX], BUCKET 3-63 of a-z 0-9 - _ . "
            "starting and ending with a letter or digit, without 'goog' as prefix or 'google'"
        )
    return Target.parse(value)


def upload_files(paths: list[Path], where: Target) -> list[str]:
    """Plain copies of the run's outputs under `where`; missing files are skipped."""
    from google.cloud import storage

    bucket = storage.Client().bucket(where.bucket)
    sent = []
    for path in paths:
        if path.is_file():
            bucket.blob(where.prefix + path.name).upload_from_filename(str(path), checksum="crc32c")
            sent.append(path.name)
    return sent


def reference_trainer(program: tuple[str, ...]) -> bool:
    """Whether the entry is gputrain's reference trainer: `-m trainer.train` (or bare flags)
    where the job's package carries gputrain's `trainer`, not a `trainer/` of the user's own."""
    if program != TRAINER:
        return False
    try:
        import gputrain_code  # only in the job's package (scripts/targets/vertex/job.py)
    except ImportError:
        return True  # run from a checkout of gputrain: its own trainer
    return bool(getattr(gputrain_code, "REFERENCE_TRAINER", True))


def reference_config(args: list[str]) -> tuple[Path, bool]:
    """(the out dir, whether on CPU) from the reference trainer's flags: bad flags fail here,
    in one line, before torchrun starts. Imported only for it: `trainer` is gputrain's then."""
    from trainer.config import parse_config
    from trainer.errors import InputError as TrainerInputError

    try:
        cfg = parse_config(args)
    except TrainerInputError as e:
        raise InputError(str(e)) from None
    return cfg.out, cfg.device == "cpu"


@dataclass(frozen=True)
class Placement:
    """Where this replica sits in the job: what torchrun needs besides the process count."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    task: str = "workerpool0[0]"
    evaluator: int | None = None  # an evaluator's index (pool 3): a world of its own

    @property
    def replica(self) -> str:
        """Its name in the bucket, as in its log lines: chief, worker-1, ..., evaluator-0."""
        if self.evaluator is not None:
            return f"evaluator-{self.evaluator}"
        return replica_name(self.node_rank)


def _host_port(entry: object, where: str) -> tuple[str, int]:
    host, _, port = str(entry).rpartition(":")
    if not isinstance(entry, str) or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"CLUSTER_SPEC: {where} is {entry!r}, expected 'host:port'")
    return host, int(port)


def parse_cluster_spec(text: str) -> Placement:
    """CLUSTER_SPEC JSON -> this replica's Placement; a malformed spec is one line naming the part."""
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise InputError(f"CLUSTER_SPEC: not JSON ({e})") from None
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    task = spec.get("task") if isinstance(spec, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise InputError("CLUSTER_SPEC: expected an object with 'cluster' and 'task'")
    pools = {name: cluster.get(name, []) for name in TRAINER_POOLS}
    if not all(isinstance(hosts, list) for hosts in pools.values()):
        raise InputError("CLUSTER_SPEC: each cluster pool must be a list of 'host:port'")
    if len(pools["workerpool0"]) != 1:
        raise InputError(
            f"CLUSTER_SPEC: workerpool0 has {len(pools['workerpool0'])} replicas, "
            "expected exactly 1 (the chief)"
        )
    kind, index = task.get("type"), task.get("index")
    if kind not in (*pools, EVALUATOR_POOL):
        raise InputError(
            f"CLUSTER_SPEC: task type {kind!r} does not run the trainer "
            f"(allowed: {', '.join(TRAINER_POOLS)}, or {EVALUATOR_POOL} on its own)"
        )
    replicas = cluster.get(kind)
    count = len(replicas) if isinstance(replicas, list) else 0
    if not isinstance(index, int) or not 0 <= index < count:
        raise InputError(f"CLUSTER_SPEC: task index {index!r} is outside {kind}'s {count} replicas")
    if kind == EVALUATOR_POOL:
        return Placement(1, 0, "127.0.0.1", 0, f"{kind}[{index}]", evaluator=index)
    for name, hosts in pools.items():
        for i, entry in enumerate(hosts):
            _host_port(entry, f"{name}[{i}]")
    host, port = _host_port(pools["workerpool0"][0], "workerpool0[0]")
    rank = index if kind == "workerpool0" else 1 + index
    return Placement(1 + len(pools["workerpool1"]), rank, host, port, f"{kind}[{index}]")


def placement_from_env(env: Mapping[str, str]) -> Placement:
    """CLUSTER_SPEC first; MASTER_ADDR/MASTER_PORT override its rendezvous, and RANK/WORLD_SIZE
    stand in for it where it is absent; with none of them, a single node."""
    if env.get("CLUSTER_SPEC"):
        placement = parse_cluster_spec(env["CLUSTER_SPEC"])
    elif env.get("WORLD_SIZE") and env.get("RANK"):
        nnodes, rank = _int(env, "WORLD_SIZE", 1), _int(env, "RANK", 0)
        if rank >= nnodes:
            raise InputError(f"RANK {rank}: must be below WORLD_SIZE {nnodes}")
        placement = Placement(nnodes, rank, "", 0, f"rank {rank}")
    else:
        placement = Placement(1, 0, "127.0.0.1", 0, "single replica")
    addr = env.get("MASTER_ADDR") or placement.master_addr
    port = _int(env, "MASTER_PORT", 1) if env.get("MASTER_PORT") else placement.master_port
    if placement.nnodes > 1 and not (addr and port):
        raise InputError(
            "MASTER_ADDR/MASTER_PORT: needed when RANK/WORLD_SIZE replace CLUSTER_SPEC"
        )
    if placement.evaluator is not None:
        return placement  # standalone: the trainers' rendezvous is not its
    return Placement(placement.nnodes, placement.node_rank, addr, port, placement.task)


def _int(env: Mapping[str, str], name: str, least: int) -> int:
    value = env[name]
    if not value.isdigit() or int(value) < least:
        raise InputError(f"{name} {value}: must be a whole number >= {least}")
    return int(value)


def split_entry(argv: list[str], code_root: Path) -> tuple[tuple[str, ...], list[str]]:
    """(torchrun's program: `-m MODULE` or a script path, its arguments). Arguments alone are the
    reference trainer's; a script must be a file of the job's code (one line otherwise)."""
    if is_trainer_flags(argv):
        return TRAINER, argv
    if argv[0] == "-m":
        if len(argv) < 2 or not argv[1] or argv[1].startswith("-"):
            raise InputError("entry: -m needs a module name, e.g. -m trainer.train")
        return ("-m", argv[1]), argv[2:]
    script = code_root / argv[0]
    if not script.is_file():
        raise InputError(
            f"entry script {argv[0]}: not in the job's code ({code_root}); "
            "give a path relative to the working directory, or -m MODULE"
        )
    return (str(script),), argv[1:]


def expand_out(arg: str, out: str) -> str:
    """`{out}` in an ENTRY argument is the job's out dir (as on the SSH targets); `{{out}}` is
    the literal text."""
    literal = "\0"
    return arg.replace("{{out}}", literal).replace("{out}", out).replace(literal, "{out}")


def code_root() -> Path:
    """The working directory the job's package carries (gputrain_code/files), else this one."""
    try:
        import gputrain_code  # only in the job's package (scripts/targets/vertex/job.py)
    except ImportError:
        return Path.cwd()
    return Path(gputrain_code.ROOT)


def output_files(out: Path) -> list[Path]:
    """What the chief copies to AIP_MODEL_DIR: the summary and metrics first, then the out dir's
    other files — not checkpoints, which are in the bucket already."""
    others = sorted(
        p
        for p in (out.iterdir() if out.is_dir() else ())
        if p.is_file()
        and p.name not in (*OUTPUTS, ATTEMPT_FILE)
        and not p.name.startswith(CHECKPOINT_FILE)
    )
    return [out / name for name in OUTPUTS] + others


def torchrun_argv(
    placement: Placement,
    nproc: int | str,
    trainer_args: list[str],
    program: tuple[str, ...] = TRAINER,
    *,
    python: str = sys.executable,  # the requirements' venv, when the job has requirements
) -> list[str]:
    """torchrun for this node: static rendezvous at the chief, so node ranks are Vertex's."""
    argv = [python, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if placement.nnodes == 1:
        argv += ["--standalone", "--nnodes=1"]
    else:
        argv += [
            f"--nnodes={placement.nnodes}",
            f"--node-rank={placement.node_rank}",
            f"--master-addr={placement.master_addr}",
            f"--master-port={placement.master_port}",
        ]
    return [*argv, *program, *trainer_args]


#: The job's secrets as references, never values: {"NAME": "projects/P/secrets/S/versions/V"}
#: (scripts/job/environment.py writes it); resolved here, inside the job, into this process's
#: memory.


def resolve_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """Each secret's value from Secret Manager with the job's service account; InputError names
    the secret that cannot be read (the account needs roles/secretmanager.secretAccessor)."""
    refs = json.loads(environ.get(SECRET_REFS_ENV) or "{}")
    if not refs:
        return {}
    from google.cloud import secretmanager

    options: dict[str, object] = {}
    if environ.get(SECRET_ENDPOINT_ENV):
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials

        options = {
            "credentials": AnonymousCredentials(),
            "transport": "rest",
            "client_options": ClientOptions(api_endpoint=environ[SECRET_ENDPOINT_ENV]),
        }
    client = secretmanager.SecretManagerServiceClient(**options)  # type: ignore[arg-type]
    values = {}
    for name, resource in refs.items():
        try:
            answer = client.access_secret_version(name=resource, timeout=60)
        except Exception as e:
            raise InputError(
                f"secret {name}: cannot read {resource} ({type(e).__name__}); the job's service "
                "account needs roles/secretmanager.secretAccessor on it (`gputrain up` grants "
                "it for the secrets the stack's `secrets` key names)"
            ) from None
        values[name] = bytes(answer.payload.data).decode("utf-8")
    return values


def replica_outputs(
    env: Mapping[str, str], out: Path, replica: str, program: tuple[str, ...]
) -> ReplicaOutputs | None:
    """The out dir's mirror where the session asked for one (GPUTRAIN_OUT_URI) and the entry is
    not the reference trainer (bare flags are its flags: it checkpoints to the bucket itself)."""
    uri = env.get(OUT_URI_ENV)
    if not uri or reference_trainer(program):
        return None
    parse_gs_uri(uri, OUT_URI_ENV)
    interval = env.get(MIRROR_INTERVAL_ENV) or "10"
    try:
        interval_s = float(interval)
    except ValueError:
        interval_s = 0.0
    if not interval_s > 0:
        raise InputError(f"{MIRROR_INTERVAL_ENV} {interval!r}: expected seconds > 0")
    return ReplicaOutputs(out, uri, replica, interval_s=interval_s)


def nproc_here(cpu: bool, devices: str = "/dev/nvidia[0-9]*") -> int | str:
    """torchrun's --nproc-per-node: 1 without an NVIDIA device (or for the trainer's --device
    cpu), else `gpu`: torchrun counts them itself (it imports torch anyway; counting here would
    import it twice, a second or more before the first step on every replica)."""
    return 1 if cpu or not glob.glob(devices) else "gpu"


def live_children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, zombies left out (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid) and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def run_forwarding_signals(
    argv: list[str], cwd: Path | None = None, on_signal: Callable[[], None] = lambda: None
) -> int:
    """Run torchrun; SIGTERM/SIGINT (a cancel or a spot stop) go on to it, and we wait for it.
    A torchrun that after the signal has had no live worker for BARRIER_GRACE_S but is still
    there waits in its exit barrier for nodes that are gone (a wait deaf to signals, 300 s): it is
    killed, as the chief's outputs must go up within the stop's grace, not after it."""
    proc = subprocess.Popen(argv, cwd=cwd)
    signalled: list[float] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        proc.send_signal(signum)
        signalled.append(time.monotonic())
        on_signal()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    childless_since: float | None = None
    while True:
        try:
            code = proc.wait(timeout=0.5)
            return code if code >= 0 else 128 - code  # killed by a signal: as a shell says it
        except subprocess.TimeoutExpired:
            if not signalled:
                continue
            if live_children(proc.pid):
                childless_since = None
                continue
            now = time.monotonic()
            childless_since = childless_since or now  # an exit right after its workers' is quick
            if now - childless_since > BARRIER_GRACE_S:
                print(
                    "vertex: torchrun's workers have ended and it still waits for other nodes "
                    "(its exit barrier): stopped",
                    flush=True,
                )
                proc.kill()


def main(argv: list[str] | None = None) -> None:
    entry = sys.argv[1:] if argv is None else argv
    workdir = code_root()
    # Every process of the job writes its results here: absolute, as it starts in `workdir`.
    os.environ[OUT_ENV] = str(Path(os.environ.get(OUT_ENV) or "out").absolute())
    try:
        placement = placement_from_env(os.environ)
        if os.environ.get("AIP_CHECKPOINT_DIR"):
            parse_gs_uri(os.environ["AIP_CHECKPOINT_DIR"], "AIP_CHECKPOINT_DIR")
            os.environ.setdefault(CHECKPOINT_URI_ENV, os.environ["AIP_CHECKPOINT_DIR"])
        outputs = os.environ.get("AIP_MODEL_DIR")
        model_dir = parse_gs_uri(outputs, "AIP_MODEL_DIR") if outputs else None
        program, args = split_entry(entry, workdir)
        secrets = resolve_secrets(os.environ)  # memory only: torchrun inherits them (not setup)
        os.environ.pop(SECRET_REFS_ENV, None)
        args = [expand_out(a, os.environ[OUT_ENV]) for a in args]
        out, cpu = Path(os.environ[OUT_ENV]), False
        if reference_trainer(program):
            if placement.evaluator is not None:  # it would train, into the chief's checkpoints
                raise InputError(
                    f"ENTRY on {placement.task}: the reference trainer trains; an evaluator runs "
                    "your own -m MODULE or script.py"
                )
            out_dir, cpu = reference_config(args)
            out = workdir / out_dir
        mirrored = replica_outputs(os.environ, out, placement.replica, program)
        extra = [expand_out(a, os.environ[OUT_ENV]) for a in resume_args(os.environ)]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    nproc = nproc_here(cpu)
    processes = "one process per GPU" if nproc == "gpu" else f"{nproc} process(es)"
    where = (
        f"node {placement.node_rank} of {placement.nnodes}, {processes}, rendezvous "
        f"{placement.master_addr}:{placement.master_port}"
        if placement.evaluator is None
        else f"{placement.replica} on its own (not in the trainers' world), {processes}"
    )
    print(
        f"vertex: {placement.task} is {where}, "
        f"runs {' '.join(program)} in {workdir}, "
        f"checkpoints {os.environ.get(CHECKPOINT_URI_ENV) or 'local only'}, "
        f"outputs {model_dir.uri if model_dir else 'local only'}",
        flush=True,
    )
    if mirrored is not None:  # a restart's files come back before anything writes there
        try:
            attempt = mirrored.restore()
        except Exception as e:  # starting over from nothing would lose the run: say so, stop
            print(f"error: restoring {mirrored.uri} failed: {e}", file=sys.stderr, flush=True)
            sys.exit(1)
        os.environ[ATTEMPT_ENV] = str(attempt)
        args += extra if attempt > 1 else []
    try:
        # requirements, then `setup`; their lines also in the chief's outputs as setup.log
        python = prepare(os.environ, workdir, placement.task, log=out / SETUP_LOG)
    except SetupFailed as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    os.environ.update(secrets)
    try:
        copy_on_vertex(os.environ, workdir, str(placement.task))  # `copy` datasets, if any
    except FetchError as e:
        print(f"error: data: {e}", file=sys.stderr, flush=True)
        sys.exit(e.code)
    argv = torchrun_argv(placement, nproc, args, program, python=python)
    if mirrored is None:
        status = run_forwarding_signals(argv, cwd=workdir)
    else:
        mirrored.start()
        status = run_forwarding_signals(argv, cwd=workdir, on_signal=mirrored.flush)
        mirrored.stop()
    chief = placement.node_rank == 0 and placement.evaluator is None
    if chief and model_dir is not None:  # on failure too: the results so far
        try:
            sent = upload_files(output_files(out), model_dir)
            print(f"vertex: copied {', '.join(sent) or 'nothing'} to {model_dir.uri}", flush=True)
        except Exception as e:  # the training's own status still decides the exit code
            print(
                f"vertex: copying outputs to {model_dir.uri} failed: {e}",
                file=sys.stderr,
                flush=True,
            )
            status = status or 1
    sys.exit(status)


if __name__ == "__main__":
    main()
