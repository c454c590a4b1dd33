"""Fabric node setup: the scripts run for real (bash, in a private mount namespace whose /etc,
/usr/local, /var/lib and /dev are overlays and whose /sys/class/net is a fake A4 / A3 Mega NIC
tree), with stub apt-get/docker/modprobe/udevadm/ip that behave like the real ones and log calls.
The report they print is parsed, and the NCCL env rendered from it is sourced by /bin/sh.

Fake NICs follow what the nodes show: A3 Mega enp0s12 + enp6s0..enp142s0 (CT a3-megagpu-8g
run-nccl-tests.sh), A4 enp0s19/enp192s20 gVNICs (CT a3-ultragpu nccl-tests) and gpu0rdma0..7
mlx5 netdevs (GKE DRANET interface names). The plugin env values are CT's a4high-vm.yaml
/etc/environment and the TCPXO profile values in the CEA gpudirect-tcpxo README.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from scripts.verify import fabric_setup as fs
from scripts.verify.fabric_setup import (
    FabricSetupError,
    SetupReport,
    nccl_env,
    parse_setup_report,
    setup_script,
)
from tests.support.fabric_samples import (
    A4_GVNICS,
    A4_RDMA_NICS,
    MEGA_GPU_NICS,
    MEGA_PRIMARY,
    a4_pci,
)

A4_NICS = [("0000:00:13.0", A4_GVNICS[0], "gve"), ("0000:c0:14.0", A4_GVNICS[1], "gve")] + [
    (a4_pci(i), name, "mlx5_core") for i, name in enumerate(A4_RDMA_NICS)
]
MEGA_NICS = [("0000:00:0c.0", MEGA_PRIMARY, "gve")] + [
    (f"0000:{int(n[3:].split('s')[0]):02x}:00.0", n, "gve") for n in MEGA_GPU_NICS
]
GIB_ENV = """export NCCL_NET=gIB
export NCCL_CROSS_NIC=0
export NCCL_NET_GDR_LEVEL=PIX
export NCCL_P2P_NET_CHUNKSIZE=131072
export NCCL_NVLS_CHUNKSIZE=524288
export NCCL_IB_GID_INDEX=3
export NCCL_IB_ADAPTIVE_ROUTING=1
export NCCL_IB_QPS_PER_CONNECTION=4
export NCCL_IB_TC=52
export NCCL_IB_FIFO_TC=84
export NCCL_TUNER_CONFIG_PATH=/usr/local/gib/configs/tuner_config_a4.txtpb
export NCCL_SOCKET_IFNAME=eth0,eth1
"""
TCPXO_PROFILE = """export NCCL_CROSS_NIC=0
export NCCL_PROTO=Simple,LL128
export NCCL_MIN_NCHANNELS=4
export NCCL_TUNER_PLUGIN=libnccl-tuner.so
export NCCL_TUNER_CONFIG_PATH=${NCCL_LIB_DIR}/a3plus_tuner_config.textproto
export NCCL_FASTRAK_NUM_FLOWS=2
export NCCL_FASTRAK_USE_SNAP=1
export NCCL_FASTRAK_IFNAME=eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8
export NCCL_FASTRAK_CTRL_DEV=eth0
export NCCL_BUFFSIZE=8388608
export LD_LIBRARY_PATH=${NCCL_LIB_DIR}:${LD_LIBRARY_PATH}
"""

STUBS = {
    "ip": 'echo "ip $*" >> "$STATE/calls"; echo "default via 10.0.0.1 dev $PRIMARY proto dhcp src 10.0.0.2 metric 100"',
    "apt-get": """echo "apt-get $*" >> "$STATE/calls"
[ -n "${FAIL_APT:-}" ] && exit 100
case " $* " in *" install "*) ;; *) exit 0 ;; esac
for p in "$@"; do case "$p" in
  nccl-gib) mkdir -p /usr/local/gib/scripts /usr/local/gib/lib64; cp "$STATE/gib_env" /usr/local/gib/scripts/set_nccl_env.sh; touch "$STATE/pkg-nccl-gib" ;;
  ibverbs-utils) printf '#!/bin/sh\\necho "    device  node GUID"\\n' > "$STUBS/ibv_devices"; chmod +x "$STUBS/ibv_devices" ;;
  dmabuf-import-helper) touch "$STATE/pkg-dmabuf" ;;
