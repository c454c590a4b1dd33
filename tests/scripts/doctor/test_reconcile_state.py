"""doctor's row for laptop-closed recovery: the Cloud Run job runs `pulumi refresh/up`, so the
stack's state must be in gs:// and its secrets under gcpkms:// (said before anything exists)."""

from __future__ import annotations

import pytest

from infra.spec import parse_spec
from infra.stackfile import StackSecrets
from scripts.doctor.run import reconcile_state_row
from tests.support.pulumi_mocks import deployable_config

KMS = "gcpkms://projects/p/locations/global/keyRings/r/cryptoKeys/k"


@pytest.mark.parametrize(
    ("recover", "backend", "provider", "status", "says"),
    [
        ("auto", "gs://state-bucket", KMS, "ok", "state in gs://state-bucket"),
        ("auto", "file:///home/me/.pulumi", None, "fail", "the Cloud Run job cannot read"),
        ("auto", "gs://state-bucket", None, "fail", "a passphrase"),
        ("always", None, KMS, "unknown", "backend is unknown"),
    ],
)
def test_the_reconcile_job_must_reach_the_state(
    recover: str, backend: str | None, provider: str | None, status: str, says: str
) -> None:
    spec = parse_spec(deployable_config("dev", recover=recover), "dev")  # a spot stack
    row = reconcile_state_row(spec, backend, StackSecrets((), False, provider))
    assert row.status == status and says in row.detail, row
    if status != "ok":
        assert "gcpkms://" in row.fix
