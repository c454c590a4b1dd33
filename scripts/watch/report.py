"""runs/<target>/<run-id>/report.html: one self-contained page per run (plots embedded as PNG),
written at the end of every run and by `gputrain report RUN`. It reads only what the run left in
its results dir: metrics.jsonl and summary.json (the trainer), <node>/watch*/telemetry.csv (the
GPU sampler), watch-events.jsonl (stalls, restarts, GPU faults, idle nodes), job.json
(recoveries), cost.json (the price the run was billed at) and the run's cost-ledger records."""

from __future__ import annotations

import base64
import html
import io
import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.base.errors import UserError
from scripts import ui
from scripts.cost.ledger import LedgerRecord, record_files
from scripts.settings import Settings
from scripts.watch.telemetry import Sample, parse_samples

REPORT = "report.html"
COST = "cost.json"


@dataclass
class RunData:
    """Everything the report shows, read from a results dir."""

    run_id: str
    metrics: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, list[Sample]] = field(default_factory=dict)  # node -> samples
    events: list[dict[str, Any]] = field(default_factory=list)  # time, kind, label
    job: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    ledger: dict[str, Any] = field(default_factory=dict)  # its cost-ledger records' figures


def _json_lines(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ledger(results_dir: Path) -> dict[str, Any]:
    """The run's cost-ledger figures as `gputrain cost` shows the run: its records' (one per
    segment: each `train --resume` adds one) GPU-hours, downtime and estimate, summed."""
    found = [LedgerRecord.from_json(_json(p)) for p in record_files(results_dir)]
    records = list({r.segment: r for r in found if r is not None}.values())
    if not records:
        return {}
    costs = [r.estimated_usd for r in records if r.estimated_usd is not None]
    return {
        "segments": len(records),
        "gpu_hours": sum(r.gpu_hours for r in records),
        "downtime_s": sum(r.downtime_s for r in records),
        "estimated_usd": sum(costs) if costs else None,
    }


def _number(value: Any) -> float | None:
    """A finite number, else None: a foreign trainer's files may hold strings, lists, NaN."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _numbers(row: dict[str, Any]) -> dict[str, Any]:
    """The row's finite numbers alone (what the plots and the table read)."""
    return {k: v for k, v in row.items() if _number(v) is not None}


def _metric_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metric rows with a step: the plots' x axis; the rest are some other trainer's lines."""
    return [r for r in map(_numbers, rows) if "step" in r]


def _recoveries(job: dict[str, Any]) -> list[dict[str, Any]]:
    found = job.get("recoveries")
    return [
        r
        for r in (found if isinstance(found, list) else [])
        if isinstance(r, dict)
        and _number(r.get("preempted_at")) is not None
        and isinstance(r.get("nodes"), list)
    ]


def load_run(results_dir: Path) -> RunData:
    """What the report shows; anything in a results dir that is not the shape our own writers
    give (a third-party trainer's metrics.jsonl or summary.json) is left out, never a crash."""
    data = RunData(results_dir.name)
    nodes = sorted(p for p in results_dir.iterdir() if p.is_dir())
    logs = [_metric_rows(_json_lines(n / "metrics.jsonl")) for n in nodes]
    data.metrics = max(logs, key=len, default=[])
    summaries = [_numbers(_json(n / "summary.json")) for n in nodes]
    data.summary = next((s for s in summaries if s.get("final_loss") is not None), {})
    for n in nodes:
        seen: dict[tuple[float, int], Sample] = {}
        for csv_path in sorted(n.glob("watch*/telemetry.csv")):
            for s in parse_samples(csv_path.read_text(errors="replace")):
                seen[(s.time, s.gpu)] = s
        if seen:
            data.telemetry[n.name] = sorted(seen.values(), key=lambda s: (s.time, s.gpu))
    data.job = _json(results_dir / "job.json")
    data.cost = _json(results_dir / COST)
    data.ledger = _ledger(results_dir)
    for e in _json_lines(results_dir / "watch-events.jsonl"):
        if e.get("kind") in ("stall", "restart", "gpu_fault") and _number(e.get("time")):
            where = " ".join(
                f"{k} {e[k.lower()]}".removeprefix("node ")
                for k in ("node", "rank", "GPU")
                if e.get(k.lower()) is not None
            )
            data.events.append(
                {"time": e["time"], "kind": e["kind"], "label": f"{e['kind']} {where}"}
            )
    for r in _recoveries(data.job):
        data.events.append(
            {
                "time": r["preempted_at"],
                "kind": "recovery",
                "label": f"recovery: {', '.join(map(str, r['nodes']))} {r.get('cause', 'preempted')}",
            }
        )
    data.events.sort(key=lambda e: e["time"])
    return data


# -- plots --------------------------------------------------------------------------------------


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _eng() -> Any:
    from matplotlib.ticker import EngFormatter

    return EngFormatter()


def loss_plot(data: RunData) -> str | None:
    rows = [r for r in data.metrics if isinstance(r.get("loss"), int | float)]
    if not rows:
        return None
    plt = _pyplot()
    steps = [r["step"] for r in rows]
    losses = [r["loss"] for r in rows]
    per_step = data.summary.get("tokens_per_step")
    fig, axes = plt.subplots(1, 2 if per_step else 1, figsize=(12, 4), squeeze=False)
    xs = [("step", steps)] + ([("tokens", [s * per_step for s in steps])] if per_step else [])
    for ax, (name, x) in zip(axes[0], xs, strict=True):
        ax.plot(x, losses, label="train loss")
        if isinstance(data.summary.get("eval_loss"), int | float):
            ax.plot([x[-1]], [data.summary["eval_loss"]], "o", color="C3", label="eval loss")
        if isinstance(data.summary.get("loss_floor"), int | float):
            ax.axhline(data.summary["loss_floor"], ls=":", color="grey", label="loss floor")
        ax.set_xlabel(name)
        ax.xaxis.set_major_formatter(_eng())
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("loss")
    return _png(fig)


def throughput_plot(data: RunData) -> str | None:
    rows = [r for r in data.metrics if isinstance(r.get("tokens_per_s"), int | float)]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, 3.5))
    ax.plot([r["step"] for r in rows], [r["tokens_per_s"] for r in rows], label="tokens/s")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s")
    ax.yaxis.set_major_formatter(_eng())
    ax.grid(alpha=0.3)
    mfu = [(r["step"], r["mfu"] * 100) for r in rows if isinstance(r.get("mfu"), int | float)]
    if mfu:
        twin = ax.twinx()
        twin.plot(*zip(*mfu, strict=True), color="C1", label="MFU %")
        twin.set_ylabel("MFU %")
    ax.set_title("throughput" + ("" if mfu else " (MFU: n/a on this device)"))
    return _png(fig)


