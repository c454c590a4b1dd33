"""What the controller and the node agent agree on, in one place both sides import: the node
package's modules (what the controller starts), where gputrain's own copy lives on a node, the
`GPUTRAIN_*` names the helpers read and the exit codes the controller reads back.

Standard library only and no I/O: the controller imports it to build the nodes' commands, the
node modules import it for the same names. The helpers in STANDALONE run before the code is
uploaded (sent on stdin, or copied on their own): they spell their names themselves and a test
(tests/test_layers.py) holds them equal to these.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

PACKAGE = "gputrain_node"

# -- modules the controller starts (python -m MODULE, or the file sent on stdin) ----------------
FETCH_DATA = f"{PACKAGE}.fetch_data"  # the `copy` datasets onto the node (standalone)
MIRROR_OUT = f"{PACKAGE}.mirror_out"  # the out dir to the bucket and back (standalone --restore)
WATCHDOG = f"{PACKAGE}.watchdog"  # stack runs: results to the bucket, autodown (standalone)
BUDGET_GUARD = f"{PACKAGE}.budget_guard"  # billingBudget: beside the head's watchdog (standalone)
TELEMETRY = f"{PACKAGE}.telemetry"  # GPU samples and rank stacks beside torchrun
HEALTHCHECK = f"{PACKAGE}.healthcheck"  # a torchrun ENTRY: are these GPUs and links healthy?
VERTEX_ENTRY = f"{PACKAGE}.vertex_entry"  # Vertex AI's pythonModule on every replica
TORCH_PINS = f"{PACKAGE}.torch_pins"  # the node's torch as pip constraints (standalone, -c)
STANDALONE = (
    FETCH_DATA,
    MIRROR_OUT,
    WATCHDOG,
    BUDGET_GUARD,
    TORCH_PINS,
)  # run by their source, not the code
HEALTHCHECK_ENTRY = ("-m", HEALTHCHECK)
WATCH_HOOK_DIR = "watch_hook"  # in the package: a sitecustomize put first on the ranks' path

PACKAGE_DIR = Path(__file__).resolve().parent


def source_of(module: str) -> Path:
    """This machine's file of a node module (what a standalone helper sends on stdin)."""
    package, _, name = module.partition(".")
    if package != PACKAGE or not name or "." in name:
        raise ValueError(f"{module!r} is not a module of {PACKAGE}")
    return PACKAGE_DIR / f"{name}.py"


NODE_ENTRIES = (HEALTHCHECK,)  # the package's torchrun programs: run from gputrain's own copy


def is_node_entry(entry: Sequence[str]) -> bool:
    """ENTRY runs one of this package's torchrun programs (the health check), not user code."""
    return len(entry) >= 2 and entry[0] == "-m" and entry[1] in NODE_ENTRIES


def is_trainer_flags(entry: Sequence[str]) -> bool:
    """ENTRY is no program, only flags or nothing: Vertex's entry (VERTEX_ENTRY) runs the
    reference trainer with them, and a job file's evaluator pool must not (infra/vertex_jobspec.py
    refuses it before anything is created)."""
    return not entry or (entry[0].startswith("-") and entry[0] != "-m")


# -- where gputrain's own copy lives on a node -------------------------------------------------
#: Under the code dir, in every code bundle: gputrain's copy of this package and of the reference
#: trainer that mirror_out's preemption watcher builds on. `.gputrain/` is a
#: name the upload never takes from the user's directory, so nothing of theirs is ever here, and
#: it is no importable name, so their processes never import from it.
LIB_DIR = ".gputrain/lib"
LIB_PACKAGES = (PACKAGE, "trainer")

