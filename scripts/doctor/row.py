"""One row of the doctor's table, the record every probe returns (doctor/run.py, project.py,
data.py, cost/billing.py): a check, its status, what was found and the fix. What could not be
checked is "unknown", never a pass; only "fail" stops `up`/`run`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail", "unknown"]


@dataclass(frozen=True)
class Row:
    check: str
    status: Status
    detail: str
    fix: str = ""