def gpu_plot(data: RunData, what: str) -> str | None:
    """Per node over time (minutes from the first sample): mean utilization or memory used,
    with stalls, restarts, GPU faults and recoveries marked."""
    if not data.telemetry:
        return None
    plt = _pyplot()
    t0 = min(s.time for samples in data.telemetry.values() for s in samples)
    fig, ax = plt.subplots(figsize=(12, 3.5))
    for node, samples in data.telemetry.items():
        by_time: dict[float, list[float]] = {}
        for s in samples:
            value = s.util_pct if what == "util" else s.mem_used_mib
            if value is not None:
                by_time.setdefault(s.time, []).append(value)
        xs = sorted(by_time)
        if what == "util":
            ys = [sum(by_time[t]) / len(by_time[t]) for t in xs]
        else:
            ys = [sum(by_time[t]) / 1024 for t in xs]
        ax.plot([(t - t0) / 60 for t in xs], ys, label=node)
    for i, e in enumerate(data.events):
        x = (e["time"] - t0) / 60
        ax.axvline(x, color="C3" if e["kind"] != "restart" else "C2", ls="--", alpha=0.7)
        ax.annotate(e["label"], (x, 1 - 0.12 * (i % 4)), xycoords=("data", "axes fraction"),
                    fontsize=8, color="C3", rotation=0, va="top")  # fmt: skip
    ax.set_xlabel("minutes")
    ax.set_ylabel("mean GPU utilization %" if what == "util" else "memory used, all GPUs, GiB")
    if what == "util":
        ax.set_ylim(0, 105)
    ax.set_title("GPU utilization per node" if what == "util" else "GPU memory per node")
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


# -- the page -----------------------------------------------------------------------------------