esac; done""",
    "dpkg-query": """case "$*" in
  *Status*) [ -e "$STATE/pkg-nccl-gib" ] && echo "install ok installed" ;;
  *Version*) echo "1.1.0" ;;
esac; exit 0""",
    "apt-mark": 'echo "apt-mark $*" >> "$STATE/calls"; [ -z "${FAIL_APT_MARK:-}" ]',
    "curl": 'echo "curl $*" >> "$STATE/calls"; echo KEY',
    "gpg": 'echo "gpg $*" >> "$STATE/calls"; cat > "${@: -1}"',
    "modinfo": '[ -e "$STATE/pkg-dmabuf" ]',
    "modprobe": 'echo "modprobe $*" >> "$STATE/calls"; [ -e "$STATE/pkg-dmabuf" ] && touch /dev/dmabuf_import_helper',
    "udevadm": 'echo "udevadm $*" >> "$STATE/calls"; case "$*" in *trigger*) mkdir -p /dev/aperture_devices/0000:8a:00.0 ;; esac',
    "gcloud": 'echo "gcloud $*" >> "$STATE/calls"',
    "docker": """echo "docker $*" >> "$STATE/calls"
case "$1" in
  run) case " $* " in
         *" install "*) mkdir -p /var/lib/tcpxo/lib64; cp "$STATE/tcpxo_profile" /var/lib/tcpxo/lib64/nccl-env-profile.sh ;;
         *" --detach "*) echo "${@: -3:1}" > "$STATE/rxdm" ;;
       esac ;;
  inspect) [ -e "$STATE/rxdm" ] && echo "$(cat "$STATE/rxdm") true" ;;
  logs) [ -e "$STATE/rxdm" ] && echo "I0101 rxdm.cc:123] Buffer manager initialization complete" ;;
  rm) rm -f "$STATE/rxdm" ;;
