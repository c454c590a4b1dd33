"""MkDocs hook: the stack config reference's key table, rendered at build time from the keys and
types the code declares (infra/schema.py) and the descriptions Pulumi.yaml gives them (one source each;
nothing generated is committed). tests/test_docs.py renders it too.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference/stack-config.md"
MARKER = "<!-- stack-keys -->"


@dataclass(frozen=True)
class StackKey:
    """One `gputrain:` setting as the reference shows it."""

    name: str
    type: str
    default: str
    description: str
    notes: str


def stack_keys(root: Path = ROOT) -> list[StackKey]:
    """Every key infra/stackfile.py knows, in Pulumi.yaml's order, with Pulumi.yaml's type and
    description (a map key has no Pulumi type: its description is the comment that names it)."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import yaml

    from infra import schema, stackfile

    text = (root / "Pulumi.yaml").read_text(encoding="utf-8")
    declared: dict[str, Any] = yaml.safe_load(text).get("config", {})
    order = [k for k in declared if k in stackfile.DEFAULTS]
    order += [k for k in stackfile.DEFAULTS if k not in order]
    keys = []
    for name in order:
        found = declared.get(name)
        decl: dict[str, Any] = found if isinstance(found, dict) else {}
        kind = schema.allowed(name)  # the YAML shapes the key takes, from the one schema
        if name in stackfile.MAP_KEYS:
            description = _comment_description(text, name)
        else:
            description = " ".join(str(decl.get("description", "")).split())
        keys.append(
            StackKey(name, kind, stackfile.DEFAULTS[name], description, _notes(stackfile, name))
        )
    return keys


def _comment_description(text: str, key: str) -> str:
    """The `# KEY (...): description` comment block Pulumi.yaml gives an undeclarable key, up to
    its example, the next key's block (`# OTHER (`) or the next declared key."""
    match = re.search(
        rf"^\s*# {re.escape(key)} \((.*?)(?=^\s*[^#\s]|^\s*# \w+ \()", text, re.M | re.S
    )
    if not match:
        return ""
    words = " ".join(line.strip().lstrip("#").strip() for line in match.group(1).splitlines())
    words = words.split("For example:")[0]
    return words.split("): ", 1)[-1].strip()


def _notes(stackfile: Any, name: str) -> str:
    notes = [
        f"`backend: {backend}` only"
        for backend, names in stackfile.BACKEND_ONLY_KEYS.items()
        if name in names
    ]
    if name not in stackfile.PROGRAM_KEYS:
        notes.append("read by gputrain, never by the Pulumi program")
    return "; ".join(notes)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_table(keys: list[StackKey]) -> str:
    """The reference table: key, type, default, where it applies, description."""
    rows = [
        "| key | type | default | applies | description |",
        "|---|---|---|---|---|",
        "| `gcp:project` | string | (none) | | The GCP project the stack's resources go in "
        "(required before `up`; `pulumi config set gcp:project MY_PROJECT --stack NAME`). |",
    ]
    for key in keys:
        default = f"`{key.default}`" if key.default else "(empty)"
        rows.append(
            f"| `{key.name}` | {key.type} | {_cell(default)} | {_cell(key.notes)} "
            f"| {_cell(key.description)} |"
        )
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Fills the marker on the stack config page; a page without it fails the build."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{PAGE}: the marker {MARKER} is missing")
    return markdown.replace(MARKER, render_table(stack_keys()))
