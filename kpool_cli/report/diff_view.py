"""The views of `kpool diff`: a side-by-side rich table for terminals, a plain text
form for pipes and files, and JSON for machines. All three show the same thing:
the differing ubatches and events of each trace (base | head), where the runs
part, and a summary (findings fixed and introduced, pools re-pooled and cells
scanned base vs head, the other cost counters, the verdict).

Owns: `write_diff` (which view, for the format and the output), `diff_json`,
`write_diff_json`, `write_diff_plain` (and its `write_summary_plain`, which the diff
page shows too), `write_diff_rich`. Reads only
`kpool_cli.diff.compare` results; never runs anything. Rich consoles come from
`terminal.make_console` (markup off): styles are attached to `Text` spans, so
trace text can never be read as markup. Rows, pools, tokens, stale positions and
codes are worded by `kpool_cli.wording`, as in the replay's views.

Text from the inputs (trace paths and names, engine names, event kinds and
messages: a saved report may hold anything) goes through `wording.visible` in the
text and rich views, so it cannot drive the terminal. The JSON view writes it as
it is: `json_text.dumps` escapes every control character (and, ASCII-only, the rest).
Codes left out of a comparison (`TraceDiff.not_compared`: one side had no value
backend) are said in every view, per trace and in the summary.

The rich view fits any width without cutting a name or wrapping a sparkline: a
title too long for its rule takes lines of its own; the summary's trace column
holds every name whole while the longest takes at most a third of the width
(TRACE_SHARE) and the rows still fit beside it, else each name takes a line of its
own with its row under it; the sparklines fold to the width their line leaves.
Counts are worded by `wording.count` (grouped from 10,000 on) in the text views;
the JSON writes them bare.
"""

from __future__ import annotations

from typing import NamedTuple, TextIO

from rich.cells import cell_len
from rich.console import Console, Group
from rich.padding import Padding
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from .. import __version__
from .. import wording as words
from ..contracts.report_format import (
    COST_KEYS,
    DIFF,
    DIFF_BOTH,
    DIFF_CHANGE,
    DIFF_COMPARE,
    DIFF_ENGINE,
    DIFF_EVENT,
    DIFF_EVENT_SIDE,
    DIFF_FINDING,
    DIFF_OP_SIDE,
    DIFF_OP_UBATCH,
    DIFF_PARTED,
    DIFF_REGRESSION,
    DIFF_SUMMARY,
    DIFF_TOKEN,
    DIFF_TOTALS,
    DIFF_TRACE,
    DIFF_TRACE_ID,
    DIFF_UBATCH,
    DIFF_UBATCH_SIDE,
    DIFF_VERSION,
    SCATTER,
    TOOL,
)
from ..diff.compare import (
    BASE,
    HEAD,
    DiffResult,
    EventDiff,
    FindingChange,
    OpSide,
    Parting,
    Totals,
    TraceDiff,
    UbatchDiff,
    ratio,
    regressions,
)
from ..diff.summary import EventSummary, UbatchSummary
from ..verdict.codes import CODES
from ..wording import visible
from .json_text import dumps
from .terminal import Manners, make_console
from .view import Flow

# code -> count
Counter_t = dict[str, int]
# a line of a cell: (text, style) spans; the plain view drops the styles
Span = tuple[str, str]
Line = list[Span]

GAINED, LOST, PART, DIM, BOLD = "bold red", "green", "bold yellow", "dim", "bold"
MAX_TABLE_WIDTH = 150  # wider terminals leave the side-by-side columns this wide


# --- lines the text views share ------------------------------------------------------


def _ratio_parts(base: int, head: int) -> list[str]:
    """`1247 -> 634` and, when base is not 0, `(0.51x)`: a line breaks only between them."""
    r = ratio(base, head)
    return [f"{words.count(base)} -> {words.count(head)}"] + ([f"({r:.2f}x)"] if r is not None
                                                             else [])


def _ratio_text(base: int, head: int) -> str:
    return " ".join(_ratio_parts(base, head))


def _finding_lines(findings, gained: Counter_t, lost: Counter_t, side: str) -> list[Line]:
    """One line per finding; a finding the other side lacks is marked."""
    out: list[Line] = []
    extra = dict(gained if side == HEAD else lost)
    for code, rows in findings:
        name = CODES[code].name if code in CODES else ""
        text = words.code(code, name) + (f" rows {words.folded(rows)}" if rows else "")
        if extra.get(code, 0) > 0:
            extra[code] -= 1
            out.append([("NEW: ", GAINED), (text, GAINED)] if side == HEAD
                       else [("fixed: ", LOST), (text, LOST)])
        else:
            out.append([(text, "")])
    return out


