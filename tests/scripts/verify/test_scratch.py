"""verify's local SSD check: the probe run for real against stub devices and mountpoint, and
the verdict per node."""

from __future__ import annotations

import subprocess
from pathlib import Path

from scripts.verify.scratch import build_scratch_probe, scratch_verdict


def probe(tmp_path: Path, disks: int, mounted: bool) -> str:
    tmp_path.mkdir()
    dev, mnt, bin_dir = tmp_path / "dev", tmp_path / "mnt", tmp_path / "bin"
    for d in (dev, mnt, bin_dir):
        d.mkdir(exist_ok=True)
    for i in range(disks):
        (dev / f"google-local-nvme-ssd-{i}").touch()
    (bin_dir / "mountpoint").write_text(f"#!/bin/sh\n{'exit 0' if mounted else 'exit 1'}\n")
    (bin_dir / "mountpoint").chmod(0o755)
    cmd = build_scratch_probe(wait_s=2, mount=str(mnt), devices=f"{dev}/google-local-nvme-ssd-*")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["sh", "-c", cmd], env=env, capture_output=True, text=True).stdout


def test_the_probe_and_its_verdict(tmp_path: Path) -> None:
    assert probe(tmp_path / "a", 0, False).strip() == "none"
    assert scratch_verdict("n0", "none\n") is None
    out = probe(tmp_path / "b", 2, True)
    assert out.startswith("mounted ") and scratch_verdict("n0", out) is None
    out = probe(tmp_path / "c", 2, False)
    assert out.strip() == "not-mounted 2"
    why = scratch_verdict("n1", out)
    assert why is not None and why.startswith("node n1: its 2 local SSD(s) are not mounted at")
    assert scratch_verdict("n1", "") == "node n1: could not check its local SSD: no answer"
