"""Shared fixtures: the fake Compute API and its production adapter, a Cloud Storage emulator (the
sshd test bed's fixtures are in tests/testbed/conftest.py, for the tests in that folder only).

The suite leaves the machine as it found it: child processes (torchrun, the trainer, gputrain)
get a TMPDIR the session removes at its end, and the session's end checks that nothing new is in
/tmp/torchelastic_* or ~/.cache/gputrain (a failure under CI=true; elsewhere other sessions may
share /tmp, so a note)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.gcp.compute import ComputeApi
from tests.support.fake_compute import FakeCompute
from tests.support.gcs_emulator import GcsEmulator

_SESSION = pytest.StashKey[
    tuple[str, str | None, set[str]]
]()  # (children's TMPDIR, the old one, traces)


def _traces() -> set[str]:
    """What a test run must not leave behind on the machine."""
    ours = (Path.home() / ".cache" / "gputrain", Path.home() / ".local" / "state" / "gputrain")
    return {str(p) for p in Path("/tmp").glob("torchelastic_*")} | {
        str(d) for d in ours if d.exists()
    }


def pytest_configure(config: pytest.Config) -> None:
    tempfile.tempdir = tempfile.gettempdir()  # this process keeps its own temp dir
    above = Path(tempfile.tempdir).resolve()
    stray = next(
        (d / "Pulumi.yaml" for d in (above, *above.parents) if (d / "Pulumi.yaml").is_file()), None
    )
    if stray is not None:  # gputrain looks upwards for Pulumi.yaml, as the Pulumi CLI does
        pytest.exit(
            f"{stray}: a Pulumi project above the temporary directory, which every test's own "
            "project would find instead of itself; move it away",
            returncode=4,
        )
    session_tmp = tempfile.mkdtemp(prefix="gputrain-tests-")
    os.chmod(session_tmp, 0o1777)  # like /tmp: the test hosts' login users write there too
    config.stash[_SESSION] = (session_tmp, os.environ.get("TMPDIR"), _traces())
    os.environ["TMPDIR"] = session_tmp
    # `--local` node roots (scripts/settings.py state_home) go with the session's temp dir
    os.environ["XDG_STATE_HOME"] = str(Path(session_tmp) / "state")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION not in config.stash:  # configure stopped the run before making it
        return
    session_tmp, before, _ = config.stash[_SESSION]
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    shutil.rmtree(session_tmp, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("GPUTRAIN_SKIP_TRACE_CHECK") == "1":
        return  # `make test`'s half without the test bed: the half with it checks the machine
    _, _, before = session.config.stash[_SESSION]
    left = sorted(_traces() - before)
    if not left:
        return
    listing = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if os.environ.get("CI", "").lower() == "true":
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if reporter:
            reporter.write_line(f"FAILED: the tests left {listing} on this machine", red=True)
    elif reporter:
        reporter.write_line(
            f"note: new on this machine since the tests started (ours, or another session's): "
            f"{listing}",
            yellow=True,
        )


@pytest.fixture(scope="session", autouse=True)
def _no_real_cloud_storage() -> Iterator[None]:
    """No test reaches real Cloud Storage: the controller's bucket calls (teardown, sweep) go to a
    session-wide emulator unless a test points STORAGE_EMULATOR_HOST at its own."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        yield
        return
    with GcsEmulator() as emulator:
        os.environ["STORAGE_EMULATOR_HOST"] = emulator.url
        try:
            yield
        finally:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)


@pytest.fixture
def fake() -> Iterator[FakeCompute]:
    """The local fake of the Compute REST API, seeded from the facts sheet."""
    with FakeCompute() as fc:
        yield fc


@pytest.fixture
def api(fake: FakeCompute) -> ComputeApi:
    """The production Compute API adapter, pointed at the fake."""
    return ComputeApi(fake.url)


@pytest.fixture
def gcs(monkeypatch: pytest.MonkeyPatch) -> Iterator[GcsEmulator]:
    """A fresh Cloud Storage emulator with one bucket; this process and its children use it."""
    with GcsEmulator() as emulator:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
        yield emulator
