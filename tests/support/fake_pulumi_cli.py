"""A `pulumi` shell script standing in for the CLI under the real adapter and Automation API, for
what only real processes show: a pulumi that hangs, what a Ctrl-C reaches, what is left running.
It logs every argv, answers `version`, `stack select`, `stack output` and `stack history` like the
CLI, and runs a test's shell body for `up`, `refresh`, `destroy` or `cancel` (exit 0 where none is
given)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from tests.support import JOBS, alive

HANGING = JOBS / "hanging_pulumi.py"

#: one finished update: what the Automation API reads after up, refresh and destroy
HISTORY = [
    {
        "kind": "destroy",
        "startTime": "2026-04-20T10:00:00.000Z",
        "endTime": "2026-04-20T10:04:00.000Z",
        "message": "",
        "environment": {},
        "config": {},
        "result": "succeeded",
        "resourceChanges": {"delete": 5},
    }
]

#: `up`'s first line once it holds the lock (stack `dev` on a self-managed backend)
HEADER = "Updating (dev):"

SCRIPT = """#!/bin/sh
[ "$1" = --non-interactive ] && shift
echo "$*" >> "__LOG__"
case "$1 $2" in
  "version "*) echo v3.272.0;;
  "stack history") echo '__HISTORY__';;
  "stack output") echo '{}';;
  "up "*) __UP__;;
  "refresh "*) __REFRESH__;;
  "destroy "*) __DESTROY__;;
  "cancel "*) __CANCEL__;;
esac
"""


def fake_pulumi(
    bin_dir: Path,
    log: Path,
    *,
    up: str = ":",
    refresh: str = ":",
    destroy: str = ":",
    cancel: str = ":",
) -> Path:
    """`bin_dir/pulumi` (put bin_dir first on PATH); each verb's body is shell, e.g.
    `echo $$ >> PIDS; sleep 60 & echo $! >> PIDS; wait` for one that hangs."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "pulumi"
    text = SCRIPT.replace("__LOG__", str(log)).replace("__HISTORY__", json.dumps(HISTORY))
    verbs = (("__UP__", up), ("__REFRESH__", refresh), ("__DESTROY__", destroy))
    for verb, body in (*verbs, ("__CANCEL__", cancel)):
        text = text.replace(verb, body)
    script.write_text(text)
    script.chmod(0o755)
    log.touch()
    return script


def hanging(pids: Path, *, deaf: bool = False) -> str:
    """A body that prints nothing and never ends on its own (jobs/hanging_pulumi.py): it and its
    child write their pids; SIGINT ends it at once, as pulumi's cancel (`deaf`: never)."""
    return f'exec "{sys.executable}" -S "{HANGING}" "{pids}"' + (" --deaf" if deaf else "")


def running(pids: Path) -> list[int]:
    """Which of the pids written to `pids` still run."""
    return [
        pid for pid in map(int, pids.read_text().split() if pids.exists() else ()) if alive(pid)
    ]


def wait_until_gone(pids: Path, within_s: float = 5.0) -> list[int]:
    """The pids still running after `within_s` (reparented children take a moment to go)."""
    deadline = time.monotonic() + within_s
    while (left := running(pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def locking(lock: Path) -> dict[str, str]:
    """Verb bodies for a stack lock as Pulumi's file backend keeps it in `lock`: `up` takes it and
    then prints its header, as the CLI does (a body after it, e.g. hanging(...), runs while it is
    held), `refresh` and `destroy` refuse while it is there, as the CLI does, and `cancel`
    removes it."""
    refused = (
        "error: the stack is currently locked by 1 lock(s). Either wait for the other "
        "process(es) to end or delete the lock file with pulumi cancel."
    )
    held = f'if [ -e "{lock}" ]; then echo "{refused}" >&2; exit 255; fi'
    up = f'touch "{lock}"; echo "{HEADER}"'
    return {"up": up, "refresh": held, "destroy": held, "cancel": f'rm "{lock}"'}


def kill_all(pids: Path) -> None:
    """A test's cleanup: SIGKILL to every pid it recorded that still runs (the code under test
    failed to end them)."""
    for pid in running(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
