"""A node that runs the job's image: docker and (on GPU nodes) the NVIDIA container toolkit
present — installed from apt on the stack's own VMs, only named on machines that are the user's
(`--hosts`: not ours to change) — the digest pulled once, and nvidia-smi inside the image seeing
the node's GPUs. The commands are pure text; `ensure_image` runs them on every node.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from infra.base.records import Fleet
from scripts import ui
from scripts.job.container import ImageRef, build_image_gpu_command, build_pull_command
from scripts.job.environment import EnvironmentSetupError
from scripts.parallel import parallel
from scripts.transport.base import Transport

DOCKER_PACKAGE = "docker.io"  # Debian's and Ubuntu's docker engine + CLI
TOOLKIT_PACKAGE = "nvidia-container-toolkit"
#: NVIDIA's apt repository for the toolkit (its install guide), added only where apt has no
#: candidate for the package (GCE's GPU images often carry it already).
TOOLKIT_KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
TOOLKIT_LIST_URL = (
    "https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list"
)
TOOLKIT_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
INSTALL_TIMEOUT_S = 1200.0


def build_node_check_command(gpus: bool) -> str:
    """Prints what the node lacks to run containers (`missing: docker`, `missing:
    nvidia-container-toolkit`) and exits 1, or prints `ok`."""
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


def parse_missing(output: str) -> tuple[str, ...]:
    """`missing: docker nvidia-container-toolkit` -> ("docker", "nvidia-container-toolkit")."""
    for line in output.splitlines():
        if line.startswith("missing:"):
            return tuple(line[len("missing:") :].split())
    return ()


def build_container_install_command(missing: tuple[str, ...]) -> str:
    """Install what build_node_check_command found missing, as root (sudo -n unless the login is
    root), printing `gputrain-install: STEP` progress lines: docker.io from the distribution (the
    login user added to the docker group, and given the socket now: a group joins at the next
    login), the toolkit from NVIDIA's repository (added when apt has no candidate) configured as
    docker's runtime. Exits non-zero after the failing step's last lines."""
    if not missing:
        raise ValueError("nothing to install")
    steps = [
        'SUDO="sudo -n"; [ "$(id -u)" = 0 ] && SUDO=',
        "export DEBIAN_FRONTEND=noninteractive",
        'say() { echo "gputrain-install: $*"; }',
        'step() { what=$1; shift; out=$("$@" 2>&1) || { say "failed: $what"; '
        'printf "%s\\n" "$out" | tail -n 3; exit 1; }; }',
        "apt_get() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 "
        '-y -qq "$@"; }',
        'say "apt-get update"',
        'step "apt-get update" apt_get update',
    ]
    if "docker" in missing:
        steps += [
            f'say "installing {DOCKER_PACKAGE}"',
            f'step "apt-get install {DOCKER_PACKAGE}" apt_get install --no-install-recommends '
            f"{DOCKER_PACKAGE} acl",
            'U=$(id -un); [ "$U" = root ] || { $SUDO usermod -aG docker "$U"; '
            '$SUDO setfacl -m "u:$U:rw" /var/run/docker.sock 2>/dev/null || true; }',
        ]
    if "nvidia-container-toolkit" in missing:
        keyring = shlex.quote(TOOLKIT_KEYRING)
        steps += [
            f"add_repo() {{ curl -fsSL {TOOLKIT_KEY_URL} | $SUDO gpg --batch --yes --dearmor "
            f"-o {keyring} && curl -fsSL {TOOLKIT_LIST_URL} | sed 's#deb https://#deb "
            f"[signed-by={TOOLKIT_KEYRING}] https://#g' | $SUDO tee "
            "/etc/apt/sources.list.d/nvidia-container-toolkit.list >/dev/null && apt_get update; }",
            f"if ! apt-cache policy {TOOLKIT_PACKAGE} 2>/dev/null | grep -q 'Candidate: [0-9]'; "
            'then say "adding NVIDIA\'s apt repository"; '
            'step "adding NVIDIA\'s repository" add_repo; fi',
            f'say "installing {TOOLKIT_PACKAGE}"',
            f'step "apt-get install {TOOLKIT_PACKAGE}" apt_get install {TOOLKIT_PACKAGE}',
            'step "nvidia-ctk runtime configure" $SUDO nvidia-ctk runtime configure --runtime=docker',
            "$SUDO systemctl restart docker >/dev/null 2>&1 || true",
        ]
    steps.append('say "done"')
    return "\n".join(steps) + "\n"


def ensure_image(
    fleet: Fleet, transports: Mapping[str, Transport], image: ImageRef, *, verify: bool = False
) -> None:
    """Every node can run containers (docker, and the NVIDIA container toolkit where it has GPUs:
    installed on the stack's own VMs, named elsewhere) and holds the image's digest, pulled once;
    on GPU nodes nvidia-smi inside the image sees the expected GPUs. A node that fails is named
    with what it lacks. `verify`: the line says so (`gputrain verify`)."""
    gpus = not fleet.expect.is_cpu
    check = build_node_check_command(gpus=gpus)
    pull = build_pull_command(image)
    label = f"{image.repository}:{image.tag}"

    def one(name: str) -> str:
        t = transports[name]
        r = t.run(check, 60)
        missing = parse_missing(r.stdout)
        if not r.ok and missing and fleet.install_trainer:  # the stack's own VM: install
            ui.say(f"{name}: {label} needs {' and '.join(missing)}; installing (apt)")

            def progress(line: str) -> None:
                if line.startswith("gputrain-install: "):
                    ui.say(f"[{name}] [install] {line.removeprefix('gputrain-install: ')}")
                else:
                    lines.append(line)

            lines: list[str] = []
            rc = t.stream(build_container_install_command(missing), progress, INSTALL_TIMEOUT_S)
            if rc != 0:
                raise EnvironmentSetupError(
                    f"node {name}: the VM image lacks {' and '.join(missing)} and installing "
                    f"them failed: {' | '.join(lines[-3:]) or f'exit {rc}'}; use a VM image "
                    "with docker and the NVIDIA container toolkit, or run without --image"
                )
            r = t.run(check, 60)
        if not r.ok:
            raise EnvironmentSetupError(
                f"node {name}: cannot run the image {label}: "
                f"{r.stdout.strip() or r.stderr.strip()} (install docker and the NVIDIA "
                "container toolkit, or run without --image)"
            )
        r = t.run(pull, 1800)
        if not r.ok:
            last = " | ".join((r.stdout + r.stderr).strip().splitlines()[-3:])
            raise EnvironmentSetupError(
                f"node {name}: cannot pull {image.pinned}: {last or f'exit {r.exit_code}'}"
            )
        if not gpus:
            return r.stdout.strip()
        seen = t.run(build_image_gpu_command(image), 300)
        found = [ln for ln in seen.stdout.splitlines() if ln.strip()]
        if not seen.ok or len(found) != fleet.expect.count:
            raise EnvironmentSetupError(
                f"node {name}: nvidia-smi inside {label} sees "
                f"{len(found) if seen.ok else 'no'} GPU(s), expected {fleet.expect.count}: "
                + " | ".join(seen.stdout.strip().splitlines()[-2:])
            )
        return f"{r.stdout.strip()}, {len(found)} GPU(s) inside"

    names = [n.name for n in fleet.nodes]
    results, errors = parallel(names, one)
    if errors:
        first = next(n for n in names if n in errors)
        raise errors[first]
    what = "verified" if verify else "on"
    ui.say(
        f"image {label} ({image.digest}) {what} {len(names)} node(s): "
        + ", ".join(f"{n} {results[n]}" for n in names)
    )
