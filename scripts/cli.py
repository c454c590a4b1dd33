"""The gputrain command line (minimal for now: `plan`). Heavy modules are imported per command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from scripts.errors import GputrainError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gputrain", description="GPU training clusters on GCE for exactly as long as needed."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser(
        "plan", help="validate a stack's config and show what it would cost (no cloud calls)"
    )
    plan.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    plan.add_argument(
        "--dir", type=Path, default=Path("."), help="project directory (with Pulumi.yaml)"
    )
    return parser


def _plan(args: argparse.Namespace) -> int:
    from infra.plan import HEADERS, plan_stack
    from scripts import ui

    plan = plan_stack(args.dir, args.stack)
    ui.table(plan.title, HEADERS, [plan.row])
    for line in plan.footer_lines():
        ui.say(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "plan":
            return _plan(args)
    except GputrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 2


if __name__ == "__main__":
    sys.exit(main())
