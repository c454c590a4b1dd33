"""A node whose runs directory is on another file system than its code directory (a data disk
mounted there, tmpfs): the code snapshot cannot be hard links, and a run still starts and ends."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
SHM = Path("/dev/shm")


@pytest.mark.skipif(
    not SHM.is_dir() or os.stat(SHM).st_dev == os.stat("/tmp").st_dev,
    reason="needs /dev/shm on a file system of its own",
)
def test_a_run_starts_when_runs_and_code_are_on_different_file_systems(tmp_path: Path) -> None:
    node = tmp_path / "node"
    other = Path(SHM / f"gputrain-test-runs-{os.getpid()}")
    (node / ".gputrain").mkdir(parents=True)
    other.mkdir()
    try:
        (node / ".gputrain" / "runs").symlink_to(other)  # as a mount point there would be
        (tmp_path / "job.py").write_text("print('trained from', __file__)\n")
        env = {**os.environ, "GPUTRAIN_NODE_ROOT": str(node), "HOME": str(tmp_path / "home")}
        r = subprocess.run(
            [str(VENV_BIN / "gputrain"), "run", "--local", "--", "job.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "trained from" in r.stdout
        run = next(other.iterdir())
        assert (run / "code" / "job.py").is_file() and not (run / "code" / "code").exists()
    finally:
        shutil.rmtree(other, ignore_errors=True)