def _count(codes: tuple[str, ...]) -> Counter_t:
    out: Counter_t = {}
    for c in codes:
        out[c] = out.get(c, 0) + 1
    return out


def _scatter_line(u: UbatchSummary) -> Line:
    reps = [rep for rep, _, pad in u.scatter if not pad]
    pads = [rep for rep, _, pad in u.scatter if pad]
    text = "scatter" + (f" {words.folded(reps)}" if reps else "")
    if pads:
        text += f"{',' if reps else ''} +{len(pads)} pad: {words.folded(sorted(pads))}"
    seen: set[int] = set()
    race = any(r in seen or seen.add(r) for r in reps)  # type: ignore[func-returns-value]
    return [(text, GAINED if race else "")]


def ubatch_lines(u: UbatchSummary, d: UbatchDiff, side: str) -> list[Line]:
    only = d.only_base if side == BASE else d.only_head
    n_new = f"{words.count(u.n_new)}/{words.count(u.n_new_g)} of {words.count(u.n_pool_real)}"
    lines: list[Line] = [[(f"n_new {n_new}",
                           BOLD if {"n_new", "n_new_g", "n_pool_real"} & set(d.fields) else "")]]
    marks: Line = [(f"marks {words.count(len(u.marked))}", "")]
    if only:
        marks.append((f", only here: {words.pools(only)}", BOLD))
    elif u.marked:
        marks.append((", none only here", DIM))
    lines.append(marks)
    if "stale" in d.fields:
        lines.append([(f"stale {words.stale(u.stale_batch)}", "")])
    if "scatter" in d.fields:
        lines.append(_scatter_line(u))
    if "tokens" in d.fields:
        lines.append([(f"tokens {words.tokens(u.tokens)}", "")])
    lines += _finding_lines(u.findings, _count(d.gained), _count(d.lost), side)
    lines += _cost_lines(d.base.cost, d.head.cost, u.cost)
    return lines


# shown already as n_new and n_new_g
_SHOWN = ("pools_marked", "scatter_entries")


def _cost_lines(base_cost, head_cost, mine) -> list[Line]:
    """The cost counters that differ between the two sides, one per line."""
    b, h, m = dict(base_cost), dict(head_cost), dict(mine)
    return [[(f"{k} {words.count(m.get(k, 0))}", DIM)] for k in COST_KEYS
            if k not in _SHOWN and b.get(k, 0) != h.get(k, 0)]


def event_lines(e: EventSummary, gained: Counter_t, lost: Counter_t, side: str) -> list[Line]:
    lines: list[Line] = [[(e.status, BOLD if e.status != "applied" else "")]]
    if e.message and e.status != "applied":
        lines.append([(visible(e.message), "")])
    if e.stale or e.status == "applied":
        lines.append([(f"stale {words.stale(e.stale)}", "")])
    lines += _finding_lines(e.findings, gained, lost, side)
    return lines


def opside_lines(s: OpSide | None, other: OpSide | None, side: str) -> list[Line]:
    """What one run did at the parting op."""
    if s is None:
        return [[("(its run ended before this op)", DIM)]]
    mine = [c for c, _ in (s.event.findings if s.event else ())]
    mine += [c for u in s.ubatches for c, _ in u.findings]
    theirs: list[str] = []
    if other is not None:
        theirs = [c for c, _ in (other.event.findings if other.event else ())]
        theirs += [c for u in other.ubatches for c, _ in u.findings]
    extra = _count(tuple(mine))
    for c in theirs:
        if c in extra:
            extra[c] -= 1
    gained = extra if side == HEAD else {}
    lost = extra if side == BASE else {}
    lines: list[Line] = []
    if s.event is not None:
        lines += event_lines(s.event, gained, lost, side)
    for u in s.ubatches:
        lines.append([(f"ubatch {u.index} ({words.place(u.op, u.batch_ubatch)}) n_new "
                       f"{words.count(u.n_new)}/{words.count(u.n_new_g)} of "
                       f"{words.count(u.n_pool_real)}", "")])
        lines.append([(f"marks {words.pools(u.marked)}", "")])
        lines += _finding_lines(u.findings, gained, lost, side)
    return lines


def where_lines(entry: UbatchDiff | EventDiff | Parting) -> list[Line]:
    if isinstance(entry, UbatchDiff):
        idx = (f"ubatch {entry.base.index}" if entry.base.index == entry.head.index
               else f"ubatch {entry.base.index}|{entry.head.index}")
        return [[(entry.where, BOLD)], [(idx, DIM)], [(words.tokens(entry.base.tokens), "")]]
    if isinstance(entry, EventDiff):
        return [[(f"{entry.where} {visible(entry.kind)}", BOLD)]]
    return [[(f"op {entry.op} {visible(entry.kind)}", PART)], [("the runs part here", PART)]]


