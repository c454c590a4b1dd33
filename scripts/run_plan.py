"""The run plan: every check that must pass before anything is created, in one function and the
README's order, and one frozen record of everything the run needs (dstack's RunSpec ->
validate_run_spec_and_set_defaults -> RunPlan). `lifecycle.run` plans, then provisions, verifies,
runs and sums up; nothing after the plan checks the user's input again. The spending caps
(`maxHourlyCost`, `budget`) are among those checks; `up` and `plan` apply them from here too.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gputrain_node.contract import HEALTHCHECK_ENTRY
from infra.base.errors import UserError
from infra.datasets import Dataset, merge_datasets
from scripts import ui
from scripts.job.records import DEFAULT_ENTRY, Job
from scripts.settings import Settings, new_run_id
from scripts.targets.base import Capabilities, Declared, Feature, RunOptions, Target
from scripts.watch.telemetry import WatchSettings, watch_settings

if TYPE_CHECKING:
    from infra.offers import Candidate
    from infra.schema import StackSettings
    from infra.spec import ClusterSpec
    from infra.vertex_pools import PoolShape
    from scripts.job.container import ImageRef
    from scripts.job.environment import Environment, EnvironmentSettings
    from scripts.job.image_build import PlannedBuild

DEFAULT_RECOVERIES = 3  # --max-recoveries' default, on any capacity (see recoveries_allowed)
BUDGET_INTERVAL_ENV = "GPUTRAIN_BUDGET_INTERVAL_S"
BUDGET_INTERVAL_S = 120.0  # the budget rule looks this far ahead: a checkpoint, results, teardown
#: A Vertex job's worker pools as (pool index, shape): a vertexJobSpec file's, priced by the caps
JobPools = Sequence[tuple[int, "PoolShape"]]


@dataclass(frozen=True)
class JobSecrets:
    values: dict[str, str] = field(default_factory=dict, repr=False)  # sent to SSH nodes
    # projects/P/secrets/S/versions/V: a Vertex job resolves them itself, so may a reconcile pass
    refs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunPlan:
    """Everything one `run`/`train` needs, checked; nothing of it exists yet."""

    target: Target
    opts: RunOptions
    create: bool  # `run`: the target exists for this job only (unless --keep)
    selector: str  # the target as the user named it (`--stack dev`), for the way back
    label: str  # what notifications call the target
    spec: ClusterSpec | None  # a stack's validated spec
    stack_settings: StackSettings | None  # its stack file's keys, typed: read and checked once
    datasets: tuple[Dataset, ...]  # listed once, here
    environment: Environment | None  # requirements + setup the nodes prepare
    secrets: JobSecrets  # values (SSH nodes) or references (a Vertex job)
    image: ImageRef | None  # the image named, at its digest
    build: PlannedBuild | None  # or the image to build before any GPU (a stack's registry)
    entry: tuple[str, ...]
    notify: tuple[str, ...]  # webhook URLs (secrets: never printed)
    watch: WatchSettings
    max_recoveries: int  # nodes the cloud takes away to recover from
    autodown_s: int | None  # a detached stack run's VMs go this long after the job ends
    run_id: str
    results_dir: Path  # runs/<target>/<run-id>/ (made when the job starts)

    def job(self, image: ImageRef | None) -> Job:
        """The job to launch, in `image` (the named one, or the one built for this run)."""
        opts = self.opts
        resuming = opts.resume is not None  # started as a relaunch is: --resume-args on
        return Job(
            run_id=self.run_id,
            entry=(*self.entry, *opts.resume_args) if resuming else self.entry,
            env=opts.env,
            max_restarts=opts.max_restarts,
            workdir=Path.cwd(),
            datasets=self.datasets,
            resume_args=() if resuming else opts.resume_args,
            resumed=resuming,
            environment=self.environment,
            secrets=self.secrets.values,
            secret_refs=self.secrets.refs,
            image=image,
            watch=self.watch,
        )


def plan_run(target: Target, opts: RunOptions, settings: Settings, *, create: bool) -> RunPlan:
    """Every "before anything is created" check, in the README's order: what the target cannot
    do, the image or build, the data, the environment and secrets, the entry, where the results
    go, the webhooks and the watch settings. A bad input is one UserError line; nothing is
    created here."""
    from scripts.job.sync import check_entry
    from scripts.notify import run_notify_urls

    declared = target.declared()
    env = declared.environment
    build = opts.build or env.build
    image_conflict_check(env, opts)
    refuse_missing_features(target.capabilities, opts, build)
    if declared.spec is not None:  # maxHourlyCost and the budget: pure, before Google is asked
        check_spending_caps(declared.spec, opts.budget, declared.job_pools)
        if opts.budget is not None or declared.spec.budget is not None:
            budget_interval_s(os.environ.get(BUDGET_INTERVAL_ENV))  # the knob: one line now
    refuse_unused_with_job_file(declared, opts)
    max_recoveries = recoveries_allowed(opts.max_recoveries)
    datasets = planned_datasets(declared, opts)
    environment, secrets = job_environment(env, opts)
    if opts.detach:
        warn_unrelaunchable(target.capabilities, secrets.values, secrets.refs)
    image = declared_image(env, opts)
    planned_build = target.planned_build(opts) if build else None  # a missing Dockerfile
    entry = tuple(opts.entry or DEFAULT_ENTRY)
    check_entry(
        entry,
        Path.cwd(),
        node_is_here=target.name == "local" and not (image or planned_build or environment),
    )
    settings.check_results_home()  # runs/<target>/<run-id>/ is made only when the job starts
    notify = run_notify_urls(opts.notify, declared.notify)
    watch = watch_settings(opts.stall_timeout_s)
    autodown_s = planned_autodown(target.capabilities, declared, opts)
    run_id = opts.resume or new_run_id()
    return RunPlan(
        target=target,
        opts=opts,
        create=create,
        selector=opts.selector or declared.name,
        label=declared.label,
        spec=declared.spec,
        stack_settings=declared.stack_settings,
        datasets=datasets,
        environment=environment,
        secrets=secrets,
        image=image,
        build=planned_build,
        entry=entry,
        notify=notify,
        watch=watch,
        max_recoveries=max_recoveries,
        autodown_s=autodown_s,
        run_id=run_id,
        results_dir=settings.results_path(declared.name, run_id),
    )


def refuse_missing_features(can: Capabilities, opts: RunOptions, build: str) -> None:
    """An option the target cannot honour: one line naming it and why (one row per option)."""
    wanted = [
        (opts.detach, Feature.DETACH, "--detach"),
        (opts.resume is not None, Feature.RESUME, f"--resume {opts.resume}"),
        (opts.max_recoveries is not None, Feature.RECREATE_NODES, f"--max-recoveries {opts.max_recoveries}"),
        (opts.autodown is not None, Feature.AUTODOWN, f"--autodown {opts.autodown}"),
        (bool(build), Feature.BUILD, f"--build {build}"),
    ]  # fmt: skip
    for asked, feature, option in wanted:
        if asked:
            can.require(feature, option)


def refuse_unused_with_job_file(declared: Declared, opts: RunOptions) -> None:
    """With `vertexJobSpec` the file's pools run their own commands, env and data as written:
    what the command line or the stack file would add to the job is one line, never dropped."""
    if declared.job_pools is None:
        return
    from infra.stackfile import NS

    env = declared.environment
    unused = [
        (bool(opts.entry), f"ENTRY {' '.join(opts.entry)}"),
        (bool(opts.env), "--env"),
        (bool(opts.secrets), "--secret"),
        (bool(opts.data), "--data"),
        (opts.setup is not None, "--setup"),
        (bool(env.secrets), f"{env.source}secrets"),
        (bool(declared.datasets), f"{env.source}data"),
        (bool(env.setup), f"{env.source}setup"),
    ]
    for given, what in unused:
        if given:
            raise UserError(
                f"{what}: not used with {NS}vertexJobSpec (its pools run the commands, env and "
                "data the file names); put it in the file, or remove it"
            )


def recoveries_allowed(given: int | None) -> int:
    """--max-recoveries, by default 3 on any capacity: spot VMs are preempted, and host errors and
    maintenance terminate on-demand and reserved VMs too (recovered the same way)."""
    if given is None:
        return DEFAULT_RECOVERIES
    if not 0 <= given <= 100:
        raise UserError(f"--max-recoveries {given}: allowed 0..100")
    return given


def planned_datasets(declared: Declared, opts: RunOptions) -> tuple[Dataset, ...]:
    """The target's `data` with `--data` over it, each prefix listed once (it must exist and be
    readable: a typo costs nothing); none for `healthcheck`, which reads no data."""
    from scripts.job.data_io import check_prefixes

    if tuple(opts.entry[:2]) == HEALTHCHECK_ENTRY:
        return ()
    datasets = merge_datasets(declared.datasets, opts.data)
    check_prefixes(datasets)
    return datasets


def image_conflict_check(env: EnvironmentSettings, opts: RunOptions) -> None:
    """`build` and `image` (from the file or the command line) together: one line naming both."""
    if (opts.build or env.build) and (opts.image or env.image):
        from scripts.job.image_build import image_conflict

        build_key = "--build" if opts.build else f"{env.source}build"
        raise image_conflict(build_key, "--image" if opts.image else f"{env.source}image")


def job_environment(
    env: EnvironmentSettings, opts: RunOptions
) -> tuple[Environment | None, JobSecrets]:
    """The environment the nodes prepare and the secrets (values, or references a Vertex job
    resolves itself): the target file's `setup` and `secrets` with the command line's."""
    from scripts.job.environment import (
        parse_secrets,
        plan_environment,
        refuse_env_secrets,
        resolve_secrets,
        secret_references,
    )

    setup = env.setup if opts.setup is None else opts.setup
    in_file = parse_secrets(env.secrets, f"{env.source}secrets")
    given = parse_secrets(opts.secrets, "--secret")
    refuse_env_secrets(opts.env, {f"{env.source}secrets": in_file, "--secret": given})
    # `--secret NAME` replaces the file's NAME, as --image replaces its image
    refs = (*(r for r in in_file if r.name not in {g.name for g in given}), *given)
    # with an image: built inside it, on every node; on Vertex by the entry on every replica
    environment = plan_environment(
        Path.cwd(),
        requirements=opts.requirements,
        setup=setup,
        setup_timeout_s=opts.setup_timeout_s,
        force=opts.force_setup,
    )
    if env.backend_without_ssh:  # the job resolves them itself: references only
        return environment, JobSecrets({}, secret_references(refs, env.project))
    values = resolve_secrets(refs, project=env.project)
    # the Secret Manager ones also as references: a reconcile pass reads them itself
    project = env.project or os.environ.get("GOOGLE_CLOUD_PROJECT")
    in_sm = [r for r in refs if r.sm_secret is not None]
    return environment, JobSecrets(values, secret_references(in_sm, project))


def warn_unrelaunchable(
    can: Capabilities, names: Iterable[str], in_secret_manager: Iterable[str]
) -> None:
    """Up front, on a stack whose detached runs a `gputrain reconcile` pass recovers: a secret
    of this machine's environment keeps a pass from relaunching the run."""
    from scripts.job.environment import machine_secrets_line

    line = machine_secrets_line(names, in_secret_manager) if Feature.AUTODOWN in can else None
    if line is not None:
        ui.warn(line)


