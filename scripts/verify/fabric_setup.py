"""Node setup for the GPU fabric: idempotent root scripts per fabric, their report, the NCCL env.

Pure: scripts are strings, the report and env are parsed and rendered here; the caller runs
`SETUP_COMMAND` on every node with `setup_script(kind)` on stdin, parses what it prints with
`parse_setup_report`, and writes `nccl_env(kind, report)` to `NCCL_ENV_FILE` (`install_env_command`)
which the launcher sources on every node.

Sources: Google's "Run NCCL on Compute Engine instances" (AI Hypercomputer, 2026-04-06: the
`gpudirect-gib-apt` repository on packages.cloud.google.com, `/usr/local/gib/scripts/set_nccl_env.sh`,
`/usr/local/gib/lib64` on LD_LIBRARY_PATH; no TCPX/TCPXO/RxDM on A3 Ultra/A4); Cluster Toolkit
a3mega blueprint (dmabuf-import-helper from `gpudirect-tcpxo-apt`, udev rule
00-a3-megagpu.rules); slurm-gcp `receive-data-path-manager-mega` (plugin v1.0.17 / RxDM v1.0.23,
`install --install-nccl` into /var/lib/tcpxo/lib64, ready line "Buffer manager initialization
complete"); google/nccl-plugin-gpudirect-tcpxo README (RxDM >= v1.0.18 flags `--num_hops=2
--num_nics=8`); CT a3-megagpu-8g run-nccl-tests.sh (FASTRAK_CTRL_DEV / IFNAME / LLCM overrides).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from infra.base.errors import GputrainError
from infra.fabric import TCPXO_GPU_NICS, FabricKind
from scripts.node_layout import NCCL_ENV_FILE

SETUP_COMMAND = "sudo -n bash -s"  # the script arrives on stdin
MARK = "@@gputrain-fabric"

GIB_APT_LINE = "deb https://packages.cloud.google.com/apt gpudirect-gib-apt main"
GOOGLE_APT_KEY = "https://packages.cloud.google.com/apt/doc/apt-key.gpg"
GIB_ENV_SCRIPT = "/usr/local/gib/scripts/set_nccl_env.sh"
GIB_LIB = "/usr/local/gib/lib64"

AR_TRANSPORT_APT_LINE = (
    "deb http://packages.cloud.google.com/apt apt-transport-artifact-registry-stable main"
)
TCPXO_APT_LINE = "deb [arch=all trusted=yes] ar+https://us-apt.pkg.dev/projects/gce-ai-infra gpudirect-tcpxo-apt main"
TCPXO_REGISTRY = "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo"
TCPXO_PLUGIN_IMAGE = f"{TCPXO_REGISTRY}/nccl-plugin-gpudirecttcpx-dev:v1.0.17"
TCPXO_RXDM_IMAGE = f"{TCPXO_REGISTRY}/tcpgpudmarxd-dev:v1.0.23"
TCPXO_LIB = "/var/lib/tcpxo/lib64"
TCPXO_ENV_SCRIPT = f"{TCPXO_LIB}/nccl-env-profile.sh"
RXDM_CONTAINER = "receive-datapath-manager"
RXDM_READY = "Buffer manager initialization complete"  # CEA's probe says "...completed"
APERTURE_DIR = "/dev/aperture_devices"
UDEV_RULE_FILE = "/etc/udev/rules.d/00-a3-megagpu.rules"
UDEV_RULE = """\
ACTION=="add", SUBSYSTEM=="pci", ATTR{vendor}=="0x1ae0", ATTR{device}=="0x0084", TAG+="systemd", \\
    RUN+="/usr/bin/mkdir --mode=0755 -p /dev/aperture_devices", \\
    RUN+="/usr/bin/systemd-mount --type=none --options=bind --collect %S/%p /dev/aperture_devices/%k", \\
    RUN+="/usr/bin/bash -c '/usr/bin/chmod 0666 /dev/aperture_devices/%k/resource*'"
