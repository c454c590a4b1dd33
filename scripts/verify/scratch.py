"""`verify`'s local SSD check: a node whose VM has local NVMe SSDs must have them mounted at
/mnt/gputrain-scratch (its startup script does it at boot; this waits a little for it). Nodes
without local SSD pass: nothing to check."""

from __future__ import annotations

from collections.abc import Mapping

from infra.base.errors import GputrainError
from infra.base.records import Fleet
from infra.scratch import LOCAL_SSD_GLOB, SCRATCH_MOUNT
from scripts import ui
from scripts.parallel import parallel
from scripts.transport.base import Transport


def build_scratch_probe(
    wait_s: int = 120, mount: str = SCRATCH_MOUNT, devices: str = LOCAL_SSD_GLOB
) -> str:
    """Prints `none`, `mounted <size>` or `not-mounted <disks>`. Pure."""
    tries = max(1, wait_s // 2)
    return (
        f"DEVS=$(ls {devices} 2>/dev/null | grep -v -- -part | wc -l); "
        '[ "$DEVS" -gt 0 ] || { echo none; exit 0; }; '
        f"i=0; while ! mountpoint -q {mount} && [ $i -lt {tries} ]; do sleep 2; i=$((i+1)); done; "
        f"if mountpoint -q {mount}; then echo mounted $(df -h --output=size {mount} | tail -1); "
        'else echo not-mounted "$DEVS"; fi'
    )


def scratch_verdict(node: str, output: str) -> str | None:
    """None when the node passes; else why not. Pure."""
    word, _, rest = output.strip().partition(" ")
    if word in ("none", "mounted"):
        return None
    if word == "not-mounted":
        return (
            f"node {node}: its {rest} local SSD(s) are not mounted at {SCRATCH_MOUNT} (the "
            "startup script assembles them at boot: `sudo journalctl -u google-startup-scripts` "
            "on the node says why)"
        )
    return f"node {node}: could not check its local SSD: {output.strip() or 'no answer'}"


def verify_scratch(fleet: Fleet, transports: Mapping[str, Transport]) -> None:
    probe = build_scratch_probe()

    def one(name: str) -> str:
        return transports[name].run(probe, 180).stdout

    names = [n.name for n in fleet.nodes]
    results, errors = parallel(names, one)
    bad = [scratch_verdict(n, results.get(n, str(errors.get(n, "")))) for n in names]
    if any(bad):
        raise GputrainError("\n".join(b for b in bad if b))
    sizes = {
        n: results[n].split(" ", 1)[1].strip() for n in names if results[n].startswith("mounted")
    }
    if sizes:
        ui.say(
            f"local SSD mounted at {SCRATCH_MOUNT}: "
            + ", ".join(f"{n} {s}" for n, s in sizes.items())
        )
