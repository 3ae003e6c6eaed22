"""The plain text view of a replay: one line per ubatch with what it marked and
scattered, its findings indented below, events in between, and a summary line.

Owns: `write_plain`. Used when the output is not a terminal (pipes, files, CI
logs): no colour, no markup, stable for grep. What is shown is decided by
`select.select` (the same navigation options as the rich view); how positions,
pools, rows, stale positions and codes are worded, by `kpool_cli.wording`. It
never counts: the tally is fed by the caller (`tally.tallied`) and only read here,
for the summary line, once every record has gone by.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TextIO

from .. import wording as words
from ..contracts.finding import Finding
from ..contracts.records import ExpectResult, OpEvent, UbatchRecord
from ..contracts.shape import Shape
from ..contracts.tally import Tally
from ..trace.model import Trace
from ..wording import visible
from .select import Selection, select

Record = OpEvent | UbatchRecord | ExpectResult


def _finding(f: Finding) -> str:
    return f"    {words.code(f.code, f.name)} [{f.severity}]: {visible(f.message)}"


def _stale(stale: dict[int, int]) -> str:
    return f" (stale {words.stale(stale)})" if stale else ""


def write_plain(out: TextIO, trace: Trace, engine: str, records: Iterable[Record],
                tally: Tally, only_findings: bool = False, *,
                selection: Selection | None = None,
                pairs: Iterable[tuple[Record, bool]] | None = None) -> None:
    """`records` filtered by `selection` (default: `only_findings` alone), or already
    decided `pairs` from `select` (then `records` is ignored); `tally` is read for
    the summary line, after the last record."""
    cfg = trace.cache
    selection = selection or Selection(only_findings=only_findings)
    out.write(f"trace {visible(trace.path)}"
              + (f" ({visible(trace.name)})" if trace.name else "") + f" under {visible(engine)}\n")
    # values as a trace writes them (true, not True)
    out.write("  cache: " + ", ".join(f"{k} {json.dumps(v)}" for k, v in cfg.as_dict().items())
              + "\n")
    note = selection.describe()
    if note:
        out.write(f"  ({note})\n")
    shown_ub = 0
    shape = Shape()  # every ubatch, shown or not
    for rec, shown in (pairs if pairs is not None else select(records, selection, trace)):
        if isinstance(rec, UbatchRecord):
            shape.add(rec)
        if not shown:
            continue
        if isinstance(rec, UbatchRecord):
            shown_ub += 1
            tokens = words.tokens(zip(rec.token_pos.tolist(), rec.token_seqs, strict=True))
            out.write(f"  ubatch {rec.index} ({words.place(rec.op, rec.batch_ubatch)}) {tokens}"
                      f"{_stale(rec.stale_batch)}: n_new {words.count(rec.n_new)}/"
                      f"{words.count(rec.n_new_g)} of {words.count(rec.n_pool_real)} pools "
                      f"[{words.pools(rec.pools.marked())}] "
                      f"rows {words.folded(rec.scatter_rep.tolist())}\n")
            for f in rec.findings:
                out.write(_finding(f) + "\n")
        elif isinstance(rec, OpEvent):
            if rec.kind == "note":
                out.write(f"  note: {visible(rec.message)}\n")
                continue
            msg = f": {visible(rec.message)}" if rec.message else ""
            out.write(f"  op {rec.op} {rec.kind} {rec.status}{_stale(rec.stale)}{msg}\n")
            for f in rec.findings:
                out.write(_finding(f) + "\n")
        else:
            verdict = "ok" if rec.ok else "FAILED" if tally.check else "FAILED (not checked)"
            out.write(f"  expect (op {rec.op}): {verdict}: {visible(rec.message)}\n")
    for what, series in shape.series():
        values, per = series.folded()
        out.write(f"  {what} ({words.per_bin(per)}): {' '.join(map(words.count, values))}\n")
    s = tally.summary()
    found = ", ".join(words.code_count(c, n) for c, n in s["findings"].items()) or "no findings"
    n_ub = s["ubatches"]
    part = selection.shown_note(shown_ub, n_ub, cfg.n_seq_max, counted=selection.filters)
    out.write(f"  summary: {words.counted(n_ub, 'ubatch', 'ubatches')}{part}, "
              f"{words.counted(s['pools_marked'], 'pool marked', 'pools marked')} "
              f"({s['pools_per_token']} per token), {found}{_failed(s, tally)}: "
              f"{s['status'].upper()}\n")


def _failed(summary: dict, tally: Tally) -> str:
    """Failed expectations: with --check, a cause of the status the line ends with;
    without it, said as not deciding the run."""
    failed = summary["expectations"]["failed"]
    if not failed:
        return ""
    return (f", {words.counted(failed, 'expectation')} failed"
            + ("" if tally.check else " (not checked: --check)"))
