"""What a `secrets` entry names, pure: `NAME` (the controller's environment variable) or
`NAME=sm://SECRET[/VERSION]` (Secret Manager). The controller resolves them
(scripts/job/environment.py); the Pulumi program of a Vertex stack grants the jobs' service account
access to exactly the Secret Manager secrets named (`secret_grants`), since there the job reads them
itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from infra.base.errors import UserError
from infra.env_names import check_env_name

SM_SCHEME = "sm://"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SM_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_SM_VERSION = re.compile(r"^(latest|[1-9][0-9]*)$")
#: A project id or number (a-z, 0-9, '-'; a domain-scoped one with '.' and ':'), never `..`
_PROJECT = re.compile(r"^(?!.*\.\.)[a-z0-9](?:[a-z0-9.:-]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class SecretRef:
    """One declared secret: the variable the ranks see, and where its value comes from."""

    name: str
    sm_secret: str | None = None  # None: the controller's environment variable `name`
    sm_version: str = "latest"
    sm_project: str | None = None  # from `sm://projects/P/secrets/S[/versions/V]`


def parse_secret(text: str, setting: str) -> SecretRef:
    """`NAME` or `NAME=sm://SECRET[/VERSION]` (or the full `sm://projects/P/secrets/S[/versions/V]`);
    UserError naming the setting and what is allowed — never echoing what follows `NAME=` unless it
    is an sm:// reference (a value pasted there by mistake is a secret)."""
    name, sep, source = text.partition("=")
    allowed = (
        "allowed: NAME (the value of the environment variable NAME here) or "
        "NAME=sm://SECRET[/VERSION] (Secret Manager)"
    )
    shown = f"{name}=..." if sep else name
    if not _NAME.match(name):
        raise UserError(f"{setting}: {shown!r} is not allowed; {allowed}")
    check_env_name(name, setting, secret=True)
    if not sep:
        return SecretRef(name)
    if not source.startswith(SM_SCHEME):
        raise UserError(
            f"{setting}: {shown!r} is not allowed (the value itself never goes in the file or "
            f"on the command line); {allowed}"
        )
    parts = source[len(SM_SCHEME) :].split("/")
    project = None
    if parts[:1] == ["projects"] and len(parts) >= 4 and parts[2] == "secrets":
        project, parts = parts[1], parts[3:]
        if len(parts) == 3 and parts[1] == "versions":
            parts = [parts[0], parts[2]]
    secret, version = parts[0], parts[1] if len(parts) > 1 else "latest"
    bad_project = project is not None and not _PROJECT.match(project)
    if (
        len(parts) > 2
        or bad_project
        or not _SM_NAME.match(secret)
        or not _SM_VERSION.match(version)
    ):
        raise UserError(
            f"{setting}: {text[:200]!r} is not allowed; {allowed}, or "
            "NAME=sm://projects/PROJECT/secrets/SECRET[/versions/VERSION] (SECRET: letters, "
            "digits, '_', '-'; VERSION: latest or a number; PROJECT: a project id or number)"
        )
    return SecretRef(name, secret, version, project)


def parse_secrets(items: Iterable[str], setting: str) -> tuple[SecretRef, ...]:
    """Every entry of one `secrets` list (or the --secret flags); a name given twice is refused:
    which source would hold is a guess, and a stack would grant only the last one."""
    refs: dict[str, SecretRef] = {}
    for item in items:
        ref = parse_secret(str(item).strip(), setting)
        if ref.name in refs:
            raise UserError(
                f"{setting}: {ref.name} is given twice; allowed: each name once (one source "
                "per variable)"
            )
        refs[ref.name] = ref
    return tuple(refs.values())


def secret_grants(refs: Sequence[SecretRef], project: str | None) -> tuple[tuple[str, str], ...]:
    """(project, secret id) of every Secret Manager secret named, once each, sorted: what a job
    that reads them itself needs `roles/secretmanager.secretAccessor` on (versions share their
    secret's policy). Plain `NAME` entries and secrets without a project need nothing here."""
    found = {
        (ref.sm_project or project, ref.sm_secret)
        for ref in refs
        if ref.sm_secret is not None and (ref.sm_project or project)
    }
    return tuple(sorted((str(p), str(s)) for p, s in found))
