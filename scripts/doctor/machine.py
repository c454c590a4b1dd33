"""The doctor's checks of this machine: the Pulumi CLI and its backend, the secrets passphrase a
local backend needs, and Application Default Credentials. `probe_*` do the I/O (the `pulumi`
executable on PATH, google-auth); the `*_row(s)` functions judge what they found and are pure."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from infra.stackfile import StackSecrets
from scripts.doctor.report import Row

#: Pulumi.yaml's typed config schema needs CLI 3.44 (see shared/reference/pulumi-offline-testing).
MIN_PULUMI = (3, 44, 0)
INSTALL_PULUMI = "install it: curl -fsSL https://get.pulumi.com | sh (pulumi.com/docs/install)"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
PASSPHRASE, PASSPHRASE_FILE = "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE"


@dataclass(frozen=True)
class PulumiProbe:
    path: str | None  # the `pulumi` found on PATH
    version: str = ""  # `pulumi version`'s output
    version_error: str = ""
    whoami: str = ""  # `pulumi whoami --json`'s output
    whoami_error: str = ""


def _run(argv: list[str], timeout_s: float) -> tuple[str, str]:
    """(stdout, "") or ("", why it failed)."""
    env = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"}
    command = " ".join(["pulumi", *argv[1:]])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return "", f"`{command}` did not answer within {timeout_s:.0f} s"
    except OSError as e:
        return "", f"`{command}` could not run ({e.strerror or e})"
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return "", said[-1] if said else f"exit {done.returncode}"
    return done.stdout.strip(), ""


def probe_pulumi(timeout_s: float = 30.0) -> PulumiProbe:
    path = shutil.which("pulumi")
    if path is None:
        return PulumiProbe(None)
    version, version_error = _run([path, "version"], timeout_s)
    whoami, whoami_error = _run([path, "whoami", "--json", "--non-interactive"], timeout_s)
    return PulumiProbe(path, version, version_error, whoami, whoami_error)


def pulumi_rows(p: PulumiProbe) -> tuple[Row, Row, str | None]:
    """The CLI row, the backend row, and the backend's URL (None: unknown)."""
    cli, backend = "Pulumi CLI", "Pulumi backend"
    need_cli = Row(backend, "unknown", "needs the Pulumi CLI", "fix the Pulumi CLI row first")
    if p.path is None:
        return Row(cli, "fail", "`pulumi` is not on PATH", INSTALL_PULUMI), need_cli, None
    if p.version_error:
        return Row(cli, "unknown", p.version_error, f"reinstall: {INSTALL_PULUMI}"), need_cli, None
    m = re.search(r"v?(\d+)\.(\d+)\.(\d+)", p.version)
    if not m:
        return (
            Row(cli, "unknown", f"unrecognised version {p.version!r}", INSTALL_PULUMI),
            need_cli,
            None,
        )
    found = tuple(int(x) for x in m.groups())
    minimum = ".".join(map(str, MIN_PULUMI))
    if found < MIN_PULUMI:
        row = Row(
            cli,
            "fail",
            f"{p.version} at {p.path} is older than {minimum} (Pulumi.yaml's typed config)",
            f"upgrade: {INSTALL_PULUMI}",
        )
    else:
        row = Row(cli, "ok", f"{p.version} at {p.path}")
    if p.whoami_error:
        return (
            row,
            Row(
                backend,
                "fail",
                f"not logged in: {p.whoami_error}",
                "pulumi login --local (state in ~/.pulumi on this machine), or pulumi login "
                "(Pulumi Cloud)",
            ),
            None,
        )
    try:
        who = json.loads(p.whoami)
        url, user = str(who["url"]), str(who["user"])
    except (ValueError, KeyError, TypeError):
        return (
            row,
            Row(backend, "unknown", f"unrecognised `pulumi whoami` output {p.whoami[:60]!r}"),
            None,
        )
    return row, Row(backend, "ok", f"{url} as {user}"), url


