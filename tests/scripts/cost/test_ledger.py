"""The cost ledger: records appended by real `--local` runs (a success and a failure) read back
through `gputrain cost --json`; two processes appending at once lose nothing; grouping by run,
stack and day with recoveries' downtime counted; bad `--since` is one line."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import time
from pathlib import Path

import pytest

from infra.base.errors import UserError
from scripts.cli import main
from scripts.cost.command import group, parse_since, select
from scripts.cost.ledger import LEDGER, LedgerRecord, append, read, record_name, record_run
from scripts.settings import Settings
from tests.support import JOBS

#: the trainer's stand-in without torch (tests/support/jobs/steps.py): its step lines and summary
TRAIN = ["steps.py", "20", "0.01"]


def record(run_id: str, **kw: object) -> LedgerRecord:
    fields: dict[str, object] = dict(
        target="stack-dev", run_id=run_id, user="me", start=1_000_000.0, end=1_003_600.0,
        ok=True, nodes=2, machine="g2-standard-8", gpus_per_node=1, stack="dev",
        hourly_usd=2.0, capacity="spot",
    )  # fmt: skip
    return LedgerRecord(**(fields | kw))  # type: ignore[arg-type]


def test_local_runs_success_and_failure_are_in_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(JOBS / "steps.py", tmp_path)
    monkeypatch.delenv("GPUTRAIN_NODE_ROOT", raising=False)
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["train", "--local", "--", *TRAIN], settings) == 0
    (tmp_path / "boom.py").write_text("raise SystemExit(3)\n")
    assert main(["train", "--local", "--", "boom.py"], settings) == 1
    capsys.readouterr()
    assert main(["cost", "--local", "--json", "--since", "1h"], settings) == 0
    ledger = json.loads(capsys.readouterr().out)
    good, bad = ledger["runs"]
    assert good["target"] == "local" and good["machine"] == "local" and good["nodes"] == 1
    assert good["ok"] is True and bad["ok"] is False and good["run_id"] != bad["run_id"]
    assert 0 < good["elapsed_s"] < 600 and good["end"] <= bad["start"] + 1
    assert good["estimated_usd"] is None and ledger["total"]["unpriced_runs"] == 2
    assert ledger["total"]["runs"] == 2 and len(ledger["groups"]) == 2
    # the run report shows the ledger's figures
    report = (tmp_path / "runs" / "local" / good["run_id"] / "report.html").read_text()
    assert "GPU-hours" in report
    # the table, and another target's view is empty
    assert main(["cost", "--by", "day"], settings) == 0
    out = capsys.readouterr().out
    assert "total" in out and "2 run(s) on machines gputrain does not bill" in out
    assert main(["cost", "--stack", "dev"], settings) == 0
    assert "no runs in the ledger for stack-dev" in capsys.readouterr().out


def _append_many(runs_dir: Path, tag: str) -> None:
    for i in range(200):
        append(runs_dir, record(f"{tag}-{i}", user="x" * 3000))  # lines beyond one pipe buffer


def test_two_processes_appending_at_once_lose_nothing(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(tmp_path, t)) for t in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = (tmp_path / LEDGER).read_text().splitlines()
    assert len(lines) == 400 and all(json.loads(ln)["v"] == 1 for ln in lines)
    assert len(read(tmp_path).records) == 400


def test_grouping_counts_gpu_hours_cost_and_recovery_downtime() -> None:
    day2 = 1_000_000.0 + 86400
    runs = [
        record("r1"),
        record("r2", recoveries=2, downtime_s=300.0, start=day2, end=day2 + 1800),
        record("r3", target="stack-big", stack="big", hourly_usd=None),
    ]
    rows, total = group(runs, "stack")
    assert [(g.key, g.runs) for g in rows] == [("dev", 2), ("big", 1)]
    assert rows[0].estimated_usd == pytest.approx(2.0 + 1.0)
    assert rows[0].gpu_hours == pytest.approx(2 * 1.0 + 2 * 0.5)
    assert rows[0].recoveries == 2 and rows[0].downtime_s == 300.0
    assert total.estimated_usd == pytest.approx(3.0) and total.unpriced == 1
    days, _ = group(runs, "day")
    assert [(g.key, g.runs) for g in days] == [("1970-01-12", 2), ("1970-01-13", 1)]
    assert select(runs, target="stack-dev", since=day2) == [runs[1]]
    billed_rows, billed_total = group(runs, "run", {"r1": 1.75})
    assert billed_rows[0].billed_usd == 1.75 and billed_total.billed_usd == 1.75


def test_a_compute_engine_record_costs_at_least_the_minute_its_vms_are_billed() -> None:
    """A run that failed its GPU check seconds after `up` still paid Compute Engine's minimum
    minute per VM; off Compute Engine the time is the time."""
    brief = dict(start=1_000_000.0, end=1_000_005.0, hourly_usd=3.6)
    assert record("r1", backend="gce", **brief).estimated_usd == pytest.approx(0.06)
    assert record("r2", backend="vertex", **brief).estimated_usd == pytest.approx(0.005)
    assert record("r3", backend="gce").estimated_usd == pytest.approx(2.0)  # an hour: as it was


def test_partial_creates_and_zones_are_in_the_record_and_older_records_still_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the partial creates of a run's `up` billed while it waited for capacity is in its
    estimate, and `gputrain cost` counts it; the zones its cluster ran in are recorded; a
    record written before either field existed reads as it did (no zones, nothing before)."""
    moved = record("r1", zones=("us-central1-a", "europe-west4-b"), partial_usd=0.5)
    assert moved.estimated_usd == pytest.approx(2.0 + 0.5)
    assert LedgerRecord.from_json(json.loads(json.dumps(moved.to_json()))) == moved
    unpriced = record("r2", partial_usd=None)  # a VM of unknown price: the rest still counts
    assert unpriced.estimated_usd == pytest.approx(2.0)
    older = {k: v for k, v in record("r3").to_json().items() if k not in ("zones", "partial_usd")}
    runs = tmp_path / "runs"
    for r in (moved, unpriced):
        append(runs, r)
    with (runs / LEDGER).open("a") as f:
        f.write(json.dumps(older) + "\n")
    old = LedgerRecord.from_json(older)
    assert old is not None and old.zones == () and old.estimated_usd == pytest.approx(2.0)
    settings = Settings(root=tmp_path, runs_dir=runs)
    assert main(["cost", "--json", "--since", "1970-01-01"], settings) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["total"]["estimated_usd"] == pytest.approx(6.5) and doc["total"]["runs"] == 3
    assert doc["runs"][0]["zones"] == ["us-central1-a", "europe-west4-b"]
    assert doc["runs"][0]["partial_usd"] == 0.5 and doc["runs"][0]["estimated_usd"] == 2.5


