"""The controller's side of mirrored outputs: which jobs get the mirror, ENTRY with
--resume-args on relaunches only, run.sh's lines, and the restore command each node runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.base.errors import UserError
from scripts.cli_options import glue_resume_args, resume_args
from scripts.job import data_io as outputs
from scripts.job.data_io import (
    attempt_entry,
    build_restore_command,
    output_env,
    vertex_output_env,
)
from scripts.job.node_scripts import build_node_command
from scripts.job.records import Job


def test_the_mirror_is_for_trainers_that_do_not_upload_their_own() -> None:
    nano = Job("r1", entry=("train.py", "cfg.py"))
    assert output_env("gs://b/p/", nano) == {"GPUTRAIN_OUT_URI": "gs://b/p/runs/r1/out/"}
    assert output_env("gs://b/", Job("r1", entry=("-m", "trainer.train", "--preset", "tiny"))) == {}
    assert output_env(None, nano) == {}
    assert output_env("gs://b/", Job("r1", entry=("-m", "gputrain_node.healthcheck"))) == {}


def test_a_users_own_trainer_package_is_mirrored_like_any_trainer(tmp_path: Path) -> None:
    """`-m trainer.train` is ours only where the upload adds our trainer: a project with its own
    `trainer/` runs its own, which does not upload checkpoints by itself."""
    job = Job("r1", entry=("-m", "trainer.train"), workdir=tmp_path)
    assert output_env("gs://b/", job) == {}
    (tmp_path / "trainer").mkdir()
    assert output_env("gs://b/", job) == {"GPUTRAIN_OUT_URI": "gs://b/runs/r1/out/"}


def test_a_vertex_job_carries_the_resume_args_its_replicas_append_themselves() -> None:
    from gputrain_node import contract  # the names the replica reads: the same

    nano = Job("r1", entry=("train.py",), resume_args=("--init_from=resume", "a b"))
    assert vertex_output_env("gs://b/", nano) == {
        "GPUTRAIN_OUT_URI": "gs://b/runs/r1/out/",
        "GPUTRAIN_RESUME_ARGS": '["--init_from=resume", "a b"]',
    }
    assert vertex_output_env("gs://b/", Job("r1", entry=("-m", "trainer.train"))) == {}
    for name in ("OUT_URI_ENV", "RESUME_ARGS_ENV", "ATTEMPT_ENV", "MIRROR_INTERVAL_ENV"):
        assert getattr(outputs, name) == getattr(contract, name)


def test_resume_args_come_after_the_first_attempt() -> None:
    job = Job("r1", entry=("train.py", "cfg.py"), resume_args=("--init_from=resume",))
    assert attempt_entry(job) == ("train.py", "cfg.py")
    again = Job("r1", entry=job.entry, resume_args=job.resume_args, attempt=2, rdzv_port=29500)
    assert attempt_entry(again) == ("train.py", "cfg.py", "--init_from=resume")
    script = build_node_command(
        again, nnodes=2, nproc_per_node=1, head_address="10.0.0.1", python="py"
    )
    assert "export GPUTRAIN_ATTEMPT=2\n" in script
    assert "train.py cfg.py --init_from=resume" in script
    assert (
        '-m gputrain_node.mirror_out --dir "$RUN/out" --uri "${GPUTRAIN_OUT_URI%/}/$NODE_NAME/"'
        in script
    )
    assert script.index('kill -USR1 "$MIRROR"') < script.index("> exitcode")  # flushed first


def test_the_cli_form_of_resume_args() -> None:
    argv = [
        "run",
        "--resume-args",
        "--init_from=resume --x 'a b'",
        "--",
        "t.py",
        "--resume-args",
        "y",
    ]
    assert glue_resume_args(argv) == [
        "run", "--resume-args=--init_from=resume --x 'a b'", "--", "t.py", "--resume-args", "y",
    ]  # fmt: skip
    assert resume_args("--init_from=resume --x 'a b'") == ("--init_from=resume", "--x", "a b")
    with pytest.raises(UserError, match="--resume-args"):
        resume_args("'unclosed")


def test_the_out_dir_is_restored_only_on_relaunches_with_a_bucket() -> None:
    env = {"GPUTRAIN_OUT_URI": "gs://b/runs/r1/out/", "STORAGE_EMULATOR_HOST": "http://h:1"}
    assert build_restore_command(Job("r1", env=env), "node-1", "python3") is None
    assert build_restore_command(Job("r1", attempt=2), "node-1", "python3") is None
    restore = build_restore_command(Job("r1", env=env, attempt=2), "node-1", "python3")
    assert restore is not None
    again, stdin = restore
    assert "python3 - --restore --dir .gputrain/runs/r1/out" in again
    assert "--uri gs://b/runs/r1/out/node-1/" in again
    # the working directory's files: beside the out dirs, into the run's workdir/ (the start
    # links them into the new code snapshot), after this node's own newer ones were kept there
    assert (
        "--changed-dir .gputrain/runs/r1/workdir --changed-uri gs://b/runs/r1/workdir/node-1/"
        in again
    )
    assert again.index("find code -newer pgid") < again.index("--restore")
    assert "http://h:1" not in again  # --env values come on stdin, never in an argv
    assert stdin.startswith(b"#gputrain-secrets\nGPUTRAIN_OUT_URI ")
    assert b"def restore(" in stdin  # mirror_out, before the code is there


def test_nanogpt_lines_tell_the_step_reached_and_resumed_from() -> None:
    from scripts.watch.telemetry import StepWatch

    w = StepWatch(clock=lambda: 7.0)
    w.line("n1", "[rank1]:iter 0: loss 5.5433, time 533.20ms, mfu -100.00%")
    w.line("n1", "[rank1]:iter 150: loss 1.2, time 5.00ms, mfu 0.01%")
    assert (w.reached, w.start_step, w.first_step_at) == (150, 0, 7.0)
    fired: list[int] = []
    w.new_attempt(lambda: fired.append(1))
    w.line("n1", "[rank1]:Resuming training from /x/out/nanogpt")
    w.line("n1", "[rank1]:iter 100: loss 1.5, time 1321.44ms, mfu -100.00%")
    w.line("n1", "[rank1]:iter 110: loss 1.4, time 12.00ms, mfu 0.00%")
    assert (w.start_step, w.reached, fired) == (100, 110, [1])


def test_the_restore_command_gets_its_variables_from_stdin_and_the_source_after(
    tmp_path: Path,
) -> None:
    """The --env values are read off stdin by shell builtins; what follows is the interpreter's
    script, whole (run here with a stand-in interpreter that prints both)."""
    import subprocess

    stand_in = tmp_path / "py"
    stand_in.write_text('#!/bin/sh\necho "host=$STORAGE_EMULATOR_HOST"\nhead -c 200\n')
    stand_in.chmod(0o755)
    env = {"GPUTRAIN_OUT_URI": "gs://b/runs/r1/out/", "STORAGE_EMULATOR_HOST": "http://h:1"}
    restore = build_restore_command(Job("r1", env=env, attempt=2), "node-1", str(stand_in))
    assert restore is not None
    cmd, stdin = restore
    done = subprocess.run(
        ["sh", "-c", cmd], input=stdin, cwd=tmp_path, capture_output=True, check=True
    )
    out = done.stdout.decode()
    assert out.startswith("host=http://h:1\n")
    assert out[len("host=http://h:1\n") :] == outputs.MIRROR_SOURCE.read_text()[:200]


def test_nodes_but_rank_0s_get_its_files_on_relaunches_and_resumes() -> None:
    env = {"GPUTRAIN_OUT_URI": "gs://b/runs/r1/out/"}
    for job in (Job("r1", env=env, attempt=2), Job("r1", env=env, resumed=True)):
        worker = build_restore_command(job, "node-1", "python3", "node-0")
        assert worker is not None
        assert (
            "--fill-uri gs://b/runs/r1/out/node-0/ --fill-changed-uri gs://b/runs/r1/workdir/"
            "node-0/ --filled .gputrain/runs/r1/filled" in worker[0]
        )
        head = build_restore_command(job, "node-0", "python3", "node-0")
        assert head is not None and "--fill-uri" not in head[0]
    assert build_restore_command(Job("r1", env=env), "node-1", "python3", "node-0") is None
    script = build_node_command(
        Job("r1", env=env, rdzv_port=29500),
        nnodes=2,
        nproc_per_node=1,
        head_address="h",
        python="p",
    )
    assert '--filled "$RUN/filled"' in script  # the mirror leaves the fills alone


def test_the_files_a_fill_gave_a_node_do_not_come_home_as_its_own(tmp_path: Path) -> None:
    """Once the job is over, a fill still as the fill left it is removed before the download
    (rank 0's node brings it home); one the node's job rewrote since is its own and kept."""
    import subprocess

    (tmp_path / "out").mkdir()
    (tmp_path / "workdir").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_text("rank 0's")
    (tmp_path / "workdir" / "snapshot.pt").write_text("3")
    (tmp_path / "workdir" / "own.txt").write_text("its own")
    record = ""
    for rel in ("out/ckpt.pt", "workdir/snapshot.pt"):
        st = (tmp_path / rel).stat()
        record += f"{rel}\t{st.st_size}\t{st.st_mtime_ns}\t7\n"
    (tmp_path / "filled").write_text(record)
    (tmp_path / "workdir" / "snapshot.pt").write_text("12")  # the node's job saved it again
    running = subprocess.run(["sh", "-c", outputs.FORGET_FILLED_SH], cwd=tmp_path)
    assert running.returncode == 0 and (tmp_path / "out" / "ckpt.pt").exists()  # still running
    (tmp_path / "exitcode").write_text("0 1.0")
    subprocess.run(["sh", "-c", outputs.FORGET_FILLED_SH], cwd=tmp_path, check=True)
    assert not (tmp_path / "out" / "ckpt.pt").exists()
    assert (tmp_path / "workdir" / "snapshot.pt").read_text() == "12"
    assert (tmp_path / "workdir" / "own.txt").exists()


def test_a_relaunch_without_a_bucket_says_what_rank_0_alone_has(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from infra.base.records import Fleet, Node
    from scripts.job.data_io import prepare_outputs

    fleet = Fleet("t", (Node("n0", "head", "10.0.0.1"), Node("n1", "worker", "10.0.0.2")))
    prepare_outputs(fleet, {}, Job("r1", entry=("multinode.py",), attempt=2))
    assert capsys.readouterr().err == (
        "warning: no bucket mirrors this run's files: every node resumes from what it kept "
        "itself; what rank 0 alone wrote is only on n0\n"
    )
    prepare_outputs(fleet, {}, Job("r1", entry=("multinode.py",)))  # a first attempt: nothing
    prepare_outputs(Fleet("t", fleet.nodes[:1]), {}, Job("r1", resumed=True))  # one node
    assert capsys.readouterr().err == ""
