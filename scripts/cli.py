"""`gputrain`: plan, create, verify, train on and destroy a GPU cluster — or existing machines, or
this one. One handler per command; heavy modules (pulumi, google clients, paramiko, torch) load only
in the commands that use them, so `gputrain --help` answers at once.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gputrain_node import contract
from infra.base.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, GputrainError, UserError
from scripts import cli_options, lifecycle, ui
from scripts.job.records import DEFAULT_ENTRY, MAX_RESTARTS
from scripts.settings import RUNS_DIR_ENV, Settings, find_project_root, path_problem, user_path
from scripts.targets.base import Feature, RunOptions

if TYPE_CHECKING:
    from scripts.targets.base import Target
    from scripts.targets.gce.clients import GceClients
    from scripts.targets.vertex.clients import VertexClients

STACK_ONLY = {"doctor", "keygen", "up", "down", "status", "sweep", "reconcile"}
NO_TARGET_NEEDED = {"doctor", "gpus", "report", "cost"}
TAKES_ENTRY = {"train", "run", "healthcheck"}
HEALTHCHECK_ENTRY = contract.HEALTHCHECK_ENTRY


_UP_TO_A_DAY = cli_options.seconds_up_to(86400)  # --wait, top's --interval: seconds
_RESTARTS = cli_options.count_up_to(MAX_RESTARTS)  # --max-restarts


@dataclass
class Context:
    """A handler's arguments, options, project and results dirs, GCE/Vertex clients (or fakes)."""

    args: argparse.Namespace
    opts: RunOptions
    settings: Settings
    gce: GceClients | None
    vertex: VertexClients | None = None

    @functools.cached_property
    def target(self) -> Target:
        return cli_options.open_target(
            stack=self.args.stack,
            hosts=getattr(self.args, "hosts", None),
            settings=self.settings,
            gce=self.gce,
            vertex=self.vertex,
        )


def _options(args: argparse.Namespace) -> RunOptions:
    return RunOptions(
        entry=_entry(args),
        keep=getattr(args, "keep", False),
        yes=getattr(args, "yes", False),
        skip_preflight=getattr(args, "skip_preflight", False),
        trust_new_hosts=getattr(args, "trust_new_hosts", False),
        env=_env_pairs(getattr(args, "env", []) or []),
        max_restarts=getattr(args, "max_restarts", 0),
        wait_s=getattr(args, "wait", None),
        keep_bucket=getattr(args, "keep_bucket", False),
        keep_images=getattr(args, "keep_images", False),
        max_recoveries=getattr(args, "max_recoveries", None),
        max_candidates=_max_candidates(getattr(args, "max_candidates", 5)),
        fabric=getattr(args, "fabric", False),
        **cli_options.run_options_fields(args),
        force=getattr(args, "force", False) and args.command in TAKES_ENTRY,
    )


def _max_candidates(n: int) -> int:
    if not 1 <= n <= 50:
        raise UserError(f"--max-candidates {n}: allowed 1..50")
    return n


Handler = Callable[[Context], int]


def cmd_doctor(ctx: Context) -> int:
    """Everything a first `up` needs, at once; exit 1 when a row fails."""
    from infra.stackfile import read_stack_file
    from scripts.doctor.run import run_doctor
    from scripts.targets.gce.clients import GceClients

    stack = ctx.args.stack
    report = run_doctor(
        read_stack_file(ctx.settings.root, stack) if stack else None, ctx.gce or GceClients()
    )
    report.show()
    return EXIT_FAILED if report.failures else EXIT_OK


def cmd_plan(ctx: Context) -> int:
    lifecycle.plan(ctx.target, ctx.opts, export=ctx.args.export, force=ctx.args.force)
    return EXIT_OK


def cmd_gpus(ctx: Context) -> int:
    from scripts.gpus import show_gpus

    show_gpus(ctx.args.what, spot=ctx.args.spot, region=ctx.args.region)
    return EXIT_OK


def cmd_keygen(ctx: Context) -> int:
    ctx.target.keygen(force=ctx.args.force)
    return EXIT_OK


def cmd_up(ctx: Context) -> int:
    ctx.target.up(ctx.opts)
    return EXIT_OK


def cmd_down(ctx: Context) -> int:
    ctx.target.down(ctx.opts)
    return EXIT_OK


def cmd_status(ctx: Context) -> int:
    ctx.target.status()
    return EXIT_OK


def cmd_sweep(ctx: Context) -> int:
    return EXIT_FAILED if ctx.target.sweep() else EXIT_OK


