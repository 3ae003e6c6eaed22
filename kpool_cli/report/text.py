"""`kpool replay --format text`: which text view runs, where it goes, and the files
and progress bar around it.

Owns: `TextOutput` (one per command: the rich view on a terminal, the plain view
otherwise, the recording console behind --svg, the whole-trace page of --html
(report/trace_page.py), both written atomically at `close()`), `may_draw_rich` (known
before the replay: whether records carry cell maps), and `write_trace` (`kpool gen`'s
output). The delayed progress bar around a
replay and the other long commands (`ticker_for`, `ticking`, `progress_bar`) lives
in `ticking.py`, which imports no rich until a bar shows.

Decisions:
- stdout a terminal (and no --output file): the rich view, coloured unless
  --no-color or NO_COLOR; with --svg the same console records.
- otherwise: the plain view (report/plain.py); with --svg a second, off-screen
  recording console renders the rich view for the file (coloured unless --no-color
  or NO_COLOR) from the same single replay.
- --svg holds the ubatches' views up to SVG_RECORD_CHARS characters of text, then
  each trace's summary after a line saying where the views stopped: the file stays
  a few MB however long the run (as --html's views stop at a budget).
- --html: a page per trace (report/trace_page.py) from the same single replay: its
  pictures from every record, and each record's rich view, rendered off-screen
  (always coloured) as the terminal shows it (the same selection).
- the views never count: the caller feeds the tally (`tally.tallied`) and the
  views read it for their summary. A trace found invalid mid-replay (TraceError)
  goes through: the command ends there, exit 2, and no --html/--svg is written.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TextIO

from ..contracts.files import written_whole
from ..contracts.records import ExpectResult, OpEvent, UbatchRecord
from ..contracts.tally import Tally
from ..trace.model import Trace
from ..versions import EngineVersion
from ..wording import count, visible
from .plain import write_plain
from .select import Selection, select
from .terminal import Manners, Ticker, make_console, stream_is_terminal
from .ticking import ticker_for, ticking

if TYPE_CHECKING:
    from rich.terminal_theme import TerminalTheme

    from .trace_page import TracePage
    from .view import RichView

Record = OpEvent | UbatchRecord | ExpectResult


def may_draw_rich(html: str | None, svg: str | None, color: bool | None = None) -> bool:
    """Can a `TextOutput` draw the rich view (so the replay's records, and the memory
    budget, must carry cell maps)? With --html/--svg, when stdout is a terminal, or
    when colour is forced (--color, FORCE_COLOR)."""
    return bool(html or svg or stream_is_terminal(sys.stdout) or color_forced(color))


def color_forced(color: bool | None) -> bool:
    """--color, or FORCE_COLOR without --no-color or NO_COLOR: the rich view even when
    the output is not a terminal (a CI log that renders colour, `| less -R`)."""
    if color is not None:
        return color
    return bool(os.environ.get("FORCE_COLOR")) and "NO_COLOR" not in os.environ


def write_trace(out: TextIO, trace: Trace, ticker: Ticker) -> None:
    """`kpool gen`'s output: the trace's YAML (`trace.write.trace_pieces`, exactly
    `dump_trace`), ticking `ticker` at every piece by the ops it wrote (its total: the
    trace's ops). Create the ticker before generating, so its delay counts from the
    start of the command. Written to the terminal, the text is the progress: the bar
    never shows."""
    from ..trace.write import trace_pieces

    ticker.total = len(trace.ops)
    ticker.shares_terminal = stream_is_terminal(out)
    for text, n_ops in trace_pieces(trace):
        with ticker.hidden():
            out.write(text)
        ticker.tick(n_ops)


# characters of recorded text the --svg file holds at most: 19-61 bytes of SVG each
# (traces/server-session.yaml: 23,601 characters, 452,994 bytes; a 16-slot `kpool gen
# server` trace's coloured tables: 300,000 characters, 18.3 MB), so 2-6 MB. Past it
# the ubatches' views are neither recorded nor drawn off-screen (that trace's 150
# made a 126 MB SVG in 94 s); the summary is, after a line that says where the views
# stop and how to see the rest
SVG_RECORD_CHARS = 100_000


class TextOutput:
    def __init__(self, out: TextIO, *, color: bool | None = None, quiet: bool = False,
                 html: str | None = None, svg: str | None = None,
                 width: int | None = None) -> None:
        self.out, self.color, self.quiet, self.html, self.svg = out, color, quiet, html, svg
        # what --svg's recording holds (`_view_added`), and the ubatch it stopped before
        self._svg_chars = self._svg_segments = 0
        self.svg_stopped: tuple[str, int | None] | None = None
        self.on_terminal = out is sys.stdout and stream_is_terminal(out)
        self.pages: list[TracePage] = []
        record = bool(svg)
        self.console = None
        self.recorder = None
        if self.on_terminal or color_forced(color):
            self.console = make_console(out, Manners.detect(out, color=color, width=width),
                                        record=record)
            self.recorder = self.console if record else None
        elif record:
            shade = color if color is not None else "NO_COLOR" not in os.environ
            self.recorder = make_console(io.StringIO(), Manners(False, shade, width),
                                         record=True)

    @property
    def rich(self) -> bool:
        """Does a rich view run (so records should carry cell maps)?"""
        return self.recorder is not None or self.console is not None or bool(self.html)

    def run(self, trace: Trace, version: EngineVersion, backend: str | None,
            records: Iterable[Record], tally: Tally, selection: Selection,
            pools_all: bool = False) -> None:
        """One trace's view of `records`, the stream `tally.tallied` feeds `tally`
        from: the view reads the tally for its summary, never adds to it."""
        with ticker_for(trace, quiet=self.quiet, color=self.color,
                        shares_terminal=self.on_terminal) as ticker:
            # the bar is erased however the run ends (an interrupt included)
            self._run(trace, version, backend, ticking(records, ticker), tally, selection,
                      pools_all, ticker)

    def _run(self, trace: Trace, version: EngineVersion, backend: str | None,
             records: Iterable[Record], tally: Tally, selection: Selection,
             pools_all: bool, ticker: Ticker) -> None:
        pairs = select(records, selection, trace)
        if self.html:
            pairs = self._paged(pairs, trace, version, backend, selection, pools_all, tally)
        rich_console = self.console or self.recorder
        if rich_console is None:  # the plain view alone
            write_plain(self.out, trace, version.name, (), tally, selection=selection,
                        pairs=pairs)
            return
        from .view import RichView  # rich: imported only when a rich view is drawn

        view = RichView(rich_console, trace, version, backend, selection, pools_all)
        with ticker.hidden():
            view.start()
        if self.console is not None:  # the rich view is the output
            for rec, shown in pairs:
                if shown:
                    with ticker.hidden():
                        self._view_added(view, rec, shown, trace)
                else:
                    view.add(rec, shown)
            with ticker.hidden():
                self._record_summary()
                view.finish(tally)
            return
        # plain output, the rich view recorded for the files
        write_plain(self.out, trace, version.name, (), tally, selection=selection,
                    pairs=self._tee(pairs, view, trace))
        self._record_summary()
        view.finish(tally)

    def _tee(self, pairs: Iterable[tuple[Record, bool]], view: RichView, trace: Trace
             ) -> Iterator[tuple[Record, bool]]:
        for rec, shown in pairs:
            self._view_added(view, rec, shown, trace)
            yield rec, shown

    def _view_added(self, view: RichView, rec: Record, shown: bool, trace: Trace) -> None:
        """`view.add(rec, shown)`, which --svg's recording takes while it holds less
        than SVG_RECORD_CHARS; past that a view is drawn and not recorded, and the
        ubatch it stopped before is kept for the note `_record_summary` writes."""
        recorder = self.recorder
        if recorder is None or not shown:
            view.add(rec, shown)
            return
        recorder.record = self._svg_chars <= SVG_RECORD_CHARS
        # off-screen, a view the file will not hold is not drawn: counted as not shown
        view.add(rec, shown and (recorder.record or recorder is self.console))
        if not recorder.record:
            if self.svg_stopped is None:
                self.svg_stopped = (trace.path,
                                    rec.index if isinstance(rec, UbatchRecord) else None)
            return
        buffer = recorder._record_buffer  # rich's recording: its segments, in order
        self._svg_chars += sum(len(seg.text) for seg in buffer[self._svg_segments:])
        self._svg_segments = len(buffer)

    def _record_summary(self) -> None:
        """The recording takes a trace's summary whatever the views took, after a line
        (once) saying where the views stopped and how to see the rest."""
        recorder = self.recorder
        if recorder is None:
            return
        recorder.record = True
        if self.svg_stopped is not None:
            path, first = self.svg_stopped
            note = f"--svg: the views stop here, at {count(SVG_RECORD_CHARS)} characters"
            if first is not None:
                note = (f"--svg: the views stop before ubatch {first}, at "
                        f"{count(SVG_RECORD_CHARS)} characters: kpool replay {visible(path)} "
                        f"--ubatch {first}.. --svg FILE records the rest")
            # into the recording alone: on a terminal the console is also the output,
            # where the views went on
            from rich.text import Text

            with recorder._record_buffer_lock:
                recorder._record_buffer.extend(recorder.render(Text(note)))
            self.svg_stopped = None
        self._svg_segments = len(recorder._record_buffer)

    def _paged(self, pairs: Iterable[tuple[Record, bool]], trace: Trace,
               version: EngineVersion, backend: str | None, selection: Selection,
               pools_all: bool, tally: Tally) -> Iterator[tuple[Record, bool]]:
        """`pairs`, each also fed to this trace's page with the HTML of its rich view
        (a console of its own, off-screen, 100 columns)."""
        from ..replay import planned_ubatches
        from .trace_page import TracePage
        from .view import RichView

        console = make_console(io.StringIO(), Manners(False, True, PAGE_COLUMNS), record=True)
        view = RichView(console, trace, version, backend, selection, pools_all)
        page = TracePage(trace, version.name, version.description, backend,
                         planned_ubatches(trace))
        self.pages.append(page)
        empty = PAGE_PRE.format(code="")
        for rec, shown in pairs:
            fragment = ""
            if not page.views_full:  # past the budget no view is kept: none is drawn
                view.add(rec, shown)
                fragment = console.export_html(theme=page_theme(), clear=True,
                                               inline_styles=True, code_format=PAGE_PRE)
            page.add(rec, "" if fragment == empty else fragment)
            yield rec, shown
        page.tally = tally
        view.finish(tally)  # the folded repeats, and the summary the terminal ends with
        page.closing = console.export_html(theme=page_theme(), clear=True,
                                           inline_styles=True, code_format=PAGE_PRE)

    def close(self) -> None:
        """Write --html / --svg (atomically) and flush the output, so a reader that
        left (`| head`) is noticed here, not at interpreter exit."""
        # both appear or neither: each is renamed into place only once both are
        # written, and a failure or an interrupt removes both temporaries
        with contextlib.ExitStack() as files:
            if self.svg and self.recorder is not None:
                files.enter_context(written_whole(self.svg)).write(
                    self.recorder.export_svg(title="kpool replay", clear=True,
                                             code_format=offline_svg_format()))
            if self.html:
                from .trace_page import write_pages

                write_pages(files.enter_context(written_whole(self.html)), self.pages)
        self.out.flush()


# --svg / --html are self-contained: a CI artifact or a bug report shows the same
# offline. rich's SVG template fetches Fira Code from a CDN (@font-face url()s): it is
# left out for local monospace fonts, Fira Code first if installed (the text keeps
# its cell widths: rich gives every run a textLength). The page's views get the same
# fonts.
MONOSPACE = ('"Fira Code", "DejaVu Sans Mono", Menlo, Consolas, "Liberation Mono", '
             '"Courier New", monospace')
MONOSPACE_HTML = MONOSPACE.replace('"', "'")
PAGE_COLUMNS = 100  # the width of the views a page embeds
# a view's HTML on the page: rich's own spans in a <pre> of the local monospace fonts
PAGE_PRE = ('<pre style="font-family:' + MONOSPACE_HTML + ';font-size:13px;line-height:1.25">'
            "{code}</pre>")


# the page's views on its white ground: rich's default theme but for its bright
# colours, which it draws at full strength (bright green, yellow and cyan, the seq
# colours of sequences 5 to 7, cannot be read on white): the same hues, darker.
# bright_white stays white, only ever text on a coloured ground (a shared cell).
_PAGE_BRIGHT = ((102, 102, 102), (204, 0, 0), (0, 140, 0), (150, 120, 0), (0, 60, 230),
                (180, 0, 180), (0, 130, 160), (255, 255, 255))


@functools.cache
def page_theme() -> TerminalTheme:
    from rich.terminal_theme import DEFAULT_TERMINAL_THEME, TerminalTheme

    normal = [(c.red, c.green, c.blue) for c in
              (DEFAULT_TERMINAL_THEME.ansi_colors[i] for i in range(8))]
    return TerminalTheme((255, 255, 255), (0, 0, 0), normal, list(_PAGE_BRIGHT))


@functools.cache
def offline_svg_format() -> str:
    from rich.console import CONSOLE_SVG_FORMAT

    fmt = re.sub(r"[ \t]*@font-face \{\{.*?\}\}\n?", "", CONSOLE_SVG_FORMAT, flags=re.S)
    fmt = re.sub(r"font-family: Fira Code, monospace;", f"font-family: {MONOSPACE};", fmt)
    # its own size, as well as its viewBox: a browser opens a long replay at that size
    # and scrolls, where a viewBox alone shrinks the whole run to fit the window
    fmt = fmt.replace('<svg class="rich-terminal" viewBox=',
                      '<svg class="rich-terminal" width="{width}" height="{height}" viewBox=', 1)
    return re.sub(r"(<!-- Generated with Rich) https?://[^ ]* -->", r"\1 -->", fmt)


