"""The reference trainer (`python -m trainer.train ARGS`), unchanged, whose rank drops to the
lowest CPU priority (nice 19) once it trains (its first heartbeat, $GPUTRAIN_HEARTBEAT.rank<R>).

For a bed test that stops a run at a moment of its own (the budget test: at a fixed time after
the run's start): until then the ranks train as fast as they can, taking CPU from whatever runs
beside them on the machine's two cores; niced, their steps take only what is left idle. Before
the first step nothing changes, so the run starts training as soon as it would.

Usage (the entry torchrun starts): niced_trainer.py TRAINER_ARGS...
"""

import contextlib
import os
import runpy
import sys
import threading
import time


def lower_priority_once_training() -> None:
    beat = os.environ.get("GPUTRAIN_HEARTBEAT")
    if not beat:
        return
    path = f"{beat}.rank{os.environ.get('RANK', '0')}"
    while not os.path.exists(path):
        time.sleep(0.2)
    for tid in os.listdir("/proc/self/task"):  # nice is per thread on Linux: every one of them
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, int(tid), 19)


threading.Thread(target=lower_priority_once_training, daemon=True).start()
sys.argv = ["trainer.train", *sys.argv[1:]]
runpy.run_module("trainer.train", run_name="__main__", alter_sys=True)
