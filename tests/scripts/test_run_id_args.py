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
