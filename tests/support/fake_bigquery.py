"""A local BigQuery REST server holding one Cloud Billing export table, for the real
google-cloud-bigquery client: jobs.query (POST /bigquery/v2/projects/P/queries), and for a query
that does not finish at once, jobs.get and jobs.getQueryResults (GET .../jobs/ID, .../queries/ID).

Rows are kept in the standard usage cost export's documented schema ("Structure of Standard data
export", cloud.google.com/billing/docs/how-to/export-data-bigquery-tables/standard-usage) and sent
in BigQuery's REST row encoding ({"f": [{"v": ...}]}; REPEATED as a list of {"v": ...}; RECORD as
{"f": ...}; TIMESTAMP as int64 microseconds, as the client asks with formatOptions).

It understands the two query shapes gputrain sends (scripts/cost/billing.py): the newest
export_time, and the labelled usage rows since @since whose labels hold @stack_label with a value
in @stacks; anything else is answered 400 invalidQuery, as a query BigQuery cannot parse is."""

from __future__ import annotations

import json
import re
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlparse

from tests.support.fake_http import FakeHttpServer, send_json

STRING, FLOAT, TIMESTAMP = "STRING", "FLOAT", "TIMESTAMP"
KEY_VALUE = [{"name": "key", "type": STRING}, {"name": "value", "type": STRING}]
#: The standard usage cost export's columns (those gputrain reads, and their neighbours).
SCHEMA: dict[str, dict[str, Any]] = {
    "billing_account_id": {"type": STRING},
    "service": {"type": "RECORD", "fields": [{"name": "id", "type": STRING},
                                             {"name": "description", "type": STRING}]},
    "sku": {"type": "RECORD", "fields": [{"name": "id", "type": STRING},
                                         {"name": "description", "type": STRING}]},
    "usage_start_time": {"type": TIMESTAMP},
    "usage_end_time": {"type": TIMESTAMP},
    "labels": {"type": "RECORD", "mode": "REPEATED", "fields": KEY_VALUE},
    "system_labels": {"type": "RECORD", "mode": "REPEATED", "fields": KEY_VALUE},
    "export_time": {"type": TIMESTAMP},
    "cost": {"type": FLOAT},
    "currency": {"type": STRING},
    "credits": {"type": "RECORD", "mode": "REPEATED", "fields": [
        {"name": "name", "type": STRING}, {"name": "amount", "type": FLOAT},
        {"name": "full_name", "type": STRING}, {"name": "id", "type": STRING},
        {"name": "type", "type": STRING}]},
    "cost_type": {"type": STRING},
}  # fmt: skip


def export_row(
    *,
    labels: dict[str, str],
    start: float,
    end: float,
    cost: float,
    exported: float,
    credits: float = 0.0,
    sku: str = "Nvidia L4 GPU running in Americas",
    currency: str = "USD",
) -> dict[str, Any]:
    """One usage row as the export holds it."""
    return {
        "billing_account_id": "012345-6789AB-CDEF01",
        "service": {"id": "6F81-5844-456A", "description": "Compute Engine"},
        "sku": {"id": "0000-0000-0000", "description": sku},
        "usage_start_time": start,
        "usage_end_time": end,
        "labels": [{"key": k, "value": v} for k, v in labels.items()],
        "system_labels": [],
        "export_time": exported,
        "cost": cost,
        "currency": currency,
        "credits": [{"name": "Committed use discount", "amount": credits, "full_name": None,
                     "id": None, "type": "COMMITTED_USAGE_DISCOUNT"}] if credits else [],
        "cost_type": "regular",
    }  # fmt: skip


