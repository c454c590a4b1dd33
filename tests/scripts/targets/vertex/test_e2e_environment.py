"""`setup` and requirements on `backend: vertex`, end to end and offline (the world of tests/support/vertex_world.py:
the fake stack runner, the fake Vertex AI whose runner starts one real `gputrain_node.vertex_entry`
process per replica): the commands and the requirement list travel as data in the CustomJob's env,
every replica installs and runs them in the job's working directory before torchrun, their lines
reach the job's log as `[setup]`, and a failing setup fails the job naming the replica and its
exit code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.vertex_world import World, assert_torn_down
from tests.support.wheelhouse import build_wheel

SETUP = 'echo "making data in $(basename "$PWD")"\necho 99 > data.txt\n'


def _job_env(w: World) -> dict[str, str]:
    [body] = w.created()[-1:]
    pool = body["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]
    return {e["name"]: e["value"] for e in pool["env"]}


def test_the_stack_setup_runs_on_every_replica_before_training(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    stack_file = w.dir / "project" / "Pulumi.vtest.yaml"
    indented = "".join(f"    {line}\n" for line in SETUP.splitlines())
    stack_file.write_text(stack_file.read_text() + "  gputrain:setup: |\n" + indented)
    rc = w.run("run", "--stack", "vtest", "--yes", "--skip-preflight", "--", "-m", "jobs.answer")
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-2000:]
    env = _job_env(w)
    assert env["GPUTRAIN_SETUP"] == SETUP  # as data, byte for byte
    assert env["GPUTRAIN_SETUP_TIMEOUT"] == "1800"
    assert "GPUTRAIN_REQUIREMENTS" not in env  # the working directory has no requirement files
    for replica in ("chief", "worker-1"):  # in the job's working directory, before torchrun
        assert f"[{replica}] [setup] making data in files" in out
    # the training read what setup wrote (data.txt said 41 when it was packaged)
    assert "[chief] answer 100 from rank 0" in out and "[worker-1] answer 100 from rank 1" in out
    assert (w.run_dir / "model" / "answer.txt").read_text() == "100"
    # the chief's setup lines are in the run's results too, as setup.log is on the nodes
    assert "[setup] making data in files\n" in (w.run_dir / "model" / "setup.log").read_text()
    assert_torn_down(w)


def test_a_failing_setup_fails_the_job_naming_the_replica_and_the_exit_code(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    failing = 'echo "about to fail"; [ "$(hostname)" = never ] || exit 7; echo not reached'
    argv = ["run", "--stack", "vtest", "--yes", "--skip-preflight", "--setup", failing]
    rc = w.run(*argv, "--", "-m", "jobs.answer")
    out, err = capsys.readouterr()
    assert rc == 1, out[-3000:] + err[-2000:]
    first = err.strip().splitlines()[0]
    assert first.startswith("gputrain: error: Vertex job ") and " FAILED: " in first, first
    assert "exited with a non-zero status of 7" in first  # the replica's status is setup's
    log = (w.run_dir / "vertex.log").read_text()
    assert "[setup] about to fail" in log and "not reached" not in log
    assert "] error: setup on workerpool" in log and ": exited with code 7; see its [setup]" in log
    assert "answer 4" not in log and "answer 1" not in log  # the training never started
    assert_torn_down(w)


def test_a_setup_past_its_timeout_is_stopped_and_named(
    world: Callable[..., World], capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    argv = ["run", "--stack", "vtest", "--yes", "--skip-preflight", "--setup", "sleep 300"]
    rc = w.run(*argv, "--setup-timeout", "2", "--", "-m", "jobs.answer")
    out, err = capsys.readouterr()
    assert rc == 1, out[-3000:] + err[-2000:]
    assert "exited with a non-zero status of 124" in err.strip().splitlines()[0]
    assert ": timed out after 2 s (--setup-timeout)" in (w.run_dir / "vertex.log").read_text()
    assert_torn_down(w)  # no `sleep` left behind


def test_requirements_install_into_a_venv_that_still_sees_torch(
    world: Callable[..., World], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = world()
    wheel = build_wheel("vx-tinypkg", tmp_path / "wheels", module_body="ANSWER = 'from a wheel'\n")
    Path("requirements.txt").write_text(
        f"--no-index\n--find-links {wheel.parent}\nvx-tinypkg==1.0\n"
    )
    Path("jobs/uses_pkg.py").write_text(
        "import os, sys, torch, vx_tinypkg\n"
        "print('pkg', os.environ['RANK'], vx_tinypkg.ANSWER, sys.prefix != sys.base_prefix, "
        "bool(torch.__version__), flush=True)\n"
    )
    argv = [
        "run",
        "--stack",
        "vtest",
        "--yes",
        "--skip-preflight",
        "--setup",
        "python -c 'import vx_tinypkg'",
    ]
    rc = w.run(*argv, "--", "-m", "jobs.uses_pkg")
    out, err = capsys.readouterr()
    assert rc == 0, out[-3000:] + err[-2000:]
    assert '"requirements_txt": true' in _job_env(w)["GPUTRAIN_REQUIREMENTS"]
    assert "[chief] [requirements] " in out and "vx-tinypkg" in out
    for rank in ("0", "1"):  # torchrun ran in the venv (sys.prefix), torch still imported
        assert f"pkg {rank} from a wheel True True" in out
    assert_torn_down(w)
