"""trainer.vertex_entry's setup step on one replica, as Vertex starts it (a real process, the real
Secret Manager client against the fake): the commands run in the job's working directory before
torchrun, never with the job's secrets, which the training then has."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.fake_secretmanager import FakeSecretManager
from tests.support.trainer_helpers import ROOT, child_env
from trainer.vertex_entry import SECRET_ENDPOINT_ENV, SECRET_REFS_ENV
from trainer.vertex_setup import SETUP_ENV, SETUP_TIMEOUT_ENV


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
            [sys.executable, "-m", "trainer.vertex_entry", "show.py"],
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