def cmd_verify(ctx: Context) -> int:
    lifecycle.verify(ctx.target, ctx.opts)
    return EXIT_OK


def cmd_run(ctx: Context) -> int:
    """Create, run, collect, destroy: the target exists only for this job (unless --keep)."""
    lifecycle.run(ctx.target, ctx.opts, ctx.settings, create=True)
    return EXIT_OK


def cmd_train(ctx: Context) -> int:
    """A job on what exists (`healthcheck` is one with the health check as its entry)."""
    lifecycle.run(ctx.target, ctx.opts, ctx.settings, create=False)
    return EXIT_OK


def cmd_logs(ctx: Context) -> int:
    lifecycle.logs(ctx.target, ctx.args.run, ctx.opts, ctx.settings)
    return EXIT_OK


def cmd_top(ctx: Context) -> int:
    from scripts.watch.top import top

    args = ctx.args
    top(ctx.target, args.run, ctx.opts, ctx.settings, once=args.once, interval_s=args.interval)
    return EXIT_OK


def cmd_report(ctx: Context) -> int:
    from scripts.watch.report import report_command

    args = ctx.args
    chosen = args.stack or getattr(args, "hosts", None) or getattr(args, "local", False)
    report_command(ctx.target.name if chosen else None, args.run, ctx.settings)
    return EXIT_OK


def cmd_cost(ctx: Context) -> int:
    from scripts.cost.command import cost_from_args

    cost_from_args(ctx.args, ctx.settings, lambda: ctx.target)
    return EXIT_OK


def cmd_results(ctx: Context) -> int:
    lifecycle.results(ctx.target, ctx.args.run_id, ctx.opts, ctx.settings)
    return EXIT_OK


def cmd_stop(ctx: Context) -> int:
    lifecycle.stop(ctx.target, ctx.args.run_id, ctx.opts, ctx.settings)
    return EXIT_OK


def cmd_reconcile(ctx: Context) -> int:
    """One pass of recovery for a stack's run (scripts/targets/gce/reconcile.py)."""
    import os

    from scripts.targets.gce.reconcile import stack_file_from_environment

    stack_file_from_environment(ctx.settings.root, ctx.args.stack, os.environ)  # in its job
    ctx.target.capabilities.require(Feature.RECREATE_NODES, "reconcile")
    ctx.target.reconcile(ctx.args.run, ctx.opts)  # type: ignore[attr-defined]
    return EXIT_OK


def cmd_ssh(ctx: Context) -> int:
    command = list(ctx.args.remote_command or ())
    if command and command[0] == "--":
        command = command[1:]
    return lifecycle.ssh(ctx.target, ctx.args.node, command, ctx.opts)


