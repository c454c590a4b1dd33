"""Terminal output: rich tables and live status on a TTY, plain lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()
#: What a line from a node may carry to the user's terminal: colours (SGR, ESC [ ... m) and tabs.
#: Every other control character is shown as an escape, so node output (a trainer, a requirement's
#: install script) cannot set the clipboard (OSC 52), the window title, move the cursor over lines
#: already printed or answer-back through the terminal.
_SGR = r"\x1b\[[0-9;]{0,32}m"
_CONTROL = re.compile(rf"({_SGR})|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _shown(m: re.Match[str]) -> str:
    return m.group(1) or ascii(m.group(0))[1:-1]


def terminal_safe(text: str) -> str:
    """`text` with every control character but newline, tab and colours escaped (\\x1b); of a
    line a progress bar redraws with carriage returns, what a terminal would end up showing (its
    last part). Pure."""
    if "\r" in text:
        text = "\n".join(
            next((p for p in reversed(line.split("\r")) if p), "") for line in text.split("\n")
        )
    return _CONTROL.sub(_shown, text)


def is_tty() -> bool:
    return sys.stdout.isatty()


def say(message: str) -> None:
    """One line to stdout, safe from several threads at once."""
    message = terminal_safe(message)
    with _lock:
        print(message, flush=True)


def warn(message: str) -> None:
    message = terminal_safe(message)
    with _lock:
        print(f"warning: {message}", file=sys.stderr, flush=True)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A table: rich on a terminal, aligned plain text otherwise."""
    cells = [[("" if c is None else terminal_safe(str(c))) for c in row] for row in rows]
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


class StatusLines:
    """One status line per key (a node) while something is awaited. On a terminal the lines update
    in place (rich Live, started at the first update); otherwise a key's line is printed at its
    first update and then at most every `every_s`, so a log gets a heartbeat, not a flood."""

    def __init__(
        self,
        *,
        tty: bool,
        every_s: float = 5.0,
        console: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tty = tty
        self.every_s = every_s
        self.lines: dict[str, str] = {}
        self._console = console
        self._clock = clock
        self._printed_at: dict[str, float] = {}
        self._live: Any = None
        self._mutex = threading.Lock()

    def update(self, key: str, text: str, *, final: bool = False) -> None:
        """Set the key's line; `final` lines are always printed off a terminal."""
        text = terminal_safe(text)
        with self._mutex:
            self.lines[key] = text
            if self.tty:
                self._show()
                return
            now = self._clock()
            last = self._printed_at.get(key)
            if not final and last is not None and now - last < self.every_s:
                return
            self._printed_at[key] = now
        say(f"{key}: {text}")

    def render(self) -> Any:
        from rich.text import Text

        return Text("\n".join(f"{k}: {v}" for k, v in self.lines.items()))

    def _show(self) -> None:
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(
                self.render(), console=self._console or Console(), refresh_per_second=4
            )
            self._live.start()
        else:
            self._live.update(self.render())

    def close(self) -> None:
        with self._mutex:
            if self._live is not None:
                self._live.update(self.render(), refresh=True)
                self._live.stop()
                self._live = None


@contextmanager
def status_lines(every_s: float = 5.0) -> Iterator[StatusLines]:
    """StatusLines for this output (a terminal or not), closed afterwards."""
    lines = StatusLines(tty=is_tty(), every_s=every_s)
    try:
        yield lines
    finally:
        lines.close()
