"""`verify --fabric` checks: NICs and MTU, RDMA devices, the TCPXO daemon, the NCCL log and the
bus bandwidth of a 2-node all-reduce. Pure parsers and checks; every problem is one line that
starts with the name of the check (`nics`, `mtu`, `rdma`, `rxdm`, `nccl-plugin`,
`nccl-network`, `nccl-socket`, `busbw`).

`PROBE_COMMAND` gathers the node-side facts in one round trip; `parse_probe` splits them. The
bandwidth comes from gputrain_node.healthcheck's health.json (its `allreduce_busbw` check), run under
torchrun with `NCCL_ENV` so the NCCL log shows which transport carried the traffic.

Log shapes: NCCL's own lines ("Using network X", "NET/Plugin: Loaded net plugin X",
"Initialized NET plugin X", "Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0"; NVIDIA/nccl
issues #226, #1519, #1584) and the gIB plugin's ("NET/gIB : Initializing gIB v1.0.5", channels
"via NET/gIB/2/GDRDMA"; Google's "Run NCCL on Compute Engine instances" page and an A4 Ray
tutorial). FasTrak's channel line shape is inferred from the same NCCL format.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from infra.fabric import FabricExpectation
from scripts.verify.fabric_setup import RXDM_CONTAINER, RXDM_READY

NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
_SECTIONS = ("links", "ibv", "rxdm")
PROBE_COMMAND = (
    'PATH="$PATH:/usr/sbin:/sbin"; '
    "echo @@fabric-links; ip -j -d link show 2>/dev/null || ip -o -d link show; "
    'echo @@fabric-ibv; ibv_devices 2>&1; echo "@@fabric-rc $?"; '
    f"echo @@fabric-rxdm; sudo -n docker logs --tail 200 {RXDM_CONTAINER} 2>&1 || true"
)
#: Interface names of virtual devices when `ip` prints no details (no -d, or old iproute2).
_VIRTUAL_PREFIXES = (
    "lo",
    "docker",
    "veth",
    "br-",
    "virbr",
    "cni",
    "flannel",
    "cali",
    "tun",
    "tap",
    "ifb",
)
_VIRTUAL_KINDS = r"veth|bridge|bond|dummy|ifb|vxlan|macvlan|ipvlan|vlan|tun|wireguard|geneve|gre\w*|ipip|sit|vrf|team"


@dataclass(frozen=True)
class Link:
    """One network interface as `ip` shows it."""

    name: str
    mtu: int
    physical: bool  # a device on a bus (PCI), not a bridge/veth/loopback
    state: str


@dataclass(frozen=True)
class Probe:
    """What PROBE_COMMAND found on one node."""

    links: tuple[Link, ...]
    rdma_devices: tuple[str, ...] | None  # None: ibv_devices is not installed
    rxdm_log: str


def _virtual_name(name: str) -> bool:
    return name == "lo" or name.startswith(_VIRTUAL_PREFIXES)


def parse_links(text: str) -> list[Link]:
    """`ip -j [-d] link|addr show` JSON or `ip -o [-d] link show` lines."""
    text = text.strip()
    if text.startswith("["):
        links = []
        for d in json.loads(text):
            kind = (d.get("linkinfo") or {}).get("info_kind")
            physical = bool(d.get("parentbus")) or (
                kind is None and d.get("link_type") == "ether" and not _virtual_name(d["ifname"])
            )
            links.append(Link(d["ifname"], int(d["mtu"]), physical, d.get("operstate", "")))
        return links
    links = []
    for line in text.splitlines():
        m = re.match(r"^\d+:\s+([^:@\s]+)(?:@\S+)?:\s+<[^>]*>.*?\smtu\s+(\d+)", line)
        if not m:
            continue
        name, details = m.group(1), line.split("\\", 1)[-1]
        state = re.search(r"\sstate\s+(\S+)", line)
        virtual = (
            re.search(rf"\\\s+({_VIRTUAL_KINDS})(?:\s|$)", line) or "link/ether" not in details
        )
        physical = "parentbus" in line or not (virtual or _virtual_name(name))
        links.append(Link(name, int(m.group(2)), physical, state.group(1) if state else ""))
    return links


def parse_ibv_devices(text: str) -> list[str]:
    """Device names from `ibv_devices` (a header, a dashed rule, then `name GUID` rows)."""
    names = []
    for line in text.splitlines():
        parts = line.split()
        if (
            len(parts) == 2
            and parts[0] not in ("device", "------")
            and re.fullmatch(r"[0-9a-f]{16}", parts[1])
        ):
            names.append(parts[0])
    return names


def parse_probe(text: str) -> Probe:
    """Split PROBE_COMMAND's output into its sections."""
    sections: dict[str, list[str]] = {s: [] for s in _SECTIONS}
    current, ibv_rc = None, "0"
    for line in text.splitlines():
        if line.startswith("@@fabric-rc "):
            ibv_rc = line.split()[1]
        elif line.startswith("@@fabric-") and line[9:] in sections:
            current = line[9:]
        elif current:
            sections[current].append(line)
    ibv = "\n".join(sections["ibv"])
    missing = ibv_rc == "127" or "not found" in ibv
    return Probe(
        tuple(parse_links("\n".join(sections["links"]))),
        None if missing else tuple(parse_ibv_devices(ibv)),
        "\n".join(sections["rxdm"]),
    )


