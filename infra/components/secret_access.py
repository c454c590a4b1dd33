"""Read access for the identity that reads the job's secrets itself (a Vertex job's service
account, a GCE stack's reconcile job's): `roles/secretmanager.secretAccessor` on each Secret
Manager secret the stack's `secrets` names, that secret only — never a project-wide grant. A GCE
stack's nodes need none: there the controller (or the reconcile pass) reads the secrets and sends
the values to the nodes over SSH.
"""

from __future__ import annotations

import re

import pulumi
import pulumi_gcp as gcp

ACCESSOR_ROLE = "roles/secretmanager.secretAccessor"


def grant_secret_access(
    stack: str,
    project: str | None,
    secrets: tuple[tuple[str, str], ...],
    member: pulumi.Input[str],
    opts: pulumi.ResourceOptions,
) -> list[gcp.secretmanager.SecretIamMember]:
    """One member binding per (project, secret id); the resource name carries the project when
    the secret lives in another one (two projects may share a secret id)."""
    grants = []
    for where, secret in secrets:
        suffix = secret if where == project else f"{where}-{secret}"
        grants.append(
            gcp.secretmanager.SecretIamMember(
                f"{stack}-secret-{re.sub(r'[^A-Za-z0-9-]', '-', suffix)}",
                project=where,
                secret_id=secret,
                role=ACCESSOR_ROLE,
                member=member,
                opts=opts,
            )
        )
    return grants
