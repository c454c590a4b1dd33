"""Autodown: the head node's dead man's switch. Once the job has ended on every node and the
controller has been silent this long, the head's watchdog (gputrain_node/watchdog.py) puts each node's out
dir in the stack's bucket and deletes the stack's VMs. Pure: the setting, the bound `plan` states,
and the IAM condition that lets the nodes' account delete its own stack's VMs and nothing else.
"""

from __future__ import annotations

from infra.schema import format_duration, parse_duration
from infra.stackfile import SpecError

DEFAULT = "10m"
MIN_S = 60  # a shorter silence is a blip of the network, not a controller that went away
ALLOWED = "allowed: off or a duration of at least 1m, like 10m, 30m, 1h (units d/h/m/s)"
#: The predefined role the nodes' account gets, conditioned on the stack's own VMs (and their boot
#: disks, which a delete takes with it). There is no narrower predefined role that can delete.
ROLE = "compute.instanceAdmin.v1"


def parse_autodown(
    text: str, setting: str = "gputrain:autodown", ttl_s: int | None = None
) -> int | None:
    """Seconds of silence after the job's end before the VMs are deleted; None for `off`. With
    the VMs' TTL (maxRunDuration): an autodown the TTL always comes first is refused, not
    promised."""
    value = text.strip()
    if value.lower() in ("off", "false", "none"):
        return None
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise SpecError(f"{setting} {text!r}: {ALLOWED}") from None
    if seconds < MIN_S:
        raise SpecError(f"{setting} {text!r}: below 1m; {ALLOWED}")
    if ttl_s is not None and seconds >= ttl_s:
        ttl = format_duration(ttl_s)
        raise SpecError(
            f"{setting} {text!r}: not below gputrain:maxRunDuration ({ttl}), which deletes the "
            f"VMs first; allowed: off or a duration from 1m to below {ttl}"
        )
    return seconds


def read_autodown(text: str, ttl_s: int) -> int | None:
    """The stack's `autodown`: one the user set must come before the TTL (the default may not,
    on a stack whose TTL is at most 10m: the TTL then deletes the VMs sooner still)."""
    return parse_autodown(text, ttl_s=None if text.strip() == DEFAULT else ttl_s)


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
