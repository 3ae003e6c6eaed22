"""`kpool diff --html FILE`: the comparison as one self-contained page of pictures.

Owns: `write_diff_page`. Per trace, the two versions' host work per ubatch and summed
(cells scanned, pools marked, rows gathered) as inline SVG curves, base and head on
one scale (head's line thin over base's wide one, so both show where they are equal),
with the ubatches and events where their decisions part and the op where
the runs part marked (every per-ubatch panel), and the findings head fixed (below the
axis) and introduced (above it) where they occur (the first panel): at their ubatch,
or between two ubatches at the event (an edit, an abort) that raised them; after the
runs part, at the places of the run that has them (`FindingChange.places`, which the
diff's text summarises); then the diff's own summary lines.

Invariants: the page embeds everything it shows (inline CSS and SVG, no script, no
font, no request of any kind), so it opens offline and with JavaScript off; every
text taken from an input goes through `html.escape` after `wording.visible`; a
curve has at most `POINTS` points whatever the run's length (a point is the largest
value of the ubatches it covers; a sum curve, the sum at its last ubatch), so the
page's size grows with the number of traces, not of ubatches.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from typing import TextIO

from .. import wording as words
from ..diff.compare import DiffResult, EventDiff, TraceDiff, UbatchDiff
from ..diff.summary import RunSummary
from ..wording import visible
from .diff_view import engines, trace_label, trace_outcome, verdict_text, write_summary_plain

POINTS = 400  # at most this many points a curve
CURVES = (("cells scanned", "cells_scanned"), ("pools marked", "n_new"),
          ("rows gathered", "rows_gathered"))
W, H, PAD = 760, 120, 44  # a panel's plot area and its left margin (px)
BASE_COLOUR, HEAD_COLOUR = "#1f77b4", "#d95f02"
# base's line is drawn wide and head's thin over it: where the two sides are equal,
# head's runs inside base's, and both show (a line of one width would hide base)
BASE_WIDTH, HEAD_WIDTH = 4, 1.5
FIXED_COLOUR, INTRODUCED_COLOUR, PART_COLOUR = "#2ca02c", "#d62728", "#7f7f7f"

STYLE = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 4px}
p.meta{color:#555;margin:0 0 8px} .key span{margin-right:16px}
svg{display:block;margin:6px 0 2px} text{font:11px system-ui,sans-serif;fill:#444}
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}
"""


def _e(text: object) -> str:
    return html.escape(visible(str(text)), quote=True)


def _series(run: RunSummary, key: str) -> list[int]:
    if key == "n_new":
        return [u.n_new for u in run.ubatches]
    return [dict(u.cost).get(key, 0) for u in run.ubatches]


def _folded(values: Sequence[int], per: int) -> tuple[list[int], list[int]]:
    """(the largest, the running sum at the end) of each `per` ubatches."""
    peaks, sums, total = [], [], 0
    for i in range(0, len(values), per):
        chunk = values[i:i + per]
        peaks.append(max(chunk))
        total += sum(chunk)
        sums.append(total)
    return peaks, sums


def _path(values: Sequence[int], top: int, n: int, colour: str, width: float,
          dash: str = "") -> str:
    if not values:
        return ""
    step = W / max(n - 1, 1)
    pts = " ".join(f"{PAD + i * step:.1f},{H - (v / top * (H - 8) if top else 0):.1f}"
                   for i, v in enumerate(values))
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<polyline fill="none" stroke="{colour}" stroke-width="{width}"{extra} '
            f'points="{pts}"/>')


def _at(at: int, event: bool, n: int, per: int) -> float:
    """The x of a place on the ubatch axis (`Place.at`): ubatch `at`'s point (of the
    `per` it is folded with); an event's, half a step before ubatch `at`, the one
    after it (so between it and the one before), kept on the panel."""
    step = W / max(n - 1, 1)
    u = at - 0.5 if event else at // per * per
    return PAD + min(max(u / per, 0.0), max(n - 1, 0)) * step


def _marks(t: TraceDiff, n: int, per: int) -> tuple[list[str], list[str]]:
    """SVG marks: the ubatches and events whose decisions part (grey ticks), the op
    where the runs part (a dark dashed tick), and the findings fixed (green, below)
    and introduced (red, above) at each of their places (`FindingChange.places`: an
    aligned ubatch or event, or after the runs part a place of the run that has them),
    each with a title."""
    ticks, dots = [], []
    for e in t.entries:
        if isinstance(e, UbatchDiff):
            x = _at(e.base.index, False, n, per)
            label = f"ubatch {e.base.index} ({e.where})"
        else:
            x = _at(e.before, True, n, per)
            label = f"{e.where} ({_e(e.kind)}), before ubatch {e.before}"
        ticks.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{H}" stroke="{PART_COLOUR}" '
                     f'stroke-opacity="0.35"><title>{label}: {_e(", ".join(e.fields))} '
                     "differ</title></line>")
    if t.parting is not None:
        p = t.parting
        x = _at(p.before, True, n, per)
        ticks.append(f'<line class="parting" data-op="{p.op}" x1="{x:.1f}" x2="{x:.1f}" '
                     f'y1="0" y2="{H}" stroke="{PART_COLOUR}" stroke-width="1.5" '
                     f'stroke-dasharray="4 2"><title>the runs part at op {p.op} '
                     f"({_e(p.kind)}), before ubatch {p.before}: {_e(p.reason)}</title></line>")
    stacked: dict[tuple[str, float], int] = {}  # marks already at (kind, x): stack them
    for changes, y0, dy, colour, what in ((t.introduced, 4, 9, INTRODUCED_COLOUR, "introduced"),
                                          (t.fixed, H - 4, -9, FIXED_COLOUR, "fixed")):
        for c in changes:
            for place in c.places:
                x = round(_at(place.at, place.event, n, per), 1)
                j = stacked.get((what, x), 0)
                if j * 9 >= H // 2:
                    continue  # a column full of marks: its first ones say it
                stacked[(what, x)] = j + 1
                attrs = (f'data-op="{place.op}" data-before="{place.at}"' if place.event
                         else f'data-ubatch="{place.at}"')
                kind = f"{what} event" if place.event else what
                side = "" if c.aligned else f" in {'head' if what == 'introduced' else 'base'}"
                title = (f"at {place.where}{side}, before ubatch {place.at}" if place.event
                         else f"at ubatch {place.at} ({place.where}{side})")
                dots.append(f'<circle class="finding {kind}" {attrs} cx="{x:.1f}" '
                            f'cy="{y0 + j * dy}" r="4" fill="{colour}"><title>{_e(c.code)} '
                            f"{what} {_e(title)}</title></circle>")
    return ticks, dots


