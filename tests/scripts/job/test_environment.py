"""Requirements + setup on a node (scripts/job/environment.py): the checks on the controller, and
the real node script run by `sh` through the local transport, pip installing from a local index."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.base.errors import UserError
from scripts.job.environment import EnvironmentSetupError, plan_environment
from scripts.job.environment_node import prepare_environment
from scripts.transport.local import LocalTransport
from tests.support.wheelhouse import PackageIndex, build_wheel

CODE = ".gputrain/code"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    root = tmp_path_factory.mktemp("index")
    with PackageIndex(root / "www") as idx:
        idx.add(build_wheel("gputrain-probe", root / "build"))
        yield idx


def _node(tmp_path: Path, files: dict[str, str]) -> LocalTransport:
    code = tmp_path / "node" / CODE
    code.mkdir(parents=True)
    for name, text in files.items():
        (code / name).write_text(text)
    return LocalTransport("n0", tmp_path / "node")


def _prepare(t: LocalTransport, index: PackageIndex, lines: list[str], **kw: object):  # type: ignore[no-untyped-def]
    env = plan_environment(t.node_root / CODE, **kw)  # type: ignore[arg-type]
    assert env is not None
    return prepare_environment(
        ["n0"],
        {"n0": t},
        env.for_python(sys.executable),
        python=sys.executable,
        code_dir=CODE,
        run_dir=".gputrain/runs/r1",
        extra_env={"PIP_INDEX_URL": index.url, "PIP_NO_CONFIG": "", "PIP_CONFIG_FILE": "/dev/null"},
        on_line=lambda node, line: lines.append(f"[{node}] {line}"),
    )["n0"]


def test_key_follows_what_is_installed_and_run(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("numpy>=1\n")
    a = plan_environment(tmp_path, setup="echo 1")
    assert a is not None and a.sources == ("requirements.txt",)
    assert plan_environment(tmp_path, setup="echo 1") == a
    assert plan_environment(tmp_path, setup="echo 2").key != a.key  # type: ignore[union-attr]
    assert a.for_python("/usr/bin/python3").key != a.for_python("/opt/py").key
    (tmp_path / "pyproject.toml").write_text("[project]\nname='x'\ndependencies=['tqdm']\n")
    b = plan_environment(tmp_path, setup="echo 1")
    assert b is not None and b.pyproject_deps == ("tqdm",) and b.key != a.key
    (tmp_path / "pyproject.toml").write_text("[project]\nname='y'\ndependencies=['tqdm']\n")
    assert plan_environment(tmp_path, setup="echo 1") == b  # only the dependencies count
    assert plan_environment(tmp_path, requirements=False) is None  # --no-requirements, no setup
    assert plan_environment(None) is None


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("requirements.txt", "numpy\ntorch>=2\nnot a = requirement\n", "requirements.txt line 3"),
        ("pyproject.toml", "[project\n", "pyproject.toml: not valid TOML"),
        ("pyproject.toml", "[project]\ndependencies=['ok', 'bad ==']\n", "'bad =='"),
    ],
)
def test_unparseable_requirements_are_one_line(
    tmp_path: Path, name: str, text: str, expected: str
) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(UserError) as e:
        plan_environment(tmp_path)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_options_and_urls_are_left_to_pip(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text(
        "# comment\n--extra-index-url http://x/simple\n-r other.txt\n./local\n"
        "pkg @ https://x/pkg.whl\nnumpy>=1 ; python_version > '3'  # why\nfoo[bar]==1.0 \\\n  ; os_name == 'posix'\n"
    )
    assert plan_environment(tmp_path) is not None


def test_installs_once_then_cached_and_torch_stays_visible(
    tmp_path: Path, index: PackageIndex
) -> None:
    t = _node(tmp_path, {"requirements.txt": "gputrain-probe==1.0\n"})
    setup = "python -c 'import gputrain_probe, torch; print(\"probe\", gputrain_probe.VERSION)'"
    lines: list[str] = []
    first = _prepare(t, index, lines, setup=setup)
    assert not first.cached
    assert any("Successfully installed gputrain-probe-1.0" in ln for ln in lines)
    assert "[n0] [setup] probe 1.0" in lines  # setup runs after, with the venv first on PATH
    log = tmp_path / "node/.gputrain/runs/r1/setup.log"
    assert "probe 1.0" in log.read_text()  # kept for the run's results
    lines.clear()
    second = _prepare(t, index, lines, setup=setup)
    assert second.cached and second.seconds < first.seconds / 10
    assert not any("[setup] probe" in ln for ln in lines)
    forced = _prepare(t, index, [], setup=setup, force=True)
    assert not forced.cached
    # the interpreter the run uses: the venv's, relative to the run's code snapshot
    env = plan_environment(t.node_root / CODE, setup=setup).for_python(sys.executable)  # type: ignore[union-attr]
    snapshot = tmp_path / "node/.gputrain/runs/r1/code"
    snapshot.mkdir(parents=True)
    py = Path(os.path.normpath(snapshot / env.python_rel))
    assert py == tmp_path / "node/.gputrain/envs" / env.key / "bin/python" and py.exists()


def test_a_package_that_does_not_exist_names_the_node(tmp_path: Path, index: PackageIndex) -> None:
    t = _node(tmp_path, {"requirements.txt": "gputrain-no-such-package==9\n"})
    with pytest.raises(EnvironmentSetupError) as e:
        _prepare(t, index, [])
    msg = str(e.value)
    assert msg.startswith("node n0: installing the requirements failed: requirements.txt")
    assert "gputrain-no-such-package" in msg and "\n" not in msg
    assert not list((tmp_path / "node/.gputrain/envs").glob("*/ready"))


def test_setup_failure_and_timeout_name_the_node(tmp_path: Path, index: PackageIndex) -> None:
    t = _node(tmp_path, {})
    with pytest.raises(EnvironmentSetupError) as e:
        _prepare(t, index, [], setup="echo before\nfalse\necho never")
    assert str(e.value).startswith("node n0: setup failed: exited with code 1")
    assert "before" in str(e.value) and "never" not in str(e.value)
    with pytest.raises(EnvironmentSetupError) as e:
        _prepare(t, index, [], setup="sleep 30", setup_timeout_s=1)
    assert str(e.value).startswith("node n0: setup failed: timed out after 1 s")


def test_uv_lock_is_exported_and_installed_where_uv_is(
    tmp_path: Path, index: PackageIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        pytest.skip("needs uv (pip install uv)")
    pyproject = (
        "[project]\nname = 'proj'\nversion = '0.1'\nrequires-python = '>=3.10'\n"
        "dependencies = ['gputrain-probe==1.0']\n"
    )
    t = _node(tmp_path, {"pyproject.toml": pyproject})
    code = t.node_root / CODE
    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    subprocess.run(
        [uv, "lock", "--index-url", index.url], cwd=code, env=env, check=True, capture_output=True
    )
    assert (code / "uv.lock").is_file()
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("PATH", f"{Path(uv).parent}:{os.environ['PATH']}")
    t = LocalTransport("n0", tmp_path / "node")  # sees the PATH with uv
    lines: list[str] = []
    _prepare(t, index, lines)
    built = next(p for p in (tmp_path / "node/.gputrain/envs").iterdir() if p.is_dir())
    assert "gputrain-probe==1.0" in (built / "uv-requirements.txt").read_text()
    assert any("Successfully installed gputrain-probe-1.0" in ln for ln in lines)
    # a node without uv says so and installs the pyproject's dependencies alone
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    lines.clear()
    _prepare(LocalTransport("n0", tmp_path / "node"), index, lines, force=True)
    assert "[n0] [requirements] no uv on this node: uv.lock skipped" in lines


def test_a_local_launch_builds_the_environment_then_runs_with_it(
    tmp_path: Path, index: PackageIndex
) -> None:
    """Through the launcher: the code goes first, the environment is built from it, and torchrun
    runs with the venv's interpreter (the rank imports what requirements.txt named)."""
    from scripts.connect import close_all, connect
    from scripts.job.launch import launch_torchrun
    from scripts.job.records import Job
    from tests.support.local_fleet import local_fleet

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "requirements.txt").write_text("gputrain-probe==1.0\n")
    (proj / "use_probe.py").write_text(
        "import sys, gputrain_probe\nprint('probe', gputrain_probe.VERSION, sys.prefix)\n"
    )
    fleet = local_fleet()
    env = plan_environment(proj, setup="echo setup here")
    job = Job(
        run_id="env-run",
        entry=("use_probe.py",),
        env={"PIP_INDEX_URL": index.url, "PIP_CONFIG_FILE": "/dev/null"},
        workdir=proj,
        include_trainer=False,
        environment=env,
    )
    ts = connect(fleet, deadline_s=10, local_root=tmp_path / "node")
    lines: list[str] = []
    try:
        for run_id in ("env-run", "env-run-2"):
            res = launch_torchrun(
                fleet,
                ts,
                Job(**{**job.__dict__, "run_id": run_id}),
                tmp_path / run_id,
                on_line=lambda n, ln: lines.append(ln),
                settle_s=0.5,
            )
            assert res.ok, lines[-20:]
    finally:
        close_all(ts)
    assert lines.count("[setup] setup here") == 1  # the second launch found it ready
    assert sum("skipped (cached)" in ln for ln in lines) == 1
    probe = [ln for ln in lines if "probe 1.0" in ln]
    assert len(probe) == 2 and all("/.gputrain/envs/" in ln for ln in probe)  # the venv's python
    assert (tmp_path / "env-run" / "local" / "setup.log").is_file()


@pytest.mark.parametrize(
    "leftover",
    [
        "sleep 45 &",  # a background process: it held the step's output open
        "setsid sh -c 'sleep 45 & echo $! > daemon.pid' < /dev/null > /dev/null 2>&1 &",  # a daemon
    ],
)
def test_what_setup_leaves_running_ends_with_it(
    tmp_path: Path, index: PackageIndex, leftover: str
) -> None:
    t = _node(tmp_path, {})
    started = time.monotonic()
    _prepare(t, index, [], setup=f"{leftover}\nsleep 0.5\necho done", setup_timeout_s=30)
    assert time.monotonic() - started < 20  # not the 45 s of what it left behind
    leftovers = subprocess.run(
        ["pgrep", "-f", "^sleep 45$"], capture_output=True, text=True
    ).stdout.split()
    mine = [p for p in leftovers if f"{tmp_path}" in _cwd(p)]
    assert mine == [], mine


def _cwd(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""