def summary_rows(data: RunData) -> list[tuple[str, str]]:
    s, rows = data.summary, []
    for key, label, fmt in (
        ("final_loss", "final loss", "{:.4f}"),
        ("eval_loss", "eval loss", "{:.4f}"),
        ("loss_floor", "loss floor", "{:.4f}"),
        ("steps", "steps", "{:,}"),
        ("tokens_per_step", "tokens per step", "{:,}"),
        ("tokens_per_s", "tokens/s (steady)", "{:,.0f}"),
        ("mfu", "MFU (steady)", "{:.1%}"),
        ("world_size", "ranks", "{}"),
        ("resumed_from", "resumed from step", "{}"),
    ):
        if isinstance(s.get(key), int | float):
            rows.append((label, fmt.format(s[key])))
    if data.job:
        rows.append(("outcome", "completed" if data.job.get("ok") else "failed"))
        if data.job.get("failed_node"):
            rows.append(("failed node", str(data.job["failed_node"])))
    kinds = [e["kind"] for e in data.events]
    for kind, label in (("recovery", "recoveries"), ("restart", "restarts"), ("stall", "stalls"),
                        ("gpu_fault", "GPU faults")):  # fmt: skip
        rows.append((label, str(kinds.count(kind))))
    for node, samples in data.telemetry.items():
        util = [x.util_pct for x in samples if x.util_pct is not None]
        if util:
            rows.append((f"{node} mean GPU utilization", f"{sum(util) / len(util):.0f} %"))
    gpu_hours, estimated = _number(data.ledger.get("gpu_hours")), data.ledger.get("estimated_usd")
    if gpu_hours is not None:  # the figures `gputrain cost` shows for this run
        rows.append(("GPU-hours", f"{gpu_hours:.2f}"))
        if _number(data.ledger.get("downtime_s")):
            rows.append(("recovery downtime", f"{data.ledger['downtime_s']:.0f} s"))
        if _number(estimated) is not None:
            segments = data.ledger.get("segments", 1)
            over = f", {segments} segments" if segments > 1 else ""
            rows.append((f"estimated cost (ledger{over})", f"${estimated:.2f}"))
    hourly, elapsed = _number(data.cost.get("hourly_usd")), _number(data.cost.get("elapsed_s"))
    if hourly is not None and elapsed is not None:
        rows.append(("cost so far", f"${hourly * elapsed / 3600:.2f} at ${hourly:.2f}/h"))
    elif data.cost:
        rows.append(("cost so far", "nothing billed by gputrain (machines you own)"))
    return rows


def render(data: RunData) -> str:
    plots = [
        ("Loss (train and eval) against steps and tokens", loss_plot(data)),
        ("Tokens/s and MFU", throughput_plot(data)),
        ("GPU utilization per node (stalls, restarts, faults, recoveries marked)",
         gpu_plot(data, "util")),
        ("GPU memory per node", gpu_plot(data, "mem")),
    ]  # fmt: skip
    esc = html.escape
    table = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in summary_rows(data))
    sections = []
    for title, png in plots:
        body = (
            f'<img alt="{esc(title)}" src="data:image/png;base64,{png}">'
            if png
            else "<p class=none>no data (no GPU telemetry: CPU nodes or no nvidia-smi)</p>"
        )
        sections.append(f"<section><h2>{esc(title)}</h2>{body}</section>")
    events = "".join(
        f"<li>{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['time']))} {esc(e['label'])}</li>"
        for e in data.events
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gputrain run {esc(data.run_id)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1300px}}table{{border-collapse:collapse}}
th,td{{text-align:left;padding:.2em 1em;border-bottom:1px solid #ddd}}img{{max-width:100%}}
.none{{color:#888}}</style></head><body>
<h1>gputrain run {esc(data.run_id)}</h1>
<table>{table}</table>
{"".join(sections)}
<section><h2>Events</h2><ul>{events or "<li>none</li>"}</ul></section>
<p class=none>written {time.strftime("%Y-%m-%d %H:%M:%S")} by gputrain</p>
</body></html>
"""


def write_report(results_dir: Path) -> Path:
    path = results_dir / REPORT
    path.write_text(render(load_run(results_dir)))
    return path


def record_cost(results_dir: Path, hourly_usd: float | None, elapsed_s: float) -> None:
    """cost.json: what the run cost so far (None: machines gputrain does not bill)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / COST).write_text(json.dumps({"hourly_usd": hourly_usd, "elapsed_s": elapsed_s}))


def report_after_run(results_dir: Path, hourly_usd: float | None, elapsed_s: float) -> None:
    """The report at the end of a run; a failure to draw it is a warning, never the run's."""
    if not results_dir.is_dir():
        return
    try:
        record_cost(results_dir, hourly_usd, elapsed_s)
        ui.say(f"report: {write_report(results_dir)}")
    except Exception as e:
        ui.warn(f"could not write the run report in {results_dir}: {e}")


def report_command(target: str | None, run: str | None, settings: Settings) -> None:
    """`gputrain report [RUN]`: RUN is a results dir, or a run id of the target (default: its
    last run) or of any target under runs/."""
    results = _find(target, run, settings)
    ui.say(f"report: {write_report(results)}")


def _find(target: str | None, run: str | None, settings: Settings) -> Path:
    if run and Path(run).is_dir() and (Path(run) / "job.json").exists():
        return Path(run)
    if target is not None:
        run = run or settings.last_run(target)
        found: Iterable[Path] = [settings.runs_dir / target / run]
    elif run:
        found = settings.runs_dir.glob(f"*/{run}")
    else:
        raise UserError("report: give a RUN (a run id or runs/<target>/<run-id>) or a target")
    dirs: Sequence[Path] = [p for p in found if p.is_dir()]
    if not dirs:
        raise UserError(f"report: no run {run} under {settings.runs_dir}")
    return dirs[0]