def test_since_and_malformed_lines() -> None:
    now = time.time()
    assert parse_since("7d", now) == now - 7 * 86400
    assert parse_since("2026-11-20", now) == 1_795_132_800.0
    for bad in ("7", "7x", "-1d", "0d", "yesterday", "2026-13-01", "٧d"):
        with pytest.raises(UserError, match=r"--since .*allowed: a count and a unit"):
            parse_since(bad, now)
    for line in ("{", "[]", '{"run_id": 1}', '{"target": "x", "run_id": "y", "start": "a"}'):
        assert LedgerRecord.from_json(json.loads(line) if line != "{" else None) is None


def test_a_record_with_a_field_of_the_wrong_type_or_range_is_no_record() -> None:
    """Every field the table uses is checked, so a hand-edited or foreign line is skipped like an
    unreadable one rather than crashing the arithmetic or the dates."""
    good = record("r1").to_json()
    assert LedgerRecord.from_json(good) == record("r1")
    bad_fields: list[dict[str, object]] = [
        {"hourly_usd": "x"}, {"recoveries": "3"}, {"start": 1e300}, {"start": -1e12},
        {"end": float("nan")}, {"nodes": True}, {"nodes": 10**400}, {"user": 7},
        {"ok": "yes"}, {"stack": 1}, {"downtime_s": -5}, {"hourly_usd": float("inf")},
        {"zones": "us-central1-a"}, {"zones": [1]}, {"partial_usd": -1.0}, {"partial_usd": "1"},
    ]  # fmt: skip
    for bad in bad_fields:
        assert LedgerRecord.from_json(good | bad) is None, bad


