"""The `run`/`train` options about data in and outputs out (kept apart from cli.py's table)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence

from infra.base.errors import UserError


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
