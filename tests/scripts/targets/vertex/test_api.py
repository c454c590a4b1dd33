"""The Vertex AI adapter through the real google-cloud-aiplatform (REST) and google-cloud-logging
clients against tests/support/fake_vertex.py: the create body as it arrives on the wire, get/cancel,
following a job to its end with its log lines, and API errors as typed one-line errors."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra.base.errors import EXIT_BAD_INPUT, EXIT_FAILED
from infra.gcp import bounded_http
from scripts.targets.vertex import job as vj
from scripts.targets.vertex.api import (
    VertexApi,
    VertexApiError,
    VertexNotFound,
    VertexPermissionError,
    VertexQuotaError,
)
from tests.support import ROOT
from tests.support.fake_gcp_admin import FakeGcpAdmin
from tests.support.fake_http import unreachable_endpoint
from tests.support.fake_vertex import PROJECT, PROJECT_NUMBER, FakeVertex, RunContext

REGION = "us-central1"


@pytest.fixture
def fv() -> Iterator[FakeVertex]:
    with FakeVertex() as fake:
        yield fake


@pytest.fixture
def api(fv: FakeVertex) -> VertexApi:
    return VertexApi(PROJECT, REGION, api_endpoint=fv.url)


def _request(**kw: object) -> vj.JobRequest:
    base: dict[str, object] = dict(
        display_name="gputrain-dev-20260420-100000",
        region=REGION,
        machine_type="a3-megagpu-8g",
        gpu_type=None,
        gpu_count=0,
        nodes=3,
        spot=True,
        max_run_duration_s=3 * 3600,
        output_dir=vj.run_output_dir("dev-bkt", "r1"),
        package_uris=("gs://dev-bkt/staging/r1/gputrain-job-0.tar.gz",),
        args=("--preset", "tiny"),
        env={"GPUTRAIN_RUN_ID": "r1"},
        labels={"gputrain-stack": "dev", "team": "ml"},
        service_account="dev-job@gputrain-test.iam.gserviceaccount.com",
    )
    base.update(kw)
    return vj.JobRequest(**base)  # type: ignore[arg-type]


# ---- create / get / cancel ----------------------------------------------------------------------


def test_create_sends_the_job_field_by_field(fv: FakeVertex, api: VertexApi) -> None:
    from google.cloud.aiplatform_v1 import AcceleratorType, Scheduling

    status = api.create_job(vj.custom_job_body(_request()))
    assert status.name == f"projects/{PROJECT_NUMBER}/locations/{REGION}/customJobs/{status.job_id}"
    assert status.state == "JOB_STATE_PENDING" and status.create_time is not None

    ((method, path, query, body),) = [r for r in fv.requests if r[1].endswith("/customJobs")]
    assert (method, path) == ("POST", f"/v1/projects/{PROJECT}/locations/{REGION}/customJobs")
    assert query["$alt"] == ["json;enum-encoding=int"]  # enums travel as numbers
    assert body["displayName"] == "gputrain-dev-20260420-100000"
    assert body["labels"] == {"gputrain-stack": "dev", "team": "ml"}
    spec = body["jobSpec"]
    chief, workers = spec["workerPoolSpecs"]
    assert (chief["replicaCount"], workers["replicaCount"]) == ("1", "2")  # int64 as strings
    for pool in (chief, workers):
        assert pool["machineSpec"] == {
            "machineType": "a3-megagpu-8g",
            "acceleratorType": int(AcceleratorType.NVIDIA_H100_MEGA_80GB),
            "acceleratorCount": 8,
        }
        assert pool["pythonPackageSpec"] == {
            "executorImageUri": "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest",
            "packageUris": ["gs://dev-bkt/staging/r1/gputrain-job-0.tar.gz"],
            "pythonModule": "gputrain_node.vertex_entry",
            "args": ["--preset", "tiny"],
            "env": [{"name": "GPUTRAIN_RUN_ID", "value": "r1"}],
        }
    assert spec["scheduling"] == {"timeout": "10800s", "strategy": int(Scheduling.Strategy.SPOT)}
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": "gs://dev-bkt/runs/r1/"}
    assert spec["serviceAccount"] == "dev-job@gputrain-test.iam.gserviceaccount.com"
    # the fake kept it with names, as GET shows it
    stored = fv.job(status.job_id)["jobSpec"]
    assert stored["workerPoolSpecs"][0]["machineSpec"]["acceleratorType"] == "NVIDIA_H100_MEGA_80GB"
    assert stored["scheduling"]["strategy"] == "SPOT"


def test_one_node_on_demand_job_has_one_pool_and_standard_strategy(
    fv: FakeVertex, api: VertexApi
) -> None:
    from google.cloud.aiplatform_v1 import AcceleratorType, Scheduling

    req = _request(
        nodes=1, spot=False, machine_type="n1-standard-8", gpu_type="nvidia-tesla-t4", gpu_count=2
    )
    api.create_job(vj.custom_job_body(req))
    (body,) = fv.requests_to("POST", r"/customJobs$")
    (pool,) = body["jobSpec"]["workerPoolSpecs"]
    assert pool["replicaCount"] == "1"
    assert pool["machineSpec"]["acceleratorType"] == int(AcceleratorType.NVIDIA_TESLA_T4)
    assert pool["machineSpec"]["acceleratorCount"] == 2
    assert body["jobSpec"]["scheduling"]["strategy"] == int(Scheduling.Strategy.STANDARD)


def test_get_moves_the_job_and_cancel_ends_it(fv: FakeVertex, api: VertexApi) -> None:
    status = api.create_job(vj.custom_job_body(_request()))
    running = api.get_job(status.name)
    assert running.state == "JOB_STATE_RUNNING" and running.start_time is not None
    api.cancel_job(status.name)
    assert fv.requests_to("POST", r":cancel$") == [{}]
    assert fv.requests[-1][1].startswith(f"/v1/projects/{PROJECT_NUMBER}/")  # the name as returned
    cancelled = api.get_job(status.name)
    assert (cancelled.state, cancelled.done, cancelled.succeeded) == (
        "JOB_STATE_CANCELLED",
        True,
        False,
    )
    api.cancel_job(status.name)  # already final: FAILED_PRECONDITION is not an error for us
    assert api.get_job(status.name).state == "JOB_STATE_CANCELLED"


def test_cancel_and_wait_stops_a_running_job(fv: FakeVertex, api: VertexApi) -> None:
    stopped = threading.Event()

    def runner(ctx: RunContext) -> None:
        ctx.log("workerpool0-0", "training")
        ctx.cancelled.wait(30)
        time.sleep(0.3)  # the trainer takes a moment to stop: the job shows CANCELLING meanwhile
        stopped.set()

    fv.runner = runner
    status = api.create_job(vj.custom_job_body(_request()))
    assert api.get_job(status.name).state == "JOB_STATE_RUNNING"
    seen: list[str] = []
    final = api.cancel_and_wait(
        status.name, poll_s=0.05, timeout_s=20, on_state=lambda s, _: seen.append(s.short_state)
    )
    assert stopped.is_set() and final.state == "JOB_STATE_CANCELLED"
    assert seen[0] == "CANCELLING" and seen[-1] == "CANCELLED"


# ---- following a job ----------------------------------------------------------------------------


def _log_polls(fv: FakeVertex) -> int:
    return len(fv.requests_to("POST", r"^/v2/entries:list$"))


def test_follow_reports_states_and_each_log_line_once(fv: FakeVertex, api: VertexApi) -> None:
    def runner(ctx: RunContext) -> None:
        ctx.log("workerpool0-0", "step 1 loss 4.0\nstep 2 loss 3.5")
        ctx.log("workerpool1-0", "worker 1 up")
        ctx.log("workerpool1-1", "worker 2 up", json_payload=True)
        ctx.log("workerpool0-0", "step 3 loss 3.1")
        polls = _log_polls(fv)
        deadline = time.monotonic() + 20
        while _log_polls(fv) < polls + 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # let the follower poll twice more: old entries come back each time
        ctx.log("workerpool0-0", "done")

    fv.runner = runner
    fv.progression = ("JOB_STATE_PENDING", "JOB_STATE_PENDING", "JOB_STATE_RUNNING")
    status = api.create_job(vj.custom_job_body(_request()))
    states: list[tuple[str, dt.datetime]] = []
    lines: list[str] = []
    followed = api.follow(
        status.name,
        on_state=lambda s, at: states.append((s.short_state, at)),
        on_lines=lines.extend,
        poll_s=0.02,
        settle_s=0.05,
    )
    assert [s for s, _ in states] == ["PENDING", "RUNNING", "SUCCEEDED"]
    assert [t for _, t in states] == sorted(t for _, t in states)
    assert lines == [
        "[chief] step 1 loss 4.0",
        "[chief] step 2 loss 3.5",
        "[worker-1] worker 1 up",
        "[worker-2] worker 2 up",
        "[chief] step 3 loss 3.1",
        "[chief] done",
    ]
    assert followed.status.succeeded and followed.last_lines[-1] == "[chief] done"
    filters = [b["filter"] for b in fv.requests_to("POST", r"^/v2/entries:list$")]
    assert all(f'resource.labels.job_id="{status.job_id}"' in f for f in filters)
    assert all('resource.type="ml_job"' in f and "timestamp>=" in f for f in filters)


@pytest.mark.parametrize(
    ("image", "label", "role"),
    [("us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest", "reducer-1",
      "reducers"),
     ("us-docker.pkg.dev/p/r/ps:1", "parameter-server-1", "parameter servers")],
)  # fmt: skip
def test_follow_labels_pool_2_by_what_the_job_runs_there(
    fv: FakeVertex, api: VertexApi, image: str, label: str, role: str
) -> None:
    """Pool 2 is a Reduction Server only with Google's image; any other is parameter servers,
    and its replicas' lines say so, as the submit line and `plan` name the pool."""
    body = vj.custom_job_body(_request())
    pool = {"machineSpec": {"machineType": "n1-standard-8"}, "replicaCount": 2,
            "containerSpec": {"imageUri": image}}  # fmt: skip
    body["jobSpec"]["workerPoolSpecs"].append(pool)
    fv.runner = lambda ctx: ctx.log("workerpool2-1", "serving")
    status = api.create_job(body)
    lines: list[str] = []
    api.follow(status.name, on_state=lambda *_: None, on_lines=lines.extend, poll_s=0.02,
               settle_s=0.05)  # fmt: skip
    assert lines == [f"[{label}] serving"]
    assert vj.describe_pools(body["jobSpec"]).endswith(f" + 2 x n1-standard-8 ({role})")


