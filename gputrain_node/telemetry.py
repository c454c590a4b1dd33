"""The node side of watching a run (standard library only, any trainer): `sample` polls the GPUs
into <watch>/telemetry.csv beside torchrun until torchrun ends; `dump` prints every rank's Python
stack (py-spy where it is installed, else the faulthandler our sitecustomize hook registered).

    python -m gputrain_node.telemetry sample --out DIR --interval 5 --until-pid PID
    python -m gputrain_node.telemetry dump --watch DIR --jobpid PID
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# The signal our sitecustomize hook (gputrain_node/watch_hook/) registers faulthandler on; sent only to
# processes that left a marker saying so (its default action would end any other process).
DUMP_SIGNAL = signal.SIGRTMIN + 5
QUERY_FIELDS = (
    "index",
    "pci.bus_id",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "power.draw",
    "temperature.gpu",
    "clocks.sm",
    "ecc.errors.uncorrected.volatile.total",
)
# telemetry.csv: one row per GPU per sample; empty = unknown ([N/A])
COLUMNS = (
    "time",
    "gpu",
    "util_pct",
    "mem_used_mib",
    "mem_total_mib",
    "power_w",
    "temp_c",
    "sm_clock_mhz",
    "ecc_uncorrected",
    "xid_count",
    "last_xid",
    "xids",  # the latest Xid codes, oldest first, space-separated: the watch classes each new one
)
RECENT_XIDS = 32
EXTRA_PATH = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/nvidia/bin:/var/lib/nvidia/bin"
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": os.environ.get("PATH", "") + ":" + EXTRA_PATH}


def bus_key(bus_id: str) -> str:
    """'00000000:00:04.0' (nvidia-smi) and '0000:00:04' (an Xid line) -> '00:04'."""
    parts = bus_id.lower().split(".")[0].split(":")
    return ":".join(parts[-2:])


def query_gpus() -> list[dict[str, str]]:
    """One dict per GPU from nvidia-smi; raises OSError / CalledProcessError when it fails."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(),
        check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(QUERY_FIELDS):
            rows.append(dict(zip(QUERY_FIELDS, values, strict=True)))
    return rows


def kernel_xids() -> dict[str, list[int]]:
    """Xid codes per GPU bus ('00:04') from the kernel log, oldest first: `dmesg`, else
    `sudo -n dmesg` (dmesg_restrict); {} when neither can read it."""
    for argv in (["dmesg"], ["sudo", "-n", "dmesg"]):
        if shutil.which(argv[0], path=_env()["PATH"]) is None:
            continue
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=_env())
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            found: dict[str, list[int]] = {}
            for m in _XID.finditer(r.stdout):
                found.setdefault(bus_key(m.group(1)), []).append(int(m.group(2)))
            return found
    return {}


def _number(text: str) -> str:
    """nvidia-smi's value, or '' for [N/A], N/A, [Not Supported] and the like."""
    try:
        float(text)
    except ValueError:
        return ""
    return text


