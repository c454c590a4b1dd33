"""Container images for jobs on GCE VMs and hosts (`image:`): the image reference checked and
resolved to a digest on the controller (a missing image or a refused registry is bad input before
anything is billed), and the node-side shell: docker (+ the NVIDIA container toolkit) present, the
digest pulled once per node, and the `docker run` that torchrun runs inside — host network and IPC,
shared memory, the run's directory mounted at the same path, GPUs, the environment by name only.
Pure text except `resolve_digest` (one registry HTTP call).
"""

from __future__ import annotations

import re
import shlex
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from infra.base.errors import UserError

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REF = re.compile(
    rf"^(?P<registry>[A-Za-z0-9.-]+(?::[0-9]+)?)/(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


class ImageNotFound(UserError):
    """The registry has no such tag (404): bad input for `image:`, a build to run for `build:`."""


@dataclass(frozen=True)
class ImageRef:
    """`REGISTRY/PATH[:TAG][@sha256:...]` (a registry host is required: no implicit Docker Hub)."""

    registry: str
    path: str
    tag: str = "latest"
    digest: str | None = None

    @property
    def repository(self) -> str:
        return f"{self.registry}/{self.path}"

    @property
    def pinned(self) -> str:
        """What the nodes pull and run: the repository at its digest."""
        if self.digest is None:
            raise ValueError("resolve the digest first")
        return f"{self.repository}@{self.digest}"


def parse_image(text: str, setting: str) -> ImageRef:
    m = _REF.match(text.strip())
    if not m or (
        "." not in m["registry"] and ":" not in m["registry"] and m["registry"] != "localhost"
    ):
        raise UserError(
            f"{setting}: {text!r} is not allowed; expected REGISTRY/PATH[:TAG][@sha256:DIGEST], "
            "e.g. us-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG"
        )
    return ImageRef(m["registry"], m["path"], m["tag"] or "latest", m["digest"])


def resolve_digest(
    ref: ImageRef, *, token: str | None = None, insecure: bool = False, timeout: float = 30
) -> ImageRef:
    """The tag's manifest digest from the registry (HEAD /v2/PATH/manifests/TAG); UserError for
    an image that does not exist (404) or a registry that refuses us (401/403)."""
    if ref.digest is not None:
        return ref
    scheme = "http" if insecure else "https"
    url = f"{scheme}://{ref.registry}/v2/{ref.path}/manifests/{ref.tag}"
    req = urllib.request.Request(url, method="HEAD", headers={"Accept": ", ".join(MANIFEST_TYPES)})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    image = f"{ref.repository}:{ref.tag}"
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            digest = answer.headers.get("Docker-Content-Digest", "")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise ImageNotFound(f"image {image}: not found in {ref.registry} (404)") from None
        if e.code in (401, 403):
            raise UserError(
                f"image {image}: {ref.registry} refused access ({e.code}); for Artifact Registry "
                "grant roles/artifactregistry.reader and check your credentials"
            ) from None
        raise UserError(f"image {image}: {ref.registry} answered {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise UserError(f"image {image}: cannot reach {ref.registry} ({e})") from None
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise UserError(f"image {image}: {ref.registry} gave no manifest digest")
    return ImageRef(ref.registry, ref.path, ref.tag, digest)


#: Registries reached over plain HTTP (comma-separated hosts), e.g. a local one in tests.
INSECURE_REGISTRIES_ENV = "GPUTRAIN_INSECURE_REGISTRIES"


def resolve_image(ref: ImageRef) -> ImageRef:
    """`resolve_digest` with this machine's settings: Artifact Registry with the application-
    default credentials' token, plain HTTP for the registries GPUTRAIN_INSECURE_REGISTRIES names."""
    import os

    token = registry_token(ref) if ref.digest is None else None
    insecure = ref.registry in os.environ.get(INSECURE_REGISTRIES_ENV, "").split(",")
    return resolve_digest(ref, token=token, insecure=insecure)


def find_image(ref: ImageRef) -> ImageRef | None:
    """`resolve_image`, or None where the registry has no such tag (or repository) yet."""
    try:
        return resolve_image(ref)
    except ImageNotFound:
        return None


def registry_token(ref: ImageRef) -> str | None:
    """An access token for Artifact Registry (the application-default credentials'); None for
    other registries."""
    token = None
    if ref.registry.endswith("-docker.pkg.dev"):
        import google.auth
        import google.auth.transport.requests

        try:
            creds, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"]
            )
            creds.refresh(google.auth.transport.requests.Request())
            token = creds.token
        except Exception as e:
            raise UserError(
                f"image {ref.repository}:{ref.tag}: no credentials for {ref.registry} ({e}); run "
                "`gcloud auth application-default login`"
            ) from None
    return token


def build_node_check_command(gpus: bool) -> str:
    """Prints what the node lacks to run containers (`missing: docker`, `missing: nvidia
    container toolkit`) and exits 1, or prints `ok`."""
    toolkit = (
        "if ! command -v nvidia-ctk >/dev/null 2>&1 && ! command -v nvidia-container-cli "
        '>/dev/null 2>&1; then missing="$missing nvidia-container-toolkit"; fi; '
        if gpus
        else ""
    )
    return (
        "missing=''; command -v docker >/dev/null 2>&1 || missing=\"$missing docker\"; "
        f"{toolkit}"
        'if [ -n "$missing" ]; then echo "missing:$missing"; exit 1; fi; echo ok'
    )


def build_pull_command(ref: ImageRef) -> str:
    """Pull the digest unless the node has it already; prints `present` or `pulled`. From
    Artifact Registry with the node service account's token (the metadata server's; on stdin)."""
    image = shlex.quote(ref.pinned)
    login = ""
    if ref.registry.endswith("-docker.pkg.dev"):
        login = (
            "curl -sf -H 'Metadata-Flavor: Google' http://metadata.google.internal/"
            "computeMetadata/v1/instance/service-accounts/default/token 2>/dev/null | "
            'sed -n \'s/.*"access_token": *"\\([^"]*\\)".*/\\1/p\' | docker login -u '
            f"oauth2accesstoken --password-stdin {shlex.quote(ref.registry)} >/dev/null 2>&1; "
        )
    return (
        f"if docker image inspect {image} >/dev/null 2>&1; then echo present; exit 0; fi; {login}"
        f"docker pull -q {image} >/dev/null 2>&1 || {{ docker pull {image} 2>&1 | tail -n 3; "
        "exit 1; }; echo pulled"
    )


def build_image_gpu_command(ref: ImageRef) -> str:
    """The node's GPUs as the image sees them (one CSV line each), for `verify`'s count."""
    return (
        f"docker run --rm --gpus all {shlex.quote(ref.pinned)} nvidia-smi "
        "--query-gpu=name,memory.total --format=csv,noheader 2>&1"
    )


def build_docker_run(
    ref: ImageRef,
    *,
    name: str,
    gpus: bool,
    env_names: Sequence[str],
    docker: str = "docker",
) -> str:
    """Shell text that runs what follows it inside the image: as the node's user (what it writes
    into the mounted run directory stays the SSH user's; HOME is the container's /tmp), host
    network and IPC (NCCL, the c10d store; host IPC also gives the ranks the node's whole
    /dev/shm, so no --shm-size, which docker ignores and podman refuses with it), the run's
    directory (`$RUN`) mounted at the same path with the code snapshot as working directory, GPUs
    when the node has them, the environment passed by name (`-e NAME`: values never in argv)."""
    q = shlex.quote
    parts = [
        docker, "run", "--rm", "--name", q(name), "--network", "host", "--ipc", "host",
        '--user "$(id -u):$(id -g)"', "-e HOME=/tmp",
        *(["--gpus", "all"] if gpus else []),
        '-v "$RUN:$RUN"', '-w "$RUN/code"',
        *(f"-e {q(n)}" for n in env_names),
        q(ref.pinned),
    ]  # fmt: skip
    return " ".join(parts)


#: The interpreter torchrun starts with inside an image (the image's own, with its torch).
IMAGE_PYTHON = "python3"

#: What run.sh exports for torchrun and the ranks (node_scripts.build_node_command); with an image
#: they enter the container by name.
RUN_ENV_NAMES = (
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "PYTHONUNBUFFERED",
    "GPUTRAIN_OUT",
    "GPUTRAIN_RUN_ID",
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
)


def container_name(run_id: str) -> str:
    return f"gputrain-{run_id}"
