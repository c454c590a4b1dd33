"""Secrets (scripts/job/secrets.py): declared, resolved before anything exists (the environment or
Secret Manager through the real client against a fake with its REST shape), and a real local run
whose rank reads the value while it is found nowhere on disk, in no argv and no log line."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.base.errors import UserError
from scripts.job.launch import launch_torchrun
from scripts.job.records import Job
from scripts.job.secrets import (
    ENDPOINT_ENV,
    SecretRef,
    fetch_secret_manager,
    parse_secret,
    parse_secrets,
    redact,
    resolve_secrets,
)
from scripts.targets.session import close_all, connect
from tests.support.fake_secretmanager import FakeSecretManager
from tests.support.local_fleet import local_fleet

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
    assert [r.name for r in parse_secrets(["A", "B", "A=sm://a"], "s")] == ["A", "B"]


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

    from scripts.job.secrets import READ_SECRETS_SH, secret_stdin

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
