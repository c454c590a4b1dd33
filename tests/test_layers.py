"""The layer rules, on the import graph read from the source (module-level and lazy imports alike):
no import circle; `infra` (the Pulumi program's side) never imports the controller; the trainer
stands alone; each backend folder under scripts/targets/ imports no other, and the shared stack
layer none of them; the CLI's --help loads nothing heavy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.imports import PACKAGES, edges, find_cycle, import_graph, module_files

HEAVY = ("pulumi", "pulumi_gcp", "google", "paramiko", "torch")
#: a backstop, not a guide: split along roles and seams long before this
MAX_LINES = 600
TARGETS = ROOT / "scripts" / "targets"
#: the folder every Pulumi-stack target shares; every other folder under scripts/targets/ is a backend
SHARED = "stack"


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT, (*PACKAGES, "tests"))


def test_no_import_circle(graph: dict[str, set[str]]) -> None:
    code = {m: imported for m, imported in graph.items() if m.split(".")[0] in PACKAGES}
    cycle = find_cycle(code)
    assert cycle is None, "import circle: " + " -> ".join(cycle or ())


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("infra", "scripts"),
        ("infra", "trainer"),
        ("infra", "tests"),
        ("trainer", "infra"),
        ("trainer", "scripts"),
        ("scripts", "tests"),
        ("trainer", "tests"),
    ],
)
def test_a_lower_layer_never_imports_a_higher_one(
    graph: dict[str, set[str]], source: str, target: str
) -> None:
    assert edges(graph, source, target) == []


def test_the_bottom_layer_imports_only_itself(graph: dict[str, set[str]]) -> None:
    bad = {m: sorted(i for i in graph[m] if i.split(".")[:2] != ["infra", "base"]) for m in graph}
    assert {m: i for m, i in bad.items() if m.startswith("infra.base") and i} == {}


def test_backend_folders_never_import_each_other_nor_does_the_shared_stack_layer(
    graph: dict[str, set[str]],
) -> None:
    folders = sorted(p.name for p in TARGETS.iterdir() if (p / "__init__.py").is_file())
    backends = [f for f in folders if f != SHARED]
    assert "gce" in backends  # the rule holds for real folders, not an empty list
    bad = [
        edge
        for source in folders
        for target in backends
        if source != target
        for edge in edges(graph, f"scripts.targets.{source}", f"scripts.targets.{target}")
    ]
    assert bad == []


def test_loading_every_infra_module_loads_no_controller_module() -> None:
    """The Pulumi program's side at run time: import everything in infra/, then look at
    sys.modules."""
    names = sorted(n for n in module_files(ROOT, ("infra",)))
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}: importlib.import_module(n)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scripts', 'trainer')))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert r.stdout.strip() == "[]"


def test_no_module_is_over_the_backstop() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in module_files(ROOT, PACKAGES).values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
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
