"""`gputrain doctor [--stack NAME]`: everything a first `up` on GCP needs, checked at once and
shown in one table with a fix per row, in the order of the checklist in docs/getting-started.md.
`up` and `run` on a stack run it first and stop with the whole table when a row fails (the
table is DoctorReport, here; each probe module returns doctor/row.py's Row).

The probes are independent, so they run in parallel: the Pulumi CLI, the credentials, the
project's APIs and permissions, the GPU quota and the public-address lookup. The project's rows
are doctor/project.py's; this machine's (the Pulumi CLI and its backend, the secrets passphrase a
local backend needs, Application Default Credentials) and the stack's own settings' (the SSH key
pair, `sshSourceRanges` holding this machine's public address) are here: `probe_*` do the I/O, the
`*_row(s)` functions judge what they found and are pure. The public address cannot be known
offline, so its lookup is a function the caller passes (tests pass their own); when it fails the
row is "unknown".
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import os
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from infra.base.errors import UserError
from infra.keys import redact, whole_internet
from infra.reconciler import BACKEND_ENV
from infra.spec import ClusterSpec
from infra.stackfile import StackSecrets
from scripts import ui
from scripts.doctor.row import Row
from scripts.settings import path_problem, unmakeable
from scripts.transport.ssh import fingerprint, parse_public_key

if TYPE_CHECKING:
    from infra.spec import ClusterSpec
    from infra.stackfile import StackFile
    from scripts.targets.stack.clients import StackClients


HEADERS = ("check", "status", "detail", "fix")


class DoctorFailed(UserError):
    """Something a first `up` needs is missing; the table above says what and how to fix it."""


@dataclass(frozen=True)
class DoctorReport:
    """The doctor's one table: its rows, shown, and the failures that stop `up`/`run`."""

    title: str
    rows: tuple[Row, ...]

    @property
    def failures(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.status == "fail")

    def row(self, check: str) -> Row:
        return next(r for r in self.rows if r.check == check)

    def show(self) -> None:
        ui.table(self.title, HEADERS, [(r.check, r.status, r.detail, r.fix) for r in self.rows])

    def require_ok(self, action: str) -> None:
        """DoctorFailed naming every failing check (the table, already shown, has the fixes)."""
        if self.failures:
            names = ", ".join(r.check for r in self.failures)
            raise DoctorFailed(
                f"{action}: {len(self.failures)} problem(s) to fix first: {names} "
                "(see the fixes in the table above); nothing was created"
            )


