"""The options of `run`/`train` (and `top`/`report`'s) that are not cli.py's table: added to a
parser, their contradictions checked in one line each before anything is created, and read back
into RunOptions' fields. By concern: how long a run may outlive or outlast things (--max-recoveries,
--detach, --autodown, --budget, --notify, `train --resume`), data in and outputs out, the job's
environment (requirements, setup, secrets, image, build), and the watch (--stall-timeout). And
the target the command line names (`open_target`: --stack, --hosts, else --local)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.base.errors import UserError
from infra.datasets import parse_data_flags
from infra.keys import check_urls
from scripts import ui
from scripts.job.records import check_run_id

if TYPE_CHECKING:
    from scripts.settings import Settings
    from scripts.targets.base import Target
    from scripts.targets.gce.clients import GceClients
    from scripts.targets.vertex.clients import VertexClients


def add_run_options(c: argparse.ArgumentParser, command: str) -> None:
    """Every option of this module that `run` and `train` take."""
    add_environment_options(c)
    add_run_flags(c, command)
    add_data_options(c)


def run_options_fields(args: argparse.Namespace) -> dict[str, Any]:
    """RunOptions' fields these options set (defaults for commands that lack them)."""
    return {
        **environment_options(args),
        "stall_timeout_s": stall_timeout_option(getattr(args, "stall_timeout", None)),
        "wait_for_capacity_s": wait_for_capacity(getattr(args, "wait_for_capacity", None)),
        "data": parse_data_flags(getattr(args, "data", []) or []),
        "resume_args": resume_args(getattr(args, "resume_args", None)),
        **run_flag_options(args),
    }


def wait_for_capacity(raw: str | None) -> int | None:
    """--wait-for-capacity in seconds (None: not given; an empty value: no waiting)."""
    if raw is None:
        return None
    from infra.capacity import read_wait

    return read_wait("--wait-for-capacity", raw.strip()) if raw.strip() else 0


