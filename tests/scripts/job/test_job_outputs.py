"""A third-party trainer's outputs (issue 27, class 6): what the job writes beside its code comes
home, `{out}` in ENTRY names the run's out dir, and ENTRY is checked before anything is created."""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

import pytest

from infra.base.errors import UserError
from scripts.job.download import download_results
from scripts.job.node_scripts import build_upload_and_start_command, entry_argument
from scripts.job.sync import CodeBundle, check_entry
from scripts.transport.local import LocalTransport


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("--out_dir={out}", "--out_dir=/n/out"),
        ("{out}/ckpt.pt", "/n/out/ckpt.pt"),
        ("a{out}b{out}", "a/n/outb/n/out"),
        ("{{out}}", "{out}"),
        ("it's $HOME; {out}", "it's $HOME; /n/out"),
        ("plain 'arg' $X", "plain 'arg' $X"),
    ],
)
def test_the_out_placeholder_becomes_the_runs_out_dir_and_nothing_else_changes(
    arg: str, expected: str
) -> None:
    out = subprocess.run(
        ["sh", "-c", f"printf %s {entry_argument(arg)}"],
        capture_output=True,
        text=True,
        env={"GPUTRAIN_OUT": "/n/out", "HOME": "/h", "X": "x"},
        check=True,
    )
    assert out.stdout == expected


def test_files_the_job_creates_or_changes_in_its_working_dir_come_home(tmp_path: Path) -> None:
    node = LocalTransport("n0", tmp_path / "node")
    code = tmp_path / "node" / ".gputrain" / "code"
    (code / "data").mkdir(parents=True)
    (code / "train.py").write_text("x\n")
    (code / "data" / "input.txt").write_text("old\n")
    past = time.time() - 60
    for p in (code / "train.py", code / "data" / "input.txt"):
        import os

        os.utime(p, (past, past))
    job = (
        "echo $$ > pgid\nRUN=$(pwd)\ncd code\nsleep 0.05\n"
        "mkdir -p out __pycache__ && echo ckpt > out/ckpt.pt && echo c > __pycache__/m.pyc\n"
        "echo new > data/input.txt\necho 0 > $RUN/exitcode\necho 1 > $RUN/jobpid\n"
    )
    bundle = CodeBundle({}, run_script=job)
    r = node.run(build_upload_and_start_command("r1"), 30, stdin=bundle.payload(bundle.plan("")))
    assert r.ok, r.stderr
    run = tmp_path / "node" / ".gputrain" / "runs" / "r1"
    for _ in range(100):
        if (run / "exitcode").exists():
            break
        time.sleep(0.05)
    download_results({"n0": node}, "r1", tmp_path / "results")
    home = tmp_path / "results" / "n0" / "workdir"
    got = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    assert got == ["data/input.txt", "out/ckpt.pt"]
    assert (home / "out" / "ckpt.pt").read_text() == "ckpt\n"


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "train.py").write_text("print(1)\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "run.py").write_text("")
    (root / "data" / "train.bin").write_bytes(b"\0\0")
    (root / "data" / "small.txt").write_text("x")
    (root / "secret.py").write_text("x")
    (root / ".gitignore").write_text("data/train.bin\nsecret.py\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (["missing.py"], r"ENTRY missing\.py: no such file in .*proj"),
        (["secret.py"], r"ENTRY secret\.py: .*left out of the upload \(ignored by \.gitignore"),
        (["-m", "pkg.nope"], r"ENTRY -m pkg\.nope: .*no pkg/nope\.py"),
        (["-m"], r"ENTRY -m: .*module"),
        (["../outside.py"], r"ENTRY \.\./outside\.py: outside .*proj \(the directory that is up"),
        (["train.py/"], r"ENTRY train\.py/: no such file in .*proj"),
    ],
)
def test_a_missing_entry_is_refused_before_anything_is_created(
    tmp_path: Path, entry: list[str], match: str
) -> None:
    with pytest.raises(UserError, match=match):
        check_entry(tuple(entry), _project(tmp_path))


def test_a_module_name_the_system_refuses_is_only_not_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Longer than a file name may be: not in the upload, so it must be on the nodes (a warning),
    never an OSError."""
    check_entry(("-m", "z" * 300), _project(tmp_path))
    assert "not in" in capsys.readouterr().err


def test_a_module_the_local_python_lacks_is_refused_on_local_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--local`'s node is this Python: a module it cannot import fails the run for sure, so it
    is refused (exit 2) unless an image or the project's requirements may bring it; elsewhere
    the nodes may have it installed (a warning)."""
    from scripts.cli import main
    from scripts.settings import Settings

    root = _project(tmp_path)
    check_entry(("-m", "nope_not_installed"), root)
    assert "it must be installed on the nodes" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"ENTRY -m nope_not_installed: not in .*the Python --l"):
        check_entry(("-m", "nope_not_installed"), root, node_is_here=True)
    monkeypatch.chdir(root)
    settings = Settings(root=root, runs_dir=tmp_path / "runs")
    assert main(["run", "--local", "--", "-m", "nope_not_installed"], settings) == 2
    assert "the Python --local runs it with" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_good_entries_pass_and_data_the_upload_leaves_out_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _project(tmp_path)
    for entry in (
        ["train.py", "--data", "data/small.txt"],
        ["-m", "pkg.run"],
        ["-m", "pkg"],
        ["-m", "trainer.train", "--preset", "tiny"],
        ["-m", "json.tool"],  # installed on the nodes too
    ):
        check_entry(tuple(entry), root)
    assert "warning" not in capsys.readouterr().err
    check_entry(("train.py", "--data=data/train.bin", "--x", shlex.quote("data")), root)
    err = capsys.readouterr().err
    assert "data/train.bin" in err and ".gitignore" in err and "not be on the nodes" in err


def test_vertex_entry_expands_the_placeholder_alike() -> None:
    from gputrain_node.vertex_entry import expand_out

    assert expand_out("--out_dir={out}", "/w/out") == "--out_dir=/w/out"
    assert expand_out("{{out}} {out}", "/o") == "{out} /o"
