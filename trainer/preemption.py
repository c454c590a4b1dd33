"""Why a rank should checkpoint and stop early: SIGTERM, or GCE's preemption notice.

GCE sends SIGTERM about 30 s before a spot VM stops; its metadata server flips
`instance/preempted` to TRUE at the same notice, which a long poll sees without waiting for the
signal to reach us through systemd and torchrun. Either one only sets a flag: the training loop
all-reduces it every step (`any_rank`), so every rank saves at the same step.

GPU VMs cannot live-migrate, so host maintenance terminates them; `instance/maintenance-event`
turns from NONE to TERMINATE_ON_HOST_MAINTENANCE at the notice. That asks for a checkpoint at
the next common step (not a stop: the VM runs until the maintenance window), so a recovery
repeats little.

The watchers run where the controller asks for them (GPUTRAIN_WATCH_PREEMPTION=1 on spot nodes,
GPUTRAIN_WATCH_MAINTENANCE=1 on every GCE node): off GCE there is no metadata server to ask, and
a probe would cost a timeout and stray traffic. GCE_METADATA_HOST (host[:port]) redirects them,
as it does google-auth.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import urllib.request
from collections.abc import Callable, Iterator
from types import FrameType

WATCH_ENV = "GPUTRAIN_WATCH_PREEMPTION"
WATCH_MAINTENANCE_ENV = "GPUTRAIN_WATCH_MAINTENANCE"
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
MAINTENANCE_PATH = "/computeMetadata/v1/instance/maintenance-event"
#: Signals the loop all-reduces (MAX) every step: nothing, save now, stop.
CARRY_ON, CHECKPOINT, STOP = 0, 1, 2


class StopRequest:
    """The first reason this process was asked to stop; read by the loop, set from anywhere."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.checkpoints_asked = 0  # maintenance notices seen
        self.checkpoints_taken = 0  # ... answered with a checkpoint
        self.checkpoint_reason = ""

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def request_checkpoint(self, reason: str) -> None:
        """Save at the next common step and carry on (a maintenance notice)."""
        self.checkpoint_reason = reason
        self.checkpoints_asked += 1

    @property
    def code(self) -> int:
        """STOP, CHECKPOINT or CARRY_ON: what this rank asks of the next step."""
        if self.requested:
            return STOP
        return CHECKPOINT if self.checkpoints_asked > self.checkpoints_taken else CARRY_ON

    @contextlib.contextmanager
    def handling(self, local_rank: int) -> Iterator[None]:
        """While the block runs, SIGTERM sets the flag instead of killing the process, and so does
        the preemption notice on a node where the watcher was asked for (one per node)."""

        def handler(signum: int, frame: FrameType | None) -> None:
            self.request("SIGTERM")

        previous = signal.signal(signal.SIGTERM, handler)
        watchers = []
        if local_rank == 0 and watch_requested():
            watchers.append(
                PreemptionWatcher(lambda: self.request("preemption notice (metadata server)"))
            )
        if local_rank == 0 and watch_requested(WATCH_MAINTENANCE_ENV):
            watchers.append(maintenance_watcher(self))
        for w in watchers:
            w.start()
        try:
            yield
        finally:
            for w in watchers:
                w.stop()
            signal.signal(signal.SIGTERM, previous)


def watch_requested(env: str = WATCH_ENV) -> bool:
    return os.environ.get(env, "").strip().lower() in ("1", "true", "yes", "on")


def maintenance_watcher(stop: StopRequest, host: str | None = None) -> PreemptionWatcher:
    """Watches `instance/maintenance-event`: every notice (NONE -> anything else) asks for a
    checkpoint; it keeps watching for the next one."""
    return PreemptionWatcher(
        lambda: stop.request_checkpoint("maintenance notice (metadata server)"),
        host=host,
        path=MAINTENANCE_PATH,
        fires=lambda value: value.upper() not in ("", "NONE"),
        once=False,
    )


def metadata_host() -> str:
    return os.environ.get("GCE_METADATA_HOST") or "metadata.google.internal"


class PreemptionWatcher(threading.Thread):
    """Long-polls `instance/preempted` and calls `on_preempted` once it reads TRUE (or another
    `path` and what `fires` there; `once=False`: on every change into firing, until stopped).

    Never raises into training: an absent or failing metadata server is reported once, then
    retried with backoff. A daemon thread, so a pending poll never holds the process up at exit.
    """

    def __init__(
        self,
        on_preempted: Callable[[], None],
        host: str | None = None,
        poll_timeout_s: int = 60,
        max_backoff_s: float = 30.0,
        *,
        path: str = PREEMPTED_PATH,
        fires: Callable[[str], bool] = lambda value: value.upper() == "TRUE",
        once: bool = True,
    ) -> None:
        super().__init__(name=f"gputrain-watch-{path.rsplit('/', 1)[-1]}", daemon=True)
        self.on_preempted = on_preempted
        self.fires, self.once = fires, once
        self.url = f"http://{host or metadata_host()}{path}"
        self.poll_timeout_s, self.max_backoff_s = poll_timeout_s, max_backoff_s
        self.preempted = threading.Event()
        self._halt = threading.Event()
        self.errors = 0

    def read(self, etag: str | None, wait: bool) -> tuple[str, str | None]:
        """The current value; with `wait`, once it differs from version `etag` (or on timeout)."""
        url = self.url
        if wait:
            url += f"?wait_for_change=true&timeout_sec={self.poll_timeout_s}"
            url += f"&last_etag={etag}" if etag else ""
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=self.poll_timeout_s + 10) as response:
            return response.read().decode().strip(), response.headers.get("ETag")

    def run(self) -> None:
        etag: str | None = None
        wait, backoff, firing = False, 1.0, False
        while not self._halt.is_set():
            try:
                value, etag = self.read(etag, wait)
            except (OSError, ValueError) as e:  # URLError and HTTPError are OSErrors
                self.errors += 1
                if self.errors == 1:
                    print(f"metadata watch: {self.url} unreachable ({e}); retrying", flush=True)
                self._halt.wait(backoff)
                backoff, wait = min(backoff * 2, self.max_backoff_s), False
                continue
            if self.fires(value) and not firing:
                self.preempted.set()
                self.on_preempted()
                if self.once:
                    return
            firing = self.fires(value)
            if wait and etag is None:  # a server without versions: poll gently, never spin
                self._halt.wait(1.0)
            wait, backoff = True, 1.0

    def stop(self) -> None:
        self._halt.set()
