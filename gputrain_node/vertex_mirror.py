"""A Vertex AI replica's out dir for a trainer other than ours: kept in the bucket while it runs
and back on the replica's next start, which is how its checkpoints outlive the VM when Vertex
restarts the replica elsewhere or retries the job.

The session sets GPUTRAIN_OUT_URI (gs://<bucket>/runs/<run-id>/out/) only for such entries: the
reference trainer uploads its own checkpoints to AIP_CHECKPOINT_DIR. Each replica mirrors to
<uri>/<replica>/ (chief, worker-1, ..., evaluator-0: the names its log lines carry). The
replica's start count lives beside its files (`.gputrain-attempt`, sent at once), so every start
after the first knows it is one: GPUTRAIN_ATTEMPT is its number and GPUTRAIN_RESUME_ARGS (a JSON
list, `--resume-args`) is appended to ENTRY, as on GCE.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gputrain_node.contract import RESUME_ARGS_ENV
from gputrain_node.mirror_out import Mirror, Target, Wake, run

ATTEMPT_FILE = ".gputrain-attempt"  # in the out dir: how many times this replica has started


class InputError(Exception):
    """A malformed setting of the job's environment or entry; the message names it. The node
    package's own: the job's `trainer` may be the user's, not gputrain's."""

    exit_code = 2


def replica_name(node_rank: int) -> str:
    """The replica's name in the bucket, as in its log lines: chief, worker-1, ... Pure."""
    return "chief" if node_rank == 0 else f"worker-{node_rank}"


def resume_args(env: Mapping[str, str]) -> list[str]:
    """GPUTRAIN_RESUME_ARGS as a list of strings; anything else is one line naming it."""
    text = env.get(RESUME_ARGS_ENV) or "[]"
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise InputError(f"{RESUME_ARGS_ENV} {text!r}: expected a JSON list of strings")
    return value


class ReplicaOutputs:
    """restore() before torchrun (the attempt number), start() beside it, stop() after it; a
    SIGTERM (Vertex stopping the replica) calls flush() so the grace period goes to uploading."""

    def __init__(
        self,
        out: Path,
        uri: str,
        replica: str,
        *,
        interval_s: float = 10.0,
        client: Any = None,
        say: Callable[[str], None] = lambda s: print(f"vertex: {s}", flush=True),
    ) -> None:
        target = Target.parse(uri.rstrip("/") + f"/{replica}/")
        out.mkdir(parents=True, exist_ok=True)
        self.mirror = Mirror(out, target, client, say)
        self.interval_s = interval_s
        self.wake = Wake()
        self.thread: threading.Thread | None = None

    @property
    def uri(self) -> str:
        return self.mirror.target.uri

    def restore(self) -> int:
        """What the bucket holds of this replica's out dir and the disk lacks comes back; then
        its start is counted and sent at once. Returns the attempt: 1, 2, ..."""
        got = self.mirror.restore()
        marker = self.mirror.root / ATTEMPT_FILE
        try:
            attempt = int(marker.read_text().strip() or 0) + 1
        except (OSError, ValueError):
            attempt = 1
        marker.write_text(f"{attempt}\n")
        st = marker.stat()
        self.mirror.send(ATTEMPT_FILE, (st.st_size, st.st_mtime_ns))  # the passes skip it now
        if got or attempt > 1:
            self.mirror.say(f"attempt {attempt}: restored {len(got)} file(s) from {self.uri}")
        else:
            self.mirror.say(f"attempt 1: the out dir is mirrored to {self.uri}")
        return attempt

    def start(self) -> None:
        self.thread = threading.Thread(
            target=run, args=([self.mirror], self.interval_s, self.wake), daemon=True
        )
        self.thread.start()

    def flush(self) -> None:
        self.wake.set(self.wake.notice)

    def stop(self, timeout_s: float = 300.0) -> None:
        """The job has ended: the last pass (files that held still for half a second), then the
        thread ends."""
        if self.thread is not None:
            self.wake.set(self.wake.ended)
            self.thread.join(timeout_s)
