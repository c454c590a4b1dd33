"""mypy's settings in pyproject.toml: of pulumi_gcp it reads the top-level modules and only the
service subpackages our code uses (every other one is skipped, taken as Any), so a service our code
names must be in that list, or its resources would go unchecked without a word."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from tests.support import ROOT
from tests.support.imports import PACKAGES, module_files


def _followed() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    followed: set[str] = set()
    for override in config["tool"]["mypy"].get("overrides", []):
        if override.get("follow_imports") == "normal":
            modules = override["module"]
            followed.update([modules] if isinstance(modules, str) else modules)
    return followed


def _pulumi_gcp_names_used(tree: ast.AST) -> set[str]:
    """Each `pulumi_gcp.X` the module names: `import pulumi_gcp as gcp; gcp.X`, `from pulumi_gcp
    import X` and `import pulumi_gcp.X`."""
    aliases: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for name in node.names:
                parts = name.name.split(".")
                if parts[0] != "pulumi_gcp":
                    continue
                if len(parts) > 1:
                    used.add(parts[1])
                else:
                    aliases.add(name.asname or "pulumi_gcp")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "pulumi_gcp":
                used.update([parts[1]] if len(parts) > 1 else [n.name for n in node.names])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            used.add(node.attr)
    return used


def _pulumi_gcp_dir() -> Path:
    spec = importlib.util.find_spec("pulumi_gcp")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def test_mypy_reads_every_pulumi_gcp_service_our_code_uses() -> None:
    followed = _followed()
    package = _pulumi_gcp_dir()
    services = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    unread: dict[str, set[str]] = {}
    for module, path in module_files(ROOT, PACKAGES).items():
        used = _pulumi_gcp_names_used(ast.parse(path.read_text())) & services
        missing = {name for name in used if f"pulumi_gcp.{name}.*" not in followed}
        if missing:
            unread[module] = missing
    assert "pulumi_gcp.compute.*" in followed
    assert unread == {}, f"add these pulumi_gcp services to pyproject.toml's mypy list: {unread}"


def test_mypy_reads_pulumi_gcps_top_level_modules() -> None:
    """What `gcp.Provider` and the package's other top-level names come from."""
    top = {"pulumi_gcp"} | {f"pulumi_gcp.{p.stem}" for p in _pulumi_gcp_dir().glob("*.py")}
    assert top - {"pulumi_gcp.__init__"} - _followed() == set()


def test_the_finder_sees_each_way_of_naming_a_service() -> None:
    source = (
        "import pulumi_gcp as gcp\nimport pulumi_gcp.kms\nfrom pulumi_gcp import storage\n"
        "from pulumi_gcp.pubsub import Topic\n"
        "def f():\n    return gcp.compute.Instance, gcp.cloudfunctions.Function, gcp.Provider\n"
    )
    assert _pulumi_gcp_names_used(ast.parse(source)) == {
        "kms",
        "storage",
        "pubsub",
        "compute",
        "cloudfunctions",
        "Provider",
    }