def declared_image(env: EnvironmentSettings, opts: RunOptions) -> ImageRef | None:
    """The image the target's file or --image names, at its digest (UserError for a bad
    reference, a missing image or a registry that refuses us); None without one."""
    image_text = opts.image or env.image
    if not image_text:
        return None
    from scripts.job.container import parse_image, resolve_image

    setting = "--image" if opts.image else f"{env.source}image"
    image = resolve_image(parse_image(image_text, setting))
    ui.say(f"image {image.repository}:{image.tag} is {image.digest}")
    return image


def resolve_autodown(stack_s: int | None, *, keep: bool, flag: str | None) -> int | None:
    """The autodown of one command: `--autodown` over the stack's; `--keep` keeps the cluster,
    so no autodown (`--keep` with an explicit `--autodown` is refused by the CLI)."""
    if keep:
        return None
    if flag is not None:
        from infra.keys import parse_autodown

        return parse_autodown(flag, "--autodown")
    return stack_s


def planned_autodown(can: Capabilities, declared: Declared, opts: RunOptions) -> int | None:
    """`--autodown` over the stack's `autodown`; none with --keep or where nothing autodowns."""
    if Feature.AUTODOWN not in can or declared.spec is None:
        return None
    from infra.keys import format_duration

    spec = declared.spec
    seconds = resolve_autodown(spec.autodown_s, keep=opts.keep, flag=opts.autodown)
    if opts.autodown is not None and seconds is not None and seconds >= spec.max_run_duration_s:
        ttl = format_duration(spec.max_run_duration_s)
        raise UserError(
            f"--autodown {opts.autodown}: not below gputrain:maxRunDuration ({ttl}), which "
            f"deletes the VMs first; allowed: off or a duration from 1m to below {ttl}"
        )
    return seconds


