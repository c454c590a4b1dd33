"""Status lines: updated in place on a terminal, throttled lines otherwise."""

from __future__ import annotations

import re

import pytest


def test_status_lines_update_in_place_on_a_terminal_and_throttle_otherwise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import io

    from rich.console import Console

    from scripts.ui import StatusLines

    now = [0.0]
    plain = StatusLines(tty=False, every_s=5.0, clock=lambda: now[0])
    for second in range(13):  # a wait polled every second for 12 s, on two nodes
        now[0] = float(second)
        for node in ("a", "b"):
            plain.update(node, f"waiting ({12 - second} s left)")
    plain.update("a", "connected", final=True)
    assert capsys.readouterr().out.splitlines() == [
        "a: waiting (12 s left)",
        "b: waiting (12 s left)",
        "a: waiting (7 s left)",
        "b: waiting (7 s left)",
        "a: waiting (2 s left)",
        "b: waiting (2 s left)",
        "a: connected",
    ]
    screen = io.StringIO()
    live = StatusLines(tty=True, console=Console(file=screen, force_terminal=True, width=80))
    for second in range(13):
        for node in ("a", "b"):
            live.update(node, f"waiting ({12 - second} s left)")
    live.update("a", "connected", final=True)
    live.close()
    assert capsys.readouterr().out == ""  # nothing scrolled by: the lines were redrawn in place
    assert live.render().plain.splitlines() == ["a: connected", "b: waiting (0 s left)"]
    # the last frame: what follows the last "cursor up, erase line" of the redraw
    up, erase = "\x1b[1A", "\x1b[2K"
    assert up + erase in screen.getvalue()
    frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue().rsplit(up + erase, 1)[1])
    assert frame.splitlines() == ["a: connected", "b: waiting (0 s left)"]