"""

#: Roles the nodes' service account needs for the setup (TCPXO pulls from Artifact Registry).
NODE_ROLES: dict[FabricKind, tuple[str, ...]] = {
    "none": (),
    "rdma": (),
    "tcpxo": ("artifactregistry.reader",),
}


class FabricSetupError(GputrainError):
    """The fabric setup failed on a node; one line naming the node and what went wrong."""


_PRELUDE = r"""set -Eeuo pipefail
export DEBIAN_FRONTEND=noninteractive PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
fail() { echo "@@gputrain-fabric error $*"; exit 1; }
trap 'rc=$?; fail "$BASH_COMMAND exited $rc (line $LINENO)"' ERR
apt_install() {
  apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "$@" >/dev/null
}
nics() {  # "<pci address> <name> <driver>" for every physical NIC
  for d in /sys/class/net/*; do
    [ -e "$d/device" ] || continue
    printf '%s %s %s\n' "$(basename "$(readlink -f "$d/device")")" "${d##*/}" \
      "$(basename "$(readlink -f "$d/device/driver" 2>/dev/null || echo none)")"
  done | sort
}
report() {  # the NICs by role, then the plugin's own NCCL environment ($1 sources it)
  local primary gvnic="" rdma="" pci name driver
  primary=$(ip -o -4 route show to default | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')
  [ -n "$primary" ] || fail "no default route, so no primary NIC"
  while read -r pci name driver; do
    [ "$name" = "$primary" ] && continue
    case "$driver" in
      gve) gvnic="$gvnic${gvnic:+,}$name" ;;
      mlx5*) rdma="$rdma${rdma:+,}$name" ;;
    esac
  done < <(nics)
  echo "@@gputrain-fabric nics primary=$primary gvnic=$gvnic rdma=$rdma"
  echo "@@gputrain-fabric env-begin"
  env -i PATH=/usr/bin:/bin bash -c "set -a; $1 >/dev/null 2>&1; env" | grep -E '^(NCCL_|LD_LIBRARY_PATH=)' || true
  echo "@@gputrain-fabric env-end"
}
"""

_RDMA = r"""
if ! dpkg-query -W -f='${Status}' nccl-gib 2>/dev/null | grep -q "ok installed" || ! command -v ibv_devices >/dev/null; then
  [ -s /etc/apt/trusted.gpg.d/cloud.google.gpg ] || curl -fsSL "$GOOGLE_APT_KEY" | gpg --dearmor -o /etc/apt/trusted.gpg.d/cloud.google.gpg \
    || fail "adding Google's apt signing key failed"
  echo "$GIB_APT_LINE" > /etc/apt/sources.list.d/nccl-gib.list
  apt_install nccl-gib ibverbs-utils || fail "apt-get install nccl-gib ibverbs-utils failed"
fi
apt-mark hold nccl-gib >/dev/null  # every node must keep the same plugin version
[ -f "$GIB_ENV_SCRIPT" ] || fail "nccl-gib is installed but $GIB_ENV_SCRIPT is missing"
echo "@@gputrain-fabric version nccl-gib=$(dpkg-query -W -f='${Version}' nccl-gib)"
report ". $GIB_ENV_SCRIPT"
echo "@@gputrain-fabric ok"
"""

_TCPXO = r"""
command -v docker >/dev/null || fail "docker is missing (the TCPXO plugin and receive-datapath-manager are containers)"
if ! modinfo import-helper >/dev/null 2>&1; then
  echo "$AR_TRANSPORT_APT_LINE" > /etc/apt/sources.list.d/artifact-registry.list
  apt_install apt-transport-artifact-registry dkms "linux-headers-$(uname -r)" || fail "installing dkms and the Artifact Registry apt transport failed"
  echo "$TCPXO_APT_LINE" > /etc/apt/sources.list.d/gpudirect-tcpxo.list
  apt_install dmabuf-import-helper || fail "apt-get install dmabuf-import-helper failed"
fi
modprobe import-helper || fail "modprobe import-helper failed (dmabuf-import-helper not built for $(uname -r)?)"
[ -e /dev/dmabuf_import_helper ] || fail "/dev/dmabuf_import_helper is missing after modprobe import-helper"
mkdir -p "$(dirname "$UDEV_RULE_FILE")"
printf '%s' "$UDEV_RULE" > "$UDEV_RULE_FILE.new"
if cmp -s "$UDEV_RULE_FILE.new" "$UDEV_RULE_FILE"; then rm -f "$UDEV_RULE_FILE.new"; else
  mv "$UDEV_RULE_FILE.new" "$UDEV_RULE_FILE"
  udevadm control --reload-rules
  udevadm trigger --subsystem-match=pci --action=add
