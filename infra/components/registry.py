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
from infra.stackfile import service_account_id

COMPONENT_TYPE = "gputrain:infra:ImageRegistry"
READER_TYPE = "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"
READER_ROLE = "roles/artifactregistry.reader"
#: Cloud Build runs as the stack's own account (not the project's default one, which secure-by-
#: default organizations leave without Editor), so that account pushes the image it builds
WRITER_ROLE = "roles/artifactregistry.writer"


def component_name(stack: str) -> str:
    return f"{stack}-registry"


def target_urns(
    spec: ClusterSpec, *, with_bucket: bool, pulumi_project: str = "gputrain"
) -> tuple[str, ...]:
    """What a targeted `pulumi up` creates before an image is pushed: the repository (and its
    component); `with_bucket` (Cloud Build): also the stack's own bucket, with the components
    above it (the build's source goes there), and what the build runs as: the stack's service
    account, its log writer role, its access to the bucket and its writer grant on the
    repository. `**` is Pulumi's target wildcard: a URN carries its parents' types."""
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
    if with_bucket and spec.bucket_name:
        account = service_account_id(spec.stack)
        top = "gputrain:infra:VertexStack" if spec.on_vertex else "gputrain:infra:GpuCluster"
        urns += [
            f"{prefix}{top}::{spec.stack}",
            f"{prefix}**gputrain:infra:NodeIdentity::{spec.stack}-identity",
            f"{prefix}**$gcp:serviceaccount/account:Account::{account}",
            f"{prefix}**$gcp:projects/iAMMember:IAMMember::{account}-logwriter",
            f"{prefix}**gputrain:infra:StackBucket::{spec.stack}-bucket",
            f"{prefix}**$gcp:storage/bucketIAMMember:BucketIAMMember::{spec.bucket_name}-nodes",
            f"{prefix}**${READER_TYPE}::{repository_id(spec.stack)}-builder",
        ]
    return tuple(dict.fromkeys(urns))


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

    def grant_writer(
        self, member: pulumi.Input[str], opts: pulumi.ResourceOptions
    ) -> gcp.artifactregistry.RepositoryIamMember:
        """roles/artifactregistry.writer for `member` on this repository only: Cloud Build,
        running as the stack's account, pushes the image there."""
        return gcp.artifactregistry.RepositoryIamMember(
            f"{repository_id(self.stack)}-builder",
            project=self.project,
            location=self.region,
            repository=self.repository.repository_id,
            role=WRITER_ROLE,
            member=member,
            opts=opts,
        )

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
