"""The JSON report of TRACE_FORMAT.md ("Report"), written as the replay streams.

Owns: the mapping from records to report fields (field names are a public
contract: add, never rename) and `write_report`, which streams ubatches as they
come and holds only events and expectations (a few per op) until the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TextIO

from .. import __version__
from ..records import ExpectResult, OpEvent, UbatchRecord
from ..trace.load import TraceError
from ..trace.model import Trace
from ..verdict.codes import Finding
from .tally import Tally


def finding_json(f: Finding) -> dict:
    out = {"code": f.code, "name": f.name, "severity": f.severity, "message": f.message,
           "rows": list(f.rows), "seqs": list(f.seqs)}
    if f.tokens:
        out["tokens"] = [{"pos": p, "seq": s} for p, s in f.tokens]
    if f.pools:
        out["pools"] = [list(p) for p in f.pools]
    if f.evidence:
        out["evidence"] = f.evidence
    return out


def event_json(e: OpEvent) -> dict:
    out = {"op": e.op, "kind": e.kind, "status": e.status,
           "stale": {str(s): p for s, p in e.stale.items()}}
    if e.message:
        out["message"] = e.message
    if e.findings:
        out["findings"] = [finding_json(f) for f in e.findings]
    return out


def ubatch_json(r: UbatchRecord) -> dict:
    tokens = []
    for k, (p, ss, row) in enumerate(zip(r.token_pos.tolist(), r.token_seqs,
                                         r.token_rows.tolist(), strict=True)):
        t = {"pos": p, "seq": list(ss), "cell": row}
        if r.token_ext is not None:
            t["ext"] = r.token_ext[k].tolist()
        tokens.append(t)
    return {
        "index": r.index, "op": r.op, "batch_ubatch": r.batch_ubatch,
        "tokens": tokens,
        "stale_batch": {str(s): p for s, p in r.stale_batch.items()},
        "n_pool_real": r.n_pool_real, "n_new": r.n_new, "n_new_g": r.n_new_g,
        "pools": [{"seq": p.seq, "k": p.k, "first_pos": p.first_pos, "last_pos": p.last_pos,
                   "cells": list(p.cells), "rep": p.rep, "new": p.new} for p in r.pools],
        "scatter": [{"rep": rep, "cells": cells, "pad": pad} for rep, cells, pad in zip(
            r.scatter_rep.tolist(), r.scatter_rows.tolist(), r.scatter_pad.tolist(),
            strict=True)],
        "cost": dict(r.cost),
        "findings": [finding_json(f) for f in r.findings],
    }


def report_header(trace: Trace, engine: str, backend: str | None) -> dict:
    return {
        "kpool_report": 1,
        "tool": {"name": "kpool", "version": __version__},
        "trace": {"path": trace.path, "name": trace.name, "sha256": trace.sha256},
        "engine": engine,
        "backend": backend,
        "config": trace.cache.as_dict(),
    }


def write_report(out: TextIO, trace: Trace, engine: str, backend: str | None,
                 records: Iterable[OpEvent | UbatchRecord | ExpectResult], tally: Tally,
                 indent: str = "") -> None:
    """Stream one report to `out`, feeding `tally` on the way. A trace that turns out
    invalid mid-replay (TraceError) ends the report there, with its `problems` and
    `summary.status` "invalid": the document is always whole."""
    head = report_header(trace, engine, backend)
    out.write("{\n")
    for key, value in head.items():
        out.write(f'{indent}  {json.dumps(key)}: {json.dumps(value)},\n')
    out.write(f'{indent}  "ubatches": [')
    events, expects = [], []
    first = True
    try:
        for rec in records:
            tally.add(rec)
            if isinstance(rec, UbatchRecord):
                out.write(("\n" if first else ",\n") + f"{indent}    "
                          + json.dumps(ubatch_json(rec)))
                first = False
            elif isinstance(rec, OpEvent):
                events.append(event_json(rec))
            else:
                expects.append({"op": rec.op, "ok": rec.ok, "message": rec.message})
    except TraceError as e:  # invalid at this point: the document still closes, saying why
        tally.invalidate(e.problems)
    out.write(("" if first else f"\n{indent}  ") + "],\n")
    for key, value in (("events", events), ("expectations", expects)):
        out.write(f"{indent}  {json.dumps(key)}: [")
        out.write(",".join(f"\n{indent}    " + json.dumps(v) for v in value))
        out.write(("" if not value else f"\n{indent}  ") + "],\n")
    if tally.problems:
        problems = [{"file": p.file, "line": p.line, "column": p.column, "field": p.field,
                     "message": p.message} for p in tally.problems]
        out.write(f'{indent}  "problems": {json.dumps(problems)},\n')
    out.write(f'{indent}  "summary": {json.dumps(tally.summary())}\n{indent}}}')