def entry_sides(entry: UbatchDiff | EventDiff | Parting) -> tuple[list[Line], list[Line]]:
    if isinstance(entry, UbatchDiff):
        return ubatch_lines(entry.base, entry, BASE), ubatch_lines(entry.head, entry, HEAD)
    if isinstance(entry, EventDiff):
        g, lo = _count(entry.gained), _count(entry.lost)
        return event_lines(entry.base, g, lo, BASE), event_lines(entry.head, g, lo, HEAD)
    return (opside_lines(entry.base, entry.head, BASE),
            opside_lines(entry.head, entry.base, HEAD))


def parting_note(t: TraceDiff) -> str:
    p = t.parting
    assert p is not None
    return (f"the runs part at op {p.op} ({visible(p.kind)}): {p.reason}; after it base ran "
            f"{words.counted(p.base_after, 'more ubatch', 'more ubatches')}, head "
            f"{words.count(p.head_after)}: "
            f"findings from op {p.op} on are compared by code counts")


def _changes_text(changes: tuple[FindingChange, ...], where: bool = True) -> str:
    """`KP001 x2 (op 3.0, op 6.0)`, grouped by code (`KP001 x2` without `where`)."""
    by: dict[str, tuple[int, list[str]]] = {}
    for c in changes:
        n, places = by.get(c.code, (0, []))
        by[c.code] = (n + c.count, [*places, c.where])
    return ", ".join(words.code_count(code, n) + (f" ({', '.join(w)})" if where else "")
                     for code, (n, w) in by.items())


def _codes_text(counts: Counter_t) -> str:
    """`KP001 x28, KP002 x1`, or `none`."""
    return ", ".join(words.code_count(c, n) for c, n in counts.items()) or words.NONE


def trace_title(t: TraceDiff) -> str:
    name = f" ({visible(t.trace_name)})" if t.trace_name else ""
    return f"{visible(t.trace_path)}{name}"


def trace_label(t: TraceDiff) -> str:
    """The trace's name, else its path: short, for the summary and the verdict."""
    return visible(t.trace_name or t.trace_path)


def not_compared_text(t: TraceDiff) -> str:
    """`KP003 not compared (value backend: base none, head numba)`."""
    return (f"{', '.join(t.not_compared)} not compared (value backend: base "
            f"{t.base_backend or 'none'}, head {t.head_backend or 'none'})")


def by_design_text(t: TraceDiff) -> str:
    """`stale positions differ by design (base rep-once, head rep-once+noop-seq-rm)`."""
    what = ", ".join({"stale": "stale positions", "pools": "marked pools"}.get(f, f)
                     for f in t.by_design)
    return (f"{what} not judged: they differ by design (base {visible(t.base_engine)}, "
            f"head {visible(t.head_engine)})")


def not_compared_note(r: DiffResult) -> str | None:
    """The summary's line on codes left out of the comparison, if any."""
    if not r.not_compared:
        return None
    traces = [trace_label(t) for t in r.traces if t.not_compared]
    return (f"not compared: {', '.join(r.not_compared)} in {', '.join(traces)}: one side "
            "was replayed without a value backend, which never looks for them; the rest is "
            "compared in full (make both reports with the same --backend to compare them)")


def _shown(t: TraceDiff) -> bool:
    """Has the trace anything to show side by side?"""
    return t.changed or bool(t.fixed) or bool(t.introduced)


def trace_outcome(t: TraceDiff, ignore: tuple[str, ...] = (), where: bool = True
                  ) -> list[Line]:
    """What changed in one trace, one line per kind of change."""
    lines: list[Line] = []
    if t.fixed:
        lines.append([(f"fixed {_changes_text(t.fixed, where)}", LOST)])
    if t.introduced:
        ignored = not regressions(t, ignore)
        lines.append([(f"introduced {_changes_text(t.introduced, where)}",
                       PART if ignored else GAINED)]
                     + ([(" (ignored)", PART)] if ignored else []))
    if t.parting is not None:
        lines.append([(f"parts at op {t.parting.op} ({visible(t.parting.kind)})", PART)])
    n_ub = sum(isinstance(e, UbatchDiff) for e in t.entries)
    n_ev = len(t.entries) - n_ub
    what = [f"{words.count(n_ub)}/{words.count(t.aligned_ubatches)} ubatches"] if n_ub else []
    what += [words.counted(n_ev, "event")] if n_ev else []
    if what:
        lines.append([(" and ".join(what) + " differ", "")])
    if not lines:
        same = t.base.cost == t.head.cost
        lines.append([("no differences" if same else "same behaviour", DIM)])
    if t.not_compared:
        lines.append([(not_compared_text(t), PART)])
    if t.by_design:
        lines.append([(by_design_text(t), DIM)])
    return lines


