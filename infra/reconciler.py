"""Recovery with the laptop closed, as the stack declares it: `recover` (auto, always, never) and
`reconcileEvery` (how often Cloud Scheduler starts the stack's Cloud Run job that runs
`gputrain reconcile`), whether a stack gets that job, its schedule and what it costs. Pure.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from infra.keys import format_duration, parse_duration
from infra.stackfile import SpecError

RECOVER = ("auto", "always", "never")
DEFAULT_EVERY = "2m"
MIN_EVERY_S = 60  # Cloud Scheduler's unix-cron has a granularity of one minute
EVERY_ALLOWED = "allowed: 1m to 59m in whole minutes, or whole hours up to 24h, like 2m, 5m, 1h"
#: Cloud Run jobs, Tier 1 regions, instance-based: $0.00001800 per vCPU-second and $0.00000200
#: per GiB-second beyond the free tier (cloud.google.com/run/pricing, as of 2026-11).
VCPU_SECOND_USD = 0.000018
GIB_SECOND_USD = 0.000002
JOB_CPU, JOB_MEMORY_GIB = 1.0, 0.5  # the job's limits: 1 vCPU, 512 MiB
#: The job's execution is billed from container start to exit, rounded up to 100 ms: an idle
#: pass (0.6 s with the interpreter's start, bench/laptop_closed.py on the test bed) plus an
#: allowance for the container's start on Cloud Run (not measured here).
IDLE_PASS_S = 5.0


def job_name(stack: str) -> str:
    """The stack's Cloud Run job (and its Scheduler job)."""
    return f"{stack}-reconcile"


def account_id(stack: str) -> str:
    """The job's service account: `gputrain-rc-<stack>` within IAM's 30 characters. A stack
    name too long for that (over 18) keeps its first 11 characters and a hash of the whole name,
    so two stacks that share a beginning never share an account. Pure."""
    whole = f"gputrain-rc-{stack}"
    if len(whole) <= 30:
        return whole
    digest = hashlib.sha256(stack.encode()).hexdigest()[:6]
    return f"gputrain-rc-{stack[:11].rstrip('-')}-{digest}"


#: What the pass's `pulumi refresh` reads of the stack beyond Compute (compute.viewer), and what
#: an `up` that changes the job writes: per kind of resource, a custom role of the project granted
#: on the stack's own resources of that kind; `project` holds what has no resource-level policy
#: (the project's IAM policy, Scheduler jobs, the custom roles themselves)
REFRESH_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "bucket": ("storage.buckets.get", "storage.buckets.getIamPolicy"),
    "repository": (
        "artifactregistry.repositories.get",
        "artifactregistry.repositories.getIamPolicy",
    ),
    "job": ("run.jobs.get", "run.jobs.getIamPolicy", "run.jobs.update"),
    "account": ("iam.serviceAccounts.get", "iam.serviceAccounts.getIamPolicy"),
    "key": ("cloudkms.cryptoKeys.get", "cloudkms.cryptoKeys.getIamPolicy"),
    "secret": ("secretmanager.secrets.get", "secretmanager.secrets.getIamPolicy"),
    "project": (
        "resourcemanager.projects.getIamPolicy",
        "cloudscheduler.jobs.get",
        "iam.roles.get",
    ),
}


def refresh_role_id(stack: str, kind: str, account_unique_id: str | None) -> str:
    """A custom role's id (`[a-zA-Z0-9_.]`, at most 64): per stack and kind, and per creation of
    the job's account (its unique id), since a deleted custom role's id stays taken for up to 37
    days and a stack may come back sooner. Pure."""
    stem = re.sub(r"[^A-Za-z0-9_.]", "_", stack)[:24]
    return f"gputrainRc.{kind}.{stem}.{account_unique_id or 0}"[:64]


def is_refresh_role(role_id: str, stack: str) -> bool:
    """Whether a custom role id is one of `stack`'s reconcile job's (refresh_role_id's shape,
    any kind, any creation of the account). Pure."""
    stem = re.sub(r"[^A-Za-z0-9_.]", "_", stack)[:24]
    kind, dot, rest = role_id.removeprefix("gputrainRc.").partition(".")
    return role_id.startswith("gputrainRc.") and bool(kind and dot) and rest.startswith(f"{stem}.")


def run_uri(project: str, region: str, job: str) -> str:
    """Cloud Run Admin API v2 `jobs.run`: what the Scheduler job POSTs to."""
    return f"https://run.googleapis.com/v2/projects/{project}/locations/{region}/jobs/{job}:run"


#: The environment variable the Pulumi CLI reads its state backend from (also the job's own)
BACKEND_ENV = "PULUMI_BACKEND_URL"
KMS_SCHEME = "gcpkms://"
#: The job's container gets the stack file (its text: secure values stay ciphertext) here;
#: `gputrain reconcile` writes it into the project directory before it reads the stack
STACK_FILE_ENV = "GPUTRAIN_STACK_FILE"


