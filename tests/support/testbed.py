"""SSH test hosts on this machine: network namespaces on a bridge, a real sshd in each, a fake
nvidia-smi each host's config controls. Needs root, /usr/sbin/sshd, ip, unshare, ssh-keygen.

Traffic stays on loopback and 10.213.0.0/24 (checked with ``ip route get`` before use). The /24
holds SLOTS test beds side by side (see Slot), each with its own networks, names, state dir and
lock: a test run takes a free slot and waits when none is (other worktrees too).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gputrain_node.telemetry import QUERY_FIELDS
from infra.base.records import Fleet, GpuExpectation, Node
from scripts.verify.nodes import GPU_FIELDS
from tests.support import alive

SUBNET = "10.213.0"
SLOTS = 3  # test beds that can run at once on one machine (make test runs three)
STATE_SIZE = "8g"  # each bed's tmpfs (its hosts' disks): an upper bound, only what is used costs
TEST_USER = "gputrain-tb"
SSHD = "/usr/sbin/sshd"
# What an earlier layout (one bed per machine) left: removed by slot 0, which takes its lock.
LEGACY_PREFIX, LEGACY_LINKS, LEGACY_STATE = "gtb-", ("gtb0", "gtb1"), Path("/run/gputrain-testbed")


@dataclass(frozen=True)
class Slot:
    """One test bed's share of the machine. Slot 0, the large one (53 hosts: the fleet bench's
    32): 10.213.0.0/26 on its bridge (hosts from .10), 10.213.0.64/26 on its isolated bridge (the
    gateway's leg at .65, hosts from .70). Slots 1 and 2 (21 hosts each): a /27 on the bridge
    at .128 / .192 and a /28 isolated beside it. Namespaces, veths, bridges, state dir, lock and
    CPU cgroup are named by its index."""

    index: int

    @property
    def large(self) -> bool:
        return self.index == 0

    @property
    def base(self) -> int:
        return 0 if self.large else 64 + 64 * self.index

    @property
    def size(self) -> int:
        return 128 if self.large else 64

    @property
    def prefix_len(self) -> int:  # the bridge's network
        return 26 if self.large else 27

    @property
    def isolated_offset(self) -> int:  # the isolated bridge's network, from base
        return 64 if self.large else 32

    @property
    def isolated_prefix_len(self) -> int:
        return 26 if self.large else 28

    @property
    def gateway_offset(self) -> int:  # the gateway host's leg on the isolated bridge
        return self.isolated_offset + 1

    def address(self, offset: int) -> str:
        return f"{SUBNET}.{self.base + offset}"

    @property
    def bridge_address(self) -> str:
        """The bridge's address in the root namespace: what the hosts reach the controller at."""
        return self.address(1)

    @property
    def host_offsets(self) -> range:
        return range(10, 63) if self.large else range(10, 31)

    @property
    def isolated_offsets(self) -> range:
        return range(70, 127) if self.large else range(38, 47)

    @property
    def isolated_cidr(self) -> str:
        """Unreachable from the root namespace (a route says so: never out through its uplink)."""
        return f"{self.address(self.isolated_offset)}/{self.isolated_prefix_len}"

    @property
    def prefix(self) -> str:  # namespaces
        return f"gtb{self.index}-"

    @property
    def bridge(self) -> str:
        return f"gtbr{self.index}"

    @property
    def iso_bridge(self) -> str:  # no address in the root namespace: only via the gateway host
        return f"gtbi{self.index}"

    def veth(self, offset: int) -> str:
        return f"gtw{self.base + offset}"

    @property
    def gateway_veth(self) -> str:
        return f"gtwgw{self.index}"

    @property
    def state(self) -> Path:
        return Path(f"/run/gputrain-testbed-{self.index}")

    @property
    def lock_path(self) -> Path:  # slot 0 keeps the one-bed layout's lock: never beside it
        suffix = "" if self.index == 0 else f"-{self.index}"
        return Path(f"/run/lock/gputrain-testbed{suffix}.lock")

    @property
    def cpu_group(self) -> Path:  # cgroup v1: the hosts' CPU time
        return Path(f"/sys/fs/cgroup/cpuacct/gputrain-testbed-{self.index}")

    def owns_link(self, dev: str) -> bool:
        if dev in (self.bridge, self.iso_bridge, self.gateway_veth):
            return True
        if dev.startswith("gtw") and dev[3:].isdigit():
            return self.base <= int(dev[3:]) < self.base + self.size
        return self.index == 0 and (dev in LEGACY_LINKS or dev.startswith("gtv"))


class TestBedUnavailable(RuntimeError):
    """The machine cannot host the test bed (not root, no sshd, ...)."""

    __test__ = False


@dataclass(frozen=True)
class GpuPhase:
    """What the GPUs report from `at_s` seconds after `set_gpus` on (the fake's clock starts
    when gpu.json is written): busy or idle, and an Xid the fake `dmesg` logs from then on."""

    at_s: float = 0.0
    util_pct: int = 0
    mem_used_mib: int = 0
    power_w: float = 30.0
    xid: int | None = None  # e.g. 79 (fallen off the bus), logged for GPU `xid_gpu`
    xid_gpu: int = 0
    ecc_errors: int | None = None  # uncorrected volatile total from now on (None: unchanged)


BUSY = GpuPhase(util_pct=97, mem_used_mib=18000, power_w=70.0)
IDLE = GpuPhase(util_pct=12, mem_used_mib=18000, power_w=25.0)


@dataclass
class GpuConfig:
    """What this host's fake nvidia-smi reports."""

    model: str = "NVIDIA L4"
    count: int = 1
    memory_mib: int = 23034
    driver: str = "550.90.07"
    ecc_errors: int | None = 0  # uncorrected volatile total per GPU; None prints [N/A]
    installing_calls: int = 0  # the first K calls fail as if the driver were still installing
    missing: bool = False  # no nvidia-smi at all (exit 127)
    invalid_fields: tuple[str, ...] = ()  # an old driver: these fields cannot be queried
    timeline: tuple[GpuPhase, ...] = ()  # utilization, memory, power, Xids over time


@dataclass(frozen=True)
class FabricFakes:
    """What this host's fake `ip` (its link listing), `ibv_devices` and `sudo` (the fabric
    setup's report) print, for `verify --fabric`. Every other `ip` call reaches the real one."""

    nics: tuple[tuple[str, int], ...]  # physical NICs (name, MTU), nic0 first
    rdma_devices: tuple[str, ...] = ()
    down: tuple[str, ...] = ()
    setup_report: str = ""  # what `sudo -n bash -s` (the fabric setup) prints; "" = exit 1
    rxdm_log: str = ""  # what `sudo -n docker logs ...` prints (TCPXO's daemon); "" = exit 1


# `ip -j -d link show`: the JSON iproute2 prints (physical NICs carry parentbus/parentdev).
FAKE_IP = r'''#!/usr/bin/python3
"""Fake ip for the gputrain test bed: lists this host's fabric.json NICs, else runs the real ip."""
import json, os, sys
args = sys.argv[1:]
if "-j" in args and "link" in args:
    fab = json.load(open("__DIR__/fabric.json"))
    links = [{"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP"], "mtu": 65536,
              "operstate": "UNKNOWN", "link_type": "loopback"}]
    for i, (name, mtu) in enumerate(fab["nics"]):
        links.append({"ifindex": i + 2, "ifname": name, "mtu": mtu, "link_type": "ether",
                      "operstate": "DOWN" if name in fab["down"] else "UP",
                      "parentbus": "pci", "parentdev": f"0000:{0x81 + 12 * i:02x}:00.0"})
    print(json.dumps(links))
    sys.exit(0)
os.execv("__REAL_IP__", ["ip", *args])
'''
FAKE_IBV_DEVICES = """#!/bin/sh
printf '    device          \t   node GUID\n    ------          \t----------------\n'
i=0
for d in $(cat __DIR__/ibv); do printf '    %-16s\t0c42a1030065%04x\n' "$d" $i; i=$((i+1)); done
"""
FAKE_SUDO = """#!/bin/sh
# Fake sudo: the fabric setup (`sudo -n bash -s`, script on stdin) prints the recorded report;
# `sudo -n docker logs ...` prints the recorded daemon log.
if [ "$1 $2" = "-n docker" ] && [ -s __DIR__/rxdm_log ]; then cat __DIR__/rxdm_log; exit 0; fi
[ "$*" = "-n bash -s" ] && [ -s __DIR__/setup_report ] || exit 1
cat > __DIR__/setup_script && cat __DIR__/setup_report
"""


@dataclass
class TestHost:
    """One test host: its namespace, address, pinned host key and state directory."""

    __test__ = False
    name: str
    address: str
    namespace: str
    host_key: str  # "ssh-ed25519 AAAA..."
    dir: Path
    isolated: bool = False
    containers: bool = False  # entered with nsenter: podman sees the cgroups
    hostname: str | None = None  # set_hostname's (else its name), in the hosts file too
    sshd: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def node(self, role: str = "worker", *, user: str = TEST_USER, via_head: bool = False) -> Node:
        return Node(
            name=self.name,
            role=role,  # type: ignore[arg-type]
            internal_address=self.address,
            address=None if (via_head or self.isolated) else self.address,
            user=user,
            host_keys=(self.host_key,),
        )


# -S (no site): the fake costs a host ~10 ms of CPU instead of ~20, which matters when 32 test
# hosts share the controller's 2 cores (a real nvidia-smi runs on its own machine).
FAKE_NVIDIA_SMI = r'''#!/usr/bin/python3 -S
"""Fake nvidia-smi for the gputrain test bed: answers --query-gpu from this host's gpu.json."""
import hashlib, json, os, sys, time
GPU_DIR = "__GPU_DIR__"
cfg = json.load(open(GPU_DIR + "/gpu.json"))
elapsed = time.time() - os.stat(GPU_DIR + "/gpu.json").st_mtime
phase = {"util_pct": 0, "mem_used_mib": 0, "power_w": 30.0, "ecc_errors": None}
for p in cfg["timeline"]:
    if p["at_s"] <= elapsed:
        phase = {**p, "ecc_errors": p["ecc_errors"] if p["ecc_errors"] is not None else phase["ecc_errors"]}
if cfg["installing_calls"] > 0:
    try:
        calls = int(open(GPU_DIR + "/calls").read() or 0)
    except OSError:
        calls = 0
    open(GPU_DIR + "/calls", "w").write(str(calls + 1))
    if calls < cfg["installing_calls"]:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")
        sys.exit(9)
args = sys.argv[1:]
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "")
nounits = "nounits" in fmt
if query is None:
    print(f"Driver Version: {cfg['driver']}")
    for i in range(cfg["count"]):
        print(f"GPU {i}: {cfg['model']} {cfg['memory_mib']}MiB")
    sys.exit(0)
fields = query.split(",")
ecc = cfg["ecc_errors"] if phase["ecc_errors"] is None else phase["ecc_errors"]
u = "" if nounits else " %"


def values(i):
    h = hashlib.md5(f"{cfg['model']}/{i}".encode()).hexdigest()
    return {
        "index": str(i),
        "name": cfg["model"],
        "uuid": f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}",
        "memory.total": f"{cfg['memory_mib']}" + ("" if nounits else " MiB"),
        "driver_version": cfg["driver"],
        "ecc.errors.uncorrected.volatile.total": "[N/A]" if ecc is None else str(ecc),
        "pci.bus_id": f"00000000:00:{4 + i:02X}.0",
        "temperature.gpu": "34",
        "utilization.gpu": f"{phase['util_pct']}{u}",
        "memory.used": f"{phase['mem_used_mib']}" + ("" if nounits else " MiB"),
        "power.draw": f"{phase['power_w']:.2f}" + ("" if nounits else " W"),
        "clocks.sm": ("1980" if phase["util_pct"] else "210") + ("" if nounits else " MHz"),
    }


for f in fields:  # an unknown field: the error alone, no header (as a real one)
    if f not in values(0) or f in cfg["invalid_fields"]:
        print(f'Field "{f}" is not a valid field to query.', file=sys.stderr)
        sys.exit(2)
# The header as a real one prints it (tests/support/nvidia_smi/): units in brackets, clocks.sm
# under its long name; with nounits (never recorded: gputrain always asks noheader) bare names.
UNITS = {"memory.total": "MiB", "memory.used": "MiB", "utilization.gpu": "%", "power.draw": "W",
         "clocks.sm": "MHz"}
if "noheader" not in fmt:
    print(", ".join(f if nounits or f not in UNITS else
                    f"{'clocks.current.sm' if f == 'clocks.sm' else f} [{UNITS[f]}]" for f in fields))
for i in range(cfg["count"]):
    print(", ".join(values(i)[f] for f in fields))
'''


def _nvidia_smi_front(fake: Path, gpus: GpuConfig) -> str:
    """The host's nvidia-smi: with a static gpu.json (no timeline, no installing driver) the
    answers to gputrain's two queries (verify's, the telemetry sampler's), rendered once by the
    fake itself, are printed by sh alone (~1 ms instead of ~10 on 32 hosts sharing 2 cores);
    anything else runs the fake."""
    cases = []
    if not gpus.timeline and not gpus.installing_calls:
        for fields in (GPU_FIELDS, QUERY_FIELDS):
            args = (f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
            r = subprocess.run([str(fake), *args], capture_output=True, text=True, timeout=30)
            if r.returncode == 0 and not r.stderr:
                rows = " ".join(shlex.quote(row) for row in r.stdout.splitlines())
                cases.append(f"  {shlex.quote(' '.join(args))}) printf '%s\\n' {rows}; exit 0;;\n")
    fast = f'case "$*" in\n{"".join(cases)}esac\n' if cases else ""
    return f'#!/bin/sh\n{fast}exec {shlex.quote(str(fake))} "$@"\n'


FAKE_DMESG = r'''#!/usr/bin/python3 -S
"""Fake dmesg for the gputrain test bed: the kernel log's NVRM Xid lines of gpu.json's timeline."""
import json, os, time
GPU_DIR = "__GPU_DIR__"
cfg = json.load(open(GPU_DIR + "/gpu.json"))
elapsed = time.time() - os.stat(GPU_DIR + "/gpu.json").st_mtime
print("[    0.000000] Linux version 6.1.0 (test bed)")
for p in cfg["timeline"]:
    if p["xid"] is not None and p["at_s"] <= elapsed:
        print(f"[{p['at_s'] + 100:12.6f}] NVRM: Xid (PCI:0000:00:{4 + p['xid_gpu']:02x}): "
              f"{p['xid']}, pid=4242, name=python3, GPU has fallen off the bus.")
'''


TRIVIAL_PYTHON = """#!/bin/sh
# gputrain test bed: a stand-in interpreter for fleet-scale tests and the bench. `-c` checks go to
# the real one; in place of torchrun, a trivial job prints one line and writes a result naming
# its host (the fleet machinery is measured, not torch's import on 2 shared cores); the run's
# helpers (the telemetry sampler) have nothing to watch and end at once.
case "$1" in -c|-I) exec __PYTHON__ "$@";; esac
[ "$2" = torch.distributed.run ] || exit 0
read -r host < /proc/sys/kernel/hostname
echo "[rank0]:trivial job on $host: $*"
mkdir -p "$GPUTRAIN_OUT" && echo "$host" > "$GPUTRAIN_OUT/ok.txt"
"""


@functools.cache
def _sshd_no_reexec() -> str:
    """`-r ` where this sshd has it: no re-exec per connection (a test host's connection costs
    ~10 ms of CPU instead of ~15, which counts when 32 hosts share 2 cores)."""
    return "-r " if _run(SSHD, "-r", "-V", check=False).returncode == 0 else ""


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _keygen(path: str, comment: str) -> None:
    """A new ed25519 key pair at `path` (no passphrase)."""
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path)


def _ns_pids(ns: str) -> list[int]:
    r = _run("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _kill_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def check_prerequisites() -> None:
    """Raise TestBedUnavailable with the reason when this machine cannot run the test bed."""
    if os.geteuid() != 0:
        raise TestBedUnavailable("the SSH test bed needs root (network namespaces, sshd)")
    for tool in (SSHD, "/usr/bin/ssh-keygen"):
        if not os.path.exists(tool):
            raise TestBedUnavailable(f"{tool} is missing (apt-get install openssh-server)")
    for tool in ("ip", "unshare", "mount", "ps"):
        if shutil.which(tool) is None:
            raise TestBedUnavailable(f"{tool} is missing (iproute2 / util-linux / procps)")


class TestBed:
    """The test hosts. ``start()`` takes the machine-wide lock and clears leftovers; hosts can
    be added and removed at any time; ``close()`` removes everything and releases the lock."""

    __test__ = False

    def __init__(
        self,
        python: str | None = None,
        lock_timeout_s: float = 900,
        *,
        count_cpu: bool = False,
        min_hosts: int = 0,
    ) -> None:
        self.python = python or sys.executable  # the interpreter with torch, run on the hosts
        self.count_cpu = count_cpu  # account the hosts' CPU time (hosts_cpu_s), for benchmarks
        self.min_hosts = min_hosts  # only a slot that holds this many hosts at once
        self._cpu_group: Path | None = None
        self.lock_timeout_s = lock_timeout_s
        self.hosts: dict[str, TestHost] = {}
        self.slot = Slot(0)  # until start() takes a free one
        self.user = TEST_USER
        self._lock_fd: int | None = None
        self._mutex = threading.Lock()
        self._iso_gateway: str | None = None
        # Addresses of removed hosts are not handed out again while others are free: a new host
        # (a re-created VM) behind an old address would meet stale ARP entries for ~30 s. When
        # every free one was used, the one removed longest ago (offset -> when it was removed),
        # its neighbour entries flushed first.
        self._retired: dict[int, float] = {}

    @property
    def state(self) -> Path:
        """This bed's state dir: per host its keys, config, fakes and node root (home/)."""
        return self.slot.state

    @property
    def identity_file(self) -> Path:
        return self.state / "client_ed25519"

    @property
    def bridge_address(self) -> str:
        """Where the hosts reach this machine (a package index, a registry served here)."""
        return self.slot.bridge_address

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> TestBed:
        check_prerequisites()
        self._acquire_lock()
        state = self.state
        try:
            cleanup_leftovers(self.slot)
            state.mkdir(mode=0o755, parents=True)
            # the hosts' disks in memory: each VM has its own disk, while 32 hosts extracting
            # their code into one ext4 journal at once spend most of their CPU contending for it
            _run(
                "mount", "-t", "tmpfs", "-o", f"size={STATE_SIZE},mode=0755", state.name, str(state)
            )
            Path("/run/sshd").mkdir(exist_ok=True)
            _keygen(str(self.identity_file), "gputrain-testbed")
            pub = (state / "client_ed25519.pub").read_text()
            (state / "authorized_keys").write_text(pub)
            os.chmod(state / "authorized_keys", 0o644)
            (state / "hosts").write_text("127.0.0.1 localhost\n")
            os.chmod(state / "hosts", 0o644)
            self.user = self._login_user()
            _run("ip", "link", "add", self.slot.bridge, "type", "bridge")
            cidr = f"{self.slot.bridge_address}/{self.slot.prefix_len}"
            _run("ip", "addr", "add", cidr, "dev", self.slot.bridge)
            _run("ip", "link", "set", self.slot.bridge, "up")
            _run("ip", "link", "add", self.slot.iso_bridge, "type", "bridge")
            _run("ip", "link", "set", self.slot.iso_bridge, "up")
            _run("ip", "route", "replace", "unreachable", self.slot.isolated_cidr)
            if self.count_cpu:
                group = self.slot.cpu_group
                if not group.parent.is_dir():
                    raise TestBedUnavailable(
                        f"count_cpu needs cgroup v1's cpuacct ({group.parent})"
                    )
                group.mkdir(exist_ok=True)
                self._cpu_group = group
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        try:
            for name in list(self.hosts):
                self._stop_sshd(self.hosts[name])
            if self._lock_fd is not None:
                cleanup_leftovers(self.slot)
        finally:
            self.hosts.clear()
            self._cpu_group = None
            self._release_lock()

    def __enter__(self) -> TestBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _acquire_lock(self) -> None:
        """The first free slot's lock (waiting while every slot is taken)."""
        slots = [Slot(i) for i in range(SLOTS)]
        slots = [s for s in slots if len(s.host_offsets) >= self.min_hosts]
        if not slots:
            raise TestBedUnavailable(f"no test-bed slot holds {self.min_hosts} hosts")
        slots[0].lock_path.parent.mkdir(parents=True, exist_ok=True)
        fds = [os.open(slot.lock_path, os.O_RDWR | os.O_CREAT, 0o644) for slot in slots]
        end = time.monotonic() + self.lock_timeout_s
        said = False
        try:
            while True:
                for slot, fd in zip(slots, fds, strict=True):
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue
                    os.ftruncate(fd, 0)
                    os.write(fd, f"{os.getpid()}\n".encode())
                    self.slot, self._lock_fd = slot, fd
                    return
                if time.monotonic() > end:
                    raise TestBedUnavailable(
                        f"other test beds held all {SLOTS} slots for {self.lock_timeout_s:.0f} s"
                    )
                if not said:
                    print(f"test bed: all {SLOTS} slots are taken; waiting", file=sys.stderr)
                    said = True
                time.sleep(0.5)
        finally:
            for fd in fds:
                if fd != self._lock_fd:
                    os.close(fd)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def _login_user(self) -> str:
        """A dedicated unprivileged user with a clean per-host home, like a fresh VM — if it can
        read the interpreter with torch (the repo may live anywhere); else root."""
        try:
            pwd.getpwnam(TEST_USER)
        except KeyError:
            r = _run(
                "useradd",
                "--system",
                "--shell",
                "/bin/bash",
                "--home-dir",
                f"/home/{TEST_USER}",
                "--no-create-home",
                TEST_USER,
                check=False,
            )
            if r.returncode != 0 and not _user_exists(TEST_USER):  # (another slot made it)
                return "root"
        _run("usermod", "-p", "*", TEST_USER, check=False)  # not locked: sshd w/o PAM refuses
        Path(f"/home/{TEST_USER}").mkdir(exist_ok=True)
        probe = (
            "import importlib.util as u, os; s = u.find_spec('torch'); "
            "print(bool(s) and os.access(s.origin, os.R_OK))"
        )
        r = _run("runuser", "-u", TEST_USER, "--", self.python, "-c", probe, check=False)
        return TEST_USER if r.stdout.strip() == "True" else "root"

    # -- hosts -------------------------------------------------------------------------------

    def add_host(
        self,
        name: str | None = None,
        *,
        gpus: GpuConfig | None = None,
        isolated_behind: str | None = None,
        sshd_delay_s: float = 0.0,
        fabric: FabricFakes | None = None,
        containers: bool = False,
    ) -> TestHost:
        """A new host with a running sshd (after sshd_delay_s). ``isolated_behind=<host>``: on
        the second bridge, reachable only from that host's namespace (for jump tests).
        ``containers``: podman can run there (tests/support/container_bed.py)."""
        host = self._create_host(name, gpus, isolated_behind, sshd_delay_s, fabric, containers)
        if not sshd_delay_s:
            self.wait_listening(host, 5)
        return host

    def add_hosts(self, count: int, *, gpus: GpuConfig | None = None) -> list[TestHost]:
        """`count` new hosts, their sshd started side by side and waited for together (the
        starts overlap instead of one waiting for the next: a fleet of 32 on 2 cores)."""
        hosts = [self._create_host(None, gpus, None, 0.0, None) for _ in range(count)]
        for host in hosts:
            self.wait_listening(host, 10)
        return hosts

    def _create_host(
        self,
        name: str | None,
        gpus: GpuConfig | None,
        isolated_behind: str | None,
        sshd_delay_s: float,
        fabric: FabricFakes | None,
        containers: bool = False,
    ) -> TestHost:
        """The namespace, keys, config and fakes of a new host, its sshd started (not waited for)."""
        with self._mutex:
            slot = self.slot
            used = {self._offset(h) for h in self.hosts.values()}
            span = slot.host_offsets if isolated_behind is None else slot.isolated_offsets
            free = [i for i in span if i not in used]
            fresh = [i for i in free if i not in self._retired]
            offset = fresh[0] if fresh else min(free, key=lambda i: self._retired.get(i, 0.0))
            name = name or f"{'h' if isolated_behind is None else 'x'}{offset - span.start}"
            if name in self.hosts:
                raise ValueError(f"test host {name} exists")
            address = slot.address(offset)
            ns = slot.prefix + name
            d = self.state / name
            (d / "bin").mkdir(parents=True)
            (d / "gpu").mkdir()
            os.chmod(d / "gpu", 0o777)
            (d / "home").mkdir()
            if self.user != "root":
                shutil.chown(d / "home", TEST_USER, TEST_USER)
            _keygen(str(d / "ssh_host_ed25519_key"), name)
            host_key = " ".join((d / "ssh_host_ed25519_key.pub").read_text().split()[:2])
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            if isolated_behind is None:
                self._veth(ns, slot.veth(offset), slot.bridge, f"{address}/{slot.prefix_len}")
            else:
                self._ensure_iso_gateway(isolated_behind)
                cidr = f"{address}/{slot.isolated_prefix_len}"
                self._veth(ns, slot.veth(offset), slot.iso_bridge, cidr)
            if offset in self._retired:  # an address used before: no stale MAC for it anywhere
                for where in ([], *(["-n", h.namespace] for h in self.hosts.values())):
                    _run("ip", *where, "neigh", "flush", "to", address, check=False)
            host = TestHost(name, address, ns, host_key, d, isolated_behind is not None, containers)
            if not host.isolated:
                route = _run("ip", "route", "get", address).stdout
                if f"dev {slot.bridge} " not in route:
                    raise TestBedUnavailable(
                        f"route to {address} is not via {slot.bridge}: {route}"
                    )
            self.hosts[name] = host
            self.set_gpus(name, gpus or GpuConfig())
            if fabric is not None:
                self.set_fabric(name, fabric)
            self._write_hosts_file()
            self._write_sshd_config(host)
            self._spawn_sshd(host, sshd_delay_s)
            return host

    def _veth(self, ns: str, root_end: str, bridge: str, cidr: str, peer: str = "eth0") -> None:
        _run("ip", "link", "add", root_end, "type", "veth", "peer", "name", peer, "netns", ns)
        _run("ip", "link", "set", root_end, "master", bridge, "up")
        _run("ip", "-n", ns, "addr", "add", cidr, "dev", peer)
        _run("ip", "-n", ns, "link", "set", peer, "up")

    def _ensure_iso_gateway(self, gateway: str) -> None:
        if self._iso_gateway == gateway:
            return
        if self._iso_gateway is not None:
            raise ValueError(f"the isolated bridge is already behind {self._iso_gateway}")
        gw = self.hosts[gateway]
        slot = self.slot
        self._veth(
            gw.namespace,
            slot.gateway_veth,
            slot.iso_bridge,
            f"{slot.address(slot.gateway_offset)}/{slot.isolated_prefix_len}",
            peer="eth1",
        )
        self._iso_gateway = gateway

    def remove_host(self, name: str) -> None:
        """Stop the host's processes and delete its namespace (its veths go with it)."""
        with self._mutex:
            host = self.hosts.pop(name)
            self._retired[self._offset(host)] = time.monotonic()
            self._stop_sshd(host)
            # the root ends of its veths deleted here: a namespace's deletion takes them away
            # only later (the kernel's cleanup), and the next gateway would find its name taken
            veths = [self.slot.veth(self._offset(host))]
            if self._iso_gateway == name:
                veths.append(self.slot.gateway_veth)
                self._iso_gateway = None
            _kill_namespace(host.namespace, *veths)
            shutil.rmtree(host.dir, ignore_errors=True)
            self._write_hosts_file()

    def _offset(self, host: TestHost) -> int:
        return int(host.address.rsplit(".", 1)[1]) - self.slot.base

    def reset_node_state(self, name: str) -> None:
        """Empty the host's node root (its code and runs), as on a fresh VM."""
        home = self.hosts[name].dir / "home"
        for p in home.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()

    def trivial_python(self) -> str:
        """The path of TRIVIAL_PYTHON on this test bed (a fleet's `python`), removed with it."""
        path = self.state / "trivial-python"
        path.write_text(TRIVIAL_PYTHON.replace("__PYTHON__", self.python))
        path.chmod(0o755)
        return str(path)

    def hosts_cpu_s(self) -> float:
        """CPU seconds used so far by everything the hosts ran: sshd, login shells, jobs (their
        detached processes too). Needs ``count_cpu=True``."""
        if self._cpu_group is None:
            raise TestBedUnavailable("the test bed was started without count_cpu=True")
        return int((self._cpu_group / "cpuacct.usage").read_text()) / 1e9

    def set_gpus(self, name: str, gpus: GpuConfig) -> None:
        """Change what the host's nvidia-smi reports (takes effect on the next call)."""
        host = self.hosts[name]
        gpu_dir = host.dir / "gpu"
        (gpu_dir / "gpu.json").write_text(json.dumps(asdict(gpus)))
        (gpu_dir / "calls").unlink(missing_ok=True)
        script = host.dir / "bin" / "nvidia-smi"
        if gpus.missing:
            script.unlink(missing_ok=True)
        else:
            fake = gpu_dir / "nvidia-smi.py"
            fake.write_text(FAKE_NVIDIA_SMI.replace("__GPU_DIR__", str(gpu_dir)))
            fake.chmod(0o755)
            script.write_text(_nvidia_smi_front(fake, gpus))
            script.chmod(0o755)
        dmesg = host.dir / "bin" / "dmesg"
        dmesg.write_text(FAKE_DMESG.replace("__GPU_DIR__", str(gpu_dir)))
        dmesg.chmod(0o755)

    def set_fabric(self, name: str, fakes: FabricFakes) -> None:
        """Fake `ip`, `ibv_devices` and `sudo` in the host's bin dir (first on its PATH when the
        host was added with `fabric=`)."""
        host = self.hosts[name]
        gpu_dir, bin_dir = host.dir / "gpu", host.dir / "bin"
        (gpu_dir / "fabric.json").write_text(
            json.dumps({"nics": [list(n) for n in fakes.nics], "down": list(fakes.down)})
        )
        (gpu_dir / "ibv").write_text(" ".join(fakes.rdma_devices))
        (gpu_dir / "setup_report").write_text(fakes.setup_report)
        (gpu_dir / "rxdm_log").write_text(fakes.rxdm_log)
        real_ip = shutil.which("ip") or "/usr/sbin/ip"
        for tool, body in (
            ("ip", FAKE_IP.replace("__REAL_IP__", real_ip)),
            ("ibv_devices", FAKE_IBV_DEVICES),
            ("sudo", FAKE_SUDO),
        ):
            if tool == "ibv_devices" and not fakes.rdma_devices:
                (bin_dir / tool).unlink(missing_ok=True)  # not installed
                continue
            (bin_dir / tool).write_text(body.replace("__DIR__", str(gpu_dir)))
            (bin_dir / tool).chmod(0o755)

    def _write_hosts_file(self) -> None:
        lines = ["127.0.0.1 localhost"] + [
            f"{h.address} {f'{h.hostname} ' if h.hostname else ''}{h.name}"
            for h in self.hosts.values()
        ]
        with open(self.state / "hosts", "r+") as f:  # in place: the per-host bind mounts see it
            f.truncate(0)
            f.write("\n".join(lines) + "\n")

    def _write_sshd_config(self, host: TestHost) -> None:
        lines = [
            f"ListenAddress {host.address}:22",
            f"HostKey {host.dir}/ssh_host_ed25519_key",
            f"PidFile {host.dir}/sshd.pid",
            f"AuthorizedKeysFile {self.state}/authorized_keys",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "AllowTcpForwarding yes",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            "LogLevel ERROR",
            "Subsystem sftp internal-sftp",
        ]
        env = []
        if self.user == "root":  # no clean per-host home: give each host its own node root
            env.append(f"GPUTRAIN_NODE_ROOT={host.dir}/home")
        # the fake nvidia-smi, dmesg (and with fabric fakes ip / ibv_devices / sudo) in
        # /usr/local/sbin shadow the real ones: the test bed's GPUs and kernel log are fake
        env.append("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        if env:  # sshd uses the first SetEnv line only
            lines.append("SetEnv " + " ".join(env))
        (host.dir / "sshd_config").write_text("\n".join(lines) + "\n")

    def _start_sshd(self, host: TestHost, delay_s: float = 0.0) -> None:
        self._spawn_sshd(host, delay_s)
        if not delay_s:
            self.wait_listening(host, 5)

    def _spawn_sshd(self, host: TestHost, delay_s: float) -> None:
        mounts = [
            f"hostname {host.name}",
            f"mount --bind {self.state}/hosts /etc/hosts",
            f"mount --bind {host.dir}/bin /usr/local/sbin",
        ]
        if self.user != "root":
            mounts.append(f"mount --bind {host.dir}/home /home/{TEST_USER}")
        if host.containers:  # rootless podman's --ipc host binds /dev/mqueue (machines have one)
            mounts.append("mkdir -p /dev/mqueue && mount -t mqueue mqueue /dev/mqueue")
            if os.path.isfile("/usr/local/bin/docker"):  # its docker is the one a test puts
                # there: this machine's daemonless docker CLI is hidden (nothing a host runs
                # lives in /usr/local/bin)
                (host.dir / "no-local-bin").mkdir(exist_ok=True)
                mounts.append(f"mount --bind {host.dir}/no-local-bin /usr/local/bin")
        script = " && ".join(
            ([f"sleep {delay_s}"] if delay_s else [])
            + mounts
            + [f"exec {SSHD} -D -e {_sshd_no_reexec()}-f {host.dir}/sshd_config"]
        )
        # `ip netns exec` remounts /sys, which hides the cgroups podman needs: container hosts
        # enter only the network namespace
        enter = (
            ["nsenter", f"--net=/var/run/netns/{host.namespace}"]
            if host.containers
            else ["ip", "netns", "exec", host.namespace]
        )
        with open(host.dir / "sshd.log", "ab") as log:
            host.sshd = subprocess.Popen(
                [*enter, "unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c",
                 script],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
        if self._cpu_group is not None:  # what the host runs (sshd, shells, jobs) is counted
            (self._cpu_group / "tasks").write_text(str(host.sshd.pid))

    def wait_listening(self, host: TestHost, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            r = _run("ip", "netns", "exec", host.namespace, "ss", "-Htln", check=False)
            if f"{host.address}:22" in r.stdout:
                return
            if host.sshd is not None and host.sshd.poll() is not None:
                raise TestBedUnavailable(
                    f"sshd on {host.name} exited: {(host.dir / 'sshd.log').read_text()[-500:]}"
                )
            time.sleep(0.02)
        raise TestBedUnavailable(f"sshd on {host.name} did not listen within {timeout_s} s")

    def _stop_sshd(self, host: TestHost) -> None:
        if host.sshd is not None and host.sshd.poll() is None:
            host.sshd.kill()
            host.sshd.wait(5)

    def stop_sshd(self, name: str) -> None:
        """Stop listening for new connections (existing sessions live on)."""
        self._stop_sshd(self.hosts[name])

    def start_sshd(self, name: str, delay_s: float = 0.0) -> None:
        self._start_sshd(self.hosts[name], delay_s)

    # -- faults ------------------------------------------------------------------------------

    def drop_connections(self, name: str) -> int:
        """Kill the per-connection sshd processes (not the listener): every SSH session to the
        host ends with a FIN, as when a NAT or a flaky link drops it. Returns how many."""
        host = self.hosts[name]
        listener = host.sshd.pid if host.sshd else -1
        pids = [p for p in _ns_pids(host.namespace) if p != listener and _comm(p) == "sshd"]
        _kill_pids(pids, signal.SIGKILL)
        return len(pids)

    def set_hostname(self, name: str, hostname: str) -> None:
        """The host's hostname from now on (its sshd's UTS namespace: every later login's), as a
        VM's is its instance name: torchrun's c10d numbers the nodes in their hostnames' order."""
        host = self.hosts[name]
        assert host.sshd is not None
        _run("nsenter", "-t", str(host.sshd.pid), "-u", "hostname", hostname)
        with self._mutex:  # resolvable at once, and first on its line: getfqdn's answer
            host.hostname = hostname
            self._write_hosts_file()

    def kill_processes(self, name: str) -> int:
        """SIGKILL every process on the host except sshd: the training dies without a word."""
        host = self.hosts[name]
        pids = [p for p in _ns_pids(host.namespace) if _comm(p) != "sshd"]
        _kill_pids(pids, signal.SIGKILL)
        return len(pids)

    def set_link(self, name: str, up: bool) -> None:
        """Take the host's interface down (or up again) inside its namespace: packets vanish
        without a FIN or RST, as when a VM's network dies; the controller's sockets then see
        "No route to host" once the neighbour entry expires."""
        host = self.hosts[name]
        _run("ip", "-n", host.namespace, "link", "set", "eth0", "up" if up else "down")

    # -- what the code under test needs ------------------------------------------------------

    def hosts_file(
        self, d: Path, hosts: list[TestHost], extra: str = "", *, known: str | None = None
    ) -> Path:
        """d/lab.yaml, a `--hosts` file for these hosts (the bed's user, key and interpreter)
        with `extra` YAML lines before `hosts:`; d/known_hosts pins their keys (or is `known`)."""
        d.mkdir(parents=True, exist_ok=True)
        pins = "".join(f"{h.address} {h.host_key}\n" for h in hosts)
        (d / "known_hosts").write_text(pins if known is None else known)
        path = d / "lab.yaml"
        path.write_text(
            f"user: {self.user}\nidentity_file: {self.identity_file}\nknown_hosts: known_hosts\n"
            f"python: {self.python}\n{extra}hosts:\n"
            + "".join(f"  - address: {h.address}\n" for h in hosts)
        )
        return path

    def fleet(
        self,
        hosts: list[TestHost],
        *,
        expect: GpuExpectation | None = None,
        target: str = "hosts-testbed",
        jump: bool = False,
    ) -> Fleet:
        """hosts[0] is the head; with jump=True workers are reached through it."""
        nodes = tuple(
            h.node("head" if i == 0 else "worker", user=self.user, via_head=jump and i > 0)
            for i, h in enumerate(hosts)
        )
        return Fleet(
            target=target,
            nodes=nodes,
            expect=expect or GpuExpectation(),
            identity_file=self.identity_file,
            python=self.python,
        )


def _kill_namespace(ns: str, *root_veths: str) -> None:
    """SIGKILL everything in the namespace, wait until it is gone, delete veths and namespace."""
    pids = _ns_pids(ns)
    _kill_pids(pids, signal.SIGKILL)
    end = time.monotonic() + 3
    while time.monotonic() < end and any(alive(p) for p in pids):
        time.sleep(0.02)
    for root_veth in root_veths:
        _run("ip", "link", "del", root_veth, check=False)
    _run("ip", "netns", "del", ns, check=False)


def cleanup_leftovers(slot: Slot) -> None:
    """Remove the slot's namespaces, bridges, veths and processes (also from a killed run; slot 0
    also what the one-bed layout left). The caller holds the slot's lock."""
    prefixes = (slot.prefix, LEGACY_PREFIX) if slot.index == 0 else (slot.prefix,)
    states = [slot.state, LEGACY_STATE] if slot.index == 0 else [slot.state]
    r = _run("ip", "netns", "list", check=False)
    namespaces = [line.split()[0] for line in r.stdout.splitlines() if line.startswith(prefixes)]
    pids: list[int] = []
    for ns in namespaces:
        pids += _ns_pids(ns)
    for state in states:
        for pidfile in state.glob("*/sshd.pid") if state.exists() else []:
            try:
                pid = int(pidfile.read_text().strip())
                if str(state) in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                    pids.append(pid)
            except (OSError, ValueError):
                pass
    _kill_pids(pids, signal.SIGTERM)
    end = time.monotonic() + 2
    while time.monotonic() < end and any(alive(p) for p in pids):
        time.sleep(0.05)
    _kill_pids(pids, signal.SIGKILL)
    for ns in namespaces:
        _kill_pids(_ns_pids(ns), signal.SIGKILL)
        _run("ip", "netns", "del", ns, check=False)
    links = _run("ip", "-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        dev = line.split(":")[1].strip().split("@")[0]
        if slot.owns_link(dev):
            _run("ip", "link", "del", dev, check=False)
    _run("ip", "route", "del", "unreachable", slot.isolated_cidr, check=False)
    for state in states:
        if os.path.ismount(state):
            _run("umount", "--lazy", str(state), check=False)
        shutil.rmtree(state, ignore_errors=True)
    if slot.cpu_group.exists():
        with contextlib.suppress(OSError):  # its processes are gone: the group can go too
            slot.cpu_group.rmdir()
