"""The JSON report of TRACE_FORMAT.md ("Report"), written as the replay streams.

Owns: the mapping from records to report fields (field names are a public
contract: add, never rename) and `write_report`, which streams ubatches as they
come and holds only events and expectations (a few per op) until the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TextIO

import numpy as np

from .. import __version__
from ..records import ExpectResult, OpEvent, Pools, UbatchRecord
from ..trace.load import TraceError
from ..trace.model import Trace
from ..verdict.codes import Finding
from .tally import Tally


def finding_json(f: Finding) -> dict:
    """A finding. Its pools [seq, k] are written as [seq, k0, k1] where k0..k1-1 of one
    sequence follow each other."""
    out = {"code": f.code, "name": f.name, "severity": f.severity, "message": f.message,
           "rows": list(f.rows), "seqs": list(f.seqs)}
    if f.tokens:
        out["tokens"] = [{"pos": p, "seq": s} for p, s in f.tokens]
    if f.pools:
        out["pools"] = pool_ids_json(f.pools)
    if f.evidence:
        out["evidence"] = f.evidence
    return out


def pool_ids_json(pools: tuple[tuple[int, int], ...]) -> list[list[int]]:
    """(seq, k) pairs, consecutive k of one sequence folded into [seq, k0, k1]."""
    a = np.asarray(pools, dtype=np.int64).reshape(-1, 2)
    link = (a[1:, 0] == a[:-1, 0]) & (a[1:, 1] == a[:-1, 1] + 1)
    pairs = a.tolist()
    out: list[list[int]] = []
    at = 0
    for lo, hi in runs(link):
        out += pairs[at:lo]
        out.append([pairs[lo][0], pairs[lo][1], pairs[hi - 1][1] + 1])
        at = hi
    return out + pairs[at:]


def event_json(e: OpEvent) -> dict:
    out = {"op": e.op, "kind": e.kind, "status": e.status,
           "stale": {str(s): p for s, p in e.stale.items()}}
    if e.message:
        out["message"] = e.message
    if e.findings:
        out["findings"] = [finding_json(f) for f in e.findings]
    return out


def runs(link: np.ndarray) -> list[tuple[int, int]]:
    """Maximal [a, b) index ranges of length >= 2 where every neighbour pair i, i + 1
    (a <= i < b - 1) is linked (`link[i]`), from `link` [n - 1] bool."""
    if link.size == 0 or not link.any():
        return []
    edge = np.diff(np.concatenate(([0], link.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edge == 1).tolist(),
                    (np.flatnonzero(edge == -1) + 1).tolist(), strict=True))


def pools_json(p: Pools, kpool: int) -> list[dict]:  # kpool 0: no runs
    """The listed pools, in order. A run of pools k0..k1-1 of one sequence with the
    same `new` whose members are consecutive rows, pool after pool, and whose
    positions follow each other (pool k0 + i: first_pos p0 + i kpool, member rows
    c0 + i kpool .. + kpool - 1, rep the last) is written as one
    {"seq", "k": [k0, k1], "first_pos": p0, "cells": [c0, c0 + (k1 - k0) kpool], "new"}."""
    n = len(p)
    regular = (np.all(p.cells == p.cells[:, :1] + np.arange(p.cells.shape[1]), axis=1)
               & (p.rep == p.cells[:, -1]) & (p.last_pos == p.first_pos + kpool - 1)
               if n and kpool else np.zeros(n, dtype=bool))
    link = (regular[:-1] & regular[1:] & (p.seq[1:] == p.seq[:-1]) & (p.k[1:] == p.k[:-1] + 1)
            & (p.first_pos[1:] == p.first_pos[:-1] + kpool)
            & (p.cells[1:, 0] == p.cells[:-1, 0] + kpool) & (p.new[1:] == p.new[:-1]))
    spans = runs(link)
    alone = np.ones(n, dtype=bool)
    for a, b in spans:
        alone[a:b] = False
    idx = np.flatnonzero(alone)
    singles = dict(zip(idx.tolist(), zip(
        p.seq[idx].tolist(), p.k[idx].tolist(), p.first_pos[idx].tolist(),
        p.last_pos[idx].tolist(), p.cells[idx].tolist(), p.rep[idx].tolist(),
        p.new[idx].tolist(), strict=True), strict=True))
    keys = ("seq", "k", "first_pos", "last_pos", "cells", "rep", "new")
    out: list[dict] = []
    at = 0
    for a, b in [*spans, (n, n)]:
        out += [dict(zip(keys, singles[i], strict=True)) for i in range(at, a)]
        if a < n:
            out.append({"seq": int(p.seq[a]), "k": [int(p.k[a]), int(p.k[b - 1]) + 1],
                        "first_pos": int(p.first_pos[a]),
                        "cells": [int(p.cells[a, 0]), int(p.cells[b - 1, 0]) + kpool],
                        "new": bool(p.new[a])})
        at = b
    return out


def scatter_json(r: UbatchRecord, kpool: int) -> list[dict]:
    """The scatter entries, in order. A run of real entries each pooling kpool
    consecutive rows, entry after entry, into the last of them is written as one
    {"cells": [c0, c1], "pad": false}: entries c0 .. c0 + kpool - 1, then the next
    kpool rows, up to c1."""
    rows, rep, pad = r.scatter_rows, r.scatter_rep, r.scatter_pad
    n = int(rep.size)
    regular = (np.all(rows == rows[:, :1] + np.arange(rows.shape[1]), axis=1)
               & (rep == rows[:, -1]) & ~pad if n and kpool else np.zeros(n, dtype=bool))
    link = regular[:-1] & regular[1:] & (rows[1:, 0] == rows[:-1, 0] + kpool)
    reps, cells, pads = rep.tolist(), rows.tolist(), pad.tolist()
    out: list[dict] = []
    at = 0
    for a, b in runs(link):
        out += [{"rep": reps[i], "cells": cells[i], "pad": pads[i]} for i in range(at, a)]
        out.append({"cells": [cells[a][0], cells[b - 1][0] + kpool], "pad": False})
        at = b
    out += [{"rep": reps[i], "cells": cells[i], "pad": pads[i]} for i in range(at, n)]
    return out


def ubatch_json(r: UbatchRecord, run_form: bool = True) -> dict:
    """A ubatch. `run_form`: pools and scatter entries that follow each other are
    written as runs (pools_json, scatter_json); without it, one object each (what
    `--pools all` asks for: the full listing)."""
    kpool = int(r.scatter_rows.shape[1]) if run_form else 0
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
        "pools": pools_json(r.pools, kpool),
        "scatter": scatter_json(r, kpool),
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
                 indent: str = "", run_form: bool = True) -> None:
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
                          + json.dumps(ubatch_json(rec, run_form)))
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