def add_run_flags(c: argparse.ArgumentParser, command: str) -> None:
    c.add_argument(
        "--max-recoveries",
        type=whole_number,
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
        "finished, budget, autodown) to this webhook (Slack/Discord-style `text`); repeatable",
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


def check_run_flags(args: argparse.Namespace) -> None:
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
        run = None if run is None or os.path.isfile(Path(run, "job.json")) else run
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
    if getattr(args, "stack", None):
        from scripts.targets.stack.pulumi_process import pulumi_silence_s

        pulumi_silence_s()  # GPUTRAIN_PULUMI_SILENCE_S: a bad value is one line, before anything
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


def open_target(
    *,
    stack: str | None,
    hosts: str | None,
    settings: Settings,
    gce: GceClients | None = None,
    vertex: VertexClients | None = None,
) -> Target:
    """The target the command line chose: --stack NAME (its `backend` picks GCE or Vertex AI),
    --hosts FILE, else --local."""
    if stack:
        from infra.keys import CHECK
        from infra.stackfile import BACKENDS, read_stack_file
        from scripts.targets.gce.clients import GceClients

        gce = gce or GceClients()
        stack_file = read_stack_file(settings.root, stack)  # once: typed, checked, handed on
        if CHECK.one_of("backend", stack_file.settings.backend.strip(), BACKENDS) == "vertex":
            from scripts.targets.vertex import VertexTarget
            from scripts.targets.vertex.clients import VertexClients

            clients = vertex or VertexClients()
            return VertexTarget(stack, settings, clients, stack_file=stack_file, doctor=gce)
        from scripts.targets.gce.target import GceTarget

        return GceTarget(stack, settings, gce, stack_file=stack_file)
    if hosts:
        from scripts.targets.hosts import HostsTarget

        return HostsTarget(hosts, settings)
    from scripts.targets.local import LocalTarget

    return LocalTarget(settings)


def run_flag_options(args: argparse.Namespace) -> dict[str, Any]:
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
    return parse_usd(raw, "--budget", unset=False)


def resume_args(text: str | None) -> tuple[str, ...]:
    """`--resume-args "ARGS"`: split as a shell would (quotes group, nothing is expanded)."""
    if not text:
        return ()
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise UserError(f"--resume-args {text!r}: {e}; quote as in a shell") from None


def glue_resume_args(argv: Sequence[str]) -> list[str]:
    """`--resume-args "--init_from=resume"` -> `--resume-args=--init_from=resume`: argparse would
    take a value starting with '-' for an option. Only before `--` (ENTRY is verbatim)."""
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--":
            out += [a, *it]
            break
        if a == "--resume-args":
            value = next(it, None)
            out.append(a if value is None else f"{a}={value}")
        else:
            out.append(a)
    return out


def add_data_options(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="NAME=gs://BUCKET/PREFIX[:copy|:mount]",
        help="a dataset on every node before training, at $GPUTRAIN_DATA_<NAME> (repeatable; "
        "adds to or replaces the stack's or hosts file's `data`)",
    )
    c.add_argument(
        "--resume-args",
        metavar='"ARGS"',
        help="(--stack) appended to ENTRY when a spot recovery relaunches the run, e.g. "
        '"--init_from=resume" for nanoGPT; the out dir is restored from the bucket first',
    )


SETUP_TIMEOUT_S = 1800.0
MAX_SETUP_TIMEOUT_S = 7 * 86400  # a week


def add_environment_options(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--setup",
        metavar="CMD",
        help="shell commands every node runs once per content hash (on backend vertex: every "
        "replica of every job), in the working directory after the requirements (replaces the "
        "stack's / hosts file's `setup`)",
    )
    c.add_argument(
        "--setup-timeout",
        type=seconds_up_to(MAX_SETUP_TIMEOUT_S),
        default=SETUP_TIMEOUT_S,
        metavar="SECONDS",
        help="how long setup may run on a node (default: 1800)",
    )
    c.add_argument(
        "--force-setup",
        action="store_true",
        help="rebuild the cached environment: install the requirements and run setup again",
    )
    c.add_argument(
        "--no-requirements",
        action="store_true",
        help="do not install requirements.txt / pyproject.toml dependencies / uv.lock",
    )
    c.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME[=sm://SECRET]",
        help="an environment variable every rank gets, never written to disk or shown: its "
        "value here, or from Secret Manager (repeatable)",
    )
    c.add_argument(
        "--image",
        metavar="REGISTRY/PATH:TAG",
        help="run torchrun inside this container image on every node (on backend vertex: the "
        "job's containerSpec); replaces the stack's / hosts file's `image`",
    )
    add_build_option(c)


def add_build_option(c: argparse.ArgumentParser) -> None:
    """`--build` (run, train, and up: the image is built before any GPU exists)."""
    c.add_argument(
        "--build",
        metavar="PATH/TO/Dockerfile",
        help="(--stack) build this Dockerfile (its directory is the context) into the stack's "
        "Artifact Registry repository, unless the registry has its content hash already, and "
        "run in it like --image; replaces the stack's `build`",
    )


def environment_options(args: argparse.Namespace) -> dict[str, Any]:
    """RunOptions' environment fields from parsed arguments (defaults for other commands)."""
    return {
        "requirements": not getattr(args, "no_requirements", False),
        "setup": getattr(args, "setup", None),
        "setup_timeout_s": getattr(args, "setup_timeout", SETUP_TIMEOUT_S),
        "force_setup": getattr(args, "force_setup", False),
        "secrets": tuple(getattr(args, "secret", None) or ()),
        "image": getattr(args, "image", None),
        "build": getattr(args, "build", None),
    }


def whole_number(text: str) -> int:
    """An argparse type: a whole number in ASCII digits (int() also takes '١' and '1_0')."""
    if not re.fullmatch(r"-?[0-9]+", text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; use a whole number, e.g. 3")
    return int(text)


def seconds_up_to(limit: int) -> Callable[[str], float]:
    """An argparse type: seconds > 0, at most `limit` (one line naming the bad value)."""

    def seconds(text: str) -> float:
        from infra.billing import DECIMAL

        value = float(text) if DECIMAL.fullmatch(text.strip()) else -1.0
        if not 0 < value <= limit:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not allowed; use seconds > 0, at most {limit}"
            )
        return value

    return seconds


def count_up_to(limit: int) -> Callable[[str], int]:
    """An argparse type: a whole number 0..limit (one line naming the bad value)."""

    def count(text: str) -> int:
        value = int(text) if re.fullmatch(r"[0-9]+", text.strip()) else -1  # not '١', '1_0'
        if not 0 <= value <= limit:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; use 0..{limit}")
        return value

    return count


def add_watch_arguments(
    name: str,
    parser: argparse.ArgumentParser,
    takes_entry: set[str],
    seconds: Callable[[str], float],
) -> None:
    if name == "report":  # (report and top are scripts/cli.py's commands)
        parser.add_argument(
            "run",
            nargs="?",
            metavar="RUN",
            help="a run id (default: the target's last run) or a results dir runs/<target>/<id>",
        )
    if name in ("top", "logs"):
        parser.add_argument("--run", metavar="RUN_ID", help="a run id (default: the last one)")
    if name == "top":
        parser.add_argument("--once", action="store_true", help="print the table once and exit")
        parser.add_argument(
            "--interval",
            type=seconds,
            default=5.0,
            metavar="SECONDS",
            help="refresh period (default: 5)",
        )
    if name in takes_entry:
        parser.add_argument(
            "--stall-timeout",
            metavar="DURATION",
            help="dump every rank's stack and stop the job when no rank made a training step "
            "for this long (30s..7d, e.g. 90s, 15m; default: the stack's stallTimeout, else "
            "max(10m, 10 x the slowest step)); relaunched from its checkpoint while "
            "--max-restarts allows",
        )


def stall_timeout_option(raw: str | None) -> float | None:
    """--stall-timeout in seconds (None: not given); one line when it is not allowed."""
    from infra.keys import parse_stall_timeout

    if raw is None:
        return None
    try:
        return parse_stall_timeout(raw)
    except ValueError as e:
        raise UserError(f"--stall-timeout {raw!r}: {e}") from None
