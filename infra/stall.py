"""The stall timeout (`stallTimeout` in the stack, `--stall-timeout` on the command line): how long
no rank may make a training step before gputrain dumps the stacks and stops the job. Pure."""

from __future__ import annotations

from infra.fields import CHECK, parse_duration

MIN_STALL_S = 30
MAX_STALL_S = 7 * 86400
AUTO_FLOOR_S = 600.0  # the default: the larger of 10 min and 10 x the slowest step seen
AUTO_STEPS = 10
ALLOWED = "allowed: empty (auto: max(10m, 10 x the slowest step)), or 30s to 7d like 90s, 15m, 1h"


def parse_stall_timeout(text: str) -> int | None:
    """Seconds, or None for the automatic timeout ("" or "auto"); ValueError(what is allowed)
    for a malformed value or one outside 30 s..7 d. A bare number is seconds."""
    raw = text.strip()
    if raw in ("", "auto"):
        return None
    try:
        seconds = int(raw) if raw.isascii() and raw.isdigit() else parse_duration(raw)
    except ValueError:
        raise ValueError(ALLOWED) from None
    if not MIN_STALL_S <= seconds <= MAX_STALL_S:
        raise ValueError(ALLOWED)
    return seconds


def effective_timeout(explicit_s: float | None, slowest_step_s: float | None) -> float:
    """The timeout in force: the explicit one, else max(10 min, 10 x the slowest step)."""
    if explicit_s is not None:
        return explicit_s
    return max(AUTO_FLOOR_S, AUTO_STEPS * (slowest_step_s or 0.0))


def read_stall_timeout(raw: str) -> int | None:
    """The stack's `stallTimeout`; SpecError (one line naming the key) when it is not allowed."""
    try:
        return parse_stall_timeout(raw)
    except ValueError as e:
        raise CHECK.fail("stallTimeout", raw, str(e)) from None