fi
for i in $(seq 60); do [ -n "$(ls -A "$APERTURE_DIR" 2>/dev/null)" ] && break; [ "$i" = 60 ] && fail "$APERTURE_DIR stayed empty for 120 s"; sleep 2; done
gcloud auth configure-docker --quiet "${TCPXO_PLUGIN_IMAGE%%/*}" >/dev/null 2>&1 || true
if [ "$(cat "$TCPXO_LIB/.gputrain-plugin" 2>/dev/null)" != "$TCPXO_PLUGIN_IMAGE" ]; then
  rm -rf "$TCPXO_LIB"
  docker run --rm --name nccl-installer --network=host -v /var/lib:/var/lib "$TCPXO_PLUGIN_IMAGE" install --install-nccl >/dev/null || fail "installing the FasTrak NCCL plugin ($TCPXO_PLUGIN_IMAGE) failed"
  echo "$TCPXO_PLUGIN_IMAGE" > "$TCPXO_LIB/.gputrain-plugin"
fi
[ -f "$TCPXO_ENV_SCRIPT" ] || fail "the plugin installer did not write $TCPXO_ENV_SCRIPT"
if [ "$(docker inspect -f '{{.Config.Image}} {{.State.Running}}' "$RXDM_CONTAINER" 2>/dev/null)" != "$TCPXO_RXDM_IMAGE true" ]; then
  docker rm -f "$RXDM_CONTAINER" >/dev/null 2>&1 || true
  docker run --detach --restart=unless-stopped --name "$RXDM_CONTAINER" --cap-add=NET_ADMIN --network=host \
    --privileged --gpus all --volume /dev/dmabuf_import_helper:/dev/dmabuf_import_helper \
    --env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu "$TCPXO_RXDM_IMAGE" --num_hops=2 --num_nics=8 >/dev/null \
    || fail "starting $RXDM_CONTAINER ($TCPXO_RXDM_IMAGE) failed"
fi
for i in $(seq 90); do
  docker logs "$RXDM_CONTAINER" 2>&1 | grep -q "$RXDM_READY" && break
  [ "$i" = 90 ] && fail "$RXDM_CONTAINER not ready after 180 s: $(docker logs --tail 1 "$RXDM_CONTAINER" 2>&1)"
  sleep 2
done
echo "@@gputrain-fabric version plugin=$TCPXO_PLUGIN_IMAGE rxdm=$TCPXO_RXDM_IMAGE"
report "NCCL_LIB_DIR=$TCPXO_LIB; . $TCPXO_ENV_SCRIPT"
echo "@@gputrain-fabric ok"
"""


def setup_script(kind: FabricKind) -> str:
    """The idempotent root script that readies a node for `kind` (bash, run via SETUP_COMMAND);
    a second run changes nothing. Its last line is `@@gputrain-fabric ok` or `... error WHY`."""
    if kind == "none":
        raise ValueError("no fabric, no setup")
    values: dict[str, str] = (
        {
            "GIB_APT_LINE": GIB_APT_LINE,
            "GOOGLE_APT_KEY": GOOGLE_APT_KEY,
            "GIB_ENV_SCRIPT": GIB_ENV_SCRIPT,
        }
        if kind == "rdma"
        else {
            "AR_TRANSPORT_APT_LINE": AR_TRANSPORT_APT_LINE,
            "TCPXO_APT_LINE": TCPXO_APT_LINE,
            "TCPXO_PLUGIN_IMAGE": TCPXO_PLUGIN_IMAGE,
            "TCPXO_RXDM_IMAGE": TCPXO_RXDM_IMAGE,
            "TCPXO_LIB": TCPXO_LIB,
            "TCPXO_ENV_SCRIPT": TCPXO_ENV_SCRIPT,
            "RXDM_CONTAINER": RXDM_CONTAINER,
            "RXDM_READY": RXDM_READY,
            "APERTURE_DIR": APERTURE_DIR,
            "UDEV_RULE_FILE": UDEV_RULE_FILE,
            "UDEV_RULE": UDEV_RULE,
        }
    )
    header = "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())
    body = _RDMA if kind == "rdma" else _TCPXO
    return f"#!/bin/bash\n# gputrain fabric setup ({kind}): idempotent, run as root\n{header}{_PRELUDE}{body}"


@dataclass(frozen=True)
class SetupReport:
    """What the setup found on one node: its NICs by role, versions and the plugin's env."""

    primary: str
    gvnics: tuple[str, ...]  # gVNICs other than the primary, in PCI order
    rdma_nics: tuple[str, ...]  # mlx5 (MRDMA) netdevs, in PCI order
    versions: Mapping[str, str] = field(default_factory=dict)
    plugin_env: Mapping[str, str] = field(default_factory=dict)


