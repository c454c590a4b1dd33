"""The doctor's rows for the stack's datasets: this machine can list each prefix (the nodes read
it with their own account, which `up` grants roles/storage.objectViewer on the bucket)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.base.errors import UserError
from infra.datasets import Dataset
from scripts.doctor.row import Row


def data_rows(
    datasets: Sequence[Dataset], client: Any = None, room_gib: int | None = None
) -> list[Row]:
    """A row per dataset; then, when the node's disk size is known (`room_gib`: the local SSD,
    else the boot disk), a row failing if the `copy` datasets cannot fit on it."""
    from scripts.job.data_io import list_prefix, storage_client

    rows = []
    copy_bytes = 0
    for d in datasets:
        check = f"data {d.name}"
        try:
            info = list_prefix(d, client or storage_client())
        except UserError as e:
            text = str(e).removeprefix(f"{check} ({d.uri}): ")
            fix = f"fix `gputrain:data` {d.name} or grant yourself roles/storage.objectViewer on gs://{d.bucket}"
            rows.append(Row(check, "fail", f"{d.uri}: {text}", fix))
            continue
        copy_bytes += info.bytes if d.mode == "copy" else 0
        rows.append(
            Row(
                check,
                "ok",
                f"{d.uri}: {info.objects} object(s), {info.bytes / (1 << 30):.2f} GiB ({d.mode})",
            )
        )
    if room_gib is not None and copy_bytes > room_gib << 30:
        rows.append(
            Row(
                "data size",
                "fail",
                f"the copy datasets hold {copy_bytes / (1 << 30):,.1f} GiB; a node's disk for them "
                f"has {room_gib:,} GiB",
                "raise bootDiskGb, use a machine type with local SSD (or localSsdCount), or `:mount`",
            )
        )
    return rows
