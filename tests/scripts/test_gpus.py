"""`gputrain gpus [MODEL|MEMORY+] [--spot] [--region R]`: what the catalog offers, fast, offline."""

from __future__ import annotations

import subprocess
import sys

import pytest

from infra.offer_tables import gpu_offerings
from infra.offers import price_table
from scripts.cli import main
from tests.support.pulumi_mocks import ROOT


def _rows(out: str) -> dict[str, list[str]]:
    """GPU model -> its cells (split on runs of 2+ spaces, as the plain table aligns them)."""
    import re

    rows = {}
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == 6 and cells[0] != "GPU":
            rows[cells[0]] = cells
    return rows


def test_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "H100"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert set(rows) == {"H100"}  # never the A3 Mega: that is H100-MEGA
    [h100] = gpu_offerings("H100")
    assert rows["H100"] == [
        "H100",
        "80 GB",
        "8",  # on demand only the 8-GPU VM is sold
        "a3-highgpu-8g",
        h100.zone,
        f"${h100.hourly_per_gpu:,.2f}",
    ]
    assert price_table().source in out and price_table().as_of in out


def test_a_memory_request_lists_every_gpu_with_that_much(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["gpus", "80GB+"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert list(rows) == ["A100-80GB", "H100", "H100-MEGA", "H200", "B200"]
    assert rows["H200"][4:] == ["-", "Spot only"] and rows["B200"][5] == "Spot only"


def test_spot_prices_and_spot_only_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "H100", "--spot", "--region", "us-central1"]) == 0
    out = capsys.readouterr().out
    cells = _rows(out)["H100"]
    [h100] = gpu_offerings("H100", spot=True, region="us-central1")
    assert cells[2] == "1, 2, 4, 8"  # A3 High 1g/2g/4g are sold as Spot
    assert cells[4].startswith("us-central1-") and cells[5] == f"${h100.hourly_per_gpu:,.2f}"
    [on_demand] = gpu_offerings("H100", region="us-central1")
    assert h100.hourly_per_gpu is not None and on_demand.hourly_per_gpu is not None
    assert h100.hourly_per_gpu < on_demand.hourly_per_gpu
    assert "Spot" in out


def test_a_spot_only_gpu_without_a_price_still_says_where_it_is_sold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """B200 is sold as Spot only (never on demand): its Spot row names the zones that sell it,
    as the on-demand row's "Spot only" promises, though the price table has no price for it."""
    assert main(["gpus", "B200"]) == 0
    assert _rows(capsys.readouterr().out)["B200"][4:] == ["-", "Spot only"]
    assert main(["gpus", "B200", "--spot"]) == 0
    [b200] = gpu_offerings("B200", spot=True)
    assert b200.sold and b200.hourly_per_gpu is None and b200.zones > 0
    assert _rows(capsys.readouterr().out)["B200"][4:] == [f"{b200.zones} zone(s)", "unknown"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["gpus", "H101"], "gpus = 'H101': unknown GPU model 'H101' (did you mean H100?)"),
        (["gpus", "--region", "mars-north1"], "--region = 'mars-north1': no GPU offered there"),
        (
            ["gpus", "1000GB+"],
            "gpus: nothing offers 1000GB+; `gputrain gpus` lists what is offered",
        ),
        (
            ["gpus", "B200", "--region", "us-west1"],
            "gpus: nothing offers B200 in us-west1; `gputrain gpus --region us-west1` lists",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gputrain: error: {expected}") and err.count("\n") == 1


def test_gpus_imports_nothing_heavy() -> None:
    code = (
        "import sys; before = set(sys.modules)\n"
        "import scripts.cli as c\n"
        "c.main(['gpus', 'A100', '--spot'])\n"
        "print('HEAVY', sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
        "('pulumi', 'pulumi_gcp', 'google', 'paramiko', 'torch')), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert "HEAVY []" in proc.stderr and "a2-megagpu-16g" in proc.stdout
