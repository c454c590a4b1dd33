"""The one rule for a variable name the user gives the nodes' environment: `--env NAME=VALUE` and
every `secrets` entry. Pure; shared by the controller's flags and the stack file's `secrets` (the
Pulumi program reads them too), so `plan`, `run` and `up` refuse the same names.
"""

from __future__ import annotations

import re

from infra.base.errors import UserError

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: Variables the node's run script, torchrun or gputrain set: a value would break the run (PATH:
#: the script's own commands) or be overwritten (the ranks).
RESERVED = frozenset(
    {
        "PATH", "HOME", "SHELL", "USER", "PWD",
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
        "GPUTRAIN_OUT", "GPUTRAIN_RUN_ID", "GPUTRAIN_NODE_ROOT",
    }
)  # fmt: skip
#: The shell's own variables: exported into the node's scripts they change how every later line
#: is read (IFS), run a file in every bash (BASH_ENV, ENV) or are overwritten by the shell.
SHELL_INTERNAL = frozenset(
    {
        "IFS", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "CDPATH", "GLOBIGNORE", "PS1", "PS2",
        "PS4", "PROMPT_COMMAND", "OPTIND", "OPTARG", "OLDPWD", "SHLVL", "PPID", "UID", "EUID",
        "LINENO", "RANDOM", "SECONDS", "BASHPID", "BASH", "FUNCNAME", "GROUPS", "HOSTNAME",
        "POSIXLY_CORRECT", "TMOUT",
    }
)  # fmt: skip
#: Secrets may not take gputrain's own names at all: GPUTRAIN_SECRET_NAMES as a secret turned the
#: node's redaction off.
SECRET_RESERVED_PREFIX = "GPUTRAIN_"


def check_env_name(name: str, setting: str, *, secret: bool = False) -> str:
    """`name` if the nodes' environment may take it, else one line (UserError) naming `setting`,
    the name and what is allowed; never the value."""
    allowed = "a shell variable name (letters, digits, '_'; not starting with a digit)"
    if not NAME.match(name):
        raise UserError(f"{setting}: name {name!r} is not allowed; allowed: {allowed}")
    why = None
    if name in RESERVED:
        why = "is set on the node by the run script, torchrun or gputrain"
    elif name in SHELL_INTERNAL or name.startswith("BASH_FUNC_"):
        why = "is the shell's own variable"
    elif secret and name.startswith(SECRET_RESERVED_PREFIX):
        why = f"is gputrain's own (every {SECRET_RESERVED_PREFIX}* name is)"
    if why:
        raise UserError(
            f"{setting}: {name} {why} and cannot be replaced; allowed: {allowed} other than "
            f"{', '.join(sorted(RESERVED | SHELL_INTERNAL))}"
            + (f" and {SECRET_RESERVED_PREFIX}*" if secret else "")
        )
    return name
