"""The delayed progress bar on stderr, as the commands use it: around a replay
(`ticker_for`, `ticking`) and around the other long commands (`progress_bar`:
`kpool diff`, `check`, `validate`, `gen`; `ticking_each`). Never when stdout is a
pipe, stderr is not a terminal, or with --quiet: a disabled `Ticker` then, and rich
is not imported (`terminal.py`), so a JSON replay or a `validate` piped to a file
does not pay for it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from ..contracts.records import ExpectResult, OpEvent, UbatchRecord
from ..replay import planned_ubatches
from ..trace.model import Trace
from ..wording import visible
from .terminal import Manners, Ticker, make_console, stream_is_pipe, stream_is_terminal

Record = OpEvent | UbatchRecord | ExpectResult
T = TypeVar("T")


def ticker_for(trace: Trace, *, quiet: bool, color: bool | None, shares_terminal: bool
               ) -> Ticker:
    """The progress bar of one replay (a disabled one when it must not show, which
    does not split the trace's decodes to count its ubatches)."""
    total = planned_ubatches(trace) if _shows(quiet) else 0
    return progress_bar(total, visible(trace.name or trace.path),
                        quiet=quiet, color=color, shares_terminal=shares_terminal)


def _shows(quiet: bool) -> bool:
    """Whether a bar shows: not with --quiet, when stderr is not a terminal, or when
    stdout is a pipe."""
    return not quiet and stream_is_terminal(sys.stderr) and not stream_is_pipe(sys.stdout)


def progress_bar(total: int, label: str, *, unit: str = "ubatches", quiet: bool = False,
                 color: bool | None = None, shares_terminal: bool = False) -> Ticker:
    """The delayed progress bar of any long command (a replay's, `kpool diff`'s
    replays, `kpool gen`'s writing, `kpool check`, `kpool validate`): on stderr, never
    with --quiet, when stderr is not a terminal, or when stdout is a pipe (a disabled
    ticker then). `label` is shown as given: make it visible first."""
    err = sys.stderr
    console = make_console(err, Manners.detect(err, color=color)) if _shows(quiet) else None
    return Ticker(console, total, label, shares_terminal=shares_terminal, unit=unit)


def ticking(records: Iterable[Record], ticker: Ticker, *, close: bool = True
            ) -> Iterator[Record]:
    """`records`, ticking the bar at every ubatch; the bar is erased at the end (unless
    not `close`: a bar over several replays)."""
    try:
        for rec in records:
            if isinstance(rec, UbatchRecord):
                ticker.tick()
            yield rec
    finally:
        if close:
            ticker.close()


def ticking_each(items: Iterable[T], ticker: Ticker) -> Iterator[T]:
    """`items` (made as they are asked for: `kpool check`'s results), ticking the bar at
    each; while the caller writes one the bar is off the terminal it may share
    (`Ticker.hidden`), and it is erased once the items end, before the caller writes
    what follows them."""
    try:
        for item in items:
            ticker.tick()
            with ticker.hidden():
                yield item
    finally:
        ticker.close()
