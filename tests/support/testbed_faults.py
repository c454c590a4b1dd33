"""Faults injected into the test bed by real mechanisms, for the end-to-end tests."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.support.testbed import TestBed, TestHost, _comm, _ns_pids


def cut_during_download(tb: TestBed, host: TestHost, *, for_good: bool) -> threading.Thread:
    """Once the job ended on `host` and its `tar -c` streams the results: drop its SSH sessions
    (and, `for_good`, stop its sshd first, so reconnecting fails)."""

    runs = host.dir / "home" / ".gputrain" / "runs"
    earlier = set(runs.glob("*"))  # a host's home may hold an earlier test's runs

    def packing() -> bool:
        for pid in _ns_pids(host.namespace):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if _comm(pid) == "tar" and b"-c" in argv:
                return True
        return False

    def watch() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            ours = [p for p in runs.glob("*") if p not in earlier]
            ended = any(
                (p / "exitcode").is_file() and (p / "exitcode").stat().st_size for p in ours
            )
            if ended and packing():
                if for_good:
                    tb.stop_sshd(host.name)
                tb.drop_connections(host.name)
                return
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t
