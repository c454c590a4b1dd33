"""The command line of the watch: `top`, `report` and `--stall-timeout` (scripts/cli.py adds them;
everything heavy loads only when a handler runs)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from infra.base.errors import EXIT_OK, UserError

if TYPE_CHECKING:
    from scripts.cli import Context


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


WATCH_COMMANDS: dict[str, tuple[Callable[[Context], int], str]] = {
    "top": (
        cmd_top,
        "a live per-node, per-GPU table of a run (utilization, memory, power, temperature, "
        "clocks, Xid/ECC) with its step, loss and tokens/s",
    ),
    "report": (
        cmd_report,
        "write runs/<target>/<run-id>/report.html for a run (loss, tokens/s, MFU, GPU "
        "utilization and memory per node, restarts and recoveries, cost)",
    ),
}


def add_watch_arguments(
    name: str,
    parser: argparse.ArgumentParser,
    takes_entry: set[str],
    seconds: Callable[[str], float],
) -> None:
    if name == "report":
        parser.add_argument(
            "run",
            nargs="?",
            metavar="RUN",
            help="a run id (default: the target's last run) or a results dir runs/<target>/<id>",
        )
    if name in ("top", "logs"):
        parser.add_argument("--run", metavar="RUN_ID", help="a run id (default: the last one)")
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
    from infra.stall import parse_stall_timeout

    if raw is None:
        return None
    try:
        return parse_stall_timeout(raw)
    except ValueError as e:
        raise UserError(f"--stall-timeout {raw!r}: {e}") from None
