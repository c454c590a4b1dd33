"""The Google API adapter's one rule for failures (infra/gcp/api.py:call): every way a call can
fail is one GoogleApiError line starting with the call's label."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from infra.base.errors import EXIT_BAD_INPUT
from infra.gcp.api import GoogleApiError, authorized_session, build_client, call
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


@pytest.mark.parametrize("key", [None, "not json", "{}", "directory"])
def test_a_bad_key_file_is_named_not_a_login(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str | None
) -> None:
    """GOOGLE_APPLICATION_CREDENTIALS set wins over a login: a missing or useless key file is the
    user's to fix (exit 2), named in one line by every adapter, never a login to run."""
    path = tmp_path / "key.json"
    if key == "directory":
        path.mkdir()
    elif key is not None:
        path.write_text(key)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud login to fall back on
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)  # else anonymous credentials
    what = "is missing" if key is None else "is not a key file"
    line = f"GOOGLE_APPLICATION_CREDENTIALS={path} {what}: fix or unset it"
    with pytest.raises(GoogleApiError) as rest:
        IamApi().service_accounts("p")
    with pytest.raises(GoogleApiError) as built:
        build_client(compute_v1.ZonesClient, "Compute Engine", None)
    with pytest.raises(StorageApiError) as storage:
        StorageApi("p").client()
    assert str(rest.value) == f"IAM: no credentials: {line}" and rest.value.credentials
    assert str(built.value) == f"cannot build a Compute Engine client: {line}"
    assert str(storage.value) == f"cannot build a Cloud Storage client: {line}"
    assert {e.value.exit_code for e in (rest, built, storage)} == {EXIT_BAD_INPUT}


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
