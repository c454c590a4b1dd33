"""Containers on the sshd test bed: a real OCI registry (Debian's docker-registry) on the bed's
bridge, where the test hosts pull from it, and test hosts whose `docker` is podman (their own
storage, runc, cgroupfs, no default ulimits; the hosts are entered with nsenter so podman sees the
cgroups: TestBed.add_host(containers=True)), rootless as the bed's login user (one mapped id,
no subuid ranges here) or as root.

The images are tiny on purpose: a busybox rootfs whose `python3` is the test hosts' interpreter
with torch, which every host's docker shim bind-mounts read-only at its own path (/usr/lib, the
venv, its site-packages). An image with torch in it would be GBs, pushed and pulled per test;
this one is a few MB, and the job still runs torchrun inside the container: its own root, /tmp,
mounts and namespaces, as production's `docker run` starts it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from scripts.job.container import ImageRef, parse_image, resolve_digest
from tests.support.containers import Podman, Registry, require_tools
from tests.support.testbed import TestBed, TestHost

#: What an image built here has at its root: the tests tell "inside the image" by it.
IMAGE_MARK = "/gputrain-image"

FAKE_APT_GET = """#!/bin/sh
# gputrain test bed: apt-get records its call; installing docker.io (or the toolkit) puts the
# host's podman-backed docker shim (or a fake nvidia-ctk) in place, as the package would.
echo "apt-get $*" >> __LOG__
case " $* " in *" install "*)
  case " $* " in *" docker.io "*) cp __SHIM__ __BIN__/docker;; esac
  case " $* " in *" nvidia-container-toolkit "*) cp __CTK__ __BIN__/nvidia-ctk;; esac;;
esac
exit 0
"""
FAKE_APT_CACHE = """#!/bin/sh
printf 'nvidia-container-toolkit:\\n  Installed: (none)\\n  Candidate: 1.17.8-1\\n'
"""
FAKE_NVIDIA_CTK = """#!/bin/sh
echo "nvidia-ctk $*" >> __LOG__
echo "NVIDIA Container Toolkit CLI version 1.17.8"
"""
FAKE_RECORD = """#!/bin/sh
echo "$(basename "$0") $*" >> __LOG__
"""
FAKE_SUDO = """#!/bin/sh
# gputrain test bed: sudo records its call and runs the command as the caller
echo "sudo $*" >> __LOG__
[ "$1" = -n ] && shift
exec "$@"
"""


class ContainerBed:
    """The registry on the bridge, a builder podman on this machine that makes and pushes the
    images, and each enabled host's podman. `close()` removes all of it."""

    def __init__(self, tb: TestBed, root: Path) -> None:
        require_tools()
        self.tb = tb
        self.root = root
        self.registry = Registry(root / "registry", address=tb.bridge_address)
        self.builder = Podman(root / "builder")
        self.builder.trust(self.registry.host)
        self.hosts: dict[str, Podman] = {}
        self._mounts: tuple[str, ...] | None = None

    def python_mounts(self) -> tuple[str, ...]:
        """`-v PATH:PATH:ro` for what the hosts' interpreter needs: the shared libraries, the
        standard library, its venv and every site-packages dir (torch)."""
        if self._mounts is None:
            code = (
                "import json, os, sys; print(json.dumps([sys.prefix, os.path.join(sys.base_prefix, 'lib'), "
                "os.path.realpath(sys._base_executable), "
                "*[p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))]]))"
            )
            found = subprocess.run(
                [self.tb.python, "-c", code], capture_output=True, text=True, check=True
            ).stdout
            paths = {"/usr/lib", *(p for p in ("/usr/lib64",) if Path(p).is_dir())}
            hops = []  # every link from the venv's python to the real file (venv -> /usr/bin/...)
            hop = self.tb.python
            while os.path.islink(hop) and len(hops) < 16:
                hop = os.path.join(os.path.dirname(hop), os.readlink(hop))
                hops.append(os.path.normpath(hop))
            for p in [*json.loads(found), *hops]:
                if Path(p).exists() and not any(p.startswith(q + "/") for q in paths):
                    paths.add(p)
            self._mounts = tuple(a for p in sorted(paths) for a in ("-v", f"{p}:{p}:ro"))
        return self._mounts

    def image(self, name: str, *, gpus: int = 0, mark: str = "bed") -> ImageRef:
        """Build REGISTRY/gputrain/NAME:1 (its python3 the hosts' interpreter, `gpus` fake
        GPUs for its nvidia-smi), push it and return it at its digest; the builder keeps no
        copy (the hosts pull it)."""
        files = {
            "/usr/local/bin/python3": f'#!/bin/sh\nexec {self.tb.python} "$@"\n',
            IMAGE_MARK: f"#!/bin/sh\necho {mark}\n",
        }
        if gpus:
            files["/usr/bin/nvidia-smi"] = "#!/bin/sh\n" + "echo 'NVIDIA L4, 23034 MiB'\n" * gpus
        local = f"localhost/gputrain-{name}:1"
        self.builder.import_image(local, files, {"/lib": "usr/lib", "/lib64": "usr/lib64"})
        target = f"{self.registry.host}/gputrain/{name}:1"
        self.builder("push", "-q", local, f"docker://{target}")
        self.builder("rmi", "-f", local)
        return resolve_digest(parse_image(target, "image"), insecure=True)

    def enable(self, host: TestHost, *, docker: bool = True) -> Podman:
        """The host's podman (storage under its dir, trusting the registry). With `docker`, its
        shim is the host's `docker`; else fake apt-get / apt-cache / nvidia-ctk / systemctl
        record what an install does and apt-get puts the shim in place (`apt_log`); the login
        user owns the host's bin dir then, as the fake sudo makes no one root."""
        if not host.containers:
            raise ValueError(f"{host.name}: add it with containers=True")
        pod = Podman(
            host.dir / "podman",
            run_args=self.python_mounts(),
            runroot=host.dir / "podrun",
            user=self.tb.user,
        )
        pod.trust(self.registry.host)
        self.hosts[host.name] = pod
        bin_dir = host.dir / "bin"
        if docker:
            shutil.copy(pod.shim_dir / "docker", bin_dir / "docker")
            return pod
        log = self.apt_log(host)
        ctk = pod.root / "nvidia-ctk"
        ctk.write_text(FAKE_NVIDIA_CTK.replace("__LOG__", str(log)))
        ctk.chmod(0o755)
        fakes = {
            "apt-get": FAKE_APT_GET.replace("__SHIM__", str(pod.shim_dir / "docker"))
            .replace("__CTK__", str(ctk))
            .replace("__BIN__", str(bin_dir)),
            "apt-cache": FAKE_APT_CACHE,
            "sudo": FAKE_SUDO,
            **dict.fromkeys(("systemctl", "usermod", "setfacl"), FAKE_RECORD),
        }
        for tool, body in fakes.items():
            (bin_dir / tool).write_text(body.replace("__LOG__", str(log)))
            (bin_dir / tool).chmod(0o755)
        for path in (bin_dir, log):
            path.touch()
            shutil.chown(path, self.tb.user)
        return pod

    def apt_log(self, host: TestHost) -> Path:
        return host.dir / "install-calls.log"

    def containers_on(self, host: TestHost) -> list[str]:
        """The containers the host's podman knows (running or not)."""
        return self.hosts[host.name]("ps", "-aq").stdout.split()

    def close(self) -> None:
        for pod in self.hosts.values():
            pod.cleanup()
        self.hosts.clear()
        self.registry.stop()
        self.builder.cleanup()
        shutil.rmtree(self.root, ignore_errors=True)
