"""What the GCE target adds to the stack client bag: how long it waits for host keys and for the
Compute API's word on a lost node, and the interpreter with torch on the nodes."""

from __future__ import annotations

from dataclasses import dataclass

from scripts.targets.stack.clients import StackClients


@dataclass
class GceClients(StackClients):
    hostkey_deadline_s: float = 600.0  # until the guest agent publishes the VM's host keys
    node_python: str = "python3"  # the interpreter with torch on the nodes (the DLVM's)
    preemption_confirm_s: float = 60.0  # a node killed or lost: how long to ask "preempted?"
