"""Results that cannot be brought home are never a success: `run --local` and `results --local`
against a node whose `tar -c` fails every time (its own shell's tar, a real failing process)
exit non-zero, name the node and where its results still are, and never say "results in"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def gputrain(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "tar").write_text(
        "#!/bin/bash\n"  # packing for the download fails; unpacking the upload works
        'case " $* " in *" -c "*) echo "tar: out: Cannot open: Input/output error" >&2; exit 2;; '
        f'esac\nexec {shutil.which("tar")} "$@"\n'
    )
    (fake / "tar").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "GPUTRAIN_NODE_ROOT"}
    env["GPUTRAIN_NODE_ROOT"] = str(tmp_path / "runs" / "local" / "node")  # read below
    env["HOME"] = str(tmp_path / "home")
    env["PATH"] = f"{fake}:{env['PATH']}"
    return subprocess.run(
        [str(VENV_BIN / "gputrain"), *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_run_whose_results_cannot_come_home_fails_and_says_where_they_are(
    tmp_path: Path,
) -> None:
    (tmp_path / "job.py").write_text(
        "import os, pathlib\npathlib.Path(os.environ['GPUTRAIN_OUT'], 'model.txt').write_text('w')\n"
    )
    r = gputrain(tmp_path, "run", "--local", "--", "job.py")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    run_id = (tmp_path / "runs" / "local" / "LAST_RUN").read_text().strip()
    assert "results in" not in r.stdout
    assert "the results of local could not be brought home (local: " in r.stderr, r.stderr
    assert f"`gputrain results {run_id}` with the run's target tries again" in r.stderr
    node = tmp_path / "runs" / "local" / "node" / ".gputrain" / "runs" / run_id
    assert (node / "out" / "model.txt").read_text() == "w"  # still there, as the line says

    again = gputrain(tmp_path, "results", "--local", run_id)
    err = [ln for ln in again.stderr.splitlines() if ln.startswith("gputrain: error")]
    assert again.returncode == 1 and len(err) == 1, again.stdout + again.stderr
    assert "could not be brought home" in err[0] and "results in" not in again.stdout
