"""`kpool replay TRACE --html FILE`: a whole replay at a glance, as one self-contained
page.

Owns: `TracePage` (fed every record of one replay, and the HTML of what the rich view
printed for it; writes its part of the page), `write_pages` (the document around the
pages of one command) and the page's pictures:
- the timeline: per bin of ubatches, tokens, pools marked, scatter entries and cells
  scanned (each the largest of the bin, tokens summed), a mark per finding code
  (coloured by code: a dot per bin for a ubatch's findings, a diamond per bin at the
  op for an op's, an edit's or a refused decode's, between the ubatches it came
  between) and a tick per edit or refused decode, each a link to the view of its
  ubatch (an op's: the view it is part of, before its next ubatch's);
- the cell map over time: rows of cells (runs of rows) by bins of ubatches, each
  square the state of its rows at the end of its bin (empty, one sequence in its
  colour, shared), with the rows a token was written to and the rows a finding names
  outlined, under a key of its colours;
- the view: for each ubatch, what `kpool replay` prints in a terminal.

Invariants: the page embeds everything it shows (inline CSS and SVG, no script, no
font, no request: it opens offline, with JavaScript off); text from the trace goes
through `html.escape` after `wording.visible` (the rich view's HTML escapes its own);
the pictures hold at most `MAX_BINS` bins of ubatches and `MAX_ROW_BINS` bins of rows
whatever the run's size (a bin's value is the largest of its ubatches); the views stop
at `VIEW_BUDGET` bytes (no view is drawn after), and the page says where and how to
see the rest.
"""

from __future__ import annotations

import bisect
import html
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np

from .. import wording as words
from ..contracts.records import SEQ_EMPTY, SEQ_SHARED, ExpectResult, OpEvent, UbatchRecord
from ..contracts.tally import Tally
from ..trace.model import Trace
from ..verdict.codes import CODES
from ..wording import visible

MAX_BINS = 400  # ubatch bins of the timeline and the cell map
MAX_ROW_BINS = 96  # row bins of the cell map
VIEW_BUDGET = 3 << 20  # bytes of per-ubatch views, at most
SEQ_COLOURS = ("#17becf", "#2ca02c", "#bcbd22", "#1f77b4", "#e377c2", "#9edae5", "#98df8a",
               "#dbdb8d", "#aec7e8", "#f7b6d2")
SHARED_COLOUR, EMPTY_COLOUR = "#d62728", "#eeeeee"
# a finding's mark: the colour of its code's place in the registry
CODE_PALETTE = ("#d62728", "#9467bd", "#ff7f0e", "#8c564b", "#000000", "#7f7f7f", "#e377c2",
                "#bcbd22", "#17becf", "#1f77b4")
SERIES = (("tokens", "tokens"), ("pools marked", "marked"), ("scatter entries", "entries"),
          ("cells scanned", "scanned"))
W, H, PAD = 820, 56, 96  # a timeline panel's plot area and its left margin (px)

