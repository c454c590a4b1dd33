"""What never leaves the machine, widened (issue 27, classes 4 and 5): well-known credential
files and formats whatever their case, secrets anywhere in a file (not only its first MiB),
symbolic links named, gputrain's own results never re-uploaded, and what gputrain writes private."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from scripts.job.node_scripts import build_upload_and_start_command, forget_run_script_line
from scripts.job.sync import RUN_SCRIPT, CodeBundle, collect_sources, sync_code
from scripts.settings import Settings
from scripts.targets.gce.keys import generate_ssh_keypair
from scripts.transport.local import LocalTransport
from scripts.transport.tar import extract_tar, tar_files

PRIVATE, _ = generate_ssh_keypair("test")
ADC = json.dumps({"type": "authorized_user", "refresh_token": "1//x", "client_secret": "y"})
SA = json.dumps({"type": "service_account", "private_key_id": "k"})
PPK = "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nPrivate-Lines: 1\nAAAA\n"
KUBE = "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    client-key-data: LS0t\n"
SECRETS = {
    "ADC.JSON": ADC,
    "adc.json.bak": ADC,
    "gcloud/application_default_credentials": ADC,
    "keys/Service-Account.txt": SA,  # Google credentials by contents, any name
    "putty/me.ppk": PPK,
    "putty/renamed.txt": PPK,
    "tls/server.KEY": "k",
    "tls/server.key.bak": "k",
    "CERT.PEM": "c",
    ".aws/credentials": "[default]\n",
    "notes/aws.ini": "[x]\nAWS_SECRET_ACCESS_KEY = abc\n",
    ".git-credentials": "https://u:t@github.com\n",
    ".netrc": "machine h login u password p\n",
    ".kube/config": "apiVersion: v1\n",
    "deploy/prod.kubeconfig": "x",
    "cluster.yaml": KUBE,  # a kubeconfig by contents
    "prod.env": "TOKEN=1\n",
    ".ENV": "TOKEN=2\n",
    "infra/terraform.tfstate": "{}",
    "store.p12": "x",
    # OAuth and token files, by contents (any name) and by name
    "auth/token.json": json.dumps(
        {"token": "ya29.a0AfH6SMBx", "refresh_token": "1//0gLongRefresh", "client_id": "c"}
    ),
    "oauth/renamed.json": '{"web": {"client_id": "c", "client_secret": "GOCSPX-abcdefghijk"}}',
    "client_secret_123.apps.googleusercontent.com.json": "{}",
    "settings.yaml": "oauth:\n  client_secret: 'GOCSPX-abcdefghijk'\n",
    ".cache/huggingface/token": "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"[:34] + "\n",
    "notes/hf.txt": "mine: hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567 (read)\n",
    ".streamlit/secrets.toml": 'db_password = "x"\n',
    "scripts/env.sh": "#!/bin/sh\nexport OPENAI_API_KEY=sk-proj-abcdef123\n",
    "setup_env.bash": "  export WANDB_API_KEY='0123456789abcdef'\n",
    "deploy/vars": 'export GITHUB_TOKEN="ghp_abcdefghijkl"\n',
}
KEPT = {
    "train.py": "print('hi')\n",
    "environment.yml": "name: x\n",
    "keyboard.py": "K = 1\n",
    "config.json": json.dumps({"type": "model"}),
    "docs/secrets.md": 'never commit .env, *.pem or JSON with "type": "service_account"\n',
    "docs/oauth.md": 'token.json holds "refresh_token": "..." and "client_secret": ""\n',
    "tokenizer.json": json.dumps({"model": {"vocab": {"hf_": 1, "token": 2}}}),
    "train.sh": 'export PAD_TOKEN=0\nexport MAX_TOKENS=512\nexport HF_TOKEN="$(cat ~/.hf)"\n'
    "export WANDB_API_KEY=$WANDB_API_KEY\n",
}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _upload_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("upload:")]


@pytest.mark.parametrize("git", [True, False], ids=["git", "plain"])
def test_credentials_in_every_well_known_shape_stay_home_and_are_all_named(
    tmp_path: Path, git: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(tmp_path / "w", {**SECRETS, **KEPT})
    if git:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    assert sorted(collect_sources(root)) == sorted(KEPT)
    [line] = _upload_lines(capsys)
    assert line.startswith(f"upload: not sending {len(SECRETS)} file(s): ")
    for rel in SECRETS:  # every one named, none summarised as "and N more"
        assert f"{rel} (" in line
    assert " more" not in line


def test_a_key_after_the_first_mib_or_across_a_chunk_boundary_is_seen(tmp_path: Path) -> None:
    big = "x" * (3 << 20)
    boundary = "y" * ((1 << 20) - 10)
    root = _tree(
        tmp_path,
        {
            "data/late.txt": big + PRIVATE,
            "data/straddle.txt": boundary + PRIVATE,
            "data/clean.txt": big,
        },
    )
    assert sorted(collect_sources(root)) == ["data/clean.txt"]


def test_symbolic_links_are_named_never_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(tmp_path / "w", {"train.py": "x\n"})
    outside = _tree(tmp_path / "home", {"id": PRIVATE})
    os.symlink(outside / "id", root / "mykey")
    os.symlink(root / "train.py", root / "alias.py")
    assert sorted(collect_sources(root)) == ["train.py"]
    [line] = _upload_lines(capsys)
    assert "alias.py (symbolic link, not followed)" in line
    assert "mykey (symbolic link, not followed)" in line


def test_earlier_results_are_never_uploaded_as_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A git project whose .gitignore lacks runs/: the results of earlier runs stay home —
    ignored by git through runs/.gitignore, else left out by their marker, said."""
    root = _tree(tmp_path / "w", {"train.py": "x\n", ".gitignore": "*.pyc\n"})
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    settings = Settings(root=root, runs_dir=root / "runs")
    for i in range(3):
        run = settings.results_dir("local", f"run{i}")
        (run / "node0").mkdir()
        (run / "node0" / "ckpt.pt").write_bytes(os.urandom(1 << 16))
    assert sorted(collect_sources(root)) == [".gitignore", "train.py"]
    assert _upload_lines(capsys) == []  # git ignores runs/ (its own .gitignore): nothing to say
    (root / "runs" / ".gitignore").unlink()  # as runs/ made by a version before it
    assert sorted(collect_sources(root)) == [".gitignore", "train.py"]
    [line] = _upload_lines(capsys)
    assert line.startswith("upload: not sending runs/ (") and "gputrain's own results" in line
    # results left by a version without the marker are recognised by their LAST_RUN files too
    (root / "runs" / ".gputrain-results").unlink()
    assert sorted(collect_sources(root)) == [".gitignore", "train.py"]
    # and the results directories are the user's alone
    for d in (root / "runs", root / "runs" / "local", root / "runs" / "local" / "run0"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_results_under_another_name_are_not_walked_into(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No git, GPUTRAIN_RUNS_DIR inside the project under a name of its own: left out, silently."""
    root = _tree(tmp_path / "w", {"train.py": "x\n"})
    run = Settings(root=root, runs_dir=root / "results").results_dir("local", "r1")
    (run / "ckpt.pt").write_bytes(b"x")
    capsys.readouterr()
    assert sorted(collect_sources(root)) == ["train.py"]
    assert _upload_lines(capsys) == []


def test_what_gputrain_writes_on_a_node_and_brings_home_is_private(tmp_path: Path) -> None:
    node = LocalTransport("n", tmp_path / "node")
    src = _tree(tmp_path / "w", {"train.py": "x\n"})
    (src / "train.py").chmod(0o644)
    sync_code(node, {"train.py": src / "train.py"})
    state = tmp_path / "node" / ".gputrain"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    state.chmod(0o755)  # as someone (an older gputrain, the user) left it
    sync_code(node, {"train.py": src / "train.py"})
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    script = (
        f"echo $$ > pgid\nRUN=$(pwd)\n{forget_run_script_line()}\nexport T=secret\necho > jobpid\n"
    )
    bundle = CodeBundle({}, run_script=script)
    r = node.run(build_upload_and_start_command("r1"), 30, stdin=bundle.payload(bundle.plan("")))
    assert r.ok, r.stderr
    run = state / "runs" / "r1"
    for _ in range(100):
        if (run / "jobpid").exists():
            break
        time.sleep(0.05)
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert stat.S_IMODE((run / "pgid").stat().st_mode) == 0o600
    for code in (run / "code", state / "code"):  # it held the --env values
        assert not (code / RUN_SCRIPT).exists()
    home = tmp_path / "home"
    (tmp_path / "f").write_text("r")
    (tmp_path / "f").chmod(0o664)
    extract_tar(tar_files({"d/f": tmp_path / "f"}), home)
    assert stat.S_IMODE((home / "d" / "f").stat().st_mode) == 0o600
    assert stat.S_IMODE((home / "d").stat().st_mode) == 0o700
