"""Local SSD: which machine types bring it, `localSsdCount` per machine type (one line otherwise),
the VMs under Pulumi mocks (the disks for N1/G2, the startup script wherever there is local SSD),
`plan`'s line, and the startup script itself run against stub mdadm/mkfs/mount commands."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest

from infra import catalog
from infra.base.errors import UserError
from infra.plan import build_plan
from infra.scratch import SCRATCH_MOUNT, startup_script
from infra.spec import parse_spec, scratch_for
from infra.stackfile import load_stack_config
from tests.support.pulumi_mocks import ROOT, GcpMocks, deployable_config, pulumi_mocks

MT = catalog.MACHINE_TYPES


@pytest.mark.parametrize(
    ("machine", "gib"),
    [
        ("a2-ultragpu-2g", 750),
        ("a3-highgpu-8g", 6000),
        ("a3-megagpu-8g", 6000),
        ("a4-highgpu-8g", None),
    ],
)
def test_bundled_local_ssd_is_always_used(machine: str, gib: int | None) -> None:
    s = scratch_for(MT[machine], 0)
    assert (s.bundled, s.present, s.gib, s.declared_disks) == (True, True, gib, 0)
    with pytest.raises(UserError) as e:
        scratch_for(MT[machine], 2)
    assert (
        str(e.value)
        == f"gputrain:localSsdCount = '2': allowed: 0 ({machine} brings its own local SSD, all of it used)"
    )


def test_n1_and_g2_take_what_their_type_allows() -> None:
    assert scratch_for(MT["n1-standard-8"], 24).gib == 24 * 375
    assert scratch_for(MT["g2-standard-24"], 2).declared_disks == 2
    assert not scratch_for(MT["g2-standard-8"], 0).present
    with pytest.raises(
        UserError,
        match=r"localSsdCount = '9': allowed for n1-standard-8: 0 or 1, 2, 3, 4, 5, 6, 7, 8, 16, 24",
    ):
        scratch_for(MT["n1-standard-8"], 9)
    with pytest.raises(UserError, match=r"allowed for g2-standard-32: 0 or 1$"):
        scratch_for(MT["g2-standard-32"], 2)
    with pytest.raises(UserError, match=r"a2-highgpu-1g takes no local SSD here"):
        scratch_for(MT["a2-highgpu-1g"], 1)


def test_the_stack_key_and_plan() -> None:
    spec = parse_spec(deployable_config("t4", localSsdCount="2"), "t4")
    assert spec.scratch.gib == 750
    lines = build_plan(spec).footer_lines()
    assert (
        f"Scratch per node: 750 GiB local NVMe SSD (2 x 375 GiB), RAID 0 at {SCRATCH_MOUNT}"
        in lines
    )
    with pytest.raises(UserError, match="localSsdCount = '25'"):
        parse_spec(deployable_config("t4", localSsdCount="25"), "t4")
    h100 = build_plan(parse_spec(deployable_config("h100"), "h100")).footer_lines()
    assert any(ln.startswith("Scratch per node: 6,000 GiB local NVMe SSD (bundled") for ln in h100)


@pytest.fixture
def mocks() -> Iterator[GcpMocks]:
    with pulumi_mocks(load_stack_config(ROOT, "dev")) as m:
        yield m


@pulumi.runtime.test
def test_n1_vms_get_their_disks_and_the_startup_script(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = parse_spec(deployable_config("t4", localSsdCount="2"), "t4")
    cluster = GpuCluster(spec.stack, spec)

    def check(_: Any) -> None:
        for vm in mocks.instances():
            assert vm.inputs["scratchDisks"] == [{"interface": "NVME"}, {"interface": "NVME"}]
            assert vm.inputs["metadataStartupScript"] == startup_script()

    return pulumi.Output.all(**cluster.exports()).apply(check)


@pulumi.runtime.test
def test_bundled_types_get_the_script_but_declare_no_disks(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = parse_spec(deployable_config("h100"), "h100")
    cluster = GpuCluster(spec.stack, spec)

    def check(_: Any) -> None:
        for vm in mocks.instances():
            assert not vm.inputs.get("scratchDisks")
            assert vm.inputs["metadataStartupScript"] == startup_script()

    return pulumi.Output.all(**cluster.exports()).apply(check)


@pulumi.runtime.test
def test_no_local_ssd_no_script(mocks: GcpMocks) -> Any:
    from infra.components.cluster import GpuCluster

    spec = parse_spec(deployable_config("dev"), "dev")
    cluster = GpuCluster(spec.stack, spec)

    def check(_: Any) -> None:
        for vm in mocks.instances():
            assert "metadataStartupScript" not in vm.inputs and not vm.inputs.get("scratchDisks")

    return pulumi.Output.all(**cluster.exports()).apply(check)


# The startup script, for real, with every command that touches disks replaced by a stub that
# records its arguments (a "device" is a file; "mounting" marks the mount point).
STUBS = {
    "mdadm": 'echo "mdadm $*" >> "$LOG"; [ "$1" = --create ] && touch "$2"; [ "$1" = --assemble ] && [ -n "$ASSEMBLES" ] && touch "$2"; [ "$1" = --create ] || [ -n "$ASSEMBLES" ]',
    "blkid": '[ -e "$1.fs" ] || [ -e "$MARK.fs" ]',
    "mkfs.ext4": 'echo "mkfs $*" >> "$LOG"; for a; do last=$a; done; touch "$MARK.fs"',
    "mount": 'echo "mount $*" >> "$LOG"; for a; do last=$a; done; touch "$last/.mounted"',
    "mountpoint": '[ -e "$2/.mounted" ]',
    "apt-get": 'echo "apt-get $*" >> "$LOG"',
}


def run_script(
    tmp_path: Path, disks: int, *, assembles: bool = False
) -> tuple[int, str, list[str]]:
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    for i in range(disks):
        (dev / f"google-local-nvme-ssd-{i}").touch()
    (dev / "google-local-nvme-ssd-0-part1").touch()  # partitions are not disks
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    mnt, log = tmp_path / "mnt", tmp_path / "log"
    script = startup_script(str(mnt), str(dev / "google-local-nvme-ssd-*"))
    script = script.replace("/dev/md/gputrain-scratch", str(tmp_path / "md"))
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log), "MARK": str(tmp_path / "md"),
        "ASSEMBLES": "1" if assembles else "",
    }  # fmt: skip
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    lines = log.read_text().splitlines() if log.exists() else []
    return r.returncode, r.stdout + r.stderr, lines


def test_several_disks_become_one_raid0_formatted_once_and_mounted(tmp_path: Path) -> None:
    rc, out, log = run_script(tmp_path, 4)
    assert rc == 0, out
    [assemble, create, mkfs, mount] = [ln for ln in log if not ln.startswith("apt-get")]
    assert assemble.startswith(f"mdadm --assemble {tmp_path}/md ")
    assert create.startswith(
        f"mdadm --create {tmp_path}/md --name=gputrain-scratch --level=0 --raid-devices=4 --force --run"
    )
    assert create.count("google-local-nvme-ssd-") == 4 and "-part1" not in create
    assert mkfs.startswith("mkfs -F -q -m 0") and mount.endswith(f"{tmp_path}/md {tmp_path}/mnt")
    assert oct(os.stat(tmp_path / "mnt").st_mode & 0o7777) == "0o1777"
    assert "4 local SSD(s)" in out
    rc, out, again = run_script(tmp_path, 4)  # the same boot again: nothing to do
    assert rc == 0 and "mounted already" in out and again == log


def test_after_a_reboot_the_array_is_assembled_not_recreated(tmp_path: Path) -> None:
    (tmp_path / "md.fs").touch()  # a file system from the boot before
    rc, out, log = run_script(tmp_path, 2, assembles=True)
    assert rc == 0, out
    assert [ln.split()[0:2] for ln in log if not ln.startswith("apt-get")] == [
        ["mdadm", "--assemble"],
        ["mount", "-o"],
    ]


def test_one_disk_is_used_as_is_and_none_is_nothing(tmp_path: Path) -> None:
    rc, out, log = run_script(
        tmp_path / "one" if (tmp_path / "one").mkdir() is None else tmp_path, 1
    )
    assert rc == 0, out
    assert [ln.split()[0] for ln in log] == ["mkfs", "mount"] and "google-local-nvme-ssd-0" in log[
        1
    ]
    empty = tmp_path / "none"
    empty.mkdir()
    rc, out, log = run_script(empty, 0)
    assert rc == 0 and "no local SSD" in out and log == []
