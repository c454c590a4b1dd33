"""Local SSD as the nodes' scratch disk: where it is mounted on every node and what the job is
told. (The machine types that bundle it and the startup script that assembles it live here too.)
"""

from __future__ import annotations

#: where every node's local NVMe SSDs are mounted (RAID 0 over all of them), when it has any
SCRATCH_MOUNT = "/mnt/gputrain-scratch"
SCRATCH_ENV = "GPUTRAIN_SCRATCH"