SPARK_WIDTH = 16  # the most marks of a side's sparkline in the rich summary


def shapes(t: TraceDiff, limit: int | None = None
           ) -> list[tuple[str, list[int], list[int], int]]:
    """(what, base values, head values, ubatches per value) of the two runs' shapes,
    folded alike: pools marked and cells scanned per ubatch."""
    out = []
    for (what, b), (_, h) in zip(t.base.shape.series(), t.head.shape.series(), strict=False):
        per = max(b.folded(limit)[1], h.folded(limit)[1])  # one per on both sides
        bv, per = b.folded(limit, per)
        hv, _ = h.folded(limit, per)
        out.append((what, bv, hv, per))
    return out


# the cost counters of the summary's host work line (the other two are its pools
# re-pooled, which is n_new, and cells scanned)
HOST_WORK = tuple(k for k in COST_KEYS if k not in ("cells_scanned", "pools_marked"))


def _totals_lines(b: Totals, h: Totals) -> list[str]:
    return [f"pools re-pooled {_ratio_text(b.pools_repooled, h.pools_repooled)}",
            f"cells scanned {_ratio_text(b.counter('cells_scanned'), h.counter('cells_scanned'))}"]


def verdict_text(r: DiffResult) -> tuple[str, str]:
    """The verdict line, with the exit code `r` decides, and its style."""
    code = f"exit {r.exit_code}"
    if r.regressions:
        parts = [f"{c.code} in {trace_label(t)} at {c.where}"
                 for t, c in r.regressions]
        return f"REGRESSION ({code}): head introduces {'; '.join(parts)}", GAINED
    ignored = "".join(f"; {c.code} introduced in {trace_label(t)} is ignored"
                      for t in r.traces for c in t.introduced)
    if r.changed:
        if r.fail_on_change:
            return f"behaviour changed ({code}, --fail-on-change){ignored}", GAINED
        return f"behaviour changed, no regression ({code}){ignored}", LOST
    if any(t.base.cost != t.head.cost for t in r.traces):
        return f"no behavioural differences; cost counters differ ({code})", LOST
    return f"no differences ({code})", LOST


def engines(r: DiffResult) -> tuple[str, str]:
    """The base and head engine names, as they are (the views make them visible): a
    side's one name, or its names in the traces' order, `a/b`."""
    def one(names: list[str]) -> str:
        uniq = list(dict.fromkeys(names))
        return uniq[0] if len(uniq) == 1 else "/".join(uniq)
    return (one([t.base_engine for t in r.traces]) if r.traces else "?",
            one([t.head_engine for t in r.traces]) if r.traces else "?")


# --- JSON ------------------------------------------------------------------------------


def _finding_json(findings) -> list[dict]:
    return [DIFF_FINDING.make(code=c, rows=list(rows)) for c, rows in findings]


def _ubatch_side(u: UbatchSummary) -> dict:
    """The fields of `DIFF_UBATCH_SIDE`, as keyword arguments of a record that holds
    them (a ubatch side, or an op's ubatch)."""
    return dict(
        index=u.index, n_pool_real=u.n_pool_real, n_new=u.n_new, n_new_g=u.n_new_g,
        stale_batch={str(s): p for s, p in u.stale_batch},
        pools=[list(p) for p in u.marked],
        scatter=[SCATTER.make(rep=rep, cells=list(cells), pad=pad)
                 for rep, cells, pad in u.scatter],
        findings=_finding_json(u.findings), cost=dict(u.cost),
    )


def _event_side_json(e: EventSummary) -> dict:
    return DIFF_EVENT_SIDE.make(kind=e.kind, status=e.status,
                                stale={str(s): p for s, p in e.stale},
                                findings=_finding_json(e.findings),
                                **({"message": e.message} if e.message else {}))


def _opside_json(s: OpSide | None) -> dict | None:
    if s is None:
        return None
    return DIFF_OP_SIDE.make(
        status=s.status, event=_event_side_json(s.event) if s.event else None,
        ubatches=[DIFF_OP_UBATCH.make(batch_ubatch=u.batch_ubatch, **_ubatch_side(u))
                  for u in s.ubatches])


def _change_fields(c: FindingChange) -> dict:
    """The fields of `DIFF_CHANGE` (a regression holds them too)."""
    return dict(code=c.code, count=c.count, where=c.where, aligned=c.aligned,
                rows=list(c.rows))


def _totals_json(t: Totals) -> dict:
    return DIFF_TOTALS.make(ubatches=t.ubatches, pools_repooled=t.pools_repooled,
                            cost=dict(t.cost), findings=dict(t.findings), aborted=t.aborted)