esac""",
}


def _sandbox_ok() -> bool:
    return (
        os.geteuid() == 0
        and shutil.which("unshare") is not None
        and "overlay" in Path("/proc/filesystems").read_text()
    )


needs_sandbox = pytest.mark.skipif(not _sandbox_ok(), reason="needs root, unshare and overlayfs")


class Node:
    """A fake GPU node: NIC tree, stubs and overlay upper dirs that persist between runs."""

    def __init__(self, root: Path, nics: list[tuple[str, str, str]]) -> None:
        self.root, self.state, self.stubs = root, root / "state", root / "bin"
        for d in (self.state, self.stubs, root / "net"):
            d.mkdir(parents=True)
        (self.state / "gib_env").write_text(GIB_ENV)
        (self.state / "tcpxo_profile").write_text(TCPXO_PROFILE)
        for name, body in STUBS.items():
            (self.stubs / name).write_text(f"#!/bin/bash\n{body}\n")
            (self.stubs / name).chmod(0o755)
        for pci, name, driver in nics:
            dev = root / "sys/devices/pci0000:00" / pci
            dev.mkdir(parents=True)
            (root / "sys/bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
            (dev / "driver").symlink_to(root / "sys/bus/pci/drivers" / driver)
            (root / "net" / name).mkdir()
            (root / "net" / name / "device").symlink_to(dev)
        (root / "net" / "lo").mkdir()  # virtual: no device link
        self.primary = nics[0][1]

    def run(self, script: str, **env: str) -> str:
        mounts = []
        for target in ("/etc", "/usr/local", "/var/lib", "/dev"):
            up = self.root / "overlay" / target.strip("/").replace("/", "_")
            (up / "u").mkdir(parents=True, exist_ok=True)
            (up / "w").mkdir(exist_ok=True)
            mounts.append(
                f"mount -t overlay overlay -o lowerdir={target},upperdir={up}/u,workdir={up}/w {target}"
            )
        mounts.append(f"mount --bind {self.root}/net /sys/class/net")
        (self.root / "script.sh").write_text(script)
        inner = (
            " && ".join(mounts) + f' && PATH="{self.stubs}:$PATH" exec bash {self.root}/script.sh'
        )
        proc = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "bash", "-c", inner],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                **os.environ,
                "STATE": str(self.state),
                "STUBS": str(self.stubs),
                "PRIMARY": self.primary,
                **env,
            },
        )
        return proc.stdout

    def calls(self) -> list[str]:
        path = self.state / "calls"
        lines = path.read_text().splitlines() if path.exists() else []
        path.write_text("")
        return lines


@needs_sandbox
def test_rdma_setup_installs_gib_reports_nics_and_is_idempotent(tmp_path: Path) -> None:
    node = Node(tmp_path, A4_NICS)
    report = parse_setup_report(node.run(setup_script("rdma")), "node-0")
    first = node.calls()
    assert any(c.startswith("apt-get") and "nccl-gib" in c and "ibverbs-utils" in c for c in first)
    assert "apt-mark hold nccl-gib" in first
    assert (
        tmp_path / "overlay/etc/u/apt/sources.list.d/nccl-gib.list"
    ).read_text() == fs.GIB_APT_LINE + "\n"
    assert report.primary == "enp0s19"
    assert report.gvnics == ("enp192s20",)
    assert report.rdma_nics == A4_RDMA_NICS
    assert report.versions == {"nccl-gib": "1.1.0"}
    assert report.plugin_env["NCCL_NET"] == "gIB" and report.plugin_env["NCCL_IB_TC"] == "52"

    again = parse_setup_report(node.run(setup_script("rdma")), "node-0")
    assert again == report
    assert not [
        c for c in node.calls() if c.startswith(("apt-get", "curl", "gpg"))
    ]  # nothing reinstalled


@needs_sandbox
def test_tcpxo_setup_dmabuf_udev_plugin_rxdm_and_is_idempotent(tmp_path: Path) -> None:
    node = Node(tmp_path, MEGA_NICS)
    report = parse_setup_report(node.run(setup_script("tcpxo")), "node-1")
    first = node.calls()
    assert any("dmabuf-import-helper" in c for c in first if c.startswith("apt-get"))
    assert "modprobe import-helper" in first
    assert "udevadm trigger --subsystem-match=pci --action=add" in first
    assert any(
        c.startswith("docker run --rm --name nccl-installer") and fs.TCPXO_PLUGIN_IMAGE in c
        for c in first
    )
    rxdm = next(c for c in first if c.startswith("docker run --detach"))
    assert fs.TCPXO_RXDM_IMAGE in rxdm and rxdm.endswith("--num_hops=2 --num_nics=8")
    assert (tmp_path / "overlay/etc/u/udev/rules.d/00-a3-megagpu.rules").read_text() == fs.UDEV_RULE
    assert report.primary == "enp0s12" and report.gvnics == MEGA_GPU_NICS  # PCI order
    assert report.rdma_nics == ()
    assert (
        report.plugin_env["NCCL_TUNER_CONFIG_PATH"]
        == "/var/lib/tcpxo/lib64/a3plus_tuner_config.textproto"
    )
    assert report.versions["rxdm"] == fs.TCPXO_RXDM_IMAGE

    assert parse_setup_report(node.run(setup_script("tcpxo")), "node-1") == report
    second = node.calls()
    assert not [
        c for c in second if c.startswith(("apt-get", "udevadm", "docker run", "docker rm"))
    ]
    assert "modprobe import-helper" in second  # loading the module is harmless to repeat


@needs_sandbox
def test_setup_failure_is_one_line_naming_the_node(tmp_path: Path) -> None:
    node = Node(tmp_path, A4_NICS)
    with pytest.raises(FabricSetupError) as err:
        parse_setup_report(node.run(setup_script("rdma"), FAIL_APT="1"), "stack-node-1")
    assert (
        str(err.value)
        == "stack-node-1: fabric setup failed: apt-get install nccl-gib ibverbs-utils failed"
    )


@needs_sandbox
def test_an_unexpected_failure_still_reports_one_line(tmp_path: Path) -> None:
    with pytest.raises(FabricSetupError) as err:
        parse_setup_report(
            Node(tmp_path, A4_NICS).run(setup_script("rdma"), FAIL_APT_MARK="1"), "n"
        )
    assert re.fullmatch(
        r"n: fabric setup failed: apt-mark hold nccl-gib > /dev/null exited 1 \(line \d+\)",
        str(err.value),
    )


def test_scripts_are_valid_bash_and_pin_what_they_install() -> None:
    for kind in ("rdma", "tcpxo"):
        script = setup_script(kind)  # type: ignore[arg-type]
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
        assert script.startswith("#!/bin/bash\n") and "set -Eeuo pipefail" in script
    rdma, tcpxo = setup_script("rdma"), setup_script("tcpxo")
    assert "gpudirect-gib-apt main" in rdma and "tcpxo" not in rdma.lower()  # no TCPX(O) on A4
    assert "tcpgpudmarxd-dev:v1.0.23" in tcpxo and "nccl-plugin-gpudirecttcpx-dev:v1.0.17" in tcpxo
    assert "gpudirect-tcpxo-apt main" in tcpxo and "--restart=unless-stopped" in tcpxo
    with pytest.raises(ValueError):
        setup_script("none")


def test_report_without_ok_line_fails_with_its_last_line() -> None:
    with pytest.raises(
        FabricSetupError,
        match=r"^node-2: fabric setup did not finish \(sudo: a password is required\)$",
    ):
        parse_setup_report("sudo: a password is required\n", "node-2")


def source_env(text: str, tmp_path: Path, *names: str) -> dict[str, str]:
    """Source the env file with /bin/sh (dash here, like the launcher's run.sh) and read it back."""
    (tmp_path / "nccl.env").write_text(text)
    shown = "; ".join(f'echo "{n}=${n}"' for n in names)
    out = subprocess.run(
        ["sh", "-c", f". {tmp_path}/nccl.env; {shown}"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/usr/lib/old"},
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_rdma_env_keeps_plugin_settings_and_uses_the_primary_nic(tmp_path: Path) -> None:
    plugin = dict(line[len("export ") :].split("=", 1) for line in GIB_ENV.splitlines())
    report = SetupReport("enp0s19", ("enp192s20",), (), {}, plugin)
    text = nccl_env("rdma", report)
    got = source_env(
        text,
        tmp_path,
        "NCCL_NET",
        "NCCL_IB_TC",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "LD_LIBRARY_PATH",
    )
    assert got == {
        "NCCL_NET": "gIB",
        "NCCL_IB_TC": "52",
        "NCCL_SOCKET_IFNAME": "enp0s19",  # not the plugin's GKE default eth0,eth1
        "GLOO_SOCKET_IFNAME": "enp0s19",
        "LD_LIBRARY_PATH": "/usr/local/gib/lib64:/usr/lib/old",
    }
    # Without NCCL_NET from the plugin, gIB is forced so a broken plugin fails instead of falling back.
    assert "export NCCL_NET=gIB" in nccl_env("rdma", SetupReport("ens4", (), (), {}, {}))


def test_tcpxo_env_names_this_nodes_gpu_nics(tmp_path: Path) -> None:
    plugin = {
        "NCCL_FASTRAK_IFNAME": "eth1,eth2",
        "NCCL_FASTRAK_CTRL_DEV": "eth0",
        "NCCL_PROTO": "Simple,LL128",
    }
    report = SetupReport("enp0s12", MEGA_GPU_NICS, (), {}, plugin)
    got = source_env(
        nccl_env("tcpxo", report),
        tmp_path,
        "NCCL_FASTRAK_IFNAME",
        "NCCL_FASTRAK_CTRL_DEV",
        "NCCL_SOCKET_IFNAME",
        "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY",
        "NCCL_PROTO",
        "LD_LIBRARY_PATH",
    )
    assert got["NCCL_FASTRAK_IFNAME"] == ",".join(MEGA_GPU_NICS)
    assert got["NCCL_FASTRAK_CTRL_DEV"] == got["NCCL_SOCKET_IFNAME"] == "enp0s12"
    assert got["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"] == "/dev/aperture_devices"
    assert got["NCCL_PROTO"] == "Simple,LL128"
    assert got["LD_LIBRARY_PATH"] == "/var/lib/tcpxo/lib64:/usr/lib/old"
    with pytest.raises(
        FabricSetupError, match=r"^node-3: found 2 GPU gVNIC\(s\) \(a,b\), expected 8$"
    ):
        nccl_env("tcpxo", SetupReport("ens4", ("a", "b"), (), {}, {}), "node-3")


def test_env_values_are_quoted_for_the_shell(tmp_path: Path) -> None:
    report = SetupReport("ens4", (), (), {}, {"NCCL_ODD": "a b;$(touch /tmp/x)'q"})
    assert source_env(nccl_env("rdma", report), tmp_path, "NCCL_ODD") == {
        "NCCL_ODD": "a b;$(touch /tmp/x)'q"
    }


def test_install_env_command_writes_the_file_atomically(tmp_path: Path) -> None:
    subprocess.run(
        ["sh", "-c", fs.install_env_command()],
        input="export A=1\n",
        text=True,
        cwd=tmp_path,
        check=True,
    )
    assert (tmp_path / fs.NCCL_ENV_FILE).read_text() == "export A=1\n"
    assert not (tmp_path / (fs.NCCL_ENV_FILE + ".tmp")).exists()
