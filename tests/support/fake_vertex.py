"""A local fake of the Vertex AI v1 REST API (customJobs create/get/cancel) and of Cloud Logging's
`POST /v2/entries:list`, for the real google-cloud-aiplatform (REST transport) and
google-cloud-logging (JSON) clients.

It speaks the real shapes: camelCase JSON, int64 as strings, enums as numbers when the client asks
for `$alt=json;enum-encoding=int` (the aiplatform REST transport always does) and as names
otherwise, job names carrying the project *number*, Google's error body with `status`, paged log
entries with `nextPageToken`. Every request body is recorded as it arrived.

Jobs move one state per GET along `progression` (deterministic, no sleeping), or a test forces a
state with `set_state`. With a `runner`, a job that reaches RUNNING is "run" by calling
runner(RunContext) in a thread: it can write log entries and watch for cancellation; its return
value decides the final state (part 2 starts local trainer processes there).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.fake_http import FakeHttpServer, send_json

PROJECT, PROJECT_NUMBER = "gputrain-test", "123456789012"
LOG_PAGE_SIZE = 3  # small on purpose: every test that reads logs crosses a page boundary
JOB_PAGE_SIZE = 2  # likewise for customJobs.list

# Enum numbers as the v1 API reference lists them (AcceleratorType, Scheduling.Strategy, JobState).
ACCELERATOR_TYPES = {
    "ACCELERATOR_TYPE_UNSPECIFIED": 0,
    "NVIDIA_TESLA_K80": 1,
    "NVIDIA_TESLA_P100": 2,
    "NVIDIA_TESLA_V100": 3,
    "NVIDIA_TESLA_P4": 4,
    "NVIDIA_TESLA_T4": 5,
    "NVIDIA_TESLA_A100": 8,
    "NVIDIA_A100_80GB": 9,
    "NVIDIA_L4": 11,
    "NVIDIA_H100_80GB": 13,
    "NVIDIA_H100_MEGA_80GB": 14,
    "NVIDIA_H200_141GB": 15,
    "NVIDIA_B200": 16,
}
STRATEGIES = {"STRATEGY_UNSPECIFIED": 0, "STANDARD": 3, "SPOT": 4, "FLEX_START": 6}
_STATE_NAMES = (
    "UNSPECIFIED QUEUED PENDING RUNNING SUCCEEDED FAILED CANCELLING CANCELLED PAUSED EXPIRED "
    "UPDATING PARTIALLY_SUCCEEDED"
)
JOB_STATES = {f"JOB_STATE_{s}": i for i, s in enumerate(_STATE_NAMES.split())}
FINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}
DEFAULT_PROGRESSION = ("JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED")


def now_rfc3339(nanos: bool = False) -> str:
    t = dt.datetime.now(dt.timezone.utc)
    frac = f"{t.microsecond:06d}" + ("789" if nanos else "")  # Logging writes 9 digits
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + frac + "Z"


@dataclass
class RunContext:
    """What a runner sees: the job as created, a way to log, and the cancel flag."""

    fake: FakeVertex
    job_id: str
    job: dict[str, Any]
    cancelled: threading.Event

    def log(self, task: str, text: str, **kw: Any) -> None:
        self.fake.add_log(self.job_id, task, text, **kw)


RunResult = tuple[str, str] | None  # (final state, error message); None = SUCCEEDED
Runner = Callable[[RunContext], RunResult]


@dataclass
class _Job:
    body: dict[str, Any]  # the CustomJob as GET returns it, enums by name
    ahead: list[str]  # states still to come, one per GET (when no runner owns the job)
    cancelled: threading.Event = field(default_factory=threading.Event)
    running: bool = False  # a runner thread owns the state


class _HttpError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class FakeVertex(FakeHttpServer):
    """The fake server plus the Python API tests use to drive its world (thread-safe)."""

    def __init__(
        self,
        project: str = PROJECT,
        project_number: str = PROJECT_NUMBER,
        *,
        progression: tuple[str, ...] = DEFAULT_PROGRESSION,
        runner: Runner | None = None,
    ) -> None:
        self.project, self.project_number = project, project_number
        self.progression, self.runner = progression, runner
        self._lock = threading.RLock()
        self._ids = itertools.count(8_000_000_000_000_000_001)
        self._insert_ids = itertools.count(1)
        self.jobs: dict[str, _Job] = {}
        self.logs: list[dict[str, Any]] = []  # LogEntry JSON, as written
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        self._injected: list[tuple[str, re.Pattern[str], int, str, str, list[int]]] = []
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._serve()

    # -- lifecycle

    def stop(self) -> None:
        self._stopping.set()
        for job in self.jobs.values():
            job.cancelled.set()
        for t in self._threads:
            t.join(timeout=10)
        super().stop()

    # -- the API tests use

    def advance_on_its_own(self, every_s: float = 0.3) -> None:
        """From now on every job moves along its progression as Vertex moves it, with no client
        asking (a detached job): one step each `every_s`, besides the step of each GET."""

        def tick() -> None:
            while not self._stopping.wait(every_s):
                with self._lock:
                    for job in list(self.jobs.values()):
                        self._advance(job)

        t = threading.Thread(target=tick, daemon=True)
        self._threads.append(t)
        t.start()

    def job(self, job_id: str) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self.jobs[job_id].body))

    def set_state(self, job_id: str, state: str, *, error: str = "", code: int = 13) -> None:
        """Force a state now (a final one ends the job; `error` becomes its google.rpc.Status)."""
        with self._lock:
            job = self.jobs[job_id]
            job.ahead = []
            self._enter(job, state, {"code": code, "message": error} if error else None)

    def add_log(
        self,
        job_id: str,
        task: str,
        text: str,
        *,
        timestamp: str | None = None,
        severity: str = "INFO",
        json_payload: bool = False,
    ) -> dict[str, Any]:
        """One entry as Vertex writes a replica's output: resource ml_job, labels job_id/task_name."""
        labels = {"job_id": job_id, "project_id": self.project}
        if task:
            labels["task_name"] = task
        entry: dict[str, Any] = {
            "logName": f"projects/{self.project}/logs/{task or 'aiplatform.googleapis.com%2Fjob'}",
            "resource": {"type": "ml_job", "labels": labels},
            "timestamp": timestamp or now_rfc3339(nanos=True),
            "receiveTimestamp": now_rfc3339(nanos=True),
            "severity": severity,
            "insertId": f"{next(self._insert_ids):012x}",
        }
        entry["jsonPayload" if json_payload else "textPayload"] = (
            {"message": text, "levelname": severity} if json_payload else text
        )
        with self._lock:
            self.logs.append(entry)
        return entry

    def inject_error(
        self, method: str, path_regex: str, status: int, code: str, message: str, *, times: int = 1
    ) -> None:
        """The next `times` requests whose method and path match answer with this Google error."""
        with self._lock:
            self._injected.append((method, re.compile(path_regex), status, code, message, [times]))

    def requests_to(self, method: str, pattern: str) -> list[Any]:
        """Bodies of the recorded requests with this method whose path matches."""
        with self._lock:
            return [b for m, p, _, b in self.requests if m == method and re.search(pattern, p)]

    # -- state machine

    def _enter(self, job: _Job, state: str, error: dict[str, Any] | None = None) -> None:
        now = now_rfc3339()
        body = job.body
        body["state"], body["updateTime"] = state, now
        if state == "JOB_STATE_RUNNING" and "startTime" not in body:
            body["startTime"] = now
        if state in FINAL:
            body["endTime"] = now
        if error:
            body["error"] = error
        if state == "JOB_STATE_RUNNING" and self.runner and not job.running:
            job.running = True
            t = threading.Thread(target=self._run, args=(job,), daemon=True)
            self._threads.append(t)
            t.start()

    def _run(self, job: _Job) -> None:
        assert self.runner is not None
        job_id = job.body["name"].rsplit("/", 1)[1]
        ctx = RunContext(self, job_id, json.loads(json.dumps(job.body)), job.cancelled)
        try:
            result = self.runner(ctx)
        except Exception as e:
            result = ("JOB_STATE_FAILED", f"runner raised {type(e).__name__}: {e}")
        with self._lock:
            job.running = False
            if job.body["state"] in FINAL:
                return
            if job.cancelled.is_set():
                self._enter(job, "JOB_STATE_CANCELLED", {"code": 1, "message": "CANCELED"})
            elif result is None:
                self._enter(job, "JOB_STATE_SUCCEEDED")
            else:
                self._enter(job, result[0], {"code": 13, "message": result[1]})

    def _advance(self, job: _Job) -> None:
        """One GET's worth of progress (a runner-owned job moves only when its runner ends)."""
        if job.running or job.body["state"] in FINAL:
            return
        if job.body["state"] == "JOB_STATE_CANCELLING":
            self._enter(job, "JOB_STATE_CANCELLED", {"code": 1, "message": "CANCELED"})
        elif job.ahead:
            self._enter(job, job.ahead.pop(0))

    # -- request handling

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _serve(self, method: str) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                query = parse_qs(parts.query, keep_blank_values=True)
                status, body = fake._dispatch(method, parts.path, query, raw)
                send_json(self, status, body)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

        return Handler

    def _dispatch(
        self, method: str, path: str, query: dict[str, list[str]], raw: bytes
    ) -> tuple[int, Any]:
        with self._lock:
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = raw.decode(errors="replace")
            self.requests.append((method, path, query, body))
            for m, pattern, status, code, message, left in self._injected:
                if left[0] > 0 and m == method and pattern.search(path):
                    left[0] -= 1
                    return _error(status, code, message)
            numeric = any("enum-encoding=int" in v for v in query.get("$alt", []))
            try:
                result = self._route(method, path, body, query)
            except _HttpError as e:
                return _error(e.status, e.code, e.message)
            return 200, _encode_enums(result) if numeric else result

    def _route(self, method: str, path: str, body: Any, query: dict[str, list[str]]) -> Any:
        if (method, path) == ("POST", "/v2/entries:list"):
            return self._list_entries(body or {})
        m = re.fullmatch(
            r"/v1/projects/([^/]+)/locations/([^/]+)/customJobs(?:/([^/:]+))?(:cancel)?", path
        )
        if not m:
            raise _HttpError(404, "NOT_FOUND", f"Requested entity was not found: {path}")
        project, region, job_id, cancel = m.groups()
        verb = "create" if job_id is None else "cancel" if cancel else "get"
        if project not in (self.project, self.project_number):
            raise _HttpError(
                403,
                "PERMISSION_DENIED",
                f"Permission 'aiplatform.customJobs.{verb}' denied on resource "
                f"'//aiplatform.googleapis.com/projects/{project}/locations/{region}' "
                "(or it may not exist).",
            )
        if verb == "create" and method == "POST":
            return self._create(region, body)
        if verb == "create" and method == "GET":
            return self._list(region, query)
        job = self.jobs.get(job_id or "")
        if job is None or f"/locations/{region}/" not in job.body["name"]:
            raise _HttpError(404, "NOT_FOUND", f'The CustomJob "{job_id}" does not exist.')
        if verb == "get" and method == "GET":
            self._advance(job)
            return job.body
        if verb == "cancel" and method == "POST":
            if job.body["state"] in FINAL:
                raise _HttpError(
                    400,
                    "FAILED_PRECONDITION",
                    f"Cannot cancel CustomJob {job_id} in state {job.body['state']}.",
                )
            job.cancelled.set()
            self._enter(job, "JOB_STATE_CANCELLING")
            return {}
        raise _HttpError(405, "UNIMPLEMENTED", f"{method} {path}")

    def _create(self, region: str, body: Any) -> Any:
        if not isinstance(body, dict) or not body.get("displayName"):
            raise _HttpError(400, "INVALID_ARGUMENT", "custom_job.display_name is required.")
        job = _decode_enums(json.loads(json.dumps(body)))
        pools = job.get("jobSpec", {}).get("workerPoolSpecs") or []
        if not pools:
            raise _HttpError(400, "INVALID_ARGUMENT", "At least one worker pool is required.")
        for i, pool in enumerate(pools):
            if not pool and i > 0:
                continue  # an empty pool: skipped (Vertex's distributed-training page)
            if ("containerSpec" in pool) == ("pythonPackageSpec" in pool):
                raise _HttpError(
                    400,
                    "INVALID_ARGUMENT",
                    f"worker_pool_specs[{i}]: exactly one of container_spec or "
                    "python_package_spec must be set.",
                )
            if not pool.get("machineSpec", {}).get("machineType"):
                raise _HttpError(400, "INVALID_ARGUMENT", f"worker_pool_specs[{i}]: machine_type")
        job_id = str(next(self._ids))
        now = now_rfc3339()
        name = f"projects/{self.project_number}/locations/{region}/customJobs/{job_id}"
        job |= {"name": name, "createTime": now, "updateTime": now, "state": self.progression[0]}
        self.jobs[job_id] = _Job(job, list(self.progression[1:]))
        return job

    def _list(self, region: str, query: dict[str, list[str]]) -> Any:
        """customJobs.list: newest first, paged; filtering is the caller's (no `filter` sent)."""
        if any(v != [""] for k, v in query.items() if k == "filter"):
            raise _HttpError(400, "INVALID_ARGUMENT", "this fake implements no list filter")
        jobs = [j.body for j in self.jobs.values() if f"/locations/{region}/" in j.body["name"]]
        jobs.sort(key=lambda b: b["createTime"], reverse=True)
        start = int((query.get("pageToken") or ["0"])[0] or 0)
        size = min(int((query.get("pageSize") or ["0"])[0] or JOB_PAGE_SIZE), JOB_PAGE_SIZE)
        out: dict[str, Any] = {"customJobs": jobs[start : start + size]}
        if start + size < len(jobs):
            out["nextPageToken"] = str(start + size)
        return out

    def _list_entries(self, body: dict[str, Any]) -> Any:
        if body.get("resourceNames") not in ([f"projects/{self.project}"], None):
            raise _HttpError(403, "PERMISSION_DENIED", "The caller does not have permission")
        match = _log_filter(body.get("filter", ""))
        entries = sorted((e for e in self.logs if match(e)), key=lambda e: e["timestamp"])
        if body.get("orderBy", "timestamp asc").lower() == "timestamp desc":
            entries.reverse()
        start = int(body.get("pageToken") or 0)
        size = min(int(body.get("pageSize") or LOG_PAGE_SIZE), LOG_PAGE_SIZE)
        out: dict[str, Any] = {"entries": entries[start : start + size]}
        if start + size < len(entries):
            out["nextPageToken"] = str(start + size)
        return out