def run_doctor(
    stack_file: StackFile | None, clients: StackClients, spec: ClusterSpec | None = None
) -> DoctorReport:
    """All rows for the stack (None: the rows that need no stack; the rest say "no stack
    given"). `spec`: the stack file's spec when the caller parsed it already. A stack file that
    does not parse is a UserError, as for every command."""
    from infra.keys import whole_internet
    from infra.permissions import all_permissions, required_permissions, spec_resource_types
    from infra.reconciler import wanted
    from infra.spec import stack_file_spec
    from scripts.doctor import project

    stack = stack_file.stack if stack_file else None
    secrets = stack_file.secrets if stack_file else None
    if stack_file is not None and spec is None:
        from infra.reconciler import job_reach

        reach = job_reach(os.environ, stack_file.secrets.provider)
        spec = dataclasses.replace(stack_file_spec(stack_file), job_reach=reach)
    vertex = spec is not None and spec.on_vertex
    # laptop-closed recovery: `up` declares the reconcile job and builds its image
    reconciler = (
        spec is not None and not vertex and wanted(spec.recover, spec.capacity, spec.job_reach)
    )
    builder = None  # `build`: "local" (docker/podman here) or "cloud" (Cloud Build)
    if spec is not None and (spec.build or reconciler):
        from scripts.job.image_build import local_builder

        builder = "local" if local_builder() else "cloud"
    if spec is None:
        permissions, source = all_permissions(), "what any stack may need"
    else:
        types = spec_resource_types(spec)
        permissions = required_permissions(types, vertex=vertex, builder=builder)
        source = f"{len(types)} resource types of the stack, `up`'s waits, the controller's reads"
    apis = project.CORE_APIS + (project.VERTEX_APIS if vertex else ())
    if builder is not None:
        apis += project.BUILD_APIS + (project.CLOUD_BUILD_APIS if builder == "cloud" else ())
    if reconciler:
        apis += project.RECONCILER_APIS
    check = project.ProjectCheck(
        spec.project if spec else None, stack, apis, tuple(permissions), source
    )

    def address() -> str | None:
        if spec is None or not spec.ssh_source_ranges or whole_internet(spec.ssh_source_ranges):
            return None  # not needed
        return (clients.public_address or lookup_public_address)()

    def quota() -> Row | None:
        if spec is None or vertex:
            return None  # Vertex AI jobs draw on Vertex quotas, not Compute Engine's
        if not spec.project:
            return Row("GPU quota", "unknown", "needs gcp:project (set gcp:project first)")
        if spec.reservation:  # reserved VMs use the reservation's GPUs (the preflight checks it)
            return Row(
                "GPU quota", "ok", f"not used: reservation {spec.reservation} holds the GPUs"
            )
        return project.gpu_quota_row(
            clients.compute(),
            spec.project,
            [spec.region],
            spec.gpu_quota_metric,
            spec.nodes * spec.gpus_per_node,
            spec.gpus_per_node,
            spec.preemptible_quota,
        )

    with ThreadPoolExecutor(max_workers=5) as pool:
        pulumi = pool.submit(probe_pulumi)
        adc = pool.submit(probe_adc)
        project_rows = pool.submit(
            project.project_rows, check, clients.projects(), clients.compute()
        )
        quota_row = pool.submit(quota)
        public = pool.submit(address)

    rows: list[Row] = []
    found = _result(pulumi, lambda e: _unknown("Pulumi CLI", e))
    url: str | None = None
    if isinstance(found, Row):
        rows.append(found)
    else:
        cli, backend, url = pulumi_rows(found)
        rows += [cli, backend, passphrase_row(url, secrets, os.environ)]
    probe = _result(adc, lambda e: _unknown("credentials (ADC)", e))
    credentials = probe if isinstance(probe, Row) else adc_row(probe)
    rows.append(credentials)
    about_project: list[Row] = _result(project_rows, lambda e: [_unknown("gcp:project", e)])
    rows += about_project
    q = _result(quota_row, lambda e: _unknown("GPU quota", e))
    rows += [q] if q is not None else []
    if spec is not None and secrets is not None and not vertex:
        rows.append(ssh_key_row(spec, secrets))
        rows.append(source_ranges_row(spec, _result(public, lambda e: None)))
        if reconciler:
            rows.append(reconcile_state_row(spec, url, secrets))
    if vertex:
        from scripts.targets.vertex.preflight import AIPLATFORM, aiplatform_problem

        problem = aiplatform_problem()
        rows.append(
            Row("Vertex AI client", "fail", problem, "upgrade it in this environment")
            if problem
            else Row("Vertex AI client", "ok", f"{AIPLATFORM} can send the job")
        )
    if spec is not None and spec.datasets:
        from scripts.doctor.data import data_rows

        unknown = spec.on_vertex or (spec.scratch.present and spec.scratch.gib is None)
        room = None if unknown else (spec.scratch.gib or spec.boot_disk_gb)
        rows += data_rows(spec.datasets, room_gib=room)
    if spec is not None and spec.billing_export:
        from scripts.cost.billing import billing_row

        rows.append(
            billing_row(spec.billing_export)
            if credentials.status == "ok"
            else Row(  # BigQuery would retry for minutes what cannot work
                "billing export",
                "unknown",
                "not checked: the credentials are not usable",
                "fix the credentials (ADC) row first",
            )
        )
    title = f"doctor: stack {stack}" if stack else "doctor (no --stack: this machine only)"
    return DoctorReport(title, tuple(rows))


