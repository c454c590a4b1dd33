"""The trainer's one error type for bad flags or data: printed as one line, exit status 2.

The trainer runs on the GPU VMs with only torch and numpy, so it does not import the controller's
infra.base.errors; the exit status (2) matches infra.base.errors.UserError.
"""

from __future__ import annotations


class InputError(Exception):
    """A bad flag value or a missing, corrupt or too short data file; the message names it."""

    exit_code = 2


class CorruptCheckpoint(InputError):
    """A checkpoint that exists but cannot be used (truncated, foreign, or unlike its manifest):
    `--resume auto` falls back to an older one; a checkpoint named with `--resume PATH` exits 2."""


class DivergedError(Exception):
    """The loss became NaN or infinite: training cannot recover, the run ends with exit 1."""

    exit_code = 1