# ---- spending caps: maxHourlyCost against the cluster's dearest rate over every capacity rung,
# the budget against that rate x maxRunDuration (the server-side bound on every VM and Vertex
# job, so the cap holds with the laptop closed). Pure. ------------------------------------------


def budget_interval_s(raw: str | None) -> float:
    """How far ahead the head's budget rule looks: GPUTRAIN_BUDGET_INTERVAL_S's value (`raw`),
    else BUDGET_INTERVAL_S; one line for a value that is not seconds. Pure."""
    if raw is None or not raw.strip():
        return BUDGET_INTERVAL_S
    from infra.billing import DECIMAL

    value = float(raw) if DECIMAL.fullmatch(raw.strip()) else -1.0
    if not 0 <= value <= 86400:
        raise UserError(f"{BUDGET_INTERVAL_ENV} {raw!r}: allowed: seconds from 0 to 86400")
    return value


def worst_hourly(spec: ClusterSpec, pools: JobPools | None = None) -> float | None:
    """USD per hour of the whole cluster at the dearest capacity it may get (every rung of a
    capacity list; flex-start and reservation at most on-demand): on Vertex every worker pool
    (the chief's own machine, the reducers; `pools`: a vertexJobSpec file's, in place of the
    stack's shape); None: a price is unknown."""
    rungs = spec.capacity_ladder or (spec.capacity,)
    rates = [_hourly(spec, mode == "spot", pools) for mode in rungs]
    if any(r is None for r in rates):
        return None
    return max(r for r in rates if r is not None)


