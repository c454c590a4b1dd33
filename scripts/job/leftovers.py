"""What a job or a setup leaves running ends with it: the shell that finds every process carrying
a tag in its environment (a daemon that double-forked out of its process group keeps it) and ends
it. Shared by the node's run script and its environment step.
"""

from __future__ import annotations


def kill_tagged_sh(name: str, value: str) -> str:
    """Shell: TERM, then KILL a second later, every process whose environment holds NAME=VALUE
    (`value` is shell-expanded): whatever a job or a setup left running, also a daemon that left
    its process group and session. The searching processes themselves are untagged."""
    find = (
        f"env -u {name} sh -c 'grep -lzx \"$1\" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3' "
        f'_ "{name}={value}"'
    )
    return (
        f'L=$({find}); if [ -n "$L" ]; then kill -TERM $L 2>/dev/null; i=0; '
        f'while [ $i -lt 10 ] && L=$({find}) && [ -n "$L" ]; do sleep 0.1; i=$((i+1)); done; '
        '[ -z "$L" ] || kill -KILL $L 2>/dev/null; fi'
    )
