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

from gputrain_node import contract
from infra.base.errors import UserError
from infra.datasets import DATA_DIR_ENV
from scripts.node_layout import NODE_STATE

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
#: distribution/reference's grammar (reference.go): domain-component :=
#: /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/, joined by dots, then an optional port
_DOMAIN = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_REGISTRY = rf"{_DOMAIN}(?:\.{_DOMAIN})*(?::[0-9]+)?"
_REF = re.compile(
    rf"^(?P<registry>{_REGISTRY})/(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
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
    except (urllib.error.URLError, OSError, UnicodeError) as e:  # UnicodeError: a label over 63
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
        f"docker run --rm --network none --gpus all {shlex.quote(ref.pinned)} nvidia-smi "
        "--query-gpu=name,memory.total --format=csv,noheader 2>&1"
    )


def build_docker_run(
    ref: ImageRef,
    *,
    name: str,
    gpus: bool,
    env_names: Sequence[str],
    env_dir: str | None = None,
    data_names: Sequence[str] = (),
    fabric: str = "none",
    docker: str = "docker",
) -> str:
    """Shell text that runs what follows it inside the image: as the node's user (what it writes
    into the mounted run directory stays the SSH user's; HOME is the container's /tmp), host
    network and IPC (NCCL, the c10d store; host IPC also gives the ranks the node's whole
    /dev/shm, so no --shm-size, which docker ignores and podman refuses with it), the run's
    directory (`$RUN`) mounted at the same path with the code snapshot as working directory, GPUs
    when the node has them, the environment passed by name (`-e NAME`: values never in argv).
    `env_dir`: the job's environment (requirements, setup; built inside this image), mounted
    read-only at its path under the node state (`.gputrain/envs/KEY`). `data_names`: the
    datasets' variables (run.sh exports them), passed in, and their directory mounted read-only
    at the same path. `fabric`: the GPU network's devices and libraries (fabric_args), its NCCL
    env sourced inside."""
    q = shlex.quote
    env_mount = []
    if env_dir is not None:  # $RUN is NODE_STATE/runs/ID: the state dir is ${RUN%/runs/*}
        path = f'"${{RUN%/runs/*}}"/{q(env_dir.removeprefix(NODE_STATE + "/"))}'
        env_mount = [f"-v {path}:{path}:ro"]
    if data_names:  # the data dir may be a link to local SSD: docker mounts what it points to
        env_mount.append(f'-v "${DATA_DIR_ENV}:${DATA_DIR_ENV}:ro"')
    parts = [
        docker, "run", "--rm", "--name", q(name), "--network", "host", "--ipc", "host",
        '--user "$(id -u):$(id -g)"', "-e HOME=/tmp",
        *(["--gpus", "all"] if gpus else []),
        *fabric_args(fabric),
        '-v "$RUN:$RUN"', *env_mount, '-w "$RUN/code"',
        *(f"-e {q(n)}" for n in [*env_names, *data_names]),
        q(ref.pinned),
        *(nccl_entry() if fabric != "none" else []),
    ]  # fmt: skip
    return " ".join(parts)


#: Where the node's NCCL env file (fabric setup) appears inside the container.
NCCL_ENV_IN_CONTAINER = "/run/gputrain/nccl.env"
RDMA_DEVICES = "/dev/infiniband"  # A3 Ultra / A4: the RDMA NICs' verbs devices
RDMA_LIBS = "/usr/local/gib"  # the gIB NCCL plugin (lib64) and its env script
TCPXO_LIBS = "/var/lib/tcpxo/lib64"  # A3 Mega: the FasTrak plugin and NCCL it installs
APERTURE_DEVICES = "/dev/aperture_devices"  # A3 Mega: the GPU NICs' PCI BARs (udev bind mounts)


def fabric_args(kind: str) -> list[str]:
    """`docker run` arguments that give the container a GPU network the fabric setup prepared
    on the host: the NCCL env file (run.sh sets $NCCL_ENV_FILE, /dev/null when there is none),
    RDMA devices plus unlimited locked memory (gIB), or the aperture devices (TCPXO, mounted as
    dstack does: bind-mounted PCI resource files, not device nodes); the plugin's libraries
    read-only at the paths the env file puts on LD_LIBRARY_PATH."""
    if kind == "none":
        return []
    env = f'-v "$NCCL_ENV_FILE:{NCCL_ENV_IN_CONTAINER}:ro"'
    if kind == "rdma":
        return [
            env, f"--device {RDMA_DEVICES}", "--ulimit memlock=-1", "--cap-add IPC_LOCK",
            f"-v {RDMA_LIBS}:{RDMA_LIBS}:ro",
        ]  # fmt: skip
    if kind == "tcpxo":
        return [
            env,
            f"-v {APERTURE_DEVICES}:{APERTURE_DEVICES}",
            f"-v {TCPXO_LIBS}:{TCPXO_LIBS}:ro",
        ]
    raise ValueError(f"fabric kind {kind!r}")


def nccl_entry() -> list[str]:
    """What precedes the command inside the container: the NCCL env file sourced there (its
    LD_LIBRARY_PATH goes before the image's own, its NICs replace the host's guess)."""
    code = f'. {NCCL_ENV_IN_CONTAINER}; exec "$@"'
    return ["sh", "-c", shlex.quote(code), "gputrain-nccl"]


def build_in_image_command(
    ref: ImageRef, script: str, *, name: str, gpus: bool, env_names: Sequence[str] = ()
) -> str:
    """Run the shell `script` inside the image on a node, as the node user, from the node root
    (its state dir mounted at the same path: the code, the environments, the runs), host network
    (a package index), GPUs when the node has them. The script goes on the container's stdin,
    so values it holds never reach any argv; `env_names` pass on from the calling shell by name
    (`-e NAME`: docker reads the value from its environment). Its exit status is the command's."""
    q = shlex.quote
    passed = "".join(f"-e {q(n)} " for n in env_names)
    state = f'"$ROOT/{NODE_STATE}"'
    gpu = "--gpus all " if gpus else ""
    return (
        f"ROOT=$(pwd); mkdir -p {state} || exit 1\n"
        f"docker run --rm -i --name {q(name)} --network host "
        f'--user "$(id -u):$(id -g)" -e HOME=/tmp {passed}{gpu}-v {state}:{state} -w "$ROOT" '
        f"{q(ref.pinned)} sh -s <<'GPUTRAIN_IN_IMAGE_EOF'\n{script.rstrip()}\nGPUTRAIN_IN_IMAGE_EOF\n"
    )


def image_key(ref: ImageRef) -> str:
    """What keys an environment built inside the image: its interpreter at this digest."""
    return f"{IMAGE_PYTHON} in {ref.pinned}"


#: The interpreter torchrun starts with inside an image (the image's own, with its torch).
IMAGE_PYTHON = "python3"

#: What run.sh exports for torchrun and the ranks (node_scripts.build_node_command); with an image
#: they enter the container by name.
RUN_ENV_NAMES = (
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "PYTHONUNBUFFERED",
    contract.OUT_ENV,
    contract.RUN_ID_ENV,
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
)


def container_name(run_id: str) -> str:
    return f"gputrain-{run_id}"