def passphrase_row(
    backend: str | None, secrets: StackSecrets | None, environ: Mapping[str, str]
) -> Row:
    """A local (file://, s3://, gs://...) backend encrypts secrets with a passphrase that a
    non-interactive `up` can only read from PULUMI_CONFIG_PASSPHRASE(_FILE)."""
    name = PASSPHRASE
    provider = secrets.provider if secrets else None
    if provider and not provider.startswith("passphrase"):
        scheme = provider.split("://")[0]
        return Row(name, "ok", f"not needed: the stack's secrets provider is {scheme}://")
    if PASSPHRASE in environ:
        return Row(name, "ok", f"{PASSPHRASE} is set")
    if PASSPHRASE_FILE in environ:
        path = environ[PASSPHRASE_FILE]
        if os.path.isfile(path) and os.access(path, os.R_OK):
            return Row(name, "ok", f"{PASSPHRASE_FILE} is set ({path})")
        return Row(
            name,
            "fail",
            f"{PASSPHRASE_FILE}={path} cannot be read",
            "point it at a readable file that holds the stack's passphrase",
        )
    if backend is None:
        return Row(
            name,
            "unknown",
            "not set; whether it is needed depends on the backend, which is unknown",
            f"with `pulumi login --local`, export {PASSPHRASE}",
        )
    if backend.startswith(("https://", "http://")) and not provider:
        return Row(name, "ok", "not needed: Pulumi Cloud encrypts the stack's secrets")
    export = f"export {PASSPHRASE}='...' (or {PASSPHRASE_FILE}=FILE)"
    if secrets is not None and secrets.any:
        held = ", ".join(secrets.secure_keys) or "encryptionsalt"
        return Row(
            name,
            "fail",
            f"not set, and the stack holds secrets ({held}) that `up` must decrypt",
            f"{export}: the passphrase the stack was created with",
        )
    return Row(
        name,
        "warn",
        "not set; a local backend needs it once the stack holds a secret (keygen stores one)",
        f"{export} before `gputrain keygen`",
    )


@dataclass(frozen=True)
class AdcProbe:
    outcome: Literal["ok", "missing", "refused", "unreachable"]
    detail: str


def probe_adc(timeout_s: float = 15.0) -> AdcProbe:
    """Application Default Credentials found (google.auth.default) and accepted by Google's token
    endpoint (one refresh)."""
    import google.auth
    from google.auth import exceptions
    from google.auth.transport.requests import Request

    try:
        creds, _ = google.auth.default(scopes=[CLOUD_PLATFORM])
    except exceptions.DefaultCredentialsError as e:
        return AdcProbe("missing", str(e).split(". ")[0])
    email = str(getattr(creds, "service_account_email", ""))
    if type(creds).__module__ == "google.oauth2.credentials":
        who = "user credentials (gcloud auth application-default login)"
    elif "@" in email:
        who = f"service account {email}"
    else:  # the VM's own (compute_engine), workload identity federation (external_account)...
        who = f"{type(creds).__module__.split('.')[-2]} credentials"
    try:
        creds.refresh(functools.partial(Request(), timeout=timeout_s))
    except exceptions.RefreshError as e:
        return AdcProbe("refused", f"{who} were refused: {e}")
    except exceptions.TransportError as e:
        return AdcProbe("unreachable", f"{who}: Google's token endpoint did not answer ({e})")
    return AdcProbe("ok", who)


def adc_row(p: AdcProbe) -> Row:
    name = "credentials (ADC)"
    login = "gcloud auth application-default login"
    if p.outcome == "ok":
        return Row(name, "ok", p.detail)
    if p.outcome == "missing":
        return Row(name, "fail", p.detail, f"{login} (or GOOGLE_APPLICATION_CREDENTIALS=KEY.json)")
    if p.outcome == "refused":
        return Row(
            name,
            "fail",
            p.detail,
            f"renew them: {login}, or a service-account key that is not deleted",
        )
    return Row(name, "unknown", p.detail, "check the network or proxy, then run the doctor again")
