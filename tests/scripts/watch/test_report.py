"""The run report: built from a real trainer run's files, the sampler's telemetry (fake GPUs),
watch events and a recovery; opened in headless Chromium (no console errors, plots that are real
images); `gputrain report RUN`."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputrain_node import telemetry
from scripts.cli import main
from scripts.job.download import write_job_record
from scripts.job.records import JobResult, Recovery
from scripts.settings import Settings
from scripts.watch.monitor import record_event
from scripts.watch.report import record_cost, write_report
from tests.support.testbed import BUSY, FAKE_NVIDIA_SMI, IDLE, GpuConfig
from trainer.train import main as train

pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler")
PROBE = """<script>window.addEventListener("load", () => document.body.setAttribute("data-images",
[...document.images].map(i => i.naturalWidth + "x" + i.naturalHeight).join(",")));</script>"""


def _telemetry(node_dir: Path, gpus: GpuConfig, t0: float, n: int, tmp: Path,
               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """n samples 5 s apart from the real sampler code against the fake nvidia-smi."""
    gpu, bin_dir = tmp / "gpu", tmp / "bin"
    gpu.mkdir(parents=True)
    bin_dir.mkdir()
    (gpu / "gpu.json").write_text(json.dumps(dataclasses.asdict(gpus)))
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI.replace("__GPU_DIR__", str(gpu)))
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setattr(telemetry, "EXTRA_PATH", str(bin_dir))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    watch = node_dir / "watch"
    watch.mkdir(parents=True)
    lines = [",".join(telemetry.COLUMNS)]
    for i in range(n):
        lines += [",".join(r) for r in telemetry.sample_rows(t0 + 5 * i)]
    (watch / "telemetry.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One run's files for the module's tests (a training run and 120 fake nvidia-smi calls)."""
    tmp_path = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield _results(tmp_path, monkeypatch)


def _results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run = tmp_path / "runs" / "hosts-bed" / "r-42"
    monkeypatch.delenv("GPUTRAIN_TENSORBOARD_DIR", raising=False)
    train(["--preset", "tiny", "--steps", "60", "--log-every", "5", "--out", str(run / "h0")])
    t0 = time.time() - 600
    _telemetry(
        run / "h0", GpuConfig(count=2, timeline=(BUSY,)), t0, 40, tmp_path / "a", monkeypatch
    )
    _telemetry(
        run / "h1", GpuConfig(count=1, timeline=(IDLE,)), t0, 40, tmp_path / "b", monkeypatch
    )
    (run / "h1" / "watch").rename(run / "h1" / "watch.prev1")  # an earlier attempt's copy
    _telemetry(run / "h1", GpuConfig(count=1, timeline=(BUSY,)), t0 + 200, 40, tmp_path / "c",
               monkeypatch)  # fmt: skip
    monkeypatch.undo()  # the fake nvidia-smi's PATH was for the samples only
    record_event(run, "stall", node="h1", rank=1, message="stuck")
    record_event(run, "restart", reason="stall", number=1)
    recovery = Recovery(("h1",), t0 + 100, 20.0, "us-central1-a", 20, 3)
    write_job_record(JobResult("r-42", True, {"h0": 0, "h1": 0}, 60.0, run, recoveries=(recovery,)))
    record_cost(run, 25.55, 1800)
    return run


def test_report_holds_the_summary_events_and_four_plots(results: Path) -> None:
    page = write_report(results).read_text()
    assert len(re.findall(r'<img alt="[^"]+" src="data:image/png;base64,', page)) == 4
    for row in ("final loss", "eval loss", "tokens/s (steady)", "recoveries</th><td>1",
                "restarts</th><td>1", "stalls</th><td>1", "h0 mean GPU utilization</th><td>97 %",
                "cost so far</th><td>$12.78 at $25.55/h"):  # fmt: skip
        assert row in page
    assert "recovery: h1 preempted" in page and "stall h1 rank 1" in page
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing fetched


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium (make apt)")
def test_report_opens_in_chromium_without_console_errors(results: Path, tmp_path: Path) -> None:
    probe = tmp_path / "probe.html"
    probe.write_text(write_report(results).read_text().replace("</body>", PROBE + "</body>"))
    r = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert not [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]
    sizes = re.search(r'data-images="([^"]*)"', r.stdout)
    assert sizes, r.stdout[:500]
    dims = [tuple(map(int, s.split("x"))) for s in sizes.group(1).split(",")]
    assert len(dims) == 4 and all(w >= 600 and h >= 200 for w, h in dims), dims
    shot = tmp_path / "report.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=1300,2600", f"--screenshot={shot}", (results / "report.html").as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    assert shot.stat().st_size > 50_000  # a page with plots, not a blank one


