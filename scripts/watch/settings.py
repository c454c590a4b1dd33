"""How a run is watched: the node sampler's interval, how often the controller looks, the summary
line's period, the idle warning's window and the stall timeout. Defaults suit a real run; the
GPUTRAIN_WATCH_* variables shorten them (tests, impatient users)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from infra.base.errors import UserError

ENV_KNOBS = {
    "GPUTRAIN_WATCH_SAMPLE_S": "sample_interval_s",
    "GPUTRAIN_WATCH_POLL_S": "poll_s",
    "GPUTRAIN_WATCH_SUMMARY_S": "summary_every_s",
    "GPUTRAIN_WATCH_IDLE_WINDOW_S": "idle_window_s",
}


@dataclass(frozen=True)
class WatchSettings:
    stall_timeout_s: float | None = None  # None: max(10 min, 10 x the slowest step seen)
    sample_interval_s: float = 5.0  # nvidia-smi on every node
    poll_s: float = 10.0  # the controller reads the nodes' telemetry and heartbeats
    summary_every_s: float = 300.0  # the one-line summary in the run's output
    idle_window_s: float = 600.0  # warn when a node's mean utilization stays low this long
    idle_below_pct: float = 50.0
    dump_wait_s: float = 5.0  # how long a rank's faulthandler may take to write its stack


def watch_settings(
    stall_timeout_s: float | None, environ: Mapping[str, str] = os.environ
) -> WatchSettings:
    """The defaults, the stall timeout given, and any GPUTRAIN_WATCH_* override (one line
    naming the variable when it is not a number of seconds > 0)."""
    values: dict[str, float] = {}
    for var, name in ENV_KNOBS.items():
        raw = environ.get(var)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 < value <= 86400:
            raise UserError(f"{var}={raw!r}: allowed: seconds > 0, at most 86400")
        values[name] = value
    return WatchSettings(stall_timeout_s=stall_timeout_s, **values)
