"""Where gputrain keeps things on a node, in one place. Every path is relative to the node root
(NODE_ROOT_SH: ``$GPUTRAIN_NODE_ROOT`` if the node sets it, else the login home), so it means the
same on every kind of node:

``.gputrain/code/``            the synced code
``.gputrain/nccl.env``         the GPU network's NCCL env, when the fabric was set up
``.gputrain/runs/<run-id>/``   pgid, jobpid, torchrun.log, exitcode ("<rc> <unix time>"), out/
                               (GPUTRAIN_OUT), logs/ (torchrun --log-dir), code/ (a hard-link
                               snapshot of the code the run started with), watch/ (GPU
                               telemetry, heartbeats, stacks: scripts/watch/node.py) and, at
                               download, workdir/ (what the job created or changed in code/);
                               run.sh is deleted once its shell holds it (it has the --env values)
"""

NODE_ROOT_SH = '"${GPUTRAIN_NODE_ROOT:-$HOME}"'
"""Shell expression for the directory every command starts in (relative paths are under it)."""

NODE_STATE = ".gputrain"
CODE_DIR = f"{NODE_STATE}/code"
RUNS_DIR = f"{NODE_STATE}/runs"
NCCL_ENV_FILE = f"{NODE_STATE}/nccl.env"


def run_dir(run_id: str) -> str:
    return f"{RUNS_DIR}/{run_id}"