# ---- helpers -------------------------------------------------------------------------------------


def _error(status: int, code: str, message: str) -> tuple[int, Any]:
    """Google's JSON error body for the newer APIs (aiplatform, logging): code, message, status."""
    return status, {"error": {"code": status, "message": message, "status": code}}


_ENUM_FIELDS = {"acceleratorType": ACCELERATOR_TYPES, "strategy": STRATEGIES, "state": JOB_STATES}


def _decode_enums(node: Any, where: str = "custom_job") -> Any:
    """Numbers or names in, names kept; an unknown value fails as the real API does."""
    if isinstance(node, list):
        return [_decode_enums(v, f"{where}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        snake = re.sub(r"([A-Z])", r"_\1", key).lower()
        table = _ENUM_FIELDS.get(key)
        if key == "labels":  # user data: never enums
            out[key] = value
            continue
        if table is not None:
            names = {v: k for k, v in table.items()}
            name = names.get(value) if isinstance(value, int) else value
            if name not in table:
                raise _HttpError(
                    400,
                    "INVALID_ARGUMENT",
                    f"Invalid value at '{where}.{snake}' "
                    f"(type.googleapis.com/google.cloud.aiplatform.v1.{key}), {json.dumps(value)}",
                )
            value = name
        out[key] = _decode_enums(value, f"{where}.{snake}")
    return out


def _encode_enums(node: Any) -> Any:
    if isinstance(node, list):
        return [_encode_enums(v) for v in node]
    if not isinstance(node, dict):
        return node
    return {
        k: v
        if k == "labels"
        else _ENUM_FIELDS[k][v]
        if k in _ENUM_FIELDS and isinstance(v, str)
        else _encode_enums(v)
        for k, v in node.items()
    }


_TERM = re.compile(
    r'\s*(resource\.type|resource\.labels\.[a-z_]+|timestamp)\s*(=|>=|>)\s*"([^"]*)"\s*'
)


def _log_filter(expr: str) -> Callable[[dict[str, Any]], bool]:
    """The subset of the Logging query language gputrain sends: terms joined by AND, each
    `resource.type="x"`, `resource.labels.k="v"` or `timestamp>="t"`; anything else is a 400."""
    terms = []
    for term in filter(None, re.split(r"\s+AND\s+", expr.strip())):
        m = _TERM.fullmatch(term)
        if not m:
            raise _HttpError(400, "INVALID_ARGUMENT", f"Unparseable filter: {term!r}")
        key, op, value = m.groups()
        terms.append((key, op, _sortable(value) if key == "timestamp" else value))

    def match(entry: dict[str, Any]) -> bool:
        for key, op, want in terms:
            if key == "timestamp":
                got = _sortable(entry["timestamp"])
            elif key == "resource.type":
                got = entry["resource"]["type"]
            else:
                got = entry["resource"]["labels"].get(key.rsplit(".", 1)[1], "")
            if not (got == want if op == "=" else got >= want if op == ">=" else got > want):
                return False
        return True

    return match


def _sortable(ts: str) -> str:
    """An RFC 3339 time (Z or +00:00/+0000, any fraction) as a fixed-width UTC string."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)", ts)
    if not m:
        raise _HttpError(400, "INVALID_ARGUMENT", f"Invalid timestamp in filter: {ts!r}")
    base, frac, zone = m.groups()
    t = dt.datetime.fromisoformat(base).replace(tzinfo=dt.timezone.utc)
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        hours, minutes = int(zone[1:3]), int(zone[-2:])
        t -= sign * dt.timedelta(hours=hours, minutes=minutes)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + (frac or "").ljust(9, "0")[:9]