@dataclass(frozen=True)
class JobReach:
    """Whether a Cloud Run job could run a pass: it needs the stack's Pulumi state (a `gs://`
    backend, named by PULUMI_BACKEND_URL where `up` runs, so the program can hand it on) and its
    secrets (the SSH key) under a Cloud KMS key its account may use. A passphrase or a local
    state stays on the machine that has them."""

    backend: str | None  # PULUMI_BACKEND_URL, e.g. gs://my-state; None: not set
    secrets_provider: str | None  # the stack file's `secretsprovider`; None: a passphrase

    @property
    def state_bucket(self) -> str | None:
        """The backend's bucket (gs://BUCKET[/path]); None: not a gs:// backend."""
        if not (self.backend or "").startswith("gs://"):
            return None
        return (self.backend or "")[5:].split("/", 1)[0].split("?", 1)[0] or None

    @property
    def kms_key(self) -> str | None:
        """projects/P/locations/L/keyRings/R/cryptoKeys/K of a gcpkms:// provider."""
        provider = self.secrets_provider or ""
        if not provider.startswith(KMS_SCHEME):
            return None
        return provider[len(KMS_SCHEME) :].split("?", 1)[0] or None

    @property
    def missing(self) -> str | None:
        """What keeps a job from running a pass; None: nothing."""
        if self.backend is None:
            return f"{BACKEND_ENV} does not name the stack's Pulumi state (a gs:// backend)"
        if self.state_bucket is None:
            return f"the Pulumi state is in {self.backend}, not in a gs:// bucket"
        if self.kms_key is None:
            return "the stack's secrets are not under a gcpkms:// secrets provider"
        return None


def job_reach(environ: Mapping[str, str], secrets_provider: str | None) -> JobReach:
    return JobReach((environ.get(BACKEND_ENV) or "").strip() or None, secrets_provider)


def parse_recover(text: str, setting: str = "gputrain:recover") -> str:
    value = text.strip().lower() or "auto"
    if value not in RECOVER:
        raise SpecError(
            f"{setting} {text!r}: allowed: auto (when the VMs can be preempted: spot or "
            "flex-start), always, never"
        )
    return value


def parse_every(text: str, setting: str = "gputrain:reconcileEvery") -> int:
    """Seconds between passes: whole minutes, at least one."""
    try:
        seconds = parse_duration(text.strip() or DEFAULT_EVERY)
    except ValueError:
        raise SpecError(f"{setting} {text!r}: {EVERY_ALLOWED}") from None
    if seconds < MIN_EVERY_S:
        raise SpecError(f"{setting} {text!r}: below 1m; {EVERY_ALLOWED}")
    minutes = seconds // 60
    if seconds % 60 or (minutes >= 60 and (minutes % 60 or minutes > 1440)):
        raise SpecError(f"{setting} {text!r}: not a cron step; {EVERY_ALLOWED}")
    return seconds


def wanted(recover: str, capacity: str, reach: JobReach | None = None) -> bool:
    """Whether the stack declares the reconciler: `always`, or `auto` where GCE may take VMs
    away by design (spot, flex-start; host errors on other capacity are the laptop's to recover)
    and a job could act (`reach`; None: unknown, so not)."""
    return why_off(recover, capacity, reach) is None


def why_off(recover: str, capacity: str, reach: JobReach | None) -> str | None:
    """Why the stack declares no reconciler; None: it declares one."""
    if recover == "always":
        return None
    if recover == "never":
        return "recover: never"
    if capacity not in ("spot", "flex-start"):
        return f"{capacity} VMs are not preempted"
    missing = reach.missing if reach is not None else "the Pulumi state backend is unknown"
    return f"{missing}, so a Cloud Run job could not act" if missing else None


def schedule(every_s: int) -> str:
    """Cloud Scheduler's unix-cron for every N minutes (hours when N is a multiple of 60)."""
    minutes = every_s // 60
    if minutes < 60:
        return f"*/{minutes} * * * *"
    hours = minutes // 60
    return "0 0 * * *" if hours >= 24 else f"0 */{hours} * * *"


def idle_cost_per_day(every_s: int, pass_s: float = IDLE_PASS_S) -> float:
    """USD a day of passes with nothing to do (list price, before the free tier)."""
    per_second = JOB_CPU * VCPU_SECOND_USD + JOB_MEMORY_GIB * GIB_SECOND_USD
    return 86400 / every_s * pass_s * per_second


def plan_line(recover: str, capacity: str, every_s: int, reach: JobReach | None = None) -> str:
    """What `plan` says about it."""
    why = why_off(recover, capacity, reach)
    if why is not None:
        return f"laptop-closed recovery: off ({why}; `recover: always` turns it on)"
    return (
        f"laptop-closed recovery: a Cloud Run job runs `gputrain reconcile` every "
        f"{format_duration(every_s)} (Cloud Scheduler); idle about "
        f"${idle_cost_per_day(every_s):.3f}/day at list price, before Cloud Run's free tier"
    )
