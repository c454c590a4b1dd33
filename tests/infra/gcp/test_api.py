"""The Google API adapter's one rule for failures (infra/gcp/api.py:call): every way a call can
fail is one GoogleApiError line starting with the call's label."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from infra.base.errors import EXIT_BAD_INPUT, EXIT_FAILED, GputrainError
from infra.gcp import bounded_http
from infra.gcp.api import ADC_FIX, GoogleApiError, authorized_session, build_client, call
from infra.gcp.compute import ComputeApi
from infra.gcp.gcs import StorageApi, StorageApiError
from infra.gcp.iam import IamApi
from tests.support.fake_gcp_admin import FakeGcpAdmin
from tests.support.fake_http import unreachable_endpoint


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


def _each_adapter_failing() -> list[tuple[GputrainError, str]]:
    """A call through each kind of adapter (an authorized session, a generated client, Cloud
    Storage's), each failing: its error and its label."""
    with pytest.raises(GoogleApiError) as rest:
        IamApi().service_accounts("p")
    with pytest.raises(GoogleApiError) as built:
        ComputeApi().machine_type("p", "z", "m")
    with pytest.raises(StorageApiError) as storage:
        StorageApi("p").bucket_exists("b")
    return [
        (rest.value, "IAM serviceAccounts.list"),
        (built.value, "Compute API machineTypes.get z/m"),
        (storage.value, "Cloud Storage buckets.get b"),
    ]


@pytest.mark.filterwarnings("ignore:Your application has authenticated using end user")
def test_an_expired_login_is_the_users_setup_in_every_adapter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A login whose refresh token Google refuses (expired or revoked) is fixed as no credentials
    are: one line naming the refusal and ADC_FIX, exit 2, in every adapter."""
    refusal = "the credentials were refused (RefreshError: invalid_grant: Token has been expired"
    with FakeGcpAdmin() as admin:
        admin.expired_login(monkeypatch, tmp_path)
        failed = _each_adapter_failing()
    for e, label in failed:
        assert str(e).startswith(f"{label}: {refusal} or revoked.); ")
        assert str(e).endswith(f"; {ADC_FIX}") and e.exit_code == EXIT_BAD_INPUT
    rest, built, _ = (e for e, _ in failed)
    assert isinstance(rest, GoogleApiError) and isinstance(built, GoogleApiError)
    assert rest.credentials and built.credentials


def test_a_token_endpoint_that_says_try_again_is_not_the_users_setup() -> None:
    """A refresh Google may answer next time (a 5xx of the token endpoint: retryable) is the
    network's one line, exit 1, never a login to run."""
    from google.auth.exceptions import RefreshError

    error = RefreshError("internal_failure: try again", retryable=True)
    with pytest.raises(GoogleApiError) as e:
        call("compute zones.list", lambda: _raise(error))
    assert str(e.value).startswith("compute zones.list: cannot reach it (RefreshError: internal")
    assert e.value.exit_code == EXIT_FAILED and ADC_FIX not in str(e.value)


_IMPERSONATION = "Unable to acquire impersonated credentials"


@pytest.mark.parametrize(
    ("args", "is_refused"),
    [
        (("<html><title>503 Service Unavailable</title>try again in 30 seconds</html>",), False),
        (("Reauthentication is needed. Please run `gcloud auth application-default login` to "
          "reauthenticate.",), True),
        (("invalid_client: The OAuth client was not found.", {"error": "invalid_client"}), True),
        ((_IMPERSONATION, '{"error": {"code": 403, "status": "PERMISSION_DENIED"}}'), True),
        ((_IMPERSONATION, '{"error": {"code": 503, "status": "UNAVAILABLE"}}'), False),
        ((_IMPERSONATION, "<html>502 Bad Gateway</html>"), False),
    ],
)  # fmt: skip
def test_only_a_refusal_the_token_endpoint_gave_is_the_users_setup(
    args: tuple[object, ...], is_refused: bool
) -> None:
    """google-auth raises a RefreshError it marks final for a page that is no JSON (a Google
    front end's 503, a proxy's): that is the network's one line, exit 1; an OAuth error, an
    impersonation's 4xx and a login's reauthentication are the credentials' (exit 2)."""
    from google.auth.exceptions import RefreshError

    with pytest.raises(GoogleApiError) as e:
        call("compute zones.list", lambda: _raise(RefreshError(*args, retryable=False)))
    said = "the credentials were refused" if is_refused else "cannot reach it"
    assert str(e.value).startswith(f"compute zones.list: {said} (RefreshError: ")
    assert e.value.exit_code == (EXIT_BAD_INPUT if is_refused else EXIT_FAILED)


@pytest.mark.parametrize(
    ("answer", "refusal"),
    [
        ((502, "<html><title>502 Bad Gateway</title>try again in 30 seconds</html>"), None),
        ((403, "<html><body>Blocked by the proxy</body></html>"), None),
        ((400, {"error": "invalid_grant", "error_subtype": "rapt_required"}),
         "the credentials were refused (RefreshError: Reauthentication is needed. "),
    ],
)  # fmt: skip
@pytest.mark.filterwarnings("ignore:Your application has authenticated using end user")
def test_a_token_endpoints_page_is_no_refusal_in_any_adapter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: tuple[int, Any], refusal: str | None
) -> None:
    """A token endpoint that answers an HTML page (a front end's or a proxy's) has not refused the
    login: one line, "cannot reach it", exit 1, never a login to run; a reauthentication Google
    asks for is the user's setup, exit 2."""
    with FakeGcpAdmin() as admin:
        admin.expired_login(monkeypatch, tmp_path)
        admin.world.token_answer = answer
        failed = _each_adapter_failing()
    for e, label in failed:
        if refusal is None:
            assert str(e).startswith(f"{label}: cannot reach it (RefreshError: <html>")
            assert e.exit_code == EXIT_FAILED and ADC_FIX not in str(e)
        else:
            assert str(e).startswith(f"{label}: {refusal}")
            assert e.exit_code == EXIT_BAD_INPUT and str(e).endswith(ADC_FIX)
        assert "\n" not in str(e)


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