def _both_json(b: Totals, h: Totals) -> dict:
    def pair(x: int, y: int) -> dict:
        return {"base": x, "head": y, "ratio": ratio(x, y)}
    return DIFF_BOTH.make(
        base=_totals_json(b), head=_totals_json(h),
        compare=DIFF_COMPARE.make(
            pools_repooled=pair(b.pools_repooled, h.pools_repooled),
            **{k: pair(b.counter(k), h.counter(k)) for k in COST_KEYS}))


def _difference_json(e: UbatchDiff | EventDiff) -> dict:
    if isinstance(e, UbatchDiff):
        return DIFF_UBATCH.make(
            type="ubatch", op=e.op, batch_ubatch=e.batch_ubatch,
            tokens=[DIFF_TOKEN.make(pos=p, seq=list(ss)) for p, ss in e.base.tokens],
            differs=list(e.fields),
            pools_only_base=[list(p) for p in e.only_base],
            pools_only_head=[list(p) for p in e.only_head],
            findings_gained=list(e.gained), findings_lost=list(e.lost),
            base=DIFF_UBATCH_SIDE.make(**_ubatch_side(e.base)),
            head=DIFF_UBATCH_SIDE.make(**_ubatch_side(e.head)))
    return DIFF_EVENT.make(
        type="event", op=e.op, kind=e.kind, differs=list(e.fields),
        findings_gained=list(e.gained), findings_lost=list(e.lost),
        base=_event_side_json(e.base), head=_event_side_json(e.head))


def trace_json(t: TraceDiff, ignore: tuple[str, ...] = ()) -> dict:
    p = t.parting
    return DIFF_TRACE.make(
        trace=DIFF_TRACE_ID.make(path=words.unicode_path(t.trace_path), name=t.trace_name,
                                 sha256=t.sha256, same_trace=t.same_trace),
        base=DIFF_ENGINE.make(engine=t.base_engine, backend=t.base_backend),
        head=DIFF_ENGINE.make(engine=t.head_engine, backend=t.head_backend),
        not_compared=list(t.not_compared),
        by_design=list(t.by_design),
        changed=t.changed,
        regression=bool(regressions(t, ignore)),
        aligned_ubatches=t.aligned_ubatches,
        cost_only_ubatches=t.cost_only,
        differences=[_difference_json(e) for e in t.entries],
        parted=None if p is None else DIFF_PARTED.make(
            op=p.op, kind=p.kind, reason=p.reason,
            base=_opside_json(p.base), head=_opside_json(p.head),
            base_ubatches_after=p.base_after, head_ubatches_after=p.head_after),
        findings_fixed=[DIFF_CHANGE.make(**_change_fields(c)) for c in t.fixed],
        findings_introduced=[DIFF_CHANGE.make(**_change_fields(c)) for c in t.introduced],
        totals=_both_json(t.base, t.head),
    )


def diff_json(r: DiffResult) -> dict:
    """The diff as `contracts.report_format.DIFF` declares it."""
    base, head = engines(r)
    return DIFF.make(
        kpool_diff=DIFF_VERSION,
        tool=TOOL.make(name="kpool", version=__version__),
        base=base, head=head,
        fail_on_change=r.fail_on_change, ignore=list(r.ignore),
        traces=[trace_json(t, r.ignore) for t in r.traces],
        summary=DIFF_SUMMARY.make(
            traces=len(r.traces),
            changed=sum(t.changed for t in r.traces),
            findings_fixed=r.changes("fixed"),
            findings_introduced=r.changes("introduced"),
            regressions=[DIFF_REGRESSION.make(trace=words.unicode_path(t.trace_path),
                                              **_change_fields(c))
                         for t, c in r.regressions],
            totals=_both_json(r.totals(BASE), r.totals(HEAD)),
            not_compared=list(r.not_compared),
            verdict=r.verdict,
            exit_code=r.exit_code,
        ),
    )


def write_diff_json(out: TextIO, r: DiffResult) -> None:
    out.write(dumps(diff_json(r), indent=True) + "\n")


def write_diff(out: TextIO, r: DiffResult, fmt: str) -> None:
    """`r` as `fmt`: json, or text: the rich view on a terminal (or with colour forced),
    else the plain one."""
    if fmt == "json":
        write_diff_json(out, r)
        return
    manners = Manners.detect(out)
    if manners.is_terminal or manners.color:
        write_diff_rich(make_console(out, manners), r)
    else:
        write_diff_plain(out, r)


# --- plain text ------------------------------------------------------------------------


def _plain(line: Line) -> str:
    return "".join(t for t, _ in line)


