"""A node that runs the job's image (scripts/job/image_node.py): the install of docker and the NVIDIA
container toolkit, run for real by a local shell against fake apt-get / sudo / id that record
their calls; on a stack VM the node step installs what is missing and goes on, on `--hosts` it
names what is missing in one line and changes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra.base.records import Fleet, GpuExpectation, Node
from scripts.job.container import ImageRef
from scripts.job.environment import EnvironmentSetupError
from scripts.job.image_node import (
    build_container_install_command,
    build_node_check_command,
    ensure_image,
    parse_missing,
)
from scripts.targets.session import close_all, connect

RECORD = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n'
DIGEST = "sha256:" + "d" * 64


def _fakes(bin_dir: Path, *, user: str = "alice", candidate: bool = True) -> None:
    """apt-get (an install of docker.io puts a `docker` in place, of the toolkit nvidia-ctk),
    apt-cache, sudo (records, then runs the rest), id (an unprivileged login), usermod, setfacl,
    nvidia-ctk's configure, systemctl, curl, gpg, tee."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    scripts = {
        "apt-get": RECORD
        + f'case " $* " in *" docker.io "*) cp {bin_dir}/pkg-docker {bin_dir}/docker;; esac\n'
        f'case " $* " in *" nvidia-container-toolkit "*) cp {bin_dir}/ctk {bin_dir}/nvidia-ctk;; '
        "esac\n",
        # the installed docker: no image yet, every pull works
        "pkg-docker": '#!/bin/sh\necho "docker $*" >> "$CALLS"\n'
        '[ "$1 $2" = "image inspect" ] && exit 1; exit 0\n',
        "apt-cache": RECORD
        + ("echo '  Candidate: 1.17.8-1'\n" if candidate else "echo '  Candidate: (none)'\n"),
        "sudo": RECORD + '[ "$1" = -n ] && shift; exec "$@"\n',
        "id": f'#!/bin/sh\ncase "$1" in -u) echo 1000;; -un) echo {user};; *) echo 1000;; esac\n',
        "ctk": RECORD,
        **{t: RECORD for t in ("usermod", "setfacl", "systemctl", "curl", "gpg", "tee")},
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)


def _run(cmd: str, bin_dir: Path, calls: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls)}
    return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=60)


def test_install_docker_and_the_toolkit_as_an_unprivileged_user(tmp_path: Path) -> None:
    _fakes(tmp_path / "bin")
    calls = tmp_path / "calls"
    check = _run(build_node_check_command(gpus=True), tmp_path / "bin", calls)
    missing = parse_missing(check.stdout)
    assert check.returncode == 1 and missing == ("docker", "nvidia-container-toolkit")
    r = _run(build_container_install_command(missing), tmp_path / "bin", calls)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "gputrain-install: apt-get update",
        "gputrain-install: installing docker.io",
        "gputrain-install: installing nvidia-container-toolkit",
        "gputrain-install: done",
    ]
    log = calls.read_text()
    assert "sudo -n env DEBIAN_FRONTEND=noninteractive apt-get" in log
    assert "-y -qq install --no-install-recommends docker.io acl" in log
    assert "usermod -aG docker alice" in log and "setfacl -m u:alice:rw /var/run/docker.sock" in log
    assert "-y -qq install nvidia-container-toolkit" in log
    assert "nvidia-ctk runtime configure --runtime=docker" in log
    assert "curl" not in log  # apt had a candidate: NVIDIA's repository was not added
    assert _run(build_node_check_command(gpus=True), tmp_path / "bin", calls).stdout == "ok\n"


def test_the_toolkit_repository_is_added_where_apt_has_no_candidate(tmp_path: Path) -> None:
    _fakes(tmp_path / "bin", candidate=False)
    calls = tmp_path / "calls"
    r = _run(
        build_container_install_command(("nvidia-container-toolkit",)), tmp_path / "bin", calls
    )
    assert r.returncode == 0 and "adding NVIDIA's apt repository" in r.stdout
    log = calls.read_text()
    assert "curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey" in log
    assert "tee /etc/apt/sources.list.d/nvidia-container-toolkit.list" in log
    assert "docker.io" not in log


def test_a_failed_install_names_the_step_and_its_last_lines(tmp_path: Path) -> None:
    _fakes(tmp_path / "bin")
    (tmp_path / "bin" / "apt-get").write_text(
        '#!/bin/sh\ncase " $* " in *" install "*) echo "E: Unable to locate package docker.io"; '
        "exit 100;; esac\n"
    )
    r = _run(build_container_install_command(("docker",)), tmp_path / "bin", tmp_path / "calls")
    assert r.returncode == 1
    assert r.stdout.splitlines()[-2:] == [
        "gputrain-install: failed: apt-get install docker.io",
        "E: Unable to locate package docker.io",
    ]


def _fleet(install: bool) -> Fleet:
    node = Node(name="local", role="head", internal_address="127.0.0.1", address="127.0.0.1")
    return Fleet(
        target="local",
        nodes=(node,),
        expect=GpuExpectation(count=0),
        python=sys.executable,
        local=True,
        install_trainer=install,
    )


@pytest.mark.parametrize("stack_vm", [True, False])
def test_a_node_without_docker(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stack_vm: bool,
) -> None:
    """The stack's own VM: docker installed (progress lines), then pulled. A machine of the
    user's (`--hosts`): one line naming what it lacks; nothing installed."""
    _fakes(tmp_path / "bin", user="root")
    calls = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("CALLS", str(calls))
    image = ImageRef("r.io", "team/train", "v1", DIGEST)
    ts = connect(_fleet(stack_vm), deadline_s=10, local_root=tmp_path / "node")
    try:
        if stack_vm:
            ensure_image(_fleet(True), ts, image)
        else:
            with pytest.raises(EnvironmentSetupError) as e:
                ensure_image(_fleet(False), ts, image)
    finally:
        close_all(ts)
    out = capsys.readouterr().out
    if stack_vm:
        assert "local: r.io/team/train:v1 needs docker; installing (apt)" in out
        assert "[local] [install] installing docker.io" in out
        assert f"image r.io/team/train:v1 ({DIGEST}) on 1 node(s): local pulled" in out
        assert f"docker pull -q r.io/team/train@{DIGEST}" in calls.read_text()
    else:
        assert str(e.value) == (
            "node local: cannot run the image r.io/team/train:v1: missing: docker (install "
            "docker and the NVIDIA container toolkit, or run without --image)"
        )
        assert not calls.exists() or "apt-get" not in calls.read_text()
