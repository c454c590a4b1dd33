"""A CustomJobSpec file's file-system mounts, `workerPoolSpecs[].nfsMounts` and `lustreMounts`,
checked before submission: Vertex rejects a bad one only once the job is created.

Pure: no I/O. Each rule is Google's, read while building this (none was tried on Vertex):
- NfsMount (the installed aiplatform_v1's machine_resources.py, and the REST reference,
  docs.cloud.google.com/vertex-ai/docs/reference/rest/v1beta1/NfsMount): server, path and
  mountPoint, each "Required"; server the "IP address of the NFS server"; path "Has to start
  with '/'"; "The NFS will be mounted for the user under /mnt/nfs/<mount_point>".
- "Mount a Network File System share" (cloud.google.com/vertex-ai/docs/training/
  train-nfs-share): a job that mounts a share must specify "The name of the network for Vertex
  AI to access" (`network`, or `pscInterfaceConfig` with a Private Service Connect interface);
  its field table (read in the page's Portuguese and Japanese versions, the English copy read
  here stopping before it): mountPoint a valid UNIX directory name (sourceData is mounted at
  /mnt/nfs/sourceData), path an absolute path starting with /, the server a private address in
  your VPC (not checked: a VPC may use privately used public ranges).
- LustreMount (the installed aiplatform_v1, google-cloud-aiplatform 2.7.0, and the .NET
  reference, docs.cloud.google.com/dotnet/docs/reference/Google.Cloud.AIPlatform.V1/latest/
  Google.Cloud.AIPlatform.V1.LustreMount): instanceIp ("IP address of the Lustre instance"),
  volumeHandle, filesystem and mountPoint, each "Required"; mounted "under
  /mnt/lustre/<mount_point>". No Vertex guide for Lustre mounts was found: no network rule.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from infra.base.errors import UserError

#: Each mount message's fields as the file writes them: (field, what is allowed), all Required.
NFS_FIELDS = {
    "server": "the NFS server's IP address",
    "path": "the exported path, starting with '/'",
    "mountPoint": "a directory name, e.g. data: Vertex mounts the share at /mnt/nfs/data",
}
LUSTRE_FIELDS = {
    "instanceIp": "the Lustre instance's IP address",
    "volumeHandle": "the Lustre volume's unique identifier",
    "filesystem": "the Lustre file system's name",
    "mountPoint": "a directory name, e.g. data: Vertex mounts it at /mnt/lustre/data",
}
_KINDS = {
    "nfsMounts": ("NfsMount", NFS_FIELDS),
    "lustreMounts": ("LustreMount", LUSTRE_FIELDS),
}
#: A file name's most bytes (NAME_MAX on Linux): a mountPoint is one directory name.
NAME_MAX = 255


def check_mounts(pool: Mapping[str, Any], at: str) -> None:
    """The pool's nfsMounts and lustreMounts (`at`: the pool as the line names it), one line for
    the first problem: not a list of maps, a field the message lacks, a Required field missing
    or not a string, an IP that is not one, a path not absolute, a mountPoint that is not a
    single directory name."""
    for key, (message, fields) in _KINDS.items():
        mounts = pool.get(key)
        if mounts is None:
            continue
        if not isinstance(mounts, list):
            raise UserError(
                f"{at}.{key}: a YAML {type(mounts).__name__}; allowed: a list of {message} maps "
                f"({', '.join(fields)})"
            )
        for n, mount in enumerate(mounts):
            _check_mount(mount, f"{at}.{key}[{n}]", message, fields)


def _check_mount(mount: Any, at: str, message: str, fields: Mapping[str, str]) -> None:
    if not isinstance(mount, dict):
        raise UserError(
            f"{at}: a YAML {type(mount).__name__}; allowed: a {message} map ({', '.join(fields)})"
        )
    extra = sorted(set(mount) - set(fields))
    if extra:
        raise UserError(f"{at}.{extra[0]}: not a {message} field; allowed: {', '.join(fields)}")
    for field, allowed in fields.items():
        value = mount.get(field)
        said = f"{at}.{field}" + (" is missing" if value is None else f" = {value!r}")
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{said}: allowed: {allowed} (a string: Vertex requires it)")
        if field in ("server", "instanceIp") and not _is_ip(value):
            raise UserError(f"{said}: not an IP address; allowed: {allowed}")
        if field == "path" and not value.startswith("/"):
            raise UserError(f"{said}: not absolute; allowed: {allowed}")
        if field == "mountPoint" and not _is_dir_name(value):
            raise UserError(f"{said}: not a single directory name; allowed: {allowed}")


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _is_dir_name(value: str) -> bool:
    """One UNIX directory name: no '/', not '.' or '..', no NUL, at most NAME_MAX bytes."""
    return (
        "/" not in value
        and "\0" not in value
        and value not in (".", "..")
        and len(value.encode()) <= NAME_MAX
    )


def check_nfs_network(doc: Mapping[str, Any], where: str) -> None:
    """A job that mounts an NFS share names the network Vertex reaches it through (Google's NFS
    guide: "you must specify the name of the network"): `network` (VPC Network Peering) or
    `pscInterfaceConfig` (a Private Service Connect interface). A blank `network` names none."""
    if str(doc.get("network") or "").strip() or doc.get("pscInterfaceConfig"):
        return
    for i, pool in enumerate(doc.get("workerPoolSpecs") or []):
        if isinstance(pool, dict) and pool.get("nfsMounts"):
            raise UserError(
                f"{where}: workerPoolSpecs[{i}].nfsMounts needs the network Vertex reaches the "
                "share through, and the file has none; allowed: network "
                "(projects/PROJECT_NUMBER/global/networks/NETWORK, with VPC Network Peering) or "
                "pscInterfaceConfig (a Private Service Connect interface)"
            )
