"""A job's environment on Vertex AI (its requirements and `setup`), as data in the CustomJob's env:
The node package's Vertex entry installs the requirements into a venv and runs the commands on
every replica before torchrun. The commands come from the stack file or the command
line, never from secrets; they travel as the value of an environment variable and run as `sh -c`'s
script, so nothing of them is parsed or quoted on the way. Replicas are fresh machines: nothing is
cached from one job to the next.
"""

from __future__ import annotations

import json

from gputrain_node.contract import REQUIREMENTS_ENV, SETUP_ENV, SETUP_TIMEOUT_ENV
from scripts.job.environment import Environment


def environment_env(env: Environment | None) -> dict[str, str]:
    """The CustomJob env that asks the entry for the requirements and setup ({} for none)."""
    if env is None:
        return {}
    out: dict[str, str] = {}
    if env.sources:
        out[REQUIREMENTS_ENV] = json.dumps(
            {
                "requirements_txt": env.use_requirements_txt,
                "pyproject_deps": list(env.pyproject_deps),
                "uv_lock": env.use_uv_lock,
            },
            sort_keys=True,
        )
    if env.setup.strip():
        out[SETUP_ENV] = env.setup
        out[SETUP_TIMEOUT_ENV] = str(max(1, int(env.setup_timeout_s)))
    return out
