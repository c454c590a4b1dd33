"""Errors the CLI turns into one line and an exit code: 2 for the user's input, 1 for the rest."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class GputrainError(Exception):
    """Something failed; the message is one readable line (or a short block) for the user."""

    exit_code = EXIT_FAILED


class UserError(GputrainError):
    """Bad input (config, flags, hosts file): nothing was created."""

    exit_code = EXIT_BAD_INPUT
