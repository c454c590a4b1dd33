"""The manual (docs/, built with MkDocs) against the code: every CLI option and every stack and
hosts-file key has its place in the reference pages, and the strict build fails on a broken link,
a missing anchor or a page left out of the nav."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import yaml

from infra import stackfile
from scripts import cli
from scripts.targets import hosts_file
from tests.support import ROOT

DOCS = ROOT / "docs"
CLI_PAGE = DOCS / "reference" / "cli.md"
#: The section of the CLI page whose options every command takes.
SHARED_SECTION = "Options every command takes"


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "stack_config_hook", DOCS / "hooks" / "stack_config.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _sections(markdown: str) -> list[tuple[str, str]]:
    """(heading, body) for every heading of a page, code blocks kept in the body."""
    sections: list[tuple[str, str]] = [("", "")]
    fence = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fence = not fence
        match = None if fence else re.match(r"^#{1,6} (.*)", line)
        if match:
            sections.append((match.group(1), ""))
        else:
            heading, body = sections[-1]
            sections[-1] = (heading, body + line + "\n")
    return sections


def _commands() -> dict[str, list[str]]:
    """Every subcommand of `gputrain` and its long options (the parser as main builds it)."""
    parser = cli._parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: [
            option
            for action in command._actions
            for option in action.option_strings
            if option.startswith("--") and option != "--help"
        ]
        for name, command in sub.choices.items()
    }


def _mentions(text: str, option: str) -> bool:
    return re.search(rf"`{re.escape(option)}[ `=]", text) is not None


def missing_cli_options(page: str) -> list[str]:
    """What the page lacks: a section per command, and each option of a command in that section,
    in a section whose heading names the command, or in the shared section."""
    sections = _sections(page)
    shared = "".join(body for heading, body in sections if heading == SHARED_SECTION)
    missing = []
    for command, options in _commands().items():
        own = "".join(
            heading + "\n" + body for heading, body in sections if f"`{command}`" in heading
        )
        if not own:
            missing.append(f"a section whose heading names `{command}`")
        missing += [
            f"{command} {option}"
            for option in options
            if not _mentions(own, option) and not _mentions(shared, option)
        ]
    return missing


def test_every_cli_option_is_in_the_reference() -> None:
    assert _commands()["run"], "the parser walk found no options"
    assert missing_cli_options(CLI_PAGE.read_text(encoding="utf-8")) == []


def test_the_cli_check_finds_a_missing_option() -> None:
    page = CLI_PAGE.read_text(encoding="utf-8")
    without = re.sub(r"`--keep-images[ `=]", "`", page)
    assert missing_cli_options(without) == ["run --keep-images"]
    without_top = page.replace("### `top`", "### the live table")
    assert "a section whose heading names `top`" in missing_cli_options(without_top)


ARCHITECTURE = DOCS / "developer" / "architecture.md"
#: the code the Layout section lists one line per module (packages' __init__.py left out)
LAID_OUT = ("infra", "scripts", "trainer", "gputrain_node")


def missing_from_layout(page: str) -> list[str]:
    """Modules of LAID_OUT without their line in the page's Layout block, lines naming a module
    that does not exist, and bench/ scripts its bench/ line does not name."""
    layout = "".join(body for heading, body in _sections(page) if heading == "Layout")
    block = layout.split("```")[1] if layout.count("```") >= 2 else ""
    lines = block.splitlines()
    starts = {line.split(" ", 1)[0] for line in lines}
    bench = " ".join(line for line in lines if line.startswith("bench/"))
    modules = sorted(
        str(f.relative_to(ROOT))
        for package in LAID_OUT
        for f in (ROOT / package).rglob("*.py")
        if f.name != "__init__.py"
    )
    scripts = sorted(f.name for f in (ROOT / "bench").iterdir() if f.suffix in (".py", ".sh"))
    gone = sorted(
        f"{line} (no such module)"
        for line in starts
        if line.startswith(tuple(f"{package}/" for package in LAID_OUT))
        and line.endswith(".py")
        and line not in modules
    )
    return (
        [m for m in modules if m not in starts]
        + gone
        + [f"bench/{s}" for s in scripts if not re.search(rf"\b{re.escape(s)}\b", bench)]
    )


def test_every_module_is_in_the_layout() -> None:
    assert missing_from_layout(ARCHITECTURE.read_text(encoding="utf-8")) == []


def test_the_layout_check_finds_a_missing_module() -> None:
    page = ARCHITECTURE.read_text(encoding="utf-8")
    without = re.sub(r"^gputrain_node/torch_pins\.py .*\n", "", page, flags=re.M)
    assert missing_from_layout(without) == ["gputrain_node/torch_pins.py"]
    assert missing_from_layout(page.replace("way_through.py", "")) == ["bench/way_through.py"]
    moved = page.replace("\nscripts/job/leftovers.py ", "\nscripts/job/tagged.py ")
    assert missing_from_layout(moved) == [
        "scripts/job/leftovers.py",
        "scripts/job/tagged.py (no such module)",
    ]


ENV_PAGE = DOCS / "reference" / "environment-variables.md"
#: gputrain's own names the page leaves out on purpose, each with why
UNLISTED_ENV = {
    "GPUTRAIN_SECRET_NAMES": "run.sh's own: the names it redacts, set and read on the node",
    "GPUTRAIN_STACK_FILE": "the reconcile job's own: set by the program on its Cloud Run job",
    "GPUTRAIN_RECREATE_DEADLINE": "a recovery's own: set on the `pulumi up` that re-creates VMs",
    "GPUTRAIN_RECREATE_ZONE": "a recovery's own: set on the `pulumi up` that re-creates VMs",
    "GPUTRAIN_RECREATE_IMAGE": "a recovery's own: set on the `pulumi up` that re-creates VMs",
    "GPUTRAIN_RECREATE_KEEP": "a recovery's own: set on the `pulumi up` that re-creates VMs",
}


def missing_env_names(page: str) -> list[str]:
    """`GPUTRAIN_*` names in the code that the page does not show (a heredoc's delimiter, `..._EOF`
    or the one line it ends, is no variable), and UNLISTED_ENV names the code no longer has."""
    names: set[str] = set()
    for package in LAID_OUT:
        for f in (ROOT / package).rglob("*.py"):
            text = f.read_text(encoding="utf-8")
            heredocs = set(re.findall(r"<<'?(GPUTRAIN_[A-Z0-9_]+)'?", text))
            names |= set(re.findall(r"GPUTRAIN_[A-Z0-9_]*[A-Z0-9]_?", text)) - heredocs
    names = {n for n in names if not n.endswith("_EOF")}
    shown = [n for n in names if f"`{n}" in page or n in UNLISTED_ENV]
    return sorted(names - set(shown)) + sorted(set(UNLISTED_ENV) - names)


def test_every_gputrain_variable_is_on_its_page() -> None:
    assert missing_env_names(ENV_PAGE.read_text(encoding="utf-8")) == []


def test_the_variable_check_finds_a_missing_one() -> None:
    page = ENV_PAGE.read_text(encoding="utf-8")
    assert missing_env_names(page.replace("`GPUTRAIN_REGISTRY_HOST`", "")) == [
        "GPUTRAIN_REGISTRY_HOST"
    ]


def _rendered_stack_page() -> str:
    hook = _hook()
    page = SimpleNamespace(file=SimpleNamespace(src_uri=hook.PAGE))
    return hook.on_page_markdown((DOCS / hook.PAGE).read_text(encoding="utf-8"), page=page)


def missing_stack_keys(rendered: str) -> list[str]:
    """Keys without a row in the Keys section's table that has a type and a description."""
    rendered = "".join(body for heading, body in _sections(rendered) if heading == "Keys")
    missing = []
    for key in [stackfile.GCP_PROJECT_KEY, *stackfile.DEFAULTS]:
        row = re.search(rf"^\| `{re.escape(key)}` \|(.*)\|\s*$", rendered, re.M)
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row.group(1))] if row else []
        if len(cells) != 4 or not cells[0] or not cells[-1]:
            missing.append(key)
    return missing


