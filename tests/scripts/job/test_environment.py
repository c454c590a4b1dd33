"""The job's environment (scripts/job/environment.py). Requirements + setup on a node: the checks
on the controller, and the real node script run by `sh` through the local transport, pip installing
from a local index. Secrets: declared, resolved before anything exists (the environment or Secret
Manager through the real client against a fake with its REST shape), and a real local run whose
rank reads the value while it is found nowhere on disk, in no argv and no log line."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.base.errors import UserError
from scripts.job.environment import (
    ENDPOINT_ENV,
    EnvironmentSetupError,
    SecretRef,
    fetch_secret_manager,
    parse_secret,
    parse_secrets,
    plan_environment,
    redact,
    resolve_secrets,
)
from scripts.job.environment_node import prepare_environment
from scripts.job.launch import launch_torchrun
from scripts.job.records import Job
from scripts.targets.session import close_all, connect
from scripts.transport.local import LocalTransport
from tests.support import ROOT
from tests.support.fake_secretmanager import FakeSecretManager
from tests.support.local_fleet import local_fleet
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
        "# comment\n--extra-index-url http://x/simple\n-r other.txt\n./local\n-e .\n-c sub/c.txt\n"
        "--find-links /opt/wheels\n"
        "pkg @ https://x/pkg.whl\nnumpy>=1 ; python_version > '3'  # why\nfoo[bar]==1.0 \\\n  ; os_name == 'posix'\n"
    )
    assert plan_environment(tmp_path) is not None


@pytest.mark.parametrize(
    "line",
    [
        "-r /etc/passwd",
        "-r../../x.txt",
        "--requirement=/root/.ssh/id_rsa",
        "-c ~/.config/pip/constraints.txt",
        "--constraint ${HOME}/c.txt",
        "-e ../sibling",
        "--editable=/opt/lib",
        "/srv/wheels/pkg.whl",
        "pkg @ file:///etc/shadow",
        "-r sub/../../../etc/passwd",
    ],
)
def test_a_requirement_line_naming_a_file_outside_the_upload_is_one_line(
    tmp_path: Path, line: str
) -> None:
    """On the node pip would read that file (and print its lines in its error): not the code."""
    (tmp_path / "requirements.txt").write_text(f"numpy\n{line}\n")
    with pytest.raises(UserError) as e:
        plan_environment(tmp_path)
    message = str(e.value)
    assert (
        message.startswith("requirements.txt line 2: ") and "outside the uploaded code" in message
    )


def test_a_pyproject_file_dependency_outside_the_upload_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\nversion = "1"\ndependencies = ["lib @ file:///home/u/lib"]\n'
    )
    with pytest.raises(UserError, match="outside the uploaded code"):
        plan_environment(tmp_path)


def test_installs_once_then_cached_and_torch_stays_visible(
    tmp_path: Path, index: PackageIndex
) -> None:
    import torch

    t = _node(tmp_path, {"requirements.txt": "gputrain-probe==1.0\n"})
    setup = "python -c 'import gputrain_probe, torch; print(\"probe\", gputrain_probe.VERSION)'"
    lines: list[str] = []
    first = _prepare(t, index, lines, setup=setup)
    assert not first.cached
    assert any("Successfully installed gputrain-probe-1.0" in ln for ln in lines)
    assert "[n0] [setup] probe 1.0" in lines  # setup runs after, with the venv first on PATH
    log = tmp_path / "node/.gputrain/runs/r1/setup.log"
    assert "probe 1.0" in log.read_text()  # kept for the run's results
    # pip's own lines are in setup.log alone; the console has its verdict in one line per node
    assert "Collecting gputrain-probe" in log.read_text()
    assert not any("Collecting" in ln or "Installing collected" in ln for ln in lines)
    assert [ln for ln in lines if ln.startswith("[n0] [requirements]")] == [
        f"[n0] [requirements] building environment {first_key(t)} for python "
        f"{sys.version.split()[0]} {sys.executable}: installing requirements.txt "
        "(pip's output: setup.log)",
        f"[n0] [requirements] the node's torch {torch.__version__} stays (pinned with its 0 CUDA "
        "runtime package(s)): pip picks what fits it",
        "[n0] [requirements] Successfully installed gputrain-probe-1.0",
    ]
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


@pytest.fixture(scope="module")
def vision_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    """A torch newer than the node's, a torchvision built for it (the newest) and one built for
    the node's torch (2.13), as on PyPI the day a new torch is out."""
    root = tmp_path_factory.mktemp("vision")
    with PackageIndex(root / "www") as idx:
        idx.add(build_wheel("torch", root / "t214", version="2.14.0"))
        for version, torch in (("0.29.0", "2.14.0"), ("0.28.0", "2.13.0")):
            wheel = build_wheel(
                "torchvision", root / version, version=version, dependencies=(f"torch=={torch}",)
            )
            idx.add(wheel)
        yield idx


