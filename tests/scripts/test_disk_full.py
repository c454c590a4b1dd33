"""A node whose disk fills during the job keeps the job's exit code and says ENOSPC, instead of
"none: its processes were killed": a real full file system (a 4 MiB tmpfs on the node's runs
directory, in a mount namespace of the test's own), a job that fills it, `gputrain run --local`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
FILL = """import os
with open(os.path.join(os.environ["GPUTRAIN_OUT"], "fill.bin"), "wb") as f:
    while True:  # until the disk is full: OSError ENOSPC, exit 1
        f.write(b"x" * 65536)
        f.flush()
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a mount namespace"
)
def test_a_full_disk_keeps_the_exit_code_and_says_enospc(tmp_path: Path) -> None:
    node = tmp_path / "node"
    runs = node / ".gputrain" / "runs"
    runs.mkdir(parents=True)
    (tmp_path / "fill.py").write_text(FILL)
    env = {**os.environ, "GPUTRAIN_NODE_ROOT": str(node), "HOME": str(tmp_path / "home")}
    script = (
        f"mount -t tmpfs -o size=4m tmpfs {runs} && "
        f"exec {VENV_BIN / 'gputrain'} run --local -- fill.py"
    )
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "its processes were killed" not in out, out[-3000:]
    assert "(exit code 1)" in out and "No space left on device (ENOSPC)" in out, out[-3000:]
