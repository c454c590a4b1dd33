"""Notifications against local HTTP sinks (real HTTP on loopback): a `--local` run posts started
and finished (with its loss and tokens/s) within seconds; a sink that answers 500 and one that
hangs cost one warning line each and change nothing else; the webhook URL — a secret — never
appears in full; bad URLs are one line."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.base.errors import UserError
from infra.keys import check_urls, redact
from scripts import notify
from scripts.cli import main
from scripts.notify import Notifier, message
from scripts.settings import Settings
from tests.support import JOBS
from tests.support.http_sink import HttpSink

SECRET = "/services/T000/B000/s3cr3t-token"
#: the trainer's stand-in without torch (tests/support/jobs/steps.py): its step lines and summary
TRAIN = ["steps.py", "30", "0.01"]


@pytest.fixture
def sinks() -> Iterator[tuple[HttpSink, HttpSink, HttpSink]]:
    with HttpSink("ok") as ok, HttpSink("fail") as fail, HttpSink("hang", hang_s=5) as hang:
        yield ok, fail, hang


def test_the_body_is_a_chat_webhook_message() -> None:
    body = message(
        "finished",
        {"stack": "dev", "run_id": "r1", "nodes": 2, "step": 300, "final_loss": 1.41234,
         "tokens_per_s": 51234.5, "cost_usd": 1.5},
    )  # fmt: skip
    assert body["event"] == "finished" and body["run_id"] == "r1" and body["nodes"] == 2
    assert body["text"] == (
        "gputrain finished: run r1 on dev; 2 node(s); step 300; loss 1.4123; tokens/s 51,234; "
        "cost so far $1.50"
    )
    failed = message("failed", {"stack": "dev", "run_id": "r1", "root_cause": "boom"})
    assert failed["text"].endswith("root cause: boom")


def test_a_failing_or_hanging_webhook_is_one_warning_and_never_blocks(
    sinks: tuple[HttpSink, HttpSink, HttpSink], capsys: pytest.CaptureFixture[str]
) -> None:
    ok, fail, hang = sinks
    urls = [ok.url + SECRET, fail.url + SECRET, hang.url + SECRET]
    n = Notifier(urls, {"stack": "dev", "run_id": "r1"}, timeout_s=0.5, backoff_s=(0.1,))
    t = time.monotonic()
    n.send("started", nodes=2)
    n.send("finished", step=10)
    assert time.monotonic() - t < 0.2  # queued, not sent on the caller's time
    ok.wait_for("finished", 5)
    n.close(drain_s=6)
    assert ok.events() == ["started", "finished"]
    assert fail.attempts == 6  # 3 tries per event
    out = capsys.readouterr()
    said = out.out + out.err
    warnings = [ln for ln in said.splitlines() if "notify:" in ln]
    assert len(warnings) == 2, said  # one per failing URL, not one per event or try
    assert any("HTTP 500 after 3 tries" in w for w in warnings)
    assert "s3cr3t" not in said and "127.0.0.1/…" in said


def test_bad_urls_are_one_line_without_the_secret() -> None:
    with pytest.raises(UserError) as e:
        check_urls(["ftp://hooks.example.com/s3cr3t"], "--notify")
    assert str(e.value).startswith("--notify ftp://hooks.example.com/…: not an http(s) URL")
    assert "s3cr3t" not in str(e.value)
    with pytest.raises(UserError, match=r"^gputrain:notify\[1\] "):
        check_urls(["https://a.example/x", "hooks.slack.com/s3cr3t"], "gputrain:notify")
    assert check_urls([" https://a.example/x"], "k") == ("https://a.example/x",)
    assert redact("https://hooks.slack.com/services/T/B/x?y=1") == "https://hooks.slack.com/…"


def test_notify_flag_and_stack_key_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "Pulumi.yaml").write_text((root / "Pulumi.yaml").read_text())
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    assert main(["run", "--local", "--notify", "mailto:me@example.com"], settings) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--notify mailto:…: not an http(s) URL" in err[0], err
    (tmp_path / "Pulumi.s.yaml").write_text(
        'config:\n  gputrain:notify: ["ws://x.example/s3cr3t"]\n'
    )
    assert main(["plan", "--stack", "s"], settings) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gputrain:notify ws://x.example/…: not an http(s) URL" in err[0]


def test_a_local_run_notifies_started_and_finished_and_bad_sinks_change_nothing(
    sinks: tuple[HttpSink, HttpSink, HttpSink],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ok, fail, hang = sinks
    monkeypatch.setattr(notify, "TIMEOUT_S", 1.0)
    monkeypatch.setattr(notify, "BACKOFF_S", (0.2,))
    monkeypatch.chdir(tmp_path)
    shutil.copy(JOBS / "steps.py", tmp_path)
    monkeypatch.delenv("GPUTRAIN_NODE_ROOT", raising=False)
    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    monkeypatch.setenv("GPUTRAIN_NOTIFY", ok.url + SECRET)  # the good one from the environment
    argv = ["train", "--local"]
    for sink in (fail, hang):
        argv += ["--notify", sink.url + SECRET]
    t = time.monotonic()
    rc = main([*argv, "--", *TRAIN], settings)
    out = capsys.readouterr()
    said = out.out + out.err
    assert rc == 0, said[-3000:]
    started = ok.wait_for("started", 30)
    finished = ok.wait_for("finished", 30)
    assert time.monotonic() - t < 120
    assert started["nodes"] == 1 and started["stack"] == "local" and started["run_id"]
    assert finished["run_id"] == started["run_id"] and finished["step"] == 30
    assert isinstance(finished["final_loss"], float) and finished["tokens_per_s"] > 0
    assert finished["text"].startswith(f"gputrain finished: run {started['run_id']} on local")
    assert ok.received[0][1] == SECRET  # the path arrived intact
    warnings = [ln for ln in said.splitlines() if "notify:" in ln]
    assert len(warnings) <= 2 and "s3cr3t" not in said, said[-2000:]
    assert "run summary" in said  # the run itself went as always


def test_a_run_that_fails_before_training_notifies_failed_with_its_last_line(
    sinks: tuple[HttpSink, HttpSink, HttpSink], tmp_path: Path
) -> None:
    """Any failure (here: provisioning ran out of zones) is `failed` with one root-cause line;
    a training failure's line is the failing node's root cause."""
    from contextlib import contextmanager

    from infra.base.errors import GputrainError
    from scripts import lifecycle
    from scripts.job.records import JobResult, NodeFailure, TrainingError
    from scripts.targets.base import Capabilities, Declared, RunOptions

    ok = sinks[0]

    class NoCapacity:
        name = "stack-lab"
        capabilities = Capabilities()

        def declared(self) -> Declared:
            return Declared(name=self.name, label="lab", notify=(ok.url + SECRET,))

        @contextmanager
        def provisioned(self, opts: object, guard: object) -> Iterator[None]:
            raise GputrainError("up failed in every zone:\n  us-central1-a: stockout")
            yield

    settings = Settings(root=tmp_path, runs_dir=tmp_path / "runs")
    with pytest.raises(GputrainError):
        lifecycle.run(NoCapacity(), RunOptions(), settings, create=True)  # type: ignore[arg-type]
    failed = ok.wait_for("failed", 10)
    assert failed["root_cause"] == "us-central1-a: stockout" and failed["stack"] == "lab"
    result = JobResult("r1", False, {"n0": 1}, 1.0, tmp_path)
    crash = TrainingError(
        "run r1 failed",
        failure=NodeFailure("n0", "exited", 1, ("Traceback ...", "RuntimeError: boom")),
        result=result,
    )
    assert lifecycle.root_cause_line(crash) == "RuntimeError: boom"
    assert lifecycle.root_cause_line(GputrainError("")) == "GputrainError"


@pytest.mark.parametrize(
    "url",
    [
        "https://bot:hunter2@hooks.example.com/services/T0/B0/x",
        "https://hunter2@hooks.example.com/x",
        "http://u:hunter2@[::1]:8080/x",
        "https://:hunter2@hooks.example.com/x",
    ],
)
def test_a_webhook_url_with_a_user_or_password_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(UserError) as e:
        check_urls([url], "--notify")
    message = str(e.value)
    assert "a user or password in the URL is not allowed" in message
    assert "hunter2" not in message and "bot" not in message and "\n" not in message


@pytest.mark.parametrize("url", ["http://[::1/hook", "https://[zz::1]/x", "https://h:99999999/x"])
def test_a_malformed_webhook_url_is_one_line(url: str) -> None:
    with pytest.raises(UserError, match=r"^--notify \S+: not a valid URL"):
        check_urls([url], "--notify")
