"""Teardown of a stack: the bucket's results home and the bucket emptied (or kept), refresh +
destroy (retried, a stale lock cleared when the user said so), then a sweep that must find nothing
carrying the stack's labels or name — but a bucket kept on purpose."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from infra.base.errors import GputrainError, UserError
from infra.base.retry import GaveUp, Waiting, every, poll_until
from infra.spec import ClusterSpec
from infra.sweep import Leftover, sweep
from scripts import ui
from scripts.targets.gce.bucket import BUCKET_TYPE, KeptBucket, settle_bucket
from scripts.targets.gce.clients import GceClients
from scripts.targets.gce.offer_failover import CANDIDATE_CONFIG_KEY
from scripts.targets.gce.stack import (
    ZONE_CONFIG_KEY,
    PulumiMissingError,
    StackLockedError,
    StackRunner,
)


def pulumi_line(line: str) -> None:
    """Pulumi's own progress, indented under ours."""
    if line.strip():
        ui.say(f"  pulumi: {line.rstrip()}")


def teardown(
    spec: ClusterSpec,
    runner: StackRunner,
    clients: GceClients,
    *,
    runs_dir: Path,
    clear_stale_lock: bool = False,
    keep_bucket: bool = False,
) -> None:
    """Destroy the stack, retried with `refresh` first (the TTL may have deleted VMs already);
    then the sweep must find nothing. The stack's own bucket is emptied only once the results in
    it are under `runs_dir`; it survives the destroy with `keep_bucket` or when they could not be
    downloaded. `clear_stale_lock` (the user's `down`): a lock left by an update whose process
    died is cleared with `pulumi cancel`, said out loud, and destroy goes on."""
    kept = _settle_bucket(spec, runner, clients, runs_dir, keep_bucket)
    failure = destroy_stack(
        runner,
        spec.stack,
        attempts=clients.destroy_attempts,
        pause_s=clients.retry_pause_s,
        clear_stale_lock=clear_stale_lock,
        keep_types=(BUCKET_TYPE,) if kept else (),
    )
    for key in (ZONE_CONFIG_KEY, CANDIDATE_CONFIG_KEY):  # failover's picks: the next up ranks anew
        try:
            runner.remove_config(key)
        except Exception as exc:
            ui.warn(f"could not clear {key}: {exc}")
    leftovers = show_leftovers(spec, clients, kept=kept.name if kept else None)
    end_teardown(spec.stack, failure, len(leftovers), kept)


def end_teardown(
    stack: str, failure: GaveUp | None, leftovers: int, kept: KeptBucket | None
) -> None:
    """Say the stack is gone (all but a kept bucket), or raise naming everything that is not."""
    problem = kept.problem if kept else None
    if failure is not None or leftovers or problem:
        raise GputrainError(
            f"teardown of stack {stack} is incomplete: "
            + (f"destroy failed ({failure.reason}); " if failure else "")
            + (f"{leftovers} resource(s) still exist (listed above); " if leftovers else "")
            + (f"bucket gs://{kept.name} kept: {problem}; " if kept and problem else "")
            + f"run `gputrain down --stack {stack}` again or delete them in the console."
        )
    left = f", all but its bucket gs://{kept.name}" if kept else "; sweep found nothing left"
    ui.say(f"down: stack {stack} destroyed{left}")


def destroy_stack(
    runner: StackRunner,
    stack: str,
    *,
    attempts: int,
    pause_s: float,
    clear_stale_lock: bool = False,
    keep_types: Sequence[str] = (),
) -> GaveUp | None:
    """refresh + destroy (all but `keep_types`), retried; the last failure, or None. Any target
    made of a Pulumi stack (GCE, Vertex AI) ends this way."""
    attempts_made = 0

    def destroy() -> None:
        nonlocal attempts_made, clear_stale_lock
        attempts_made += 1
        ui.say(f"down: destroying stack {stack} (attempt {attempts_made})")
        try:
            runner.refresh(on_output=None)
            runner.destroy(on_output=pulumi_line, keep=keep_types)
        except StackLockedError:
            if not clear_stale_lock:
                raise
            clear_stale_lock = False  # once: a lock that comes back is someone's live update
            ui.say(
                f"down: stack {stack} is locked by an update that is no longer running; "
                "clearing the lock (pulumi cancel) and destroying again"
            )
            runner.cancel()
            runner.refresh(on_output=None)
            runner.destroy(on_output=pulumi_line, keep=keep_types)

    def failed(w: Waiting) -> None:
        ui.warn(f"destroy attempt {w.attempts} failed: {w.reason}")

    try:
        poll_until(
            destroy,
            max_attempts=attempts,
            delay=every(pause_s),
            retry_on=(Exception,),
            fatal=(PulumiMissingError,),
            on_wait=failed,
        )
    except GaveUp as e:
        ui.warn(f"destroy attempt {e.attempts} failed: {e.reason}")
        return e
    return None


def _settle_bucket(
    spec: ClusterSpec, runner: StackRunner, clients: GceClients, runs_dir: Path, keep: bool
) -> KeptBucket | None:
    """The bucket the destroy must leave alone, if any (see scripts/targets/gce/bucket.py)."""
    try:
        outputs = runner.outputs()
    except Exception as e:  # no outputs, no bucket known to us: destroy decides
        ui.warn(f"down: could not read the outputs of stack {spec.stack}: {e}")
        return None
    return settle_bucket(
        outputs, clients.storage(spec.project), stack=spec.stack, runs_dir=runs_dir, keep=keep
    )


def show_leftovers(
    spec: ClusterSpec, clients: GceClients, *, kept: str | None = None
) -> list[Leftover]:
    """Whatever still carries the stack's labels or name prefix, printed loudly; a bucket kept
    on purpose is not a leftover."""
    if not spec.project:
        raise UserError(f"gcp:project is not set for stack {spec.stack}")
    found = sweep(
        spec.project, spec.stack, api=clients.compute(), storage=clients.storage(spec.project)
    )
    leftovers = [x for x in found if not (x.kind == "bucket" and x.name == kept)]
    if leftovers:
        ui.table(
            f"LEFT BEHIND by stack {spec.stack}",
            ["kind", "name", "where", "matched by"],
            [[x.kind, x.name, x.location, x.matched_by] for x in leftovers],
        )
    return leftovers
