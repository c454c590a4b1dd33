"""A local package index for the nodes' `pip install`: wheels of tiny projects built here (no
internet), served in PEP 503's layout (`/simple/<name>/`) by a plain HTTP file server."""

from __future__ import annotations

import base64
import functools
import hashlib
import threading
import zipfile
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
    """A wheel (out/dist/) of a one-module project `name` (module `name` with dashes as
    underscores) that requires `dependencies` (PEP 508 strings). Written as the wheel format
    (PEP 427) lays it out — the module, METADATA, WHEEL and a RECORD of sha256 digests — with
    no build backend to start: what pip and uv install is the same."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {d}\n" for d in dependencies)
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n"
        + (module_body or "def hello() -> str:\n    return 'hi'\n"),
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: gputrain-tests\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ),
    }
    record = [
        f"{path},sha256={_digest(text.encode())},{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    dist = out / "dist"
    dist.mkdir(parents=True, exist_ok=True)
    wheel = dist / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def _digest(data: bytes) -> str:
    """RECORD's hash: urlsafe base64 of the sha256, without padding."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


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
