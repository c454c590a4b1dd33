"""The environment's bad input through the CLI: one line naming the setting, exit 2, before any
target is touched (a `--local` run creates its node root only once it starts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.cli import main
from scripts.settings import Settings


@pytest.mark.parametrize(
    ("files", "argv", "expected"),
    [
        (
            {},
            ["--secret", "UNSET_SECRET_X_FOR_TESTS"],
            "secret UNSET_SECRET_X_FOR_TESTS: the environment variable",
        ),
        ({}, ["--secret", "A=value"], "--secret: 'A=...' is not allowed"),
        ({"requirements.txt": "torch\nnot valid ==\n"}, [], "requirements.txt line 2"),
        (
            {"pyproject.toml": "[project]\ndependencies = 3\n"},
            [],
            "pyproject.toml: [project].dependencies",
        ),
        ({}, ["--image", "ubuntu:22.04"], "--image: 'ubuntu:22.04' is not allowed"),
        ({}, ["--build", "Dockerfile", "--image", "r.io/a:1"], "--build and --image are both set"),
        (
            {"Dockerfile": "FROM x\n"},
            ["--build", "Dockerfile"],
            "--build Dockerfile: only for --stack targets",
        ),
        (
            {},
            ["--image", "127.0.0.1:9/gputrain/none:1"],
            "127.0.0.1:9/gputrain/none:1: cannot reach",
        ),
    ],
)
def test_bad_environment_input_is_one_line_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    files: dict[str, str],
    argv: list[str],
    expected: str,
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("UNSET_SECRET_X_FOR_TESTS", raising=False)
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["run", "--local", *argv, "--", "job.py"], settings) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gputrain: error: ") and expected in err and "\n" not in err
    assert not (tmp_path / "runs").exists()  # nothing ran, nothing was made


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("secrets: {a: 1}", "lab.yaml: secrets: {'a': 1} is not allowed; expected a list"),
        ("setup: [1]", "lab.yaml: setup: [1] is not allowed; expected shell commands"),
        ("secrets: [1X]", "lab.yaml: secrets: '1X' is not allowed"),
        ("image: ubuntu", "lab.yaml: image: 'ubuntu' is not allowed"),
    ],
)
def test_hosts_file_keys_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, expected: str
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = tmp_path / "id"  # a real key: the identity file is checked before the settings
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    key.chmod(0o600)
    (tmp_path / "known_hosts").write_text("")
    path = tmp_path / "lab.yaml"
    path.write_text(
        f"user: u\nidentity_file: {key}\nknown_hosts: known_hosts\ncpu: true\n{line}\n"
        "hosts: [10.0.0.1]\n"
    )
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["run", "--hosts", str(path), "--trust-new-hosts"], settings) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1


def test_vertex_refuses_environment_secrets_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "Pulumi.yaml").write_text((root / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.v.yaml").write_text(
        "config:\n  gcp:project: proj-test\n  gputrain:backend: vertex\n  gputrain:secrets: [TOK]\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOK", "x")
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["run", "--stack", "v", "--yes"], settings) == 2
    err = capsys.readouterr().err
    assert "secret TOK: on backend: vertex a secret must come from Secret Manager" in err


@pytest.mark.parametrize(
    ("secrets", "expected"),
    [
        ("[RANK]", "gputrain:secrets: RANK is set on the node"),
        ("[GPUTRAIN_SECRET_NAMES]", "GPUTRAIN_SECRET_NAMES is gputrain's own"),
        ("[IFS]", "IFS is the shell's own variable"),
        ("['X=sm://projects/../secrets/y']", "gputrain:secrets: 'X=sm://projects/../secrets/y'"),
        ("[UNSET_SECRET_Y_FOR_TESTS]", "secret UNSET_SECRET_Y_FOR_TESTS: the environment variable"),
    ],
)
def test_plan_refuses_the_secrets_run_refuses(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    secrets: str,
    expected: str,
) -> None:
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "Pulumi.yaml").write_text((root / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.lab.yaml").write_text(
        "config:\n  gcp:project: gputrain-test\n  gputrain:machineType: g2-standard-8\n"
        f"  gputrain:secrets: {secrets}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("UNSET_SECRET_Y_FOR_TESTS", raising=False)
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    lines = []
    for command in ("plan", "run"):
        assert (
            main([command, "--stack", "lab", "--yes"][: 3 if command == "plan" else 4], settings)
            == 2
        )
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err
        lines.append(err)
    assert lines[0] == lines[1]


def test_plan_refuses_the_image_run_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An image reference run would refuse: plan says the same line (the registry not asked)."""
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "Pulumi.yaml").write_text((root / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.lab.yaml").write_text(
        "config:\n  gcp:project: gputrain-test\n  gputrain:machineType: g2-standard-8\n"
        "  gputrain:image: 'Not An Image!!'\n"
    )
    monkeypatch.chdir(tmp_path)
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    lines = []
    for command in (["plan", "--stack", "lab"], ["run", "--stack", "lab", "--yes"]):
        assert main(command, settings) == 2
        err = capsys.readouterr().err
        assert "gputrain:image: 'Not An Image!!' is not allowed" in err and err.count("\n") == 1
        lines.append(err)
    assert lines[0] == lines[1]