def test_an_unpinned_torchvision_fits_the_nodes_torch_without_a_torch_download(
    tmp_path: Path, vision_index: PackageIndex, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    node_torch = torch.__version__
    t = _node(tmp_path, {"requirements.txt": "torchvision\n"})
    lines: list[str] = []
    first = _prepare(t, vision_index, lines)
    assert f"[n0] [requirements] the node's torch {node_torch} stays" in "\n".join(lines)
    assert any("Successfully installed torchvision-0.28.0" in ln for ln in lines), lines
    assert not [r for r in vision_index.requests if r.endswith(".whl") and "/torch/" in r]
    env = tmp_path / "node/.gputrain/envs"
    [pins] = env.glob("*/node-pins.txt")
    assert pins.read_text().startswith(f"torch=={node_torch}\n")
    out = capsys.readouterr().out
    assert f"with the node's torch {node_torch}" in out
    lines.clear()
    second = _prepare(t, vision_index, lines)
    assert second.cached and f"with the node's torch {node_torch} (cached on n0)" in (
        capsys.readouterr().out
    )
    with capsys.disabled():  # the figures: the environment step, first and cached
        print(
            f"\nenvironment step (unpinned torchvision, node torch {node_torch}): first "
            f"{first.seconds:.1f} s (torchvision 0.28.0, no torch download), second "
            f"{second.seconds:.2f} s (cache hit: {second.cached})"
        )


def test_a_requirement_that_needs_another_torch_fails_in_one_line(
    tmp_path: Path, vision_index: PackageIndex
) -> None:
    import torch

    t = _node(tmp_path, {"requirements.txt": "torchvision==0.29.0\n"})
    with pytest.raises(EnvironmentSetupError) as e:
        _prepare(t, vision_index, [])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(
        "node n0: installing the requirements failed: requirements.txt: "
    )
    assert "torchvision 0.29.0 depends on torch==2.14.0" in msg
    assert f"the node has torch=={torch.__version__}" in msg
    assert f"the node's torch {torch.__version__} stays: ask for versions built for it " in msg
    assert "(torchvision 0.28.*, torchaudio 2.13.*)" in msg
    assert not [r for r in vision_index.requests if r.endswith(".whl") and "/torch/" in r]


def first_key(t: LocalTransport) -> str:
    return next(p.name for p in (t.node_root / ".gputrain/envs").iterdir() if p.is_dir())


def test_gputrain_own_checkout_sends_none_of_its_dependencies_to_the_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make run` from gputrain's checkout: its pyproject.toml lists the controller's Pulumi and
    Google clients, which no node needs; nothing is planned from it."""
    assert plan_environment(ROOT) is None
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    assert plan_environment(tmp_path) is None
    assert "gputrain's own project" in capsys.readouterr().out
    with_setup = plan_environment(tmp_path, setup="echo hi")
    assert with_setup is not None
    assert (with_setup.pyproject_deps, with_setup.sources) == ((), ())
    # a user's project of another name keeps its dependencies
    (tmp_path / "pyproject.toml").write_text("[project]\nname='mine'\ndependencies=['tqdm']\n")
    assert plan_environment(tmp_path).pyproject_deps == ("tqdm",)  # type: ignore[union-attr]


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


def test_index_credentials_come_on_the_secret_channel_and_no_value_is_in_an_argv(
    tmp_path: Path, index: PackageIndex
) -> None:
    """PIP_INDEX_URL with a password as a secret: pip installs from it; the setup sees the --env
    values; no process on the node has a value in its argv meanwhile; no line shows the password."""
    t = _node(tmp_path, {"requirements.txt": "gputrain-probe==1.0\n"})
    # a process may end between the glob and the read: that is not the setup's failure (sh -e)
    argv_dump = (
        'for p in /proc/[0-9]*; do { tr "\\0" " " < "$p/cmdline"; } 2>/dev/null || true; echo; done'
    )
    env = plan_environment(
        t.node_root / CODE, setup=f'{argv_dump} > argv.txt\necho "$MODE" > seen.txt'
    )
    assert env is not None
    url = index.url.replace("http://", "http://gputrain:s3cret-pw@")
    lines: list[str] = []
    prepare_environment(
        ["n0"],
        {"n0": t},
        env.for_python(sys.executable),
        python=sys.executable,
        code_dir=CODE,
        run_dir=".gputrain/runs/r1",
        extra_env={"MODE": "fast-mode-x1", "PIP_NO_CONFIG": "", "PIP_CONFIG_FILE": "/dev/null"},
        secrets={"PIP_INDEX_URL": url},
        on_line=lambda node, line: lines.append(line),
    )
    code = t.node_root / CODE
    assert any("Successfully installed gputrain-probe-1.0" in ln for ln in lines), lines
    assert (code / "seen.txt").read_text() == "fast-mode-x1\n"
    argv = (code / "argv.txt").read_text()
    assert "for p in /proc" in argv  # the dump saw the node's processes
    assert "s3cret-pw" not in argv and "fast-mode-x1" not in argv
    assert not any("s3cret-pw" in ln for ln in lines)


def test_a_local_launch_builds_the_environment_then_runs_with_it(
    tmp_path: Path, index: PackageIndex
) -> None:
    """Through the launcher: the code goes first, the environment is built from it, and torchrun
    runs with the venv's interpreter (the rank imports what requirements.txt named)."""
    from scripts.job.launch import launch_torchrun
    from scripts.job.records import Job
    from scripts.targets.session import close_all, connect
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


REPO = Path(__file__).resolve().parents[3]
#: shell- and regex-hostile, with a newline inside: it must arrive byte for byte
VALUE = "s3cr3t-'q\" $HOME `id` ; * \\n\nsecond line-" + os.urandom(6).hex()


@pytest.fixture
def secret_manager(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSecretManager]:
    with FakeSecretManager() as fake:
        monkeypatch.setenv(ENDPOINT_ENV, fake.url)
        yield fake


def test_declarations() -> None:
    assert parse_secret("HF_TOKEN", "secrets") == SecretRef("HF_TOKEN")
    assert parse_secret("T=sm://hf-token", "secrets") == SecretRef("T", "hf-token", "latest")
    assert parse_secret("T=sm://hf-token/3", "s") == SecretRef("T", "hf-token", "3")
    full = parse_secret("T=sm://projects/p1/secrets/x/versions/2", "s")
    assert full == SecretRef("T", "x", "2", "p1")
    for bad in ("1X", "A-B", "X=sm://", "X=sm://a/b/c", "X=sm://a/v0"):
        with pytest.raises(UserError) as e:
            parse_secret(bad, "--secret")
        assert str(e.value).startswith(f"--secret: {bad!r} is not allowed")
    assert [r.name for r in parse_secrets(["A", "B=sm://b"], "s")] == ["A", "B"]
    for twice in (["A", "B", "A=sm://a"], ["H=sm://a", "H=sm://b"], ["A", " A"]):
        with pytest.raises(UserError, match=r"^s: (A|H) is given twice; allowed: each name once"):
            parse_secrets(twice, "s")
    # a stack that names one twice: refused with the stack's settings, never only b granted
    from infra.spec import SpecError, parse_spec
    from tests.support.pulumi_mocks import deployable_config

    both = json.dumps(["HF_TOKEN=sm://a", "HF_TOKEN=sm://b"])
    with pytest.raises(SpecError, match=r"^gputrain:secrets: HF_TOKEN is given twice"):
        parse_spec(deployable_config("vertex", secrets=both), "vertex")


@pytest.mark.parametrize(
    "bad",
    [
        "X=sm://projects/../secrets/x",
        "X=sm://projects/p1/../secrets/x",
        "X=sm://../x",
        "X=sm://projects/p1/secrets/../versions/1",
        "X=sm://projects/a..b/secrets/x",
        "X=sm://x/../../1",
    ],
)
def test_sm_references_with_dot_dot_are_one_line(bad: str) -> None:
    with pytest.raises(UserError, match=r"^--secret: 'X=sm://.*' is not allowed"):
        parse_secret(bad, "--secret")


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("GPUTRAIN_SECRET_NAMES", "gputrain's own"),  # it turned the node's redaction off
        ("GPUTRAIN_ANYTHING", "gputrain's own"),
        ("IFS", "the shell's own"),
        ("BASH_ENV", "the shell's own"),
        ("RANK", "set on the node"),
        ("HOME", "set on the node"),
        ("PATH=sm://p", "set on the node"),
    ],
)
def test_reserved_and_shell_names_are_refused_as_secrets(entry: str, why: str) -> None:
    with pytest.raises(UserError, match=why) as e:
        parse_secret(entry, "secrets")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("entry", ["HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz012345", "K=p@ss w0rd"])
def test_a_value_pasted_where_a_reference_goes_is_never_echoed(entry: str) -> None:
    with pytest.raises(UserError) as e:
        parse_secret(entry, "secrets")
    assert entry.split("=", 1)[1] not in str(e.value)
    assert str(e.value).startswith(f"secrets: '{entry.split('=')[0]}=...' is not allowed")


def test_unset_secret_is_one_line_naming_it() -> None:
    with pytest.raises(UserError) as e:
        resolve_secrets([SecretRef("WANDB_API_KEY")], project=None, environ={})
    assert str(e.value).startswith("secret WANDB_API_KEY: the environment variable WANDB_API_KEY")
    assert resolve_secrets([SecretRef("A")], project=None, environ={"A": ""}) == {"A": ""}


def test_secret_manager_through_the_real_client(secret_manager: FakeSecretManager) -> None:
    secret_manager.add("proj", "hf-token", "old")
    secret_manager.add("proj", "hf-token", VALUE)
    refs = parse_secrets(["A=sm://hf-token", "B=sm://hf-token/1"], "secrets")
    assert resolve_secrets(refs, project="proj", environ={}) == {"A": VALUE, "B": "old"}
    with pytest.raises(UserError) as e:
        resolve_secrets(parse_secrets(["A=sm://nope"], "s"), project="proj", environ={})
    assert "projects/proj/secrets/nope/versions/latest: not found" in str(e.value)
    secret_manager.add("proj", "locked", "x")
    secret_manager.denied.add("locked")
    with pytest.raises(UserError) as e:
        resolve_secrets(parse_secrets(["A=sm://locked"], "s"), project="proj", environ={})
    assert "access refused" in str(e.value) and "secretAccessor" in str(e.value)
    with pytest.raises(UserError) as e:
        resolve_secrets(parse_secrets(["A=sm://x"], "s"), project=None, environ={})
    assert "needs a project" in str(e.value)


def test_a_secret_manager_that_does_not_answer_is_one_line_within_the_deadline(
    secret_manager: FakeSecretManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage (503s until the retries' deadline: the client's RetryError) and a refused
    connection are each one line naming the resource, never a traceback (issue 39, 5)."""
    secret_manager.add("proj", "hf-token", "x")
    secret_manager.unavailable.add("hf-token")
    started = time.monotonic()
    with pytest.raises(UserError) as e:
        fetch_secret_manager("proj", "hf-token", "latest", deadline_s=2)
    assert time.monotonic() - started < 15
    text = str(e.value)
    assert text.startswith("secret projects/proj/secrets/hf-token/versions/latest: Secret Manager")
    assert "did not answer (" in text and "\n" not in text
    assert len([r for r in secret_manager.requests if "hf-token" in r]) >= 2  # it did retry
    monkeypatch.setenv(ENDPOINT_ENV, "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(UserError) as e:
        fetch_secret_manager("proj", "hf-token", "latest", deadline_s=2)
    assert "did not answer (" in str(e.value) and "\n" not in str(e.value)


def test_redact_longest_first() -> None:
    assert redact("a abc b", ["abc", "ab"]) == "a *** b"


def _everything_on_disk(roots: list[Path], needle: bytes) -> list[str]:
    hits = []
    for root in roots:
        for p in root.rglob("*"):
            if p.is_file() and not p.is_symlink():
                try:
                    if needle in p.read_bytes():
                        hits.append(str(p))
                except OSError:
                    pass
    return hits


def test_local_run_reads_the_secret_and_it_is_nowhere(tmp_path: Path) -> None:
    node_root = tmp_path / "node"
    fleet = local_fleet()
    ts = connect(fleet, deadline_s=10, local_root=node_root)
    lines: list[str] = []
    seen_argv: list[bytes] = []
    stop = threading.Event()
    first_line = VALUE.splitlines()[0].encode()

    def watch_argv() -> None:  # every process's argv while the job runs
        while not stop.is_set():
            for d in Path("/proc").iterdir():
                if d.name.isdigit():
                    try:
                        argv = (d / "cmdline").read_bytes()
                    except OSError:
                        continue
                    if first_line in argv:
                        seen_argv.append(argv)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_argv, daemon=True)
    watcher.start()
    job = Job(
        run_id="secret-run",
        entry=("tests/support/jobs/read_secret.py",),
        env={"SECRET_NAME": "GPUTRAIN_TEST_TOKEN"},
        workdir=REPO,
        include_trainer=False,
        secrets={"GPUTRAIN_TEST_TOKEN": VALUE},
    )
    try:
        res = launch_torchrun(
            fleet, ts, job, tmp_path / "results", on_line=lambda n, ln: lines.append(ln)
        )
    finally:
        stop.set()
        watcher.join()
        close_all(ts)
    assert res.ok
    out = json.loads(next((tmp_path / "results").rglob("secret.json")).read_text())
    assert out["sha256"] == hashlib.sha256(VALUE.encode()).hexdigest()  # the rank read it whole
    assert any("the token is ***" in ln for ln in lines), lines  # printed by the rank: redacted
    assert not [ln for ln in lines if first_line.decode() in ln]
    assert not seen_argv
    assert not _everything_on_disk([node_root, tmp_path / "results"], first_line)
    log = next((tmp_path / "results").rglob("torchrun.log")).read_text()
    assert "the token is ***" in log  # the node's own log was filtered before it was written


def test_every_secret_name_arrives_whole_on_the_node() -> None:
    """The start script's own variables are GPUTRAIN_* (no secret may take one): secrets named
    like them before (h, n, v) arrived empty; they arrive whole now, and nothing else is left."""
    import subprocess

    from scripts.job.environment import READ_SECRETS_SH, secret_stdin

    values = {"n": "one", "v": "two words", "h": "th=ree\nlines", "HF_TOKEN": "hf_x"}
    script = READ_SECRETS_SH.format(failed=9) + 'for k in n v h HF_TOKEN; do printenv "$k"; done; '
    script += 'echo "names:$GPUTRAIN_SECRET_NAMES left:${GPUTRAIN_N-}${GPUTRAIN_V-}"'
    done = subprocess.run(
        ["bash", "-c", script], input=secret_stdin(values), capture_output=True, check=True
    )
    assert done.stdout.decode().splitlines() == [
        "one",
        "two words",
        "th=ree",
        "lines",
        "hf_x",
        "names: n v h HF_TOKEN left:",
    ]