def test_cost_says_what_it_skipped_and_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Lines that are no record are counted in one warning naming the ledger it read; with none
    left, the line says which ledger (or that the results directory is not there)."""
    runs = tmp_path / "elsewhere"
    for run_id in ("r1", "r2", "r3"):
        append(runs, record(run_id))
    with (runs / LEDGER).open("a") as f:
        f.write('garbage\n{"start": 1e300, "run_id": "x", "target": "y"}\n{"target": "stack-d')
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["cost", "--runs-dir", str(runs), "--json"], settings) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["total"]["runs"] == 3
    assert (
        err.strip()
        == f"warning: cost: skipped 3 unreadable line(s) in {runs / LEDGER}: not counted"
    )
    (runs / LEDGER).write_text("garbage\n")
    assert main(["cost", "--runs-dir", str(runs)], settings) == 0
    out, err = capsys.readouterr()
    assert f"1 unreadable line(s) in {runs / LEDGER}" in err
    assert out.strip() == f"cost: no runs in the ledger ({runs / LEDGER})"
    assert main(["cost", "--runs-dir", str(tmp_path / "nope")], settings) == 0
    assert f"({tmp_path / 'nope'} does not exist)" in capsys.readouterr().out
    assert main(["cost", "--runs-dir", str(runs / LEDGER)], settings) == 2
    assert "not a directory" in capsys.readouterr().err


def test_cost_bad_since_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["cost", "--since", "last week"], settings) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--since 'last week'" in err


def test_a_detached_runs_record_is_completed_by_the_heads_watchdog(tmp_path: Path) -> None:
    """The record the launch knows (cluster, price, start, zone, what partial creates billed
    before), completed by the watchdog at the end with no controller there (its end, its
    outcome, the figures): the ledger reads it as it reads a controller's, the same figures."""
    from gputrain_node import watchdog
    from infra.spec import parse_spec
    from scripts.cost.ledger import launch_record, with_zone
    from scripts.run_plan import worst_hourly
    from tests.support.pulumi_mocks import deployable_config

    spec = parse_spec(deployable_config("dev", machineType="g2-standard-8", nodes="2"), "dev")
    template = launch_record("stack-dev", spec, 1_000_000.0, "us-central1-a", 0.25)
    assert template["run_id"] == "" and template["ok"] is None
    # the rate its budget counts (the VMs with their boot disks), not the VMs' alone
    rate = worst_hourly(spec)
    assert rate is not None and spec.hourly_price is not None and rate > spec.hourly_price
    # a recovery moved the cluster: the watchdog the relaunch arms has both zones, in order
    template = with_zone(with_zone(template, "us-central1-b"), "us-central1-b")
    cfg = watchdog.Config.parse(
        {"stack": "dev", "run_id": "r7", "node": "dev-node-0", "head": True, "project": "p",
         "instances": [], "bucket": "gs://b/", "autodown_s": None, "ledger": template}
    )  # fmt: skip
    (tmp_path / "exitcode").write_text("0 1000001.0\n")
    done = watchdog.ledger_record(cfg, tmp_path, 1_003_600.0)
    assert done is not None
    record = LedgerRecord.from_json(json.loads(json.dumps(done)))
    assert record is not None and record.to_json() == done  # the same figures, derived alike
    assert (record.run_id, record.ok, record.elapsed_s) == ("r7", True, 3600.0)
    assert record.nodes == 2 and record.machine == "g2-standard-8" and record.stack == "dev"
    assert record.zones == ("us-central1-a", "us-central1-b")
    assert record.hourly_usd == rate and record.estimated_usd == pytest.approx(rate + 0.25)
    (tmp_path / "exitcode").write_text("143 1000001.0\n")
    assert watchdog.ledger_record(cfg, tmp_path, 1_000_100.0)["ok"] is False  # type: ignore[index]
    runs = tmp_path / "runs"  # `down` brought it home: the ledger counts it
    (runs / "stack-dev" / "r7").mkdir(parents=True)
    (runs / "stack-dev" / "r7" / record_name(done["start"])).write_text(json.dumps(done))
    assert [r.run_id for r in read(runs).records] == ["r7"]


