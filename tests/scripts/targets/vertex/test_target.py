"""The Vertex target's parts that the end-to-end runs do not reach: picking the target by the stack's
backend, the preflight's rows, a cancel when the create's answer never came, a run's job found by
label, the stack outputs it accepts, and the CLI's one-line refusals."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from infra.gcp.compute import ComputeApi
from infra.outputs import parse_vertex_outputs
from infra.spec import ClusterSpec, parse_spec
from scripts.cli import main
from scripts.cli_options import open_target
from scripts.job.records import Job
from scripts.settings import Settings
from scripts.targets.gce.target import GceTarget
from scripts.targets.vertex.clients import VertexClients
from scripts.targets.vertex.job import custom_job_body
from scripts.targets.vertex.preflight import vertex_preflight
from scripts.targets.vertex.session import (
    JOB_RECORD,
    RUN_LABEL,
    VertexSession,
    run_label,
)
from scripts.targets.vertex.target import VertexTarget
from tests.support.fake_compute import FakeCompute
from tests.support.fake_stack import FakeStackRunner, sample_outputs, sample_vertex_outputs
from tests.support.fake_vertex import FakeVertex
from tests.support.gcs_emulator import GcsEmulator
from tests.support.pulumi_mocks import ROOT, deployable_config

PROJECT = "gputrain-test"


def _project(tmp_path: Path, **keys: str) -> Settings:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    keys = {"backend": "vertex", **keys}  # one line per key: a duplicate is refused
    lines = [f"  gcp:project: {PROJECT}", *(f"  gputrain:{k}: {v}" for k, v in keys.items())]
    (tmp_path / "Pulumi.vx.yaml").write_text("config:\n" + "\n".join(lines) + "\n")
    return Settings(root=tmp_path, runs_dir=tmp_path / "runs")


def _spec(settings: Settings) -> ClusterSpec:
    from infra.stackfile import load_stack_config

    return parse_spec(load_stack_config(settings.root, "vx"), "vx")


@pytest.fixture
def fv() -> Iterator[FakeVertex]:
    with FakeVertex(project=PROJECT) as fake:
        yield fake


def test_the_stack_backend_picks_the_target(tmp_path: Path) -> None:
    settings = _project(tmp_path)
    assert isinstance(open_target(stack="vx", hosts=None, settings=settings), VertexTarget)
    (tmp_path / "Pulumi.g.yaml").write_text("config:\n  gputrain:machineType: g2-standard-8\n")
    assert isinstance(open_target(stack="g", hosts=None, settings=settings), GceTarget)


def test_cli_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = _project(tmp_path, backend="kubernetes")
    assert main(["plan", "--stack", "vx"], settings) == 2
    assert capsys.readouterr().err.strip() == (
        "gputrain: error: gputrain:backend = 'kubernetes': allowed: gce, vertex"
    )
    settings = _project(tmp_path)
    assert main(["keygen", "--stack", "vx"], settings) == 2
    assert "there are no VMs to log in to" in capsys.readouterr().err
    clients = VertexClients(runner_for=lambda s, r: FakeStackRunner(stack_name="vx"))
    assert main(["train", "--stack", "vx"], settings, vertex=clients) == 2
    assert capsys.readouterr().err.strip() == (
        "gputrain: error: stack vx is not up; run `gputrain up --stack vx`"
    )
    assert main(["run", "--stack", "vx", "--max-recoveries", "2"], settings, vertex=clients) == 2
    assert "re-creates no VMs; allowed only for backend gce stacks" in capsys.readouterr().err


def test_plan_of_a_vertex_stack_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _project(tmp_path, machineType="a2-highgpu-2g", sshPublicKey="ssh-ed25519 x")
    assert main(["plan", "--stack", "vx"], settings) == 0
    out = capsys.readouterr().out
    assert "us-central1 (Vertex AI)" in out and "Vertex training premium +15 %" in out
    assert "ignored with backend vertex: sshPublicKey" in out
    assert "Ready: pulumi up --stack vx" in out  # nothing else to set: no SSH keys, no ranges


def test_outputs_of_the_other_backend_or_a_broken_program_are_refused(tmp_path: Path) -> None:
    settings = _project(tmp_path)
    runner = FakeStackRunner(stack_name="vx")
    target = VertexTarget("vx", settings, VertexClients(runner_for=lambda s, r: runner))
    runner._outputs = sample_outputs("vx", "us-central1-a")  # a GCE cluster of this stack
    with pytest.raises(Exception, match=r"up with backend gce \(it has VMs\); `gputrain down"):
        target._outputs()
    broken = sample_vertex_outputs("vx", "us-central1")
    del broken["serviceAccount"]
    with pytest.raises(Exception, match="stack output serviceAccount is None; expected a string"):
        parse_vertex_outputs(broken)


# ---- cancel and logs find the run's job by its labels ------------------------------------------


def _session(settings: Settings, fv: FakeVertex) -> VertexSession:
    clients = VertexClients(vertex_endpoint=fv.url, poll_s=0.05)
    out = parse_vertex_outputs(sample_vertex_outputs("vx", "us-central1", project=PROJECT))
    return VertexSession(_spec(settings), out, clients, settings)


def _submit(session: VertexSession, run_id: str) -> str:
    from scripts.job.records import Job

    request = session._request(Job(run_id=run_id), "gs://b/staging/x/gputrain-job-0.tar.gz")
    return session.api.create_job(custom_job_body(request)).name


def test_a_create_whose_answer_was_lost_is_still_cancelled(tmp_path: Path, fv: FakeVertex) -> None:
    """Ctrl-C between sending the create and reading its answer: the job is found by its labels."""
    session = _session(_project(tmp_path), fv)
    mine, other_run = _submit(session, "20260101-000000-aaaa"), _submit(session, "other")
    session.cancel(None, "20260101-000000-aaaa")
    states = {j.name: j.state for j in session.api.list_jobs({})}
    assert states[mine] == "JOB_STATE_CANCELLED"
    assert states[other_run] not in ("JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED")
    assert len(fv.requests_to("POST", r":cancel$")) == 1


def test_a_failing_cancel_is_loud_and_names_the_server_side_bound(
    tmp_path: Path, fv: FakeVertex, capsys: pytest.CaptureFixture[str]
) -> None:
    session = _session(_project(tmp_path), fv)
    name = _submit(session, "r1")
    fv.inject_error("POST", r":cancel$", 403, "PERMISSION_DENIED", "no cancel for you")
    session.cancel(name)  # teardown goes on; the user is told the job's time limit
    err = capsys.readouterr().err
    assert "could not cancel the Vertex job(s) of stack vx" in err
    assert err.rstrip().endswith(  # a job this session never saw: the bound it is sent with
        "Vertex ends them 6h after they started at the latest (maxRunDuration, sent as their "
        "scheduling.timeout)"
    )


def _short_job(session: VertexSession, run_id: str, timeout: str) -> str:
    """A job submitted with its own scheduling.timeout, as a vertexJobSpec file may set it."""
    request = session._request(Job(run_id=run_id), "gs://b/staging/x/gputrain-job-0.tar.gz")
    body = custom_job_body(request)
    body["jobSpec"]["scheduling"]["timeout"] = timeout
    return session.api.create_job(body).name


def test_a_failing_cancel_names_the_timeout_each_job_has_else_the_files(
    tmp_path: Path, fv: FakeVertex, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bound said is the jobs' own scheduling.timeout as Vertex reports it (the longest);
    where no job could be seen, the vertexJobSpec file's, shorter than maxRunDuration."""
    settings = _project(tmp_path, vertexJobSpec="job.yaml")
    session = _session(settings, fv)
    _short_job(session, "r1", "600s")
    _short_job(session, "r2", "900s")
    fv.inject_error("POST", r":cancel$", 403, "PERMISSION_DENIED", "no cancel for you")
    session.cancel(None)
    said = capsys.readouterr().err.rstrip()
    assert said.endswith(
        "Vertex ends them 15m after they started at the latest (the scheduling.timeout each "
        "was submitted with)"
    ), said
    job_spec = custom_job_body(session._request(Job(run_id="r3"), "gs://b/s/x.tar.gz"))["jobSpec"]
    job_spec["scheduling"] = {"timeout": "1200s"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job_spec))
    fv.inject_error("GET", r"/customJobs$", 503, "UNAVAILABLE", "try later", times=10)
    session.cancel(None, "r3")  # which jobs there are is not known: the file's bound
    said = capsys.readouterr().err.rstrip()
    assert said.endswith(
        "Vertex ends them 20m after they started at the latest (scheduling.timeout in job.yaml)"
    ), said


