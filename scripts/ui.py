"""Terminal output: rich tables and live status on a TTY, plain lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

_lock = threading.Lock()


def is_tty() -> bool:
    return sys.stdout.isatty()


def say(message: str) -> None:
    """One line to stdout, safe from several threads at once."""
    with _lock:
        print(message, flush=True)


def warn(message: str) -> None:
    with _lock:
        print(f"warning: {message}", file=sys.stderr, flush=True)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A table: rich on a terminal, aligned plain text otherwise."""
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    if is_tty():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for h in headers:
            t.add_column(h)
        for row in cells:
            t.add_row(*row)
        with _lock:
            Console().print(t)
        return
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    with _lock:
        print("\n".join(lines), flush=True)
