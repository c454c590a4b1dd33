"""ImageRegistry: the stack's Docker repository in Artifact Registry, for `build:` (one per stack,
in its region, labelled like its other resources, deleted with it), and the one grant that lets
the nodes' / jobs' service account pull from it: reader on THAT repository, nothing project-wide.

It is a top-level component (parented to the stack, not to the cluster), so the controller can
create it alone with a targeted `pulumi up` before the image is pushed and before any GPU
exists: `target_urns` names exactly what that update creates.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.components import cluster_labels
from infra.image_build import REPOSITORY_TYPE, repository_id
from infra.spec import ClusterSpec

COMPONENT_TYPE = "gputrain:infra:ImageRegistry"
READER_TYPE = "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"
READER_ROLE = "roles/artifactregistry.reader"


def component_name(stack: str) -> str:
    return f"{stack}-registry"


def target_urns(
    spec: ClusterSpec, *, with_bucket: bool, pulumi_project: str = "gputrain"
) -> tuple[str, ...]:
    """What a targeted `pulumi up` creates before an image is pushed: the repository (and its
    component); `with_bucket`: also the stack's own bucket, with the components above it (Cloud
    Build's source goes there). `**` is Pulumi's target wildcard: the bucket's URN carries its
    parents' types."""
    prefix = f"urn:pulumi:{spec.stack}::{pulumi_project}::"
    urns = [
        f"{prefix}{COMPONENT_TYPE}::{component_name(spec.stack)}",
        f"{prefix}{COMPONENT_TYPE}${REPOSITORY_TYPE}::{repository_id(spec.stack)}",
    ]
    if with_bucket and spec.existing_bucket is None and spec.bucket_name:
        top = "gputrain:infra:VertexStack" if spec.on_vertex else "gputrain:infra:GpuCluster"
        urns += [
            f"{prefix}{top}::{spec.stack}",
            f"{prefix}**gputrain:infra:StackBucket::{spec.stack}-bucket",
            f"{prefix}**$gcp:storage/bucket:Bucket::{spec.bucket_name}",
        ]
    return tuple(urns)


class ImageRegistry(pulumi.ComponentResource):
    """`repository` the Docker repository; `grant_reader` gives one service account pull rights."""

    def __init__(
        self,
        stack: str,
        project: str,
        region: str,
        labels: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(COMPONENT_TYPE, component_name(stack), None, opts)
        self.stack, self.project, self.region = stack, project, region
        self.repository = gcp.artifactregistry.Repository(
            repository_id(stack),
            repository_id=repository_id(stack),
            project=project,
            location=region,
            format="DOCKER",
            description=f"images gputrain builds for stack {stack} (`build:`)",
            labels=labels,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"repository": self.repository.name})

    def grant_reader(
        self, member: pulumi.Input[str], opts: pulumi.ResourceOptions
    ) -> gcp.artifactregistry.RepositoryIamMember:
        """roles/artifactregistry.reader for `member` on this repository only (declared under
        the caller: a targeted `up` of the repository leaves it for the full one)."""
        return gcp.artifactregistry.RepositoryIamMember(
            f"{repository_id(self.stack)}-reader",
            project=self.project,
            location=self.region,
            repository=self.repository.repository_id,
            role=READER_ROLE,
            member=member,
            opts=opts,
        )


def stack_registry(spec: ClusterSpec) -> ImageRegistry:
    """The stack's repository, in its region, with the stack's labels."""
    assert spec.project is not None  # require_deployable ran
    return ImageRegistry(
        spec.stack, spec.project, spec.region, cluster_labels(spec, pulumi.get_project())
    )