COMMANDS: dict[str, tuple[Handler, str]] = {
    "doctor": (
        cmd_doctor,
        "check everything a first `up` on GCP needs (Pulumi, credentials, project, APIs, IAM "
        "permissions, quota, SSH key and source ranges) and show a fix for each problem",
    ),
    "plan": (
        cmd_plan,
        "validate the target and show nodes, GPUs, $/h and the TTL-bounded worst case",
    ),
    "gpus": (
        cmd_gpus,
        "list the GPUs the catalog offers (memory, GPUs per VM, machine types, the cheapest "
        "zone and $/h per GPU), e.g. `gputrain gpus H100 --spot`, `gputrain gpus 40GB+`",
    ),
    "keygen": (
        cmd_keygen,
        "create the stack's SSH key pair and store it in the stack config (private as secret)",
    ),
    "up": (
        cmd_up,
        "preflight, then create the cluster (zone failover) and verify its GPUs; it stays up",
    ),
    "verify": (cmd_verify, "connect (pinned host keys) and prove the GPUs on every node"),
    "healthcheck": (
        cmd_train,
        "run the GPU health check (matmul, memory bandwidth, all-reduce) on every node",
    ),
    "train": (
        cmd_train,
        "launch `torchrun ENTRY` on a running cluster, stream logs, collect results",
    ),
    "run": (
        cmd_run,
        "all of it: up -> verify -> train -> collect -> destroy (--keep keeps the cluster)",
    ),
    "down": (cmd_down, "destroy the stack, then sweep for anything left carrying its labels"),
    "status": (
        cmd_status,
        "show the stack's nodes and the time left before the VMs delete themselves",
    ),
    "ssh": (cmd_ssh, "open a shell (or run a command) on a node, with its host key pinned"),
    "logs": (cmd_logs, "follow the logs of the last run on the target"),
    "top": (
        cmd_top,
        "a live per-node, per-GPU table of a run (utilization, memory, power, temperature, "
        "clocks, Xid/ECC) with its step, loss and tokens/s",
    ),
    "cost": (
        cmd_cost,
        "what runs cost: the ledger (runs/ledger.jsonl) as a table with totals, per run, stack "
        "or day; estimated from the price table, billed from the Cloud Billing export",
    ),
    "report": (
        cmd_report,
        "write runs/<target>/<run-id>/report.html for a run (loss, tokens/s, MFU, GPU "
        "utilization and memory per node, restarts and recoveries, cost)",
    ),
    "results": (
        cmd_results,
        "bring a run's results home (any target; finished or still running), e.g. after the "
        "controller was killed",
    ),
    "stop": (cmd_stop, "stop a run on every node (default: the last), then bring results home"),
    "sweep": (cmd_sweep, "list every resource still carrying the stack's labels; fails if any"),
    "reconcile": (
        cmd_reconcile,
        "one pass of spot recovery for the stack's run, from any machine (what the stack's "
        "Cloud Run job runs while the laptop is closed): nothing to do, re-create and resume, "
        "or record the end",
    ),
}


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with `only` (the command argv names), only that command's
    arguments are built: the others are listed by `--help`, never parsed."""
    p = argparse.ArgumentParser(
        prog="gputrain",
        allow_abbrev=False,
        description="A GPU training cluster on Google Compute Engine (or Vertex AI jobs: "
        "backend: vertex) for exactly as long as the training needs it.",
        epilog="Exit codes: 0 success, 2 bad input, 1 anything else. Examples: gputrain run "
        "--local  |  gputrain doctor --stack dev  |  gputrain run --stack dev -- -m trainer.train",
    )
    p.add_argument("--version", action=_Version, help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (handler, help_text) in COMMANDS.items():
        # no abbreviations: `run --resume X` must not be read as `--resume-args X`
        c = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        c.set_defaults(handler=handler)
        if only is not None and name != only:
            continue
        if name == "gpus":
            c.add_argument("what", nargs="?", help="a MODEL (H100, A100-80GB) or MEMORY+ (40GB+)")
            c.add_argument("--spot", action="store_true", help="Spot prices (default: on demand)")
            c.add_argument("--region", metavar="R", help="only zones of this region")
            c.set_defaults(stack=None, dir=None)
            continue
        t = c.add_mutually_exclusive_group()
        t.add_argument("--stack", metavar="NAME", help="a Pulumi stack (Pulumi.NAME.yaml) on GCP")
        if name not in STACK_ONLY:
            t.add_argument("--hosts", metavar="FILE", help="existing machines over SSH (YAML)")
            t.add_argument("--local", action="store_true", help="this machine, no SSH")
        c.add_argument(
            "--dir",
            metavar="DIR",
            help="the Pulumi project directory (default: nearest with Pulumi.yaml upwards)",
        )
        c.add_argument(
            "--runs-dir",
            metavar="DIR",
            help="where results go (default: $GPUTRAIN_RUNS_DIR, else ./runs, ignored by git)",
        )
        if name in {"up", "run"}:
            c.add_argument("--yes", action="store_true", help="do not ask before spending money")
            c.add_argument(
                "--skip-preflight",
                action="store_true",
                help="skip the checks before spending money: `gputrain doctor`'s and the Compute "
                "API preflight's",
            )
            c.add_argument(
                "--max-candidates",
                type=cli_options.whole_number,
                default=5,
                metavar="N",
                help="(--stack with gpus) candidates `up` tries down the ranked list on stockouts "
                "and quota errors (default: 5)",
            )
        if name == "up":
            cli_options.add_build_option(c)
        if name == "run":
            c.add_argument("--keep", action="store_true", help="keep the cluster after the run")
        if name in {"run", "down"}:
            c.add_argument(
                "--keep-bucket",
                action="store_true",
                help="(--stack) keep the stack's bucket and its checkpoints when destroying",
            )
        if name == "run":
            c.add_argument(
                "--keep-images",
                action="store_true",
                help="(--stack with build) keep the image repository when the run tears down: the "
                "next run of an unchanged context is not built again; `down` removes it",
            )
        if name in {"up", "run", "train"}:
            c.add_argument(
                "--wait-for-capacity",
                metavar="DURATION",
                help="(--stack) when every zone or candidate is stocked out, keep trying this "
                "long (30m, 2h; at most 7d) with backoff, nothing billing meanwhile; also a spot "
                "recovery (default: the stack's waitForCapacity, else no waiting)",
            )
        if name in {"run", "train"}:
            cli_options.add_run_options(c, name)
        if name == "verify":
            c.add_argument(
                "--image",
                metavar="REGISTRY/PATH:TAG",
                help="also prove every node runs this image, nvidia-smi inside it seeing the "
                "GPUs (replaces the stack's / hosts file's `image`)",
            )
            c.add_argument(
                "--fabric",
                action="store_true",
                help="(--stack) also set up and prove the GPU network of a multi-node A3 Mega/"
                "Ultra or A4 stack: NICs, MTU, RDMA devices or the TCPXO daemon, a 2-node "
                "all-reduce (run/train/up do this by themselves)",
            )
        if name == "cost":
            from scripts.cost.command import add_arguments

            add_arguments(c)
        if name == "keygen":
            c.add_argument("--force", action="store_true", help="replace an existing key pair")
        if name == "plan":
            c.add_argument(
                "--export",
                metavar="FILE",
                help="(--stack with backend vertex) also write the CustomJobSpec the next run "
                "submits, as YAML for `gcloud ai custom-jobs create --config` (and vertexJobSpec)",
            )
            c.add_argument("--force", action="store_true", help="--export: replace FILE")
            c.add_argument(
                "entry",
                nargs=argparse.REMAINDER,
                help="--export: after `--`, the job's entry, as `run` takes it (default: "
                f"{' '.join(DEFAULT_ENTRY)})",
            )
        if name == "reconcile":
            c.add_argument("--run", metavar="RUN_ID", help="a run id (default: the newest)")
            c.add_argument(
                "--max-recoveries",
                type=cli_options.whole_number,
                metavar="N",
                help="recoveries the run may have in all (default: what its launch said)",
            )
        if name in TAKES_ENTRY | {"verify", "ssh", "logs", "top", "results", "stop"}:
            c.add_argument(
                "--trust-new-hosts",
                action="store_true",
                help="(--hosts) record first-seen host keys into the hosts file's known_hosts",
            )
        if name in TAKES_ENTRY | {"verify", "logs", "top", "results", "stop"}:
            c.add_argument(
                "--wait",
                type=_UP_TO_A_DAY,
                metavar="SECONDS",
                help="how long to wait for SSH on each node before it counts as unreachable "
                "(default: 30 for machines that exist, 900 for new cloud VMs)",
            )
        if name in TAKES_ENTRY:
            c.add_argument(
                "--env", action="append", default=[], metavar="K=V", help="extra environment"
            )
            c.add_argument(
                "--max-restarts",
                type=_RESTARTS,
                default=0,
                metavar="K",
                help="torchrun restarts every worker up to K times after a failure (default: 0)",
            )
            default_entry = " ".join(HEALTHCHECK_ENTRY if name == "healthcheck" else DEFAULT_ENTRY)
            c.add_argument(
                "entry",
                nargs=argparse.REMAINDER,
                help=f"after `--`: what follows torchrun's options (default: {default_entry})",
            )
        if name == "ssh":
            c.add_argument("node", help="node name or index (0 is the head)")
            c.add_argument("remote_command", nargs=argparse.REMAINDER, help="after `--`")
        cli_options.add_watch_arguments(name, c, TAKES_ENTRY, _UP_TO_A_DAY)
        if name in {"results", "stop"}:
            c.add_argument("run_id", nargs="?", metavar="RUN", help="a run id (default: the last)")
        if name in TAKES_ENTRY:
            c.add_argument(
                "--force",
                action="store_true",
                help="start even where another gputrain run is still training (two jobs on the "
                "same GPUs)",
            )
    return p


class _Version(argparse.Action):
    """`--version`: the installed package's version, looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help=str(kwargs.get("help", "")))

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("gputrain")
        except PackageNotFoundError:
            text = "unknown (not installed; run `make venv`)"
        print(f"gputrain {text}")
        parser.exit()