STYLE = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 6px}
p.meta{color:#555;margin:2px 0} svg{display:block;margin:4px 0}
svg text{font:11px system-ui,sans-serif;fill:#444} .key span{margin-right:14px}
section.view{margin:8px 0;border-top:1px solid #eee} section.view pre{margin:0}
section.view h3{font-size:13px;margin:10px 0 2px}
"""


def _code_colour(code: str) -> str:
    order = list(CODES)
    return CODE_PALETTE[order.index(code) % len(CODE_PALETTE)] if code in CODES else "#000000"


def _e(text: object) -> str:
    return html.escape(visible(str(text)), quote=True)


@dataclass(slots=True)
class _Bin:
    first: int  # the first ubatch index in the bin
    tokens: int = 0
    marked: int = 0
    entries: int = 0
    scanned: int = 0
    codes: Counter = field(default_factory=Counter)
    at: dict[str, int] = field(default_factory=dict)  # code -> its first ubatch here


@dataclass(slots=True)
class _OpMark:
    """The findings of one code raised at ops (not ubatches) within one bin: the first
    op's place and how many."""

    op: int
    kind: str
    ubatch: int  # the ubatch the op came before (the run's ubatches so far)
    count: int = 0


@dataclass(slots=True)
class TracePage:
    """One replay's page: `add` each record (with the rich view's HTML for it), then
    `write`. `planned` is the number of ubatches the trace splits into
    (`replay.planned_ubatches`), which sizes the bins before the first record."""

    trace: Trace
    engine: str
    description: str
    backend: str | None
    planned: int
    bins: list[_Bin] = field(default_factory=list)
    per: int = 1
    events: list[tuple[int, int, str, str, str]] = field(default_factory=list)
    # (code, bin of the ubatch the op came before) -> the findings ops raised there
    op_marks: dict[tuple[str, int], _OpMark] = field(default_factory=dict)
    columns: list[np.ndarray] = field(default_factory=list)  # row-bin states per bin
    written: list[np.ndarray] = field(default_factory=list)  # row bins written per bin
    flagged: list[np.ndarray] = field(default_factory=list)  # row bins a finding names
    rows_per: int = 1
    n_row_bins: int = 0
    views: list[tuple[int, str]] = field(default_factory=list)  # (ubatch, html)
    view_bytes: int = 0
    stopped_at: int | None = None  # the ubatch whose view did not fit the budget
    ubatches: int = 0
    tally: Tally | None = None  # the replay's, once its last record went by
    closing: str = ""  # the view's end: the repeats it folded, its summary
    _kept: list[int] = field(default_factory=list)  # the ubatches with a view, sorted
    key: str = ""  # before its ids, when a document holds several pages ("t1-")
    _last: tuple[int, np.ndarray] | None = None  # (bin, cells) of the last ubatch seen

    def __post_init__(self) -> None:
        self.per = max(1, -(-self.planned // MAX_BINS))
        n_rows = self.trace.cache.n_rows
        self.rows_per = max(1, -(-n_rows // MAX_ROW_BINS))
        self.n_row_bins = -(-n_rows // self.rows_per)

    # -- records -----------------------------------------------------------------------

    def add(self, rec: OpEvent | UbatchRecord | ExpectResult, view_html: str = "") -> None:
        if isinstance(rec, UbatchRecord):
            self._ubatch(rec)
            self._view(rec.index, view_html)
        elif isinstance(rec, OpEvent) and rec.kind != "note":
            if len(self.events) < 20 * MAX_BINS:
                self.events.append((self.ubatches, rec.op, rec.kind, rec.status,
                                    ", ".join(dict.fromkeys(f.code for f in rec.findings))))
            for f in rec.findings:  # a mark per code and bin, as a ubatch's findings
                mark = self.op_marks.setdefault((f.code, self.ubatches // self.per),
                                                _OpMark(rec.op, rec.kind, self.ubatches))
                mark.count += 1
            self._view(self.ubatches, view_html)
        else:
            self._view(self.ubatches, view_html)

    def _ubatch(self, rec: UbatchRecord) -> None:
        k = rec.index // self.per
        while len(self.bins) <= k:
            self.bins.append(_Bin(len(self.bins) * self.per))
            self.written.append(np.zeros(self.n_row_bins, dtype=bool))
            self.flagged.append(np.zeros(self.n_row_bins, dtype=bool))
        b = self.bins[k]
        b.tokens += rec.n_tokens
        b.marked = max(b.marked, rec.n_new)
        b.entries = max(b.entries, rec.n_new_g)
        b.scanned = max(b.scanned, int(rec.cost.get("cells_scanned", 0)))
        for f in rec.findings:
            b.codes[f.code] += 1
            b.at.setdefault(f.code, rec.index)
            if f.rows:
                self.flagged[k][f.rows.array // self.rows_per] = True
        self.written[k][np.asarray(rec.token_rows, dtype=np.int64) // self.rows_per] = True
        if rec.cell_map is not None:  # a bin shows its last ubatch's cells: folded later
            if self._last is not None and self._last[0] != k:
                self._fold_cells()
            self._last = (k, rec.cell_map.seq)
        self.ubatches += 1

    def _fold_cells(self) -> None:
        """The cells of the last ubatch seen, as its bin's column of row bins: shared
        if a row is, else the lowest sequence, else empty."""
        if self._last is None:
            return
        k, seq = self._last
        self._last = None
        seq = seq.astype(np.int16, copy=False)  # CellMap.seq's own dtype: no copy
        n = self.n_row_bins * self.rows_per
        if seq.size < n:  # the last row bin is short: empty rows fill it
            seq = np.concatenate([seq, np.full(n - seq.size, SEQ_EMPTY, np.int16)])
        grid = seq.reshape(self.n_row_bins, self.rows_per)
        # read unsigned, SEQ_EMPTY and SEQ_SHARED are above every seq id: a bin's least
        # code is its lowest sequence when it holds one (two passes over the int16s)
        least = grid.view(np.uint16).min(axis=1).astype(np.int32)
        no_seq = least >= np.int16(SEQ_SHARED).astype(np.uint16)
        state = np.where((grid == SEQ_SHARED).any(axis=1), SEQ_SHARED,
                         np.where(no_seq, SEQ_EMPTY, least))
        while len(self.columns) <= k:  # a bin with no cell map shows the next one's
            self.columns.append(state)
        self.columns[k] = state

    @property
    def views_full(self) -> bool:
        """The views reached their budget: no more is kept."""
        return self.stopped_at is not None

    def _view(self, ubatch: int, fragment: str) -> None:
        if not fragment or self.views_full:
            return
        if self.view_bytes + len(fragment) > VIEW_BUDGET:
            self.stopped_at = ubatch
            return
        self.view_bytes += len(fragment)
        if self.views and self.views[-1][0] == ubatch:  # an op's view, then its ubatch's
            self.views[-1] = (ubatch, self.views[-1][1] + fragment)
        else:
            self.views.append((ubatch, fragment))

    # -- the page ----------------------------------------------------------------------

    @property
    def title(self) -> str:
        return f"kpool replay: {_e(self.trace.name or self.trace.path)} under {_e(self.engine)}"

    def write(self, out: TextIO) -> None:
        """The page's body (`write_pages` writes the document around it)."""
        t, s = self.trace, (self.tally or Tally()).summary()
        found = ", ".join(words.code_count(c, n) for c, n in s["findings"].items()) or "no findings"
        out.write(f"<article><h1>{self.title}</h1>")
        out.write(f'<p class="meta">{_e(t.path)}: {words.count(s["ubatches"])} ubatches, '
                  f'{words.count(s["tokens"])} tokens, {words.count(s["pools_marked"])} pools '
                  f'marked; '
                  f'{_e(found)}; {_e(s["status"].upper())}</p>')
        if t.description:
            out.write('<p class="meta" style="white-space:pre-line"><i>'
                      f"{html.escape(visible(t.description.strip(), keep_newlines=True))}"
                      "</i></p>")
        cfg = ", ".join(f"{k} {json.dumps(v)}" for k, v in t.cache.as_dict().items())
        out.write(f'<p class="meta">engine {_e(self.engine)} ({_e(self.description)}); '
                  f'backend {_e(self.backend or "none")}; cache: {_e(cfg)}</p>')
        out.write("<h2>timeline</h2>")
        out.write(f'<p class="meta">{self._bin_words()}; a finding is a dot at its '
                  "ubatch, or a diamond at the op (an edit, a refused decode) that raised "
                  "it, between the ubatches it came between; a mark or a tick links to "
                  "its view below</p>")
        out.write(self._timeline())
        out.write("<h2>cells over time</h2>")
        out.write(f'<p class="meta">{self._cell_words()}</p>')
        out.write(self._cell_key())
        out.write(self._cell_map())
        out.write("<h2>the view, ubatch by ubatch</h2>")
        if self.stopped_at is not None:
            first = self.stopped_at
            out.write(f'<p class="meta">the views stop at {VIEW_BUDGET >> 20} MiB of them, '
                      f"before ubatch {first}: <code>kpool replay {_e(t.path)} --ubatch "
                      f"{first}..</code> shows the rest</p>")
        for ubatch, fragment in self.views:
            out.write(f'<section class="view" id="{self.key}u{ubatch}">{fragment}</section>')
        out.write(f'<section class="view" id="{self.key}summary">{self.closing}</section>'
                  "</article>")

    def _bin_words(self) -> str:
        return ("one column per ubatch" if self.per == 1
                else f"a column is {words.count(self.per)} ubatches (the largest of them; "
                "tokens summed)")

    def _cell_words(self) -> str:
        rows = "a row is one cell" if self.rows_per == 1 else (
            f"a row is {words.count(self.rows_per)} cells (shared if one is, else the first "
            "sequence)")
        return (f"{rows}; {self._bin_words()}; colour: the sequence holding it, red "
                "shared, grey empty; outlined: written by a token (blue) or named by a "
                "finding (red)")

    def _cell_key(self) -> str:
        """The cell map's colours: each sequence's (they repeat past
        len(SEQ_COLOURS) sequences), shared and empty."""
        n = self.trace.cache.n_seq_max
        own = min(n, len(SEQ_COLOURS))
        keys = [(SEQ_COLOURS[s], f"seq {s}") for s in range(own)]
        keys += [(SHARED_COLOUR, "shared"), (EMPTY_COLOUR, "empty")]
        spans = [f'<span><span style="display:inline-block;width:10px;height:10px;'
                 f'background:{c};border:1px solid #999;margin-right:4px"></span>{label}'
                 "</span>" for c, label in keys]
        if n > own:
            spans.insert(own, f"<span>seq {own} and up: these colours again, from seq 0's"
                         "</span>")
        return f'<p class="key">{"".join(spans)}</p>'

    def _anchor(self, ubatch: int) -> str:
        """The view a mark at `ubatch` links to: its own, else the last one kept before it
        (the view folds repeated ubatches into the first; past the budget none is kept),
        else the view's end."""
        at = bisect.bisect_right(self._kept, ubatch) - 1
        return f"#{self.key}u{self._kept[at]}" if at >= 0 else f"#{self.key}summary"

    def _x(self, k: int) -> float:
        return PAD + k * W / max(len(self.bins), 1)

    def _op_x(self, ubatch: int) -> float:
        """Where an op sits: the left edge of the ubatch it came before (after the last
        ubatch, the timeline's end)."""
        return PAD + min(ubatch / self.per, len(self.bins)) * W / max(len(self.bins), 1)

    def _timeline(self) -> str:
        self._kept = sorted({u for u, _ in self.views})
        n = max(len(self.bins), 1)
        bw = W / n
        parts = []
        for label, attr in SERIES:
            top = max((getattr(b, attr) for b in self.bins), default=0)
            bars = []
            for k, b in enumerate(self.bins):
                v = getattr(b, attr)
                if v <= 0:
                    continue
                h = max(1.0, v / top * (H - 4)) if top else 0
                bars.append(f'<a href="{self._anchor(b.first)}"><rect x="{self._x(k):.2f}" '
                            f'y="{H - h:.2f}" width="{max(bw - 0.3, 0.6):.2f}" '
                            f'height="{h:.2f}" fill="#4c78a8"><title>ubatch {b.first}'
                            f'{"" if self.per == 1 else f" (+{self.per - 1})"}: {label} '
                            f"{words.count(v)}</title></rect></a>")
            parts.append(self._svg(H, f'<text x="{PAD - 6}" y="{H / 2 + 4:.0f}" '
                                      f'text-anchor="end">{label}</text>'
                                      f'<text x="{PAD - 6}" y="10" text-anchor="end" '
                                      f'class="top">{words.count(top)}</text>'
                                      + "".join(bars)))
        codes = sorted({c for b in self.bins for c in b.codes}
                       | {c for c, _ in self.op_marks})
        rows = max(len(codes), 1)
        marks = []
        for r, code in enumerate(codes):
            y = 8 + r * 14
            marks.append(f'<text x="{PAD - 6}" y="{y + 4}" text-anchor="end">{code}</text>')
            for k, b in enumerate(self.bins):
                if code in b.codes:
                    at = b.at[code]
                    marks.append(f'<a href="{self._anchor(at)}"><circle class="finding" '
                                 f'data-code="{code}" data-ubatch="{at}" '
                                 f'cx="{self._x(k) + bw / 2:.2f}" cy="{y}" '
                                 f'r="{min(5.0, max(2.0, bw / 2)):.1f}" '
                                 f'fill="{_code_colour(code)}"><title>{code} '
                                 f"{_e(CODES[code].name) if code in CODES else ''} x"
                                 f"{b.codes[code]} from ubatch {at}</title></circle></a>")
            for (c, _), m in self.op_marks.items():
                if c != code:
                    continue
                x, d = self._op_x(m.ubatch), 4.5
                marks.append(f'<a href="{self._anchor(m.ubatch)}"><path class="finding op" '
                             f'data-code="{code}" data-op="{m.op}" data-ubatch="{m.ubatch}" '
                             f'd="M{x:.2f} {y - d}L{x + d:.2f} {y}L{x:.2f} {y + d}'
                             f'L{x - d:.2f} {y}Z" fill="{_code_colour(code)}" stroke="#fff" '
                             f'stroke-width="0.8"><title>{code} '
                             f"{_e(CODES[code].name) if code in CODES else ''} x{m.count} "
                             f"at op {m.op} ({_e(m.kind)}), before ubatch {m.ubatch}"
                             "</title></path></a>")
        parts.append(self._svg(16 + rows * 14, "".join(marks) if codes else
                               f'<text x="{PAD}" y="12">no findings</text>'))
        ticks = []
        for ub, op, kind, status, fcodes in self.events:
            x = self._op_x(ub)
            colour = "#7f7f7f" if status == "applied" else "#d62728"
            ticks.append(f'<a href="{self._anchor(ub)}"><line class="event" data-op="{op}" '
                         f'x1="{x:.2f}" x2="{x:.2f}" y1="2" y2="18" stroke="{colour}">'
                         f"<title>op {op} "
                         f"{_e(kind)} {_e(status)}{' ' + _e(fcodes) if fcodes else ''}, "
                         f"before ubatch {ub}</title></line></a>")
        parts.append(self._svg(22, f'<text x="{PAD - 6}" y="14" text-anchor="end">edits</text>'
                               + "".join(ticks)))
        return "".join(parts)

    def _svg(self, height: float, body: str) -> str:
        return (f'<svg width="{PAD + W + 10}" height="{height:.0f}" viewBox="0 0 {PAD + W + 10} '
                f'{height:.0f}" xmlns="http://www.w3.org/2000/svg">{body}</svg>')

    def _cell_map(self) -> str:
        self._fold_cells()
        if not self.columns:
            return '<p class="meta">no ubatch ran</p>'
        n = len(self.bins)
        bw = W / max(n, 1)
        rh = max(2.0, min(8.0, 480 / self.n_row_bins))
        cells = []
        for k, state in enumerate(self.columns):
            x = self._x(k)
            # a rect per run of row bins that look alike (a column is mostly runs)
            looks = [(v, bool(f), bool(w)) for v, f, w in
                     zip(state.tolist(), self.flagged[k].tolist(), self.written[k].tolist(),
                         strict=True)]
            r = 0
            while r < len(looks):
                end = r + 1
                while end < len(looks) and looks[end] == looks[r]:
                    end += 1
                v, flagged, written = looks[r]
                colour = (EMPTY_COLOUR if v == SEQ_EMPTY else SHARED_COLOUR if v == SEQ_SHARED
                          else SEQ_COLOURS[v % len(SEQ_COLOURS)])
                edge = "#d62728" if flagged else "#1f3b73" if written else ""
                stroke = f' stroke="{edge}" stroke-width="1"' if edge else ""
                cells.append(f'<rect x="{x:.2f}" y="{r * rh:.2f}" width="{max(bw, 0.6):.2f}" '
                             f'height="{(end - r) * rh:.2f}" fill="{colour}"{stroke}/>')
                r = end
        return self._svg(self.n_row_bins * rh + 4, "".join(cells)
                         + f'<text x="{PAD - 6}" y="10" text-anchor="end">row 0</text>'
                         f'<text x="{PAD - 6}" y="{self.n_row_bins * rh:.0f}" '
                         f'text-anchor="end">row {self.trace.cache.n_rows - 1}</text>')


def write_pages(out: TextIO, pages: list[TracePage]) -> None:
    """One document holding each trace's page, in order."""
    title = pages[0].title if len(pages) == 1 else f"kpool replay: {len(pages)} traces"
    out.write("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
              f"<title>{title}</title><style>{STYLE}</style></head><body>")
    for n, page in enumerate(pages):
        page.key = f"t{n}-" if len(pages) > 1 else ""
        page.write(out)
    out.write("</body></html>\n")
