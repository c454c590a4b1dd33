"""gputrain's own files stay out of the user's repository (issue 38, part 5): results go to
runs/, which git ignores (said once, when it is made), never named again by the upload; or
wherever --runs-dir (GPUTRAIN_RUNS_DIR) puts them. End to end on the stack world."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from tests.support.stack_world import World, assert_torn_down


def test_results_stay_out_of_the_users_repository(
    world: Callable[..., World],
    capsys: pytest.CaptureFixture[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    w = world()

    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", "-C", str(w.dir), "-c", "user.name=u", "-c", "user.email=u@example.com", *argv],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "the user's project")
    assert w.run_job("done") == 0
    first = capsys.readouterr().out
    elsewhere = tmp_path_factory.mktemp("results") / "gputrain-runs"
    assert w.run_job("done", "--runs-dir", str(elsewhere)) == 0
    second = capsys.readouterr().out
    assert first.count("git ignores it") == 1, first[-3000:]
    assert "not sending runs/" not in first + second
    assert git("status", "--porcelain", "--untracked-files=all") == ""
    assert (w.dir / "runs" / "stack-e2e" / "LAST_RUN").is_file()
    run_id = (elsewhere / "stack-e2e" / "LAST_RUN").read_text().strip()
    assert list((elsewhere / "stack-e2e" / run_id).rglob("summary.json"))  # came home there
    assert not (w.dir / "runs" / "stack-e2e" / run_id).exists()
    assert_torn_down(w)