def _panel(title: str, base: list[int], head: list[int], n: int, marks: str,
           cumulative: bool, last: int) -> str:
    top = max([*base, *head, 0])
    label = (f"{title}{' (summed)' if cumulative else ' per ubatch'}, ubatch 0 to "
             f"{last}")
    dash = "4 3" if cumulative else ""
    return (f'<svg role="img" aria-label="{_e(label)}" width="{PAD + W + 8}" height="{H + 18}" '
            f'viewBox="0 0 {PAD + W + 8} {H + 18}" xmlns="http://www.w3.org/2000/svg">'
            f'<rect x="{PAD}" y="0" width="{W}" height="{H}" fill="#fafafa" stroke="#ddd"/>'
            f'{marks}{_path(base, top, n, BASE_COLOUR, BASE_WIDTH, dash)}'
            f'{_path(head, top, n, HEAD_COLOUR, HEAD_WIDTH, dash)}'
            f'<text x="{PAD - 4}" y="10" text-anchor="end">{words.count(top)}</text>'
            f'<text x="{PAD - 4}" y="{H}" text-anchor="end">0</text>'
            f'<text x="{PAD}" y="{H + 14}">{_e(label)}</text></svg>')


def _trace_section(t: TraceDiff, base: RunSummary, head: RunSummary,
                   ignore: tuple[str, ...]) -> str:
    n_ub = max(len(base.ubatches), len(head.ubatches))
    per = max(1, -(-n_ub // POINTS))
    n = -(-n_ub // per) if n_ub else 0
    ticks, dots = _marks(t, n, per)
    out = [f"<section><h2>{_e(trace_label(t))}</h2>",
           f'<p class="meta">{_e(t.trace_path)}: '
           f"{_e('; '.join(''.join(x for x, _ in line) for line in trace_outcome(t, ignore)))}"
           f"; {words.counted(n_ub, 'ubatch', 'ubatches')}"
           + (f", a point is the largest of {words.count(per)} (sums: at its last)"
              if per > 1 else "")
           + "</p>"]
    if t.parting is not None:
        out.append(f'<p class="meta">the runs part at op {t.parting.op} '
                   f"({_e(t.parting.kind)}): {_e(t.parting.reason)}</p>")
    for k, (title, key) in enumerate(CURVES):
        b_peak, b_sum = _folded(_series(base, key), per)
        h_peak, h_sum = _folded(_series(head, key), per)
        # the parting ticks on every per-ubatch panel, the findings on the first
        marks = "".join(ticks) + ("".join(dots) if k == 0 else "")
        out.append(_panel(title, b_peak, h_peak, n, marks, False, max(n_ub - 1, 0)))
        out.append(_panel(title, b_sum, h_sum, n, "", True, max(n_ub - 1, 0)))
    events = [e for e in t.entries if isinstance(e, EventDiff)]
    if events:
        out.append("<p class=\"meta\">events that differ: "
                   + ", ".join(f"op {e.op} ({_e(e.kind)}: {_e(', '.join(e.fields))})"
                               for e in events) + "</p>")
    out.append("</section>")
    return "".join(out)


def write_diff_page(out: TextIO, r: DiffResult,
                    pairs: Sequence[tuple[RunSummary, RunSummary]]) -> None:
    """The page of `r` (the comparison of `pairs`, in order)."""
    base, head = engines(r)
    summary = io.StringIO()
    write_summary_plain(summary, r)
    out.write("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
              f"<title>kpool diff: {_e(base)} vs {_e(head)}</title>"
              f"<style>{STYLE}</style></head><body>")
    out.write(f"<h1>kpool diff: base {_e(base)} vs head {_e(head)}</h1>")
    out.write(f'<p class="meta">{_e(verdict_text(r)[0])}</p>')
    out.write(f'<p class="key"><span style="color:{BASE_COLOUR}">━ base {_e(base)}</span>'
              f'<span style="color:{HEAD_COLOUR}">━ head {_e(head)}</span>'
              "<span>(where equal, head is drawn inside base)</span>"
              "<span>╌ summed over the run</span>"
              f'<span style="color:{PART_COLOUR}">│ decisions part</span>'
              f'<span style="color:{PART_COLOUR}">┆ the runs part</span>'
              f'<span style="color:{FIXED_COLOUR}">● fixed</span>'
              f'<span style="color:{INTRODUCED_COLOUR}">● introduced</span></p>')
    for t, (b, h) in zip(r.traces, pairs, strict=True):
        out.write(_trace_section(t, b, h, r.ignore))
    out.write(f"<h2>summary</h2><pre>{html.escape(summary.getvalue())}</pre></body></html>\n")