def parse_setup_report(text: str, node: str) -> SetupReport:
    """The report `setup_script` prints; FabricSetupError (one line) on an error or no report."""
    fields: dict[str, str] = {}
    versions: dict[str, str] = {}
    env: dict[str, str] = {}
    in_env = ok = False
    for line in text.splitlines():
        if line == f"{MARK} env-begin":
            in_env = True
        elif line == f"{MARK} env-end":
            in_env = False
        elif in_env:
            key, eq, value = line.partition("=")
            if eq and key.isidentifier():
                env[key] = value
        elif line.startswith(f"{MARK} error "):
            raise FabricSetupError(f"{node}: fabric setup failed: {line[len(MARK) + 7 :]}")
        elif line.startswith(f"{MARK} nics "):
            fields = dict(p.partition("=")[::2] for p in line.split()[2:])
        elif line.startswith(f"{MARK} version "):
            versions.update(p.partition("=")[::2] for p in line.split()[2:])
        elif line == f"{MARK} ok":
            ok = True
    if not ok or not fields.get("primary"):
        last = next((ln for ln in reversed(text.splitlines()) if ln.strip()), "no output")
        raise FabricSetupError(f"{node}: fabric setup did not finish ({last.strip()[:200]})")

    def names(key: str) -> tuple[str, ...]:
        return tuple(n for n in fields.get(key, "").split(",") if n)

    return SetupReport(fields["primary"], names("gvnic"), names("rdma"), versions, env)


def nccl_env(kind: FabricKind, report: SetupReport, node: str = "node") -> str:
    """The env file the launcher sources: the plugin's own variables, its library first on
    LD_LIBRARY_PATH, and this node's NICs (primary NIC as NCCL_SOCKET_IFNAME)."""
    q = shlex.quote
    overrides = {"NCCL_SOCKET_IFNAME": report.primary, "GLOO_SOCKET_IFNAME": report.primary}
    if kind == "rdma":
        lib, what = GIB_LIB, "GPUDirect RDMA (NCCL gIB plugin)"
        if "NCCL_NET" not in report.plugin_env:
            overrides["NCCL_NET"] = "gIB"  # fail loudly rather than fall back to sockets
    elif kind == "tcpxo":
        if len(report.gvnics) != TCPXO_GPU_NICS:
            found = ",".join(report.gvnics) or "none"
            raise FabricSetupError(
                f"{node}: found {len(report.gvnics)} GPU gVNIC(s) ({found}), expected {TCPXO_GPU_NICS}"
            )
        lib, what = TCPXO_LIB, "GPUDirect-TCPXO (FasTrak NCCL plugin)"
        overrides |= {
            "NCCL_FASTRAK_CTRL_DEV": report.primary,
            "NCCL_FASTRAK_IFNAME": ",".join(report.gvnics),
            "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": APERTURE_DIR,
        }
    else:
        raise ValueError("no fabric, no NCCL environment")
    plugin = {
        k: v for k, v in report.plugin_env.items() if k != "LD_LIBRARY_PATH" and k not in overrides
    }
    lines = [f"# gputrain: NCCL environment for {what}; written by the fabric setup"]
    lines += [f"export {k}={q(v)}" for k, v in sorted(plugin.items())]
    lines.append(f"export LD_LIBRARY_PATH={q(lib)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
    lines += [f"export {k}={q(v)}" for k, v in overrides.items()]
    return "\n".join(lines) + "\n"


def install_env_command() -> str:
    """Writes stdin to NCCL_ENV_FILE in the node root, atomically."""
    path = shlex.quote(NCCL_ENV_FILE)
    return f"mkdir -p .gputrain && cat > {path}.tmp && mv {path}.tmp {path}"
