"""What an Xid means for the run, as data: NVIDIA's Xid catalogue ("Analyzing Xid Errors with
the Xid Catalog", docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) gives each Xid a
resolution; most say "restart the application", a few are informational, some are caused by
the application itself. Only the hardware class replaces a node: a user's CUDA bug must not buy
VM re-creations. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class XidClass(Enum):
    """What the watch does about an Xid (worst first)."""

    HARDWARE = "hardware"  # the GPU or its link failed: stop the job, replace the node
    APPLICATION = "application"  # the job's own error (bad address, killed process): report it
    RESTART = "restart"  # NVIDIA: restart the application; the job's own failure stands
    INFORMATIONAL = "informational"  # recorded, nothing to do: a warning


#: code -> (class, NVIDIA's description in short). Codes not listed: RESTART (the catalogue's
#: most common resolution).
XID_CLASSES: dict[int, tuple[XidClass, str]] = {
    13: (XidClass.APPLICATION, "graphics engine exception, usually the job's out-of-range access"),
    31: (XidClass.APPLICATION, "GPU memory page fault: the job used an illegal address"),
    43: (XidClass.APPLICATION, "GPU stopped processing: the job's channel was stopped"),
    45: (XidClass.APPLICATION, "preemptive cleanup: a process using the GPU ended"),
    48: (XidClass.HARDWARE, "double-bit ECC error"),
    62: (XidClass.HARDWARE, "internal micro-controller halt"),
    63: (XidClass.INFORMATIONAL, "ECC page retirement or row remapping recorded"),
    64: (XidClass.HARDWARE, "ECC page retirement or row remapping failed"),
    74: (XidClass.HARDWARE, "NVLink error"),
    79: (XidClass.HARDWARE, "GPU has fallen off the bus"),
    92: (XidClass.INFORMATIONAL, "high single-bit ECC error rate"),
    94: (XidClass.RESTART, "contained ECC error"),
    95: (XidClass.HARDWARE, "uncontained ECC error"),
    119: (XidClass.HARDWARE, "GSP RPC timeout"),
    120: (XidClass.HARDWARE, "GSP error"),
}
_ORDER = list(XidClass)


def xid_class(code: int) -> XidClass:
    return XID_CLASSES.get(code, (XidClass.RESTART, ""))[0]


def meaning(code: int) -> str:
    """NVIDIA's description in short; '' for a code the table does not name."""
    return XID_CLASSES.get(code, (XidClass.RESTART, ""))[1]


def worst(codes: Iterable[int]) -> int | None:
    """The code of the worst class among `codes` (the latest of that class); None if empty. A
    hardware Xid followed by the cleanup Xid 45 of the killed process is a hardware fault."""
    found = None
    for code in codes:
        if found is None or _ORDER.index(xid_class(code)) <= _ORDER.index(xid_class(found)):
            found = code
    return found
