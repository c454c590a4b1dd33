"""A local package index for the nodes' `pip install`: wheels of tiny projects built here (no
internet), served in PEP 503's layout (`/simple/<name>/`) by a plain HTTP file server."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def build_wheel(
    name: str,
    out: Path,
    *,
    version: str = "1.0",
    module_body: str = "",
    dependencies: tuple[str, ...] = (),
) -> Path:
    """A wheel of a one-module project `name` (module `name` with dashes as underscores) that
    requires `dependencies` (PEP 508 strings)."""
    module = name.replace("-", "_")
    src = out / f"src-{name}"
    (src / module).mkdir(parents=True)
    (src / module / "__init__.py").write_text(
        f"VERSION = {version!r}\n" + (module_body or "def hello() -> str:\n    return 'hi'\n")
    )
    (src / "pyproject.toml").write_text(
        "[build-system]\nrequires = ['setuptools']\nbuild-backend = 'setuptools.build_meta'\n"
        f"[project]\nname = {name!r}\nversion = {version!r}\ndependencies = {list(dependencies)!r}\n"
        f"[tool.setuptools]\npackages = [{module!r}]\n"
    )
    dist = out / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(dist), str(src)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return next(dist.glob(f"{module}-{version}-*.whl"))


class PackageIndex:
    """`/simple/<name>/<wheel>` over HTTP on `host` (the test bed's bridge, or loopback)."""

    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root = root
        (root / "simple").mkdir(parents=True, exist_ok=True)
        handler = functools.partial(_QuietHandler, directory=str(root))
        self._server = ThreadingHTTPServer((host, 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.requests: list[str] = []
        self._server.index = self  # type: ignore[attr-defined]

    def add(self, wheel: Path) -> None:
        name = wheel.name.split("-")[0].replace("_", "-").lower()
        d = self.root / "simple" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / wheel.name).write_bytes(wheel.read_bytes())

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/simple/"

    def __enter__(self) -> PackageIndex:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        self.server.index.requests.append(self.path)  # type: ignore[attr-defined]
