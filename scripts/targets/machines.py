"""Targets whose machines exist already (a hosts file, this machine): nothing to create, destroy
or sweep, and nothing billed by us; a session on them is all there is."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from infra.base.errors import UserError
from infra.base.records import Fleet
from infra.datasets import Dataset
from scripts import ui
from scripts.guard import SignalGuard
from scripts.settings import Settings
from scripts.targets.base import RunOptions
from scripts.targets.session import FleetSession


class MachinesTarget:
    """Subclasses say which machines (`fleet`) and where first-seen host keys go."""

    name: str

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def fleet(self, opts: RunOptions) -> tuple[Fleet, Path | None]:
        """The machines, and the known_hosts file to record first-seen keys in (or None)."""
        raise NotImplementedError

    def datasets(self) -> tuple[Dataset, ...]:
        return ()

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
    def attached(self, opts: RunOptions) -> Iterator[FleetSession]:
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