def require_doctor(stack_file: StackFile, clients: StackClients, spec: ClusterSpec) -> None:
    """Before `up`/`run` create anything: the doctor's table for the stack, shown; DoctorFailed
    when a row fails."""
    report = run_doctor(stack_file, clients, spec)
    report.show()
    report.require_ok("doctor")


T = TypeVar("T")
U = TypeVar("U")


def _result(future: Future[T], instead: Callable[[BaseException], U]) -> T | U:
    """A probe's result; a probe that crashed (a bug, a missing module) becomes `instead`."""
    try:
        return future.result()
    except Exception as e:
        return instead(e)


def _unknown(check: str, e: BaseException) -> Row:
    return Row(check, "unknown", f"could not check: {type(e).__name__}: {e}")


#: Pulumi.yaml's typed config schema needs CLI 3.44 (see shared/reference/pulumi-offline-testing).
MIN_PULUMI = (3, 44, 0)
PULUMI_INSTALLER = "curl -fsSL https://get.pulumi.com | sh (pulumi.com/docs/install)"
INSTALL_PULUMI = f"install it: {PULUMI_INSTALLER}"
REINSTALL_PULUMI = f"reinstall it: {PULUMI_INSTALLER}"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
PASSPHRASE, PASSPHRASE_FILE = "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE"


#: The backends Pulumi documents for `pulumi login` and PULUMI_BACKEND_URL: a directory or an object
#: store (pulumi.com/docs/iac/operations/stack-management/using-a-diy-backend/), else a Pulumi
#: Cloud, whose URL Pulumi speaks REST to (pulumi.com/docs/iac/cli/commands/pulumi_login/).
BACKEND_SCHEMES = ("file", "gs", "s3", "azblob", "https", "http")
BACKENDS = (
    "file://DIR, gs://BUCKET, s3://BUCKET, azblob://CONTAINER, https://api.pulumi.com or "
    "another Pulumi Cloud's URL"
)


@dataclass(frozen=True)
class PulumiProbe:
    path: str | None  # the `pulumi` found on PATH
    version: str = ""  # `pulumi version`'s output
    version_error: str = ""
    whoami: str = ""  # `pulumi whoami --json`'s output
    whoami_error: str = ""
    backend_env: str = ""  # PULUMI_BACKEND_URL: it wins over `pulumi login`
    backend_env_problem: str = ""  # why it cannot hold the state (backend_url_problem)


def backend_url_problem(url: str) -> str | None:
    """Why PULUMI_BACKEND_URL cannot hold the stack's state, or None. A file:// path is read as
    Pulumi reads it (~ the home directory, relative to here, the query its options): Pulumi writes
    DIR/.pulumi there, and makes DIR only with `?create_dir=...`."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in BACKEND_SCHEMES:
        return f"not a Pulumi backend; allowed: {BACKENDS}"
    where, _, query = rest.partition("?")
    if scheme != "file":
        named = where.split("/", 1)[0]
        return None if named else f"names no bucket or host; allowed: {BACKENDS}"
    if where.startswith("~"):
        where = str(Path.home() / where[2:])
    directory = Path(os.path.abspath(where))
    if why := path_problem(directory):
        return f"{directory}: {why}"
    if not directory.exists() and "create_dir=" not in query:
        return f"{directory} does not exist (Pulumi does not make it)"
    if directory.exists() and not directory.is_dir():
        return f"{directory} is not a directory"
    return unmakeable(directory / ".pulumi")


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
    chosen = os.environ.get(BACKEND_ENV, "")
    problem = (backend_url_problem(chosen) or "") if chosen else ""  # "": Pulumi ignores it
    env = {"backend_env": chosen, "backend_env_problem": problem}
    path = shutil.which("pulumi")
    if path is None:
        return PulumiProbe(None, **env)
    version, version_error = _run([path, "version"], timeout_s)
    if version_error:  # a CLI that cannot say its version will not say who is logged in
        return PulumiProbe(path, version, version_error, **env)
    whoami, whoami_error = _run([path, "whoami", "--json", "--non-interactive"], timeout_s)
    return PulumiProbe(path, version, version_error, whoami, whoami_error, **env)


def pulumi_rows(p: PulumiProbe) -> tuple[Row, Row, str | None]:
    """The CLI row, the backend row, and the backend's URL (None: unknown). A PULUMI_BACKEND_URL
    that cannot work is the backend row's failure, whatever the CLI says."""
    cli, backend, url = _cli_and_login_rows(p)
    if not p.backend_env_problem:
        return cli, backend, url
    shown = redact(p.backend_env) if "@" in p.backend_env else p.backend_env  # a password
    return (
        cli,
        Row(
            backend.check,
            "fail",
            f"{BACKEND_ENV}={shown}: {p.backend_env_problem}",
            f"set {BACKEND_ENV} to a backend this user can write ({BACKENDS}), or unset it",
        ),
        None,
    )