def write_diff_plain(out: TextIO, r: DiffResult) -> None:
    """For pipes, files and CI logs: no colour, one block per differing place."""
    base, head = (visible(e) for e in engines(r))
    out.write(f"kpool diff: base {base} vs head {head}\n")
    for t in r.traces:
        if not _shown(t):
            continue
        out.write(f"\n{trace_title(t)}\n")
        places: list[UbatchDiff | EventDiff | Parting] = list(t.entries)
        if t.parting is not None:
            places.append(t.parting)
        for entry in places:
            out.write("  " + "  ".join(_plain(x) for x in where_lines(entry)) + "\n")
            base_lines, head_lines = entry_sides(entry)
            for label, lines in ((f"base {visible(t.base_engine)}", base_lines),
                                 (f"head {visible(t.head_engine)}", head_lines)):
                for k, line in enumerate(lines):
                    out.write(f"    {label if k == 0 else '':<16} {_plain(line)}\n")
        if t.parting is not None:
            out.write(f"  {parting_note(t)}\n")
    out.write("\n")
    write_summary_plain(out, r)


def write_summary_plain(out: TextIO, r: DiffResult) -> None:
    """The plain view's summary (the diff page shows it too): per trace its outcome and
    shape, all traces' totals and host work, findings fixed and introduced, the verdict."""
    base, head = (visible(e) for e in engines(r))
    out.write(f"summary: base {base} vs head {head}\n")
    for t in r.traces:
        out.write(f"  {trace_title(t)}: "
                  + "; ".join(_plain(x) for x in trace_outcome(t, r.ignore))
                  + "; " + ", ".join(_totals_lines(t.base, t.head)) + "\n")
    for t in r.traces:
        for what, base_values, head_values, per in shapes(t):
            out.write(f"  {trace_label(t)}: {what} ({words.per_bin(per)}): base "
                      f"{' '.join(map(words.count, base_values))}; head "
                      f"{' '.join(map(words.count, head_values))}\n")
    b, h = r.totals(BASE), r.totals(HEAD)
    out.write("  all traces: " + ", ".join(_totals_lines(b, h)) + "\n")
    other = [f"{k} {_ratio_text(b.counter(k), h.counter(k))}" for k in HOST_WORK]
    out.write("  host work: " + ", ".join(other) + "\n")
    fixed, intro = r.changes("fixed"), r.changes("introduced")
    out.write(f"  findings fixed: {_codes_text(fixed)}; introduced: {_codes_text(intro)}\n")
    note = not_compared_note(r)
    if note is not None:
        out.write(f"  {note}\n")
    out.write(verdict_text(r)[0] + "\n")


# --- rich --------------------------------------------------------------------------------

# the summary's trace column takes at most 1/TRACE_SHARE of the width: past it, each
# trace's name takes a line of its own, its row INDENT in under it
TRACE_SHARE = 3
INDENT = 2
OUTCOME_MIN = 20  # the outcome column's width (`fixed KP001 x12`) before ratios wrap
POOLS_HEADER, CELLS_HEADER = "pools re-pooled", "cells scanned"
SPARK_BASE, SPARK_HEAD = "base ", "  head "  # before each side's sparkline
CELL_HANG = 2  # a wrapped line of a table cell goes on this many columns in


def _cell(lines: list[Line]) -> Group:
    """A table cell: each line wrapped between its units (`Flow`), so that even the
    narrow columns of an 80-column terminal never split a sequence's tokens or
    stale position, a code from its name or a label from its value."""
    return Group(*(Flow(hang=CELL_HANG).words(Text.assemble(*line)) for line in lines))


def write_diff_rich(console: Console, r: DiffResult) -> None:
    """For terminals: per trace with differences a base | head table, then a summary."""
    base, head = (visible(e) for e in engines(r))
    console.print(Text.assemble(("kpool diff", BOLD), f": base {base} vs head {head}"))
    for t in r.traces:
        if not _shown(t):
            continue
        console.print()
        _heading(console, trace_title(t))
        table = Table(show_header=True, header_style=BOLD, box=None, padding=(0, 1, 1, 1),
                      width=min(console.width, MAX_TABLE_WIDTH))
        table.add_column("where", ratio=2, overflow="fold")
        table.add_column(Text(f"base: {visible(t.base_engine)}"), ratio=3, overflow="fold")
        table.add_column(Text(f"head: {visible(t.head_engine)}"), ratio=3, overflow="fold")
        places: list[UbatchDiff | EventDiff | Parting] = list(t.entries)
        if t.parting is not None:
            places.append(t.parting)
        for entry in places:
            base_lines, head_lines = entry_sides(entry)
            table.add_row(_cell(where_lines(entry)), _cell(base_lines), _cell(head_lines))
        console.print(table)
        if t.parting is not None:
            console.print(Text(parting_note(t), style=PART))
    console.print()
    _heading(console, f"summary: base {base} vs head {head}")
    own_line = _print_outcomes(console, r)
    _print_sparklines(console, r, own_line)
    b, h = r.totals(BASE), r.totals(HEAD)
    host = Flow(style=DIM, hang=2).add("host work:")
    for n, k in enumerate(HOST_WORK):
        first, *rest = _ratio_parts(b.counter(k), h.counter(k))
        for unit in (f"{k} {first}", *rest):
            host.add(unit)
        if n + 1 < len(HOST_WORK):
            host.tail(",")
    fixed, intro = r.changes("fixed"), r.changes("introduced")
    console.print(host)
    console.print(Flow(hang=2).add("findings fixed:").words(_codes_text(fixed), style=LOST)
                  .tail(";").add("introduced:")
                  .words(_codes_text(intro), style=GAINED if intro else ""))
    note = not_compared_note(r)
    if note is not None:
        console.print(Flow(style=PART, hang=2).words(note))
    text, style = verdict_text(r)
    console.print(Flow(style=style, hang=2).words(text))


