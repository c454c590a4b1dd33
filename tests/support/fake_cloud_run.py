"""A local fake of the two managed services that run `gputrain reconcile` while the laptop is
closed: Cloud Run Admin API v2 jobs (`jobs.create`, `jobs.get`, `jobs.list`, `jobs.run`,
`executions.get`, answering with long-running Operations and Execution bodies) and Cloud
Scheduler v1 jobs (`jobs.create`, `jobs.list`) whose HTTP target the test fires with `tick()`, as
Scheduler does on its schedule: a POST to the target's URI with an OAuth bearer token. Lists come
in pages of `page_size` with a `nextPageToken`, as both APIs page.

A run starts the job's container for real, in its own process: the test maps each image to the
argv that stands for its entrypoint (tests/support/controller_child.py for gputrain's image), and
the container's `args` follow it; the execution ends with the process's exit code and keeps its
output (what Cloud Logging would hold).
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
import subprocess
import threading
import urllib.request
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.fake_http import FakeHttpServer, send_json

RUN_API = "https://run.googleapis.com"
TOKEN = "fake-scheduler-oauth-token"
_JOB = re.compile(r"^/v2/(projects/[^/]+/locations/[^/]+/jobs/[^/:]+)$")
_RUN = re.compile(r"^/v2/(projects/[^/]+/locations/[^/]+/jobs/[^/:]+):run$")
_EXECUTION = re.compile(r"^/v2/(projects/[^/]+/locations/[^/]+/jobs/[^/]+/executions/[^/]+)$")
_JOBS = re.compile(r"^/v2/(projects/[^/]+/locations/[^/]+)/jobs$")
_SCHEDULER_JOBS = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+)/jobs$")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class FakeCloudRun(FakeHttpServer):
    """`images`: image -> the argv its entrypoint stands for; `env`: the containers' environment."""

    def __init__(self, images: Mapping[str, Sequence[str]], env: Mapping[str, str]) -> None:
        self.images, self.env = dict(images), dict(env)
        self.jobs: dict[str, dict[str, Any]] = {}  # full name -> Job
        self.schedules: dict[str, dict[str, Any]] = {}  # full name -> Scheduler Job
        self.executions: dict[str, dict[str, Any]] = {}
        self.output: dict[str, str] = {}  # execution name -> its container's output
        self.requests: list[tuple[str, str, str]] = []  # method, path, Authorization
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}  # execution name -> its task
        self.page_size = 2
        self._serve()

    # ---- what the test does

    def tick(self) -> list[str]:
        """Every Scheduler job fires once: its HTTP target, with an OAuth token. The execution
        names its runs started."""
        started = []
        for job in list(self.schedules.values()):
            target = job["httpTarget"]
            uri = target["uri"].replace(RUN_API, self.url)
            request = urllib.request.Request(
                uri,
                data=b"",
                method=target.get("httpMethod", "POST"),
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as answer:
                operation = json.loads(answer.read())
            started.append(operation["metadata"]["name"])
        return started

    def wait(self, execution: str, timeout: float = 180) -> dict[str, Any]:
        """The execution once its task has ended."""
        thread = self._threads[execution]
        thread.join(timeout)
        assert not thread.is_alive(), f"{execution} still runs after {timeout} s"
        return self.executions[execution]

    # ---- the APIs

    def _run(self, job_name: str) -> dict[str, Any]:
        job = self.jobs[job_name]
        [container] = job["template"]["template"]["containers"]
        argv = [*self.images[container["image"]], *container.get("args", [])]
        name = f"{job_name}/executions/{job_name.rsplit('/', 1)[1]}-{next(self._ids):05d}"
        execution = {
            "name": name,
            "job": job_name.rsplit("/", 1)[1],
            "createTime": _now(),
            "startTime": _now(),
            "taskCount": 1,
            "runningCount": 1,
            "succeededCount": 0,
            "failedCount": 0,
        }
        self.executions[name] = execution

        def run() -> None:
            done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=600)
            self.output[name] = done.stdout + done.stderr
            execution.update(
                runningCount=0,
                succeededCount=int(done.returncode == 0),
                failedCount=int(done.returncode != 0),
                completionTime=_now(),
            )

        self._threads[name] = threading.Thread(target=run, daemon=True)
        self._threads[name].start()
        return execution

    def _page(
        self,
        handler: BaseHTTPRequestHandler,
        key: str,
        items: Mapping[str, dict[str, Any]],
        parent: str,
        query: Mapping[str, list[str]],
    ) -> None:
        """One page of `items` under `parent`, in name order."""
        mine = [items[n] for n in sorted(items) if n.startswith(f"{parent}/jobs/")]
        start = int((query.get("pageToken") or ["0"])[0])
        body: dict[str, Any] = {key: mine[start : start + self.page_size]}
        if start + self.page_size < len(mine):
            body["nextPageToken"] = str(start + self.page_size)
        send_json(handler, 200, body)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> dict[str, Any]:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def _route(self, method: str) -> None:
                parts = urlsplit(self.path)
                path, query = parts.path, parse_qs(parts.query)
                auth = self.headers.get("Authorization", "")
                with fake._lock:
                    fake.requests.append((method, path, auth))
                listing = method == "GET" and bool(_JOBS.match(path) or _SCHEDULER_JOBS.match(path))
                if not auth.startswith("Bearer ") and not listing:  # the sweep's anonymous reads
                    send_json(self, 401, {"error": {"code": 401, "status": "UNAUTHENTICATED"}})
                    return
                body = self._body() if method == "POST" else {}
                if method == "POST" and (m := _JOBS.match(path)):
                    name = f"{m[1]}/jobs/{query['jobId'][0]}"
                    fake.jobs[name] = {**body, "name": name, "createTime": _now()}
                    op = {"name": f"{m[1]}/operations/{next(fake._ids)}", "done": True}
                    op["response"] = {"@type": "type.googleapis.com/google.cloud.run.v2.Job"}
                    send_json(self, 200, op | {"response": op["response"] | fake.jobs[name]})
                elif method == "POST" and (m := _RUN.match(path)):
                    if m[1] not in fake.jobs:
                        send_json(self, 404, {"error": {"code": 404, "status": "NOT_FOUND"}})
                        return
                    execution = fake._run(m[1])
                    location = m[1].rsplit("/jobs/", 1)[0]
                    send_json(
                        self,
                        200,
                        {
                            "name": f"{location}/operations/{next(fake._ids)}",
                            "done": False,
                            "metadata": {
                                "@type": "type.googleapis.com/google.cloud.run.v2.Execution",
                                **execution,
                            },
                        },
                    )
                elif method == "GET" and (m := _EXECUTION.match(path)) and m[1] in fake.executions:
                    send_json(self, 200, fake.executions[m[1]])
                elif method == "GET" and (m := _JOB.match(path)) and m[1] in fake.jobs:
                    send_json(self, 200, fake.jobs[m[1]])
                elif method == "GET" and (m := _JOBS.match(path)):
                    fake._page(self, "jobs", fake.jobs, m[1], query)
                elif method == "GET" and (m := _SCHEDULER_JOBS.match(path)):
                    fake._page(self, "jobs", fake.schedules, m[1], query)
                elif method == "POST" and (m := _SCHEDULER_JOBS.match(path)):
                    fake.schedules[body["name"]] = {**body, "state": "ENABLED"}
                    send_json(self, 200, fake.schedules[body["name"]])
                else:
                    send_json(self, 404, {"error": {"code": 404, "status": "NOT_FOUND"}})

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

        return Handler