# -- environment names: set by the controller (run.sh, the Vertex job), read on the node -------
OUT_ENV = "GPUTRAIN_OUT"  # the node's out dir: comes home, mirrored to the bucket
RUN_ID_ENV = "GPUTRAIN_RUN_ID"
NODE_ROOT_ENV = "GPUTRAIN_NODE_ROOT"  # the directory every node path is under (default $HOME)
OUT_URI_ENV = "GPUTRAIN_OUT_URI"  # gs://BUCKET/PREFIX/: each node's out dir under <node>/
ATTEMPT_ENV = "GPUTRAIN_ATTEMPT"  # this attempt's number (1 = the first)
MIRROR_INTERVAL_ENV = "GPUTRAIN_MIRROR_INTERVAL_S"  # seconds between the mirror's passes
RESUME_ARGS_ENV = "GPUTRAIN_RESUME_ARGS"  # Vertex: --resume-args as a JSON list
CHECKPOINT_URI_ENV = "GPUTRAIN_CHECKPOINT_URI"  # the reference trainer's checkpoints: gs://...
WATCH_DIR_ENV = "GPUTRAIN_WATCH_DIR"  # the run's watch/ dir: telemetry, stacks, markers
HEARTBEAT_ENV = "GPUTRAIN_HEARTBEAT"  # the trainer touches <this>.rank<RANK> after a step
WATCH_PREEMPTION_ENV = "GPUTRAIN_WATCH_PREEMPTION"  # spot nodes: watch the metadata server
DATA_COPY_ENV = "GPUTRAIN_DATA_COPY"  # Vertex: the `copy` datasets each replica downloads
DATA_DIR_ENV = "GPUTRAIN_DATA_DIR"
SCRATCH_ENV = "GPUTRAIN_SCRATCH"  # where local SSD is mounted, when it is
SETUP_ENV = "GPUTRAIN_SETUP"  # Vertex: the setup commands (JSON)
SETUP_TIMEOUT_ENV = "GPUTRAIN_SETUP_TIMEOUT"
REQUIREMENTS_ENV = "GPUTRAIN_REQUIREMENTS"  # Vertex: which requirements to install (JSON)
SECRET_REFS_ENV = "GPUTRAIN_SECRET_REFS"  # Vertex: NAME=sm://... references, never values
SECRET_ENDPOINT_ENV = "GPUTRAIN_SECRET_MANAGER_ENDPOINT"  # tests: the fake Secret Manager
COMPUTE_ENDPOINT_ENV = "GPUTRAIN_COMPUTE_ENDPOINT"  # tests: the fake Compute API

# -- exit codes and lines the controller reads back ---------------------------------------------
FETCH_NO_SPACE = 3  # fetch_data: the node cannot hold the datasets
FETCH_UNREADABLE = 4  # fetch_data: a prefix cannot be read with the node's credentials
FETCH_USER_ERRORS = (FETCH_NO_SPACE, FETCH_UNREADABLE)  # what the user must fix
FETCH_RESULT_PREFIX = "gputrain-data: "  # fetch_data's last line: its summary as JSON
AUTODOWN_RECORD = ".gputrain/autodown.json"  # in the bucket: the stack's last autodown
#: in the bucket beside each node's results (runs/<run-id>/<node>/): the watchdog saw the job end
ENDED_MARKER = ".gputrain-ended.json"
#: in the run dir: the watchdog put this attempt's results in the bucket (a teardown whose SSH
#: download of the node failed disarms it only then)
WATCHDOG_UPLOADED = "results.uploaded"
#: in the node's state dir (.gputrain/, the runs' parent): a controller readying a run on a kept
#: cluster renews it until its own watchdogs are armed; an earlier run's watchdog counts the
#: controller's silence before autodown from the later of this and its run's heartbeat
AUTODOWN_HOLD = "autodown.hold"
#: in the bucket under runs/<run-id>/ and in the results dir: the cost record of one segment of
#: the run (each `train --resume` is one more), by its start in unix milliseconds (scripts/cost)
LEDGER_RECORD = "ledger-{start_ms}.json"
#: a run's single cost record as earlier versions of gputrain kept it there: still read
LEDGER_RECORD_SINGLE = "ledger.json"
#: in the run dir (it comes home with watch/, and the head's results in the bucket hold it): the
#: head's watchdog stopped the job at the run's budget; JSON: budget_usd, spent_usd, hourly_usd, at
BUDGET_MARK = "watch/budget.json"
#: the mark's `by` when the stack's Cloud Billing budget (`billingBudget`) stopped the job
GUARD_STOP = "billingBudget"
PUBSUB_ENDPOINT_ENV = "GPUTRAIN_PUBSUB_ENDPOINT"  # the budget guard's Pub/Sub API (tests: a fake)
#: the watchdog's `budget` setting: what it holds the run to (usd, hourly_usd, interval_s), the
#: run's time so far (elapsed_s, a span: the head counts on from there on its own clock) and what
#: `up`'s partial creates billed for the run before it (before_usd)
BUDGET_FIELDS = ("usd", "hourly_usd", "elapsed_s", "interval_s", "before_usd")
