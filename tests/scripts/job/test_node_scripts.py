"""The node scripts: torchrun's command line with hostile arguments passed verbatim, the job's
settings checked, and a detached job started, tailed and stopped with its whole process tree."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from infra.base.errors import UserError
from scripts.job.node_scripts import (
    EXIT_CODE_LINE,
    EXIT_CODE_PENDING,
    UNPACK_FAILED,
    build_follow_command,
    build_node_command,
    build_running_command,
    build_sections_command,
    build_stop_command,
    build_tail_command,
    build_upload_and_start_command,
    forget_run_script_line,
    parse_exitcode,
    parse_sections,
    split_follow_line,
)
from scripts.job.records import Job, validate_job
from scripts.job.sync import CodeBundle
from scripts.transport.local import LocalTransport
from tests.support import alive
from tests.support.fake_python import FAKE_PY

HOSTILE = ("a b", "$HOME", "'q'", 'd"q', "x;touch pwned", "`id`", "$(id)", "*", "", "-m", "\\n")


def test_node_command_passes_arguments_verbatim_and_sets_env(tmp_path: Path) -> None:
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    job = Job(
        run_id="r-1",
        entry=("-m", "trainer.train", *HOSTILE),
        env={"WANDB_MODE": "off it's", "X": "$(touch pwned2)"},
        max_restarts=2,
        rdzv_port=29400,
    )
    script = build_node_command(
        job, nnodes=3, nproc_per_node=4, head_address="127.0.0.1", python=str(fake)
    )
    run = tmp_path / "run"
    (run / "code").mkdir(parents=True)
    env = {
        "PATH": os.environ["PATH"],
        "OUT_ARGS": str(tmp_path / "args"),
        "OUT_ENV": str(tmp_path / "env"),
    }
    (run / "run.sh").write_text(script)
    r = subprocess.run(["sh", "run.sh"], cwd=run, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    argv = (tmp_path / "args").read_text().split("\n")[:-1]
    assert argv[:2] == ["-m", "torch.distributed.run"]
    opts = argv[2 : argv.index("-m", 2)]
    assert opts[opts.index("--nnodes") + 1] == "3"
    assert opts[opts.index("--nproc-per-node") + 1] == "4"
    assert opts[opts.index("--rdzv-backend") + 1] == "c10d"
    assert opts[opts.index("--rdzv-endpoint") + 1] == "127.0.0.1:29400"
    assert opts[opts.index("--rdzv-id") + 1] == "r-1"
    assert opts[opts.index("--max-restarts") + 1] == "2"
    assert opts[opts.index("--log-dir") + 1] == str(run / "logs")
    assert argv[argv.index("-m", 2) :] == ["-m", "trainer.train", *HOSTILE]
    envs = dict(
        line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line
    )
    assert envs["WANDB_MODE"] == "off it's" and envs["X"] == "$(touch pwned2)"
    assert envs["GLOO_SOCKET_IFNAME"] == envs["NCCL_SOCKET_IFNAME"] == "lo"  # holds 127.0.0.1
    assert envs["GPUTRAIN_OUT"] == str(run / "out")
    assert envs["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert parse_exitcode((run / "exitcode").read_text())[0] == 0
    assert not (run / "code" / "pwned").exists() and not (run / "pwned2").exists()


def test_validate_job_rejects_bad_settings() -> None:
    with pytest.raises(UserError, match=r"run id 'a b'"):
        validate_job(Job(run_id="a b"))
    with pytest.raises(UserError, match=r"env: variable name 'A-B'"):
        validate_job(Job(run_id="ok", env={"A-B": "1"}))
    with pytest.raises(UserError, match="rendezvous port: 80"):
        validate_job(Job(run_id="ok", rdzv_port=80))
    validate_job(Job(run_id="ok"))
    assert Job(run_id="x").entry == ("-m", "trainer.train", "--preset", "tiny")


def test_stopping_a_run_that_never_started_says_so(tmp_path: Path) -> None:
    """No run directory, or one whose job never wrote its pgid: `not-started`, never the bare
    `exit 0` of a command that printed nothing."""
    t = LocalTransport("n", tmp_path)
    assert t.run(build_stop_command("never", grace_s=0.5), 20).stdout.strip() == "not-started"
    (tmp_path / ".gputrain" / "runs" / "half").mkdir(parents=True)
    assert t.run(build_stop_command("half", grace_s=0.5), 20).stdout.strip() == "not-started"


def test_detached_start_tail_and_stop_kill_the_whole_tree(tmp_path: Path) -> None:
    t = LocalTransport("n", tmp_path)
    (tmp_path / "src.py").write_text("x = 1\n")
    # a job whose child sits in its own session, like torchrun's workers
    script = (
        f"echo $$ > pgid\nRUN=$PWD\n{forget_run_script_line()}\n"
        "setsid sleep 300 &\necho $! > child\necho $! > jobpid\nwait\n"
    )
    bundle = CodeBundle({"src.py": tmp_path / "src.py"}, run_script=script)
    payload = bundle.payload(bundle.plan(""))
    r = t.run(build_upload_and_start_command("j1", node="n-1"), 10, stdin=payload)
    assert r.ok and r.stdout.strip().isdigit()
    run = tmp_path / ".gputrain" / "runs" / "j1"
    assert (run / "code" / "src.py").read_text() == "x = 1\n"
    assert (run / "node").read_text() == "n-1\n"  # run.sh's NODE_NAME
    for code in (run / "code", tmp_path / ".gputrain" / "code"):  # started from the snapshot,
        assert not (code / ".gputrain-run.sh").exists()  # which the run.sh then removed
    pgid = int(r.stdout)
    for _ in range(50):
        if (run / "child").exists() and (run / "child").read_text().strip():
            break
        time.sleep(0.05)
    child = int((run / "child").read_text())
    os.kill(pgid, 0)
    os.kill(child, 0)
    start = time.monotonic()
    out = t.run(build_stop_command("j1", grace_s=0.5), 20).stdout.strip()
    assert out in ("killed", "terminated")
    assert time.monotonic() - start < 5
    time.sleep(0.1)
    for pid in (pgid, child):
        assert not alive(pid)
    lines: list[str] = []
    (run / "torchrun.log").write_text("one\ntwo\nthree\n")
    assert t.stream(build_tail_command("j1", 1), lines.append, timeout=10) == 0
    assert lines == ["two", "three"]  # resumes after the lines already seen; ends with the job
    # the follow: the same lines, then the exit code (after a last line without a newline, on
    # that line: split_follow_line parts them)
    (run / "exitcode").write_text("3 1700000000.5")
    for log in ("one\ntwo\nthree\n", "one\ntwo\nthree"):
        (run / "torchrun.log").write_text(log)
        lines.clear()
        t.stream(build_follow_command("j1", 1), lines.append, timeout=10)
        parts = [split_follow_line(x) for x in lines]
        assert [p[0] for p in parts if p[0] is not None] == ["two", "three"]
        assert [p[1] for p in parts if p[1] is not None] == [" 3 1700000000.5"]
        assert parse_exitcode(parts[-1][1] or "") == (3, 1700000000.5)
    assert split_follow_line("plain") == ("plain", None)
    # a payload that cannot be unpacked starts nothing and says so by its exit status
    r = t.run(build_upload_and_start_command("j2"), 10, stdin=b"not a tar")
    assert (
        r.exit_code == UNPACK_FAILED
        and not (tmp_path / ".gputrain" / "runs" / "j2" / "pgid").exists()
    )


def test_the_follow_says_pending_while_the_jobs_shell_finishes_after_torchrun(
    tmp_path: Path,
) -> None:
    """torchrun has ended but run.sh is alive (the outputs' last pass): neither an exit code nor
    "killed" — "pending", so the controller follows again; then the code once it is written."""
    t = LocalTransport("n", tmp_path)
    run = tmp_path / ".gputrain" / "runs" / "j1"
    run.mkdir(parents=True)
    shell = subprocess.Popen(["sleep", "30"], cwd=run)  # run.sh runs in its run dir
    try:
        (run / "pgid").write_text(f"{shell.pid}\n")
        (run / "jobpid").write_text("999999999\n")  # torchrun: gone
        (run / "torchrun.log").write_text("one\nmirror: flushed\n")
        lines: list[str] = []
        start = time.monotonic()
        t.stream(build_follow_command("j1", 1, wait_s=0.3), lines.append, timeout=10)
        assert lines == ["mirror: flushed", f"{EXIT_CODE_LINE} {EXIT_CODE_PENDING}"]
        assert time.monotonic() - start < 5
        (run / "exitcode").write_text("0 1700000000.5")
        lines.clear()
        t.stream(build_follow_command("j1", 2, wait_s=0.3), lines.append, timeout=10)
        assert lines == [f"{EXIT_CODE_LINE} 0 1700000000.5"]
        (run / "exitcode").unlink()
        shell.kill()
        shell.wait()
        lines.clear()
        t.stream(build_follow_command("j1", 2, wait_s=0.3), lines.append, timeout=10)
        assert [x.rstrip() for x in lines] == [EXIT_CODE_LINE]  # killed: neither code nor pending
    finally:
        shell.kill()
        shell.wait()


def test_a_pid_files_number_held_by_another_process_is_not_the_run(tmp_path: Path) -> None:
    """A run whose job shell and torchrun are gone without a word (a killed VM that kept its disk,
    SIGKILL) leaves pid files whose numbers the kernel gives to new processes. Such a process is
    not the run's: not a running job, never followed, never stopped; the run's own are."""
    t = LocalTransport("n", tmp_path)
    runs = tmp_path / ".gputrain" / "runs"
    gone, live = runs / "gone", runs / "live"
    for d in (gone / "code", live / "code"):
        d.mkdir(parents=True)
    # another process holds the gone run's numbers; the live run's torchrun works in its code dir
    other = subprocess.Popen(["sleep", "30"], cwd=tmp_path, start_new_session=True)
    torchrun = subprocess.Popen(["sleep", "30"], cwd=live / "code", start_new_session=True)
    try:
        for name in ("pgid", "jobpid"):
            (gone / name).write_text(f"{other.pid}\n")
        (live / "jobpid").write_text(f"{torchrun.pid}\n")
        (gone / "torchrun.log").write_text("one\ntwo\n")
        assert t.run(build_running_command(), 10).stdout.split() == ["live"]
        lines: list[str] = []
        start = time.monotonic()
        t.stream(build_follow_command("gone", 1, wait_s=0.3), lines.append, timeout=10)
        assert lines[0] == "two" and [x.rstrip() for x in lines[1:]] == [EXIT_CODE_LINE]
        assert time.monotonic() - start < 5  # no tail waiting on the other process
        assert t.run(build_stop_command("gone", grace_s=0.5), 20).stdout.strip() == (
            "stopped-already"
        )
        time.sleep(0.1)
        assert alive(other.pid) and alive(torchrun.pid)
    finally:
        for proc in (other, torchrun):
            proc.kill()
            proc.wait()


def test_sections_answer_several_questions_in_one_round_trip(tmp_path: Path) -> None:
    t = LocalTransport("n", tmp_path)
    cmd = build_sections_command(
        {"first": "echo one; echo two", "failing": "echo oops >&2; exit 3", "quiet": "true",
         "last": "printf 'no newline'"}
    )  # fmt: skip
    got = parse_sections(t.run(cmd, 10).stdout)
    assert list(got) == ["first", "failing", "quiet", "last"]
    assert got["first"].ok and got["first"].output == "one\ntwo"
    assert got["failing"].exit_code == 3 and got["failing"].output == "oops"
    assert got["quiet"].ok and got["quiet"].output == ""
    assert got["last"].output == "no newline"
    assert parse_sections(t.run("exit 111", 10).stdout) == {}  # the node never got that far
    with pytest.raises(ValueError, match="section name"):
        build_sections_command({"no spaces": "true"})
