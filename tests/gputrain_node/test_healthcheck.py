"""The GPU health check: a real 2-rank gloo run on CPU, and the floor judgements on GPU figures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gputrain_node import contract
from gputrain_node.healthcheck import (
    BUSBW_INTER_NODE,
    FAIL,
    PASS,
    WARN,
    Measured,
    floor_for,
    judge,
    judge_allreduce,
    judge_ranks,
    main,
)
from tests.support.trainer_helpers import run, torchrun_argv

pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler")
H100 = "NVIDIA H100 80GB HBM3"


def test_two_cpu_ranks_write_health_json_without_floors(tmp_path: Path) -> None:
    """Run as in a Vertex job's package or beside a user project with its own `trainer/`:
    gputrain's node package next to the user's `trainer`, first on the path, and no gputrain
    trainer anywhere."""
    package = tmp_path / "package"
    shutil.copytree(contract.PACKAGE_DIR, package / contract.PACKAGE)
    (package / "trainer").mkdir()
    (package / "trainer" / "__init__.py").write_text("raise SystemExit('the user package')\n")
    argv = torchrun_argv(contract.HEALTHCHECK, [])
    done = run(argv, out=tmp_path, env={"PYTHONPATH": str(package)}, cwd=package)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "health.json").read_text())
    assert report["overall"] == PASS and report["world_size"] == 2
    checks = report["checks"]
    assert sorted((c["check"], c["rank"]) for c in checks if c["rank"] is not None) == [
        ("matmul", 0),
        ("matmul", 1),
        ("mem_bw", 0),
        ("mem_bw", 1),
    ]
    by_name = {c["check"]: c for c in checks if c["rank"] is None}
    assert by_name["param_checksum"]["status"] == PASS
    assert by_name["allreduce_busbw"]["value"] > 0 and "2 MiB" in by_name["allreduce_busbw"]["note"]
    assert all(c["warn_below"] is None and c["fail_below"] is None for c in checks)
    assert all(c["value"] > 0 for c in checks if c["check"] in ("matmul", "mem_bw"))
    assert "health: PASS (6 checks, world 2)" in done.stdout


def test_single_process_runs_without_a_process_group(tmp_path: Path) -> None:
    main(["--out", str(tmp_path)])
    report = json.loads((tmp_path / "health.json").read_text())
    assert [c["check"] for c in report["checks"]] == ["matmul", "mem_bw", "param_checksum"]


def test_bad_max_bytes_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path), "--max-bytes", "10"])
    assert exc.value.code == 2 and "--max-bytes 10: must be at least" in capsys.readouterr().err


def test_judge_uses_warn_and_fail_floors() -> None:
    assert judge(700, (600, 400)) == PASS
    assert judge(500, (600, 400)) == WARN
    assert judge(300, (600, 400)) == FAIL
    assert judge(0.001, None) == PASS


def test_floors_match_the_most_specific_gpu_name() -> None:
    h100_sxm, h100_pcie = floor_for(H100), floor_for("NVIDIA H100 PCIe")
    assert h100_sxm is not None and h100_pcie is not None
    assert h100_pcie.matmul[0] < h100_sxm.matmul[0]
    assert floor_for("NVIDIA A100-SXM4-40GB") is not None and floor_for("NVIDIA L4") is not None
    assert floor_for("NVIDIA GeForce RTX 4090") is None


def test_a_healthy_h200_passes_and_a_slow_one_warns_then_fails() -> None:
    """The floors against what this check measured on a lent H200 (2026-11-27)."""
    healthy = (758.8, 4175.8)  # TFLOP/s, GB/s
    for share, status in ((1.0, PASS), (0.8, WARN), (0.65, FAIL)):
        rank = Measured("a", "NVIDIA H200", healthy[0] * share, healthy[1] * share)
        matmul, mem_bw = judge_ranks([rank], on_gpu=True)
        assert (matmul.status, mem_bw.status) == (status, status), share


def test_gpu_ranks_are_judged_by_floor_and_by_their_node_median() -> None:
    node = [Measured("a", H100, 700, 3000) for _ in range(3)] + [Measured("a", H100, 500, 1000)]
    other = [Measured("b", H100, 450, 3000) for _ in range(4)]  # slow but uniform: WARN, not FAIL
    checks = judge_ranks(node + other, on_gpu=True)
    status = {(c.check, c.rank): c.status for c in checks}
    assert status[("matmul", 0)] == PASS and status[("mem_bw", 0)] == PASS
    assert status[("matmul", 3)] == FAIL  # 500 < 0.8 x 700
    assert "median" in next(c.note for c in checks if (c.check, c.rank) == ("matmul", 3))
    assert status[("mem_bw", 3)] == FAIL  # 1000 GB/s is below H100's fail floor
    assert {status[("matmul", r)] for r in range(4, 8)} == {WARN}


def test_unknown_gpu_and_cpu_get_no_floor() -> None:
    (matmul, mem) = judge_ranks([Measured("a", "Mystery GPU", 1, 1)], on_gpu=True)
    assert matmul.status == PASS and matmul.note == "no floor for this GPU"
    assert mem.status == PASS and mem.warn_below is None
    (matmul, _) = judge_ranks([Measured("a", "cpu (a)", 0.1, 5)], on_gpu=False)
    assert matmul.warn_below is None and matmul.note == "cpu: floors not applied"


def test_allreduce_uses_the_inter_node_floor_across_hosts_and_fails_a_wrong_sum() -> None:
    sweep = [(2**20, 50.0), (2**30, 320.0)]
    intra = judge_allreduce(sweep, True, H100, ["a", "a"], on_gpu=True)
    assert intra.status == PASS and intra.value == 320.0 and intra.warn_below == 300
    inter = judge_allreduce([(2**30, 3.0)], True, H100, ["a", "b"], on_gpu=True)
    assert (inter.warn_below, inter.fail_below) == BUSBW_INTER_NODE and inter.status == WARN
    wrong = judge_allreduce(sweep, False, H100, ["a", "a"], on_gpu=True)
    assert wrong.status == FAIL and "wrong sum" in wrong.note
    assert judge_allreduce(sweep, True, "cpu", ["a", "a"], on_gpu=False).warn_below is None


def test_the_all_gather_probe_measures_the_collective_published_figures_measured(
    tmp_path: Path,
) -> None:
    """A3 Mega/Ultra's published 2-node figures are all_gather bus bandwidth: `verify --fabric`
    asks for that collective (gloo here, NCCL on GPUs). The sweep stops at --max-bytes (the
    default's 2 MiB is the test above's)."""
    args = ["--collective", "all_gather", "--max-bytes", str(256 * 2**10)]
    done = run(torchrun_argv("gputrain_node.healthcheck", args), out=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checks = json.loads((tmp_path / "health.json").read_text())["checks"]
    [gather] = [c for c in checks if c["check"] == "allgather_busbw"]
    assert gather["value"] > 0
    sweep = gather["note"].split("; ", 1)[1]  # every size measured: 32 KiB, then x8 up to the max
    assert [size.split(":")[0] for size in sweep.split(", ")] == ["0.03125 MiB", "0.25 MiB"]
    assert not [c for c in checks if c["check"] == "allreduce_busbw"]
