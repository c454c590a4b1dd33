"""Real containers for the tests: Debian's podman behind a `docker` shim (its own storage under a
temp dir, runc, cgroupfs, no default ulimits — what podman needs on these machines), a real OCI
registry (Debian's docker-registry, the CNCF distribution server) on loopback or the test bed's
bridge, and tiny images made with `podman import` of a busybox rootfs."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

CONTAINERS_CONF = """[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
"""


def require_tools() -> None:
    missing = [t for t in ("podman", "runc", "docker-registry", "busybox") if not shutil.which(t)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (make test installs them)")


class Podman:
    """podman with private storage; `shim_dir` holds a `docker` that runs it (put it on PATH).
    `run_args`: what the shim adds to every `docker run` (e.g. a test host's read-only mounts);
    `runroot`: podman's run state (a short path: podman wants < 50 characters), else in /tmp.
    `user`: who runs it (rootless, one mapped id: no subuid ranges here), root by default."""

    def __init__(
        self,
        root: Path,
        *,
        run_args: tuple[str, ...] = (),
        runroot: Path | None = None,
        user: str = "root",
    ) -> None:
        self.root = root
        self.user = user
        root.mkdir(parents=True, exist_ok=True)
        (root / "containers.conf").write_text(CONTAINERS_CONF)
        self.runroot = runroot or Path(tempfile.mkdtemp(prefix="gtpod-", dir="/tmp"))
        self.argv = [
            "podman", "--root", str(root / "storage"), "--runroot", str(self.runroot),
            "--storage-driver", "vfs",
        ]  # fmt: skip
        registries = root / "registries.conf"
        registries.write_text("")
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(root / "containers.conf"),
            "CONTAINERS_REGISTRIES_CONF": str(registries),
        }
        rootless = ""
        if user != "root":
            self.env |= {"XDG_RUNTIME_DIR": str(root / "xdg"), "HOME": str(root)}
            (root / "xdg").mkdir(mode=0o700, exist_ok=True)
            self.argv = ["runuser", "-u", user, "--", *self.argv]
            # rootless with one mapped id, the caller is root inside: `--user` with the
            # caller's own ids (which docker maps as they are) becomes 0:0
            rootless = (
                f'export XDG_RUNTIME_DIR={root / "xdg"} HOME={root}\nme="$(id -u):$(id -g)"\n'
            )
        self.shim_dir = root / "bin"
        self.shim_dir.mkdir(exist_ok=True)
        shim = self.shim_dir / "docker"
        self.calls = root / "docker-calls.log"  # every docker command line (never values)
        shim.write_text(
            f"#!/bin/sh\nexport CONTAINERS_CONF={root / 'containers.conf'}\n"
            f"export CONTAINERS_REGISTRIES_CONF={registries}\n"
            f'echo "$*" >> {self.calls}\n{rootless}'
            # podman 4.3 has no --gpus (a GPU host's docker does): the fake nvidia-smi in the
            # image plays the GPUs it would see
            'for a; do shift; [ "$a" = --gpus ] && { skip=1; continue; }; '
            '[ -n "${skip:-}" ] && { skip=; continue; }; '
            '[ -n "${user:-}" ] && { user=; [ "$a" = "${me:-}" ] && a=0:0; }; '
            '[ "$a" = --user ] && user=1; set -- "$@" "$a"; done\n'
            + (
                f'if [ "$1" = run ]; then shift; set -- run {shlex.join(run_args)} "$@"; fi\n'
                if run_args
                else ""
            )
            + f'exec {" ".join(self.argv[4:] if user != "root" else self.argv)} "$@"\n'
        )
        shim.chmod(0o755)
        if user != "root":  # its storage, run state and call log are the user's
            self.runroot.mkdir(parents=True, exist_ok=True)
            subprocess.run(["chown", "-R", f"{user}:", str(root), str(self.runroot)], check=True)

    def trust(self, registry: str) -> None:
        """Reach `registry` over plain HTTP (a node's insecure-registries setting)."""
        with open(self.env["CONTAINERS_REGISTRIES_CONF"], "a") as f:
            f.write(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [*self.argv, *args], env=self.env, capture_output=True, text=True, cwd=self.root
        )
        if check and r.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return r

    def import_image(
        self, name: str, files: dict[str, str], links: dict[str, str] | None = None
    ) -> None:
        """A busybox rootfs (sh and every applet in /bin, an empty /tmp) plus `files` (path ->
        executable text) and `links` (path -> symlink target)."""
        rootfs = self.root / f"rootfs-{len(list(self.root.glob('rootfs-*')))}"
        (rootfs / "bin").mkdir(parents=True)
        shutil.copy(shutil.which("busybox") or "/bin/busybox", rootfs / "bin" / "busybox")
        applets = subprocess.run(["busybox", "--list"], capture_output=True, text=True).stdout
        for applet in applets.split():
            if applet != "busybox":
                (rootfs / "bin" / applet).symlink_to("busybox")
        (rootfs / "tmp").mkdir(mode=0o1777)
        (rootfs / "tmp").chmod(0o1777)
        for path, target in (links or {}).items():
            (rootfs / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (rootfs / path.lstrip("/")).symlink_to(target)
        for path, text in files.items():
            p = rootfs / path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            p.chmod(0o755)
        tar = rootfs.with_suffix(".tar")
        with tarfile.open(tar, "w") as t:
            t.add(rootfs, arcname=".")
        self("import", "-q", str(tar), name)

    def cleanup(self) -> None:
        self("rm", "-af", check=False)
        self("rmi", "-af", check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.runroot, ignore_errors=True)


class Registry:
    """docker-registry on `address` (127.0.0.1, or the test bed's bridge where its hosts reach
    it) with its storage under `root`."""

    def __init__(self, root: Path, address: str = "127.0.0.1") -> None:
        with socket.socket() as s:
            s.bind((address, 0))
            self.port = s.getsockname()[1]
        self.address = address
        self.host = f"{address}:{self.port}"
        config = root / "registry.yml"
        root.mkdir(parents=True, exist_ok=True)
        config.write_text(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {root / 'data'}\nhttp:\n  addr: {self.host}\n"
        )
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                socket.create_connection((address, self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("docker-registry did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
