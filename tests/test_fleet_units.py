"""Pure parts of the fleet code: command building and quoting, parsing, planning, comparisons."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.base.errors import UserError
from infra.base.records import GpuExpectation
from scripts.job.diagnosis import root_cause_lines
from scripts.job.node_scripts import (
    build_node_command,
    build_start_command,
    build_stop_command,
    build_tail_command,
    parse_exitcode,
)
from scripts.job.records import Job, validate_job
from scripts.job.sync import check_size, collect_sources, plan_upload, sync_code
from scripts.transport.hostkeys import fingerprint, known_hosts_name, parse_public_key
from scripts.transport.local import LocalTransport
from scripts.verify.gpus import GPU_FIELDS, check_gpus, parse_gpu_csv

HOSTILE = ("a b", "$HOME", "'q'", 'd"q', "x;touch pwned", "`id`", "$(id)", "*", "", "-m", "\\n")

FAKE_PY = """#!/bin/sh
# stands in for python: records argv (one per line, NUL-safe enough for the test) and env
for a in "$@"; do printf '%s\\n' "$a"; done > "$OUT_ARGS"
env > "$OUT_ENV"
"""


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
    with pytest.raises(UserError, match=r"run id: 'a b'"):
        validate_job(Job(run_id="a b"))
    with pytest.raises(UserError, match=r"env: variable name 'A-B'"):
        validate_job(Job(run_id="ok", env={"A-B": "1"}))
    with pytest.raises(UserError, match="rendezvous port: 80"):
        validate_job(Job(run_id="ok", rdzv_port=80))
    validate_job(Job(run_id="ok"))
    assert Job(run_id="x").entry == ("-m", "trainer.train", "--preset", "tiny")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie waits for its parent; it runs nothing


def test_detached_start_tail_and_stop_kill_the_whole_tree(tmp_path: Path) -> None:
    t = LocalTransport("n", tmp_path)
    # a job whose child sits in its own session, like torchrun's workers
    script = "echo $$ > pgid\nsetsid sleep 300 &\necho $! > child\necho $! > jobpid\nwait\n"
    r = t.run(f"mkdir -p .gputrain/code && {build_start_command('j1')}", 10, stdin=script.encode())
    assert r.ok and r.stdout.strip().isdigit()
    pgid = int(r.stdout)
    run = tmp_path / ".gputrain" / "runs" / "j1"
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
        assert not _running(pid)
    lines: list[str] = []
    (run / "torchrun.log").write_text("one\ntwo\nthree\n")
    assert t.stream(build_tail_command("j1", 1), lines.append, timeout=10) == 0
    assert lines == ["two", "three"]  # resumes after the lines already seen; ends with the job


def test_parse_gpu_csv_and_unknowns() -> None:
    assert len(GPU_FIELDS) == 9
    text = (
        "0, NVIDIA A100-SXM4-40GB, GPU-aaa, 40960, 550.54.15, 0, 00000000:00:04.0, 31, 0\n"
        "1, NVIDIA A100-SXM4-40GB, GPU-bbb, 40960, 550.54.15, [N/A], 00000000:00:05.0, N/A, 0\n"
    )
    gpus = parse_gpu_csv(text)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].memory_mib == 40960 and gpus[0].ecc_uncorrected == 0
    assert gpus[1].ecc_uncorrected is None and gpus[1].temperature_c is None
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        parse_gpu_csv("NVIDIA-SMI has failed because it couldn't communicate with the driver")


def test_check_gpus_lists_every_problem() -> None:
    gpus = parse_gpu_csv(
        "0, Tesla T4, GPU-a, 15360, 535.1, 2, 0:4, 30, 0\n1, NVIDIA L4, GPU-b, 23034, [N/A], 0, 0:5, 30, 0\n"
    )
    problems = check_gpus(gpus, GpuExpectation(model="NVIDIA L4", count=4, min_memory_mib=20000))
    assert problems == [
        "found 2 GPU(s), expected 4",
        "GPU 0 is 'Tesla T4', expected 'NVIDIA L4'",
        "GPU 0 has 15360 MiB, expected at least 20000 MiB",
        "GPU 0 has 2 uncorrected ECC error(s)",
        "GPU 1: driver version unknown",
    ]
    assert check_gpus([], GpuExpectation()) == []  # cpu


def test_root_cause_prefers_earliest_error_json() -> None:
    late = {
        "message": {
            "message": "ValueError: later",
            "extraInfo": {
                "py_callstack": "Traceback (most recent call last):\n  File x\nValueError: later",
                "timestamp": "200",
            },
        }
    }
    early = {
        "message": {
            "message": "RuntimeError: first",
            "extraInfo": {
                "py_callstack": "Traceback (most recent call last):\n  File y\nRuntimeError: first",
                "timestamp": "100",
            },
        }
    }
    lines = root_cause_lines([json.dumps(late), json.dumps(early)], ["log"])
    assert lines[-1] == "RuntimeError: first"
    assert root_cause_lines([], ["", "a", "b"], max_lines=1) == ["b"]
    assert parse_exitcode("") == (None, None)
    assert parse_exitcode("143 1700000000.5") == (143, 1700000000.5)


def test_fingerprint_matches_openssh(tmp_path: Path) -> None:
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    line = key.with_suffix(".pub").read_text()
    ktype, blob = parse_public_key(line)
    expected = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(key) + ".pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert fingerprint(blob) == expected and ktype == "ssh-ed25519"
    digest = base64.b64encode(hashlib.sha256(base64.b64decode(blob)).digest()).decode()
    assert expected == "SHA256:" + digest.rstrip("=")
    assert known_hosts_name("10.0.0.1", 22) == "10.0.0.1"
    assert known_hosts_name("10.0.0.1", 2222) == "[10.0.0.1]:2222"


def _git_repo(path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / ".gitignore").write_text("data/\n*.ckpt\n")
    (path / "train.py").write_text("print('hi')\n")
    (path / "data").mkdir()
    (path / "data" / "big.bin").write_bytes(b"x" * 1000)
    (path / "model.ckpt").write_bytes(b"x" * 10)
    (path / "lib").mkdir()
    (path / "lib" / "util.py").write_text("X = 1\n")


def test_collect_respects_gitignore_and_size_limit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _git_repo(repo)
    files = collect_sources(repo)
    assert sorted(files) == [".gitignore", "lib/util.py", "train.py"]
    # `--local` node state under a runs/ that git does not ignore is never shipped back
    node_code = repo / "runs" / "local" / "node" / ".gputrain" / "code"
    node_code.mkdir(parents=True)
    (node_code / "train.py").write_text("print('hi')\n")
    assert sorted(collect_sources(repo)) == [".gitignore", "lib/util.py", "train.py"]
    (repo / "weights.bin").write_bytes(b"w" * 2 * 1024 * 1024)
    with pytest.raises(
        UserError, match=r"above the limit of 1 MiB; biggest files: weights.bin \(2.0 MiB\)"
    ):
        check_size(collect_sources(repo), 1, repo)
    # not a git repository: a walk that skips .git/.venv/__pycache__/runs
    plain = tmp_path / "plain"
    (plain / ".venv").mkdir(parents=True)
    (plain / ".venv" / "x.py").write_text("")
    (plain / "runs").mkdir()
    (plain / "runs" / "r.json").write_text("")
    (plain / "a.py").write_text("")
    assert sorted(collect_sources(plain, {"pkg": repo / "lib"})) == ["a.py", "pkg/util.py"]


def test_plan_upload_sends_only_changes() -> None:
    plan = plan_upload({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "old", "gone": "9"})
    assert plan.send == ("b", "c") and plan.delete == ("gone",)


def test_sync_skips_unchanged_files_and_removes_deleted(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _git_repo(repo)
    t = LocalTransport("n", tmp_path / "node")
    first = sync_code(t, collect_sources(repo), staging=tmp_path / "s1")
    assert first.send == (".gitignore", "lib/util.py", "train.py")
    again = sync_code(t, collect_sources(repo), staging=tmp_path / "s2")
    assert again.send == () and again.delete == ()
    (repo / "train.py").write_text("print('changed')\n")
    (repo / "lib" / "util.py").unlink()
    third = sync_code(t, collect_sources(repo), staging=tmp_path / "s3")
    assert third.send == ("train.py",) and third.delete == ("lib/util.py",)
    code = tmp_path / "node" / ".gputrain" / "code"
    assert (code / "train.py").read_text() == "print('changed')\n"
    assert not (code / "lib" / "util.py").exists()


def test_local_transport_roundtrip(tmp_path: Path) -> None:
    t = LocalTransport("n", tmp_path / "node")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.txt").write_text("hello")
    sync_code(t, {"d/f.txt": src / "d" / "f.txt"}, remote_dir="up", staging=tmp_path / "s")
    assert t.run("cat up/d/f.txt", 5).stdout == "hello"
    assert t.download("up", tmp_path / "back") is True
    assert (tmp_path / "back" / "d" / "f.txt").read_text() == "hello"
    assert t.download("missing", tmp_path / "none") is False
    got: list[str] = []
    assert t.stream("printf 'a\\nb'; exit 4", got.append, timeout=5) == 4
    assert got == ["a", "b"]
    assert t.run("echo $GPUTRAIN_NODE_ROOT", 5).stdout.strip() == str((tmp_path / "node").resolve())
    assert sys.executable


def _err(message: str, ts: int) -> str:
    return json.dumps(
        {
            "message": {
                "message": message,
                "extraInfo": {"py_callstack": message, "timestamp": str(ts)},
            }
        }
    )


def test_first_failure_prefers_the_cause_over_its_consequences() -> None:
    from scripts.job.diagnosis import FailureFacts, first_failure

    cause = FailureFacts("w1", 1, (_err("RuntimeError: deliberate", 100),), ended_at=12.0)
    peer = FailureFacts(
        "h0", 1, (_err("RuntimeError: Connection closed by peer [10.0.0.2]", 100),), 11.0
    )
    assert first_failure([peer, cause]) == "w1"  # same second: the peer's error is a consequence
    killed = FailureFacts("w2", None, (), ended_at=20.0)
    assert first_failure([peer, cause, killed]) == "w2"  # killed without a word comes first
    early = FailureFacts("a", 1, (_err("ValueError: x", 90),), 30.0)
    assert first_failure([cause, early]) == "a"  # then by error time
    assert first_failure([FailureFacts("p", 2, (), 5.0), FailureFacts("q", 3, (), 4.0)]) == "q"


def test_root_cause_without_error_file_is_the_workers_traceback() -> None:
    """torchrun's ChildFailedError report says nothing of the cause: show the worker's lines."""
    log = [
        "[rank1]:Traceback (most recent call last):",
        '[rank1]:  File "job.py", line 7, in <module>',
        "[rank1]:PermissionError: [Errno 13] Permission denied: '/data'",
        "Traceback (most recent call last):",
        '  File "torch/distributed/run.py", line 900, in main',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "  exitcode  : 1 (pid: 4651)",
    ]
    lines = root_cause_lines([], log)
    assert lines[-1] == "[rank1]:PermissionError: [Errno 13] Permission denied: '/data'"
    assert not any("ChildFailedError" in ln for ln in lines)


def test_error_json_is_parsed_once_for_cause_and_timing() -> None:
    from scripts.job.diagnosis import error_summary, parse_error_file, split_error_files

    text = _err("RuntimeError: Connection closed by peer [10.0.0.2]", 100)
    err = parse_error_file(text)
    assert err is not None and err.timestamp == 100.0 and err.message.startswith("RuntimeError")
    assert parse_error_file("not json") is None and parse_error_file("[1, 2]") is None
    assert split_error_files(f"{text}\n\036\n{_err('x', 5)}\n\036\n") == [text, _err("x", 5)]
    assert error_summary([text]) == (100.0, True)  # a lost peer: a consequence
    assert error_summary([_err("ValueError: mine", 7), text]) == (7.0, False)
    assert error_summary([]) == (float("inf"), False)


def test_connect_errors_say_what_the_socket_said() -> None:
    """A silent link ends in EHOSTUNREACH, which paramiko wraps like a refusal: name it right."""
    import errno

    from paramiko.ssh_exception import NoValidConnectionsError

    from scripts.transport.ssh import classify_connect_error

    def wrapped(code: int) -> NoValidConnectionsError:
        return NoValidConnectionsError({("10.0.0.2", 22): OSError(code, os.strerror(code))})

    assert classify_connect_error(wrapped(errno.EHOSTUNREACH)) == "no route to host"
    assert classify_connect_error(wrapped(errno.ECONNREFUSED)) == "connection refused"
    assert classify_connect_error(OSError(errno.ENETUNREACH, "Network is unreachable")) == (
        "network is unreachable"
    )
    assert classify_connect_error(TimeoutError("timed out")) == "timed out"


def test_status_lines_update_in_place_on_a_terminal_and_throttle_otherwise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import io

    from rich.console import Console

    from scripts.ui import StatusLines

    now = [0.0]
    plain = StatusLines(tty=False, every_s=5.0, clock=lambda: now[0])
    for second in range(13):  # a wait polled every second for 12 s, on two nodes
        now[0] = float(second)
        for node in ("a", "b"):
            plain.update(node, f"waiting ({12 - second} s left)")
    plain.update("a", "connected", final=True)
    assert capsys.readouterr().out.splitlines() == [
        "a: waiting (12 s left)",
        "b: waiting (12 s left)",
        "a: waiting (7 s left)",
        "b: waiting (7 s left)",
        "a: waiting (2 s left)",
        "b: waiting (2 s left)",
        "a: connected",
    ]
    screen = io.StringIO()
    live = StatusLines(tty=True, console=Console(file=screen, force_terminal=True, width=80))
    for second in range(13):
        for node in ("a", "b"):
            live.update(node, f"waiting ({12 - second} s left)")
    live.update("a", "connected", final=True)
    live.close()
    assert capsys.readouterr().out == ""  # nothing scrolled by: the lines were redrawn in place
    assert live.render().plain.splitlines() == ["a: connected", "b: waiting (0 s left)"]
    # the last frame: what follows the last "cursor up, erase line" of the redraw
    up, erase = "\x1b[1A", "\x1b[2K"
    assert up + erase in screen.getvalue()
    frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue().rsplit(up + erase, 1)[1])
    assert frame.splitlines() == ["a: connected", "b: waiting (0 s left)"]
