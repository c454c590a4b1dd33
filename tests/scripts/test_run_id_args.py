"""Every command that takes a run id checks it with one function before it acts: a run id names a
folder (runs/<target>/<id>, the node's runs/<id>), so a path there would chmod, stop, read or
write outside the run's own folder."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from scripts.cli import main
from scripts.settings import Settings

HOSTILE = ["..", "../..", "/tmp", "a/b", ".hidden", "x\x1b]0;t", "", "-"]


@pytest.mark.parametrize(
    "argv",
    [
        ["results", "--local"],
        ["stop", "--local"],
        ["logs", "--local", "--run"],
        ["top", "--local", "--once", "--run"],
        ["report"],
        ["report", "--local"],
        ["train", "--local", "--resume"],
    ],
)
@pytest.mark.parametrize("run_id", HOSTILE)
def test_a_run_id_that_is_a_path_is_one_line_and_touches_nothing(
    argv: list[str],
    run_id: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    os.chmod(victim, 0o755)
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    args = [*argv, run_id]
    if run_id == "/tmp":
        args[-1] = str(victim)
    code = main(args, settings)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(err) == 1 and "not a run id" in err[0], err
    assert "\x1b" not in err[0]
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755
    assert not (tmp_path / "runs").exists()


def test_report_still_takes_a_results_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """RUN may also be a results dir (one holding job.json): the user's own path, not a run id."""
    results = tmp_path / "elsewhere" / "r1"
    results.mkdir(parents=True)
    (results / "job.json").write_text('{"run_id": "r1"}')
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    main(["report", str(results)], settings)
    assert "not a run id" not in capsys.readouterr().err


def test_results_and_stop_of_a_run_that_is_not_there_leave_last_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo is one line, as `top` says it, with nothing made at home; an older run's results
    come home without LAST_RUN (the newest run, which `logs` and `report` follow) moving to it."""
    monkeypatch.setenv("GPUTRAIN_NODE_ROOT", str(tmp_path / "node"))
    older = tmp_path / "node" / ".gputrain" / "runs" / "r-old"
    older.mkdir(parents=True)
    (older / "exitcode").write_text("0 1\n")
    local = tmp_path / "runs" / "local"
    local.mkdir(parents=True)
    (local / "LAST_RUN").write_text("r-new\n")
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    for command in ("results", "stop"):
        assert main([command, "--local", "nope3"], settings) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert err == ["gputrain: error: run nope3 does not exist on local (its head has no "
                       "directory for it)"]  # fmt: skip
    assert not (local / "nope3").exists()
    assert main(["results", "--local", "r-old"], settings) == 0
    assert (local / "r-old" / "local" / "exitcode").is_file()
    assert (local / "LAST_RUN").read_text() == "r-new\n"