@pytest.fixture
def short_bounds(monkeypatch: pytest.MonkeyPatch) -> float:
    """bounded_http's bounds cut to fractions of a second; what the slowest line may then take
    (the retrying libraries pause up to twice as long as they have waited)."""
    monkeypatch.setattr(bounded_http, "CONNECT_S", 0.5)
    monkeypatch.setattr(bounded_http, "READ_S", 0.5)
    monkeypatch.setattr(bounded_http, "UNREACHABLE_S", 1.0)
    return 6.0


def _failure_within(seconds: float, fn: Callable[[], object]) -> tuple[BaseException, float]:
    """The exception `fn` ends with and when, run aside: a library still waiting after `seconds`
    fails the test then, not minutes later."""
    ended: list[tuple[BaseException, float]] = []
    started = time.monotonic()

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # what it ended with is the answer
            ended.append((e, time.monotonic() - started))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=seconds + 10)
    assert ended, f"still waiting after {seconds + 10:.0f} s"
    return ended[0]


def _storage(endpoint: str) -> object:
    with pytest.MonkeyPatch.context() as m:  # the client reads it when it is built
        m.setenv("STORAGE_EMULATOR_HOST", endpoint)
        storage = StorageApi("p")
        storage.client()
    return storage.bucket_exists("b")


@pytest.mark.parametrize("kind", ["refuses", "never accepts", "never answers"])
@pytest.mark.parametrize(
    ("api", "ask"),
    [
        (
            "Compute API machineTypes.get z/m",
            lambda url: ComputeApi(url).machine_type("p", "z", "m"),
        ),
        ("Cloud Storage buckets.get b", _storage),  # retries a refused connection for 2 min
        ("IAM serviceAccounts.list", lambda url: IamApi(url).service_accounts("p")),
    ],
    ids=["Compute", "Cloud Storage", "IAM"],
)
def test_a_google_api_that_gives_no_answer_is_one_line_within_the_bound(
    short_bounds: float, kind: str, api: str, ask: Callable[[str], object]
) -> None:
    """No network, a firewall, a wrong endpoint: the one line comes within the bounds, not after
    the libraries' own waits (Compute: the OS's 2 min to give up a connection, 600 s for an
    answer; Cloud Storage: 2 min of retries)."""
    with unreachable_endpoint(kind) as url:
        error, took = _failure_within(short_bounds, lambda: ask(url))
    assert isinstance(error, (GoogleApiError, StorageApiError)), repr(error)
    assert str(error).startswith(f"{api}: cannot reach it (") and "\n" not in str(error)
    assert took < short_bounds


@pytest.mark.parametrize("kind", ["refuses", "never accepts"])
def test_a_token_endpoint_that_gives_no_answer_is_the_same_one_line(
    short_bounds: float,
    kind: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real credentials get a token first: out of reach (no network), that is the call's one
    line in the same bounds, never google-auth's TransportError nor its 120 s a try."""
    with FakeGcpAdmin() as admin:
        key = admin.adc_file(tmp_path)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)  # else anonymous credentials
    asks = [
        ("IAM serviceAccounts.list", lambda: IamApi().service_accounts("p")),
        ("Cloud Storage buckets.get b", lambda: StorageApi("p").bucket_exists("b")),
    ]
    with unreachable_endpoint(kind) as url:
        key.write_text(json.dumps({**json.loads(key.read_text()), "token_uri": f"{url}/token"}))
        for api, ask in asks:
            error, took = _failure_within(short_bounds, ask)
            assert isinstance(error, (GoogleApiError, StorageApiError)), repr(error)
            assert str(error).startswith(f"{api}: cannot reach it (") and took < short_bounds