def test_an_incomplete_teardown_names_the_bound_of_the_jobs_left_running(
    tmp_path: Path, fv: FakeVertex, gcs: GcsEmulator, capsys: pytest.CaptureFixture[str]
) -> None:
    """`down` could not cancel a job: its closing line says when Vertex ends the jobs the sweep
    found running, by their own scheduling.timeout (a file's may be shorter than the stack's)."""
    settings = _project(tmp_path)
    _short_job(_session(settings, fv), "short", "600s")
    fv.inject_error("POST", r":cancel$", 403, "PERMISSION_DENIED", "no cancel for you", times=10)
    clients = VertexClients(
        vertex_endpoint=fv.url,
        runner_for=lambda s, r: FakeStackRunner(stack_name="vx"),
        retry_pause_s=0,
    )
    assert main(["down", "--stack", "vx"], settings, vertex=clients) == 1
    line = capsys.readouterr().err.splitlines()[-1]
    assert "teardown of stack vx is incomplete: 1 resource(s) still exist" in line, line
    assert line.endswith(
        "; Vertex AI ends its jobs 10m after they started at the latest (the scheduling.timeout "
        "each was submitted with); run `gputrain down --stack vx` again or delete them in the "
        "console."
    ), line


def test_logs_of_a_run_without_a_local_record_find_its_job_by_label(
    tmp_path: Path, fv: FakeVertex, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _project(tmp_path)
    session = _session(settings, fv)
    name = _submit(session, "20260101-000000-bbbb")
    job_id = name.rsplit("/", 1)[1]
    fv.add_log(job_id, "workerpool0-0", "hello from the chief")
    fv.add_log(job_id, "workerpool1-2", "hello from a worker")
    fv.set_state(job_id, "JOB_STATE_SUCCEEDED")
    session.logs("20260101-000000-bbbb")
    out = capsys.readouterr().out
    assert "[chief] hello from the chief" in out and "[worker-3] hello from a worker" in out
    assert not (settings.runs_dir / "stack-vx" / "20260101-000000-bbbb" / JOB_RECORD).exists()
    with pytest.raises(Exception, match="no Vertex job of stack vx has run id nope"):
        session.logs("nope")


def test_a_jobs_cost_counts_from_when_it_ran_not_from_its_queue(
    tmp_path: Path, fv: FakeVertex, capsys: pytest.CaptureFixture[str]
) -> None:
    """The session bills from the job's startTime as Vertex reports it (its first RUNNING): the
    time it sat PENDING is nothing the ledger or the summary may charge."""
    session = _session(_project(tmp_path), fv)
    submitted = time.time()
    job_id = _submit(session, "20260101-000000-cccc").rsplit("/", 1)[1]
    time.sleep(0.5)  # queued
    fv.set_state(job_id, "JOB_STATE_RUNNING")
    fv.set_state(job_id, "JOB_STATE_SUCCEEDED")
    assert session.billed_since is None  # nothing seen running yet
    session.logs("20260101-000000-cccc")
    assert session.billed_since is not None and session.billed_since >= submitted + 0.5
    assert session.billed_since <= time.time()


def test_status_counts_down_to_the_timeout_each_job_was_submitted_with(
    tmp_path: Path, fv: FakeVertex, capsys: pytest.CaptureFixture[str]
) -> None:
    """A vertexJobSpec file's scheduling.timeout (shorter than maxRunDuration) is the job's
    bound as Vertex reports it; a job without one has the stack's."""
    from scripts.job.records import Job

    settings = _project(tmp_path)
    session = _session(settings, fv)
    request = session._request(Job(run_id="short"), "gs://b/staging/x/gputrain-job-0.tar.gz")
    body = custom_job_body(request)
    body["jobSpec"]["scheduling"]["timeout"] = "600s"  # as the user's file set it
    short = session.api.create_job(body).job_id
    stack = _submit(session, "stack").rsplit("/", 1)[1]
    for job_id in (short, stack):
        fv.set_state(job_id, "JOB_STATE_RUNNING")
    clients = VertexClients(
        vertex_endpoint=fv.url, runner_for=lambda s, r: FakeStackRunner(stack_name="vx")
    )
    assert main(["status", "--stack", "vx"], settings, vertex=clients) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split() == ["job", "run", "state", "cut", "off", "by", "Vertex", "in"]
    rows = {ln.split()[1]: ln.split() for ln in lines[3:]}
    assert 590 <= int(rows["short"][3]) <= 600, rows
    assert 6 * 3600 - 10 <= int(rows["stack"][3]) <= 6 * 3600, rows


def test_run_ids_become_label_values() -> None:
    assert run_label("20260420-100000-ab12") == "20260420-100000-ab12"
    assert run_label("My.Run_2") == "my_run_2" and len(run_label("x" * 80)) == 63
    assert RUN_LABEL == "gputrain-run"


# ---- preflight ------------------------------------------------------------------------------


def test_preflight_rows(tmp_path: Path) -> None:
    spec = _spec(
        _project(
            tmp_path, machineType="a4-highgpu-8g", executorImage="us-docker.pkg.dev/p/t/pt-2-7:1"
        )
    )
    with FakeCompute() as fc:
        rows = {r.check: r for r in vertex_preflight(spec, ComputeApi(fc.url)).rows}
    assert rows["Vertex machine"].status == "warn"  # support unverified
    assert rows["Vertex quota"].status == "warn"  # unknown, never zero
    assert rows["Vertex quota"].detail.startswith("unknown:")
    assert "8 x NVIDIA_B200" in rows["Vertex quota"].detail


def test_preflight_without_the_compute_api_warns_and_never_blocks(tmp_path: Path) -> None:
    spec = _spec(_project(tmp_path))
    report = vertex_preflight(spec, ComputeApi("http://127.0.0.1:9"))  # nothing listens
    row = next(r for r in report.rows if r.check == "machine type")
    assert row.status == "warn" and row.detail.startswith("could not check with the Compute API")
    assert report.ok


@pytest.mark.parametrize("offered", [False, True])
def test_preflight_fails_when_no_zone_has_the_n1_gpu(tmp_path: Path, offered: bool) -> None:
    """The zone's accelerator list decides: the fake is seeded both ways, so the test never depends
    on what the facts sheet happens to list for us-central1-a."""
    settings = _project(
        tmp_path,
        machineType="n1-standard-8",
        gpuType="nvidia-tesla-p4",
        gpuCount="1",
        zones="[us-central1-a]",
    )
    spec = _spec(settings)
    with FakeCompute() as fc:
        fc.remove_accelerator_type("us-central1-a", "nvidia-tesla-p4")
        if offered:
            fc.add_accelerator_type("us-central1-a", "nvidia-tesla-p4", 4)
        report = vertex_preflight(spec, ComputeApi(fc.url))
    row = next(r for r in report.rows if r.check == "machine type")
    if offered:
        assert row.status == "ok" and report.ok, row
    else:
        assert row.status == "fail", row
        assert "nvidia-tesla-p4 is not offered in us-central1-a" in row.detail
        assert not report.ok


@pytest.mark.parametrize("stack", ["dev", "vertex"])
def test_the_money_prompt_names_the_backend_and_no_means_nothing_is_created(
    stack: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.base.errors import UserError
    from scripts.targets.stack.target import confirm

    spec = parse_spec(deployable_config(stack), stack)
    answers = iter(["n", "yes"])
    monkeypatch.setattr("builtins.input", lambda _prompt: next(answers))
    with pytest.raises(UserError, match="cancelled; nothing was created"):
        confirm(spec, yes=False)
    said = capsys.readouterr().out
    if stack == "vertex":
        assert "About to run Vertex AI jobs of 2 x g2-standard-24" in said
        assert "per job before Vertex cuts it off" in said
    else:
        assert "About to create 1 x g2-standard-24" in said and "VMs delete themselves" in said
    confirm(spec, yes=False)  # "yes" goes on
    confirm(spec, yes=True)  # --yes asks nothing: the iterator would be exhausted
