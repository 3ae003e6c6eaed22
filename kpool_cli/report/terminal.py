"""Terminal manners, decided in one place (STYLE.md §4, hatch's `Terminal`).

Owns: `Manners` (is the output a terminal, colour or not, width) and
`make_console`, the only constructor of rich consoles in kpool. Consoles have
markup, emoji and highlighting off, so trace text (names, notes) can never be
read as rich markup. Colour is tri-state: `--color/--no-color` wins, then
NO_COLOR (any value: off), then FORCE_COLOR (on), then "is it a terminal".
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console


@dataclass(frozen=True, slots=True)
class Manners:
    is_terminal: bool
    color: bool
    width: int | None  # None: the terminal's own (80 when unknown)

    @staticmethod
    def detect(stream: TextIO | None = None, *, color: bool | None = None,
               width: int | None = None) -> Manners:
        stream = stream or sys.stdout
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        if color is None:
            if "NO_COLOR" in os.environ:
                color = False
            elif os.environ.get("FORCE_COLOR"):
                color = True
            else:
                color = tty
        return Manners(tty, color, width)


def make_console(file: TextIO | None, manners: Manners, *, record: bool = False) -> Console:
    return Console(
        file=file,
        width=manners.width,
        color_system="auto" if manners.color else None,
        force_terminal=manners.color or None,
        no_color=not manners.color,
        markup=False,
        emoji=False,
        highlight=False,
        record=record,
        soft_wrap=False,
    )
