"""Targets whose machines exist already (a hosts file, this machine): nothing to create, destroy
or sweep, and nothing billed by us; a session on them is all there is."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from infra.base.errors import UserError
from infra.base.records import Fleet
from scripts import ui
from scripts.settings import Settings
from scripts.targets.base import Capabilities, Declared, Feature, RunOptions, SignalGuard
from scripts.targets.session import FleetSession

if TYPE_CHECKING:
    from scripts.job.container import ImageRef
    from scripts.job.image_build import PlannedBuild


#: what machines that exist already cannot do: they are not ours to build for, re-create or delete
MACHINES_LACK = Capabilities(
    {
        Feature.BUILD: "only for --stack targets (the image goes to the stack's Artifact Registry "
        "repository); build and push it yourself and pass --image",
        Feature.RECREATE_NODES: "only --stack targets have a bucket and re-create VMs",
        Feature.AUTODOWN: "only --stack targets have VMs gputrain may delete",
        Feature.EXPORT_JOB: "only for --stack targets with backend vertex",
    }
)


class MachinesTarget:
    """Subclasses say which machines (`fleet`) and where first-seen host keys go."""

    name: str
    capabilities = MACHINES_LACK

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def fleet(self, opts: RunOptions) -> tuple[Fleet, Path | None]:
        """The machines, and the known_hosts file to record first-seen keys in (or None)."""
        raise NotImplementedError

    def declared(self) -> Declared:
        return Declared(name=self.name, label=self.name)

    def planned_build(self, opts: RunOptions) -> PlannedBuild | None:
        return None  # Feature.BUILD is lacking: the plan refused it

    def built_image(self, opts: RunOptions) -> ImageRef | None:
        return None

    def plan(self) -> None:
        fleet, _ = self.fleet(RunOptions())
        expect = fleet.expect
        wanted = "cpu" if expect.is_cpu else f"{expect.count} x {expect.model or 'any GPU'}"
        ui.table(
            f"plan: {fleet.target}",
            ["node", "role", "address", "internal address", "expected GPUs"],
            [
                [n.name, n.role, n.address or "(via head)", n.internal_address, wanted]
                for n in fleet.nodes
            ],
        )
        ui.say("cost: nothing is created; these machines are yours")

    @contextmanager
    def attached(self, opts: RunOptions, *, for_run: bool = False) -> Iterator[FleetSession]:
        fleet, record = self.fleet(opts)
        with FleetSession(
            fleet, self.settings, record_new_keys=record, connect_deadline_s=opts.wait_s
        ) as session:
            yield session

    def provisioned(
        self, opts: RunOptions, guard: SignalGuard
    ) -> AbstractContextManager[FleetSession]:
        """Nothing to create: the machines as they are."""
        return self.attached(opts)

    def _stack_only(self, command: str) -> UserError:
        return UserError(f"{command}: {self.name} is not a stack; choose --stack NAME")

    def keygen(self, *, force: bool) -> None:
        raise self._stack_only("keygen")

    def up(self, opts: RunOptions) -> None:
        raise self._stack_only("up")

    def down(self, opts: RunOptions) -> None:
        raise self._stack_only("down")

    def status(self) -> None:
        raise self._stack_only("status")

    def sweep(self) -> bool:
        raise self._stack_only("sweep")
