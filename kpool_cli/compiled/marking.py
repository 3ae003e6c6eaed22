"""The compiled core's marking and scatter plan (ENGINE.md §6-7): engine/marking.py's
`mark` and engine/scatter.py's `build_plan`, with the loops over tokens, pools and
rows in kernels (compiled/kernels.py), and the race groups of engine/context.py.

Owns: `mark`, `build_plan`, `race_groups`, each the reference function's result for
the same arguments (the same arrays, the same EngineAbort messages), which the
tests hold byte for byte. The decisions (which candidate wins, which rows pad) are
the reference's rules, cited in the kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..cache.aborts import EngineAbort
from ..cache.cells import CELL_BITS, make_keys
from ..engine.layout import POS_CLEAN
from ..engine.marking import Marking, pad_bound
from ..engine.scatter import ScatterPlan
from . import kernels as k
from .layout import CompiledLayout


def _token_pairs(seqs: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray, bool]:
    """(pair_tok, pair_seq, one): each token's seq ids in order, and whether every
    token holds the same one sequence."""
    first = seqs[0]
    if len(first) == 1 and all(ss == first for ss in seqs):
        n = len(seqs)
        return np.arange(n, dtype=np.int64), np.full(n, first[0], dtype=np.int64), True
    pair_tok = np.array([i for i, ss in enumerate(seqs) for _ in ss], dtype=np.int64)
    pair_seq = np.array([s for ss in seqs for s in ss], dtype=np.int64)
    return pair_tok, pair_seq, False


def mark(layout: CompiledLayout, pos: np.ndarray, seqs: list[tuple[int, ...]],
         token_cells: np.ndarray, stale_from: list[int] | None, *,
         repool_all: bool, once_per_rep: bool) -> Marking:
    """engine/marking.py `mark` (ENGINE.md §6)."""
    kpool = layout.kpool
    start = layout.pool_start()
    n_pool = int(start[-1])
    if repool_all:
        return Marking(np.arange(n_pool, dtype=np.int64), n_pool, True)
    candidates: list[np.ndarray] = []
    if stale_from is not None:
        for s, sq in enumerate(layout.seqs):
            if stale_from[s] == POS_CLEAN or not len(sq.pools):
                continue
            first = int(np.searchsorted(sq.rep_pos(), stale_from[s], side="left"))
            candidates.append(np.arange(start[s] + first, start[s + 1], dtype=np.int64))
    pair_tok, pair_seq, one = _token_pairs(seqs)
    pair_ip = np.empty(pair_tok.size, dtype=np.int64)
    # the pairs grouped by sequence (ascending, as the reference asserts in that order)
    if one:
        groups = [(int(pair_seq[0]), pair_tok)]
    else:
        order = np.argsort(pair_seq, kind="stable")
        cut = np.flatnonzero(np.diff(pair_seq[order])) + 1
        groups = [(int(pair_seq[g[0]]), g) for g in np.split(order, cut)]
    for s, sel in groups:
        sq = layout.seqs[s]
        got = np.empty(sel.size, dtype=np.int64)
        tok = pair_tok[sel]
        k.pools_of_tokens(sq.keys.view, len(sq.pools), sq.first_pos(), sq.rep_pos(),
                          pos[tok], token_cells[tok], layout.by_order, kpool,
                          int(start[s]), got)
        if layout.by_order and (got == -2).any():
            raise EngineAbort(f"GGML_ASSERT(r >= 0): a token of seq {s} is not in its "
                              "sequence's layout (by-order rank lookup)")
        pair_ip[sel] = got
    candidates.append(pair_ip[pair_ip >= 0])
    cand = np.concatenate(candidates) if len(candidates) > 1 else candidates[0]
    if cand.size == 0:
        return Marking(cand, 0, False)
    seen = layout.scratch(n_pool)
    marked = k.first_winners(cand, layout.pool_cells(), once_per_rep, n_pool, seen)
    return Marking(marked, int(marked.size), False)


def build_plan(layout: CompiledLayout, marked: np.ndarray, n_new_g: int, pos: np.ndarray,
               seqs: list[tuple[int, ...]], token_cells: np.ndarray, n_rows: int,
               row_zero_padding: bool) -> ScatterPlan:
    """engine/scatter.py `build_plan` (ENGINE.md §7)."""
    kpool = layout.kpool
    pool_cells = layout.pool_cells()
    sq0 = layout.seqs[seqs[0][0]]
    keys = sq0.keys.view
    at = int(np.searchsorted(keys, np.int64(pos[0]) << CELL_BITS, side="left"))
    if at >= keys.size or int(keys[at] >> CELL_BITS) != int(pos[0]):
        raise EngineAbort(f"GGML_ASSERT: the ubatch's first token (seq {seqs[0][0]}, pos "
                          f"{int(pos[0])}) is not in its sequence's layout")
    n_new = int(marked.size)
    rows = np.empty((n_new_g, kpool), dtype=np.int64)
    rep = np.empty(n_new_g, dtype=np.int64)
    entry_pool = np.full(n_new_g, -1, dtype=np.int64)
    entry_pool[:n_new] = marked
    rows[:n_new] = layout.members_of(marked)
    rep[:n_new] = pool_cells[marked]
    reps_sorted = 0
    readers = np.empty(0, dtype=np.int64)
    if n_new_g > n_new:
        reps_sorted = int(pool_cells.size)
        n_pad = n_new_g - n_new
        if row_zero_padding:
            pad = np.zeros(n_pad, dtype=np.int64)
            readers = np.flatnonzero(pool_cells == 0)
        else:  # rows no pool's rep is on: no reader, by the choice itself
            pad = np.empty(n_pad, dtype=np.int64)
            if k.padding_rows(pool_cells, n_pad, n_rows, pad) < n_pad:
                raise EngineAbort("GGML_ASSERT(pad_cell < kv_size*n_stream): no row left "
                                  "for a padding entry")
        rep[n_new:] = pad
        rows[n_new:] = pad[:, None]
    visible = np.empty(len(seqs), dtype=np.int64)
    first = np.array([ss[0] for ss in seqs], dtype=np.int64)
    if (first == first[0]).all():
        groups: list[tuple[int, np.ndarray | slice]] = [(int(first[0]), slice(None))]
    else:
        order = np.argsort(first, kind="stable")
        cut = np.flatnonzero(np.diff(first[order])) + 1
        groups = [(int(first[g[0]]), g) for g in np.split(order, cut)]
    for s, sel in groups:
        sq = layout.seqs[s]
        if layout.by_order:
            rank = np.searchsorted(sq.keys.view, make_keys(pos[sel], token_cells[sel]))
            visible[sel] = np.minimum(len(sq.pools), (rank + 1) // kpool)
        else:
            visible[sel] = np.searchsorted(sq.rep_pos(), pos[sel], side="right")
    assert pad_bound(pool_cells.size) > pool_cells.size
    return ScatterPlan(pool_cells, entry_pool, rows, rep, visible, n_new, reps_sorted,
                       readers)


def race_groups(n_rows: int) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]]:
    """engine/context.py `race_groups` for a cache of n_rows global rows, through
    `kernels.race_groups`."""

    def groups(rep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        order, starts, rows = k.race_groups(rep, n_rows)
        return order, starts, rows

    return groups
