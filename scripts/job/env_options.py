"""The command-line options of a job's environment (`run`/`train`): requirements, setup, secrets
the image and the image to build — added to a parser, and read back into RunOptions' fields."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

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


def seconds_up_to(limit: int) -> Callable[[str], float]:
    """An argparse type: seconds > 0, at most `limit` (one line naming the bad value)."""

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 < value <= limit:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not allowed; use seconds > 0, at most {limit}"
            )
        return value

    return seconds
