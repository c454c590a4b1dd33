"""`--resume` and `--resume-args` mean what they say on every target: `run --resume X` is one line
(not `--resume-args X` by abbreviation), `--resume-args` where nothing is ever relaunched is one
line, and `train --resume RUN --resume-args ARGS` continues the run with ARGS on --local too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.cli import main
from scripts.settings import Settings

VENV_BIN = Path(sys.executable).parent


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["run", "--local", "--resume", "20261127-000000-ab12", "--", "job.py"],
            "--resume 20261127-000000-ab12: `run` starts a new run; continue that one with "
            "`gputrain train --local --resume 20261127-000000-ab12`",
        ),
        (
            ["run", "--local", "--resume-args", "--init_from=resume", "--", "job.py"],
            "--resume-args: only a --stack run is relaunched",
        ),
        (
            ["train", "--hosts", "lab.yaml", "--resume-args=--x", "--", "job.py"],
            "--resume-args: only a --stack run is relaunched",
        ),
    ],
)
def test_resume_flags_that_would_be_misread_or_ignored_are_one_line(
    argv: list[str],
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "job.py").write_text("print('ran')\n")
    monkeypatch.chdir(tmp_path)
    assert main(argv, Settings(root=tmp_path, runs_dir=tmp_path / "runs")) == 2
    assert needle in one_line(capsys)
    assert not (tmp_path / "runs" / "local").exists()  # nothing started


def test_an_abbreviated_flag_is_not_another_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--local", "--resume-arg", "--x", "--", "job.py"], Settings(root=tmp_path))
    assert exit_.value.code == 2
    assert "unrecognized arguments: --resume-arg" in capsys.readouterr().err


def test_train_resume_on_local_passes_the_resume_args(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("import sys\nprint('argv', sys.argv[1:])\n")
    env = {k: v for k, v in os.environ.items() if k != "GPUTRAIN_NODE_ROOT"}
    env["HOME"] = str(tmp_path / "home")

    def gputrain(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(VENV_BIN / "gputrain"), *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    first = gputrain("run", "--local", "--", "job.py", "--steps=9")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "argv ['--steps=9']" in first.stdout
    run_id = (tmp_path / "runs" / "local" / "LAST_RUN").read_text().strip()
    again = gputrain(
        "train", "--local", "--resume", run_id, "--resume-args", "--init_from=resume 'a b'",
        "--", "job.py", "--steps=9",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    assert "argv ['--steps=9', '--init_from=resume', 'a b']" in again.stdout, again.stdout
    kept = tmp_path / "runs" / "local" / run_id / "local"
    assert "argv ['--steps=9']\n" in (kept / "torchrun.attempt1.log").read_text()  # not lost
    assert "--init_from=resume" in (kept / "torchrun.log").read_text()
    assert (kept / "exitcode.attempt1").is_file()
