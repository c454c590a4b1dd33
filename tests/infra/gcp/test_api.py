"""The Google API adapter's one rule for failures (infra/gcp/api.py:call): every way a call can
fail is one GoogleApiError line starting with the call's label."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials

from infra.gcp.api import GoogleApiError, authorized_session, call
from infra.gcp.gcs import StorageApi, StorageApiError
from infra.gcp.iam import IamApi


def _raise(e: BaseException) -> None:
    raise e


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (gexc.RetryError("Timeout of 120.0s exceeded", requests.ConnectionError("refused")),
         "cannot reach it (ConnectionError: refused)"),
        (gexc.RetryError("Timeout of 120.0s exceeded", None),
         "cannot reach it (RetryError: Timeout of 120.0s exceeded"),
        (requests.ConnectionError("Max retries exceeded"), "cannot reach it (Max retries"),
        (gexc.ServiceUnavailable("down"), "503 down"),
    ],
)  # fmt: skip
def test_every_failure_is_one_line_naming_the_call(error: BaseException, words: str) -> None:
    with pytest.raises(GoogleApiError) as e:
        call("compute zones.list", lambda: _raise(error))
    assert str(e.value).startswith(f"compute zones.list: {words}") and "\n" not in str(e.value)


def test_a_rest_adapter_without_credentials_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Application Default Credentials: the session's one line, marked as the credentials'."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud login to fall back on
    with pytest.raises(GoogleApiError) as e:
        IamApi().service_accounts("p")
    assert e.value.credentials and "\n" not in str(e.value)
    assert str(e.value).startswith("IAM: no credentials (DefaultCredentialsError")
    assert "gcloud auth application-default login" in str(e.value)


def test_a_test_server_never_gets_credentials() -> None:
    """An endpoint of our own gets an anonymous session: no token goes to it."""
    session = authorized_session("IAM", "http://127.0.0.1:9")
    assert isinstance(session.credentials, AnonymousCredentials)


def test_cloud_storage_that_never_answers_is_one_line() -> None:
    """A RetryError (Google unreachable until the deadline) is the same one line for Cloud Storage."""
    error = gexc.RetryError("Timeout of 120.0s exceeded", requests.ConnectionError("refused"))
    with pytest.raises(StorageApiError) as e:
        StorageApi()._call("objects.list gs://b/", lambda: _raise(error))
    assert (
        str(e.value)
        == "Cloud Storage objects.list gs://b/: cannot reach it (ConnectionError: refused)"
    )
