"""The doctor's rows and its one table: a status and a fix per row. What could not be checked is
"unknown", never a pass; only "fail" stops `up`/`run`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infra.base.errors import UserError
from scripts import ui

Status = Literal["ok", "warn", "fail", "unknown"]
HEADERS = ("check", "status", "detail", "fix")


@dataclass(frozen=True)
class Row:
    check: str
    status: Status
    detail: str
    fix: str = ""


class DoctorFailed(UserError):
    """Something a first `up` needs is missing; the table above says what and how to fix it."""


@dataclass(frozen=True)
class DoctorReport:
    title: str
    rows: tuple[Row, ...]

    @property
    def failures(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.status == "fail")

    def row(self, check: str) -> Row:
        return next(r for r in self.rows if r.check == check)

    def show(self) -> None:
        ui.table(self.title, HEADERS, [(r.check, r.status, r.detail, r.fix) for r in self.rows])

    def require_ok(self, action: str) -> None:
        """DoctorFailed naming every failing check (the table, already shown, has the fixes)."""
        if self.failures:
            names = ", ".join(r.check for r in self.failures)
            raise DoctorFailed(
                f"{action}: {len(self.failures)} problem(s) to fix first: {names} "
                "(see the fixes in the table above); nothing was created"
            )
