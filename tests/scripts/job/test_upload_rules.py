"""What never leaves the operator's machine (scripts/job/sync.py): private keys, .env files, Google
credentials and whatever `.gputrainignore` matches — in git and plain directories alike, named in
one line, and removed from a node that got them from an older upload."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from infra.base.errors import UserError
from scripts.job.sync import MANIFEST, collect_sources, sync_code
from scripts.targets.gce.keys import generate_ssh_keypair
from scripts.transport.local import LocalTransport

PRIVATE, PUBLIC = generate_ssh_keypair("test")
SECRETS = {
    "id_ed25519": PRIVATE,  # an SSH private key
    "keys/id_rsa": PRIVATE,
    "deploy.pem": "pem",
    "tls/server.key": "key",
    ".env": "TOKEN=1\n",
    "conf/.env.production": "TOKEN=2\n",
    "notes/backup.txt": f"my old key:\n{PRIVATE}",  # a PRIVATE KEY block anywhere
    "sa.json": json.dumps({"type": "service_account", "private_key_id": "x"}),
    "adc.json": json.dumps({"type": "authorized_user", "refresh_token": "x"}),
    "data/raw/huge.csv": "a,b\n",  # matched by .gputrainignore
    "scratch.tmp": "",  # matched by .gputrainignore
}
KEPT = {
    "train.py": "print('hi')\n",
    "id_ed25519.pub": PUBLIC,  # public halves are fine
    "ids.py": "X = 1\n",
    "config.json": json.dumps({"type": "model", "layers": 2}),
    "data/keep/small.csv": "a\n",  # re-included by a ! rule
    "docs/environment.md": "use a .env file\n",
}
IGNORE = "data/*\n!data/keep/\n*.tmp\n"


def _tree(root: Path, *, git: bool) -> Path:
    for rel, text in {**SECRETS, **KEPT, ".gputrainignore": IGNORE}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    if git:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)  # even tracked ones
    return root


@pytest.mark.parametrize("git", [True, False], ids=["git", "plain"])
def test_secrets_and_ignored_files_are_never_uploaded(
    tmp_path: Path, git: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(tmp_path / "work", git=git)
    files = collect_sources(root)
    assert sorted(files) == sorted([*KEPT, ".gputrainignore"])
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("upload:")]
    assert line.startswith(f"upload: not sending {len(SECRETS)} file(s): ")
    assert "id_ed25519 (SSH private key)" in line and "sa.json (Google credentials)" in line
    assert (
        "notes/backup.txt (holds a private key)" in line and "scratch.tmp (.gputrainignore)" in line
    )


def test_a_node_that_got_secrets_from_an_older_upload_loses_them(tmp_path: Path) -> None:
    root = _tree(tmp_path / "work", git=False)
    node = LocalTransport("n", tmp_path / "node")
    code = tmp_path / "node" / ".gputrain" / "code"
    everything = {rel: root / rel for rel in [*SECRETS, *KEPT]}  # what an old version sent
    sync_code(node, everything)
    assert (code / ".env").exists()
    plan = sync_code(node, collect_sources(root))
    assert sorted(plan.delete) == sorted(SECRETS)
    left = sorted(str(p.relative_to(code)) for p in code.rglob("*") if p.is_file())
    assert left == sorted([*KEPT, ".gputrainignore", MANIFEST])


def test_unreadable_ignore_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("")
    (tmp_path / ".gputrainignore").write_bytes(b"\xff\xfe")
    with pytest.raises(UserError, match=r"\.gputrainignore: cannot read it"):
        collect_sources(tmp_path)
