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


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("\x1b]52;c;ZWNobyBwd25lZA==\x07copied", "\\x1b]52;c;ZWNobyBwd25lZA==\\x07copied"),
        ("\x1b]0;new title\x1b\\", "\\x1b]0;new title\\x1b\\"),
        ("\x1bP+q\x1b\\ \x1b[2J\x1b[1A erased", "\\x1bP+q\\x1b\\ \\x1b[2J\\x1b[1A erased"),
        ("\x9b2J \x9d0;t\x9c", "\\x9b2J \\x9d0;t\\x9c"),
        ("bell\x07 back\x08 cr\r", "bell\\x07 back\\x08 cr"),
        (" 10%|#  \r 20%|## \r\x1b[2K 30%|###", "\\x1b[2K 30%|###"),  # the bar's last state
        ("\x1b[1;31merror\x1b[0m\tcolumns", "\x1b[1;31merror\x1b[0m\tcolumns"),  # colours stay
        ("step 10/100 | loss 2.3 é", "step 10/100 | loss 2.3 é"),
    ],
)
def test_a_nodes_line_reaches_the_terminal_without_control_sequences(
    line: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trainer or an install script on a node prints what it likes; the user's terminal gets
    colours and text, never a clipboard write (OSC 52), a title, a cursor move or an erase."""
    from scripts.job.follow import say_line

    say_line("node-0", line)
    assert capsys.readouterr().out == f"[node-0] {shown}\n"
