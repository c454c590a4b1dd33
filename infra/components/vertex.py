"""VertexStack: what Vertex AI custom jobs of one stack need and nothing else — no VMs, no network.

Vertex starts the replicas itself; the stack holds the API enablement, the service account the
jobs run as (log writes in the project, objectUser on the stack's bucket only, secretAccessor on
each Secret Manager secret of `secrets` only) and the bucket that takes the code package, the
checkpoints and the outputs (the same `StackBucket` as on GCE).
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_gcp as gcp

from infra.components.cluster import shape_exports, stack_bucket, stack_identity
from infra.components.registry import ImageRegistry
from infra.components.secret_access import grant_secret_access
from infra.outputs import Key
from infra.spec import ClusterSpec
from infra.stackfile import SpecError

COMPONENT_TYPE = "gputrain:infra:VertexStack"
VERTEX_API = "aiplatform.googleapis.com"
JOB_ROLES = ("logging.logWriter",)  # the only project role; the bucket grant is per bucket


class VertexStack(pulumi.ComponentResource):
    """The API, the jobs' identity and their bucket; `exports()` is what the controller reads."""

    def __init__(
        self,
        name: str,
        spec: ClusterSpec,
        opts: pulumi.ResourceOptions | None = None,
        *,
        registry: ImageRegistry | None = None,  # `build`: the jobs run the stack's image
    ) -> None:
        if spec.bucket_name is None:
            raise SpecError("gcp:project is not set: it names the stack's bucket")
        super().__init__(COMPONENT_TYPE, name, None, opts)
        self.spec = spec
        child = pulumi.ResourceOptions(parent=self)
        # Left enabled on destroy: other stacks and the user's own jobs may rely on it.
        self.api = gcp.projects.Service(
            f"{spec.stack}-aiplatform",
            project=spec.project,
            service=VERTEX_API,
            disable_on_destroy=False,
            disable_dependent_services=False,
            opts=child,
        )
        self.identity = stack_identity(
            spec, f"gputrain Vertex AI jobs of stack {spec.stack}", child, JOB_ROLES
        )
        self.bucket = stack_bucket(spec, self.identity, child)
        self.secret_access = grant_secret_access(
            spec.stack, spec.project, spec.secret_access, self.identity.member, child
        )
        self.registry_reader = (
            registry.grant_reader(self.identity.member, child) if registry is not None else None
        )
        # Cloud Build (`build:` without a local docker) runs as this account and pushes
        self.registry_builder = (
            registry.grant_writer(self.identity.member, child) if registry is not None else None
        )
        self._exports = self._build_exports()
        self.register_outputs(self._exports)

    def exports(self) -> dict[str, Any]:
        return dict(self._exports)

    def _build_exports(self) -> dict[str, Any]:
        spec = self.spec
        # Jobs can be submitted once the API is on and the account may use the bucket.
        ready = pulumi.Output.all(
            self.api.service,
            self.bucket.node_access.id,
            *[b.id for b in self.identity.role_bindings],
            *([self.registry_reader.id] if self.registry_reader is not None else []),
            *[g.id for g in self.secret_access],
        )
        return {
            **shape_exports(spec, self.bucket),
            Key.BACKEND: "vertex",
            Key.SERVICE_ACCOUNT: pulumi.Output.all(self.identity.email, ready).apply(
                lambda v: v[0]
            ),
            Key.REPLICAS: spec.nodes,  # chief + workers (GCE's `nodes` lists VMs)
            Key.EXECUTOR_IMAGE: spec.executor_image,
        }
