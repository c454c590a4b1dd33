"""The doctor's checks of the GCP project: there and visible (Resource Manager), the APIs gputrain
calls enabled (Service Usage; the Compute API's own error reason when that is all there is), the
caller's IAM permissions (testIamPermissions, the list from infra/permissions.py) and the GPU quota
(Compute API). Every error the APIs answer makes its row "unknown", with the fix for its cause."""

from __future__ import annotations

from dataclasses import dataclass

from infra.gcp.api import GoogleApiError
from infra.gcp.compute import ComputeApi
from infra.gcp.project_api import ProjectApi
from infra.permissions import roles_for
from infra.preflight import GLOBAL, check_quota
from scripts.doctor.row import Row

CORE_APIS = (
    ("compute.googleapis.com", "Compute Engine API"),
    ("iam.googleapis.com", "IAM API"),
    ("cloudresourcemanager.googleapis.com", "Cloud Resource Manager API"),
    ("storage.googleapis.com", "Cloud Storage API"),  # every stack has a bucket
)
VERTEX_APIS = (("aiplatform.googleapis.com", "Vertex AI API"),)
#: `build`: the image repository; Cloud Build where no local docker/podman builds.
BUILD_APIS = (("artifactregistry.googleapis.com", "Artifact Registry API"),)
CLOUD_BUILD_APIS = (("cloudbuild.googleapis.com", "Cloud Build API"),)
#: `recover`: the reconcile job and its schedule (the state's KMS key is the user's already)
RECONCILER_APIS = (
    ("run.googleapis.com", "Cloud Run Admin API"),
    ("cloudscheduler.googleapis.com", "Cloud Scheduler API"),
)
#: APIs the stack's own program enables on `up` (backend vertex declares the Vertex AI API).
ENABLED_BY_THE_STACK = frozenset({"aiplatform.googleapis.com"})


@dataclass(frozen=True)
class ProjectCheck:
    """What to ask about the project: the APIs (name, title) and the permissions, with where
    that list comes from (said in the permissions row)."""

    project: str | None
    stack: str | None
    apis: tuple[tuple[str, str], ...]
    permissions: tuple[str, ...]
    permissions_source: str


def _fix_for(e: GoogleApiError, project: str, api: str, role: str = "roles/viewer") -> str:
    """What to do about an API error, by its cause."""
    if e.credentials:
        return "fix the credentials (ADC) row first"
    if e.api_disabled:
        return f"gcloud services enable {api} --project {project}"
    if e.code == 403:
        return f"ask for {role} on {project}, or check this in the Cloud console"
    return "retry in a minute"


def project_rows(check: ProjectCheck, projects: ProjectApi, compute: ComputeApi) -> list[Row]:
    """gcp:project, one row per API, then the permissions row."""
    project = check.project
    if not project:
        where = f" --stack {check.stack}" if check.stack else ""
        need = "pass --stack NAME" if not check.stack else "set gcp:project first"
        rows = [
            Row(
                "gcp:project",
                "fail" if check.stack else "unknown",
                "not set" if check.stack else "no stack given",
                f"pulumi config set gcp:project PROJECT_ID{where}" if check.stack else need,
            )
        ]
        return rows + _unknown_rest(check, f"needs gcp:project ({need})")
    try:
        info = projects.project(project)
    except GoogleApiError as e:
        rm = "cloudresourcemanager.googleapis.com"
        row = Row("gcp:project", "unknown", f"could not look it up: {e}", _fix_for(e, project, rm))
        unknown = Row("IAM permissions", "unknown", "the project could not be looked up")
        return [row, *_api_rows(check, project, projects, compute), unknown]
    if info is None:
        row = Row(
            "gcp:project",
            "fail",
            f"{project} does not exist, or your credentials cannot see it",
            "check the id (gcloud projects list) and that your account has a role on it",
        )
        return [row, *_unknown_rest(check, "needs a project your credentials can see")]
    if info.state != "ACTIVE":
        row = Row(
            "gcp:project",
            "fail",
            f"{project} is {info.state}",
            f"gcloud projects undelete {project}, or set another gcp:project",
        )
        return [row, *_unknown_rest(check, f"{project} is not active")]
    row = Row("gcp:project", "ok", f"{project} (number {info.number}, {info.state})")
    return [row, *_api_rows(check, project, projects, compute), _permissions_row(check, projects)]