def test_follow_a_failed_job_gives_its_error_and_last_lines(fv: FakeVertex, api: VertexApi) -> None:
    def runner(ctx: RunContext) -> tuple[str, str]:
        for i in range(30):
            ctx.log("workerpool0-0", f"line {i}")
        ctx.log("workerpool1-0", "RuntimeError: CUDA error: out of memory", severity="ERROR")
        return ("JOB_STATE_FAILED", "The replica workerpool1-0 exited with a non-zero status of 1.")

    fv.runner = runner
    status = api.create_job(vj.custom_job_body(_request()))
    followed = api.follow(
        status.name, on_state=lambda *_: None, on_lines=lambda _: None, poll_s=0.02, settle_s=0.05
    )
    assert followed.status.state == "JOB_STATE_FAILED"
    assert len(followed.last_lines) == 20  # the tail, not all 31
    text = vj.failure_message(followed.status, followed.last_lines)
    assert text.splitlines()[0] == (
        f"Vertex job {status.job_id} FAILED: INTERNAL "
        "The replica workerpool1-0 exited with a non-zero status of 1."
    )
    assert text.splitlines()[-1] == "  [worker-1] RuntimeError: CUDA error: out of memory"


def test_log_lines_read_every_page_and_only_this_jobs_entries(
    fv: FakeVertex, api: VertexApi
) -> None:
    a = api.create_job(vj.custom_job_body(_request()))
    b = api.create_job(vj.custom_job_body(_request()))
    for i in range(7):
        fv.add_log(a.job_id, f"workerpool{min(i, 1)}-0", f"a{i}")
    fv.add_log(b.job_id, "workerpool0-0", "other job")
    cursor = vj.LogCursor(since=a.create_time)
    got = api.log_lines(a.job_id, cursor)
    assert [e.text for e in got] == [f"a{i}" for i in range(7)]
    assert len(fv.requests_to("POST", r"^/v2/entries:list$")) >= 3  # pages of 3
    assert api.log_lines(a.job_id, cursor) == []


