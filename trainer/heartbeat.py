"""The trainer's side of gputrain's watch: a heartbeat file per rank, touched after a step.

The name of the variable is the node agent's (gputrain_node/contract.py HEARTBEAT_ENV; a test
holds the two equal): the trainer runs on the nodes without gputrain_node.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

HEARTBEAT_ENV = "GPUTRAIN_HEARTBEAT"


class Heartbeat:
    """Touches $GPUTRAIN_HEARTBEAT.rank<RANK> after a step (at most once a second), so the
    controller sees progress and, when the run stalls, which rank stopped first. A no-op where
    the variable is unset (a run not started by gputrain)."""

    def __init__(self, environ: dict[str, str] | None = None, every_s: float = 1.0) -> None:
        env = os.environ if environ is None else environ
        base = env.get(HEARTBEAT_ENV)
        self.path = Path(f"{base}.rank{env.get('RANK', '0')}") if base else None
        self.every_s, self._last = every_s, 0.0

    def beat(self) -> None:
        now = time.monotonic()
        if self.path is None or now - self._last < self.every_s:
            return
        self._last = now
        try:
            self.path.touch()
        except OSError:
            self.path = None  # the watch is a help, never a failure
