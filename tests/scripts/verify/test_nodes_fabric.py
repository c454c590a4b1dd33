"""The GPU network's wiring outside the test bed: run.sh sources the NCCL env file the fabric
setup wrote (the file's settings replace the one-interface guess; the user's --env still wins),
which stacks get a fabric check, and `verify --fabric` on the command line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from infra.spec import parse_spec
from scripts.cli import _options, _parser
from scripts.job.node_scripts import build_node_command
from scripts.job.records import Job
from scripts.node_layout import NCCL_ENV_FILE
from scripts.verify.nodes import FabricCheck
from tests.support.fake_python import FAKE_PY
from tests.support.pulumi_mocks import deployable_config


def _run_sh(tmp_path: Path, job: Job, node_root: Path) -> dict[str, str]:
    tmp_path.mkdir(parents=True)
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    run = tmp_path / "run"
    (run / "code").mkdir(parents=True)
    (run / "run.sh").write_text(
        build_node_command(
            job, nnodes=2, nproc_per_node=1, head_address="127.0.0.1", python=str(fake)
        )
    )
    env = {
        "PATH": os.environ["PATH"],
        "OUT_ARGS": str(tmp_path / "args"),
        "OUT_ENV": str(tmp_path / "env"),
        "GPUTRAIN_NODE_ROOT": str(node_root),
    }
    r = subprocess.run(["sh", "run.sh"], cwd=run, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return dict(
        line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line
    )


def test_run_sh_sources_the_nccl_env_file_after_its_interface_block(tmp_path: Path) -> None:
    job = Job(run_id="r-1", env={"NCCL_DEBUG": "WARN"}, rdzv_port=29400)
    root = tmp_path / "node"
    without = _run_sh(tmp_path / "a", job, root)
    assert without["NCCL_SOCKET_IFNAME"] == "lo"  # the interface holding the head's address
    (root / NCCL_ENV_FILE).parent.mkdir(parents=True)
    (root / NCCL_ENV_FILE).write_text(
        "export NCCL_NET=gIB\nexport NCCL_SOCKET_IFNAME=enp0s19\nexport NCCL_DEBUG=INFO\n"
    )
    got = _run_sh(tmp_path / "b", job, root)
    assert got["NCCL_NET"] == "gIB" and got["NCCL_SOCKET_IFNAME"] == "enp0s19"
    assert got["NCCL_DEBUG"] == "WARN"  # the job's own --env comes last


def test_only_multi_node_gpu_direct_stacks_get_a_fabric_check() -> None:
    a4 = FabricCheck.of(parse_spec(deployable_config("a4"), "a4").fabric)
    assert a4 is not None and a4.kind == "rdma" and a4.machine_type == "a4-highgpu-8g"
    assert (a4.expect.nics, a4.expect.mtu, a4.expect.rdma_devices) == (10, 8896, 8)
    assert a4.expect.busbw_floor_gbs == 341.5
    mega = FabricCheck.of(parse_spec(deployable_config("a3mega"), "a3mega").fabric)
    assert mega is not None and mega.expect.rxdm and mega.expect.nics == 9
    for stack, overrides in (("h100", {}), ("a3mega", {"gpuDirect": "off"}), ("dev", {})):
        spec = parse_spec(deployable_config(stack, **overrides), stack)
        assert FabricCheck.of(spec.fabric) is None


def test_verify_takes_fabric() -> None:
    assert _options(_parser().parse_args(["verify", "--stack", "a4", "--fabric"])).fabric
    assert not _options(_parser().parse_args(["verify", "--stack", "a4"])).fabric