def test_gputrain_report_by_path_or_id_and_a_missing_run_is_one_line(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (results / "report.html").unlink(missing_ok=True)
    settings = Settings(root=results.parents[2], runs_dir=results.parents[1])
    assert main(["report", str(results)], settings=settings) == 0
    assert (results / "report.html").exists()
    assert main(["report", "r-42"], settings=settings) == 0
    assert main(["report", "nope"], settings=settings) == 2
    assert (
        capsys.readouterr().err
        == f"gputrain: error: report: no run nope under {results.parents[1]}\n"
    )


FOREIGN_METRICS = [
    {"loss": 2.5},  # no step: a Hugging Face-style line
    {"step": "10", "loss": "2.1"},  # strings
    {"step": [1], "loss": 2.0},  # a list
    {"step": 3, "loss": float("nan"), "tokens_per_s": "fast"},  # NaN and a string
    {"step": 4, "loss": 1.9, "mfu": True},  # a bool is not a number
    {"step": 5, "loss": 1.8, "tokens_per_s": 1000.0},
]


def test_a_third_party_trainers_files_make_a_report_not_a_traceback(tmp_path: Path) -> None:
    """`report` on a results dir some other trainer wrote: only the rows with the shapes our
    writers give reach the plots and the table; none of the rest is a crash (issue 39, 5)."""
    run = tmp_path / "r-7"
    node = run / "h0"
    node.mkdir(parents=True)
    (node / "metrics.jsonl").write_text(
        "\n".join(json.dumps(r) for r in FOREIGN_METRICS) + "\nnot json\n[1, 2]\n"
    )
    (node / "summary.json").write_text(
        json.dumps(
            {
                "final_loss": 1.8,
                "tokens_per_step": "many",
                "mfu": float("nan"),
                "steps": [5],
                "eval_loss": None,
                "world_size": True,
            }
        )
    )
    (run / "watch-events.jsonl").write_text(
        json.dumps({"kind": "stall", "node": "h0"})
        + "\n"  # no time
        + json.dumps({"kind": "restart", "time": "noon"})
        + "\n"
    )
    (run / "job.json").write_text(
        json.dumps({"ok": True, "recoveries": [{"nodes": "h0"}, 5, {"preempted_at": 1.0}]})
    )
    (run / "cost.json").write_text(json.dumps({"hourly_usd": float("nan"), "elapsed_s": "1h"}))
    page = write_report(run).read_text()
    assert "<h1>gputrain run r-7</h1>" in page
    table = dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", page))
    assert table["final loss"] == "1.8000"
    assert "tokens per step" not in table and "MFU (steady)" not in table and "steps" not in table
    assert table["recoveries"] == "0" and table["stalls"] == "0"
    assert table["cost so far"] == "nothing billed by gputrain (machines you own)"  # not $nan
    # the two rows with a numeric step and loss make the loss plot
    assert page.count("data:image/png;base64,") >= 1


def test_the_report_sums_the_ledger_records_of_a_resumed_runs_segments(tmp_path: Path) -> None:
    """One record file per segment (each `train --resume` adds one): the report shows the run's
    GPU-hours and estimate as `gputrain cost` does, every segment once."""
    from scripts.cost.ledger import LedgerRecord, record_name

    run = tmp_path / "r-8"
    run.mkdir()
    for start in (1_000_000.0, 1_010_000.0):  # 2 nodes x 1 GPU, 1 h at $2/h each
        record = LedgerRecord(
            target="stack-dev", run_id="r-8", user="me", start=start, end=start + 3600, ok=True,
            nodes=2, machine="g2-standard-8", gpus_per_node=1, hourly_usd=2.0,
        )  # fmt: skip
        (run / record_name(start)).write_text(json.dumps(record.to_json()) + "\n")
    page = write_report(run).read_text()
    table = dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", page))
    assert table["GPU-hours"] == "4.00"
    assert table["estimated cost (ledger, 2 segments)"] == "$4.00"
