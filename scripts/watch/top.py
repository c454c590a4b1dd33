"""`gputrain top`: a live per-node, per-GPU table of a run (the nodes' telemetry.csv) with the
step, loss and tokens/s from its log, refreshed until the run ends (or once, without a terminal)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from infra.base.errors import UserError
from scripts import ui
from scripts.parallel import parallel
from scripts.settings import Settings
from scripts.targets.base import Feature, RunOptions, Target
from scripts.transport.base import Transport
from scripts.watch.node import TAIL_BYTES, build_top_command
from scripts.watch.telemetry import (
    GPU_HEADERS,
    LogProgress,
    NodeTelemetry,
    gpu_rows,
    parse_samples,
)


class TopView:
    """What `top` shows, read from every node."""

    def __init__(self, transports: Mapping[str, Transport], run_id: str) -> None:
        self.transports, self.run_id = transports, run_id
        self.nodes = {n: NodeTelemetry(n) for n in transports}
        self.progress = LogProgress()
        self.ended: dict[str, int | None] = {}
        self.missing: set[str] = set()
        self.errors: dict[str, str] = {}

    def refresh(self) -> None:
        cmd = build_top_command(self.run_id)
        got, errors = parallel(list(self.transports), lambda n: self.transports[n].run(cmd, 30))
        self.errors = {n: str(e) for n, e in errors.items()}
        progress = LogProgress()
        for node, r in got.items():
            if r.exit_code == 3:
                self.missing.add(node)
                continue
            telemetry, _, log = r.stdout.partition("\n@@log\n")
            lines = (
                telemetry.splitlines()[1:]
                if len(telemetry) >= TAIL_BYTES
                else telemetry.splitlines()
            )
            self.nodes[node] = NodeTelemetry(node)
            self.nodes[node].add(parse_samples("\n".join(lines) + "\n"))
            for line in log.splitlines():
                if line.startswith("@@exit "):
                    code = line.split()[1]
                    self.ended[node] = int(code) if code.lstrip("-").isdigit() else None
                else:
                    progress.line(line)
            if progress.step is not None and (self.progress.step or -1) <= progress.step:
                self.progress = progress

    @property
    def done(self) -> bool:
        return all(n in self.ended or n in self.missing for n in self.transports)

    def title(self) -> str:
        state = "ended" if self.done else "running"
        return f"run {self.run_id} ({state}): {self.progress.text()}"

    def rows(self) -> list[list[object]]:
        rows = gpu_rows({n: t for n, t in self.nodes.items() if n not in self.missing})
        rows += [[n, "-", f"unreachable: {e}", "", "", "", "", ""] for n, e in self.errors.items()]
        return rows


def top(
    target: Target,
    run_id: str | None,
    opts: RunOptions,
    settings: Settings,
    *,
    once: bool,
    interval_s: float,
) -> None:
    run = run_id or _last_run(settings, target.name)
    if Feature.SSH not in target.capabilities:
        raise UserError(
            f"top: {target.name} runs Vertex AI jobs, which have no SSH to read GPUs over; "
            "see the job's page in the console"
        )
    with target.attached(opts) as session:
        transports = session.transports
        view = TopView(transports, run)
        view.refresh()
        if view.missing == set(transports):
            raise UserError(f"top: run {run} does not exist on {target.name} (no node has it)")
        if once or not ui.is_tty():
            ui.table(view.title(), GPU_HEADERS, view.rows())
            return
        _live(view, interval_s)


def _live(view: TopView, interval_s: float) -> None:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    def render() -> Table:
        t = Table(title=view.title())
        for h in GPU_HEADERS:
            t.add_column(h)
        for row in view.rows():
            t.add_row(*[str(c) for c in row])
        return t

    with Live(render(), console=Console(), refresh_per_second=2) as live:
        while not view.done:
            time.sleep(interval_s)
            view.refresh()
            live.update(render())


def _last_run(settings: Settings, target: str) -> str:
    try:
        return settings.last_run(target)
    except UserError:
        raise UserError(f"top: no run recorded for {target}; pass --run RUN_ID") from None