def _unknown_rest(check: ProjectCheck, why: str) -> list[Row]:
    rows = [Row(title, "unknown", why) for _, title in check.apis]
    return [*rows, Row("IAM permissions", "unknown", why)]


def _api_rows(
    check: ProjectCheck, project: str, projects: ProjectApi, compute: ComputeApi
) -> list[Row]:
    try:
        states = projects.service_states(project, [name for name, _ in check.apis])
    except GoogleApiError as e:
        fix = _fix_for(
            e, project, "serviceusage.googleapis.com", "roles/serviceusage.serviceUsageViewer"
        )
        rows = [_compute_answers(project, compute, e)] if check.apis[0] == CORE_APIS[0] else []
        for _, title in check.apis[len(rows) :]:
            rows.append(Row(title, "unknown", f"Service Usage could not tell: {e}", fix))
        return rows
    rows = []
    for name, title in check.apis:
        state = states.get(name, "STATE_UNSPECIFIED")
        if state == "ENABLED":
            rows.append(Row(title, "ok", f"{name} is enabled"))
        elif name in ENABLED_BY_THE_STACK:
            rows.append(Row(title, "ok", f"{name} is {state.lower()}; `up` enables it"))
        else:
            rows.append(
                Row(
                    title,
                    "fail",
                    f"{name} is {state.lower()}",
                    f"gcloud services enable {name} --project {project}",
                )
            )
    return rows


def _compute_answers(project: str, compute: ComputeApi, why: GoogleApiError) -> Row:
    """Without Service Usage, the Compute API tells whether it is on by answering (or by its
    accessNotConfigured / SERVICE_DISABLED error reason)."""
    title = CORE_APIS[0][1]
    try:
        compute.project_quotas(project)
    except GoogleApiError as e:
        if e.api_disabled:
            return Row(
                title,
                "fail",
                f"disabled (the Compute API says {e.reason})",
                f"gcloud services enable compute.googleapis.com --project {project}",
            )
        return Row(title, "unknown", f"neither Service Usage ({why}) nor the API ({e}) could tell")
    return Row(title, "ok", "enabled: the Compute API answers (Service Usage could not be asked)")


def _permissions_row(check: ProjectCheck, projects: ProjectApi) -> Row:
    name, project = "IAM permissions", check.project or ""
    needed = list(check.permissions)
    try:
        granted = projects.granted_permissions(project, needed)
    except GoogleApiError as e:
        rm = "cloudresourcemanager.googleapis.com"
        return Row(name, "unknown", f"testIamPermissions failed: {e}", _fix_for(e, project, rm))
    missing = [p for p in needed if p not in granted]
    if not missing:
        return Row(name, "ok", f"all {len(needed)} granted ({check.permissions_source})")
    shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
    return Row(
        name,
        "fail",
        f"missing {len(missing)} of {len(needed)}: {shown}",
        f"grant {', '.join(roles_for(missing))} on {project} (or roles/owner): gcloud projects "
        f"add-iam-policy-binding {project} --member=user:YOU --role=ROLE",
    )


def gpu_quota_row(
    compute: ComputeApi,
    project: str,
    regions: list[str],
    metric: str,
    need: int,
    per_node: int,
    spot: bool,
) -> Row:
    """Enough GPUs in at least one of the stack's regions (the failover tries the zones of each),
    and GPUS_ALL_REGIONS; the full per-zone table is the preflight's, run by `up`."""
    name = "GPU quota"
    try:
        regional = [
            check_quota(
                name,
                r,
                metric,
                need,
                compute.region_quotas(project, r),
                project=project,
                per_node=per_node,
            )
            for r in regions
        ]
        total = check_quota(
            name,
            GLOBAL,
            "GPUS_ALL_REGIONS",
            need,
            compute.project_quotas(project),
            project=project,
            per_node=per_node,
            soft=spot,  # as the preflight: no GPUS_ALL_REGIONS pool is documented for Spot
        )
    except GoogleApiError as e:
        return Row(
            name,
            "unknown",
            f"could not read quotas: {e}",
            _fix_for(e, project, "compute.googleapis.com"),
        )
    best = next((c for c in regional if c.status == "ok"), None) or next(
        (c for c in regional if c.status == "warn"), regional[0]
    )
    worst = min((best, total), key=lambda c: ("fail", "warn", "ok").index(c.status))
    status = "unknown" if worst.status == "warn" and "unknown" in worst.detail else worst.status
    detail = best.detail if worst is best else f"{best.detail}; {total.detail}"
    return Row(name, status, detail, worst.fix)
