"""Where results go: $GPUTRAIN_RUNS_DIR, else runs/ in the working directory (tests/testbed/
test_results_dir.py runs it end to end with --runs-dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.settings import Settings


def test_the_results_dir_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUTRAIN_RUNS_DIR", raising=False)
    assert Settings().runs_dir == tmp_path / "runs"
    monkeypatch.setenv("GPUTRAIN_RUNS_DIR", "~/gputrain-results")
    assert Settings().runs_dir == Path.home() / "gputrain-results"


def test_the_results_dir_is_ignored_by_git_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    settings.results_dir("local", "r1")
    settings.results_dir("stack-dev", "r2")
    out = capsys.readouterr().out
    assert out.count("git ignores it") == 1 and "GPUTRAIN_RUNS_DIR" in out
    assert (tmp_path / "runs" / ".gitignore").read_text() == "*\n"
