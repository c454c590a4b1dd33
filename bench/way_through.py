"""The way through the controller: a `sys.setprofile` trace of its main thread on the `run --stack`
end-to-end test (tests/testbed/test_lifecycle.py's `test_run_stack_end_to_end`: the fake stack
runner, the fake Compute API, the doctor's fakes, sshd test hosts), from `scripts.cli.main` to the
call of `launch_torchrun`, counting only calls that cross from one project file into another.

Figures: files entered (distinct files a crossing went into, `cli.py` included), crossings, the
crossings that return to a file already left (entered before), and how often `scripts/lifecycle.py`
was entered; once for calls alone (the issue's method) and once with the returns too (control
coming back into the caller's file, as a hand trace reads it: the design review's "stops"). A project file is one under infra/, scripts/ or trainer/ (tests/ and bench/ are the
world, not the controller); what an import runs (a module body and what it calls) is not counted:
it depends on what was imported before, not on the way through. The caller of a call is the nearest project frame above it, so a call through contextlib
or a lambda from lifecycle.py into targets/stack/target.py counts as lifecycle -> target.
Needs root and openssh-server (the test bed). `--list` prints every crossing; `--as-merged
FILE=INTO` the figures as if FILE's functions stood in INTO (what a merge would change).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts import ui  # noqa: E402
from tests.support.gcs_emulator import GcsEmulator  # noqa: E402
from tests.support.stack_world import FAST_TRAIN, world_factory  # noqa: E402
from tests.support.testbed import TestBed  # noqa: E402

PROJECT = tuple(str(ROOT / d) + "/" for d in ("infra", "scripts", "trainer"))
START = (str(ROOT / "scripts" / "cli.py"), "main")
STOP = (str(ROOT / "scripts" / "job" / "launch.py"), "launch_torchrun")
LIFECYCLE = "scripts/lifecycle.py"


def project_frame(frame: FrameType | None) -> FrameType | None:
    """The nearest frame from `frame` up that runs project code (not a module body)."""
    while frame is not None and not (
        frame.f_code.co_filename.startswith(PROJECT) and frame.f_code.co_name != "<module>"
    ):
        frame = frame.f_back
    return frame


def importing(frame: FrameType | None) -> bool:
    """Whether the frame runs under an import (its module body, or what that calls)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


@dataclass
class WayThrough:
    """The crossings seen between START and STOP (in the thread that set the profile): `calls`
    (from, to, function) for calls into another file, `visits` the file control is in after each
    change, returns included (A calls B, B returns: A, B, A)."""

    calls: list[tuple[str, str, str]] = field(default_factory=list)
    visits: list[str] = field(default_factory=list)
    started: bool = False
    stopped: bool = False

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event not in ("call", "return") or self.stopped or project_frame(frame) is not frame:
            return
        if importing(frame):  # what a lazy import runs depends on what ran before, not the way
            return
        code = frame.f_code
        where = rel(code.co_filename)
        if not self.started:
            if event != "call" or (code.co_filename, code.co_name) != START:
                return
            self.started = True
            self.calls.append(("", where, code.co_name))
            self.visits.append(where)
            return
        caller = project_frame(frame.f_back)
        source = rel(caller.f_code.co_filename) if caller is not None else ""
        if event == "return":  # control goes back to the caller's file
            if source and source != self.visits[-1]:
                self.visits.append(source)
            return
        if source != where:
            self.calls.append((source, where, code.co_name))
        if where != self.visits[-1]:
            self.visits.append(where)
        if (code.co_filename, code.co_name) == STOP:
            self.stopped = True

    def figures(self, merged: dict[str, str] | None = None) -> dict[str, dict[str, int]]:
        """The figures; with `merged` (file -> the file it would live in), as if each file's
        functions stood in that one: a call between the two is no crossing then."""
        at = (merged or {}).get
        calls = [(at(s, s), at(t, t)) for s, t, _ in self.calls]
        visits = [at(v, v) for v in self.visits]
        return {
            "calls": way_figures([t for s, t in calls if s != t]),
            "calls and returns": way_figures(
                [v for i, v in enumerate(visits) if not i or v != visits[i - 1]]
            ),
        }


def way_figures(files: list[str]) -> dict[str, int]:
    """Files entered, crossings, returns to a file already left, lifecycle.py entered; `files`
    starts with where the way starts (not a crossing)."""
    seen: set[str] = set()
    returns = 0
    for f in files:
        returns += f in seen
        seen.add(f)
    return {
        "files entered": len(seen),
        "crossings": len(files) - 1,
        "returns to a file already left": returns,
        "lifecycle.py entered": files.count(LIFECYCLE),
    }


def rel(path: str) -> str:
    return str(Path(path).relative_to(ROOT))


def trace(tb: TestBed) -> WayThrough:
    """One `run --stack e2e --yes -- FAST_TRAIN` (the end-to-end test's command), traced."""
    monkeypatch = pytest.MonkeyPatch()
    way = WayThrough()
    with tempfile.TemporaryDirectory(prefix="gputrain-bench-") as tmp:
        factory = world_factory(tb, Path(tmp), monkeypatch)
        try:
            w = next(factory)()
            sys.setprofile(way.profile)
            try:
                rc = w.run("run", "--stack", "e2e", "--yes", "--", *FAST_TRAIN)
            finally:
                sys.setprofile(None)
            assert rc == 0, f"the run failed (exit {rc})"
            assert way.stopped, "the trace never reached launch_torchrun"
        finally:
            next(factory, None)
            monkeypatch.undo()
    return way


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every crossing")
    parser.add_argument(
        "--as-merged",
        action="append",
        default=[],
        metavar="FILE=INTO",
        help="also print the figures as if FILE's functions lived in INTO (repeatable, cumulative)",
    )
    args = parser.parse_args()
    quiet, table = ui.say, ui.table
    ui.say = lambda m: None  # type: ignore[assignment]
    ui.table = lambda *a, **k: None  # type: ignore[assignment]
    try:  # teardown's sweep lists buckets: an emulator, as the tests' conftest gives them
        with GcsEmulator() as gcs, TestBed() as tb:
            os.environ["STORAGE_EMULATOR_HOST"] = gcs.url
            way = trace(tb)
    finally:
        ui.say, ui.table = quiet, table
    if args.list:
        for source, to, name in way.calls:
            print(f"{source or '(start)':45} -> {to}:{name}")
        print("visits:", " > ".join(way.visits))
    for view, files in (("calls", [to for _, to, _ in way.calls]), ("+returns", way.visits)):
        busiest = ", ".join(f"{f} {n}" for f, n in Counter(files).most_common(8))
        print(f"most entered ({view}): {busiest}")
    for view, figures in way.figures().items():
        print(f"{view}: " + "; ".join(f"{k}: {v}" for k, v in figures.items()))
    merged: dict[str, str] = {}
    for pair in args.as_merged:
        file, _, into = pair.partition("=")
        merged[file] = into
        lines = sum(
            len((ROOT / f).read_text().splitlines())
            for f in (into, *[k for k, v in merged.items() if v == into])
        )
        calls = way.figures(merged)["calls"]
        print(
            f"as if {file} were in {into} ({lines} lines): "
            + "; ".join(f"{k}: {v}" for k, v in calls.items())
        )
    print("targets: files entered <= 40, returns halved, lifecycle.py entered <= 6")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
