"""What every Google API adapter here shares (Compute, Resource Manager, Service Usage): building a
client (anonymous and pointed at a local server in tests), and one-line errors that keep Google's
HTTP status and reason, so callers can tell "the API is off" from "no permission" from "no
credentials". The google libraries are imported inside the functions: they are slow to import.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable
from typing import Any

from infra.base.errors import EXIT_BAD_INPUT, GputrainError

KEY_FILE = "GOOGLE_APPLICATION_CREDENTIALS"
ADC_FIX = f"run `gcloud auth application-default login` or set {KEY_FILE}"
KEY_FILE_FIX = f"fix the file, or unset {KEY_FILE}"  # a doctor or preflight row's fix


def key_file_problem() -> str | None:
    """What is wrong with the key file GOOGLE_APPLICATION_CREDENTIALS names: it wins over every
    other credential, so a login would not help (KEY_FILE_FIX). None when it is unset or loads."""
    path = os.environ.get(KEY_FILE)
    if not path:
        return None
    if not os.path.exists(path):
        return f"{KEY_FILE}={path} is missing"
    try:
        with open(path, encoding="utf-8") as f:
            key = json.load(f)
    except (OSError, ValueError):  # a directory, unreadable, not JSON
        key = None
    if not isinstance(key, dict) or "type" not in key:  # every credential file names its type
        return f"{KEY_FILE}={path} is not a key file"
    return None


#: how google-auth words the refusal of a login whose reauthentication is due (the token
#: endpoint's invalid_grant with error_subtype rapt_required): it keeps no JSON of it
REAUTH_NEEDED = "Reauthentication is needed"


def refused(e: BaseException) -> bool:
    """Google's token endpoint refused the credentials for good (its OAuth error, such as
    "invalid_grant: Token has been expired or revoked"; an impersonation's 4xx; a login's
    reauthentication): the user's setup to fix, as missing credentials are. Not an endpoint that
    did not answer, said "try again" (retryable) or gave no error JSON (a front end's 503 page)."""
    from google.auth.exceptions import RefreshError, TransportError

    if not isinstance(e, RefreshError) or e.retryable or isinstance(e.__cause__, TransportError):
        return False
    if len(e.args) < 2:  # google-auth's own words, or a body that is no JSON
        return str(e).startswith(REAUTH_NEEDED)
    answer = e.args[1]  # the token endpoint's JSON; impersonation's as text
    if isinstance(answer, str):
        try:
            answer = json.loads(answer)
        except ValueError:
            return False
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict):  # a Google API's error: {"code": 403, "status": ...}
        return str(error.get("code", "")).startswith("4")
    return isinstance(error, str)  # OAuth's: invalid_grant, invalid_client, ...


def credentials_error(
    what: str, e: BaseException, make: Callable[[str], GputrainError]
) -> GputrainError:
    """The one line for "no credentials" or refused ones (`what` first): the bad key file
    GOOGLE_APPLICATION_CREDENTIALS names, else the library's reason and ADC_FIX. Both are the
    user's setup to fix (exit 2, as the doctor's failed credentials row stops `up`); any other
    failure to build a client exits 1."""
    from google.auth.exceptions import DefaultCredentialsError

    problem = key_file_problem()
    if problem is None:
        said = str(e.args[0] if e.args else e).strip().splitlines() or [""]
        error = make(f"{what} ({type(e).__name__}: {said[0]}); {ADC_FIX}")
        if not isinstance(e, DefaultCredentialsError) and not refused(e):
            return error
    else:
        error = make(f"{what}: {problem}: fix or unset it")
    error.exit_code = EXIT_BAD_INPUT
    return error


class GoogleApiError(GputrainError):
    """A Google API call failed (permissions, API off...): `code` the HTTP status, `reason`
    Google's (accessNotConfigured, forbidden...), `credentials` when no credentials would do."""

    def __init__(self, message: str, *, code: int | None = None, reason: str | None = None,
                 credentials: bool = False) -> None:  # fmt: skip
        super().__init__(message)
        self.code, self.reason, self.credentials = code, reason, credentials

    @property
    def api_disabled(self) -> bool:
        return self.reason in ("accessNotConfigured", "SERVICE_DISABLED")


def build_client(
    factory: Callable[..., Any], label: str, api_endpoint: str | None, **options: Any
) -> Any:
    """A client from `factory`, its HTTP bounded; with `api_endpoint` ("http://127.0.0.1:PORT")
    it talks to that test server with anonymous credentials, never real ones. Raises
    GoogleApiError(credentials=True) when Application Default Credentials cannot be found."""
    if api_endpoint:
        from google.auth.credentials import AnonymousCredentials

        options |= {
            "credentials": AnonymousCredentials(),
            "client_options": {"api_endpoint": api_endpoint},
        }
    try:
        client = factory(**options)
    except Exception as e:  # DefaultCredentialsError and friends
        raise credentials_error(
            f"cannot build a {label} client", e, lambda m: GoogleApiError(m, credentials=True)
        ) from e
    return bounded(client)