def _stack_only_refusal(words: Sequence[str]) -> str | None:
    """`status --local` and the like: a stack-only command given another target, said in one
    line (its parser has no --hosts/--local to name them). Pure."""
    if not words or words[0] not in STACK_ONLY:
        return None
    given = [w for w in words[1:] if w == "--local" or w.split("=", 1)[0] == "--hosts"]
    if not given:
        return None
    return (
        f"{words[0]}: {given[0].split('=', 1)[0]}: only a stack has this command; "
        "choose --stack NAME"
    )


def _env_pairs(items: Sequence[str]) -> dict[str, str]:
    from infra.env_names import check_env_name

    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--env {item!r}: expected NAME=VALUE with NAME a shell variable name")
        if check_env_name(key, f"--env {key}=...") in env:  # which value would hold?
            raise UserError(f"--env {key}: given twice; allowed: each name once")
        env[key] = value
        if _URL_PASSWORD.search(value):  # e.g. PIP_INDEX_URL=https://user:token@host/simple
            raise UserError(
                f"--env {key}=...: the value is a URL with a password, and --env values are "
                f"written into the node's run script; allowed: a URL without one, or the secret "
                f"channel: `export {key}=...` here, then `--secret {key}` (pip reads it too)"
            )
    return env


_URL_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]*@")