def test_every_stack_key_is_in_the_reference() -> None:
    assert missing_stack_keys(_rendered_stack_page()) == []


def test_the_stack_check_finds_a_missing_key() -> None:
    rendered = _rendered_stack_page()
    row = re.search(r"^\| `autodown` \|.*\n", rendered, re.M)
    assert row
    assert missing_stack_keys(rendered.replace(row.group(0), "")) == ["autodown"]


def test_stack_key_descriptions_come_from_pulumi_yaml() -> None:
    """One source each: descriptions from Pulumi.yaml (the `data` map key: its comment), the
    shapes a key takes from infra/schema.py."""
    declared = yaml.safe_load((ROOT / "Pulumi.yaml").read_text(encoding="utf-8"))["config"]
    keys = {k.name: k for k in _hook().stack_keys()}
    assert keys["maxRunDuration"].description == " ".join(
        declared["maxRunDuration"]["description"].split()
    )
    assert keys["data"].type.startswith("a mapping of NAME")  # types: infra/schema.py
    assert keys["nodes"].type == "a whole number (ASCII digits)"
    assert keys["data"].description.startswith("the datasets every job reads")
    # two map keys' comments one after the other: each gets its own block, not its neighbour's
    assert keys["chief"].description.startswith("worker pool 0's own machine")
    assert "Reduction Server" not in keys["chief"].description
    assert keys["reductionServer"].description.startswith("worker pool 2 runs Google's")
    assert "`backend: gce` only" in keys["stallTimeout"].notes
    assert "never by the Pulumi program" in keys["setup"].notes


def test_every_hosts_file_key_is_in_the_reference() -> None:
    page = (DOCS / "reference" / "hosts-file.md").read_text(encoding="utf-8")
    keys = (*hosts_file.TOP_KEYS, *hosts_file.HOST_KEYS, *hosts_file.GPU_KEYS)
    missing = [k for k in keys if not re.search(rf"(^|[\s{{,-])`?{k}`?:", page, re.M)]
    assert missing == []


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "<table>" in (tmp_path / "site" / "reference" / "stack-config" / "index.html").read_text()
    )


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ("orphan", 'not included in the "nav"'),
        ("broken link", "not found among documentation files"),
        ("broken anchor", "does not contain an anchor"),
    ],
)
def test_the_strict_build_fails_on(tmp_path: Path, change: str, complaint: str) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("hooks", "incoming"))
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config["docs_dir"] = str(docs)
    config["hooks"] = [str(DOCS / "hooks" / "stack_config.py")]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    if change == "orphan":
        (docs / "orphan.md").write_text("# Not in the nav\n", encoding="utf-8")
    else:
        target = "no-such-page.md" if change == "broken link" else "limits.md#no-such-anchor"
        with (docs / "index.md").open("a", encoding="utf-8") as f:
            f.write(f"\n[a link]({target})\n")
    result = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert complaint in result.stdout + result.stderr


def test_the_readme_is_a_door() -> None:
    """At most 200 lines, and every link into the repository names a file that exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert "docs/reference/cli.md" in local
    assert [link for link in local if not (ROOT / link).is_file()] == []
