"""Fleet scaling on the sshd test bed: connect + verify + launch a trivial job on 1 to 32 hosts.

Prints, per fleet size: each phase's wall time, the controller's CPU seconds (getrusage of this
process: every thread, plus the children it waited for) and CPU per host, the CPU seconds the
hosts themselves used (their sshd, login shells and the job, counted by a cgroup), and the ratio
of each size's total to one host's. Targets (issue 26): controller CPU per host <= 0.04 s at 8
and 32 hosts; 8 hosts <= 2x one host, 32 hosts <= 4x one host.

The fleet's interpreter is the test bed's trivial_python: the real one answers the interpreter
checks and, in place of torchrun, a trivial job prints one line and writes a result: the figure is
the fleet machinery (SSH, nvidia-smi, upload, detached start, log streaming, exit codes,
download), not torch's import time.
Every round starts from fresh nodes (their node state emptied: the whole code is uploaded).
Needs root and openssh-server (like the tests).

    python bench/fleet_scaling.py [--sizes 1,2,4,8,16,32] [--repeats 3] [--profile FILE]

``--profile FILE`` runs one round per size under yappi (every thread) and writes the controller's
functions sorted by total time to FILE.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.base.records import GpuExpectation
from scripts import ui
from scripts.job.launch import launch_torchrun
from scripts.job.records import Job
from scripts.targets.session import close_all, connect
from scripts.verify.nodes import verify_gpus
from tests.support.testbed import GpuConfig, TestBed

REPO = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Round:
    connect_s: float
    verify_s: float
    launch_s: float
    controller_cpu_s: float
    hosts_cpu_s: float

    @property
    def total_s(self) -> float:
        return self.connect_s + self.verify_s + self.launch_s


def cpu_s() -> float:
    """This process's CPU seconds (all threads) and its waited-for children's (git ls-files)."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def one_round(tb: TestBed, n: int) -> Round:
    hosts = list(tb.hosts.values())[:n]
    for h in hosts:
        tb.reset_node_state(h.name)
    fleet = dataclasses.replace(
        tb.fleet(hosts),
        expect=GpuExpectation(model="NVIDIA L4", count=2),
        python=tb.trivial_python(),
    )
    hosts_cpu0, cpu0, t0 = tb.hosts_cpu_s(), cpu_s(), time.monotonic()
    ts = connect(fleet, deadline_s=30)
    try:
        t1 = time.monotonic()
        verify_gpus(fleet, ts, deadline_s=30)
        t2 = time.monotonic()
        with tempfile.TemporaryDirectory() as out:
            res = launch_torchrun(
                fleet,
                ts,
                Job(run_id=f"bench-{n}", workdir=REPO),
                Path(out),
                on_line=lambda _n, _l: None,
            )
            t3, cpu3 = time.monotonic(), cpu_s()
            assert res.ok and all((Path(out) / h.name / "ok.txt").exists() for h in hosts)
    finally:
        close_all(ts)
    return Round(t1 - t0, t2 - t1, t3 - t2, cpu3 - cpu0, tb.hosts_cpu_s() - hosts_cpu0)


def measure(
    tb: TestBed, sizes: list[int], repeats: int, profile: Path | None = None
) -> dict[int, Round]:
    """Per size, the round with the median total (one slow sshd start or a retry on 2 shared
    cores would otherwise dominate a figure); the test bed must hold max(sizes) hosts."""
    rounds: dict[int, list[Round]] = {}
    one_round(tb, 1)  # warm-up: imports, first connections, caches
    if profile:
        import yappi

        yappi.set_clock_type("cpu")
        yappi.start()
    # interleaved (1, 2, 4, ... then again), so load from other users hits every size alike
    for _ in range(repeats):
        for n in sizes:
            rounds.setdefault(n, []).append(one_round(tb, n))
    if profile:
        yappi.stop()
        with open(profile, "w") as f:
            yappi.get_func_stats().sort("ttot").print_all(
                out=f,
                columns={0: ("name", 90), 1: ("ncall", 9), 2: ("tsub", 8), 3: ("ttot", 8)},
            )
            yappi.get_thread_stats().print_all(out=f)
    return {n: sorted(r, key=lambda x: x.total_s)[len(r) // 2] for n, r in rounds.items()}


def report(figures: dict[int, Round], repeats: int) -> None:
    sizes = sorted(figures)
    one = figures[sizes[0]].total_s
    print(
        f"hosts  connect  verify  launch  total (s)  x{sizes[0]}-host  controller CPU (s)  "
        f"per host  hosts' CPU (s)  CPU floor (s)   [median of {repeats} round(s)]"
    )
    for n, f in figures.items():
        print(
            f"{n:5d}  {f.connect_s:7.2f}  {f.verify_s:6.2f}  {f.launch_s:6.2f}  {f.total_s:9.2f}"
            f"  {f.total_s / one:7.2f}  {f.controller_cpu_s:18.2f}  {f.controller_cpu_s / n:8.3f}"
            f"  {f.hosts_cpu_s:14.2f}  {(f.controller_cpu_s + f.hosts_cpu_s) / 2:13.2f}"
        )
    print("CPU floor: (controller + hosts' CPU) / 2 cores, the wall the work needs on idle cores")
    big = sizes[-1]
    print(f"{big} hosts / {sizes[0]} host: {figures[big].total_s / one:.2f}x")
    print(
        "hosts' CPU / (wall x 2 cores) at the largest size: "
        f"{figures[big].hosts_cpu_s / (figures[big].total_s * 2):.0%} "
        "(the share of the machine the test hosts' sshd, shells and job took)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", type=Path, help="one round per size under yappi; stats here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    repeats = 1 if args.profile else args.repeats
    ui.say = lambda _msg: None  # type: ignore[assignment]
    ui.table = lambda *a, **k: None  # type: ignore[assignment]
    with TestBed(count_cpu=True, min_hosts=max(sizes)) as tb:
        tb.add_hosts(max(sizes), gpus=GpuConfig(count=2))
        load0 = os.getloadavg()
        figures = measure(tb, sizes, repeats, args.profile)
        load1 = os.getloadavg()
    report(figures, repeats)
    print(f"load average (1 min) before / after: {load0[0]:.2f} / {load1[0]:.2f} on 2 cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