def sample_rows(now: float) -> list[list[str]]:
    xids = kernel_xids()
    rows = []
    for g in query_gpus():
        codes = xids.get(bus_key(g["pci.bus_id"]), [])
        rows.append(
            [
                f"{now:.1f}",
                g["index"],
                _number(g["utilization.gpu"]),
                _number(g["memory.used"]),
                _number(g["memory.total"]),
                _number(g["power.draw"]),
                _number(g["temperature.gpu"]),
                _number(g["clocks.sm"]),
                _number(g["ecc.errors.uncorrected.volatile.total"]),
                str(len(codes)),
                str(codes[-1]) if codes else "",
                " ".join(str(c) for c in codes[-RECENT_XIDS:]),
            ]
        )
    return rows


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def sample(out_dir: Path, interval_s: float, until_pid: int | None) -> int:
    """Append a sample every interval_s until `until_pid` (torchrun) has ended. No nvidia-smi: one
    line in telemetry.err and exit 0 (a CPU node has nothing to sample)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "telemetry.csv"
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(COLUMNS)
        failures = 0
        while until_pid is None or _alive(until_pid):
            started = time.time()
            try:
                writer.writerows(sample_rows(started))
                f.flush()
                failures = 0
            except (OSError, subprocess.SubprocessError) as e:
                failures += 1
                if isinstance(e, FileNotFoundError) or failures >= 5:
                    (out_dir / "telemetry.err").write_text(f"no GPU telemetry: {e}\n")
                    return 0
            time.sleep(max(0.0, interval_s - (time.time() - started)))
    return 0


# -- stacks ------------------------------------------------------------------------------------


def _children(pid_of_root: int) -> list[int]:
    """The process tree under a pid (itself excluded)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    tree, changed = {pid_of_root}, True
    while changed:
        changed = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                changed = True
    return sorted(tree - {pid_of_root})


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def rank_processes(jobpid: int) -> list[dict[str, object]]:
    """The worker processes under torchrun: those with RANK whose parent has none (a data
    loader or compile worker inherits RANK from its rank)."""
    found = []
    tree = _children(jobpid)
    envs = {pid: _environ(pid) for pid in tree}
    for pid in tree:
        env = envs[pid]
        if "RANK" not in env:
            continue
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if "RANK" in envs.get(parent, {}):
            continue
        found.append(
            {
                "pid": pid,
                "rank": int(env["RANK"]),
                "local_rank": int(env.get("LOCAL_RANK", "0")),
                "state": _state(pid),
            }
        )
    return sorted(found, key=lambda p: int(str(p["rank"])))


def _py_spy(pid: int) -> str | None:
    exe = shutil.which("py-spy", path=str(Path(sys.executable).parent) + ":" + _env()["PATH"])
    if exe is None:
        return None
    try:
        r = subprocess.run(
            [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 and r.stdout.strip() else None


def dump(watch_dir: Path, jobpid: int, wait_s: float) -> list[dict[str, object]]:
    """Every rank's stack: py-spy where it is installed and allowed to attach, else the hook's
    faulthandler (a stopped process runs no handler: its stack is then unknown)."""
    ranks = rank_processes(jobpid)
    stacks_dir = watch_dir / "stacks"
    pending: dict[int, tuple[Path, int]] = {}
    for r in ranks:
        pid = int(str(r["pid"]))
        text = _py_spy(pid)
        if text is not None:
            r["stack"], r["how"] = text, "py-spy"
            continue
        marker = watch_dir / "hooked" / str(pid)
        out = stacks_dir / f"pid{pid}.txt"
        if not marker.exists():
            r["stack"], r["how"] = "", "none: the stack-dump hook is not loaded in this process"
        elif r["state"] == "T":
            r["stack"], r["how"] = "", "none: the process is stopped (SIGSTOP); it runs no handler"
        else:
            size = out.stat().st_size if out.exists() else 0
            pending[pid] = (out, size)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, DUMP_SIGNAL)
    end = time.time() + wait_s
    while pending and time.time() < end:
        time.sleep(0.1)
        for r in ranks:
            pid = int(str(r["pid"]))
            if pid in pending:
                out, size = pending[pid]
                if out.exists() and out.stat().st_size > size:
                    time.sleep(0.2)  # let faulthandler finish the other threads
                    r["stack"] = out.read_bytes()[size:].decode(errors="replace")
                    r["how"] = "faulthandler"
                    del pending[pid]
    for r in ranks:
        if int(str(r["pid"])) in pending:
            r["stack"], r["how"] = "", f"none: no faulthandler output within {wait_s:.0f} s"
    return ranks


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gputrain_node.telemetry", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample", help="poll the GPUs into OUT/telemetry.csv")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--interval", type=float, default=5.0)
    s.add_argument("--until-pid", type=int)
    d = sub.add_parser("dump", help="every rank's Python stack, as JSON")
    d.add_argument("--watch", type=Path, required=True)
    d.add_argument("--jobpid", type=int, required=True)
    d.add_argument("--wait", type=float, default=5.0)
    args = p.parse_args(argv)
    if args.command == "sample":
        return sample(args.out, max(0.2, args.interval), args.until_pid)
    print(json.dumps(dump(args.watch, args.jobpid, args.wait)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