def _field(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    out = {"name": name, "type": spec["type"], "mode": spec.get("mode", "NULLABLE")}
    if "fields" in spec:
        out["fields"] = [
            _field(f["name"], {**f, "type": f["type"]}) | {"mode": "NULLABLE"}
            for f in spec["fields"]
        ]
    return out


def _encode(value: Any, spec: dict[str, Any]) -> Any:
    """A value in BigQuery's REST row encoding."""
    if spec.get("mode") == "REPEATED":
        return [{"v": _encode(v, {**spec, "mode": "NULLABLE"})} for v in value or []]
    if value is None:
        return None
    if spec["type"] == "RECORD":
        return {"f": [{"v": _encode(value.get(f["name"]), f)} for f in spec["fields"]]}
    if spec["type"] == TIMESTAMP:
        return str(round(value * 1_000_000))
    return str(value)


def _param(body: dict[str, Any], name: str) -> Any:
    for p in body.get("queryParameters", []):
        if p.get("name") == name:
            value = p["parameterValue"]
            if "arrayValues" in value:
                return [v["value"] for v in value["arrayValues"]]
            return value.get("value")
    raise KeyError(name)


def _timestamp(text: str) -> float:
    """A TIMESTAMP query parameter as the client sends it ('2026-11-27 09:00:00.000000+00:00')."""
    return datetime.fromisoformat(text.replace(" ", "T")).astimezone(timezone.utc).timestamp()


class FakeBigQuery(FakeHttpServer):
    """`table` is PROJECT.DATASET.TABLE; `rows` its contents (export_row); `slow`: the first
    answer to each query says jobComplete false, so the client waits on getQueryResults."""

    def __init__(self, table: str, rows: list[dict[str, Any]] | None = None) -> None:
        self.table = table
        self.rows = list(rows or [])
        self.slow = False
        self.readable = True  # False: 403 accessDenied, as for a caller without the dataset role
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self._jobs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._serve()

    def paths(self, method: str) -> list[str]:
        return [p for m, p, _ in self.requests if m == method]

    # -- the query -------------------------------------------------------------------------

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        sql = body.get("query", "")
        named = re.findall(r"`([^`]+)`", sql)
        if body.get("useLegacySql", True) is not False:
            return 400, _error(400, "invalidQuery", "legacy SQL: gputrain sends standard SQL")
        if named != [self.table]:
            table = named[0] if named else "?"
            return 404, _error(404, "notFound", f"Not found: Table {table.replace('.', ':', 1)} "
                               "was not found in location US")  # fmt: skip
        if not self.readable:
            return 403, _error(403, "accessDenied", f"Access Denied: Table {self.table}: User "
                               "does not have permission to query table")  # fmt: skip
        if re.search(r"SELECT MAX\(export_time\) AS up_to FROM", sql):
            times = [r["export_time"] for r in self.rows]
            schema = {"up_to": {"type": TIMESTAMP}}
            return 200, self._result(schema, [{"up_to": max(times) if times else None}])
        m = re.match(r"SELECT ([\w, ]+)\s+FROM", sql)
        if not m or "UNNEST(labels)" not in sql:
            return 400, _error(400, "invalidQuery", f"the fake does not know this query: {sql}")
        columns = [c.strip() for c in m.group(1).split(",")]
        since = _timestamp(_param(body, "since"))
        key, values = _param(body, "stack_label"), set(_param(body, "stacks"))
        chosen = [
            r
            for r in self.rows
            if r["usage_end_time"] >= since
            and any(lb["key"] == key and lb["value"] in values for lb in r["labels"])
        ]
        schema = {c: SCHEMA[c] for c in columns}
        return 200, self._result(schema, [{c: r[c] for c in columns} for r in chosen])

    def _result(
        self, schema: dict[str, dict[str, Any]], rows: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {
            "schema": {"fields": [_field(n, s) for n, s in schema.items()]},
            "rows": [{"f": [{"v": _encode(r[n], s)} for n, s in schema.items()]} for r in rows],
            "totalRows": str(len(rows)),
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> dict[str, Any]:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n)) if n else {}

            def do_POST(self) -> None:
                path, body = urlparse(self.path).path, self._body()
                fake.requests.append(("POST", path, body))
                m = re.fullmatch(r"/bigquery/v2/projects/([^/]+)/queries", path)
                if not m:
                    send_json(self, 404, _error(404, "notFound", f"no route {path}"))
                    return
                status, answer = fake._answer(body)
                if status != 200:
                    send_json(self, status, answer)
                    return
                with fake._lock:
                    job_id = f"job_{len(fake._jobs)}"
                    fake._jobs[job_id] = answer | {"query": body.get("query", "")}
                ref = {"projectId": m.group(1), "jobId": job_id, "location": "US"}
                if fake.slow:
                    send_json(self, 200, {"kind": "bigquery#queryResponse",
                                          "jobReference": ref, "jobComplete": False})  # fmt: skip
                    return
                send_json(self, 200, {"kind": "bigquery#queryResponse", "jobReference": ref,
                                      "jobComplete": True, "cacheHit": False} | answer)  # fmt: skip

            def do_GET(self) -> None:
                path = urlparse(self.path).path
                fake.requests.append(("GET", path, {}))
                m = re.fullmatch(r"/bigquery/v2/projects/([^/]+)/(jobs|queries)/([^/]+)", path)
                job = fake._jobs.get(m.group(3)) if m else None
                if m is None or job is None:
                    send_json(self, 404, _error(404, "notFound", f"Not found: Job {path}"))
                    return
                ref = {"projectId": m.group(1), "jobId": m.group(3), "location": "US"}
                if m.group(2) == "jobs":  # jobs.get: the job is done
                    send_json(self, 200, {
                        "kind": "bigquery#job", "id": f"{m.group(1)}:US.{m.group(3)}",
                        "jobReference": ref, "status": {"state": "DONE"},
                        "configuration": {"query": {"query": job["query"],
                                                    "useLegacySql": False}},
                        "statistics": {"creationTime": "0", "startTime": "0", "endTime": "1"},
                    })  # fmt: skip
                    return
                answer = {k: v for k, v in job.items() if k != "query"}
                send_json(self, 200, {"kind": "bigquery#getQueryResultsResponse",
                                      "jobReference": ref, "jobComplete": True} | answer)  # fmt: skip

        return Handler


def _error(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message,
                      "errors": [{"reason": reason, "message": message, "domain": "global"}],
                      "status": {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED",
                                 404: "NOT_FOUND"}.get(code, "UNKNOWN")}}  # fmt: skip
