"""known_hosts lines paramiko cannot parse are skipped with a warning naming file and line; the
good ones still pin, and a @revoked key is never pinned (issue 27, class 1)."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest
from paramiko.hostkeys import HostKeys

from scripts.transport.ssh import KnownHosts


def _key() -> str:
    return paramiko.ECDSAKey.generate().get_base64()


def test_bad_lines_are_skipped_and_named_good_ones_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, ca, other = _key(), _key(), _key()
    hashed = HostKeys.hash_host("10.0.0.9")
    path = tmp_path / "known_hosts"
    path.write_text(
        "\n".join(
            [
                "# comment",
                f"@cert-authority *.example.com ecdsa-sha2-nistp256 {ca}",
                "10.0.0.5 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI!!corrupt!!",
                "garbage",
                f"10.0.0.5 ecdsa-sha2-nistp256 {good}",
                f"{hashed} ecdsa-sha2-nistp256 {other}",
            ]
        )
        + "\n"
    )
    known = KnownHosts(path)
    assert known.keys_for("10.0.0.5") == (f"ecdsa-sha2-nistp256 {good}",)
    assert known.keys_for("10.0.0.9") == (f"ecdsa-sha2-nistp256 {other}",)
    err = capsys.readouterr().err + capsys.readouterr().out
    for lineno in (2, 3, 4):
        assert f"{path}:{lineno}: skipped" in err
    assert "@cert-authority" in err
    with pytest.raises(Exception):  # noqa: B017 (the plain loader fails on line 3)
        paramiko.HostKeys().load(str(path))


def test_a_revoked_key_is_not_pinned(tmp_path: Path) -> None:
    bad, fine = _key(), _key()
    path = tmp_path / "known_hosts"
    path.write_text(
        f"10.0.0.5 ecdsa-sha2-nistp256 {fine}\n"
        f"10.0.0.5,10.0.0.6 ecdsa-sha2-nistp256 {bad}\n"
        f"@revoked * ecdsa-sha2-nistp256 {bad}\n"
    )
    assert KnownHosts(path).keys_for("10.0.0.5") == (f"ecdsa-sha2-nistp256 {fine}",)


def test_every_key_of_a_host_is_pinned_and_ports_are_named_as_ssh_names_them(
    tmp_path: Path,
) -> None:
    a, b, c = _key(), _key(), _key()
    path = tmp_path / "known_hosts"
    path.write_text(
        f"10.0.0.5 ecdsa-sha2-nistp256 {a}\n10.0.0.5 ecdsa-sha2-nistp256 {b}\n"
        f"[10.0.0.5]:2222 ecdsa-sha2-nistp256 {c}\n"
    )
    known = KnownHosts(path)
    assert known.keys_for("10.0.0.5") == (f"ecdsa-sha2-nistp256 {a}", f"ecdsa-sha2-nistp256 {b}")
    assert known.keys_for("10.0.0.5", 2222) == (f"ecdsa-sha2-nistp256 {c}",)
    assert known.keys_for("10.0.0.7") == ()
