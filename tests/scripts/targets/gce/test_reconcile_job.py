"""In the stack's Cloud Run job, `gputrain reconcile` first writes the stack file the program
handed the job (GPUTRAIN_STACK_FILE) into the project directory, where it and its Pulumi CLI
read it; a project that has the file keeps its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.stackfile import SpecError
from scripts.targets.gce.reconcile import stack_file_from_environment

TEXT = "secretsprovider: gcpkms://projects/p/locations/l/keyRings/r/cryptoKeys/k\nconfig: {}\n"


def test_the_jobs_stack_file_is_written_once_and_only_there(tmp_path: Path) -> None:
    env = {"GPUTRAIN_STACK_FILE": TEXT}
    assert stack_file_from_environment(tmp_path, "dev", env)
    path = tmp_path / "Pulumi.dev.yaml"
    assert path.read_text() == TEXT and path.stat().st_mode & 0o777 == 0o600
    path.write_text("config: {mine: 1}\n")  # a project with its own file keeps it
    assert not stack_file_from_environment(tmp_path, "dev", env)
    assert path.read_text() == "config: {mine: 1}\n"
    assert not stack_file_from_environment(tmp_path, "other", {})  # not in a job
    assert not (tmp_path / "Pulumi.other.yaml").exists()
    with pytest.raises(SpecError, match=r"stack = '\.\./x'"):
        stack_file_from_environment(tmp_path, "../x", env)
