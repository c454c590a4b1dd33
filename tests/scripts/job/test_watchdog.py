"""The worker's watchdog (node_scripts.worker_watchdog), run by sh against a listener of ours: once
the head's rendezvous answered, its refusals end the job (TERM, then SIGKILL); a head that never
answered yet (still starting) does not (issue 27, class 8)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from scripts.job.node_scripts import worker_watchdog


def _start(port: int, job: str = "sleep 60") -> subprocess.Popen[str]:
    script = (
        f"HEAD=localhost\n{job} & JOB=$!\n"
        + worker_watchdog(sys.executable, port, 2, interval_s=0.5)
        + 'wait $JOB; echo "rc=$?"\n'
    )
    return subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)


def test_a_head_that_went_away_ends_the_workers_job() -> None:
    head = socket.create_server(("localhost", 0))
    port = head.getsockname()[1]
    proc = _start(port)
    time.sleep(2.5)  # the watchdog has seen the head answer
    head.close()  # the head's job ended: its rendezvous refuses from now on
    started = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    assert "the head's rendezvous localhost:" in out and "is gone" in out
    assert "rc=143" in out  # TERM
    assert time.monotonic() - started < 15


def test_a_job_that_ignores_term_is_killed_after_the_grace_period() -> None:
    head = socket.create_server(("localhost", 0))
    port = head.getsockname()[1]
    stubborn = f'{sys.executable} -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"'
    proc = _start(port, stubborn)
    time.sleep(2.5)
    head.close()
    out, _ = proc.communicate(timeout=60)
    assert "is gone" in out and "rc=137" in out  # SIGKILL after the grace period


def test_a_head_that_never_answered_is_waited_for() -> None:
    free = socket.create_server(("localhost", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens: refused, but it never answered, so nothing is stopped
    proc = _start(port, "sleep 4")
    out, _ = proc.communicate(timeout=60)
    assert "is gone" not in out and "rc=0" in out
