"""Fleet scaling on the sshd test bed: connect + verify + launch a trivial job on 1, 2, 4, 8 hosts.

Prints seconds per phase for each size and the 8/1 ratio (target: <= 1.5). The trivial job's
"interpreter" is a stub that answers the torch check and, in place of torchrun, prints one line
and writes a result: the figure is the fleet machinery (SSH, nvidia-smi, upload, detached start,
log streaming, exit codes, download), not torch's import time, which on this 2-core machine
grows with the number of hosts sharing it. Needs root and openssh-server (like the tests).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.base.records import GpuExpectation
from scripts import ui
from scripts.connect import close_all, connect
from scripts.job.launch import launch_torchrun
from scripts.job.records import Job
from scripts.verify.gpus import verify_gpus
from tests.support.testbed import GpuConfig, TestBed

STUB = f"""#!/bin/sh
# bench stand-in for python: real interpreter for -c checks, a trivial job instead of torchrun
if [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi
echo "[rank0]:trivial job on $(hostname)"
mkdir -p "$GPUTRAIN_OUT" && echo ok > "$GPUTRAIN_OUT/ok.txt"
"""


REPEATS = 3


def main() -> int:
    stub_dir = Path(tempfile.mkdtemp(prefix="gputrain-bench-"))
    os.chmod(stub_dir, 0o755)
    stub = stub_dir / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    quiet = ui.say
    rounds: dict[int, list[tuple[float, float, float]]] = {}
    with TestBed(python=str(stub)) as tb:
        # A warm-up round, then 3 rounds per size; the round with the median total is reported
        # (one sshd start or a backoff retry on 2 shared cores otherwise dominates a figure).
        for n in (1, *[k for k in (1, 2, 4, 8) for _ in range(REPEATS)]):
            hosts = [tb.add_host(gpus=GpuConfig(count=2)) for _ in range(n)]
            fleet = dataclasses.replace(
                tb.fleet(hosts), expect=GpuExpectation(model="NVIDIA L4", count=2)
            )
            ui.say = lambda _msg: None  # type: ignore[assignment]
            ui.table = lambda *a, **k: None  # type: ignore[assignment]
            try:
                t0 = time.monotonic()
                ts = connect(fleet, deadline_s=30)
                t1 = time.monotonic()
                verify_gpus(fleet, ts, deadline_s=30)
                t2 = time.monotonic()
                with tempfile.TemporaryDirectory() as out:
                    res = launch_torchrun(
                        fleet,
                        ts,
                        Job(run_id=f"bench-{n}", workdir=Path(__file__).resolve().parent.parent),
                        Path(out),
                        on_line=lambda _n, _l: None,
                    )
                    assert res.ok and all((Path(out) / h.name / "ok.txt").exists() for h in hosts)
                t3 = time.monotonic()
            finally:
                ui.say = quiet
            close_all(ts)
            rounds.setdefault(n, []).append((t1 - t0, t2 - t1, t3 - t2))
            for h in hosts:
                tb.remove_host(h.name)
    figures = {n: sorted(r[-REPEATS:], key=sum)[REPEATS // 2] for n, r in rounds.items()}
    print(f"hosts  connect  verify  launch  total (s)   [median of {REPEATS} rounds]")
    for n, (c, v, launch) in figures.items():
        print(f"{n:5d}  {c:7.2f}  {v:6.2f}  {launch:6.2f}  {c + v + launch:5.2f}")
    ratio = sum(figures[8]) / sum(figures[1])
    print(f"8 hosts / 1 host: {ratio:.2f}x (target <= 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
