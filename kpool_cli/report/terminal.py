"""Terminal manners, decided in one place (DESIGN.md "The command line", hatch's
`Terminal`).

Owns: `Manners` (is the output a terminal, colour or not, width),
`make_console`, the only constructor of rich consoles in kpool, and `Ticker`, the
delayed progress bar on stderr. Consoles have
markup, emoji and highlighting off, so trace text (names, notes) can never be
read as rich markup. Colour is tri-state: `--color/--no-color` wins, then
NO_COLOR (any value: off), then FORCE_COLOR (on), then "is it a terminal". Width:
the caller's, else COLUMNS, else the terminal's, else 80 (`console_width`); COLUMNS
is the environment's, so a width from it is kept within `MIN_COLUMNS` ..
`MAX_COLUMNS` (COLUMNS=0 drew nothing; a width of a hundred million took minutes and
gigabytes), and one that is not a positive number is not read; LINES likewise gives
the height (`console_height`), which every console is handed, so rich reads neither.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # rich: imported when a console is made or a bar shows
    from rich.console import Console
    from rich.progress import Progress, TaskID


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


@cache
def _console_class() -> type[Console]:
    """rich's Console, except that a reader who left (`| head`) is reported as the
    BrokenPipeError it is: rich's own answer is `SystemExit(1)`, and 1 means findings.
    (Made at the first console: a command that draws nothing never imports rich.)"""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _Console


MIN_COLUMNS = 20
MAX_COLUMNS = 1000


MIN_LINES = 5
MAX_LINES = 10000


def env_columns() -> int | None:
    """COLUMNS when it is a positive number, kept within MIN_COLUMNS .. MAX_COLUMNS;
    else None."""
    return _env_size("COLUMNS", MIN_COLUMNS, MAX_COLUMNS)


def _env_size(name: str, lo: int, hi: int) -> int | None:
    """Environment variable `name` when it is a positive number, kept within lo .. hi;
    else None."""
    got = os.environ.get(name, "").strip().lstrip("0")
    if not got or not (got.isascii() and got.isdigit()):
        return None
    # past hi's digits it is past hi: no int of thousands of digits
    return hi if len(got) > len(str(hi)) else min(max(int(got), lo), hi)


def console_height(stream: TextIO) -> int:
    """The lines a console on `stream` has: LINES, else the terminal's, else 25, as
    `console_width`. Given to every console, so rich never reads LINES (or COLUMNS)
    itself: it would parse a number of any length."""
    return _console_size(stream, "LINES", 1, MIN_LINES, MAX_LINES, 25)


def console_width(stream: TextIO) -> int:
    """The columns a console on `stream` draws in: COLUMNS, else the terminal's, else
    80 (the module's invariants)."""
    return _console_size(stream, "COLUMNS", 0, MIN_COLUMNS, MAX_COLUMNS, 80)


def _console_size(stream: TextIO, name: str, axis: int, lo: int, hi: int, default: int
                  ) -> int:
    """Environment variable `name` (`_env_size`), else the terminal's size on `axis`
    (0 columns, 1 lines) kept within lo .. hi, else `default`."""
    got = _env_size(name, lo, hi)
    if got is not None:
        return got
    if stream_is_terminal(stream):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            size = os.get_terminal_size(stream.fileno())[axis]
            if size > 0:
                return min(max(size, lo), hi)
    return default


def make_console(file: TextIO | None, manners: Manners, *, record: bool = False) -> Console:
    return _console_class()(
        file=file,
        width=manners.width if manners.width is not None else console_width(file or sys.stdout),
        height=console_height(file or sys.stdout),
        color_system="auto" if manners.color else None,
        force_terminal=manners.color or None,
        no_color=not manners.color,
        markup=False,
        emoji=False,
        highlight=False,
        record=record,
        soft_wrap=False,
    )


def stream_is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def stream_is_pipe(stream: TextIO) -> bool:
    """A pipe (`| head`, `| less`), as opposed to a terminal or a file."""
    try:
        return stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, ValueError, OSError):
        return False


class Ticker:
    """A progress bar on stderr for long replays (and other long work: `unit` names
    what it counts; `label`, `unit`, `total` and `done` may change between ticks).

    It appears only once `delay` seconds have passed without output on the terminal
    (a replay that finishes sooner, or that prints as it goes, never shows one), is
    erased when done, and refreshes from the caller's thread at most 10 times a
    second, so it never writes while the view does. `hidden()` takes it off the
    screen while the view prints to the same terminal. A disabled ticker (`console`
    None: --quiet, stderr not a terminal, stdout a pipe) does nothing. As a context
    manager it is erased however the block ends (an interrupt included)."""

    def __init__(self, console: Console | None, total: int, label: str, *,
                 delay: float = 1.0, shares_terminal: bool = False,
                 unit: str = "ubatches") -> None:
        self.console, self.total, self.label, self.unit = console, total, label, unit
        self.delay, self.shares_terminal = delay, shares_terminal
        self.done = 0
        self._quiet_since = time.monotonic()
        self._last_refresh = 0.0
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def tick(self, n: int = 1) -> None:
        self.done += n
        if self.console is None:
            return
        now = time.monotonic()
        if self._progress is None:
            if now - self._quiet_since < self.delay:
                return
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                # a label quotes a trace's name: never rich markup ("[/]" would raise)
                TextColumn("{task.description}", markup=False), BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[unit]}"), TimeElapsedColumn(),
                console=self.console, transient=True, auto_refresh=False,
                redirect_stdout=False, redirect_stderr=False)
            self._task = self._progress.add_task(self.label, total=max(self.total, self.done),
                                                 unit=self.unit)
            self._progress.start()
        if now - self._last_refresh >= 0.1 and self._task is not None:
            self._last_refresh = now
            self._progress.update(self._task, completed=self.done,
                                  total=max(self.total, self.done), description=self.label,
                                  unit=self.unit)
            self._progress.refresh()

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    @contextlib.contextmanager
    def hidden(self) -> Iterator[None]:
        """Around output to the terminal the bar shares: erase it, restart the clock."""
        if self.shares_terminal:
            self._stop()
        try:
            yield
        finally:
            if self.shares_terminal:
                self._quiet_since = time.monotonic()

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> Ticker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
