"""gputrain_node.vertex_entry's setup step on one replica, as Vertex starts it (a real process, the real
Secret Manager client against the fake): the commands run in the job's working directory before
torchrun, never with the job's secrets, which the training then has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputrain_node import vertex_setup
from gputrain_node.vertex_entry import SECRET_ENDPOINT_ENV, SECRET_REFS_ENV
from gputrain_node.vertex_setup import SETUP_ENV, SETUP_TIMEOUT_ENV
from tests.support import alive
from tests.support.fake_secretmanager import FakeSecretManager
from tests.support.trainer_helpers import ROOT, child_env


def test_setup_runs_in_the_code_dir_without_the_secrets_the_training_gets(tmp_path: Path) -> None:
    site = tmp_path / "site"
    root = site / "gputrain_code" / "files"
    root.mkdir(parents=True)
    (site / "gputrain_code" / "__init__.py").write_text(
        "from pathlib import Path\nROOT = Path(__file__).resolve().parent / 'files'\n"
    )
    (root / "show.py").write_text(
        "import os\nfrom pathlib import Path\n"
        "print('made:', Path('made.txt').read_text().strip(), 'token:', os.environ['HF'], "
        "flush=True)\n"
    )
    with FakeSecretManager() as fake:
        fake.add("proj", "hf-token", "s3cr3t-value")
        env = child_env()
        env["PYTHONPATH"] = f"{site}:{ROOT}"
        env[SECRET_ENDPOINT_ENV] = fake.url
        env[SECRET_REFS_ENV] = json.dumps({"HF": "projects/proj/secrets/hf-token/versions/latest"})
        env[SETUP_ENV] = 'echo "setup sees HF=${HF:-unset}"\necho built > made.txt\n'
        env[SETUP_TIMEOUT_ENV] = "60"
        done = subprocess.run(
            [sys.executable, "-m", "gputrain_node.vertex_entry", "show.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "[setup] setup sees HF=unset" in lines
    setup_at = lines.index("[setup] setup sees HF=unset")
    trained_at = next(
        i for i, line in enumerate(lines) if "made: built token: s3cr3t-value" in line
    )
    assert setup_at < trained_at  # setup first, in the code dir; then the training, with the secret
    assert "s3cr3t-value" not in "\n".join(lines[: setup_at + 1])


def test_a_timeout_stops_the_whole_setup_even_what_ignores_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(vertex_setup, "KILL_GRACE_S", 0.5)
    commands = "trap '' TERM\necho started\nsleep 300 &\necho $! > sleeper.pid\nwait\n"
    started = time.monotonic()
    with pytest.raises(vertex_setup.SetupFailed) as e:
        vertex_setup.run_setup(commands, tmp_path, dict(os.environ), 1, "workerpool1[0]")
    assert time.monotonic() - started < 10
    assert str(e.value) == "setup on workerpool1[0]: timed out after 1 s (--setup-timeout)"
    assert e.value.exit_code == vertex_setup.TIMED_OUT == 124
    assert "[setup] started" in capsys.readouterr().out
    sleeper = int((tmp_path / "sleeper.pid").read_text())
    gone_by = time.monotonic() + 5  # SIGKILL went to the group; its death is the kernel's, soon
    while alive(sleeper) and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert not alive(sleeper)  # the background child went with the group


def test_a_failing_command_is_its_exit_code_and_the_rest_does_not_run(tmp_path: Path) -> None:
    with pytest.raises(vertex_setup.SetupFailed) as e:
        vertex_setup.run_setup("false\ntouch ran", tmp_path, dict(os.environ), 60, "workerpool0[0]")
    assert str(e.value) == "setup on workerpool0[0]: exited with code 1; see its [setup] lines"
    assert not (tmp_path / "ran").exists()  # -e: the first failing command ends it


def test_a_package_pip_cannot_find_is_one_line_with_pips_verdict(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("--no-index\nno-such-package-gputrain==1.0\n")
    lines: list[str] = []
    with pytest.raises(vertex_setup.SetupFailed) as e:
        vertex_setup.install_requirements(
            {"requirements_txt": True}, tmp_path, dict(os.environ), "workerpool0[0]",
            lambda phase, text: lines.append(f"[{phase}] {text}"),
        )  # fmt: skip
    message = str(e.value)
    assert "\n" not in message and e.value.exit_code == 1
    assert message.startswith(
        "requirements on workerpool0[0]: installing requirements.txt failed (pip exit code 1); "
        "last lines: ERROR: "
    )
    assert "no-such-package-gputrain" in message
    assert any(line.startswith("[requirements] ERROR: ") for line in lines)


def test_the_constraints_keep_torch_and_the_cuda_runtime_it_came_with() -> None:
    from gputrain_node.torch_pins import constraints, pins

    found = pins(
        [("torch", "2.13.0+cu128"), ("nvidia_cudnn_cu12", "9.10.2.21"), ("numpy", "2.3.1"),
         ("triton", "3.5.0"), ("torch", "2.12.0"), ("Pillow", "11.0.0")]
    )  # fmt: skip
    assert constraints(found) == (
        "nvidia-cudnn-cu12==9.10.2.21\ntorch==2.13.0+cu128\ntriton==3.5.0\n"
    )  # the first torch on the path wins, as import does
    assert pins([("nvidia-nccl-cu12", "2.27.3"), ("numpy", "2.3.1")]) == {}  # no torch, no pins


def test_requirements_never_replace_the_containers_torch(tmp_path: Path) -> None:
    """A torchvision built for another torch fails in one line naming the conflict (and the
    container's torch), instead of pip downloading that torch over the container's."""
    import importlib.metadata

    from tests.support.wheelhouse import build_wheel

    have = importlib.metadata.version("torch")
    # a torchvision-like wheel (not named so: this machine's pip configuration pins torchvision)
    build_wheel(
        "gputrain-vision", tmp_path / "wheels", version="0.99.0", dependencies=("torch==2.99.0",)
    )
    (tmp_path / "requirements.txt").write_text(
        f"--no-index\n--find-links {tmp_path / 'wheels' / 'dist'}\ngputrain-vision\n"
    )
    lines: list[str] = []
    with pytest.raises(vertex_setup.SetupFailed) as e:
        vertex_setup.install_requirements(
            {"requirements_txt": True}, tmp_path, dict(os.environ), "workerpool0[0]",
            lambda phase, text: lines.append(f"[{phase}] {text}"),
        )  # fmt: skip
    assert f"[requirements] torch {have} stays" in lines[0]
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(
        "requirements on workerpool0[0]: installing requirements.txt failed (pip exit code 1): "
    )
    assert "gputrain-vision 0.99.0 depends on torch==2.99.0" in message
    assert "the node has torch" in message and f"=={have}" in message
