"""destroy_stack: refresh + destroy retried; before every retry its hook runs (the bucket emptied
again when a late writer refilled it), and a failing hook is said, not fatal."""

from __future__ import annotations

import pytest

from scripts.targets.stack.teardown import destroy_stack
from tests.support.fake_stack import FakeStackRunner


def test_the_hook_runs_before_each_retry_only(capsys: pytest.CaptureFixture[str]) -> None:
    runner = FakeStackRunner(destroy_failures=2)
    seen: list[int] = []

    def hook() -> tuple[str, ...]:
        seen.append(runner.call_names().count("destroy"))
        if len(seen) == 1:
            raise RuntimeError("the bucket could not be listed")
        return ()

    assert destroy_stack(runner, "dev", attempts=3, pause_s=0, before_retry=hook) is None
    assert seen == [1, 2]  # before attempts 2 and 3, never before the first
    assert runner.call_names().count("destroy") == 3
    err = capsys.readouterr().err
    assert "down: before destroy attempt 2: the bucket could not be listed" in err
