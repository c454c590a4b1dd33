"""`gputrain doctor`: every row's pass, fail and unknown path, against the fake Compute server, the
fake Resource Manager / Service Usage / OAuth token server and a fake `pulumi` on PATH; then `up`
running the same checks first and stopping with the whole table."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.permissions import (
    all_permissions,
    required_permissions,
    resource_types,
    role_for,
    roles_for,
)
from infra.stackfile import read_stack_file
from scripts.cli import main
from scripts.doctor.project import CORE_APIS, VERTEX_APIS, ProjectCheck, project_rows
from scripts.doctor.row import Row
from scripts.doctor.run import DoctorReport, run_doctor
from scripts.settings import Settings
from scripts.targets.gce.clients import GceClients
from scripts.targets.gce.keys import generate_ssh_keypair
from tests.support import ROOT
from tests.support.fake_compute import FakeCompute
from tests.support.fake_gcp_admin import (
    NOT_LOGGED_IN,
    SERVICE_ACCOUNT,
    FakeGcpAdmin,
    install_fake_pulumi,
    ready_for_doctor,
)
from tests.support.fake_stack import FakeStackRunner
from tests.support.trainer_helpers import free_port

# the lab stack: one node (no placement policy), its own network
NEEDED = len(required_permissions(resource_types(own_network=True, placement=False)))
_, PUBLIC_KEY = generate_ssh_keypair("doctor-test")
STACK = {
    "encryptionsalt": "v1:c2FsdHNhbHQ=:v1:Pf0RbG8aQ0Qm+n5q:2mk4aZ9aRHbHmWcXnkjNe8cDuq0Vxw==",
    "gcp:project": "gputrain-test",
    "gputrain:machineType": "g2-standard-8",
    "gputrain:zones": "[us-central1-a, us-central1-b]",
    "gputrain:sshPublicKey": PUBLIC_KEY,
    "gputrain:sshPrivateKey": "{secure: v1:9c2ZSy0Yq4n5:QXNlY3JldA==}",
    "gputrain:sshSourceRanges": "[203.0.113.0/24]",
}


@dataclass
class World:
    dir: Path
    compute: FakeCompute
    admin: FakeGcpAdmin
    gce: GceClients
    monkeypatch: pytest.MonkeyPatch
    stack: dict[str, str]

    def write_stack(self) -> None:
        top = "".join(f"{k}: {v}\n" for k, v in self.stack.items() if ":" not in k)
        config = "".join(f"  {k}: {v}\n" for k, v in self.stack.items() if ":" in k)
        (self.dir / "Pulumi.lab.yaml").write_text(f"{top}config:\n{config}")

    def report(self) -> DoctorReport:
        self.write_stack()
        return run_doctor(read_stack_file(self.dir, "lab"), self.gce)

    def cli(self, *argv: str) -> int:
        self.write_stack()
        return main(list(argv), Settings(self.dir, self.dir / "runs"), self.gce)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    with FakeCompute() as compute, FakeGcpAdmin() as admin:
        ready_for_doctor(monkeypatch, tmp_path, admin)
        gce = GceClients(
            runner_for=lambda s, r: FakeStackRunner(stack_name=s, compute=compute),
            compute_endpoint=compute.url,
            admin_endpoint=admin.url,
            public_address=lambda: "203.0.113.7",
        )
        yield World(tmp_path, compute, admin, gce, monkeypatch, dict(STACK))


def test_a_ready_machine_passes_every_row_quickly(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    assert world.cli("doctor", "--stack", "lab") == 0
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    report = world.report()
    assert [r.check for r in report.rows] == [
        "Pulumi CLI",
        "Pulumi backend",
        "PULUMI_CONFIG_PASSPHRASE",
        "credentials (ADC)",
        "gcp:project",
        "Compute Engine API",
        "IAM API",
        "Cloud Resource Manager API",
        "Cloud Storage API",
        "IAM permissions",
        "GPU quota",
        "SSH key",
        "sshSourceRanges",
    ]
    assert {r.check: r.status for r in report.rows if r.status != "ok"} == {}
    assert "v3.160.0 at" in report.row("Pulumi CLI").detail
    assert report.row("Pulumi backend").detail == "file://~ as gputrain"
    assert report.row("credentials (ADC)").detail == f"service account {SERVICE_ACCOUNT}"
    assert report.row("gcp:project").detail == "gputrain-test (number 123456789012, ACTIVE)"
    assert f"all {NEEDED} granted (8 resource types of the stack" in (
        report.row("IAM permissions").detail
    )
    assert "PREEMPTIBLE_NVIDIA_L4_GPUS: need 1, free 16" in report.row("GPU quota").detail
    assert "203.0.113.7) is in 203.0.113.0/24" in report.row("sshSourceRanges").detail
    assert "doctor: stack lab" in out and "fail" not in out
    assert world.admin.world.tokens_issued == 2  # the ADC refresh, once per run
    # ~4 s on a quiet machine, up to 11 s beside the test bed's torch; a probe that waited out
    # its own timeout (15 s for ADC, 30 s for the Pulumi CLI) or two in a row would pass 14 s
    assert elapsed < 14, f"doctor took {elapsed:.1f} s against the fakes"


def _closed_token_endpoint(w: World) -> None:
    adc = w.admin.adc_file(w.dir)
    adc.write_text(adc.read_text().replace(w.admin.url, f"http://127.0.0.1:{free_port()}"))


def _no_pulumi(w: World) -> None:
    w.monkeypatch.setenv("PATH", "/usr/bin:/bin")


def _pulumi(**kw: str) -> Callable[[World], object]:
    return lambda w: install_fake_pulumi(w.dir / "bin", **kw)


def _env(name: str, value: str | None) -> Callable[[World], None]:
    def apply(w: World) -> None:
        if value is None:
            w.monkeypatch.delenv(name, raising=False)
        else:
            w.monkeypatch.setenv(name, value)

    return apply


def _stack(**changes: str | None) -> Callable[[World], None]:
    def apply(w: World) -> None:
        for key, value in changes.items():
            key = key.replace("__", ":")
            if value is None:
                w.stack.pop(key, None)
            else:
                w.stack[key] = value

    return apply


def _both(*fs: Callable[[World], object]) -> Callable[[World], None]:
    def apply(w: World) -> None:
        for f in fs:
            f(w)

    return apply


def _key_file(text: str | None) -> Callable[[World], None]:
    """GOOGLE_APPLICATION_CREDENTIALS naming a file holding `text` (None: a directory)."""

    def apply(w: World) -> None:
        path = w.dir / "key.json"
        path.mkdir() if text is None else path.write_text(text)
        w.monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))

    return apply


NO_PASSPHRASE = _env("PULUMI_CONFIG_PASSPHRASE", None)
NO_SECRETS = _stack(encryptionsalt=None, gputrain__sshPrivateKey=None, gputrain__sshPublicKey=None)

# (id, how the world differs, check, status, in the detail, in the fix)
CASES: list[tuple[str, Callable[[World], object], str, str, str, str]] = [
    ("cli missing", _no_pulumi, "Pulumi CLI", "fail", "not on PATH", "get.pulumi.com"),
    ("cli old", _pulumi(version="echo v3.30.1"), "Pulumi CLI", "fail", "older than 3.44.0", "upgrade"),
    ("cli broken", _pulumi(version="echo boom >&2; exit 2"), "Pulumi CLI", "fail", "boom", "reinstall it: curl"),
    ("cli garbage", _pulumi(version="echo hello"), "Pulumi CLI", "fail", "unrecognised version 'hello'", "reinstall it: curl"),
    ("not logged in", _pulumi(whoami=NOT_LOGGED_IN), "Pulumi backend", "fail", "PULUMI_ACCESS_TOKEN must be set", "pulumi login --local"),
    ("backend url nonsense", _env("PULUMI_BACKEND_URL", "nonsense://x"), "Pulumi backend", "fail", "PULUMI_BACKEND_URL=nonsense://x: not a Pulumi backend; allowed: file://DIR, gs://BUCKET, s3://BUCKET, azblob://CONTAINER, https://api.pulumi.com", "or unset it"),
    ("backend url nonsense without cli", _both(_no_pulumi, _env("PULUMI_BACKEND_URL", "nonsense://x")), "Pulumi backend", "fail", "PULUMI_BACKEND_URL=nonsense://x: not a Pulumi backend", "or unset it"),
    ("backend url no bucket", _env("PULUMI_BACKEND_URL", "gs://"), "Pulumi backend", "fail", "PULUMI_BACKEND_URL=gs://: names no bucket", "unset it"),
    ("backend dir missing", _env("PULUMI_BACKEND_URL", "file:///nonexistent/state"), "Pulumi backend", "fail", "PULUMI_BACKEND_URL=file:///nonexistent/state: /nonexistent/state does not exist", "a backend this user can write"),
    ("backend dir unwritable", _env("PULUMI_BACKEND_URL", "file:///proc"), "Pulumi backend", "fail", "PULUMI_BACKEND_URL=file:///proc: ", "a backend this user can write"),
    ("backend url password", _env("PULUMI_BACKEND_URL", "postgres://ana:s3cret@db/state"), "Pulumi backend", "fail", "PULUMI_BACKEND_URL=postgres://db/…: not a Pulumi backend", ""),
    ("backend url fine", _env("PULUMI_BACKEND_URL", "gs://team-state"), "Pulumi backend", "ok", "file://~ as gputrain", ""),
    ("backend url not logged in", _both(_env("PULUMI_BACKEND_URL", "gs://team-state"), _pulumi(whoami=NOT_LOGGED_IN)), "Pulumi backend", "fail", "not logged in", "PULUMI_BACKEND_URL chooses the backend, not `pulumi login`"),
    ("backend needs cli", _no_pulumi, "Pulumi backend", "unknown", "needs the Pulumi CLI", "Pulumi CLI row"),
    ("whoami garbage", _pulumi(whoami="echo hello"), "Pulumi backend", "unknown", "unrecognised", ""),
    ("passphrase missing", NO_PASSPHRASE, "PULUMI_CONFIG_PASSPHRASE", "fail", "holds secrets (gputrain:sshPrivateKey)", "export PULUMI_CONFIG_PASSPHRASE="),
    ("passphrase file", _both(NO_PASSPHRASE, _env("PULUMI_CONFIG_PASSPHRASE_FILE", "/nonexistent/pass")), "PULUMI_CONFIG_PASSPHRASE", "fail", "PULUMI_CONFIG_PASSPHRASE_FILE=/nonexistent/pass cannot be read", "readable file"),
    ("passphrase not yet", _both(NO_PASSPHRASE, NO_SECRETS), "PULUMI_CONFIG_PASSPHRASE", "warn", "once the stack holds a secret", "before `gputrain keygen`"),
    ("pulumi cloud", _both(NO_PASSPHRASE, _pulumi(whoami="""echo '{"user": "ana", "url": "https://api.pulumi.com"}'""")), "PULUMI_CONFIG_PASSPHRASE", "ok", "Pulumi Cloud encrypts", ""),
    ("kms provider", _both(NO_PASSPHRASE, _stack(secretsprovider="gcpkms://projects/p/locations/l/keyRings/r/cryptoKeys/k")), "PULUMI_CONFIG_PASSPHRASE", "ok", "provider is gcpkms://", ""),
    ("passphrase backend unknown", _both(NO_PASSPHRASE, _no_pulumi), "PULUMI_CONFIG_PASSPHRASE", "unknown", "backend, which is unknown", "pulumi login --local"),
    ("adc missing", _env("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json"), "credentials (ADC)", "fail", "GOOGLE_APPLICATION_CREDENTIALS=/nonexistent/adc.json is missing", "unset GOOGLE_APPLICATION_CREDENTIALS"),
    ("adc garbage", _key_file("not json"), "credentials (ADC)", "fail", "key.json is not a key file", "fix the file, or unset GOOGLE_APPLICATION_CREDENTIALS"),
    ("adc directory", _key_file(None), "credentials (ADC)", "fail", "key.json is not a key file", "fix the file, or unset GOOGLE_APPLICATION_CREDENTIALS"),
    ("billing without credentials", _both(_env("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json"), _stack(gputrain__billingExport="billing-proj.billing_export.t")), "billing export", "unknown", "not checked: the credentials are not usable", "credentials (ADC) row"),
    ("adc refused", lambda w: w.admin.adc_file(w.dir, revoked=True), "credentials (ADC)", "fail", "invalid_grant: Invalid JWT Signature", "renew them"),
    ("adc unreachable", _closed_token_endpoint, "credentials (ADC)", "unknown", "token endpoint did not answer", "network"),
    ("project unset", _stack(gcp__project=None), "gcp:project", "fail", "not set", "pulumi config set gcp:project PROJECT_ID --stack lab"),
    ("project invisible", lambda w: setattr(w.admin.world, "visible", False), "gcp:project", "fail", "does not exist, or your credentials cannot see it", "gcloud projects list"),
    ("project deleted", lambda w: setattr(w.admin.world, "state", "DELETE_REQUESTED"), "gcp:project", "fail", "is DELETE_REQUESTED", "gcloud projects undelete"),
    ("project api error", lambda w: w.admin.inject_error(r"^/v3/projects/[^:]+$", 500, "backend error", ""), "gcp:project", "unknown", "500", "retry"),
    ("api disabled", lambda w: w.admin.world.enabled.discard("iam.googleapis.com"), "IAM API", "fail", "iam.googleapis.com is disabled", "gcloud services enable iam.googleapis.com --project gputrain-test"),
    ("service usage off", lambda w: w.admin.world.enabled.discard("serviceusage.googleapis.com"), "IAM API", "unknown", "Service Usage could not tell", "gcloud services enable serviceusage.googleapis.com"),
    ("compute answers", lambda w: w.admin.world.enabled.discard("serviceusage.googleapis.com"), "Compute Engine API", "ok", "the Compute API answers", ""),
    ("compute says off", _both(lambda w: w.admin.world.enabled.discard("serviceusage.googleapis.com"), lambda w: w.compute.inject_error(r"/projects/gputrain-test$", 403, "Compute Engine API has not been used in project", "accessNotConfigured", times=5)), "Compute Engine API", "fail", "accessNotConfigured", "gcloud services enable compute.googleapis.com"),
    ("compute cannot tell", _both(lambda w: w.admin.world.enabled.discard("serviceusage.googleapis.com"), lambda w: w.compute.inject_error(r"/projects/gputrain-test$", 500, "boom", "backendError", times=5)), "Compute Engine API", "unknown", "neither Service Usage", ""),
    ("permissions missing", lambda w: setattr(w.admin.world, "granted", set(all_permissions()) - {"compute.firewalls.create", "iam.serviceAccounts.actAs"}), "IAM permissions", "fail", f"missing 2 of {NEEDED}: compute.firewalls.create, iam.serviceAccounts.actAs", "grant roles/compute.securityAdmin, roles/iam.serviceAccountUser on gputrain-test"),
    ("permissions api error", lambda w: w.admin.inject_error(r":testIamPermissions$", 500, "backend error", ""), "IAM permissions", "unknown", "testIamPermissions failed", "retry"),
    ("rm api off", lambda w: w.admin.world.enabled.discard("cloudresourcemanager.googleapis.com"), "IAM permissions", "unknown", "could not be looked up", ""),
    ("quota short", lambda w: w.compute.set_region_quota("us-central1", "PREEMPTIBLE_NVIDIA_L4_GPUS", 0), "GPU quota", "fail", "need 1, free 0", "request PREEMPTIBLE_NVIDIA_L4_GPUS"),
    ("quota not reported", lambda w: w.compute.remove_region_quota("us-central1", "PREEMPTIBLE_NVIDIA_L4_GPUS"), "GPU quota", "unknown", "not reported in us-central1", "if `up` fails on quota"),
    ("quota api error", lambda w: w.compute.inject_error(r"/regions/", 403, "Required 'compute.regions.get' permission", "forbidden"), "GPU quota", "unknown", "compute.regions.get", "roles/viewer"),
    ("no ssh key", _stack(gputrain__sshPublicKey=None), "SSH key", "fail", "sshPublicKey is not set", "gputrain keygen --stack lab"),
    ("no private key", _stack(gputrain__sshPrivateKey=None), "SSH key", "fail", "no gputrain:sshPrivateKey secret", "gputrain keygen --stack lab --force"),
    ("no ranges", _stack(gputrain__sshSourceRanges=None), "sshSourceRanges", "fail", "empty", "pulumi config set --path 'gputrain:sshSourceRanges[0]'"),
    ("not in ranges", _stack(gputrain__sshSourceRanges="[198.51.100.0/24]"), "sshSourceRanges", "fail", "(203.0.113.7) is not in 198.51.100.0/24", "'gputrain:sshSourceRanges[1]' 203.0.113.7/32 --stack lab"),
    ("address unknown", lambda w: setattr(w.gce, "public_address", lambda: None), "sshSourceRanges", "unknown", "could not be looked up", "GPUTRAIN_PUBLIC_IP"),
    ("open to anyone", _stack(gputrain__sshSourceRanges="[0.0.0.0/0]", gputrain__allowSshFromAnywhere="true"), "sshSourceRanges", "warn", "open to anyone", ""),
    ("open in two halves", _stack(gputrain__sshSourceRanges="[0.0.0.0/1, 128.0.0.0/1]", gputrain__allowSshFromAnywhere="true"), "sshSourceRanges", "warn", "0.0.0.0/1, 128.0.0.0/1: SSH is open to anyone", ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "check", "status", "detail", "fix"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_each_row_fails_or_is_unknown_on_its_own_cause(
    world: World,
    change: Callable[[World], object],
    check: str,
    status: str,
    detail: str,
    fix: str,
) -> None:
    change(world)
    row = world.report().row(check)
    assert (row.status, detail in row.detail, fix in row.fix) == (status, True, True), row


def test_every_stack_needs_storage_and_vertex_stacks_enable_vertex_ai_themselves(
    world: World,
) -> None:
    check = ProjectCheck(
        "gputrain-test", "lab", CORE_APIS + VERTEX_APIS, ("aiplatform.customJobs.create",), "x"
    )

    def rows() -> dict[str, Row]:
        return {r.check: r for r in project_rows(check, world.gce.projects(), world.gce.compute())}

    # the stack's program declares the Vertex AI API: disabled is fine, `up` turns it on
    assert rows()["Vertex AI API"].status == "ok"
    assert "disabled; `up` enables it" in rows()["Vertex AI API"].detail
    assert rows()["Cloud Storage API"].status == "ok"
    world.admin.world.enabled.discard("storage.googleapis.com")  # the bucket needs it: a fail
    row = rows()["Cloud Storage API"]
    assert row.status == "fail" and "gcloud services enable storage.googleapis.com" in row.fix


def test_build_needs_artifact_registry_and_without_docker_cloud_build(world: World) -> None:
    world.stack["gputrain:build"] = "Dockerfile"
    world.monkeypatch.setenv("GPUTRAIN_BUILDER", "podman")  # a local builder: no Cloud Build
    report = world.report()
    row = report.row("Artifact Registry API")
    assert row.status == "fail"  # off in a new project
    assert "gcloud services enable artifactregistry.googleapis.com" in row.fix
    assert "Cloud Build API" not in [r.check for r in report.rows]
    asked = world.admin.world.asked_permissions
    assert "artifactregistry.repositories.create" in asked
    assert "artifactregistry.repositories.uploadArtifacts" in asked
    assert "cloudbuild.builds.create" not in asked

    world.admin.world.enabled |= {"artifactregistry.googleapis.com"}
    world.monkeypatch.setenv("GPUTRAIN_BUILDER", "cloud")  # as where no docker/podman is
    report = world.report()
    assert report.row("Artifact Registry API").status == "ok"
    row = report.row("Cloud Build API")
    assert row.status == "fail" and "cloudbuild.googleapis.com" in row.fix
    types = resource_types(own_network=True, placement=False, build=True)
    every = set(required_permissions(types, builder="cloud"))
    world.admin.world.granted = every - {"cloudbuild.builds.create"}
    row = world.report().row("IAM permissions")
    assert row.status == "fail"
    assert row.detail.startswith(f"missing 1 of {len(every)}: cloudbuild.builds.create")
    assert "roles/cloudbuild.builds.editor" in row.fix
    # the build runs as the stack's account: submitting it needs actAs on that account
    world.admin.world.granted = every - {"iam.serviceAccounts.actAs"}
    row = world.report().row("IAM permissions")
    assert row.status == "fail" and "iam.serviceAccounts.actAs" in row.detail
    assert "roles/iam.serviceAccountUser" in row.fix


def test_without_a_stack_only_this_machine_is_checked(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    assert world.cli("doctor") == 0
    out = capsys.readouterr().out
    assert "doctor (no --stack: this machine only)" in out and "no stack given" in out
    assert "SSH key" not in out


def test_roles_grant_what_is_missing() -> None:
    assert role_for("compute.instances.create") == "roles/compute.instanceAdmin.v1"
    assert role_for("compute.networks.create") == "roles/compute.networkAdmin"
    assert role_for("compute.networks.updatePolicy") == "roles/compute.securityAdmin"
    assert role_for("compute.subnetworks.use") == "roles/compute.instanceAdmin.v1"
    assert role_for("iam.serviceAccounts.actAs") == "roles/iam.serviceAccountUser"
    assert role_for("resourcemanager.projects.setIamPolicy") == (
        "roles/resourcemanager.projectIamAdmin"
    )
    assert roles_for(all_permissions()) == [
        "roles/artifactregistry.admin",  # `build`: the image repository and its reader grant
        "roles/artifactregistry.reader",  # the built image's digest
        "roles/artifactregistry.writer",  # a local build's push
        "roles/cloudkms.admin",  # recover: the reconcile job decrypts the state's secrets
        "roles/cloudscheduler.admin",  # recover: the job's schedule
        "roles/compute.instanceAdmin.v1",
        "roles/compute.networkAdmin",
        "roles/compute.securityAdmin",
        "roles/iam.roleAdmin",  # recover: the job's refresh reads as custom roles
        "roles/iam.serviceAccountAdmin",
        "roles/iam.serviceAccountUser",
        "roles/pubsub.admin",  # billingBudget: the guard's topic, subscription and its reader
        "roles/resourcemanager.projectIamAdmin",
        "roles/run.admin",  # recover: the reconcile job and its invoker grant
        "roles/secretmanager.admin",  # vertex: the jobs' account gets access to its secrets
        "roles/serviceusage.serviceUsageAdmin",  # backend vertex enables the Vertex AI API
        "roles/storage.admin",  # the stack's bucket
        "roles/storage.objectAdmin",  # `down` empties it
    ]


# ---------------------------------------------------------------- up and run check first


def _one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_up_stops_with_the_whole_table_before_anything(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    _no_pulumi(world)
    world.stack.pop("gputrain:sshSourceRanges")
    runner = FakeStackRunner(stack_name="lab", compute=world.compute)
    world.gce.runner_for = lambda s, r: runner
    assert world.cli("up", "--stack", "lab", "--yes") == 2
    captured = capsys.readouterr()
    assert "doctor: stack lab" in captured.out and "get.pulumi.com" in captured.out
    err = _one_line_error(captured.err)
    assert "doctor: 2 problem(s) to fix first: Pulumi CLI, sshSourceRanges" in err
    assert "nothing was created" in err
    assert runner.calls == [] and not world.compute.requests_matching("/instances")


def test_skip_preflight_skips_the_doctor_too(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    _no_pulumi(world)  # the doctor would stop here
    runner = FakeStackRunner(stack_name="lab", compute=world.compute, zones=("us-central1-a",))
    runner.fail_quota("us-central1-a", "PREEMPTIBLE_NVIDIA_L4_GPUS")
    world.gce.runner_for = lambda s, r: runner
    assert world.cli("up", "--stack", "lab", "--yes", "--skip-preflight") == 1
    assert "doctor" not in capsys.readouterr().out
    assert "up" in runner.call_names()  # it went on to `pulumi up`


def test_recovery_asks_for_what_up_declares_for_the_reconcile_job(world: World) -> None:
    """A spot stack whose state a Cloud Run job can reach declares the reconcile job, its
    schedule, custom roles and image repository: `up` needs their APIs and permissions."""
    key = "projects/gputrain-test/locations/global/keyRings/gputrain/cryptoKeys/state"
    world.stack["gputrain:capacity"] = "spot"
    world.stack["secretsprovider"] = f"gcpkms://{key}"
    world.monkeypatch.setenv("PULUMI_BACKEND_URL", "gs://team-pulumi-state")
    world.monkeypatch.setenv("GPUTRAIN_BUILDER", "podman")
    for_the_job = {
        "run.jobs.create",
        "run.jobs.setIamPolicy",
        "cloudscheduler.jobs.create",
        "iam.roles.create",
        "cloudkms.cryptoKeys.setIamPolicy",
        "artifactregistry.repositories.create",  # the job's image
        "artifactregistry.repositories.uploadArtifacts",
    }
    report = world.report()
    assert for_the_job <= world.admin.world.asked_permissions
    for api in ("Cloud Run Admin API", "Cloud Scheduler API"):
        row = report.row(api)
        assert row.status == "fail" and "gcloud services enable" in row.fix  # off in a new project
    world.admin.world.enabled |= {"run.googleapis.com", "cloudscheduler.googleapis.com"}
    world.admin.world.granted = set(world.admin.world.asked_permissions) - {"iam.roles.create"}
    report = world.report()
    assert report.row("Cloud Run Admin API").status == "ok"
    row = report.row("IAM permissions")
    assert row.status == "fail" and "iam.roles.create" in row.detail
    assert "roles/iam.roleAdmin" in row.fix

    world.stack["gputrain:recover"] = "never"  # no job: none of it is asked
    world.admin.world.asked_permissions.clear()
    report = world.report()
    assert not for_the_job & world.admin.world.asked_permissions
    assert "Cloud Scheduler API" not in [r.check for r in report.rows]


def test_a_cli_without_a_version_is_not_asked_who_is_logged_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`whoami` of a CLI whose `version` failed would only wait out another timeout."""
    from scripts.doctor.run import probe_pulumi

    asked = tmp_path / "whoami-ran"
    bin_dir = install_fake_pulumi(
        tmp_path / "bin", version="exit 1", whoami=f"touch {asked}"
    ).parent
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    probe = probe_pulumi(timeout_s=10)
    assert probe.version_error == "exit 1" and not asked.exists()
