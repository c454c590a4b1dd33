"""Which processes are a run's, in shell: what a job or a setup leaves running ends with it (every
process carrying a tag in its environment: a daemon that double-forked out of its process group
keeps it), and a pid file's number counts only while its process is still the run's. Shared by
the node's run script, its environment step and the commands that follow, stop and watch a run.
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


#: `ours PID`, in a run's directory: whether PID is still one of the run's processes (run.sh,
#: torchrun), whose working directory is in the run dir (R: its physical path). A pid file
#: outlives its process and the kernel gives the number to any new one (after a wrap, in minutes
#: where pid_max is 32768; after a reboot that kept the disk): such a process is never signalled,
#: waited for or counted as a running job. The watchdog's side: gputrain_node/watchdog.py's job_pid.
OURS_SH = (
    'R=$(pwd -P); ours() { case "$(readlink "/proc/$1/cwd" 2>/dev/null)" in '
    '"$R"|"$R"/*) return 0;; esac; return 1; }'
)
