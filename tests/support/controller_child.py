"""A `gputrain` controller in its own process, for a test that kills it with SIGKILL: the
stack's state (its outputs and config, as the test's fake stack left them after `up`) comes from
a JSON file, the clouds are the test's fakes. `python controller_child.py STATE.json [ARGV...]`
(ARGV: the command line, else the state's `argv`; the fake Cloud Run job's container gives it).
With `runner` in the state, the stack is the test's own runner, served to this process
(tests/support/runner_proxy.py): a reconcile pass here re-creates VMs through it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from scripts.cli import main
from scripts.settings import Settings
from scripts.targets.gce.clients import GceClients


class FrozenStack:
    """The StackRunner calls `train` makes on a stack that is up: its outputs and config."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def outputs(self) -> dict[str, Any]:
        return dict(self.state["outputs"])

    def get_config(self, key: str) -> str | None:
        value = self.state["config"].get(key)
        return None if value is None else str(value)


if __name__ == "__main__":
    state = json.loads(Path(sys.argv[1]).read_text())
    stack: Any = FrozenStack(state)
    if state.get("runner"):
        from tests.support.runner_proxy import RunnerProxy

        stack = RunnerProxy(state["runner"])
    clients = GceClients(
        runner_for=lambda _stack, _root: stack,
        compute_endpoint=state["compute"],
        hostkey_deadline_s=30,
        node_python=state["python"],
        autodown_s=state["autodown_s"],
        **state.get("clients", {}),
    )
    settings = Settings(root=Path(state["root"]), runs_dir=Path(state["runs"]))
    sys.exit(main(sys.argv[2:] or state["argv"], settings, clients))
