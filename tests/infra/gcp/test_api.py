"""The Google API adapter's one rule for failures (infra/gcp/api.py:call): every way a call can
fail is one GoogleApiError line starting with the call's label."""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions as gexc

from infra.gcp.api import GoogleApiError, call


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