def test_every_segment_of_a_resumed_run_counts_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train --resume` keeps the run id: each segment is a record of its own, all summed into
    the run's one row; the copies of a segment (this machine's line, the file beside the results,
    an earlier gputrain's single ledger.json) count once, and the bill of the run once."""
    runs = tmp_path / "runs"
    first = record("r1")  # 1 h at $2/h each
    second = record("r1", start=1_010_000.0, end=1_013_600.0, ok=False)
    for r in (first, second):
        append(runs, r)
    home = runs / "stack-dev" / "r1"
    home.mkdir(parents=True)
    for r in (first, second):
        (home / record_name(r.start)).write_text(json.dumps(r.to_json()))
    (home / "ledger.json").write_text(json.dumps(second.to_json()) + "\n")
    assert read(runs).records == [first, second]
    settings = Settings(root=tmp_path, runs_dir=runs)
    assert main(["cost", "--json", "--since", "1970-01-01"], settings) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["runs"]) == 2 and doc["total"]["estimated_usd"] == pytest.approx(4.0)
    (row,) = doc["groups"]
    assert row["key"] == "stack-dev/r1" and row["runs"] == 1 and row["gpu_hours"] == 4.0
    rows, total = group([first, second], "run", {"r1": 3.5})
    assert rows[0].billed_usd == total.billed_usd == 3.5 and total.runs == 1
    # a segment only the bucket knew (its copy `down` brought home) adds to the run's
    third = record("r1", start=1_020_000.0, end=1_021_800.0)
    (home / record_name(third.start)).write_text(json.dumps(third.to_json()) + "\n")
    assert [r.start for r in read(runs).records] == [first.start, second.start, third.start]


def test_a_resumed_segments_record_never_replaces_the_earlier_ones(tmp_path: Path) -> None:
    """record_run writes each segment's file beside the results and into the bucket under a
    name of its own; the head's watchdog, for a detached segment, writes its own segment's
    file (an earlier segment's record in the bucket does not stop it) and names it alike."""
    from types import SimpleNamespace

    from gputrain_node import watchdog
    from scripts.targets.base import Footprint

    uploaded: dict[str, bytes] = {}

    class Storage:
        def upload(self, bucket: str, name: str, source: Path) -> None:
            uploaded[name] = source.read_bytes()

    results = tmp_path / "runs" / "stack-dev" / "r1"
    session = SimpleNamespace(
        name="stack-dev", hourly_usd=2.0, ledger_bucket=lambda: (Storage(), "b", "team/"),
        footprint=lambda: Footprint(2, "g2-standard-8", 1), spec=None, partial_usd=0.0,
    )  # fmt: skip
    for elapsed in (3600.0, 1800.0):
        session.billed_since = time.time() - elapsed
        record_run(None, session, "r1", results)  # type: ignore[arg-type]
    assert len(uploaded) == 2 and all(n.startswith("team/runs/r1/ledger-") for n in uploaded)
    assert sorted(p.name for p in results.iterdir()) == sorted(n.rsplit("/")[-1] for n in uploaded)
    records = read(tmp_path / "runs").records
    assert len(records) == 2 and sum(r.elapsed_s for r in records) == pytest.approx(5400, abs=5)

    class Blob:
        def __init__(self, name: str) -> None:
            self.name = name

        def exists(self) -> bool:
            return self.name in uploaded

        def upload_from_string(self, text: str) -> None:
            uploaded[self.name] = text.encode()

    bucket = SimpleNamespace(blob=Blob)
    launch = records[1].to_json() | {"start": 1_900_000.123, "run_id": ""}  # a detached resume
    cfg = watchdog.Config.parse(
        {"stack": "dev", "run_id": "r1", "node": "dev-node-0", "head": True, "project": "p",
         "instances": [], "bucket": "gs://b/team/", "autodown_s": None, "ledger": launch}
    )  # fmt: skip
    (tmp_path / "exitcode").write_text("0 1903600.0\n")
    watchdog.record_cost(cfg, tmp_path, bucket, 1_903_600.123)
    assert len(uploaded) == 3
    mine = json.loads(uploaded[f"team/runs/r1/{record_name(1_900_000.123)}"])
    assert mine["start"] == 1_900_000.123 and mine["elapsed_s"] == 3600.0