def _cli_and_login_rows(p: PulumiProbe) -> tuple[Row, Row, str | None]:
    cli, backend = "Pulumi CLI", "Pulumi backend"
    need_cli = Row(backend, "unknown", "needs the Pulumi CLI", "fix the Pulumi CLI row first")
    if p.path is None:
        return Row(cli, "fail", "`pulumi` is not on PATH", INSTALL_PULUMI), need_cli, None
    if p.version_error:  # present but not working: every stack command would fail
        return Row(cli, "fail", f"{p.path}: {p.version_error}", REINSTALL_PULUMI), need_cli, None
    m = re.search(r"v?(\d+)\.(\d+)\.(\d+)", p.version)
    if not m:
        return (
            Row(cli, "fail", f"{p.path}: unrecognised version {p.version!r}", REINSTALL_PULUMI),
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
            f"upgrade it: {PULUMI_INSTALLER}",
        )
    else:
        row = Row(cli, "ok", f"{p.version} at {p.path}")
    if p.whoami_error:
        login = (
            "pulumi login --local (state in ~/.pulumi on this machine), or pulumi login "
            "(Pulumi Cloud)"
        )
        if p.backend_env:  # a login does not change the backend the variable names
            login = (
                f"{BACKEND_ENV} chooses the backend, not `pulumi login`: fix its access or unset it"
            )
        return row, Row(backend, "fail", f"not logged in: {p.whoami_error}", login), None
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
    outcome: Literal["ok", "missing", "bad_key_file", "refused", "unreachable"]
    detail: str


def probe_adc(timeout_s: float = 15.0) -> AdcProbe:
    """Application Default Credentials found (google.auth.default) and accepted by Google's token
    endpoint (one refresh)."""
    import google.auth
    from google.auth import exceptions
    from google.auth.transport.requests import Request

    from infra.gcp.api import key_file_problem

    try:
        creds, _ = google.auth.default(scopes=[CLOUD_PLATFORM])
    except (exceptions.DefaultCredentialsError, OSError) as e:  # OSError: a directory named
        problem = key_file_problem()
        if problem is not None:
            return AdcProbe("bad_key_file", problem)
        return AdcProbe("missing", str(e.args[0] if e.args else e).split(". ")[0])
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
    from infra.gcp.api import KEY_FILE_FIX

    name = "credentials (ADC)"
    login = "gcloud auth application-default login"
    if p.outcome == "ok":
        return Row(name, "ok", p.detail)
    if p.outcome == "missing":
        return Row(name, "fail", p.detail, f"{login} (or GOOGLE_APPLICATION_CREDENTIALS=KEY.json)")
    if p.outcome == "bad_key_file":  # it wins over a login: the fix is the variable
        return Row(name, "fail", p.detail, KEY_FILE_FIX)
    if p.outcome == "refused":
        return Row(
            name,
            "fail",
            p.detail,
            f"renew them: {login}, or a service-account key that is not deleted",
        )
    return Row(name, "unknown", p.detail, "check the network or proxy, then run the doctor again")