def _hourly(spec: ClusterSpec, spot: bool, pools: JobPools | None) -> float | None:
    """USD per hour of every node (every replica of every Vertex pool: a vertexJobSpec file's,
    else the stack's) at Spot or not: the run's rate (infra/disk_prices.py cluster_hourly)."""
    from infra.disk_prices import cluster_hourly

    if spec.on_vertex and pools is not None:
        from infra.vertex_pools import price_pools, total_hourly

        return total_hourly(price_pools(list(pools), spec.region, spot=spot))
    return cluster_hourly(spec, spot)


def candidate_hourly(spec: ClusterSpec, candidate: Candidate) -> float | None:
    """A `gpus` candidate's rate as the caps count it: its VMs and their disks. Pure."""
    from infra.disk_prices import spec_disk_rate

    if candidate.hourly is None:
        return None
    return candidate.hourly + candidate.nodes * spec_disk_rate(spec, spec.spot, candidate).hourly


def unpriced_disks(spec: ClusterSpec) -> tuple[str, ...]:
    """What of a Compute Engine cluster's disks the caps leave out: no price for it. Pure."""
    from infra.disk_prices import spec_disk_rate

    return () if spec.on_vertex else spec_disk_rate(spec, spec.spot).unpriced


def _pools(spec: ClusterSpec, pools: JobPools | None) -> list[tuple[int, PoolShape]]:
    """A Vertex job's pools: the file's, else those the stack keys describe."""
    return list(pools) if pools is not None else spec.vertex_pools()


def _shape(spec: ClusterSpec, pools: JobPools | None) -> str:
    """What the caps were checked against: the nodes, or a Vertex job's pools, and the modes."""
    modes = "/".join(spec.capacity_ladder or (spec.capacity,))
    if spec.on_vertex and (pools is not None or spec.chief or spec.reduction_server):
        from infra.vertex_pools import describe_shapes

        return f"{describe_shapes(_pools(spec, pools))} ({modes})"
    return f"{spec.nodes} x {spec.machine_type} ({modes})"


