"""Autodown: the head node's dead man's switch. Once the job has ended on every node and the
controller has been silent this long, the head's watchdog (gputrain_node/watchdog.py) puts each node's out
dir in the stack's bucket and deletes the stack's VMs. Pure: the bound `plan` states and the IAM
condition that lets the nodes' account delete its own stack's VMs and nothing else (the
`autodown` key itself is read in infra/keys.py).
"""

from __future__ import annotations

from infra.keys import format_duration

#: The predefined role the nodes' account gets, conditioned on the stack's own VMs (and their boot
#: disks, which a delete takes with it). There is no narrower predefined role that can delete.
ROLE = "compute.instanceAdmin.v1"


def describe(seconds: int | None) -> str:
    return "off" if seconds is None else format_duration(seconds)


def plan_line(autodown_s: int | None, ttl: str) -> str:
    """What bounds the cost when the controller goes away (a closed laptop)."""
    if autodown_s is None:
        return (
            f"if this machine goes away: autodown is off, so the VMs run until their TTL ({ttl}) "
            "or `gputrain down`"
        )
    return (
        f"if this machine goes away: VMs deleted <= {describe(autodown_s)} after the job ends "
        f"(autodown); the TTL ({ttl}) bounds a job that never ends. A detached spot run that is "
        "preempted stops unless laptop-closed recovery is on (next line), its last checkpoint kept "
        "in the bucket: `gputrain reconcile --stack STACK` or `gputrain train --stack STACK "
        "--resume RUN` continues it"
    )


def instance_condition(project: str, stack: str) -> str:
    """CEL for an IAM condition: the stack's VMs (`<stack>-node-N`) and their boot disks in any
    zone of `project`, nothing else. A stack named like another plus `-node-...` cannot exist
    (stack names are validated without that shape)."""
    base = f"projects/{project}/zones/"
    names = f"{stack}-node-"
    return (
        f'resource.name.startsWith("{base}") && ('
        f'resource.name.extract("/instances/{{name}}").startsWith("{names}") || '
        f'resource.name.extract("/disks/{{name}}").startsWith("{names}"))'
    )
