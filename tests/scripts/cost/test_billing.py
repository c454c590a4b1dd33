"""`gputrain cost --billing`: the real google-cloud-bigquery client against a local BigQuery REST
server holding a Cloud Billing export (tests/support/fake_bigquery.py): billed next to estimated
per run, the export's lag stated; a Vertex job's rows by its run label, a stack's VM rows shared
by the runs' time windows; a slow query waits on getQueryResults; bad tables are one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.base.errors import UserError
from infra.billing import parse_table
from scripts.cli import main
from scripts.cost.billing import ENDPOINT_ENV, UsageRow, attribute
from scripts.cost.ledger import LedgerRecord, append
from scripts.settings import Settings
from tests.support.fake_bigquery import FakeBigQuery, export_row

TABLE = "billing-proj.billing_export.gcp_billing_export_v1_012345_6789AB_CDEF01"
T0 = 1_795_000_000.0  # 2026-11-18 11:06:40 UTC
H = 3600.0


def run(run_id: str, stack: str, start: float, end: float, hourly: float) -> LedgerRecord:
    return LedgerRecord(
        target=f"stack-{stack}", run_id=run_id, user="me", start=start, end=end, ok=True,
        nodes=1, machine="g2-standard-8", gpus_per_node=1, stack=stack, hourly_usd=hourly,
    )  # fmt: skip


@pytest.fixture
def bigquery(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBigQuery]:
    stack = {"gputrain-stack": "dev", "gputrain-project": "gputrain"}
    rows = [
        # dev's VM, hour by hour: the 1st hour all r1's, the 2nd half r1's, the 3rd nobody's
        export_row(labels=stack, start=T0, end=T0 + H, cost=0.9, exported=T0 + 5 * H),
        export_row(labels=stack, start=T0 + H, end=T0 + 2 * H, cost=0.9, credits=-0.1,
                   exported=T0 + 5 * H),
        export_row(labels=stack, start=T0 + 2 * H, end=T0 + 3 * H, cost=0.9,
                   exported=T0 + 6 * H),
        # a Vertex job of stack vx: its run label says whose
        export_row(labels={"gputrain-stack": "vx", "gputrain-run": "r2"}, start=T0,
                   end=T0 + H, cost=4.25, exported=T0 + 6 * H, sku="Vertex AI: Training"),
        # another stack's and an unlabelled row: not ours to show
        export_row(labels={"gputrain-stack": "other"}, start=T0, end=T0 + H, cost=50.0,
                   exported=T0 + 7 * H),
        export_row(labels={}, start=T0, end=T0 + H, cost=70.0, exported=T0 + 7 * H),
    ]  # fmt: skip
    with FakeBigQuery(TABLE, rows) as fake:
        monkeypatch.setenv(ENDPOINT_ENV, fake.url)
        yield fake


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    runs = tmp_path / "runs"
    append(runs, run("r1", "dev", T0, T0 + 1.5 * H, 1.0))
    append(runs, run("r2", "vx", T0, T0 + 0.5 * H, 8.0))
    return Settings(root=tmp_path, runs_dir=runs)


def test_billed_next_to_estimated_per_run_with_the_exports_lag(
    bigquery: FakeBigQuery, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cost", "--billing", TABLE, "--json"], settings) == 0
    doc = json.loads(capsys.readouterr().out)
    billed = {r["run_id"]: (r["estimated_usd"], r["billed_usd"]) for r in doc["runs"]}
    assert billed["r1"] == (pytest.approx(1.5), pytest.approx(0.9 + 0.4))  # credits counted
    assert billed["r2"] == (pytest.approx(4.0), pytest.approx(4.25))
    assert doc["total"]["billed_usd"] == pytest.approx(5.55)
    assert "billing data up to 2026-11-18 18:06 UTC" in doc["billing"]
    assert "between runs (stack up, no run): dev 1.30" in doc["billing"]
    # the query went to jobs.query in the table's project, standard SQL, our labels as parameters
    (_, path, body), *_ = [r for r in bigquery.requests if r[0] == "POST"]
    assert path == "/bigquery/v2/projects/billing-proj/queries"
    assert body["useLegacySql"] is False and f"`{TABLE}`" in body["query"]
    assert {p["name"] for p in body["queryParameters"]} == {"since", "stack_label", "stacks"}
    # the table, for people
    assert main(["cost", "--billing", TABLE], settings) == 0
    out = capsys.readouterr().out
    assert "billed" in out and "$4.25" in out and "$1.30" in out and "the export lags usage" in out


def test_a_slow_query_waits_on_get_query_results(
    bigquery: FakeBigQuery, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    bigquery.slow = True
    assert main(["cost", "--billing", TABLE, "--json", "--stack", "vx"], settings) == 0
    (r2,) = json.loads(capsys.readouterr().out)["runs"]
    assert r2["billed_usd"] == pytest.approx(4.25)
    assert any("/queries/job_" in p for p in bigquery.paths("GET")), bigquery.requests


def test_an_unreadable_or_missing_table_is_one_line(
    bigquery: FakeBigQuery, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    bigquery.readable = False
    assert main(["cost", "--billing", TABLE], settings) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "403" in err and "Access Denied" in err
    bigquery.readable = True
    assert main(["cost", "--billing", "billing-proj.billing_export.nope"], settings) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not found" in err and "nope" in err


@pytest.mark.parametrize(
    "bad", ["billing", "proj.dataset", "Proj.d.t", "proj.data set.t", "p.d.t", "a.b.c.d"]
)
def test_a_table_that_is_not_project_dataset_table_is_one_line(
    bad: str, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UserError, match=r"--billing .*allowed: PROJECT.DATASET.TABLE"):
        parse_table(bad, "--billing")
    assert main(["cost", "--billing", bad], settings) == 2
    assert "allowed: PROJECT.DATASET.TABLE" in capsys.readouterr().err


def test_attribution_by_label_and_by_time_window() -> None:
    runs = [run("a", "s", 0, 30, 1.0), run("b", "s", 60, 120, 1.0), run("V-1", "v", 0, 9, 1.0)]
    rows = [
        UsageRow({"gputrain-stack": "s"}, 0, 120, 12.0, "USD"),  # a: 1/4, b: 1/2, idle: 1/4
        UsageRow({"gputrain-stack": "v", "gputrain-run": "v-1"}, 0, 60, 5.0, "EUR"),
    ]
    billed = attribute(rows, runs)
    assert billed.by_run == {"a": 3.0, "b": 6.0, "V-1": 5.0}
    assert billed.between_runs == {"s": 3.0}
    assert "billed in EUR, not USD" in billed.note()


def test_the_stack_key_is_checked_and_is_costs_default(
    bigquery: FakeBigQuery,
    settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from infra.spec import parse_spec
    from tests.support import ROOT
    from tests.support.pulumi_mocks import deployable_config

    cfg = deployable_config("dev", **{"billingExport": TABLE})
    assert parse_spec(cfg, "dev").billing_export == TABLE
    with pytest.raises(UserError, match=r"gputrain:billingExport 'billing_export'.*allowed"):
        parse_spec(deployable_config("dev", **{"billingExport": "billing_export"}), "dev")
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.dev.yaml").write_text(
        "config:\n  gcp:project: gputrain-test\n  gputrain:machineType: g2-standard-8\n"
        f"  gputrain:billingExport: {TABLE}\n"
    )
    assert main(["cost", "--stack", "dev", "--json"], settings) == 0
    (r1,) = json.loads(capsys.readouterr().out)["runs"]
    assert r1["billed_usd"] == pytest.approx(1.3)


def test_doctor_row_says_whether_the_export_is_readable(bigquery: FakeBigQuery) -> None:
    from scripts.cost.billing import billing_row

    ok = billing_row(TABLE)
    assert ok.status == "ok" and "billing data up to 2026-11-18 18:06 UTC" in ok.detail
    bigquery.readable = False
    denied = billing_row(TABLE)
    assert denied.status == "fail" and "403" in denied.detail
    assert "roles/bigquery.dataViewer" in denied.fix and "billing-proj" in denied.fix


def test_a_bigquery_that_never_answers_is_one_line_soon(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens: the retries stop at QUERY_RETRY_S (not the library's 10 minutes per
    call), `cost` says so in one line and the doctor's row is unknown, not a permission fix."""
    import socket
    import threading

    from scripts.cost import billing

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before use: nothing listens there
    monkeypatch.setenv(ENDPOINT_ENV, f"http://127.0.0.1:{port}")
    monkeypatch.setattr(billing, "QUERY_RETRY_S", 1.0)
    done: list[int] = []
    worker = threading.Thread(
        target=lambda: done.append(main(["cost", "--billing", TABLE], settings)), daemon=True
    )
    worker.start()
    worker.join(timeout=30)
    assert done == [1], "still retrying after 30 s"
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"BigQuery {TABLE}: cannot reach it" in err
    row = billing.billing_row(TABLE)
    assert row.status == "unknown" and "cannot reach it" in row.detail and "network" in row.fix
