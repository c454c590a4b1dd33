"""The layer rules, on the import graph read from the source (module-level and lazy imports alike):
no import circle; `infra` (the Pulumi program's side) never imports the controller; the trainer
stands alone; the node package (gputrain_node) imports nothing of the controller's, which starts
it only through its contract module; each backend folder under scripts/targets/ imports no other, and the shared stack
layer none of them; the CLI's --help loads nothing heavy."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gputrain_node import contract
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
        ("trainer", "gputrain_node"),
        ("gputrain_node", "scripts"),
        ("gputrain_node", "infra"),
        ("gputrain_node", "tests"),
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


#: what would start a node module by a string of its own: `-m gputrain_node.x`, `trainer.x` or a
#: path to one of its files
_NAMES = "|".join(
    m.split(".")[1]
    for m in (*contract.STANDALONE, contract.TELEMETRY, contract.HEALTHCHECK, contract.VERTEX_ENTRY)
)
NODE_MODULE_TEXT = re.compile(
    rf"gputrain_node[./]|\btrainer[./](?:{_NAMES}|vertex_\w+|watch_hook)|\b(?:{_NAMES}|vertex_\w+)\.py\b"
)


def _strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a file but its docstrings (prose may name the modules)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_the_controller_starts_the_node_package_only_through_its_contract(
    graph: dict[str, set[str]],
) -> None:
    """Outside the package (and its tests) only gputrain_node.contract is imported, and no
    string names a node module or its file: every start goes through the contract's names."""
    imported = {
        (m, i)
        for m, deps in graph.items()
        if m.split(".")[0] in ("scripts", "infra", "trainer")
        for i in deps
        if i.split(".")[0] == contract.PACKAGE and i not in (contract.PACKAGE, contract.__name__)
    }
    assert imported == set()
    assert "scripts.job.data_io -> gputrain_node.contract" in edges(
        graph, "scripts", "gputrain_node"
    )
    spelled = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for package in ("scripts", "infra")
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, text in _strings(path)
        if NODE_MODULE_TEXT.search(text)
    ]
    assert spelled == []


def test_the_pattern_finds_the_strings_it_forbids() -> None:
    for text in ("-m gputrain_node.mirror_out", "trainer.telemetry", "trainer/watchdog.py",
                 "mirror_out.py", "gputrain_node/watch_hook", "trainer.vertex_entry"):  # fmt: skip
        assert NODE_MODULE_TEXT.search(text), text
    assert not NODE_MODULE_TEXT.search("trainer.train")
    assert not NODE_MODULE_TEXT.search("healthcheck")  # the command's name


def test_the_standalone_helpers_import_nothing_of_ours_and_spell_the_contracts_names(
    graph: dict[str, set[str]],
) -> None:
    """fetch_data, mirror_out and watchdog are sent on stdin before the code is uploaded: alone,
    so their top-level imports are the standard library's (and Google's) only, and the names
    they spell are the contract's."""
    from gputrain_node import budget_guard, fetch_data, watchdog

    for module in contract.STANDALONE:
        tree = ast.parse(contract.source_of(module).read_text())
        ours = [
            name
            for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            )
            if name and name.split(".")[0] in (contract.PACKAGE, "trainer", "scripts", "infra")
        ]
        assert ours == [], module
    assert (fetch_data.EXIT_NO_SPACE, fetch_data.EXIT_UNREADABLE) == contract.FETCH_USER_ERRORS
    assert fetch_data.RESULT_PREFIX == contract.FETCH_RESULT_PREFIX
    assert watchdog.RECORD == contract.AUTODOWN_RECORD
    assert watchdog.COMPUTE_ENDPOINT_ENV == contract.COMPUTE_ENDPOINT_ENV
    assert watchdog.BUDGET_MARK == contract.BUDGET_MARK
    assert watchdog.ENDED == contract.ENDED_MARKER
    assert watchdog.UPLOADED == contract.WATCHDOG_UPLOADED
    assert watchdog.HOLD == contract.AUTODOWN_HOLD
    assert watchdog.LEDGER_RECORD == contract.LEDGER_RECORD
    assert watchdog.GUARD == budget_guard.GUARD == contract.GUARD_STOP
    assert budget_guard.PUBSUB_ENDPOINT_ENV == contract.PUBSUB_ENDPOINT_ENV
    assert contract.source_of(contract.BUDGET_GUARD).name == watchdog.GUARD_FILE
    assert tuple(watchdog.Budget.__dataclass_fields__) == contract.BUDGET_FIELDS


def test_the_vertex_entry_imports_no_trainer_but_for_the_reference_trainers_flags(
    graph: dict[str, set[str]],
) -> None:
    """A Vertex job's package carries the user's `trainer/` when the project has one, in place
    of gputrain's: the entry and every node module it reaches import nothing of `trainer` at
    module level, and inside functions only where the Vertex side never goes that way (the
    reference trainer's own flags; mirror_out's command line, which runs on GCE nodes)."""
    reached, todo = set(), [contract.VERTEX_ENTRY]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += [m for m in graph[module] if m.startswith(contract.PACKAGE + ".")]
    assert {"gputrain_node.vertex_setup", "gputrain_node.vertex_mirror"} <= reached
    found = set()
    for module in reached:
        tree = ast.parse(contract.source_of(module).read_text())
        for node in tree.body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] == "trainer"], module
        found |= {
            (module.split(".")[1], fn.name)
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef)
            for node in ast.walk(fn)
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "trainer"
        }
    assert found == {("vertex_entry", "reference_config"), ("mirror_out", "main")}


def _imports(module: str) -> set[tuple[str | None, str]]:
    """(the function it is in, or None at module level; the top-level name) of each import."""
    tree = ast.parse(contract.source_of(module).read_text())
    found: set[tuple[str | None, str]] = set()

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, function or child.name)
                continue
            if isinstance(child, ast.Import):
                found.update((function, a.name.split(".")[0]) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                own = child.level > 0 or not child.module
                found.add(
                    (function, contract.PACKAGE if own else (child.module or "").split(".")[0])
                )
            visit(child, function)

    visit(tree, None)
    return found


def test_the_node_entries_import_only_their_package_the_standard_library_and_torch() -> None:
    """The health check runs from a Vertex job's package or beside a user project, where
    `trainer` (and any other name) may be the user's: it builds only on what is always there."""
    allowed = {*sys.stdlib_module_names, contract.PACKAGE, "torch"}
    assert contract.NODE_ENTRIES  # the rule holds for real modules, not an empty list
    for module in contract.NODE_ENTRIES:
        names = {name for _, name in _imports(module)}
        assert "torch" in names and names - allowed == set(), module


def test_the_node_package_imports_the_reference_trainer_only_where_it_is_gputrains_copy() -> None:
    """Only inside two functions: the reference trainer's own flags (vertex_entry, only for
    gputrain's trainer) and mirror_out's preemption watcher (GCE nodes, run from LIB_DIR beside
    gputrain's copy of `trainer`)."""
    modules = sorted(p.stem for p in contract.PACKAGE_DIR.glob("*.py") if p.stem != "__init__")
    assert "healthcheck" in modules
    found = {
        (module, function)
        for module in modules
        for function, name in _imports(f"{contract.PACKAGE}.{module}")
        if name == "trainer"
    }
    assert found == {("vertex_entry", "reference_config"), ("mirror_out", "main")}