def _heading(console: Console, title: str) -> None:
    """`title` (bold) and a rule after it on one line; a title too long for that
    (rich's rule would cut it) takes lines of its own, the rule under it."""
    if cell_len(title) + 2 <= console.width:
        console.print(Rule(Text(title, style=BOLD), align="left"))
    else:
        console.print(Flow(style=BOLD, hang=2).words(title))
        console.print(Rule())


class _Row(NamedTuple):
    """A row of the rich summary: a trace's (or all traces') label, outcome lines, and
    pools re-pooled and cells scanned as `_ratio_parts`."""

    label: str
    outcome: list[Line]
    pools: list[str]
    scanned: list[str]
    style: str = ""


def _ratio_units(parts: list[str]) -> list[str]:
    """`_ratio_parts` as the units a summary cell may break between: `12,000`, `->
    12,000`, `(1.00x)` (a narrow terminal's counts on lines of their own)."""
    first, *rest = parts
    base, arrow, head = first.partition(" -> ")
    return [base, f"-> {head}", *rest] if arrow else parts


def _whole(parts: list[str]) -> list[str]:
    return [" ".join(parts)]


def _counts_whole(parts: list[str]) -> list[str]:
    return parts[:1]


def _outcome_widths(width: int, trace_w: int | None, rows: list[_Row]
                    ) -> tuple[int, int, int] | None:
    """The summary's outcome, pools and cells columns: the ratios whole when they
    leave the outcome OUTCOME_MIN columns (or what it needs), else the counts of a
    ratio whole and the ratio under them, else (with no trace column) each count on
    a line of its own, while that leaves the outcome its widest unit as `_cell`
    wraps it (`wording.units`, at most OUTCOME_MIN); the outcome the rest, at most its
    widest line. None when the trace column leaves the outcome less; without it the
    outcome takes what is left (at least a column: a terminal that narrow folds its
    units). `trace_w`: the trace column's width, None when names have lines of their
    own (the rows then INDENT in)."""
    def widest(texts: list[str], header: str) -> int:
        return max([cell_len(t) for t in texts] + [cell_len(w) for w in header.split()])

    # the three columns' padding (a column each side), and the trace column or indent
    room = width - 3 * 2 - (INDENT if trace_w is None else trace_w + 2)
    lines = [_plain(line) for row in rows for line in row.outcome]
    outcome = widest(lines, "outcome")
    need = min(OUTCOME_MIN, outcome)
    # the widest unit, as `_cell` wraps it (past a line's first, CELL_HANG in)
    unit = min(need, max([cell_len(u) + (CELL_HANG if i else 0) for line in lines
                          for i, u in enumerate(words.units(line))], default=0))
    # the widest layout first; a count on a line of its own only under a name's line
    layouts = ((_whole, need), (_counts_whole, unit), (_ratio_units, unit))
    for units, least in layouts if trace_w is None else layouts[:2]:
        pools = widest([u for row in rows for u in units(row.pools)], POOLS_HEADER)
        cells = widest([u for row in rows for u in units(row.scanned)], CELLS_HEADER)
        if room - pools - cells >= least:
            break
    else:
        if trace_w is not None:
            return None
    return max(1, min(outcome, room - pools - cells)), pools, cells


