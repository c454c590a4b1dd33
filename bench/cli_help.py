"""How fast `gputrain --help` answers (target < 0.5 s), and that it loads no heavy module.

Runs the installed console script several times in fresh processes; prints the median and worst.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("pulumi", "pulumi_gcp", "google", "paramiko", "torch")
TARGET_S = 0.5


def main(runs: int = 10) -> int:
    exe = Path(sys.executable).parent / "gputrain"
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([str(exe), "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    probe = (
        "import sys\nbefore = set(sys.modules)  # e.g. the empty `google` namespace from a .pth\n"
        "import scripts.cli as c\n"
        "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted({{m.split('.')[0] for m in set(sys.modules) - before}} & set({HEAVY!r})))"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = r.stdout.strip().splitlines()[-1]
    median, worst = statistics.median(times), max(times)
    print(
        f"gputrain --help: median {median:.3f} s, worst {worst:.3f} s over {runs} runs "
        f"(target < {TARGET_S} s); heavy modules loaded: {loaded}"
    )
    return 0 if median < TARGET_S and loaded == "[]" else 1


if __name__ == "__main__":
    sys.exit(main())
