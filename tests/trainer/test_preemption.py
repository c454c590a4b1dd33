"""GCE's preemption notice: the metadata watcher against a local server that answers like the
metadata server, and a notice seen by one node stopping both nodes at the same step."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import torch

from tests.support.trainer_helpers import child_env, free_port, node_argv, start, wait_for_steps
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
    """`instance/preempted` as GCE serves it: Metadata-Flavor required, ETags, and
    `wait_for_change` (with `last_etag`, `timeout_sec`) holding the answer until the value changes."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str = PREEMPTED_PATH, value: str = "FALSE") -> None:
        super().__init__(("127.0.0.1", 0), MetadataHandler)
        self.path = path
        self.value = value
        self.changed = threading.Condition()
        self.requests: list[str] = []

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def etag(self) -> str:
        return f"etag-{self.value.lower()}"

    def set(self, value: str) -> None:
        with self.changed:
            self.value = value
            self.changed.notify_all()


class MetadataHandler(BaseHTTPRequestHandler):
    server: MetadataServer

    def do_GET(self) -> None:
        server, url = self.server, urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        server.requests.append(self.path)
        if url.path != server.path:
            return self.answer(404, "not found")
        if self.headers.get("Metadata-Flavor") != "Google":
            return self.answer(403, "Missing required header: Metadata-Flavor")
        if query.get("wait_for_change") == "true":
            seen = query.get("last_etag") or server.etag()
            with server.changed:
                server.changed.wait_for(
                    lambda: server.etag() != seen, timeout=float(query.get("timeout_sec", 300))
                )
        self.answer(200, server.value)

    def answer(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("ETag", self.server.etag())
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
    server.set("SHUTDOWN")  # releases held long polls
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
    metadata.set("TRUE")
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


def test_a_notice_on_one_node_makes_both_save_at_the_same_step(
    metadata: MetadataServer, tmp_path: Path
) -> None:
    port, args = free_port(), ["--log-every", "1", "--checkpoint-every", "1000"]
    envs = [child_env(tmp_path / f"node{n}") for n in (0, 1)]
    envs[1].update(GPUTRAIN_WATCH_PREEMPTION="1", GCE_METADATA_HOST=metadata.host)  # node 1 only
    procs = [start(node_argv(port, "preempt", args), env) for env in envs]
    wait_for_steps(tmp_path / "node0", 20, procs)
    metadata.set("TRUE")  # GCE's preemption notice
    logs = [p.communicate(timeout=90)[0] for p in procs]
    assert all(p.returncode != 0 for p in procs), logs[0][-3000:]
    said = logs[0].split("preemption notice (metadata server): stopped at step ")
    assert len(said) == 2, logs[0][-3000:] + logs[1][-3000:]
    step = int(said[1].split()[0])
    assert 20 <= step < 300
    saved = [checkpoint.list_checkpoints(tmp_path / f"node{n}")[-1] for n in (0, 1)]
    assert [s for s, _ in saved] == [step, step]
    states = [checkpoint.load(path) for _, path in saved]
    assert all(
        torch.equal(a, b)
        for a, b in zip(states[0]["model"].values(), states[1]["model"].values(), strict=True)
    )
    assert not (tmp_path / "node0" / "summary.json").exists()  # stopped, not finished


@pytest.fixture
def maintenance() -> Iterator[MetadataServer]:
    """`instance/maintenance-event` (NONE until a notice)."""
    server = MetadataServer(MAINTENANCE_PATH, "NONE")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.set("SHUTDOWN")
    server.shutdown()
    server.server_close()


def test_every_maintenance_notice_asks_for_one_checkpoint_and_never_a_stop(
    maintenance: MetadataServer,
) -> None:
    stop = StopRequest()
    watcher = maintenance_watcher(stop, host=maintenance.host)
    watcher.start()
    maintenance.set("TERMINATE_ON_HOST_MAINTENANCE")
    deadline = time.monotonic() + 10
    while stop.checkpoints_asked < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stop.checkpoints_asked == 1 and stop.code == 1 and not stop.requested
    stop.checkpoints_taken = 1
    seen = len(maintenance.requests)
    maintenance.set("NONE")  # the window passed; a later notice asks again
    while len(maintenance.requests) < seen + 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the watcher read NONE and polls again (etags are per value)
    maintenance.set("TERMINATE_ON_HOST_MAINTENANCE")
    while stop.checkpoints_asked < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stop.checkpoints_asked == 2 and watcher.is_alive()
    watcher.stop()


def test_a_maintenance_notice_on_one_node_saves_both_at_one_step_and_training_goes_on(
    maintenance: MetadataServer, tmp_path: Path
) -> None:
    steps = 120  # the notice comes at step 20 or so; the run then trains on to its end
    port, args = free_port(), ["--log-every", "1", "--checkpoint-every", "1000", "--steps"]
    args.append(str(steps))
    envs = [child_env(tmp_path / f"node{n}") for n in (0, 1)]
    envs[1].update(GPUTRAIN_WATCH_MAINTENANCE="1", GCE_METADATA_HOST=maintenance.host)
    procs = [start(node_argv(port, "maint", args), env) for env in envs]
    wait_for_steps(tmp_path / "node0", 20, procs)
    maintenance.set("TERMINATE_ON_HOST_MAINTENANCE")  # GCE's maintenance notice
    logs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs[0][-3000:] + logs[1][-3000:]
    said = logs[0].split("maintenance notice: checkpoint at step ")
    assert len(said) == 2, logs[0][-3000:]
    step = int(said[1].split(",")[0])
    saved = [[s for s, _ in checkpoint.list_checkpoints(tmp_path / f"node{n}")] for n in (0, 1)]
    assert all(step in s for s in saved) and 20 <= step < steps  # both saved at the notice's step
    assert (tmp_path / "node0" / "summary.json").exists()  # and trained on to the end