PUBLIC_ADDRESS_URL = "https://api.ipify.org"  # answers this machine's public IPv4 address
PUBLIC_ADDRESS_ENV = "GPUTRAIN_PUBLIC_IP"  # set it to skip the lookup (offline, or a proxy)


def lookup_public_address(timeout_s: float = 3.0) -> str | None:
    """This machine's public IPv4 address as the internet sees it, or None when it cannot tell."""
    text = os.environ.get(PUBLIC_ADDRESS_ENV, "")
    if not text:
        try:
            with urllib.request.urlopen(PUBLIC_ADDRESS_URL, timeout=timeout_s) as answer:
                text = answer.read(64).decode("ascii", "replace")
        except (OSError, ValueError):
            return None
    try:
        return str(ipaddress.IPv4Address(text.strip()))
    except ValueError:
        return None


def ssh_key_row(spec: ClusterSpec, secrets: StackSecrets) -> Row:
    name, keygen = "SSH key", f"gputrain keygen --stack {spec.stack}"
    if not spec.ssh_public_key:
        return Row(name, "fail", "gputrain:sshPublicKey is not set", keygen)
    if "gputrain:sshPrivateKey" not in secrets.secure_keys:
        return Row(
            name,
            "fail",
            f"the public key is set, but Pulumi.{spec.stack}.yaml has no gputrain:sshPrivateKey "
            "secret to log in with",
            f"{keygen} --force",
        )
    kind, blob = parse_public_key(spec.ssh_public_key)
    return Row(name, "ok", f"{kind} {fingerprint(blob)}; the private key is a stack secret")


def source_ranges_row(spec: ClusterSpec, address: str | None) -> Row:
    """`address` is this machine's public address (None: unknown)."""
    name, ranges = "sshSourceRanges", list(spec.ssh_source_ranges)
    index = len(ranges)
    here = f"{address}/32" if address else '"$(curl -s https://api.ipify.org)/32"'
    add = (
        f"pulumi config set --path 'gputrain:sshSourceRanges[{index}]' {here} --stack {spec.stack}"
    )
    if not ranges:
        return Row(name, "fail", "empty: nobody could reach the head over SSH", add)
    listed = ", ".join(ranges)
    if whole_internet(ranges):
        return Row(name, "warn", f"{listed}: SSH is open to anyone (allowSshFromAnywhere)")
    if address is None:
        return Row(
            name,
            "unknown",
            f"{listed}; this machine's public address could not be looked up",
            f"make sure it holds this machine's address (or set {PUBLIC_ADDRESS_ENV})",
        )
    ip = ipaddress.IPv4Address(address)
    inside = next((r for r in ranges if ip in ipaddress.IPv4Network(r, strict=False)), None)
    if inside:
        return Row(name, "ok", f"this machine ({address}) is in {inside}")
    return Row(name, "fail", f"this machine ({address}) is not in {listed}", add)


def reconcile_state_row(spec: ClusterSpec, backend: str | None, secrets: StackSecrets) -> Row:
    """Laptop-closed recovery runs `pulumi refresh/up` in a Cloud Run job: the stack's state must
    be in a `gs://` backend and its secrets under a cloud KMS provider the job's account can
    use (a local backend or a passphrase stays on this machine). Asked only where `recover` is
    on."""
    name = "reconcile job's state"
    fix = (
        f"pulumi login gs://BUCKET and `pulumi stack change-secrets-provider --stack {spec.stack} "
        "gcpkms://projects/P/locations/L/keyRings/R/cryptoKeys/K`, or recover: never"
    )
    if backend is None:
        return Row(name, "unknown", "the Pulumi backend is unknown (see the row above)", fix)
    if not backend.startswith("gs://"):
        return Row(
            name, "fail", f"the state is in {backend}, which the Cloud Run job cannot read", fix
        )
    if not (secrets.provider or "").startswith("gcpkms://"):
        return Row(
            name,
            "fail",
            f"the stack's secrets use {secrets.provider or 'a passphrase'}, which the job lacks",
            fix,
        )
    return Row(name, "ok", f"state in {backend}, secrets under gcpkms://")
