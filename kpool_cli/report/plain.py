"""The plain text view of a replay: one line per ubatch with what it marked and
scattered, its findings indented below, events in between, and a summary line.

Owns: `write_plain`. Used when the output is not a terminal (pipes, files, CI
logs): no colour, no markup, stable for grep. What is shown is decided by
`select.select` (the same navigation options as the rich view).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

from ..records import ExpectResult, OpEvent, UbatchRecord
from ..trace.model import Trace
from ..verdict.codes import Finding
from ..wording import visible
from .select import Selection, select
from .tally import Tally


def tokens_text(tokens: Iterable[tuple[int, tuple[int, ...]]]) -> str:
    """`seq 0 pos 12; seq 1 pos 12..15 (3)`: (pos, seq set) pairs, one part per
    sequence set in order of appearance, positions as a half-open span."""
    by_seq: dict[tuple[int, ...], list[int]] = {}
    for p, ss in tokens:
        by_seq.setdefault(ss, []).append(p)
    parts = []
    for ss, ps in by_seq.items():
        span = f"{ps[0]}" if len(ps) == 1 else f"{min(ps)}..{max(ps) + 1} ({len(ps)})"
        parts.append(f"seq {','.join(map(str, ss))} pos {span}")
    return "; ".join(parts)


def _finding(f: Finding) -> str:
    return f"    {f.code} {f.name} [{f.severity}]: {visible(f.message)}"


def write_plain(out: TextIO, trace: Trace, engine: str,
                records: Iterable[OpEvent | UbatchRecord | ExpectResult], tally: Tally,
                only_findings: bool = False, *, selection: Selection | None = None,
                pairs: Iterable[tuple[OpEvent | UbatchRecord | ExpectResult, bool]] | None = None
                ) -> None:
    """`records` filtered by `selection` (default: `only_findings` alone), or already
    decided `pairs` from `select` (then `records` is ignored)."""
    cfg = trace.cache
    selection = selection or Selection(only_findings=only_findings)
    out.write(f"trace {visible(trace.path)}"
              + (f" ({visible(trace.name)})" if trace.name else "") + f" under {visible(engine)}\n")
    out.write("  cache: " + ", ".join(f"{k} {v}" for k, v in cfg.as_dict().items()) + "\n")
    note = selection.describe()
    if note:
        out.write(f"  ({note})\n")
    shown_ub = 0
    for rec, shown in (pairs if pairs is not None else select(records, selection, trace)):
        tally.add(rec)
        if not shown:
            continue
        if isinstance(rec, UbatchRecord):
            shown_ub += 1
            pools = " ".join(f"{s}:{k}" for s, k in rec.pools.marked()) or "-"
            stale = (" stale " + ",".join(f"{s}@{p}" for s, p in rec.stale_batch.items())
                     if rec.stale_batch else "")
            tokens = tokens_text(zip(rec.token_pos.tolist(), rec.token_seqs, strict=True))
            out.write(f"  ubatch {rec.index} (op {rec.op}.{rec.batch_ubatch}) {tokens}"
                      f"{stale}: n_new {rec.n_new}/{rec.n_new_g} of {rec.n_pool_real} "
                      f"pools [{pools}] rows {rec.scatter_rep.tolist()}\n")
            for f in rec.findings:
                out.write(_finding(f) + "\n")
        elif isinstance(rec, OpEvent):
            if rec.kind == "note":
                out.write(f"  note: {visible(rec.message)}\n")
                continue
            stale = (" stale " + ",".join(f"{s}@{p}" for s, p in rec.stale.items())
                     if rec.stale else "")
            msg = f": {visible(rec.message)}" if rec.message else ""
            out.write(f"  op {rec.op} {rec.kind} {rec.status}{stale}{msg}\n")
            for f in rec.findings:
                out.write(_finding(f) + "\n")
        else:
            out.write(f"  expect (op {rec.op}): {'ok' if rec.ok else 'FAILED'}: "
                      f"{visible(rec.message)}\n")
    s = tally.summary()
    found = ", ".join(f"{c} x{n}" for c, n in s["findings"].items()) or "no findings"
    part = f" ({shown_ub} shown)" if selection.filters else ""
    out.write(f"  summary: {s['ubatches']} ubatches{part}, {s['pools_marked']} pools marked "
              f"({s['pools_per_token']} per token), {found}: {s['status'].upper()}\n")
