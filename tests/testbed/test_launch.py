"""Real torchrun (gloo, CPU) across test hosts, launched, streamed and collected by scripts/job/.
The job is a DDP one (tests/support/jobs/ddp_sum.py) where its sums or torch's error file are
the subject, the trainer's torch-free stand-in in lockstep where the launcher's handling of a
lost node or link is."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from infra.base.records import Fleet, Node
from scripts.job.launch import launch_torchrun
from scripts.job.records import Job, TrainingError
from scripts.targets.session import close_all, connect
from tests.support import ROOT
from tests.support.testbed import TestBed

pytestmark = pytest.mark.testbed


HOSTILE = ("a b", "$HOME", "'quoted'", 'dq"x', "x;touch /tmp/gputrain-pwned", "`id`", "*", "")


class Lines:
    """Collects the launcher's prefixed lines; lets a test wait for one."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self.cond = threading.Condition()

    def __call__(self, node: str, line: str) -> None:
        with self.cond:
            self.lines.append((node, line))
            self.cond.notify_all()

    def wait_for(self, pattern: str, count: int, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        with self.cond:
            while sum(1 for _, ln in self.lines if re.search(pattern, ln)) < count:
                left = end - time.monotonic()
                assert left > 0, f"no {count} x {pattern!r} in {self.lines[-10:]}"
                self.cond.wait(left)


def _job(run_id: str, steps: int, step_s: float, *args: str, **env: str) -> Job:
    return Job(
        run_id=run_id,
        entry=("tests/support/jobs/ddp_sum.py", *args),
        env={"DDP_STEPS": str(steps), "DDP_STEP_S": str(step_s), **env},
        workdir=ROOT,
    )


def _steps_job(run_id: str, steps: int, step_s: float, *, lockstep: bool = True) -> Job:
    """The trainer's torch-free stand-in (tests/support/jobs/steps.py), without paying torch's
    import in each rank; with `lockstep` its ranks keep in step as DDP's collectives keep them."""
    return Job(
        run_id=run_id,
        entry=("tests/support/jobs/steps.py", str(steps), str(step_s)),
        env={"STEPS_LOCKSTEP": "1"} if lockstep else {},
        workdir=ROOT,
    )


def _steps_seen(lines: Lines, node: str) -> list[int]:
    """The steps the node's rank logged (steps.py's `step N/M | loss X`), in the order seen."""
    return [
        int(m[1]) for n, ln in lines.lines if n == node and (m := re.search(r":step +(\d+)/", ln))
    ]


def test_two_node_ddp_run_streams_prefixed_logs_and_downloads_results(
    tb: TestBed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = [tb.add_host(), tb.add_host()]
    fleet = tb.fleet(hosts)
    ts = connect(fleet, deadline_s=10)
    res = launch_torchrun(fleet, ts, _job("ddp-ok", 3, 0.0, *HOSTILE), tmp_path / "run")
    assert res.ok and res.exit_codes == {hosts[0].name: 0, hosts[1].name: 0}
    out = capsys.readouterr().out
    for _i, h in enumerate(hosts):
        # streamed live, prefixed with the node and (from torchrun) the rank
        assert re.search(rf"^\[{h.name}\] \[rank[01]\]:step 2 sum 3$", out, re.M)
        assert f"[{h.name}] gputrain: {h.name} starts run ddp-ok; interface toward head" in out
        d = tmp_path / "run" / h.name
        results = [json.loads(p.read_text()) for p in d.glob("result-rank*.json")]
        assert len(results) == 1 and results[0]["world"] == 2 and results[0]["sums"] == [3, 3, 3]
        assert results[0]["argv"] == list(HOSTILE)  # verbatim, nothing injected
        assert (d / "torchrun.log").exists() and list((d / "torchrun-logs").rglob("stdout.log"))
    assert not Path("/tmp/gputrain-pwned").exists()
    assert json.loads((tmp_path / "run" / "job.json").read_text())["ok"] is True
    close_all(ts)


def test_killed_node_is_named_and_the_other_stopped(tb: TestBed, tmp_path: Path) -> None:
    hosts = [tb.add_host(), tb.add_host()]
    fleet = tb.fleet(hosts)
    ts = connect(fleet, deadline_s=10)
    lines = Lines()
    killed_at: list[float] = []

    def kill_worker() -> None:
        lines.wait_for(r":step +2/", 2)
        tb.kill_processes(hosts[1].name)
        killed_at.append(time.monotonic())

    threading.Thread(target=kill_worker, daemon=True).start()
    with pytest.raises(TrainingError) as e:
        launch_torchrun(fleet, ts, _steps_job("kill", 200, 0.2), tmp_path / "run", on_line=lines)
    took = time.monotonic() - killed_at[0]
    assert e.value.node == hosts[1].name
    assert e.value.failure.kind == "killed"  # a typed failure: a recovery checks the cloud
    assert f"failed on node {hosts[1].name}" in str(e.value)
    assert took < 30
    codes = e.value.result.exit_codes
    assert codes[hosts[1].name] is None  # killed: no exit code written
    assert codes[hosts[0].name] not in (0, None)  # the other node was stopped / failed
    assert (tmp_path / "run" / hosts[0].name / "torchrun.log").exists()
    close_all(ts)


def test_failing_rank_root_cause_from_error_json(tb: TestBed, tmp_path: Path) -> None:
    hosts = [tb.add_host(), tb.add_host()]
    fleet = tb.fleet(hosts)
    ts = connect(fleet, deadline_s=10)
    job = _job("ddp-fail", 50, 0.1, DDP_FAIL_RANK="1", DDP_FAIL_STEP="2")
    with pytest.raises(TrainingError) as e:
        launch_torchrun(fleet, ts, job, tmp_path / "run", on_line=lambda n, ln: None)
    msg = str(e.value)
    assert "RuntimeError: deliberate failure on rank 1 at step 2" in msg
    assert e.value.node_exit_code == 1 and e.value.exit_code == 1  # CLI exit code stays 1
    assert e.value.failure.kind == "exited" and e.value.failure.root_cause[-1] in msg
    close_all(ts)


def test_dropped_connections_resume_logs_and_run_completes(tb: TestBed, tmp_path: Path) -> None:
    hosts = [tb.add_host(), tb.add_host()]
    fleet = tb.fleet(hosts)
    ts = connect(fleet, deadline_s=10)
    lines = Lines()
    dropped: list[int] = []

    def drop() -> None:
        lines.wait_for(r":step +3/", 2)
        dropped.extend(tb.drop_connections(h.name) for h in hosts)

    threading.Thread(target=drop, daemon=True).start()
    steps = 20
    res = launch_torchrun(
        fleet, ts, _steps_job("drop", steps, 0.15), tmp_path / "run", on_line=lines
    )
    assert res.ok and all(n > 0 for n in dropped)
    for h in hosts:
        # every step exactly once: resumed where it stopped, no gap, no repeat
        assert _steps_seen(lines, h.name) == list(range(1, steps + 1))
    close_all(ts)


def test_silent_link_that_returns_resumes_the_log_without_gaps(tb: TestBed, tmp_path: Path) -> None:
    hosts = [tb.add_host(), tb.add_host()]
    fleet = tb.fleet(hosts)
    ts = connect(fleet, deadline_s=10, connect_timeout=2, probe_after_s=1.5)
    lines = Lines()
    events: list[str] = []

    def flap() -> None:
        lines.wait_for(r":step +2/", 2)
        tb.set_link(hosts[1].name, up=False)  # no FIN: the stream just goes quiet
        time.sleep(6)
        tb.set_link(hosts[1].name, up=True)
        events.append("up")

    threading.Thread(target=flap, daemon=True).start()
    steps = 30
    res = launch_torchrun(
        fleet, ts, _steps_job("flap", steps, 0.3), tmp_path / "run", on_line=lines,
        reconnect_deadline_s=60,
    )  # fmt: skip
    assert res.ok and events == ["up"]
    for h in hosts:
        assert _steps_seen(lines, h.name) == list(range(1, steps + 1))  # none lost or repeated
    close_all(ts)


def test_silent_link_lost_for_good_names_the_cause_and_the_failed_stop(
    tb: TestBed, tmp_path: Path
) -> None:
    hosts = [tb.add_host(), tb.add_host()]
    fleet = tb.fleet(hosts)
    ts = connect(fleet, deadline_s=10, connect_timeout=2, probe_after_s=1.5)
    lines = Lines()
    worker = hosts[1].name

    def cut() -> None:
        lines.wait_for(r":step +10/", 2)  # the worker's watchdog has seen the head answer
        tb.set_link(worker, up=False)

    threading.Thread(target=cut, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(TrainingError) as e:
        launch_torchrun(
            fleet, ts, _steps_job("cut", 2000, 0.2, lockstep=False), tmp_path / "run",
            on_line=lines,
            reconnect_deadline_s=6, stop_grace_s=2,
        )  # fmt: skip
    took = time.monotonic() - start
    msg = str(e.value)
    assert e.value.failure.kind == "lost" and e.value.node == worker
    # the real cause: what the socket said (no ARP answer: timed out, then no route to host),
    # never "connection refused" (tests/scripts/transport/test_transport.py pins the mapping per errno)
    assert re.search(r"could not reconnect within 6 s \((timed out|no route to host)\)", msg), msg
    assert "connection refused" not in msg
    # the root cause is the lost contact, never the job's normal output
    assert e.value.failure.root_cause == (
        f"lost contact with node {worker}: {e.value.failure.error}",
    )
    assert "| loss" not in msg.split("Root cause:", 1)[1]
    # never claims a stop that failed: the head stopped, the worker could not be
    assert f"stopped {hosts[0].name}" in msg
    assert f"could NOT stop the job on {worker}" in msg and "other nodes stopped" not in msg
    assert took < 60
    close_all(ts)
    # the job ran on on the worker while its link was down (as on a VM whose network died); once
    # the link is back it ends by itself (the worker's watchdog finds the head's rendezvous gone:
    # TERM, SIGKILL after a grace period; or torchrun's agent gives up first), long before the
    # ranks' own end (not in lockstep, the worker's would step on for 400 s), with no controller
    # left to stop it
    tb.set_link(worker, up=True)
    back = time.monotonic()
    ts2 = connect(tb.fleet([hosts[1]]), deadline_s=15)
    run = ".gputrain/runs/cut"
    assert ts2[worker].run(f"grep -c loss {run}/torchrun.log", 10).stdout.strip() != "0"
    ended = ts2[worker].run(
        f"for i in $(seq 120); do [ -s {run}/exitcode ] && break; sleep 0.5; done; "
        f"cat {run}/exitcode; tail -n 5 {run}/torchrun.log",
        90,
    )
    assert ended.stdout.split()[0].isdigit(), ended.stdout + ended.stderr
    assert time.monotonic() - back < 60, ended.stdout
    from scripts.job.launch import stop_job

    assert stop_job(ts2, "cut", grace_s=2)[worker] in ("stopped-already", "terminated")
    close_all(ts2)


def test_local_target_runs_the_same_path(tmp_path: Path) -> None:
    fleet = Fleet(
        target="local",
        nodes=(Node(name="local", role="head", internal_address="127.0.0.1"),),
        python=str(Path(__import__("sys").executable)),
        local=True,
    )
    ts = connect(fleet, deadline_s=5, local_root=tmp_path / "node")
    job = Job(
        run_id="local-1",
        entry=("tests/support/jobs/ddp_sum.py", "x y"),
        env={"DDP_STEPS": "2"},
        workdir=ROOT,
        rdzv_port=29517,
    )
    res = launch_torchrun(fleet, ts, job, tmp_path / "results", on_line=lambda n, ln: None)
    assert res.ok
    data = json.loads((tmp_path / "results" / "local" / "result-rank0.json").read_text())
    assert data["world"] == 1 and data["argv"] == ["x y"]
    assert (tmp_path / "node" / ".gputrain" / "runs" / "local-1" / "exitcode").exists()
