"""`verify --fabric` on the sshd test bed: fake `ip` / `ibv_devices` / `sudo` outputs on real SSH
hosts, the production probe and checks, and the 2-node all-reduce probe under torchrun with gloo
(the bandwidth floor applies on GPUs only)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.fabric import plan_fabric
from scripts.node_layout import NCCL_ENV_FILE
from scripts.targets.session import close_all, connect
from scripts.verify.fabric_setup import MARK
from scripts.verify.nodes import FabricCheck, VerificationError, verify_fabric
from tests.support.fabric_samples import A4_GVNICS, A4_RDMA_NICS, MEGA_GPU_NICS, MEGA_PRIMARY
from tests.support.stack_world import World, assert_torn_down
from tests.support.testbed import FabricFakes, TestBed, TestHost

pytestmark = pytest.mark.testbed

_A4 = FabricCheck.of(plan_fabric("a4-highgpu-8g", 2, zone="us-central1-b"))
assert _A4 is not None
A4: FabricCheck = _A4
MLX = tuple(f"mlx5_{i}" for i in range(8))
# What the gIB setup reports on a node whose primary NIC is the test host's eth0 (so the NCCL
# env's GLOO_SOCKET_IFNAME is an interface gloo can use); the shape parse_setup_report reads.
SETUP_REPORT = "\n".join(
    [
        f"{MARK} nics primary=eth0 gvnic={A4_GVNICS[1]} rdma={','.join(A4_RDMA_NICS)}",
        f"{MARK} version nccl-gib=1.1.0",
        f"{MARK} env-begin",
        "NCCL_NET=gIB",
        "NCCL_IB_TC=52",
        f"{MARK} env-end",
        f"{MARK} ok",
    ]
)


def a4_fakes(**changes: object) -> FabricFakes:
    nics = tuple((n, 8896) for n in (*A4_GVNICS, *A4_RDMA_NICS))
    base: dict[str, object] = {"nics": nics, "rdma_devices": MLX, "setup_report": SETUP_REPORT}
    return FabricFakes(**{**base, **changes})  # type: ignore[arg-type]


def _verify(tb: TestBed, hosts: list[TestHost], probe_dir: Path, check: FabricCheck = A4) -> str:
    """verify_fabric over real SSH to these hosts; the VerificationError's text, "" if none."""
    fleet = tb.fleet(hosts)
    ts = connect(fleet, deadline_s=10)
    try:
        verify_fabric(fleet, ts, check, probe_dir, probe_dir.name)
    except VerificationError as e:
        return str(e)
    finally:
        close_all(ts)
    return ""


def test_a_failing_node_is_named_with_its_checks_and_nothing_runs(
    tb: TestBed, tmp_path: Path
) -> None:
    good = tb.add_host(fabric=a4_fakes())
    nics = tuple((n, 1460 if n == "gpu3rdma0" else 8896) for n in (*A4_GVNICS, *A4_RDMA_NICS))
    bad = tb.add_host(fabric=a4_fakes(nics=nics, rdma_devices=MLX[:7], down=("gpu5rdma0",)))
    msg = _verify(tb, [good, bad], tmp_path / "probe")
    assert "GPU network verification failed on 1 of 2 node(s)" in msg
    assert f"{good.name}:" not in msg
    assert f"{bad.name}: nics: gpu5rdma0 down" in msg
    assert "mtu: gpu3rdma0 1460; expected 8896" in msg
    assert "rdma: ibv_devices lists 7 device(s)" in msg
    assert not (tmp_path / "probe").exists()  # the all-reduce never started


def test_missing_ibv_devices_is_a_finding_not_a_crash(tb: TestBed, tmp_path: Path) -> None:
    hosts = [tb.add_host(fabric=a4_fakes(rdma_devices=())) for _ in range(2)]
    msg = _verify(tb, hosts, tmp_path / "probe")
    assert "rdma: ibv_devices not found (ibverbs-utils missing" in msg


def test_tcpxo_nodes_need_nine_nics_at_8244_and_a_ready_daemon(tb: TestBed, tmp_path: Path) -> None:
    mega = FabricCheck.of(plan_fabric("a3-megagpu-8g", 2, zone="us-central1-a"))
    assert mega is not None
    nics = tuple((n, 8244) for n in (MEGA_PRIMARY, *MEGA_GPU_NICS))
    ready = "I1123 tcpgpudmarxd ... Buffer manager initialization complete\n"
    up = tb.add_host(fabric=FabricFakes(nics=nics, rxdm_log=ready))
    starting = tb.add_host(fabric=FabricFakes(nics=nics, rxdm_log="I1123 Creating buffers\n"))
    msg = _verify(tb, [up, starting], tmp_path / "probe", mega)
    assert f"{up.name}:" not in msg
    assert f"{starting.name}: rxdm: receive-datapath-manager is not ready (I1123 Creating" in msg


def test_run_on_an_a4_reservation_stack_proves_its_network_before_training(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    """`gputrain run --stack` end to end: the reservation in the preflight, `up`, the GPUs, the
    fabric setup on both VMs (FleetSession.verify(fabric=True), as up/run/train call it: its
    script on stdin, the NCCL env file written in the node root), verify --fabric with the gloo
    all-reduce between the two hosts (each costs every node a torchrun and a rank with torch:
    this is the bed's one), the job on both with the NCCL env file sourced, teardown."""
    w = world(
        settings={
            "machineType": "a4-highgpu-8g",
            "spot": None,
            "capacity": "reservation",
            "reservation": "e2e-res",
        },
        fabric=a4_fakes(),
    )
    w.compute.add_reservation("us-central1-b", "e2e-res", "a4-highgpu-8g", 2)
    # the test job (tests/support/stack_world.py): the trainer's own run is test_lifecycle's
    rc = w.run("run", "--stack", "e2e", "--yes", "--", "job.py", "done", str(w.marker))
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "e2e-res: 2 of 2 × a4-highgpu-8g free, need 2" in out
    assert "GPU network verification (rdma: 10 NICs, MTU 8896, 8 RDMA devices)" in out
    for host in w.node_hosts.values():
        assert "nccl-gib" in (host.dir / "gpu" / "setup_script").read_text()  # on stdin
        env = (host.dir / "home" / NCCL_ENV_FILE).read_text()  # the node root (home or override)
        assert "export NCCL_NET=gIB" in env and "export NCCL_IB_TC=52" in env
        assert "export GLOO_SOCKET_IFNAME=eth0" in env
    # one health.json per node, the same checks
    healths = sorted((w.dir / "runs").glob("*/verify-fabric-*/**/health.json"))
    assert healths
    doc = json.loads(healths[0].read_text())
    [busbw] = [c for c in doc["checks"] if c["check"] == "allreduce_busbw"]
    assert busbw["value"] > 0 and set(busbw["host"].split(",")) == set(w.node_hosts)
    assert doc["device_type"] == "cpu"  # gloo: the 341.5 GB/s floor is not applied
    assert sorted(p.name for p in w.marker.glob("pid-*")) == ["pid-0", "pid-1"]  # one job, 2 ranks
    assert_torn_down(w)
