"""GCE's preemption and maintenance notices: the metadata watchers against a local server that
answers like the metadata server, and notices seen by one node acting on both nodes at one step."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import torch

from tests.support.trainer_helpers import (
    child_env,
    free_port,
    node_argv,
    start,
    wait_for_steps,
    wait_while_running,
)
from trainer import checkpoint
from trainer.preemption import (
    MAINTENANCE_PATH,
    PREEMPTED_PATH,
    PreemptionWatcher,
    StopRequest,
    maintenance_watcher,
)

pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler")


class MetadataServer(ThreadingHTTPServer):
    """`instance/preempted` (FALSE until a notice) and `instance/maintenance-event` (NONE until
    one) as GCE serves them: Metadata-Flavor required, ETags, and `wait_for_change` (with
    `last_etag`, `timeout_sec`) holding the answer until the value changes."""

    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), MetadataHandler)
        self.values = {PREEMPTED_PATH: "FALSE", MAINTENANCE_PATH: "NONE"}
        self.changed = threading.Condition()
        self.requests: list[str] = []

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def etag(self, path: str) -> str:
        return f"etag-{self.values[path].lower()}"

    def set(self, path: str, value: str) -> None:
        with self.changed:
            self.values[path] = value
            self.changed.notify_all()


class MetadataHandler(BaseHTTPRequestHandler):
    server: MetadataServer

    def do_GET(self) -> None:
        server, url = self.server, urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        server.requests.append(self.path)
        if url.path not in server.values:
            return self.answer(404, "not found")
        if self.headers.get("Metadata-Flavor") != "Google":
            return self.answer(403, "Missing required header: Metadata-Flavor", url.path)
        if query.get("wait_for_change") == "true":
            seen = query.get("last_etag") or server.etag(url.path)
            with server.changed:
                server.changed.wait_for(
                    lambda: server.etag(url.path) != seen,
                    timeout=float(query.get("timeout_sec", 300)),
                )
        self.answer(200, server.values[url.path], url.path)

    def answer(self, status: int, body: str, path: str | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        if path is not None:
            self.send_header("ETag", self.server.etag(path))
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    server = MetadataServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    for path in server.values:
        server.set(path, "SHUTDOWN")  # releases held long polls
    server.shutdown()
    server.server_close()


def test_the_watcher_long_polls_and_fires_once_the_value_turns_true(
    metadata: MetadataServer,
) -> None:
    stop = StopRequest()
    watcher = PreemptionWatcher(lambda: stop.request("preempted"), host=metadata.host)
    watcher.start()
    deadline = time.monotonic() + 10
    while len(metadata.requests) < 2 and time.monotonic() < deadline:  # the second one is held
        time.sleep(0.01)
    time.sleep(0.2)
    assert not stop.requested and watcher.is_alive()
    assert metadata.requests[0] == PREEMPTED_PATH
    assert metadata.requests[1].startswith(f"{PREEMPTED_PATH}?wait_for_change=true")
    assert "last_etag=etag-false" in metadata.requests[1]
    metadata.set(PREEMPTED_PATH, "TRUE")
    assert watcher.preempted.wait(5)
    watcher.join(5)
    assert stop.reason == "preempted" and not watcher.is_alive()
    assert len(metadata.requests) == 2  # no busy polling while it waited


def test_a_missing_metadata_server_never_crashes_and_is_reported_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stop = StopRequest()
    watcher = PreemptionWatcher(
        lambda: stop.request("preempted"), host=f"127.0.0.1:{free_port()}", max_backoff_s=0.05
    )
    watcher.start()
    deadline = time.monotonic() + 10
    while watcher.errors < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    watcher.stop()
    watcher.join(5)
    assert watcher.errors >= 3 and not stop.requested and not watcher.is_alive()
    assert capsys.readouterr().out.count("metadata watch:") == 1


def test_every_maintenance_notice_asks_for_one_checkpoint_and_never_a_stop(
    metadata: MetadataServer,
) -> None:
    stop = StopRequest()
    watcher = maintenance_watcher(stop, host=metadata.host)
    watcher.start()
    metadata.set(MAINTENANCE_PATH, "TERMINATE_ON_HOST_MAINTENANCE")
    deadline = time.monotonic() + 10
    while stop.checkpoints_asked < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stop.checkpoints_asked == 1 and stop.code == 1 and not stop.requested
    stop.checkpoints_taken = 1
    seen = len(metadata.requests)
    metadata.set(MAINTENANCE_PATH, "NONE")  # the window passed; a later notice asks again
    while len(metadata.requests) < seen + 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the watcher read NONE and polls again (etags are per value)
    metadata.set(MAINTENANCE_PATH, "TERMINATE_ON_HOST_MAINTENANCE")
    while stop.checkpoints_asked < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stop.checkpoints_asked == 2 and watcher.is_alive()
    watcher.stop()


def test_notices_on_one_node_save_both_at_one_step_then_stop_both_at_one_step(
    metadata: MetadataServer, tmp_path: Path
) -> None:
    """Node 1 alone watches the metadata server. A maintenance notice: both save at one step and
    train on; then a preemption notice: both save at one step and stop."""
    port, args = free_port(), ["--log-every", "1", "--checkpoint-every", "1000"]
    nodes = [tmp_path / f"node{n}" for n in (0, 1)]
    envs = [child_env(out) for out in nodes]
    envs[1].update(
        GPUTRAIN_WATCH_PREEMPTION="1",
        GPUTRAIN_WATCH_MAINTENANCE="1",
        GCE_METADATA_HOST=metadata.host,
    )
    procs = [start(node_argv(port, "notices", args), env) for env in envs]
    wait_for_steps(nodes[0], 20, procs)
    metadata.set(MAINTENANCE_PATH, "TERMINATE_ON_HOST_MAINTENANCE")  # GCE's maintenance notice

    def first_saved() -> int | None:
        return next((s for s, _ in checkpoint.list_checkpoints(nodes[0])), None)

    kept = wait_while_running(first_saved, procs, timeout_s=60) or 0
    wait_for_steps(nodes[0], kept + 10, procs)  # training goes on past it
    metadata.set(PREEMPTED_PATH, "TRUE")  # GCE's preemption notice
    logs = [p.communicate(timeout=90)[0] for p in procs]
    assert all(p.returncode != 0 for p in procs), logs[0][-3000:]
    log = "".join(logs)
    said = log.split("maintenance notice: checkpoint at step ")
    assert len(said) == 2, log[-6000:]
    kept_step = int(said[1].split(",")[0])
    said = log.split("preemption notice (metadata server): stopped at step ")
    assert len(said) == 2, log[-6000:]
    step = int(said[1].split()[0])
    assert 20 <= kept_step == kept and kept + 10 <= step < 300  # saved, trained on, stopped
    saved = [checkpoint.list_checkpoints(out) for out in nodes]
    assert [[s for s, _ in node] for node in saved] == [[kept, step], [kept, step]]
    for n in (0, 1):  # each save holds one state on both nodes
        states = [checkpoint.load(node[n][1]) for node in saved]
        assert all(
            torch.equal(a, b)
            for a, b in zip(states[0]["model"].values(), states[1]["model"].values(), strict=True)
        )
    assert not (nodes[0] / "summary.json").exists()  # stopped, not finished
