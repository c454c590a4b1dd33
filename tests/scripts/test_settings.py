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


def test_a_directory_that_exists_keeps_its_mode_and_gets_no_gitignore(tmp_path: Path) -> None:
    """`--runs-dir ~` or a shared directory: gputrain made / 0700 and wrote a `*` .gitignore
    into it (which hides a dotfiles repository's every file from git)."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    (shared / "notes.txt").write_text("mine\n")
    run = Settings(root=tmp_path, runs_dir=shared).results_dir("local", "r1")
    assert shared.stat().st_mode & 0o777 == 0o755 and not (shared / ".gitignore").exists()
    assert run.stat().st_mode & 0o777 == 0o700 and (run.parent).stat().st_mode & 0o777 == 0o700
    assert (shared / ".gputrain-results").exists()  # still never uploaded as code


def test_gputrains_own_results_dir_gets_its_gitignore_back(tmp_path: Path) -> None:
    """A runs/ of gputrain's (its marker) that lost its .gitignore gets it at the next run."""
    runs = tmp_path / "runs"
    Settings(root=tmp_path, runs_dir=runs).results_dir("local", "r1")
    (runs / ".gitignore").unlink()
    Settings(root=tmp_path, runs_dir=runs).results_dir("local", "r2")
    assert (runs / ".gitignore").read_text() == "*\n" and runs.stat().st_mode & 0o777 == 0o700
