"""The watch's options on the command line: `top`'s and `report`'s, and `--stall-timeout`
(scripts/cli.py adds them to its parsers)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from infra.base.errors import UserError


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
