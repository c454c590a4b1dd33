"""Local SSD as the nodes' scratch disk: every VM's startup script assembles the disks (RAID 0 when
there are several), formats them once and mounts them at SCRATCH_MOUNT on every boot; the job
sees GPUTRAIN_SCRATCH. Pure: the names and the script text (which machine types bundle local NVMe
and what `localSsdCount` may add: infra/spec.py's Scratch).
"""

from __future__ import annotations

#: where every node's local NVMe SSDs are mounted (RAID 0 over all of them), when it has any
SCRATCH_MOUNT = "/mnt/gputrain-scratch"
SCRATCH_ENV = "GPUTRAIN_SCRATCH"
#: what the udev rules of Google's guest environment name every local NVMe SSD
LOCAL_SSD_GLOB = "/dev/disk/by-id/google-local-nvme-ssd-*"


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