# ---- errors -------------------------------------------------------------------------------------


def _one_line(e: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(e.value)
    assert "\n" not in text and "http://" not in text
    return text


def test_permission_denied_names_the_role(fv: FakeVertex) -> None:
    other = VertexApi("someone-elses-project", REGION, api_endpoint=fv.url)
    with pytest.raises(VertexPermissionError) as e:
        other.create_job(vj.custom_job_body(_request()))
    text = _one_line(e)
    assert "permission denied: Permission 'aiplatform.customJobs.create' denied" in text
    assert "roles/aiplatform.user on project someone-elses-project" in text


def test_disabled_api_says_how_to_enable_it(fv: FakeVertex, api: VertexApi) -> None:
    fv.inject_error(
        "POST",
        r"/customJobs$",
        403,
        "PERMISSION_DENIED",
        "Vertex AI API has not been used in project 123456789012 before or it is disabled. "
        "Enable it by visiting https://console.developers.google.com/apis/api/"
        "aiplatform.googleapis.com/overview?project=123456789012 then retry.",
    )
    with pytest.raises(VertexPermissionError) as e:
        api.create_job(vj.custom_job_body(_request()))
    assert "gcloud services enable aiplatform.googleapis.com --project gputrain-test" in str(
        e.value
    )


def test_quota_exhausted_is_a_quota_error(fv: FakeVertex, api: VertexApi) -> None:
    fv.inject_error(
        "POST",
        r"/customJobs$",
        429,
        "RESOURCE_EXHAUSTED",
        "The following quota metrics exceed quota limits: "
        "aiplatform.googleapis.com/custom_model_training_preemptible_nvidia_h100_mega_gpus",
    )
    with pytest.raises(VertexQuotaError) as e:
        api.create_job(vj.custom_job_body(_request()))
    text = _one_line(e)
    assert "quota exceeded in us-central1" in text and "nvidia_h100_mega_gpus" in text
    assert fv.jobs == {}  # nothing was created


def test_unknown_job_is_not_found(api: VertexApi) -> None:
    with pytest.raises(VertexNotFound) as e:
        api.get_job(f"projects/{PROJECT_NUMBER}/locations/{REGION}/customJobs/42")
    assert 'not found: The CustomJob "42" does not exist.' in _one_line(e)


def test_invalid_job_is_one_line_with_the_servers_reason(fv: FakeVertex, api: VertexApi) -> None:
    with pytest.raises(VertexApiError) as e:
        api.create_job(vj.custom_job_body(_request(display_name="")))
    assert _one_line(e).endswith(
        "create job in us-central1: 400 custom_job.display_name is required."
    )
    assert fv.jobs == {}


def test_log_permission_denied_names_the_logging_role(fv: FakeVertex, api: VertexApi) -> None:
    fv.inject_error(
        "POST", r"entries:list", 403, "PERMISSION_DENIED", "Permission denied for all log views"
    )
    with pytest.raises(VertexPermissionError) as e:
        api.log_lines("42", vj.LogCursor())
    assert "roles/logging.viewer" in _one_line(e)


@pytest.mark.parametrize("kind", ["refuses", "never accepts", "never answers"])
def test_unreachable_endpoint_is_one_line_within_the_bound(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both clients (Vertex AI's jobs, Cloud Logging) wait no longer than infra/gcp/bounded_http.py
    allows (cut to fractions of a second here; their own: 60 s for a connection or an answer)."""
    monkeypatch.setattr(bounded_http, "CONNECT_S", 0.5)
    monkeypatch.setattr(bounded_http, "READ_S", 0.5)
    monkeypatch.setattr(bounded_http, "UNREACHABLE_S", 1.0)
    with unreachable_endpoint(kind) as url:
        dead = VertexApi(PROJECT, REGION, api_endpoint=url)
        job = f"projects/{PROJECT_NUMBER}/locations/{REGION}/customJobs/1"
        for ask in (lambda: dead.get_job(job), lambda: dead.log_lines("42", vj.LogCursor())):
            started = time.monotonic()
            with pytest.raises(VertexApiError, match=r"cannot reach http://127\.0\.0\.1:\d+") as e:
                ask()
            assert time.monotonic() - started < 5 and "\n" not in str(e.value)


def test_missing_credentials_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # a credentials file that does not exist fails before any network lookup
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/gputrain-creds.json")
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    real = VertexApi(PROJECT, REGION)
    assert real.api_endpoint == "us-central1-aiplatform.googleapis.com"
    assert real.logging_endpoint == "https://logging.googleapis.com"
    for call in (lambda: real.get_job("x"), lambda: real.log_lines("42", vj.LogCursor())):
        with pytest.raises(VertexApiError) as e:
            call()
        assert str(e.value) == (
            "cannot build a Google API client: GOOGLE_APPLICATION_CREDENTIALS="
            "/nonexistent/gputrain-creds.json is missing: fix or unset it"
        )


def _a_call_per_client(real: VertexApi) -> list[tuple[str, Callable[[], object]]]:
    """One call through each of VertexApi's clients (Vertex AI, Cloud Logging), with the label
    its error starts with."""
    job = f"projects/{PROJECT_NUMBER}/locations/{REGION}/customJobs/1"
    return [
        (f"Vertex AI get job {job}", lambda: real.get_job(job)),
        ("Cloud Logging read logs of Vertex job 42", lambda: real.log_lines("42", vj.LogCursor())),
    ]


@pytest.mark.filterwarnings("ignore:Your application has authenticated using end user")
def test_an_expired_login_is_the_users_setup_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A login Google refuses (expired or revoked refresh token), for either client: one line
    with the login to run, exit 2, never google-auth's RefreshError."""
    real = VertexApi(PROJECT, REGION)
    with FakeGcpAdmin() as admin:
        admin.expired_login(monkeypatch, tmp_path)
        for what, call in _a_call_per_client(real):
            with pytest.raises(VertexApiError) as e:
                call()
            assert str(e.value) == (
                f"{what}: the credentials were refused (RefreshError: invalid_grant: Token has "
                "been expired or revoked.); run `gcloud auth application-default login` or set "
                "GOOGLE_APPLICATION_CREDENTIALS"
            )
            assert e.value.exit_code == EXIT_BAD_INPUT


@pytest.mark.parametrize("token_endpoint", ["refuses", "error page"])
@pytest.mark.filterwarnings("ignore:Your application has authenticated using end user")
def test_a_token_endpoint_out_of_reach_or_failing_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, token_endpoint: str
) -> None:
    """A token endpoint that cannot be reached (google-auth's TransportError) or answers a page
    that is no refusal (a front end's 502): for either client the network's one line, exit 1, as
    every other adapter says it, never google-auth's exception (a traceback at the CLI)."""
    real = VertexApi(PROJECT, REGION)
    with FakeGcpAdmin() as admin, unreachable_endpoint("refuses") as dead:
        admin.expired_login(monkeypatch, tmp_path)
        if token_endpoint == "refuses":
            monkeypatch.setattr("google.oauth2.credentials._GOOGLE_OAUTH2_TOKEN_ENDPOINT", dead)
        else:
            admin.world.token_answer = (502, "<html><title>502 Bad Gateway</title></html>")
        why = "TransportError: " if token_endpoint == "refuses" else "RefreshError: <html>"
        for what, call in _a_call_per_client(real):
            with pytest.raises(VertexApiError) as e:
                call()
            assert str(e.value).startswith(f"{what}: cannot reach it ({why}")
            assert e.value.exit_code == EXIT_FAILED and "\n" not in str(e.value)


def test_a_token_endpoint_that_says_try_again_is_one_line(api: VertexApi) -> None:
    """A retryable refusal (the token endpoint's 500 or 429, retried by google-auth until it
    gives up) is the network's one line, exit 1, not the credentials'."""
    from google.auth.exceptions import RefreshError

    def refresh() -> None:
        raise RefreshError("internal_failure: None", {"error": "internal_failure"}, retryable=True)

    with pytest.raises(VertexApiError) as e:
        api._call("Vertex AI get job 1", refresh)
    assert str(e.value) == (
        "Vertex AI get job 1: cannot reach it (RefreshError: ('internal_failure: None', "
        "{'error': 'internal_failure'}))"
    )
    assert e.value.exit_code == EXIT_FAILED


# ---- import cost --------------------------------------------------------------------------------


def test_google_clients_are_imported_only_when_called() -> None:
    code = (
        "import sys, scripts.cli, infra.vertex, scripts.targets.vertex.job, "
        "scripts.targets.vertex.api\n"
        "heavy = [m for m in sys.modules if m.startswith(('google.cloud.aiplatform', "
        "'google.cloud.logging', 'google.api_core', 'grpc'))]\n"
        "print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_list_finds_the_stacks_jobs_by_label_across_pages(fv: FakeVertex, api: VertexApi) -> None:
    mine = [
        api.create_job(vj.custom_job_body(_request(display_name=f"mine-{i}"))) for i in range(3)
    ]
    other = _request(display_name="other", labels={"gputrain-stack": "prod"})
    api.create_job(vj.custom_job_body(other))
    elsewhere = VertexApi(PROJECT, "europe-west4", api_endpoint=fv.url)
    elsewhere.create_job(vj.custom_job_body(_request(region="europe-west4", display_name="eu")))
    found = api.list_jobs({"gputrain-stack": "dev"})
    assert sorted(j.name for j in found) == sorted(j.name for j in mine)
    assert {j.display_name for j in found} == {"mine-0", "mine-1", "mine-2"}
    assert all(j.labels == {"gputrain-stack": "dev", "team": "ml"} for j in found)
    listed = [q for m, p, q, _ in fv.requests if m == "GET" and p.endswith("/customJobs")]
    assert len(listed) >= 2 and any("pageToken" in q for q in listed)  # crossed a page
    assert api.list_jobs({"gputrain-stack": "nope"}) == []


def test_a_flex_start_job_reaches_vertex_with_its_strategy_and_max_wait(
    fv: FakeVertex, api: VertexApi
) -> None:
    """`capacity: flex-start` on Vertex: Scheduling.Strategy.FLEX_START (queued through DWS),
    bounded by maxWaitDuration, through the real client's REST body."""
    from google.cloud.aiplatform_v1 import Scheduling

    api.create_job(vj.custom_job_body(_request(spot=False, flex_start_wait_s=1800)))
    (body,) = fv.requests_to("POST", r"/customJobs$")
    scheduling = body["jobSpec"]["scheduling"]
    assert scheduling["strategy"] == int(Scheduling.Strategy.FLEX_START)
    assert scheduling["maxWaitDuration"] == "1800s"
