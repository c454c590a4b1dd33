"""`python torch_pins.py FILE`: the interpreter's torch and the CUDA runtime it came with, as pip
constraints (`NAME==VERSION`) in FILE; prints the torch version and how many packages came with
it (nothing without torch); `python torch_pins.py --conflict LOG`: pip's reasons for a
ResolutionImpossible in LOG as ": A; B" (nothing without). The user's requirements are installed under them, on GCE nodes (run
as `python -c` before the code is there) and on Vertex AI replicas (vertex_setup): pip picks a
torchvision/torchaudio built for this torch, or fails naming the conflict, instead of replacing
torch (gigabytes) under the node's drivers. Stands alone: the standard library only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable


def pins(distributions: Iterable[tuple[str, str]]) -> dict[str, str]:
    """(name, version) of the installed distributions -> the ones to keep: torch, its triton and
    the nvidia-* CUDA runtime wheels, the first of each name (sys.path's order); none without
    torch. Pure."""
    keep: dict[str, str] = {}
    for name, version in distributions:
        n = name.lower().replace("_", "-")
        if n in ("torch", "triton", "pytorch-triton") or n.startswith("nvidia-"):
            keep.setdefault(n, version)
    return keep if "torch" in keep else {}


def installed() -> list[tuple[str, str]]:
    """This interpreter's distributions, as (name, version)."""
    import importlib.metadata as metadata

    return [(d.metadata.get("Name") or "", d.version) for d in metadata.distributions()]  # type: ignore[attr-defined,unused-ignore]


def constraints(keep: dict[str, str]) -> str:
    """A pip constraints file's text. Pure."""
    return "".join(f"{n}=={v}\n" for n, v in sorted(keep.items()))


def conflict_reason(line: str) -> str | None:
    """A line of pip's ResolutionImpossible report that says why ("X depends on torch==...", the
    constraint as "the node has torch==..."); None for any other line. Pure."""
    line = line.strip().replace("The user requested (constraint) ", "the node has ")
    return line if " depends on " in line or line.startswith("the node has ") else None


def write(path: str) -> dict[str, str]:
    """The constraints of this interpreter into `path` (empty without torch); the pins."""
    keep = pins(installed())
    with open(path, "w") as f:
        f.write(constraints(keep))
    return keep


def conflict_reasons(lines: Iterable[str]) -> list[str]:
    """Every conflict_reason of pip's output, once each, in order. Pure."""
    return list(dict.fromkeys(r for r in map(conflict_reason, lines) if r))


if __name__ == "__main__":
    if sys.argv[1] == "--conflict":
        with open(sys.argv[2], errors="replace") as log:
            if found := conflict_reasons(log):
                print(": " + "; ".join(found), end="")
    elif kept := write(sys.argv[1]):
        print(kept["torch"], len(kept) - 1)
