"""`verify --fabric` parsers and checks on recorded / realistic node output.

`ip` shapes: iproute2 6.1 `ip -j -d link show` as captured on this machine (lo, ifb, a virtio
NIC with parentbus, a bridge), extended to the NICs an A4 and an A3 Mega show (gVNIC names from
Cluster Toolkit's nccl-tests scripts, gpuNrdma0 from GKE's DRANET). `ibv_devices` is rdma-core's
format. NCCL lines follow NCCL's own INFO messages (NVIDIA/nccl #226, #352, #1519, #1584) and the
gIB plugin's (Google's "Run NCCL on Compute Engine instances"; an A4 Ray-on-GKE tutorial).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, replace

import pytest

from infra.fabric import plan_fabric
from scripts.verify.fabric_check import (
    PROBE_COMMAND,
    Link,
    check_allreduce,
    check_busbw,
    check_nccl_log,
    check_nics,
    check_probe,
    parse_health_busbw,
    parse_ibv_devices,
    parse_links,
    parse_nccl_log,
    parse_probe,
)
from tests.support.fabric_samples import (
    A4_GVNICS,
    A4_RDMA_NICS,
    MEGA_GPU_NICS,
    MEGA_PRIMARY,
    a4_pci,
)

RDMA = plan_fabric("a4-highgpu-8g", 2, zone="us-central1-b").expectation()
MEGA = plan_fabric("a3-megagpu-8g", 2, zone="us-central1-b").expectation()


def link(
    ifindex: int,
    name: str,
    mtu: int,
    pci: str | None = None,
    kind: str | None = None,
    state: str = "UP",
) -> dict[str, object]:
    """One `ip -j -d link show` entry (iproute2 6.1 field names)."""
    d: dict[str, object] = {
        "ifindex": ifindex,
        "ifname": name,
        "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
        "mtu": mtu,
        "qdisc": "mq",
        "operstate": state,
        "linkmode": "DEFAULT",
        "group": "default",
        "txqlen": 1000,
        "link_type": "ether",
        "address": f"42:01:0a:2a:00:{ifindex:02x}",
        "broadcast": "ff:ff:ff:ff:ff:ff",
        "promiscuity": 0,
        "min_mtu": 68,
        "max_mtu": 9216,
    }
    if kind:
        d["linkinfo"] = {"info_kind": kind}
    if pci:
        d |= {"parentbus": "pci", "parentdev": pci}
    return d


LO = {
    "ifindex": 1,
    "ifname": "lo",
    "flags": ["LOOPBACK", "UP", "LOWER_UP"],
    "mtu": 65536,
    "operstate": "UNKNOWN",
    "link_type": "loopback",
}


def a4_links(mtu: int = 8896, rdma: int = 8) -> str:
    entries = [
        LO,
        link(2, A4_GVNICS[0], mtu, "0000:00:13.0"),
        link(3, A4_GVNICS[1], mtu, "0000:c0:14.0"),
    ]
    entries += [link(4 + i, A4_RDMA_NICS[i], mtu, a4_pci(i)) for i in range(rdma)]
    entries.append(link(20, "docker0", 1500, kind="bridge", state="DOWN"))
    return json.dumps(entries)


MEGA_NAMES = [MEGA_PRIMARY, *MEGA_GPU_NICS]


def mega_links(gpu_mtu: int = 8244, down: str = "") -> str:
    entries = [LO] + [
        link(
            2 + i,
            n,
            8244 if i == 0 else gpu_mtu,
            f"0000:{i:02x}:00.0",
            state="DOWN" if n == down else "UP",
        )
        for i, n in enumerate(MEGA_NAMES)
    ]
    return json.dumps(entries)


IBV = "    device          \t   node GUID\n    ------          \t----------------\n" + "".join(
    f"    mlx5_{i}          \t0c42a10300b3c4{i:02x}\n" for i in range(8)
)


def test_links_from_ip_json_count_only_physical_nics() -> None:
    links = parse_links(a4_links())
    assert tuple(x.name for x in links if x.physical) == A4_GVNICS + A4_RDMA_NICS
    assert check_nics(links, RDMA) == []
    assert check_nics(parse_links(mega_links()), MEGA) == []


def test_text_and_json_forms_agree_on_this_machine() -> None:
    """The `ip -o -d link` parser reads the real iproute2 here the same way as the JSON one."""
    as_json = parse_links(
        subprocess.run(
            ["ip", "-j", "-d", "link", "show"], capture_output=True, text=True, check=True
        ).stdout
    )
    as_text = parse_links(
        subprocess.run(
            ["ip", "-o", "-d", "link", "show"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert as_json and as_text == as_json
    assert not next(x for x in as_json if x.name == "lo").physical


def test_recorded_text_form() -> None:
    text = (
        "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00 promiscuity 0  allmulti 0 minmtu 0 maxmtu 0 addrgenmode eui64 numtxqueues 1 numrxqueues 1 gso_max_size 65536 gso_max_segs 65535 \n"
        "2: ifb0: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN mode DEFAULT group default qlen 32\\    link/ether 3e:56:b2:3a:6f:60 brd ff:ff:ff:ff:ff:ff promiscuity 0  allmulti 0 minmtu 0 maxmtu 0 \\    ifb addrgenmode eui64 numtxqueues 1 numrxqueues 1 \n"
        "4: enp0s12: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 8244 qdisc mq state UP mode DEFAULT group default qlen 1000\\    link/ether 42:01:0a:2a:00:02 brd ff:ff:ff:ff:ff:ff promiscuity 0  allmulti 0 minmtu 68 maxmtu 9216 addrgenmode none numtxqueues 16 numrxqueues 16 parentbus pci parentdev 0000:00:0c.0 \n"
        "7: gtv10@if6: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue master gtb0 state UP mode DEFAULT group default qlen 1000\\    link/ether 9a:1b:6c:00:11:22 brd ff:ff:ff:ff:ff:ff link-netns gt0 promiscuity 1  allmulti 1 minmtu 68 maxmtu 65535 \\    veth \n"
    )
    assert parse_links(text) == [
        Link("lo", 65536, False, "UNKNOWN"),
        Link("ifb0", 1500, False, "DOWN"),
        Link("enp0s12", 8244, True, "UP"),
        Link("gtv10", 1500, False, "UP"),
    ]


def test_wrong_nic_count_names_the_check() -> None:
    assert check_nics(parse_links(a4_links(rdma=0)), RDMA) == [
        "nics: found 2 NIC(s) (enp0s19, enp192s20), expected 10"
    ]


def test_wrong_mtu_names_each_nic() -> None:
    problems = check_nics(parse_links(mega_links(gpu_mtu=1460)), MEGA)
    assert len(problems) == 1 and problems[0].startswith("mtu: enp6s0 1460, enp7s0 1460,")
    assert problems[0].endswith("enp142s0 1460; expected 8244 (the fabric VPCs' MTU)")


def test_primary_mtu_not_checked_on_the_users_vpc() -> None:
    users_vpc = replace(MEGA, check_primary_mtu=False)
    links = [Link("enp0s12", 1460, True, "UP")] + [
        Link(n, 8244, True, "UP") for n in MEGA_NAMES[1:]
    ]
    assert check_nics(links, users_vpc, primary="enp0s12") == []
    assert check_nics(links, users_vpc) == []  # no primary known: one NIC may differ
    assert check_nics(links, MEGA)[0] == "mtu: enp0s12 1460; expected 8244 (the fabric VPCs' MTU)"


def test_down_nic() -> None:
    assert check_nics(parse_links(mega_links(down="enp13s0")), MEGA) == ["nics: enp13s0 down"]


def test_ibv_devices() -> None:
    assert parse_ibv_devices(IBV) == [f"mlx5_{i}" for i in range(8)]
    assert parse_ibv_devices("No IB devices found\n") == []


def probe_text(links: str, ibv: str = IBV, rc: int = 0, rxdm: str = "") -> str:
    return f"@@fabric-links\n{links}\n@@fabric-ibv\n{ibv}@@fabric-rc {rc}\n@@fabric-rxdm\n{rxdm}\n"


def test_probe_on_an_a4_node() -> None:
    assert check_probe(parse_probe(probe_text(a4_links())), RDMA) == []
    few = parse_probe(probe_text(a4_links(), ibv=IBV.split("    mlx5_2")[0]))
    assert check_probe(few, RDMA) == [
        "rdma: ibv_devices lists 2 device(s) (mlx5_0, mlx5_1), expected 8"
    ]
    missing = parse_probe(probe_text(a4_links(), ibv="sh: 1: ibv_devices: not found\n", rc=127))
    assert missing.rdma_devices is None
    assert check_probe(missing, RDMA) == [
        "rdma: ibv_devices not found (ibverbs-utils missing: run the fabric setup)"
    ]


def test_probe_on_an_a3_mega_node_needs_the_datapath_manager_ready() -> None:
    ready = "I0709 12:00:01.000 rxdm.cc:88] Starting\nI0709 12:00:31.000 rxdm.cc:301] Buffer manager initialization complete\n"
    assert check_probe(parse_probe(probe_text(mega_links(), ibv="", rxdm=ready)), MEGA) == []
    waiting = "I0709 12:00:01.000 rxdm.cc:88] Starting\nI0709 12:00:02.000 rxdm.cc:120] Setting up NIC enp6s0\n"
    assert check_probe(parse_probe(probe_text(mega_links(), ibv="", rxdm=waiting)), MEGA) == [
        "rxdm: receive-datapath-manager is not ready (I0709 12:00:02.000 rxdm.cc:120] Setting up NIC enp6s0)"
    ]


def test_probe_command_runs_here() -> None:
    """The real command on this machine: its `ip` output parses, the absent tools are reported."""
    out = subprocess.run(
        ["sh", "-c", PROBE_COMMAND], capture_output=True, text=True, timeout=30
    ).stdout
    probe = parse_probe(out)
    assert any(x.name == "lo" and not x.physical for x in probe.links)
    if subprocess.run(["sh", "-c", "command -v ibv_devices"], capture_output=True).returncode:
        assert probe.rdma_devices is None


GIB_OK = """\
[rank2]:a4-vm-0:3590:3590 [2] NCCL INFO Bootstrap: Using enp0s19:10.42.0.2<0>
[rank2]:a4-vm-0:3590:3590 [2] NCCL INFO NCCL version 2.27.5+cuda12.9
[rank2]:a4-vm-0:3590:3753 [2] NCCL INFO NET/gIB : Initializing gIB v1.0.6
[rank2]:a4-vm-0:3590:3753 [2] NCCL INFO Initialized NET plugin gIB
[rank2]:a4-vm-0:3590:3753 [2] NCCL INFO Using network gIB
[rank2]:a4-vm-0:3590:3758 [2] NCCL INFO NET/gIB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'
[rank2]:a4-vm-0:3590:3799 [2] NCCL INFO Channel 00/0 : 2[2] -> 3[3] via P2P/CUMEM/read
[rank2]:a4-vm-0:3590:3799 [2] NCCL INFO Channel 02/0 : 10[2] -> 2[2] [receive] via NET/gIB/2/GDRDMA
[rank2]:a4-vm-0:3590:3799 [2] NCCL INFO Channel 02/0 : 2[2] -> 10[2] [send] via NET/gIB/2/GDRDMA
"""
SOCKET_FALLBACK = """\
a4-vm-0:3590:3590 [0] NCCL INFO NET/gIB : Initializing gIB v1.0.6
a4-vm-0:3590:3590 [0] NCCL INFO NET/gIB : No device found.
a4-vm-0:3590:3590 [0] NCCL INFO NET/IB : No device found.
a4-vm-0:3590:3590 [0] NCCL INFO NET/Socket : Using [0]enp0s19:10.42.0.2<0>
a4-vm-0:3590:3590 [0] NCCL INFO Using network Socket
a4-vm-0:3590:3712 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Socket/0
a4-vm-0:3590:3712 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0
"""
NO_PLUGIN = """\
a4-vm-0:3590:3590 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
a4-vm-0:3590:3590 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB enp0s19:10.42.0.2<0>
a4-vm-0:3590:3590 [0] NCCL INFO Using network IB
a4-vm-0:3590:3712 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
"""
FASTRAK_OK = """\
mega-0:870:870 [0] NCCL INFO NET/Plugin: Loaded net plugin FasTrak (v8)
mega-0:870:870 [0] NCCL INFO Using network FasTrak
mega-0:870:938 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/FasTrak/0/GDRDMA
"""


def test_gib_log_passes() -> None:
    log = parse_nccl_log(GIB_OK)
    assert log.version == "2.27.5+cuda12.9"
    assert log.plugins == ("gIB",) and log.networks == ("gIB",)
    assert log.net_channels == 2 and log.socket_channels == ()
    assert check_nccl_log(log, RDMA) == []


def test_socket_fallback_fails_network_and_socket_checks() -> None:
    problems = check_nccl_log(parse_nccl_log(SOCKET_FALLBACK), RDMA)
    assert problems == [
        "nccl-network: NCCL used network Socket, expected gIB",
        "nccl-socket: 2 of 2 inter-node channel(s) use NET/Socket "
        "(e.g. 'Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Socket')",
    ]


def test_missing_plugin_fails_the_plugin_check() -> None:
    problems = check_nccl_log(parse_nccl_log(NO_PLUGIN), RDMA)
    assert problems[0] == "nccl-plugin: the gIB plugin never loaded (plugins seen: none)"
    assert problems[1] == "nccl-network: NCCL used network IB, expected gIB"


def test_fastrak_log_and_no_log() -> None:
    assert check_nccl_log(parse_nccl_log(FASTRAK_OK), MEGA) == []
    empty = check_nccl_log(parse_nccl_log("training started\n"), MEGA)
    assert empty[1].startswith("nccl-network: no 'Using network' line (was NCCL_DEBUG=INFO set?)")
    none = plan_fabric("g2-standard-4", 2, zone="us-central1-b").expectation()
    assert (
        check_nccl_log(parse_nccl_log(SOCKET_FALLBACK), none) == []
    )  # no fabric: nothing to prove


def health_json(busbw: float, on_gpu: bool = True, correct: bool = True) -> str:
    """health.json as gputrain_node.healthcheck writes it (its own judge_allreduce builds the check)."""
    from gputrain_node.healthcheck import judge_allreduce

    sweep = [(2**20, busbw / 10), (2**30, busbw)]
    device = "NVIDIA B200" if on_gpu else "cpu (vm)"
    check = judge_allreduce(sweep, correct, device, ["a4-node-0"] * 8 + ["a4-node-1"] * 8, on_gpu)
    doc = {
        "overall": check.status,
        "world_size": 16,
        "device_type": "cuda" if on_gpu else "cpu",
        "checks": [asdict(check)],
    }
    return json.dumps(doc, indent=2)


def test_busbw_floor_on_gpu() -> None:
    good = parse_health_busbw(health_json(410.0))
    assert good is not None and good.hosts == ("a4-node-0", "a4-node-1") and good.on_gpu
    assert check_busbw(good, RDMA, "a4-highgpu-8g") == []
    low = parse_health_busbw(health_json(21.3))  # one gVNIC's worth: the fabric is not in use
    assert check_busbw(low, RDMA, "a4-highgpu-8g") == [
        "busbw: 21.3 GB/s all-reduce bus bandwidth across 2 node(s), below the 341.5 GB/s floor "
        "for a4-highgpu-8g (half the published 2-node figure)"
    ]


def test_busbw_floor_not_applied_off_gpu_but_a_wrong_sum_fails() -> None:
    cpu = parse_health_busbw(health_json(0.02, on_gpu=False))
    assert check_busbw(cpu, MEGA, "a3-megagpu-8g") == []
    wrong = parse_health_busbw(health_json(200.0, correct=False))
    assert check_busbw(wrong, MEGA, "a3-megagpu-8g") == [
        "busbw: the all-reduce returned a wrong sum"
    ]
    assert check_busbw(None, MEGA, "a3-megagpu-8g") == [
        "busbw: the all-reduce probe reported no result"
    ]
    assert parse_health_busbw(json.dumps({"overall": "PASS", "checks": []})) is None


def test_the_whole_probe_result() -> None:
    assert check_allreduce(GIB_OK, health_json(410.0), RDMA, "a4-highgpu-8g") == []
    slow = check_allreduce(SOCKET_FALLBACK, health_json(21.3), RDMA, "a4-highgpu-8g")
    assert [p.split(":")[0] for p in slow] == ["busbw", "nccl-network", "nccl-socket"]
    # gloo on CPU (the test bed): no NCCL log, no floor; only a result is needed.
    assert check_allreduce("", health_json(0.02, on_gpu=False), MEGA, "a3-megagpu-8g") == []
    assert check_allreduce("", None, MEGA, "a3-megagpu-8g") == [
        "busbw: the all-reduce probe reported no result"
    ]


@pytest.mark.parametrize("problems", [check_nics(parse_links(a4_links(rdma=3, mtu=1460)), RDMA)])
def test_every_problem_is_one_line_naming_its_check(problems: list[str]) -> None:
    assert problems and all("\n" not in p and p.split(":")[0] in {"nics", "mtu"} for p in problems)
