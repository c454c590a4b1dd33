"""Autodown on a `--stack` cluster: what its watchdogs are told (from the spec, the command's
options and the stack outputs), and the line `status` prints once autodown has ended a cluster."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from scripts import ui
from scripts.job.autodown import (
    Autodown,
    RunBudget,
    autodown_line,
    instances_of,
    last_autodown,
)
from scripts.run_plan import resolve_autodown

if TYPE_CHECKING:
    from infra.outputs import StackOutputs
    from infra.spec import ClusterSpec
    from scripts.targets.base import RunOptions
    from scripts.targets.gce.clients import GceClients

HEARTBEAT_S = 10.0  # the controller's touch; autodown is >= 60 s: 6 beats may fail in a row


def run_budget(
    spec: ClusterSpec, opts: RunOptions, started_at: float, before_usd: float | None = 0.0
) -> RunBudget | None:
    """What the head's watchdog holds the run to: --budget, else the stack's `budget`, at the
    cluster's worst-case rate (the plan's: check_caps passed) from `started_at`, beside what
    `up`'s partial creates billed for it before (`before_usd`; None: unpriced, none counted)."""
    from scripts.run_plan import BUDGET_INTERVAL_ENV, budget_interval_s, worst_hourly

    usd = opts.budget if opts.budget is not None else spec.budget
    rate = None if usd is None else worst_hourly(spec)
    if usd is None or rate is None:
        return None
    ahead = budget_interval_s(os.environ.get(BUDGET_INTERVAL_ENV))
    return RunBudget(usd, rate, started_at, ahead, before_usd or 0.0)


def stack_autodown(
    spec: ClusterSpec,
    out: StackOutputs,
    bucket: str | None,
    opts: RunOptions,
    clients: GceClients,
    started_at: float,
    partial_usd: float | None = 0.0,
    ledger: dict[str, Any] | None = None,
) -> Autodown | None:
    """The watchdogs' settings; None for a stack from before it had a bucket (nowhere to keep
    the results, so nothing may be deleted). `started_at`: where the run's spend counts from;
    `partial_usd`: what `up`'s partial creates billed for it before (its cost record's);
    `ledger`: that record as the run's launch made it (a relaunch goes on from it)."""
    if bucket is None:
        return None
    from scripts.cost.ledger import launch_record, with_zone
    from scripts.targets.stack.target import target_name

    seconds: float | None = resolve_autodown(spec.autodown_s, keep=opts.keep, flag=opts.autodown)
    if seconds is not None and clients.autodown_s is not None:
        seconds = clients.autodown_s  # tests: shorter than the floor
    beat = HEARTBEAT_S if seconds is None else min(HEARTBEAT_S, seconds / 6)
    if ledger:  # a relaunch: what `up`'s partial creates billed is the record's
        partial_usd = ledger.get("partial_usd")
    return Autodown(
        stack=spec.stack,
        project=out.project,
        bucket=bucket,
        instances=instances_of([(n.name, n.zone, n.role) for n in out.nodes]),
        autodown_s=seconds,
        heartbeat_s=beat,
        notify=tuple(dict.fromkeys((*opts.notify, *spec.notify))),
        budget=run_budget(spec, opts, started_at, partial_usd),
        ledger=with_zone(ledger, out.zone)
        if ledger
        else launch_record(target_name(spec.stack), spec, started_at, out.zone, partial_usd),
        guard=guard_subscription(spec, out.project),
    )


def guard_subscription(spec: ClusterSpec, project: str) -> str | None:
    """billingBudget: the budget's subscription the head's watchdog pulls. Pure."""
    if spec.billing_budget is None:
        return None
    from infra.billing import guard_name

    return f"projects/{project}/subscriptions/{guard_name(spec.stack)}"


def say_last_autodown(spec: ClusterSpec, clients: GceClients) -> None:
    """`status`: the record the head's watchdog left in the stack's bucket, when there is one."""
    if not spec.bucket_name or not spec.project:
        return
    try:
        record = last_autodown(clients.storage(spec.project), spec.bucket_name, spec.bucket_prefix)
    except Exception as e:  # status is a report: a bucket it cannot read is one line
        ui.warn(f"status: could not read gs://{spec.bucket_name} for autodown's record: {e}")
        return
    if record is not None:
        ui.say(f"status: {autodown_line(record)}")


def bucket_has_run(bucket_uri: str | None, project: str, run_id: str) -> bool:
    """Anything of the run (checkpoints, results) in the stack's bucket (`--resume`)."""
    if not bucket_uri:
        return False
    from infra.gcp.gcs import StorageApi

    bucket, _, prefix = bucket_uri.removeprefix("gs://").partition("/")
    storage = StorageApi(project)
    return storage.bucket_exists(bucket) and bool(
        storage.list_objects(bucket, f"{prefix}runs/{run_id}/")
    )