def check_nics(
    links: list[Link] | tuple[Link, ...], expect: FabricExpectation, primary: str | None = None
) -> list[str]:
    """NIC count, MTU (the primary's only when the stack owns its VPC) and link state."""
    nics = [link for link in links if link.physical]
    names = ", ".join(n.name for n in nics) or "none"
    problems = []
    if len(nics) != expect.nics:
        problems.append(f"nics: found {len(nics)} NIC(s) ({names}), expected {expect.nics}")
    down = [n.name for n in nics if n.state == "DOWN"]
    if down:
        problems.append(f"nics: {', '.join(down)} down")
    if expect.mtu is not None:
        wrong = [n for n in nics if n.mtu != expect.mtu]
        if not expect.check_primary_mtu:  # the user's VPC keeps its MTU
            wrong = [n for n in wrong if n.name != primary] if primary else wrong[1:]
        if wrong:
            shown = ", ".join(f"{n.name} {n.mtu}" for n in wrong)
            problems.append(f"mtu: {shown}; expected {expect.mtu} (the fabric VPCs' MTU)")
    return problems


def check_probe(probe: Probe, expect: FabricExpectation, primary: str | None = None) -> list[str]:
    """Everything PROBE_COMMAND can tell about one node's fabric."""
    problems = check_nics(probe.links, expect, primary)
    if expect.rdma_devices:
        if probe.rdma_devices is None:
            problems.append(
                "rdma: ibv_devices not found (ibverbs-utils missing: run the fabric setup)"
            )
        elif len(probe.rdma_devices) != expect.rdma_devices:
            found = ", ".join(probe.rdma_devices) or "none"
            problems.append(
                f"rdma: ibv_devices lists {len(probe.rdma_devices)} device(s) ({found}), expected {expect.rdma_devices}"
            )
    if expect.rxdm and not rxdm_ready(probe.rxdm_log):
        last = next(
            (ln.strip() for ln in reversed(probe.rxdm_log.splitlines()) if ln.strip()), "no log"
        )
        problems.append(f"rxdm: {RXDM_CONTAINER} is not ready ({last[:160]})")
    return problems


def rxdm_ready(log: str) -> bool:
    """The daemon logs RXDM_READY once its buffers are registered (CEA: "...completed")."""
    return RXDM_READY in log


@dataclass(frozen=True)
class NcclLog:
    """What an NCCL_DEBUG=INFO log says about the network it used."""

    version: str | None
    plugins: tuple[str, ...]  # net plugins that loaded or initialised
    networks: tuple[str, ...]  # "Using network X"
    net_channels: int  # channel lines over a network transport (between nodes)
    socket_channels: tuple[str, ...]  # those over NET/Socket


_PLUGIN_RES = (
    re.compile(r"NET/Plugin\s*:\s*Loaded net plugin (\S+)"),
    re.compile(r"Initialized NET plugin (\S+)"),
    re.compile(r"NET/(\w+)\s*:\s*Initializing\b"),
)