def _project_dir(given: Path) -> Path:
    """--dir: the Pulumi project at or above DIR; never silently another project."""
    if not os.path.isdir(given):  # False for a name the system refuses (too long)
        raise UserError(f"--dir {given}: no such directory; allowed: a directory with Pulumi.yaml")
    root = find_project_root(given)
    if not (root / "Pulumi.yaml").is_file() or not given.resolve().is_relative_to(root):
        raise UserError(
            f"--dir {given}: no Pulumi.yaml there or in a directory above it; allowed: the "
            "Pulumi project directory (or one below it)"
        )
    return root


def _entry(args: argparse.Namespace) -> tuple[str, ...]:
    entry = list(getattr(args, "entry", None) or [])
    if entry and entry[0] == "--":
        entry = entry[1:]
    if not entry and args.command == "healthcheck":
        return HEALTHCHECK_ENTRY
    return tuple(entry)


def main(
    argv: Sequence[str] | None = None,
    settings: Settings | None = None,
    gce: GceClients | None = None,
    vertex: VertexClients | None = None,
) -> int:
    """Parse, run one handler, and turn every known failure into one line and an exit code.
    `settings`, `gce` and `vertex` are the seams tests use (a project directory, fake clouds)."""
    words = cli_options.glue_resume_args(sys.argv[1:] if argv is None else argv)
    if refusal := _stack_only_refusal(words):  # one line, not argparse's generic usage
        print(f"gputrain: error: {refusal}", file=sys.stderr, flush=True)
        return UserError.exit_code
    args = _parser(words[0] if words and words[0] in COMMANDS else None).parse_args(words)
    try:
        opts = _options(args)
        chosen = args.stack or getattr(args, "hosts", None) or getattr(args, "local", False)
        if not chosen and args.command not in NO_TARGET_NEEDED:
            raise UserError(
                f"{args.command}: choose a target: --stack NAME"
                + ("" if args.command in STACK_ONLY else ", --hosts FILE or --local")
            )
        if opts.resume_args and not args.stack and getattr(args, "resume", None) is None:
            raise UserError(
                "--resume-args: only a --stack run is relaunched (spot recovery); on "
                "--hosts/--local, continue a run with `gputrain train --resume RUN "
                '--resume-args "ARGS"`'
            )
        for flag, given in (
            ("--max-recoveries", opts.max_recoveries is not None),
            ("--keep-bucket", opts.keep_bucket),
            ("--keep-images", opts.keep_images),
        ):
            if given and not args.stack:
                raise UserError(f"{flag}: only --stack targets have a bucket and re-create VMs")
        if opts.wait_for_capacity_s is not None and not args.stack:
            raise UserError(
                "--wait-for-capacity: only --stack targets create VMs, so only they can wait "
                "for capacity (--hosts and --local machines exist already)"
            )
        if getattr(args, "fabric", False) and not args.stack:
            raise UserError(
                "--fabric: only a --stack has a GPU network to set up and prove (A3 Mega/Ultra, "
                "A4); --hosts and --local machines are verified as they are"
            )
        cli_options.check_run_flags(args)
        settings = settings or Settings()
        if args.dir:
            settings.root = _project_dir(Path(args.dir))
        if getattr(args, "runs_dir", None):
            settings.runs_dir = user_path(args.runs_dir, "--runs-dir")
        if why := path_problem(settings.runs_dir):  # every command that reads results: one line
            setting = "--runs-dir" if getattr(args, "runs_dir", None) else RUNS_DIR_ENV
            raise UserError(f"{setting} {settings.runs_dir}: {why}")
        return int(args.handler(Context(args, opts, settings, gce, vertex)))
    except GputrainError as exc:
        print(f"gputrain: error: {ui.terminal_safe(str(exc))}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # StoppedWaiting says what it left
        print("gputrain:", ui.terminal_safe(str(exc)) or "interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
