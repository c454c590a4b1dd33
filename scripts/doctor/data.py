"""The doctor's rows for the stack's datasets: this machine can list each prefix (the nodes read
it with their own account, which `up` grants roles/storage.objectViewer on the bucket)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.base.errors import UserError
from infra.datasets import Dataset
from scripts.doctor.report import Row


def data_rows(datasets: Sequence[Dataset], client: Any = None) -> list[Row]:
    from scripts.job.data import list_prefix, storage_client

    rows = []
    for d in datasets:
        check = f"data {d.name}"
        try:
            info = list_prefix(d, client or storage_client())
        except UserError as e:
            text = str(e).removeprefix(f"{check} ({d.uri}): ")
            fix = f"fix `gputrain:data` {d.name} or grant yourself roles/storage.objectViewer on gs://{d.bucket}"
            rows.append(Row(check, "fail", f"{d.uri}: {text}", fix))
            continue
        rows.append(
            Row(
                check,
                "ok",
                f"{d.uri}: {info.objects} object(s), {info.bytes / (1 << 30):.2f} GiB ({d.mode})",
            )
        )
    return rows
