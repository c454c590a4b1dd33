"""gputrain's own copy of its node package in every code bundle (scripts/job/launch.py), and the
shell that starts a helper from it (scripts/node_layout.node_helper), run for real by `sh`: a
user's package of the same name is neither shadowed nor shadowing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from gputrain_node import contract
from scripts.job.launch import collect_code
from scripts.job.records import Job
from scripts.node_layout import node_helper


def test_every_bundle_carries_gputrain_own_copy_beside_the_users_packages(tmp_path: Path) -> None:
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("OWNER = 'user'\n")
    (tmp_path / ".gputrain" / "lib").mkdir(parents=True)
    (tmp_path / ".gputrain" / "lib" / "planted.py").write_text("")  # never the user's to send
    files = collect_code(Job("r1", entry=("-m", "trainer.train"), workdir=tmp_path))
    assert files["trainer/__init__.py"] == tmp_path / "trainer" / "__init__.py"  # theirs
    lib = contract.LIB_DIR
    assert files[f"{lib}/gputrain_node/mirror_out.py"] == contract.source_of(contract.MIRROR_OUT)
    assert f"{lib}/trainer/train.py" in files  # ours, for the helpers that build on it
    assert f"{lib}/planted.py" not in files
    assert not [rel for rel in files if "__pycache__" in rel]


def test_a_helper_runs_gputrain_own_module_whatever_the_users_code_holds(tmp_path: Path) -> None:
    """The code snapshot holds the user's `gputrain_node` and `trainer` (which would shadow ours
    from the code dir) and, under LIB_DIR, gputrain's copy: the helper imports gputrain's."""
    code = tmp_path / "code"
    for name in ("gputrain_node", "trainer"):
        (code / name).mkdir(parents=True)
        (code / name / "__init__.py").write_text("raise SystemExit('the user package')\n")
    shutil.copytree(contract.PACKAGE_DIR, code / contract.LIB_DIR / contract.PACKAGE)
    script = node_helper(sys.executable, contract.TELEMETRY, "--help", code=f'"{code}"')
    r = subprocess.run(
        ["sh", "-c", f"cd {code} && export PYTHONPATH={code} && {script}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "usage: python -m gputrain_node.telemetry" in r.stdout
