"""One writer at a time for a stack's run: a lease object in the stack's bucket, taken and renewed
with Cloud Storage's `ifGenerationMatch` precondition, so of two writers that read the same
generation exactly one write lands (the other gets HTTP 412). The laptop's controller holds it
while it lives; a `gputrain reconcile` pass takes it only when it is free or expired.

The lease's generation is the fencing token: every state write (the run's manifest) carries the
token it was made under and is itself conditioned on the manifest's generation, so a writer whose
lease was taken over (a paused or killed reconciler coming back) can no longer change the state.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infra.base.errors import GputrainError

if TYPE_CHECKING:
    from infra.gcp.gcs import StorageApi

LEASE = ".gputrain/lease.json"
CONTROLLER_TTL_S = 60.0  # the laptop's controller renews every third of it while it lives
RECONCILER_TTL_S = 300.0  # a pass renews it through long waits (VM boot, verify)


class LeaseLost(GputrainError):
    """Another writer took the lease: this one must stop writing state (fenced out)."""


@dataclass(frozen=True)
class Holder:
    """Who holds the lease, until when (the holder's own clock), under which token."""

    holder: str
    kind: str  # controller / reconciler
    run_id: str
    expires_at: float
    token: int = 0  # the lease object's generation when read

    def live(self, now: float) -> bool:
        return self.expires_at > now

    def line(self, now: float) -> str:
        """`the controller on HOST (run R) holds the lease for 42 s more`. Pure."""
        left = max(0.0, self.expires_at - now)
        return f"the {self.kind} {self.holder} (run {self.run_id}) holds the lease for {left:.0f} s more"


def holder_name(kind: str) -> str:
    """This process: host, pid and a random tail (two passes on one host differ)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Lease:
    """The stack's lease for one holder: `acquire` once, `renew` (or `keep_renewing`), `release`."""

    def __init__(
        self,
        storage: StorageApi,
        bucket: str,
        prefix: str,
        *,
        kind: str,
        run_id: str,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.storage, self.bucket, self.name = storage, bucket, prefix + LEASE
        self.kind, self.run_id, self.ttl_s, self.clock = kind, run_id, ttl_s, clock
        self.holder = holder_name(kind)
        self.token: int | None = None  # our generation of the lease object, while we hold it
        self._stop = threading.Event()
        self._renewing = threading.Lock()  # the renew thread's and a caller's: one at a time
        self._thread: threading.Thread | None = None
        self.lost = threading.Event()

    def current(self) -> Holder | None:
        """Who holds it now (possibly expired), None when nobody ever took it."""
        found = self.storage.read_versioned(self.bucket, self.name)
        if found is None:
            return None
        data, generation = found
        try:
            d: dict[str, Any] = json.loads(data)
            return Holder(
                str(d["holder"]),
                str(d["kind"]),
                str(d.get("run_id", "")),
                float(d["expires_at"]),
                generation,
            )
        except (ValueError, KeyError, TypeError):  # unreadable: treated as expired
            return Holder("?", "?", "?", 0.0, generation)

    def _body(self, expires_at: float) -> bytes:
        return json.dumps(
            {
                "holder": self.holder,
                "kind": self.kind,
                "run_id": self.run_id,
                "expires_at": expires_at,
            }
        ).encode()

    def acquire(self) -> Holder | None:
        """Take the lease if it is free, expired or ours: None on success, else who holds it
        (a live other holder, or the winner of a race for it)."""
        now = self.clock()
        held = self.current()
        if held is not None and held.live(now) and held.holder != self.holder:
            return held
        generation = 0 if held is None else held.token
        token = self.storage.write_if_generation(
            self.bucket, self.name, self._body(now + self.ttl_s), generation
        )
        if token is None:  # someone else wrote it between our read and our write
            return self.current() or Holder("?", "?", "?", now + self.ttl_s)
        self.token = token
        return None

    def renew(self) -> int:
        """Extend it; the new token. LeaseLost when another writer took it meanwhile (two renews
        at once would both write on one token, and one would take the other for a rival)."""
        with self._renewing:
            if self.token is None:
                raise LeaseLost("the lease was never taken")
            token = self.storage.write_if_generation(
                self.bucket, self.name, self._body(self.clock() + self.ttl_s), self.token
            )
            if token is None:
                self.lost.set()
                raise LeaseLost(f"the lease of gs://{self.bucket}/{self.name} was taken over")
            self.token = token
            return token

    def keep_renewing(self) -> None:
        """A thread renews it every third of its TTL until `release`; a lost lease sets `lost`."""

        def beat() -> None:
            while not self._stop.wait(self.ttl_s / 3):
                try:
                    self.renew()
                except LeaseLost:
                    return
                except Exception:  # the network, the credentials: the next beat retries
                    continue

        self._thread = threading.Thread(target=beat, daemon=True, name="lease")
        self._thread.start()

    def release(self) -> None:
        """Let go now (an expired body, written only if we still hold it): the next writer need
        not wait out the TTL. Errors are ignored: the TTL frees it anyway."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.token is not None and not self.lost.is_set():
            with contextlib.suppress(GputrainError):
                self.storage.write_if_generation(
                    self.bucket, self.name, self._body(0.0), self.token
                )
        self.token = None
