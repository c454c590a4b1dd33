"""What the tests share: fakes that speak the real protocols, the sshd test bed, shared tables and
helpers. Nothing here is a test module; test modules import from here, never from each other."""

import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
JOBS = Path(__file__).resolve().parent / "jobs"  # small training jobs the tests launch


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (one holds nothing but its pid)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_for(
    what: str, ready: Callable[[], bool], timeout: float = 120, every_s: float = 0.1
) -> None:
    """Until `ready()`, or fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(every_s)
