"""`gputrain doctor [--stack NAME]`: everything a first `up` on GCP needs, checked at once and
shown in one table with a fix per row, in the order of the checklist in docs/getting-started.md.
`up` and `run` on a stack run it first and stop with the whole table when a row fails.

The probes are independent, so they run in parallel: the Pulumi CLI, the credentials, the
project's APIs and permissions, the GPU quota and the public-address lookup.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from scripts.doctor.report import DoctorReport, Row

if TYPE_CHECKING:
    from infra.spec import ClusterSpec
    from infra.stackfile import StackFile
    from scripts.targets.stack.clients import StackClients


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
    from scripts.doctor import machine, project, settings

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
        return (clients.public_address or settings.lookup_public_address)()

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
        pulumi = pool.submit(machine.probe_pulumi)
        adc = pool.submit(machine.probe_adc)
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
        cli, backend, url = machine.pulumi_rows(found)
        rows += [cli, backend, machine.passphrase_row(url, secrets, os.environ)]
    probe = _result(adc, lambda e: _unknown("credentials (ADC)", e))
    rows.append(probe if isinstance(probe, Row) else machine.adc_row(probe))
    about_project: list[Row] = _result(project_rows, lambda e: [_unknown("gcp:project", e)])
    rows += about_project
    q = _result(quota_row, lambda e: _unknown("GPU quota", e))
    rows += [q] if q is not None else []
    if spec is not None and secrets is not None and not vertex:
        rows.append(settings.ssh_key_row(spec, secrets))
        rows.append(settings.source_ranges_row(spec, _result(public, lambda e: None)))
        if reconciler:
            rows.append(settings.reconcile_state_row(spec, url, secrets))
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

        rows.append(billing_row(spec.billing_export))
    title = f"doctor: stack {stack}" if stack else "doctor (no --stack: this machine only)"
    return DoctorReport(title, tuple(rows))


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
