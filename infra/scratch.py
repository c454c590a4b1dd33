"""Local SSD as the nodes' scratch disk. Machine types that bundle local NVMe (A2 Ultra, A3, A4)
get all of it; N1 and G2 may add some (`localSsdCount`). Every VM's startup script assembles the
disks (RAID 0 when there are several), formats them once and mounts them at SCRATCH_MOUNT on
every boot; the job sees GPUTRAIN_SCRATCH. Pure: the rules, the sizes and the script text.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.catalog import MachineType
from infra.schema import CHECK

#: where every node's local NVMe SSDs are mounted (RAID 0 over all of them), when it has any
SCRATCH_MOUNT = "/mnt/gputrain-scratch"
SCRATCH_ENV = "GPUTRAIN_SCRATCH"
LOCAL_SSD_GIB = 375  # one local SSD partition
#: bundle local SSD whose size our sources leave open (facts sheet: UNCONFIRMED)
BUNDLED_SIZE_UNKNOWN = ("a3-ultragpu-8g", "a4-highgpu-8g")
#: N1: the counts Compute Engine takes (docs: 1-8, 16 or 24 partitions of 375 GiB)
N1_COUNTS = (*range(1, 9), 16, 24)
#: what the udev rules of Google's guest environment name every local NVMe SSD
LOCAL_SSD_GLOB = "/dev/disk/by-id/google-local-nvme-ssd-*"


@dataclass(frozen=True)
class Scratch:
    """A node's local SSD: how many disks we declare (0: none or bundled), its size."""

    declared_disks: int
    gib: int | None  # None: bundled, size unknown
    bundled: bool

    @property
    def present(self) -> bool:
        return self.bundled or self.declared_disks > 0

    def describe(self) -> str:
        if not self.present:
            return "none (boot disk only; N1/G2: localSsdCount)"
        size = f"{self.gib:,} GiB" if self.gib is not None else "size unknown"
        how = (
            "bundled with the machine type" if self.bundled else f"{self.declared_disks} x 375 GiB"
        )
        return f"{size} local NVMe SSD ({how}), RAID 0 at {SCRATCH_MOUNT}"


NO_SCRATCH = Scratch(0, None, False)


def allowed_counts(mt: MachineType) -> tuple[int, ...]:
    """The `localSsdCount` values a machine type takes besides 0 (none: bundled or not offered)."""
    if mt.series == "n1":
        return N1_COUNTS
    if mt.series == "g2":
        # the docs' maximum local SSD per G2 type, in 375 GiB partitions (facts sheet §1.3)
        most = {4: 1, 8: 1, 12: 1, 16: 1, 24: 2, 32: 1, 48: 4, 96: 8}[mt.vcpus]
        return tuple(range(1, most + 1))
    return ()


def scratch_for(mt: MachineType, count: int) -> Scratch:
    """`localSsdCount` checked against the machine type (one line naming it otherwise)."""
    bundled = mt.local_ssd_gib is not None or mt.name in BUNDLED_SIZE_UNKNOWN
    if count == 0:
        return Scratch(0, mt.local_ssd_gib, True) if bundled else Scratch(0, None, False)
    if bundled:
        raise CHECK.fail(
            "localSsdCount",
            str(count),
            f"allowed: 0 ({mt.name} brings its own local SSD, all of it used)",
        )
    counts = allowed_counts(mt)
    if count not in counts:
        allowed = (
            f"allowed for {mt.name}: 0 or {', '.join(map(str, counts))}"
            if counts
            else f"allowed: 0 ({mt.name} takes no local SSD here; N1 and G2 do)"
        )
        raise CHECK.fail("localSsdCount", str(count), allowed)
    return Scratch(count, count * LOCAL_SSD_GIB, False)


def startup_script(mount: str = SCRATCH_MOUNT, devices: str = LOCAL_SSD_GLOB) -> str:
    """Run as root at every boot (GCE's `startup-script`): every local NVMe SSD into one RAID 0
    (one disk: used as is), formatted ext4 only when it holds no file system yet, mounted at
    `mount`, writable by everyone (sticky). Idempotent: mounted -> nothing; an array from a
    previous boot is assembled again, not re-created. No local SSD -> nothing."""
    return f"""#!/bin/bash
# gputrain: local SSD -> {mount} (every boot; idempotent)
set -eu
MNT={mount}
ARRAY=/dev/md/gputrain-scratch
if mountpoint -q "$MNT"; then echo "gputrain-scratch: mounted already"; exit 0; fi
DEVS=$(ls {devices} 2>/dev/null | grep -v -- '-part' || true)
N=$(echo $DEVS | wc -w)
if [ "$N" -eq 0 ]; then echo "gputrain-scratch: no local SSD"; exit 0; fi
command -v mdadm >/dev/null 2>&1 || [ "$N" -eq 1 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mdadm
if [ "$N" -eq 1 ]; then
  DEV=$DEVS
else
  if [ ! -e "$ARRAY" ]; then
    mdadm --assemble "$ARRAY" $DEVS 2>/dev/null || \\
      mdadm --create "$ARRAY" --name=gputrain-scratch --level=0 --raid-devices="$N" --force --run $DEVS
  fi
  DEV=$ARRAY
fi
blkid "$DEV" >/dev/null 2>&1 || mkfs.ext4 -F -q -m 0 -E lazy_itable_init=1,lazy_journal_init=1,discard "$DEV"
mkdir -p "$MNT"
mount -o discard,defaults,noatime "$DEV" "$MNT"
chmod 1777 "$MNT"
echo "gputrain-scratch: $N local SSD(s) at $MNT"
"""