def check_caps(
    spec: ClusterSpec,
    *,
    budget: float | None,
    budget_setting: str,
    pools: JobPools | None = None,
) -> None:
    """Refuse, with one line, a cluster dearer per hour than maxHourlyCost, or a run whose worst
    case (rate x maxRunDuration) exceeds its budget. Nothing is created before this."""
    from infra.billing import usd_text
    from infra.keys import format_duration
    from infra.stackfile import NS

    cap = spec.max_hourly_cost
    if cap is None and budget is None:
        return
    rate = worst_hourly(spec, pools)
    shape = _shape(spec, pools)
    disks = "" if spec.on_vertex else " (disks included)"
    if rate is None:
        where = spec.region if spec.on_vertex else spec.zone
        raise UserError(
            f"{NS}maxHourlyCost/{budget_setting}: the price of {shape} in {where} is unknown, "
            "so the cap cannot be checked; allowed: a machine type and zone the price table knows"
        )
    if cap is not None and rate > cap:
        # a candidate is the GPU nodes alone: on a Vertex job with more pools it fits no cap
        alone = not (spec.on_vertex and (pools is not None or spec.chief or spec.reduction_server))
        rates = {c: candidate_hourly(spec, c) for c in spec.candidates} if alone else {}
        priced = {c: r for c, r in rates.items() if r is not None}
        cheapest = min(priced, key=priced.__getitem__) if priced else None
        least = priced[cheapest] if cheapest is not None else 0.0
        if cheapest is not None and least > cap:
            raise UserError(
                f"{NS}maxHourlyCost {usd_text(cap)}: below the cheapest candidate, "
                f"{cheapest.nodes} x {cheapest.machine_type} in {cheapest.zone} at "
                f"${exact_usd(least)}/h; allowed: at least {cents_up(least)}"
            )
        fits = (
            f"; {cheapest.nodes} x {cheapest.machine_type} in {cheapest.zone} costs "
            f"${least:.2f}/h (pin it with {NS}candidate)"
            if cheapest is not None
            else ""
        )
        raise UserError(
            f"{NS}maxHourlyCost {usd_text(cap)}: {shape} costs up to ${exact_usd(rate)}/h{disks}; "
            f"allowed: at least {cents_up(rate)}, or a cheaper machine, capacity or node "
            f"count{fits}"
        )
    if budget is not None:
        worst = rate * spec.max_run_duration_s / 3600
        if worst > budget:
            fits_s = int(budget / rate * 3600) // 60 * 60
            hint = (
                f"set {NS}maxRunDuration to at most {format_duration(fits_s)}"
                if fits_s >= 600
                else "a cheaper cluster"
            )
            raise UserError(
                f"{budget_setting} {usd_text(budget)}: {shape} at ${exact_usd(rate)}/h{disks} for "
                f"maxRunDuration {spec.max_run_duration} may cost ${exact_usd(worst)}; allowed: a "
                f"budget of at least {cents_up(worst)}, or {hint} (the server-side bound that "
                "holds the budget)"
            )


def caps_line(spec: ClusterSpec, pools: JobPools | None = None) -> str:
    """`plan`'s line: the budget and the hourly cap next to the worst case they were checked
    against (check_caps passed): on Vertex, every pool's replicas. Pure."""
    rate = worst_hourly(spec, pools) or 0.0
    worst = rate * spec.max_run_duration_s / 3600
    unpriced = unpriced_disks(spec)
    what = (
        "dearest rate, every worker pool"
        if spec.on_vertex
        else "dearest rate" + ("" if unpriced else ", disks included")
    )
    parts = []
    if spec.max_hourly_cost is not None:
        parts.append(f"maxHourlyCost ${spec.max_hourly_cost:,.2f}/h >= ${rate:,.2f}/h ({what})")
    if spec.budget is not None:
        watchdog = (
            ""
            if spec.on_vertex  # no head of ours: Vertex's timeout alone holds it
            else "; the head's watchdog stops a run with a checkpoint before it passes the budget"
        )
        parts.append(
            f"budget ${spec.budget:,.2f} per run >= worst case ${worst:,.2f} ({spec.max_run_duration} "
            "at the dearest rate; maxRunDuration is the server-side bound that holds it)" + watchdog
        )
    priceless = f"{', '.join(unpriced)} (no price known) and " if unpriced else ""
    left_out = "" if spec.on_vertex else f" Not in them: {priceless}network traffic."
    return "Caps: " + "; ".join(parts) + "." + left_out


def cents_up(usd: float) -> str:
    """A minimum the user may set, to the cent above: $2.0434 is 2.05, never 2.04, which the
    same check would refuse again. Pure."""
    return f"{math.ceil(round(usd * 100, 6)) / 100:.2f}"


def exact_usd(amount: float) -> str:
    """An amount beside a cents_up minimum, to a hundredth of a cent and rounded up as that
    minimum is: $31.7712, not $31.77 next to "at least 31.78"; whole cents keep two digits. Pure."""
    digits = f"{math.ceil(round(amount * 10_000, 6)) / 10_000:.4f}".rstrip("0")
    return digits + "0" * (2 - len(digits.partition(".")[2]))


def check_spending_caps(
    spec: ClusterSpec, given_budget: float | None, pools: JobPools | None = None
) -> None:
    """maxHourlyCost and the run's budget (--budget, else the stack's), before anything bills;
    `pools`: a Vertex job file's pools, which replace the stack's shape."""
    from infra.stackfile import NS

    given = given_budget is not None
    check_caps(
        spec,
        budget=given_budget if given else spec.budget,
        budget_setting="--budget" if given else f"{NS}budget",
        pools=pools,
    )
