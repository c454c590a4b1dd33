"""`--local`: this machine, no SSH; its GPUs if nvidia-smi finds some, else the CPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from infra.base.records import Fleet, GpuExpectation, Node
from scripts.targets.base import Declared, RunOptions
from scripts.targets.machines import MachinesTarget


class LocalTarget(MachinesTarget):
    name = "local"

    def declared(self) -> Declared:
        """As any machines' target; first of a run's checks, the node state directory can be
        made (a run would otherwise verify, record and fail at its first command)."""
        self.settings.check_local_node_root()
        return super().declared()

    def fleet(self, opts: RunOptions) -> tuple[Fleet, Path | None]:
        count = 0
        if shutil.which("nvidia-smi"):
            r = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if r.returncode == 0:
                count = len([x for x in r.stdout.splitlines() if x.strip()])
        node = Node(name="local", role="head", internal_address="127.0.0.1", address="127.0.0.1")
        fleet = Fleet(
            target=self.name,
            nodes=(node,),
            expect=GpuExpectation(count=count),
            python=sys.executable,
            local=True,
        )
        return fleet, None
