"""`gputrain`: plan, create, verify, train on and destroy a GPU cluster — or existing machines, or
this one. Heavy modules (pulumi, google clients, paramiko, torch) load only in the commands that
use them, so `gputrain --help` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from infra.base.errors import GputrainError, UserError

if TYPE_CHECKING:
    from scripts.lifecycle import Services

COMMANDS = {
    "plan": "validate the target and show nodes, GPUs, $/h and the TTL-bounded worst case",
    "keygen": "create the stack's SSH key pair and store it in the stack config (private as secret)",
    "up": "preflight, then create the cluster (zone failover) and verify its GPUs; it stays up",
    "verify": "connect (pinned host keys) and prove the GPUs on every node",
    "healthcheck": "run the GPU health check (matmul, memory bandwidth, all-reduce) on every node",
    "train": "launch `torchrun ENTRY` on a running cluster, stream logs, collect results",
    "run": "all of it: up -> verify -> train -> collect -> destroy (--keep keeps the cluster)",
    "down": "destroy the stack, then sweep for anything left carrying its labels",
    "status": "show the stack's nodes and the time left before the VMs delete themselves",
    "ssh": "open a shell (or run a command) on a node, with its host key pinned",
    "logs": "follow the logs of the last run on the target",
    "sweep": "list every resource still carrying the stack's labels; fails if any",
}
STACK_ONLY = {"keygen", "up", "down", "status", "sweep"}
TAKES_ENTRY = {"train", "run", "healthcheck"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gputrain",
        description="A GPU training cluster on Google Compute Engine for exactly as long as "
        "the training needs it.",
        epilog="Exit codes: 0 success, 2 bad input, 1 anything else. "
        "Example: gputrain run --local   |   gputrain run --stack dev -- -m trainer.train",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        c = sub.add_parser(name, help=help_text, description=help_text)
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
        if name in {"up", "run"}:
            c.add_argument("--yes", action="store_true", help="do not ask before spending money")
            c.add_argument(
                "--skip-preflight", action="store_true", help="skip the Compute API checks"
            )
        if name == "run":
            c.add_argument("--keep", action="store_true", help="keep the cluster after the run")
        if name == "keygen":
            c.add_argument("--force", action="store_true", help="replace an existing key pair")
        if name in TAKES_ENTRY | {"verify", "ssh", "logs"}:
            c.add_argument(
                "--trust-new-hosts",
                action="store_true",
                help="(--hosts) record first-seen host keys into the hosts file's known_hosts",
            )
        if name in TAKES_ENTRY:
            c.add_argument(
                "--env", action="append", default=[], metavar="K=V", help="extra environment"
            )
            c.add_argument("--max-restarts", type=int, default=0, metavar="K")
            c.add_argument(
                "entry",
                nargs=argparse.REMAINDER,
                help="after `--`: what follows torchrun's options "
                "(default: -m trainer.train --preset tiny)",
            )
        if name == "ssh":
            c.add_argument("node", help="node name or index (0 is the head)")
            c.add_argument("remote_command", nargs=argparse.REMAINDER, help="after `--`")
        if name == "logs":
            c.add_argument("--run", metavar="RUN_ID", help="a run id (default: the last one)")
    return p


def _env_pairs(items: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise UserError(f"--env {item!r}: expected NAME=VALUE with NAME a shell variable name")
        env[key] = value
    return env


def _entry(args: argparse.Namespace) -> tuple[str, ...]:
    entry = list(getattr(args, "entry", None) or [])
    if entry and entry[0] == "--":
        entry = entry[1:]
    return tuple(entry)


def dispatch(args: argparse.Namespace, services: Services | None = None) -> int:
    """Run one command; the lifecycle module holds the logic."""
    from scripts import lifecycle as lc

    services = services or lc.Services()
    if getattr(args, "dir", None):
        services.root = lc.find_project_root(Path(args.dir))
    cmd = args.command
    target = (
        lc.Target("stack", args.stack)
        if args.stack
        else (
            lc.Target("hosts", args.hosts) if getattr(args, "hosts", None) else lc.Target("local")
        )
    )
    opts = lc.RunOptions(
        entry=args.entry_argv,
        keep=getattr(args, "keep", False),
        yes=getattr(args, "yes", False),
        skip_preflight=getattr(args, "skip_preflight", False),
        trust_new_hosts=getattr(args, "trust_new_hosts", False),
        env=args.env_vars,
        max_restarts=getattr(args, "max_restarts", 0),
    )
    if cmd == "plan":
        lc.plan(target, services)
    elif cmd == "keygen":
        lc.keygen(target.value, services, force=args.force)
    elif cmd == "up":
        lc.up(target.value, opts, services)
    elif cmd == "down":
        lc.down_stack(target.value, services)
    elif cmd == "sweep":
        return 1 if lc.sweep_stack(target.value, services) else 0
    elif cmd == "status":
        lc.status(target.value, services)
    elif cmd in ("run", "train", "healthcheck"):
        opts.create = cmd == "run"
        lc.run(target, opts, services)
    elif cmd == "verify":
        lc.verify_target(target, opts, services)
    elif cmd == "ssh":
        return lc.ssh(target, args.node, tuple(args.remote_command or ()), opts, services)
    elif cmd == "logs":
        lc.logs(target, args.run, opts, services)
    return 0


def main(argv: Sequence[str] | None = None, services: Services | None = None) -> int:
    """Parse, run, and turn every known failure into one line and an exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    args.entry_argv = _entry(args)
    try:
        args.env_vars = _env_pairs(getattr(args, "env", []) or [])
        if args.command == "healthcheck" and not args.entry_argv:
            args.entry_argv = ("-m", "trainer.healthcheck")
        if not (args.stack or getattr(args, "hosts", None) or getattr(args, "local", False)):
            raise UserError(
                f"{args.command}: choose a target: --stack NAME"
                + ("" if args.command in STACK_ONLY else ", --hosts FILE or --local")
            )
        return dispatch(args, services)
    except GputrainError as exc:
        print(f"gputrain: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        print("gputrain: interrupted", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
