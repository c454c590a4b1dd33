"""`make test` leaves the machine as it found it: its apt step (.ci/apt-install) starts nothing and
leaves no unit enabled at boot that a package enabled, and torchrun's temp directories go under the
test session's own TMPDIR, never /tmp. The apt step runs against fake `dpkg`, `apt-get` and
`systemctl` executables that behave as Debian's do (openssh-server's postinst enables ssh.service
and would start sshd unless policy-rc.d says 101)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.trainer_helpers import ROOT, child_env, free_port

APT_INSTALL = ROOT / ".ci" / "apt-install"

FAKES = {
    # dpkg -s PKG: installed when listed in $STATE/installed
    "dpkg": 'grep -qx "$2" "$STATE/installed"\n',
    # apt-get update | install -y -qq --no-install-recommends PKG...: none of the list when one
    # is not in the archive ($STATE/unavailable); the postinst of openssh-server enables
    # ssh.service and starts sshd unless policy-rc.d answers 101
    "apt-get": """echo "apt-get $*" >> "$STATE/log"
[ "$1" = install ] || exit 0
for p in "$@"; do
  if grep -qx "$p" "$STATE/unavailable" 2>/dev/null; then
    echo "E: Unable to locate package $p" >&2; exit 100
  fi
done
for p in "$@"; do
  case "$p" in -*|install) continue;; esac
  echo "$p" >> "$STATE/installed"
  if [ "$p" = openssh-server ]; then
    grep -qx ssh.service "$STATE/enabled" || echo ssh.service >> "$STATE/enabled"
    if [ -x "$POLICY_RC_D" ] && { "$POLICY_RC_D" ssh start; [ $? -eq 101 ]; }; then
      echo "policy-rc.d: not starting ssh" >> "$STATE/log"
    else
      echo "started sshd" >> "$STATE/log"
    fi
  fi
done
""",
    # systemctl list-unit-files --state=enabled --no-legend | disable --quiet UNIT
    "systemctl": """case "$1" in
  list-unit-files) sed 's/$/ enabled enabled/' "$STATE/enabled";;
  disable) grep -vx "$3" "$STATE/enabled" > "$STATE/e.new"; mv "$STATE/e.new" "$STATE/enabled"
           echo "systemctl $*" >> "$STATE/log";;
esac
""",
}


def _apt_install(tmp_path: Path, *packages: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir(exist_ok=True)
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STATE": str(state),
        "SUDO": "",
        "POLICY_RC_D": str(tmp_path / "policy-rc.d"),
    }
    done = subprocess.run(
        [str(APT_INSTALL), *packages], env=env, capture_output=True, text=True, timeout=60
    )
    return done, state


def _state(tmp_path: Path, installed: str, enabled: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "installed").write_text(installed)
    (state / "enabled").write_text(enabled)
    (state / "log").write_text("")


def test_apt_step_starts_nothing_and_leaves_ssh_disabled_at_boot(tmp_path: Path) -> None:
    _state(tmp_path, "git\n", "cron.service\n")
    done, state = _apt_install(tmp_path, "openssh-server", "git")
    assert done.returncode == 0, done.stderr
    log = (state / "log").read_text()
    assert "install -y -qq --no-install-recommends openssh-server\n" in log  # git was there
    assert "policy-rc.d: not starting ssh" in log and "started sshd" not in log
    assert (state / "enabled").read_text() == "cron.service\n"  # as before: ssh disabled again
    assert "disabled ssh.service at boot again" in done.stdout
    assert not (tmp_path / "policy-rc.d").exists()  # ours, removed again


def test_apt_step_keeps_what_the_machine_had(tmp_path: Path) -> None:
    """An existing policy-rc.d stays; a unit enabled before stays enabled; nothing missing: no
    apt-get at all."""
    _state(tmp_path, "git\n", "ssh.service\n")
    policy = tmp_path / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    done, state = _apt_install(tmp_path, "openssh-server")
    assert done.returncode == 0, done.stderr
    assert (state / "enabled").read_text() == "ssh.service\n"
    assert "systemctl disable" not in (state / "log").read_text()
    assert policy.read_text() == "#!/bin/sh\nexit 101\n"
    log = (state / "log").read_text()
    done, state = _apt_install(tmp_path, "openssh-server", "git")
    assert done.returncode == 0 and (state / "log").read_text() == log and not done.stdout


def test_an_optional_package_the_archive_lacks_is_one_line(tmp_path: Path) -> None:
    """Ubuntu has no chromium deb: the required packages are installed all the same and the step
    passes, saying so in one line; a required package the archive lacks still fails it."""
    _state(tmp_path, "", "")
    (tmp_path / "state" / "unavailable").write_text("chromium\n")
    done, state = _apt_install(tmp_path, "git", "zstd", "--optional", "chromium")
    assert done.returncode == 0, done.stderr
    assert (state / "installed").read_text() == "git\nzstd\n"
    assert "apt: chromium is not installable here (optional)" in done.stdout
    done, _ = _apt_install(tmp_path, "chromium", "--optional")
    assert done.returncode != 0 and "Unable to locate package chromium" in done.stderr


def test_torchrun_temp_dirs_stay_in_the_sessions_tmpdir(tmp_path: Path) -> None:
    """conftest points children's TMPDIR at a directory the session removes: torchrun without
    --log-dir makes its torchelastic_* directory there, not in /tmp."""
    session_tmp = Path(os.environ["TMPDIR"])
    assert session_tmp != Path("/tmp") and session_tmp.is_dir()
    assert Path(tempfile.gettempdir()) != session_tmp  # this process's own temp files: unchanged
    before = set(session_tmp.glob("torchelastic_*"))
    (tmp_path / "hello.py").write_text("print('hello')\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            "--nproc-per-node=1",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            "--rdzv-backend=c10d",
            str(tmp_path / "hello.py"),
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(set(session_tmp.glob("torchelastic_*")) - before) == 1
