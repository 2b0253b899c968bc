"""Colour on the terminal: only on a tty, never with ``NO_COLOR`` set or ``TERM=dumb``
(https://no-color.org), so logs and pipes get plain text."""
from __future__ import annotations

import os
from typing import TextIO

STYLES = {"ok": "32", "warn": "33", "error": "31;1", "bold": "1"}


def colour_on(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def paint(text: str, style: str, stream: TextIO) -> str:
    """``text`` in ``style`` (ok, warn, error, bold) when ``stream`` shows colour."""
    if not colour_on(stream):
        return text
    return f"\033[{STYLES[style]}m{text}\033[0m"
