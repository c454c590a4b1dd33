"""The import graph runs one way: `infra.base` <- `infra` <- `scripts`; and the CLI stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("pulumi", "pulumi_gcp", "google", "paramiko", "torch")


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", _modules("infra"), ids=lambda p: str(p.relative_to(ROOT)))
def test_infra_never_imports_the_controller(path: Path) -> None:
    bad = {m for m in _imports(path) if m.split(".")[0] in ("scripts", "trainer", "tests")}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", _modules("infra/base"), ids=lambda p: p.name)
def test_the_bottom_layer_imports_only_itself(path: Path) -> None:
    ours = {m for m in _imports(path) if m.split(".")[0] in ("infra", "scripts", "trainer")}
    assert all(m.startswith("infra.base") for m in ours), sorted(ours)


def test_loading_every_infra_module_loads_no_controller_module() -> None:
    """The Pulumi program's side: import everything in infra/, then look at sys.modules."""
    names = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in _modules("infra")
    ]
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}: importlib.import_module(n)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scripts', 'trainer')))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert r.stdout.strip() == "[]"


def test_no_module_is_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for pkg in ("infra", "scripts", "trainer")
        for p in _modules(pkg)
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, long


def test_help_of_every_command_loads_no_heavy_module() -> None:
    code = (  # what the interpreter starts with (a namespace package's .pth) is not the CLI's
        "import sys\nbefore = set(sys.modules)\nimport scripts.cli as c\n"
        "for argv in [['--help']] + [[name, '--help'] for name in c.COMMANDS]:\n"
        "    try:\n        c.main(argv)\n    except SystemExit:\n        pass\n"
        f"print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in {HEAVY!r}))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert r.stdout.strip().splitlines()[-1] == "[]"