def parse_nccl_log(text: str) -> NcclLog:
    plugins: list[str] = []
    networks: list[str] = []
    sockets: list[str] = []
    channels = 0
    version = None
    for line in text.splitlines():
        if "NCCL" not in line:
            continue
        if version is None and (v := re.search(r"NCCL version (\S+)", line)):
            version = v.group(1)
        for pattern in _PLUGIN_RES:
            if (m := pattern.search(line)) and m.group(1) not in plugins:
                plugins.append(m.group(1))
        if (m := re.search(r"Using network (\S+)", line)) and m.group(1) not in networks:
            networks.append(m.group(1))
        if m := re.search(r"(Channel \S+ : .*) via NET/(\w+)", line):
            channels += 1
            if m.group(2) == "Socket":
                sockets.append(f"{m.group(1)} via NET/Socket")
    return NcclLog(version, tuple(plugins), tuple(networks), channels, tuple(sockets))


def check_nccl_log(log: NcclLog, expect: FabricExpectation) -> list[str]:
    """The fabric's plugin loaded, NCCL used it, and no inter-node channel fell back to sockets."""
    want = expect.nccl_network
    if want is None:
        return []
    problems = []
    if not any(p.lower() == want.lower() for p in log.plugins):
        seen = ", ".join(log.plugins) or "none"
        problems.append(f"nccl-plugin: the {want} plugin never loaded (plugins seen: {seen})")
    if log.networks and not all(n.lower() == want.lower() for n in log.networks):
        problems.append(
            f"nccl-network: NCCL used network {', '.join(log.networks)}, expected {want}"
        )
    elif not log.networks:
        problems.append(
            f"nccl-network: no 'Using network' line (was NCCL_DEBUG=INFO set?); expected {want}"
        )
    if log.socket_channels:
        problems.append(
            f"nccl-socket: {len(log.socket_channels)} of {log.net_channels} inter-node channel(s) "
            f"use NET/Socket (e.g. {log.socket_channels[0]!r})"
        )
    return problems


@dataclass(frozen=True)
class Busbw:
    """The all-reduce result of gputrain_node.healthcheck's health.json."""

    busbw_gbs: float
    hosts: tuple[str, ...]
    on_gpu: bool
    correct: bool


def parse_health_busbw(health_json: str) -> Busbw | None:
    """The `allreduce_busbw` (or `allgather_busbw`) check of health.json; None when there is
    none (one rank)."""
    doc: dict[str, Any] = json.loads(health_json)
    checks = doc.get("checks") or []
    names = ("allreduce_busbw", "allgather_busbw")
    check = next((c for c in checks if c.get("check") in names), None)
    if check is None or check.get("value") is None:
        return None
    return Busbw(
        float(check["value"]),
        tuple(str(check.get("host", "")).split(",")),
        doc.get("device_type") == "cuda",
        "wrong sum" not in str(check.get("note", "")),  # healthcheck's note on a bad sum
    )


def check_busbw(result: Busbw | None, expect: FabricExpectation, machine_type: str) -> list[str]:
    """The bus bandwidth reaches the fabric's floor (on GPUs only) and the sum was right."""
    if result is None:
        return ["busbw: the all-reduce probe reported no result"]
    problems = []
    if not result.correct:
        problems.append("busbw: the all-reduce returned a wrong sum")
    floor = expect.busbw_floor_gbs
    if result.on_gpu and floor is not None and result.busbw_gbs < floor:
        problems.append(
            f"busbw: {result.busbw_gbs:.1f} GB/s {expect.collective.replace('_', '-')} bus bandwidth across "
            f"{len(result.hosts)} node(s), below the {floor:g} GB/s floor for {machine_type} "
            "(half the published 2-node figure)"
        )
    return problems


def check_allreduce(
    log_text: str, health_json: str | None, expect: FabricExpectation, machine_type: str
) -> list[str]:
    """The 2-node probe: bus bandwidth from health.json, and on GPUs the NCCL log checks (a
    CPU/gloo run, as in the test bed, writes no NCCL log and has no floor)."""
    result = parse_health_busbw(health_json) if health_json else None
    problems = check_busbw(result, expect, machine_type)
    if result is not None and result.on_gpu:
        problems += check_nccl_log(parse_nccl_log(log_text), expect)
    return problems
