"""Where results go: $GPUTRAIN_RUNS_DIR, else runs/ in the working directory (tests/testbed/
test_results_dir.py runs it end to end with --runs-dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.base.errors import UserError
from scripts.settings import Settings, user_path


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


def test_a_directory_of_the_users_gets_no_gitignore_at_later_runs_either(tmp_path: Path) -> None:
    """Its first run leaves the marker there; the marker a later run finds is not gputrain's
    word that it made the directory (a `*` .gitignore in a project hid all its code from git)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    for run_id in ("r1", "r2", "r3"):
        Settings(root=tmp_path, runs_dir=mine).results_dir("local", run_id)
    assert not (mine / ".gitignore").exists() and (mine / ".gputrain-results").exists()


def test_results_around_the_working_directory_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--runs-dir .`: the uploaded project itself. A directory above it holds the results
    beside the project, not in it (`..`, `~`), and one below it is the default runs/."""
    project = tmp_path / "repo" / "project"
    project.mkdir(parents=True)
    monkeypatch.chdir(project)
    for runs in (project, project / "sub" / ".."):
        with pytest.raises(UserError) as e:
            Settings(root=project, runs_dir=runs).check_results_home()
        assert "it is the working directory" in str(e.value)
        assert "other than the working directory" in str(e.value)
    for runs in (project / "runs", project / "..", tmp_path, tmp_path / "repo" / "results"):
        Settings(root=project, runs_dir=runs).check_results_home()
    assert not (project / ".gputrain-results").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_results_where_no_directory_can_be_made_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc looks writable to root, yet mkdir there fails: tried, not guessed from the mode."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"no directory can be made in /proc"):
        Settings(root=tmp_path, runs_dir=Path("/proc/runs")).check_results_home()


def test_a_home_directory_of_no_user_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match=r"--runs-dir ~nouser-gputrain/x: ~nouser-gputrain is no"):
        user_path("~nouser-gputrain/x", "--runs-dir")
    monkeypatch.setenv("GPUTRAIN_RUNS_DIR", "~nouser-gputrain")
    with pytest.raises(UserError, match=r"GPUTRAIN_RUNS_DIR ~nouser-gputrain:"):
        Settings()


def test_a_local_node_state_dir_that_cannot_be_made_names_its_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    monkeypatch.setenv("GPUTRAIN_NODE_ROOT", str(a_file))
    with pytest.raises(UserError, match=r"a-file is not a directory; .*\(GPUTRAIN_NODE_ROOT\)"):
        settings.check_local_node_root()
    monkeypatch.delenv("GPUTRAIN_NODE_ROOT")
    monkeypatch.setenv("XDG_STATE_HOME", str(a_file / "state"))
    with pytest.raises(UserError, match=r"not a directory; .*\(XDG_STATE_HOME, or GPUTRAIN_NODE"):
        settings.check_local_node_root()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    settings.check_local_node_root()
    assert not (tmp_path / "state").exists()  # checked, not made
