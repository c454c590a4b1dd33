"""The `run`/`train` options about data in and outputs out (kept apart from cli.py's table)."""

from __future__ import annotations

import argparse


def add_data_options(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="NAME=gs://BUCKET/PREFIX[:copy|:mount]",
        help="a dataset on every node before training, at $GPUTRAIN_DATA_<NAME> (repeatable; "
        "adds to or replaces the stack's or hosts file's `data`)",
    )
