"""The run form's rule (docs/FORMATS.md, "Runs"): which listed pools and scatter
entries of a ubatch are written as one run, found over the record's columns.

Owns: `runs` (maximal linked ranges whose first member steps evenly),
`arithmetic` (members evenly spaced), and the two listings' spans, `pool_spans`
and `scatter_spans`, in numpy. The compiled core finds the same spans in one
kernel pass each (compiled/kernels.py `pool_spans`, `scatter_spans`) and hands
them to the record (`UbatchRecord.pool_spans`, `scatter_spans`); the tests hold
the two equal. The JSON writer turns spans into runs (report/json_report.py).

A span is [a, b): entries a..b-1 (b - a >= 2) form one run. Spans are ascending
and never overlap.
"""

from __future__ import annotations

import numpy as np

from .records import Pools

NO_SPANS = np.empty((0, 2), dtype=np.int64)  # no run (read-only)
NO_SPANS.flags.writeable = False


def runs(rows: np.ndarray, link: np.ndarray) -> np.ndarray:
    """The spans [m, 2] of the maximal index ranges [a, b), b - a >= 2, of `rows`
    [n, kpool] (member rows) where every neighbour pair i, i + 1 is linked
    (`link[i]`, [n - 1] bool) and the first member moves by the same step from each
    to the next. A pair whose step differs from the linked pair before it starts no
    run (so runs never overlap)."""
    if link.size == 0 or not link.any():
        return NO_SPANS
    step = np.diff(rows[:, 0])
    link = link.copy()
    link[1:] &= ~(link[:-1] & (step[1:] != step[:-1]))
    edge = np.diff(np.concatenate(([0], link.astype(np.int8), [0])))
    out = np.empty((int(np.count_nonzero(edge == 1)), 2), dtype=np.int64)
    out[:, 0] = np.flatnonzero(edge == 1)
    out[:, 1] = np.flatnonzero(edge == -1) + 1
    return out


def arithmetic(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per entry of `rows` [n, kpool]: its members are c0, c0 + d, c0 + 2 d, ... (one
    step d); and d (1 where kpool is 1)."""
    n, kpool = rows.shape
    if kpool < 2:
        return np.ones(n, dtype=bool), np.ones(n, dtype=np.int64)
    d = rows[:, 1] - rows[:, 0]
    ok = np.ones(n, dtype=bool)
    for j in range(2, kpool):  # a column at a time: 16x faster than [n, kpool] products
        ok &= rows[:, j] - rows[:, j - 1] == d
    return ok, d


def pool_spans(p: Pools) -> np.ndarray:
    """The runs of listed pools: pools k0..k1-1 of one sequence with the same `new`,
    whose positions follow each other (pool k0 + i: first_pos p0 + i kpool, its rep
    at + kpool - 1) and whose member rows step evenly (member j on row c0 + i e + j d;
    its rep the last member)."""
    n, kpool = p.cells.shape
    if n < 2:
        return NO_SPANS
    ok, d = arithmetic(p.cells)
    regular = ok & (p.rep == p.cells[:, -1]) & (p.last_pos == p.first_pos + kpool - 1)
    link = (regular[:-1] & regular[1:] & (p.seq[1:] == p.seq[:-1]) & (p.k[1:] == p.k[:-1] + 1)
            & (p.first_pos[1:] == p.first_pos[:-1] + kpool) & (p.new[1:] == p.new[:-1])
            & (d[1:] == d[:-1]))
    return runs(p.cells, link)


def scatter_spans(rows: np.ndarray, rep: np.ndarray, pad: np.ndarray) -> np.ndarray:
    """The runs of scatter entries: real entries whose member rows step evenly (entry
    i: member j on row c0 + i e + j d), each pooled into its last member."""
    if rep.size < 2:
        return NO_SPANS
    ok, d = arithmetic(rows)
    regular = ok & (rep == rows[:, -1]) & ~pad
    return runs(rows, regular[:-1] & regular[1:] & (d[1:] == d[:-1]))


def run_cells(rows: np.ndarray, a: np.ndarray) -> list[list[int]]:
    """[c0, d, e] of each run, from its first entry a (every run's at once): member j
    of entry a + i is row c0 + i e + j d (d 1 where kpool is 1)."""
    if a.size <= _FEW_RUNS:  # row by row: two fancy indexings cost more
        pairs = [(rows[i].tolist(), int(rows[i + 1, 0])) for i in a.tolist()]
    else:
        pairs = list(zip(rows[a].tolist(), rows[a + 1, 0].tolist(), strict=True))
    return [[h[0], h[1] - h[0] if len(h) > 1 else 1, x - h[0]] for h, x in pairs]


# up to this many runs, a listing's runs are read run by run (a re-pool-all listing of
# two sequences is two runs), not by fancy indexing of whole columns
_FEW_RUNS = 8
