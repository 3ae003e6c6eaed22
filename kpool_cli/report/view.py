"""The rich view of a replay: what a developer reads in a terminal while chasing a
cache bug. With terminal.py, the only module that imports rich.

Owns: `RichView` (fed `(record, shown)` pairs from `select.select`, it prints a
header per trace, one block per shown ubatch, the events between them and a
closing summary), `cell_map_lines` (the folded picture of the cache, as llama.cpp's
debug dump draws it: ENGINE.md §2), `print_explanation` / `print_code_list` for
`kpool explain`, and `Flow`, the text whose lines break only between
`wording.units` (a stale position, `5 x3`, a label and its value never split), so
that nothing fits 80 columns by breaking an item in two.

It sees only records and the Trace (DESIGN.md). It never decides what is shown
(select.py does), never owns a console (terminal.make_console does), never counts
(the tally it reads at `finish` is fed by the caller) and never words a range, a
list, a pool, a stale position or a code itself (`kpool_cli.wording` does: ranges
are half-open `A..B`, as positions are written in traces). Everything styled also
reads without colour: raced rows carry `!`, rep rows `^`, padding says `pad`.

Cost: the cell map is the one picture whose input grows with the cache: a few numpy
passes over a byte per row find its runs of identical lines, and Python loops only
over the runs and the cells drawn (`cell_map_lines`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import MISSING, fields
from typing import Literal

import numpy as np
from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from .. import wording as words
from ..cache.cells import global_row
from ..contracts.finding import Finding
from ..contracts.records import SEQ_EMPTY, SEQ_SHARED, CellMap, ExpectResult, OpEvent, UbatchRecord
from ..contracts.shape import Shape
from ..contracts.tally import Tally
from ..trace import model as m
from ..verdict.codes import CODES
from ..verdict.explain import EXPLANATIONS, Explanation
from ..verdict.rules import kp001_scatter_race
from ..versions import EngineVersion
from ..wording import visible
from .select import Selection

SEQ_STYLES = ("cyan", "green", "yellow", "blue", "magenta", "bright_cyan", "bright_green",
              "bright_yellow", "bright_blue", "bright_magenta")
SHARED_STYLE = "bold bright_white on red3"
SEQ_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"
RACE = kp001_scatter_race.CODE.code  # its rows are drawn red, "xN race"
POOL_ROWS = 14  # pool table rows shown before folding (raced and flagged rows always are)
TOKEN_RUNS = 6  # cell / pos runs listed per sequence before "..."
GROUP = 16  # cells per group in the cell map


def seq_style(s: int) -> str:
    return SEQ_STYLES[s % len(SEQ_STYLES)]


# -- lines that break between units ----------------------------------------------------------


class Flow:
    """Text that wraps only between its units (`wording.units`): a list item (`seq 0
    from pos 12`, `5 x3`, `pos 4 seq 1`), a label with its value, a command in
    parentheses is never split across lines, as rich's own wrapping (at any space)
    would. `add` a unit with the gap (spaces) before it; a line with no room for the
    next unit ends there and the next starts `hang` columns in. A unit wider than the
    whole width is folded (nothing else fits). The gaps take `style`, the hang none."""

    def __init__(self, units: Iterable[Text | str] = (), *, style: str = "", hang: int = 0
                 ) -> None:
        self.style, self.hang = style, hang
        self._units: list[tuple[Text, int]] = []
        for u in units:
            self.add(u)

    def add(self, unit: Text | str, gap: int = 1, style: str = "") -> Flow:
        t = unit.copy() if isinstance(unit, Text) else Text(unit)
        if style:
            t.stylize(style)
        if t.plain:
            self._units.append((t, gap))
        return self

    def tail(self, text: str, style: str = "") -> Flow:
        """`text` at the end of the last unit: a separator (` ·`) ends a line, never
        starts one."""
        if self._units:
            self._units[-1][0].append(text, style=style or None)
        else:
            self.add(text, style=style)
        return self

    def words(self, text: str | Text, style: str = "", gap: int = 1) -> Flow:
        """The units of `text` (`wording.units`), the first after `gap` spaces; a
        `Text` keeps its own styles on its units."""
        t = text if isinstance(text, Text) else Text(text)
        at = 0
        for n, u in enumerate(words.units(t.plain)):
            a = t.plain.index(u, at)  # the units are the text's own, in order
            at = a + len(u)
            self.add(t[a:at], gap if n == 0 else 1, style)
        return self

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        if not self._units:
            return Measurement(0, 0)
        lens = [t.cell_len for t, _ in self._units]
        widest = max(lens) + (self.hang if len(lens) > 1 else 0)
        total = sum(lens) + sum(gap for _, gap in self._units[1:])
        return Measurement(min(widest, total), total).clamp(max_width=options.max_width)

    def text(self, width: int) -> Text:
        """The units on lines of `width` cells."""
        out = Text(overflow="fold")
        col, fresh = 0, True  # fresh: nothing on this line yet
        for t, gap in self._units:
            if not fresh and col + gap + t.cell_len > width:
                out.append("\n" + " " * self.hang)
                col = self.hang
            elif not fresh:
                out.append(" " * gap, style=self.style)
                col += gap
            out.append_text(_styled(t, self.style))
            col += t.cell_len
            fresh = False
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.text(options.max_width)


def _styled(t: Text, style: str) -> Text:
    """`t` under `style` (its own styles on top)."""
    if not style:
        return t
    out = Text(style=style)
    out.append_text(t)
    return out


# -- the cell map --------------------------------------------------------------------------


def cells_per_line(width: int, n_cells: int) -> int:
    """The most cells (16, 32, ..., 256: llama.cpp's dump prints 256) a line of `width`
    holds with its 8-column row label and a space every GROUP cells."""
    best = GROUP
    for n in (32, 64, 128, 256):
        if 8 + n + n // GROUP - 1 <= width:
            best = n
    while best > GROUP and best // 2 >= n_cells:
        best //= 2
    return best


def cell_map_lines(cm: CellMap, width: int, flagged: set[int] | frozenset[int] = frozenset(),
                   written: np.ndarray | None = None) -> list[Text]:
    """The cache as strips of one character per cell (`.` empty, the seq id, `M` shared),
    each followed by a marker line under rep rows (`^`) and flagged rows (`!`) when it
    has any. Runs of identical lines fold into one line saying how many: a 131072-cell
    cache stays a few lines. Streams start on a new line and are labelled.

    Cost: a few numpy passes over a byte per row (`_cell_bytes`, `_runs`: each line
    compared with the one before it), then Python work per run of identical lines and
    per cell drawn, which follow what the cache holds, not its size."""
    n_rows, kv = cm.seq.size, cm.kv_size
    per = cells_per_line(width, kv)
    n_lines = -(-kv // per)  # a stream's lines, the last one short when per does not divide kv
    char, mark, is_written = _cell_bytes(cm, per, flagged, written)
    n_stream = n_rows // kv
    out: list[Text] = []
    for strm in range(n_stream):
        base = global_row(strm, 0, kv)
        if n_stream > 1:
            out.append(Text(f"stream {strm} (rows {words.span(base, base + kv)})",
                            style="dim"))
        for i, j in _runs(char, mark, is_written, base, n_lines, per):
            a = base + i * per
            end = min(base + j * per, base + kv)
            n_same = j - i
            if n_same >= 2 and _blank(char, mark, a, per):
                out.append(Text(f"{a:>6}  ... {words.count(n_same)} lines of empty cells "
                                f"(rows {words.span(a, end)}) ...", style="dim"))
            else:
                out += _strip(cm, mark, is_written, a, min(a + per, base + kv))
                if n_same >= 3:
                    out.append(Text(f"{'':>6}  ... {words.count(n_same - 1)} more lines like it "
                                    f"(rows {words.span(a + per, end)}) ...", style="dim"))
                elif n_same == 2:
                    b = a + per
                    out += _strip(cm, mark, is_written, b, min(b + per, end))
    return out


MARKS = " ^!"  # a row's mark by its `_cell_bytes` code: none, rep row, flagged row
# `_cell_bytes`' byte of an empty cell (SEQ_EMPTY wrapped to uint8), and of a row past
# the cache's end (no cell's byte: 0..len(SEQ_CHARS) are seq ids, SEQ_EMPTY and
# SEQ_SHARED wrap to 255 and 254)
_EMPTY_BYTE = np.int16(SEQ_EMPTY).astype(np.uint8)
_PAST_END = np.uint8(128)


def _cell_bytes(cm: CellMap, per: int, flagged: set[int] | frozenset[int],
                written: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, and for `per` rows past the cache's end: a byte that two cells share
    exactly when they draw the same character (the seq id, capped at len(SEQ_CHARS):
    every id past `z` draws `#`; SEQ_EMPTY and SEQ_SHARED wrapped to uint8; _PAST_END
    past the end), its mark (an index into MARKS) and whether the ubatch wrote it.
    One pass over the int16 codes; the marks and writes cost what they mark."""
    n_rows = cm.seq.size
    char = np.empty(n_rows + per, dtype=np.uint8)
    np.minimum(cm.seq, len(SEQ_CHARS), out=char[:n_rows], casting="unsafe")
    char[n_rows:] = _PAST_END
    mark = np.zeros(n_rows + per, dtype=np.uint8)
    mark[cm.rep_rows] = MARKS.index("^")
    if flagged:
        fl = np.fromiter((r for r in flagged if 0 <= r < n_rows), dtype=np.int64)
        mark[fl] = MARKS.index("!")
    is_written = np.zeros(n_rows + per, dtype=bool)
    if written is not None and written.size:
        is_written[written] = True
    return char, mark, is_written


def _blank(char: np.ndarray, mark: np.ndarray, a: int, per: int) -> bool:
    """The line from row `a` is empty cells with no mark."""
    return bool((char[a:a + per] == _EMPTY_BYTE).all()) and not mark[a:a + per].any()


def _runs(char: np.ndarray, mark: np.ndarray, is_written: np.ndarray, base: int,
          n_lines: int, per: int) -> list[tuple[int, int]]:
    """The runs [i, j) of identical lines of the stream whose first row is `base`. A
    line is its `per` rows' bytes (`_cell_bytes`) read from its first row on: a
    stream's short last line reads on into the next stream's rows, or past the cache's
    end (bytes no whole line has). A line holding a written row is a run of its own.
    Compares 8 rows a word."""
    rows = slice(base, base + n_lines * per)

    def lines(a: np.ndarray) -> np.ndarray:
        return a[rows].reshape(n_lines, per).view(np.uint64)

    c, mk = lines(char), lines(mark)
    w = np.any(lines(is_written), axis=1)
    # a run starts at line 0, at a line that differs from the one before it, and on
    # either side of a written line
    starts = np.ones(n_lines, dtype=bool)
    starts[1:] = ((c[1:] != c[:-1]).any(axis=1) | (mk[1:] != mk[:-1]).any(axis=1)
                  | w[1:] | w[:-1])
    first = np.flatnonzero(starts).tolist()
    return list(zip(first, [*first[1:], n_lines], strict=True))


def _strip(cm: CellMap, mark: np.ndarray, is_written: np.ndarray, a: int, b: int
           ) -> list[Text]:
    line = Text(f"{a:>6}  ", style="dim")
    marks = Text(" " * 8)
    for r, (c, k, w) in enumerate(zip(cm.seq[a:b].tolist(), mark[a:b].tolist(),
                                       is_written[a:b].tolist(), strict=True)):
        if r and r % GROUP == 0:
            line.append(" ")
            marks.append(" ")
        style = ("dim" if c == SEQ_EMPTY else SHARED_STYLE if c == SEQ_SHARED
                 else seq_style(c))
        mk = MARKS[k]
        if mk != " ":
            style += " underline"
        if w:
            style += " reverse"
        line.append(_cell_char(c), style=style)
        marks.append(mk, style="bold red" if mk == "!" else "bold")
    return [line, marks] if marks.plain.strip() else [line]


def _cell_char(code: int) -> str:
    """A cell's character in the map: `.` empty, `M` shared, its seq id (`#` past `z`)."""
    if code == SEQ_EMPTY:
        return "."
    if code == SEQ_SHARED:
        return "M"
    return SEQ_CHARS[code] if code < len(SEQ_CHARS) else "#"


# -- the view ------------------------------------------------------------------------------


class RichView:
    """One trace's replay, printed as it streams: `start()`, `add(record, shown)` for
    every pair of `select.select`, `finish(tally)`."""

    def __init__(self, console: Console, trace: m.Trace, version: EngineVersion,
                 backend: str | None, selection: Selection, pools_all: bool = False) -> None:
        self.console, self.trace, self.version = console, trace, version
        self.backend, self.sel, self.pools_all = backend, selection, pools_all
        self.shown_ubatches = 0
        self.entries = 0
        self.padding = 0
        self._last_sig: tuple | None = None  # findings of the last ubatch printed in full
        self._repeats: list[int] = []  # shown ubatches folded as repeats of it
        self.shape = Shape()  # every ubatch, shown or not

    @property
    def width(self) -> int:
        return self.console.width

    def print(self, *things) -> None:
        self.console.print(*things)

    # -- header ----------------------------------------------------------------------

    def start(self) -> None:
        t, cfg = self.trace, self.trace.cache
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column()
        grid.add_row("trace", Text(visible(t.path)))
        for para in _reflow(t.description).split("\n") if t.description else ():
            # a row per paragraph: the line breaks are the view's, none is the trace's
            grid.add_row("", Text(visible(para), style="italic"))
        grid.add_row("engine", Text.assemble((visible(self.version.name), "bold"), " ",
                                             (visible(self.version.description), "dim")))
        grid.add_row("backend", Text(self.backend or "none (model only: no KP003)"))
        layout = [f"kv_size {cfg.kv_size}", f"kpool {cfg.kpool}", f"n_seq_max {cfg.n_seq_max}",
                  "unified" if cfg.unified else f"non-unified ({cfg.n_stream} streams)",
                  "pools by order (M-RoPE)" if cfg.by_order else "pools by position",
                  f"n_ubatch {cfg.n_ubatch}",
                  *([] if cfg.n_batch is None else [f"n_batch {cfg.n_batch}"]),
                  f"n_embd {cfg.n_embd}",
                  f"n_rs_seq {cfg.n_rs_seq}" if cfg.n_rs_seq else "no rollback (n_rs_seq 0)"]
        # a wrapped line breaks between items, never inside `kv_size 32`
        grid.add_row("cache", Flow([f"{item} ·" for item in layout[:-1]] + layout[-1:]))
        legend = Flow()
        for mark, style, meaning in ((".", "dim", "empty"), ("0-9a-z", "bold", "seq"),
                                     ("M", SHARED_STYLE, "shared"), ("^", "bold", "rep row"),
                                     ("!", "bold red", "flagged row"), ("x", "reverse", "new")):
            legend.add(Text.assemble((mark, style), f" {meaning}"), gap=2)
        grid.add_row("cell map", legend)
        title = Text.assemble(("kpool replay", "bold"), " · ",
                              (visible(t.name or t.path), "bold cyan"))
        self.print(Panel(grid, title=title, title_align="left", box=box.ROUNDED,
                         border_style="cyan"))
        note = self.sel.describe()
        if note:
            self.print(Text(note, style="yellow"))

    # -- records ---------------------------------------------------------------------

    def add(self, rec: OpEvent | UbatchRecord | ExpectResult, shown: bool) -> None:
        if isinstance(rec, UbatchRecord):
            self.entries += rec.n_new_g
            self.padding += int(rec.scatter_pad.sum())
            self.shape.add(rec)
            if shown:
                self.shown_ubatches += 1
                sig = tuple((f.code, f.rows, f.seqs) for f in rec.findings)
                if self.sel.only_findings and sig and sig == self._last_sig:
                    self._repeats.append(rec.index)  # same findings again: one line for all
                    return
                self._flush_repeats()
                self._last_sig = sig
                self._ubatch(rec)
            return
        if shown:
            self._flush_repeats()
            self._last_sig = None
        if shown and isinstance(rec, OpEvent):
            self._event(rec)
        elif shown and isinstance(rec, ExpectResult):
            grid = Table.grid(padding=(0, 1))
            grid.add_column(no_wrap=True, style="dim")
            grid.add_column()
            ok = ("ok", "green") if rec.ok else ("FAILED", "bold red")
            grid.add_row(f"op {rec.op}", Flow().add("expect", style="bold")
                         .add(ok[0], style=ok[1]).tail(" ·").words(visible(rec.message)))
            self.print(grid)

    def _flush_repeats(self) -> None:
        if not self._repeats:
            return
        ix, self._repeats = self._repeats, []
        codes = " ".join(dict.fromkeys(code for code, _, _ in self._last_sig or ()))
        self.print(Flow(hang=6).add("  ...", style="dim")
                   .add(words.counted(len(ix), "more ubatch", "more ubatches"), style="bold")
                   .add(f"({words.folded(ix, 4)})", style="dim")
                   .words(f"with the same {codes} on the same rows and sequences"))

    def _event(self, e: OpEvent) -> None:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, style="dim")
        grid.add_column()
        if e.kind == "note":
            grid.add_row("note", Text(visible(e.message), style="italic"))
            self.print(grid)
            return
        op = self.trace.ops[e.op]
        status_style = {"applied": "green", "rejected": "bold yellow", "aborted": "bold red"}
        line = Flow().add(e.kind, style="bold").words(visible(_op_args(op))).tail(" ·")
        line.add(e.status, style=status_style.get(e.status, ""))
        if e.stale:
            _stale_flow(e.stale, line.tail(" ·"), label="stale ")
        cell: Flow | Group = line
        if e.message and not e.findings:
            cell = Group(line, Flow(style="dim").words(visible(e.message)))
        grid.add_row(f"op {e.op}", cell)
        self.print(grid)
        if e.findings:
            self.print(self._findings_panel(e.findings, f"op {e.op} {e.kind}"))

    def _ubatch(self, r: UbatchRecord) -> None:
        raced = _raced_rows(r)
        flagged = raced | {row for f in r.findings for row in f.rows}
        style = ("red" if any(f.severity == "error" for f in r.findings)
                 else "yellow" if r.findings else "bright_black")
        title = Text.assemble((f"ubatch {r.index}", "bold"), " · ", f"op {r.op} decode",
                              " · ", f"ubatch {r.batch_ubatch} of its batch",
                              " · ", words.counted(r.n_tokens, "token"))
        self.print(Rule(title, align="left", style=style))
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column()
        grid.add_row("tokens", _tokens_text(r))
        if r.batch_ubatch == 0:
            stale: Flow | Text = (_stale_flow(r.stale_batch) if r.stale_batch
                                  else Text(words.NONE, style="dim"))
        else:
            stale = Text("- (only a batch's ubatch 0 re-pools stale pools)", style="dim")
        grid.add_row("stale", stale)
        n_pad = int(r.scatter_pad.sum())
        pools = Flow().words(f"{words.count(r.n_new)} marked of {words.count(r.n_pool_real)} · "
                             + words.counted(r.n_new_g, "scatter entry", "scatter entries"))
        if n_pad:
            pools.add(f"({words.count(n_pad)} padding)", style="dim")
        if raced:
            n_raced = len(raced)
            pools.tail(" ·").words(f"{words.counted(n_raced, 'row')} written by 2 or more "
                                   "entries", style="bold red")
        grid.add_row("pools", pools)
        self.print(grid)
        table = self._pool_table(r, raced, flagged)
        if table is not None:
            self.print(table)
        if r.cell_map is not None:
            for line in cell_map_lines(r.cell_map, self.width, flagged, r.token_rows):
                self.print(line)
        if r.findings:
            self.print(self._findings_panel(r.findings, f"ubatch {r.index}"))

    def _pool_table(self, r: UbatchRecord, raced: set[int], flagged: set[int]) -> Table | None:
        """Every scatter entry (a marked pool, or padding), or with --pools all every pool."""
        # cells, style, keep when folding
        rows: list[tuple[list[Text | Flow | str], str, bool]] = []
        new = [p for p in r.pools if p.new]
        count = Counter(r.scatter_rep.tolist())
        listed = r.pools if self.pools_all else tuple(new)
        codes_of: dict[int, set[str]] = {}
        for f in r.findings:
            for row in f.rows:
                codes_of.setdefault(row, set()).add(f.code)

        def note(row: int, base: str) -> str:
            parts = [base] if base else []
            if row in raced:
                parts.append(f"x{count[row]} race")
            parts += sorted(codes_of.get(row, set()) - ({RACE} if row in raced else set()))
            return " ".join(parts)

        for p in listed:
            rep_hot = p.rep in raced
            style = "red" if rep_hot else ("" if p.new else "dim")
            if p.rep in flagged and not rep_hot:
                style = "yellow"
            rep_text = Text(str(p.rep), style="bold red" if p.rep in flagged else "")
            cells: list[Text | Flow | str] = [
                Text(str(p.seq), style=seq_style(p.seq)), str(p.k),
                words.span(p.first_pos, p.last_pos + 1), Flow().words(words.folded(p.cells)),
                rep_text,
                note(p.rep, "" if p.new else "kept")]
            rows.append((cells, style, p.rep in flagged))
        for e in np.flatnonzero(r.scatter_pad).tolist():
            pad_rep = int(r.scatter_rep[e])
            hot = pad_rep in raced or pad_rep in flagged
            cells = ["pad", "-", "-", Flow().words(words.folded(r.scatter_rows[e].tolist())),
                     Text(str(pad_rep), style="bold red" if hot else ""),
                     note(pad_rep, "padding")]
            rows.append((cells, "red" if hot else "dim", hot))
        if not rows:
            return None
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1),
                      header_style="bold")
        columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
            ("seq", "right"), ("pool", "right"), ("pos", "left"), ("members", "left"),
            ("rep", "right"), ("", "left"))
        for name, justify in columns:
            table.add_column(name, justify=justify, overflow="fold")
        shown: list[int] = list(range(len(rows)))
        if not self.pools_all and len(rows) > POOL_ROWS:
            # the first entries, the first flagged ones, the last two
            flagged_at = [i for i, row in enumerate(rows) if row[2]]
            shown = sorted({*range(POOL_ROWS // 2), *flagged_at[:POOL_ROWS // 4],
                            len(rows) - 2, len(rows) - 1})
        prev = -1
        for i in shown:
            if i > prev + 1:
                gap = range(prev + 1, i)
                n_flag = sum(rows[j][2] for j in gap)
                table.add_row("...", "", "", f"{words.count(len(gap))} more", "",
                              f"{words.count(n_flag)} flagged" if n_flag else "", style="dim")
            cells, style, _ = rows[i]
            table.add_row(*cells, style=style)
            prev = i
        return table

    def _findings_panel(self, findings: tuple[Finding, ...], where: str) -> Panel:
        parts: list[Text | Padding] = []
        pad = (0, 0, 0, 2)
        for n, f in enumerate(findings):
            if n:
                parts.append(Text(""))
            parts.append(_code_text(f.code, f.name, f.severity, f"[{f.severity}]"))
            facts = []
            if f.rows:
                facts.append(("rows ", words.folded(f.rows.array, 10)))
            if f.seqs:
                facts.append(("seqs ", " ".join(map(str, f.seqs))))
            if f.pools:
                facts.append(("pools ", words.pools(f.pools.array.tolist(), 10)))
            if f.tokens:
                ts = [f"pos {p} seq {s}" for p, s in f.tokens]
                facts.append(("tokens ", ", ".join(ts[:4]) + (" ..." if len(ts) > 4 else "")))
            if facts:  # a label stays with its first value, `5 x3` in one piece
                line = Flow()
                for k, (label, value) in enumerate(facts):
                    first, *rest = words.units(value)
                    if k:
                        line.tail(" ·", style="dim")
                    line.add(Text.assemble((label, "dim"), first))
                    for u in rest:
                        line.add(u)
                parts.append(Padding(line, pad))
            parts.append(Padding(Flow().words(visible(f.message)), pad))
            exp = EXPLANATIONS.get(f.code)
            if exp is not None:
                parts.append(Padding(Flow(style="dim italic").words(
                    f"why: {exp.oneline} (kpool explain {f.code})"), pad))
        worst = "red" if any(f.severity == "error" for f in findings) else "yellow"
        return Panel(Group(*parts), title=Text(f"findings · {where}", style=f"bold {worst}"),
                     title_align="left", border_style=worst, box=box.ROUNDED)

    # -- summary ---------------------------------------------------------------------

    def finish(self, tally: Tally) -> None:
        self._flush_repeats()
        s = tally.summary()
        table = Table(title=Text(f"summary · {visible(self.trace.name or self.trace.path)} "
                                 f"under {visible(self.version.name)}", style="bold"),
                      title_justify="left", box=box.ROUNDED, show_header=False,
                      padding=(0, 1))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        shown = self.sel.shown_note(self.shown_ubatches, s["ubatches"],
                                    self.trace.cache.n_seq_max,
                                    counted=self.shown_ubatches != s["ubatches"])
        rows: list[tuple[str | Text, str | Text | Flow]] = [
            ("ubatches", f"{words.count(s['ubatches'])}{shown} · "
                         + words.counted(s["tokens"], "token")),
            ("pools marked", f"{words.count(s['pools_marked'])} ({s['pools_per_token']} per "
                             "token) · "
                             + words.counted(self.entries, "scatter entry", "scatter entries")
                             + f" ({words.count(self.padding)} padding)")]
        series = [(f"{what.split()[1]}/ubatch", one) for what, one in self.shape.series()]
        after: list[tuple[str | Text, str | Text | Flow]] = []
        if s["findings"]:
            for code, n in s["findings"].items():
                c = CODES[code]
                sev = "red" if c.severity == "error" else "yellow"
                after.append((Text(code, style=f"bold {sev}"), Text.assemble(
                    (f"{words.count(n)} ", "bold"), c.name, (f" ({c.severity})", "dim"))))
        else:
            after.append(("findings", Text("none", style="green")))
        ex = s["expectations"]
        if ex["passed"] or ex["failed"]:
            unchecked = " (not checked: --check fails the run on them)" if (
                ex["failed"] and not tally.check) else ""
            after.append(("expectations", Text.assemble(
                f"{words.count(ex['passed'])} held", ", ",
                (f"{words.count(ex['failed'])} failed", "bold red" if ex["failed"] else ""),
                unchecked)))
        status = s["status"]
        style = "bold green" if status == "pass" else "bold red"
        after.append(("status", Text(status.upper(), style=style)))
        # a sparkline never wraps: at most as many marks as its line leaves in the box
        # (its borders and padding take 7 columns besides the labels' column)
        labels = [label for label, _ in rows + after] + [label for label, _ in series]
        room = self.width - 7 - max(Text(label).cell_len if isinstance(label, str)
                                    else label.cell_len for label in labels)
        for label, one in series:
            values, per = one.folded(room)
            rows.append((label, Flow([
                Text(words.sparkline(values), style="cyan"),
                Text(f"{words.per_bin(per)}; max {words.count(one.peak)} at ubatch "
                     f"{one.peak_at}", style="dim")])))
        for name, cell in rows + after:
            table.add_row(name, cell)
        self.print(table)


# -- small renderers -----------------------------------------------------------------------


def _raced_rows(r: UbatchRecord) -> set[int]:
    """The rows the ubatch's scatter race (KP001) names."""
    return {row for f in r.findings if f.code == RACE for row in f.rows}


def _stale_flow(stale: dict[int, int], out: Flow | None = None, label: str = "") -> Flow:
    """`wording.stale`, each sequence in its colour, added to `out` (`label` before
    the first): a wrapped line breaks between sequences, never inside `seq 1 from
    pos 0`."""
    out = out if out is not None else Flow()
    items = sorted(stale.items())
    for n, (s, p) in enumerate(items):
        out.add(Text.assemble(label if n == 0 else "", (words.stale_one(s, p), seq_style(s)),
                              "," if n + 1 < len(items) else ""))
    return out


def _code_text(code: str, name: str, severity: str, after: str) -> Text:
    """`wording.code`, the code in its severity's colour, then `after` dimmed."""
    out = Text(words.code(code, name), style="bold")
    out.stylize("bold red" if severity == "error" else "bold yellow", 0, len(code))
    out.append(f" {after}", style="dim")
    return out


def _tokens_text(r: UbatchRecord) -> Group:
    """Tokens by sequence set, in order of appearance: positions and their cells (a
    line each, wrapped between positions, never inside `5 x3`)."""
    groups: dict[tuple[int, ...], tuple[list[int], list[int]]] = {}
    for p, ss, row in zip(r.token_pos.tolist(), r.token_seqs, r.token_rows.tolist(),
                          strict=True):
        ps, rows = groups.setdefault(ss, ([], []))
        ps.append(p)
        rows.append(row)
    lines = []
    for ss, (ps, rows) in groups.items():
        line = Flow(hang=2).add(f"seq {','.join(map(str, ss))}",
                                style=seq_style(ss[0]) + (" bold" if len(ss) > 1 else ""))
        line.words(f"pos {words.folded(ps, TOKEN_RUNS)}", gap=2)
        line.words(f"cells {words.folded(rows, TOKEN_RUNS)}", style="dim", gap=2)
        lines.append(line)
    return Group(*lines)


def _reflow(text: str) -> str:
    """Paragraphs of a YAML block (blank-line separated) as single lines."""
    paras = [" ".join(p.split()) for p in text.strip().split("\n\n")]
    return "\n".join(p for p in paras if p)


def _op_args(op) -> str:
    """An edit's arguments, defaults left out: `src 0 dst 1`, `seq 0 p0 4 p1 8 shift 1`."""
    if isinstance(op, m.Decode):
        return _tokens_brief(op)
    parts = []
    for f in fields(op):
        if f.name == "loc":
            continue
        v = getattr(op, f.name)
        if f.default is not MISSING and v == f.default:
            continue
        parts.append(f"{f.name} {v}")
    if isinstance(op, m.SeqCp | m.SeqRm | m.SeqAdd | m.SeqDiv) and op.p0 < 0 and op.p1 < 0:
        every = isinstance(op, m.SeqRm) and op.seq < 0
        parts.append("(every sequence, whole)" if every else "(whole sequence)")
    return " ".join(parts)


def _tokens_brief(op: m.Decode) -> str:
    sp = op.span
    if sp is not None:  # never built: its ends
        return f"seq {','.join(map(str, sp.seq))} pos {words.span(sp.start, sp.stop)}"
    return words.tokens(((t.pos, t.seq) for t in op.tokens), limit=3)


# -- kpool explain -------------------------------------------------------------------------


def print_explanation(console: Console, e: Explanation) -> None:
    console.print(_code_text(e.code, e.name, e.severity, f"({e.severity})"))
    console.print(_para(f"{e.oneline}.", style="italic"))  # indented when it wraps too
    for head, body in (("What it does", e.what), ("Why is this bad?", e.why)):
        console.print()
        console.print(Text(head, style="bold underline"))
        console.print(_para(body))
    console.print()
    console.print(Flow(style="bold underline", hang=2).words(f"Example (under {e.under})"))
    console.print(Panel(Text(e.example), box=box.SIMPLE, padding=(0, 2), expand=False))
    if e.plugin_module:
        console.print(Text(f"  {e.plugin_intro}"))
        console.print(Panel(Text(e.plugin_module.rstrip("\n")), box=box.SIMPLE,
                            padding=(0, 2), expand=False))
    console.print(Text(f"  $ {e.command}", style="dim"))
    console.print()
    console.print(Text("How to fix the engine", style="bold underline"))
    console.print(_para(e.fix))


def _para(text: str, style: str = "") -> Padding:
    """A docstring-style paragraph, re-flowed and indented, wrapped to the width between
    `wording.units`."""
    return Padding(Flow(style=style).words(text), (0, 0, 0, 2))


def print_code_list(console: Console) -> None:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for name in ("code", "name", "severity", "what it flags"):
        table.add_column(name)
    for c in CODES.values():
        sev = "red" if c.severity == "error" else "yellow"
        table.add_row(Text(c.code, style=f"bold {sev}"), c.name, c.severity, c.summary)
    console.print(table)
    console.print(Text("kpool explain CODE for what it means, why it is harmful, a minimal "
                       "trace and how to fix the engine.", style="dim"))