def bounded(client: Any) -> Any:
    """`client` with its HTTP bounded (bounded_http.py): a generated client over REST (its
    transport's session) or a google-cloud-core one (Cloud Storage, BigQuery, Cloud Logging)."""
    import requests

    from infra.gcp.bounded_http import bound

    transport = getattr(client, "transport", None)  # neither kind offers its session publicly
    held = (client, "_http") if transport is None else (transport, "_session")
    session = getattr(*held, None)
    if isinstance(session, requests.Session):  # else a library that moved it, or gRPC: as it is
        bound(session)
    return client


def call(label: str, fn: Callable[[], Any], *, not_found: Any = ...) -> Any:
    """Runs one API call; NotFound returns `not_found` when given; every failure (the API's, the
    credentials', the network's) becomes one GoogleApiError line starting with `label`."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    try:
        return fn()
    except gexc.NotFound as e:
        if not_found is not ...:
            return not_found
        raise GoogleApiError(
            f"{label}: not found: {message(e)}", code=404, reason=_reason(e)
        ) from e
    except gexc.GoogleAPICallError as e:
        raise GoogleApiError(
            f"{label}: {e.code} {message(e)}",
            code=int(e.code) if e.code else None,
            reason=_reason(e),
        ) from e
    except (auth_exc.RefreshError, auth_exc.DefaultCredentialsError) as e:  # refused, expired
        if isinstance(e, auth_exc.RefreshError) and not refused(e):  # the token endpoint's 5xx
            raise GoogleApiError(f"{label}: cannot reach it ({unreachable(e)})") from e
        raise credentials_error(
            f"{label}: the credentials were refused",
            e,
            lambda m: GoogleApiError(m, credentials=True),
        ) from e
    except (auth_exc.GoogleAuthError, OSError) as e:  # the network (requests' errors too)
        raise GoogleApiError(f"{label}: cannot reach it ({e})") from e
    except gexc.RetryError as e:  # retried until the client's deadline: never an answer
        raise GoogleApiError(f"{label}: cannot reach it ({unreachable(e)})") from e


def unreachable(e: BaseException) -> str:
    """Why a Google API could not be reached, in one short line (a RetryError's last cause)."""
    cause = getattr(e, "cause", None) or e
    first = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first[:200]}".rstrip(": ")


def message(e: Any) -> str:
    """The API's own words, without the "GET https://...: " the REST transport puts first."""
    return re.sub(r"^(GET|POST|PUT|PATCH|DELETE) \S+: ", "", str(getattr(e, "message", "") or e))


def _reason(e: Any) -> str | None:
    """The ErrorInfo's reason (SERVICE_DISABLED...), else the first `errors[].reason`."""
    first = (getattr(e, "errors", None) or [None])[0]
    legacy = first.get("reason") if isinstance(first, dict) else None
    return str(getattr(e, "reason", None) or legacy or "") or None


CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


def authorized_session(label: str, api_endpoint: str | None) -> Any:
    """An AuthorizedSession for a REST adapter, bounded: anonymous against a test server
    (`api_endpoint`), never real credentials there; else Application Default Credentials, and
    GoogleApiError (credentials=True) when there are none."""
    from google.auth.transport.requests import AuthorizedSession

    from infra.gcp.bounded_http import bound

    if api_endpoint:
        from google.auth.credentials import AnonymousCredentials

        return bound(AuthorizedSession(AnonymousCredentials()))
    import google.auth

    try:
        creds = google.auth.default(scopes=[CLOUD_PLATFORM])[0]
    except Exception as e:  # DefaultCredentialsError, a directory's IsADirectoryError
        raise credentials_error(
            f"{label}: no credentials", e, lambda m: GoogleApiError(m, credentials=True)
        ) from e
    return bound(AuthorizedSession(creds))


def list_all(session: Any, label: str, url: str, key: str) -> list[dict[str, Any]]:
    """Every item under `key` of a REST `list` (all pages, `pageToken`/`nextPageToken`) through an
    AuthorizedSession; a failure is one GoogleApiError with the API's code and reason."""
    found: list[dict[str, Any]] = []
    token = ""
    while True:
        params = {"pageSize": "100", **({"pageToken": token} if token else {})}
        get = functools.partial(session.get, url, params=params, timeout=60)
        r = call(label, get)  # the network's and the credentials' failures: call's one line
        body = r.json() if r.content else {}
        if r.status_code != 200:
            error = body.get("error") or {}
            infos = [d for d in error.get("details") or [] if d.get("reason")]
            raise GoogleApiError(
                f"{label}: {r.status_code} {error.get('message', r.text[:200])}",
                code=r.status_code,
                reason=(infos[0]["reason"] if infos else None) or error.get("status"),
            )
        found += body.get(key, [])
        token = body.get("nextPageToken", "")
        if not token:
            return found
