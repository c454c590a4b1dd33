"""`run`/`train`'s flags for how long a run may outlive or outlast things: --max-recoveries,
--detach, --autodown and `train --resume`, and the one-line answers to their contradictions
(checked before anything is created)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from infra.base.errors import UserError
from infra.keys import check_urls
from scripts import ui
from scripts.job.records import check_run_id


def add_flags(c: argparse.ArgumentParser, command: str) -> None:
    c.add_argument(
        "--max-recoveries",
        type=int,
        metavar="N",
        help="(--stack) nodes GCE takes away to recover from: spot preemptions, host errors, "
        "host maintenance (default: 3)",
    )
    if command == "train":
        c.add_argument(
            "--resume",
            metavar="RUN_ID",
            help="continue that run (its id, its checkpoints: a detached spot run that was "
            "preempted), instead of starting a new one",
        )
    else:  # `run --resume X`: one line saying where resuming is, not read as anything else
        c.add_argument("--resume", metavar="RUN_ID", dest="run_resume", help=argparse.SUPPRESS)
    c.add_argument(
        "--notify",
        action="append",
        default=[],
        metavar="URL",
        help="POST a JSON message per run event (started, preempted, recovered, failed, "
        "finished, autodown) to this webhook (Slack/Discord-style `text`); repeatable",
    )
    c.add_argument(
        "--detach",
        action="store_true",
        help="return once the job trains its first step; it runs on (`gputrain logs` reattaches; "
        "on a stack, autodown deletes the VMs after the job)",
    )
    c.add_argument(
        "--budget",
        metavar="USD",
        help="(--stack) what this run may cost: refused before anything is created when the "
        "cluster's rate x maxRunDuration exceeds it (default: the stack's `budget`)",
    )
    c.add_argument(
        "--autodown",
        metavar="DURATION",
        help="(--stack) delete the VMs this long after the job ends once this controller is gone "
        "(>= 1m, or off; default: the stack's `autodown`, 10m)",
    )


def check(args: argparse.Namespace) -> None:
    """Contradictions: one line each. `--keep` with `--detach`: --keep wins (said once)."""
    autodown = getattr(args, "autodown", None)
    resume = getattr(args, "resume", None)
    if getattr(args, "run_resume", None) is not None:
        raise UserError(
            f"--resume {args.run_resume}: `run` starts a new run; continue that one with "
            f"`gputrain train {selector(args)} --resume {args.run_resume}` (on a stack that is "
            "up: `gputrain up` first)"
        )
    check_urls(getattr(args, "notify", None) or [], "--notify")
    run = getattr(args, "run", None)
    if getattr(args, "command", None) == "report":
        # report's RUN may be a results dir gputrain wrote (it holds job.json), else a run id
        run = None if run is None or Path(run, "job.json").is_file() else run
        setting = "RUN"
    else:
        setting = "--run"  # logs, top
    for name, run_id in (
        ("--resume", resume),
        ("RUN", getattr(args, "run_id", None)),  # results, stop
        (setting, run),
    ):
        if run_id is not None:
            check_run_id(run_id, name)
    if autodown is None and not getattr(args, "detach", False):
        return
    if autodown is not None:
        if not args.stack:
            raise UserError(
                f"--autodown {autodown}: only --stack targets have VMs gputrain may delete"
            )
        from infra.keys import parse_autodown

        parse_autodown(autodown, "--autodown")  # one line naming the flag and what is allowed
        if getattr(args, "keep", False):
            raise UserError(
                f"--autodown {autodown} with --keep: keep the cluster, or delete it after the "
                "job? Drop one of them"
            )
    if getattr(args, "detach", False):
        from scripts.job.detach import detach_wait_s

        detach_wait_s()  # GPUTRAIN_DETACH_WAIT_S: a bad value is one line before anything exists
    if getattr(args, "detach", False) and getattr(args, "keep", False):
        ui.warn(
            "--detach with --keep: --keep wins: the cluster stays up after the job (no "
            "autodown); its TTL or `gputrain down` ends it"
        )


def selector(args: argparse.Namespace) -> str:
    """The target as the user named it, for the commands that come back to it."""
    hosts = getattr(args, "hosts", None)
    return f"--stack {args.stack}" if args.stack else f"--hosts {hosts}" if hosts else "--local"


def options(args: argparse.Namespace) -> dict[str, Any]:
    """RunOptions' fields these flags set."""
    return {
        "detach": getattr(args, "detach", False),
        "autodown": getattr(args, "autodown", None),
        "resume": getattr(args, "resume", None),
        "notify": tuple(getattr(args, "notify", None) or ()),
        "budget": budget_option(args),
        "selector": selector(args),
    }


def budget_option(args: argparse.Namespace) -> float | None:
    """--budget USD: a positive amount, for --stack targets only (one line otherwise)."""
    raw = getattr(args, "budget", None)
    if raw is None:
        return None
    from infra.billing import parse_usd

    if not args.stack:
        raise UserError(f"--budget {raw}: only --stack targets are billed by gputrain")
    return parse_usd(raw, "--budget") if raw.strip() else None
