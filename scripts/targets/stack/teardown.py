"""How every stack ends (StackTarget.teardown runs the sequence): refresh + destroy, retried, a
stale lock cleared when the user said so; then one line that the stack is gone, or an error naming
everything that is not and what still ends it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from infra.base.errors import GputrainError
from infra.base.retry import GaveUp, Waiting, every, poll_until
from scripts import ui
from scripts.targets.stack.bucket import KeptBucket
from scripts.targets.stack.clients import (
    PulumiMissingError,
    StackLockedError,
    StackMissingError,
    StackRunner,
    pulumi_line,
)
from scripts.targets.stack.pulumi_process import PulumiStuckError


def end_teardown(
    stack: str,
    failure: GaveUp | None,
    leftovers: int,
    kept: KeptBucket | None,
    *,
    unswept: str | None = None,
    bound: str = "",
) -> None:
    """Say the stack is gone (all but a kept bucket), or raise naming everything that is not;
    `unswept`: why the sweep could not look (then nothing says the stack is gone); `bound`: what
    ends its machines server-side all the same."""
    problem = kept.problem if kept else None
    if failure is not None or leftovers or problem or unswept:
        raise GputrainError(
            f"teardown of stack {stack} is incomplete: "
            + (f"destroy failed ({failure.reason}); " if failure else "")
            + (f"{leftovers} resource(s) still exist (listed above); " if leftovers else "")
            + (f"the sweep could not look for what is left ({unswept}); " if unswept else "")
            + (f"bucket gs://{kept.name} kept: {problem}; " if kept and problem else "")
            + (f"{bound}; " if bound else "")
            + f"run `gputrain down --stack {stack}` again or delete them in the console."
        )
    left = f", all but its bucket gs://{kept.name}" if kept else "; sweep found nothing left"
    ui.say(f"down: stack {stack} destroyed{left}")


def destroy_stack(
    runner: StackRunner,
    stack: str,
    *,
    attempts: int,
    pause_s: float,
    clear_stale_lock: bool = False,
    keep_types: Sequence[str] = (),
    before_retry: Callable[[], Sequence[str]] | None = None,
) -> GaveUp | None:
    """refresh + destroy (all but `keep_types`), retried; the last failure, or None. Any target
    made of a Pulumi stack (GCE, Vertex AI) ends this way. `before_retry`: run before every
    attempt after the first (e.g. the bucket emptied again: a late writer refilled it); the
    resource types it returns are kept too from then on (a bucket it could not empty)."""
    attempts_made = 0
    keep = tuple(keep_types)

    def destroy() -> None:
        nonlocal attempts_made, clear_stale_lock, keep
        attempts_made += 1
        if attempts_made > 1 and before_retry is not None:
            try:
                keep += tuple(t for t in before_retry() if t not in keep)
            except Exception as e:  # the destroy itself says what is left
                ui.warn(f"down: before destroy attempt {attempts_made}: {e}")
        ui.say(f"down: destroying stack {stack} (attempt {attempts_made})")
        try:
            runner.refresh(on_output=None)
            runner.destroy(on_output=pulumi_line, keep=keep)
        except StackLockedError:
            if not clear_stale_lock:
                raise
            clear_stale_lock = False  # once: a lock that comes back is someone's live update
            ui.say(
                f"down: stack {stack} is locked by an update that is no longer running; "
                "clearing the lock (pulumi cancel) and destroying again"
            )
            runner.cancel()
            runner.refresh(on_output=None)
            runner.destroy(on_output=pulumi_line, keep=keep)

    def failed(w: Waiting) -> None:
        ui.warn(f"destroy attempt {w.attempts} failed: {w.reason}")

    try:
        poll_until(
            destroy,
            max_attempts=attempts,
            delay=every(pause_s),
            retry_on=(Exception,),
            fatal=(PulumiMissingError, PulumiStuckError, StackMissingError),
            on_wait=failed,
        )
    except GaveUp as e:
        ui.warn(f"destroy attempt {e.attempts} failed: {e.reason}")
        return e
    except StackMissingError:  # no state: nothing for Pulumi to destroy; the sweep still looks
        ui.say(f"down: stack {stack} has no Pulumi state: nothing to destroy")
    except (PulumiMissingError, PulumiStuckError) as e:  # not retried; the sweep still looks
        ui.warn(f"destroy attempt {attempts_made} failed: {e}")
        return GaveUp(str(e), 0.0, attempts_made)
    return None
