"""Where gputrain keeps things on a node, in one place. Every path is relative to the node root
(NODE_ROOT_SH: ``$GPUTRAIN_NODE_ROOT`` if the node sets it, else the login home), so it means the
same on every kind of node:

``.gputrain/code/``            the synced code; gputrain's own copy of its node package (and
                               the reference trainer it builds on) under ``.gputrain/lib/`` in
                               it (gputrain_node/contract.py LIB_DIR): a name the upload never
                               takes from the user's directory
``.gputrain/nccl.env``         the GPU network's NCCL env, when the fabric was set up
``.gputrain/runs/<run-id>/``   pgid, jobpid, torchrun.log, exitcode ("<rc> <unix time>"), out/
                               (GPUTRAIN_OUT), logs/ (torchrun --log-dir), code/ (a hard-link
                               snapshot of the code the run started with), watch/ (GPU
                               telemetry, heartbeats, stacks: scripts/watch/node.py) and, at
                               download, workdir/ (what the job created or changed in code/);
                               run.sh is deleted once its shell holds it (it has the --env values)
"""

import shlex

from gputrain_node import contract

NODE_ROOT_SH = '"${GPUTRAIN_NODE_ROOT:-$HOME}"'
"""Shell expression for the directory every command starts in (relative paths are under it)."""

NODE_STATE = ".gputrain"
CODE_DIR = f"{NODE_STATE}/code"
RUNS_DIR = f"{NODE_STATE}/runs"
NCCL_ENV_FILE = f"{NODE_STATE}/nccl.env"


def run_dir(run_id: str) -> str:
    return f"{RUNS_DIR}/{run_id}"


def node_helper(python: str, module: str, args: str, code: str = '"$RUN/code"') -> str:
    """Shell that execs a node module from gputrain's own copy in the code snapshot `code` (a
    shell expression), never the user's code: from its lib dir (the cwd `-m` puts first) and
    with that dir first on PYTHONPATH too (where PYTHONSAFEPATH leaves the cwd out), so a user
    package named `trainer` or `gputrain_node` neither shadows it nor is shadowed. `args` is
    shell text."""
    return (
        f"cd {code}/{contract.LIB_DIR} && "
        'PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" '
        f"exec {shlex.quote(python)} -m {module} {args}"
    )
