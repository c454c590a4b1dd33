"""The stack's private key on the operator's machine (scripts/targets/gce/keys.py): a 0600 file in
a private per-user directory that exists only while a controller runs, and that the next start
removes when the controller was killed (SIGKILL leaves no chance to clean up)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra.base.errors import GputrainError
from scripts.targets.gce.keys import PRIVATE_KEY, clean_stale_key_dirs, key_root, private_key_file
from tests.support import ROOT

PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----"

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from scripts.targets.gce.keys import private_key_file

    class Runner:
        def get_config(self, key):
            return {PEM!r}

    with private_key_file(Runner(), "dev", root=Path(sys.argv[1])) as key:
        print(key, flush=True)
        time.sleep(120)
    """
).replace("{PEM!r}", repr(PEM))


class Runner:
    def __init__(self, pem: str | None = PEM) -> None:
        self.pem = pem

    def get_config(self, key: str) -> str | None:
        assert key == PRIVATE_KEY
        return self.pem


def _holder(root: Path) -> tuple[subprocess.Popen[str], Path]:
    """A controller (another process) holding the key file; returns it and the key's path."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_key_file_is_private_and_gone_afterwards(tmp_path: Path) -> None:
    root = tmp_path / "keys"
    root.mkdir(mode=0o700)
    with private_key_file(Runner(), "dev", root=root) as key:  # type: ignore[arg-type]
        assert key.read_text() == PEM + "\n"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert list(root.iterdir()) == []


def test_a_sigkilled_controller_leaves_nothing_the_next_start_does_not_clean(
    tmp_path: Path,
) -> None:
    root = tmp_path / "keys"
    root.mkdir(mode=0o700)
    killed, killed_key = _holder(root)
    alive, alive_key = _holder(root)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
        assert killed_key.read_text() == PEM + "\n"  # SIGKILL: no cleanup ran
        # the next start removes the dead controller's key, never a running one's
        with private_key_file(Runner(), "dev", root=root) as key:  # type: ignore[arg-type]
            assert not killed_key.parent.exists()
            assert alive_key.exists() and key.exists()
        assert clean_stale_key_dirs(root) == []
        assert [p.name for p in root.iterdir()] == [alive_key.parent.name]
    finally:
        alive.kill()
        alive.wait(10)
    assert clean_stale_key_dirs(root) == [alive_key.parent]
    assert list(root.iterdir()) == []


def test_key_root_is_private_and_refuses_a_shared_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    root = key_root()
    assert root == tmp_path / f"gputrain-keys-{os.getuid()}"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    root.chmod(0o777)  # someone made it shared: refuse to put keys there
    with pytest.raises(GputrainError, match="not a private directory"):
        key_root()
    root.rmdir()
    root.symlink_to(tmp_path)
    with pytest.raises(GputrainError, match="not a private directory"):
        key_root()


def test_missing_private_key_names_keygen(tmp_path: Path) -> None:
    with (
        pytest.raises(GputrainError, match="run `gputrain keygen --stack dev`"),
        private_key_file(Runner(None), "dev", root=tmp_path),  # type: ignore[arg-type]
    ):
        pass