def _print_outcomes(console: Console, r: DiffResult) -> bool:
    """The summary's table: per trace its outcome, pools re-pooled and cells scanned
    base -> head, then all traces. Every name is whole: in the trace column while the
    longest takes at most 1/TRACE_SHARE of the width and the rows fit beside it, else
    each on a line of its own with its row under it, INDENT in (the columns line up
    from row to row). Returns whether names took lines of their own."""
    b, h = r.totals(BASE), r.totals(HEAD)
    rows = [_Row(trace_label(t), trace_outcome(t, r.ignore, where=False),
                 _ratio_parts(t.base.pools_repooled, t.head.pools_repooled),
                 _ratio_parts(t.base.counter("cells_scanned"), t.head.counter("cells_scanned")))
            for t in r.traces]
    rows.append(_Row("all traces", [], _ratio_parts(b.pools_repooled, h.pools_repooled),
                     _ratio_parts(b.counter("cells_scanned"), h.counter("cells_scanned")),
                     BOLD))
    widest = max(cell_len(row.label) for row in rows)
    trace_w: int | None = widest if widest <= console.width // TRACE_SHARE else None
    widths = None if trace_w is None else _outcome_widths(console.width, trace_w, rows)
    if widths is None:  # the rows under their names, where the outcome has more room
        trace_w = None
        widths = _outcome_widths(console.width, None, rows)
    assert widths is not None
    outcome_w, pools_w, cells_w = widths

    def table(header: bool) -> Table:
        out = Table(show_header=header, header_style=BOLD, box=None, padding=(0, 1),
                    expand=False)
        if trace_w is not None:
            out.add_column("trace", width=trace_w, no_wrap=True)
        out.add_column("outcome", width=outcome_w)
        out.add_column(POOLS_HEADER, width=pools_w)
        out.add_column(CELLS_HEADER, width=cells_w)
        return out

    def cells(row: _Row) -> list[Group | Flow]:
        return [_cell(row.outcome), Flow(_ratio_units(row.pools), style=row.style),
                Flow(_ratio_units(row.scanned), style=row.style)]

    if trace_w is not None:
        summary = table(header=True)
        for row in rows:
            summary.add_row(Text(row.label, style=row.style), *cells(row))
        console.print(summary)
        return False
    console.print(Padding(table(header=True), (0, 0, 0, INDENT)))
    for row in rows:
        console.print(Padding(Text(row.label, style=row.style), (0, 0, 0, 1)))
        one = table(header=False)
        one.add_row(*cells(row))
        console.print(Padding(one, (0, 0, 0, INDENT)))
    return True


def _print_sparklines(console: Console, r: DiffResult, own_line: bool) -> None:
    """Per trace, pools marked and cells scanned per ubatch: `base ▂▅█  head ▂▃▃`, the
    two on one line always (the sparklines folded to the width left, at most
    SPARK_WIDTH marks a side), and how many ubatches a mark stands for, after them
    when it fits. The trace's name in a column when every row fits the width whole
    (and the summary kept its trace column), else on a line of its own, INDENT in."""
    widest = [(t, s) for t in r.traces if (s := shapes(t, SPARK_WIDTH))]  # the most marks
    if not widest:
        return
    traces = [t for t, _ in widest]
    labels = [trace_label(t) for t in traces]
    what_w = max(cell_len(what) for _, s in widest for what, *_ in s)
    trace_w = max(cell_len(label) for label in labels)
    # the sparklines' column: the width less each column and its padding (one a side)
    room = console.width - (trace_w + 2) - (what_w + 2) - 2
    # a row's sparklines and their note at their most marks
    whole = max(cell_len(SPARK_BASE + SPARK_HEAD) + len(bv) + len(hv) + 2
                + cell_len(words.per_bin(per)) for _, s in widest for _, bv, hv, per in s)
    own_line = own_line or whole > room
    if own_line:
        room = console.width - INDENT - (what_w + 2) - 2
    limit = max(1, min(SPARK_WIDTH, (room - cell_len(SPARK_BASE + SPARK_HEAD)) // 2))

    def table() -> Table:
        out = Table(show_header=False, box=None, padding=(0, 1), expand=False)
        if not own_line:
            out.add_column(width=trace_w, no_wrap=True)
        out.add_column(width=what_w, no_wrap=True)
        out.add_column()
        return out

    sparks = table()
    for t, label in zip(traces, labels, strict=True):
        if own_line:
            console.print(Padding(Text(label), (0, 0, 0, 1)))
            sparks = table()
        for what, base_values, head_values, per in shapes(t, limit):
            top = max(base_values + head_values)
            line = Flow(hang=2).add(Text.assemble(
                SPARK_BASE, (words.sparkline(base_values, top), "cyan"), SPARK_HEAD,
                (words.sparkline(head_values, top), "magenta")))
            line.add(Text(words.per_bin(per), style=DIM), gap=2)
            sparks.add_row(*([] if own_line else [Text(label)]), what, line)
        if own_line:
            console.print(Padding(sparks, (0, 0, 0, INDENT)))
    if not own_line:
        console.print(sparks)
