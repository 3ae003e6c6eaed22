"""Marking: which pools a ubatch re-pools, and the graph size of that list
(ENGINE.md §6, llama.cpp's kpool_build_state).

Owns: `mark` (a pure function of the layout, the ubatch and the stale snapshot),
`n_new_graph`, `pad_bound` and `entries_bound` (the most entries a plan has, for the
memory budget).

The real engine marks through generation arrays (`is_new` per pool, and for
rep-once `rep_gen` per global row) so that "marked in this ubatch" resets in O(1).
Here the same decisions are made on whole arrays: candidates are listed in the
engine's order (stale pools by sequence, then tokens in ubatch order with their
seq ids in the order given) and the first candidate per pool (cache-safe) or per
rep row (rep-once) wins, exactly as the generation test makes it win. The
generation arrays' zero-fill is still counted, as host work, by `gen_zeroed`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cache.aborts import EngineAbort
from ..cache.batch import one_id_each
from ..cache.cells import make_keys
from .layout import POS_CLEAN, Layout, all_clean, by_sequence


@dataclass(frozen=True, slots=True)
class Marking:
    marked: np.ndarray  # [n_new] | i | global pool index, ascending (layout order)
    n_new: int
    repool_all: bool  # cache-safe with a shared layout: every pool marked

    @classmethod
    def of(cls, marked: np.ndarray) -> Marking:
        """The marking of the pools `marked` (not re-pool-all); none marked is
        `NONE_MARKED`, one array, so that what a ubatch that marks nothing builds from
        its plan alone is kept by identity while the padding stands (arrays.SameArrays)."""
        return cls(marked if marked.size else NONE_MARKED, int(marked.size), False)


NONE_MARKED = np.empty(0, dtype=np.int64)
NONE_MARKED.flags.writeable = False


def _first_of_each(values: np.ndarray) -> np.ndarray:
    """Indices of the first occurrence of each distinct value, in input order."""
    if values.size == 0:
        return np.empty(0, dtype=np.int64)
    _, first = np.unique(values, return_index=True)
    return np.sort(first)


def mark(layout: Layout, pos: np.ndarray, seqs: list[tuple[int, ...]],
         token_cells: np.ndarray, stale_from: list[int] | None, *,
         repool_all: bool, once_per_rep: bool) -> Marking:
    """ENGINE.md §6 for one ubatch.

    `pos`, `seqs`, `token_cells` (stream-local) describe the ubatch's tokens in order;
    `stale_from` is the batch's stale snapshot on ubatch 0 of a batch, else None."""
    kpool = layout.kpool
    start = layout.pool_start()
    n_pool = int(start[-1])
    if repool_all:
        return Marking(layout.every_pool(), n_pool, True)

    candidates = stale_candidates(layout, stale_from)
    # touched pools: per token, per seq id in the order given
    pair_tok, pair_seq = token_pairs(seqs)
    pair_ip = np.full(pair_tok.size, -1, dtype=np.int64)
    for s, sel in by_sequence(pair_seq):
        sq = layout.seqs[s]
        p = pos[pair_tok[sel]]
        if layout.by_order:
            # a token's rank among s's (pos, cell) pairs gives its pool: rank // kpool
            keys = sq.keys.view
            want = make_keys(p, token_cells[pair_tok[sel]])
            rank = keys.searchsorted(want, side="left")
            found = rank < keys.size
            found[found] &= keys[rank[found]] == want[found]
            if not found.all():
                raise EngineAbort(f"GGML_ASSERT(r >= 0): a token of seq {s} is not in its "
                                  "sequence's layout (by-order rank lookup)")
            k = rank // kpool
            ok = k < len(sq.pools)
        else:
            # the last pool whose first pos <= p, if p <= its rep pos
            k = sq.first_pos().searchsorted(p, side="right") - 1
            ok = k >= 0
            ok[ok] = p[ok] <= sq.rep_pos()[k[ok]]
        pair_ip[sel[ok]] = start[s] + k[ok]
    candidates.append(pair_ip[pair_ip >= 0])

    cand = np.concatenate(candidates)
    if once_per_rep:
        # rep-once (PR #29994): the first pool marked with a given rep row wins
        winners = cand[_first_of_each(layout.pool_cells()[cand])] if cand.size else cand
    else:
        winners = cand[_first_of_each(cand)]
    return Marking.of(np.sort(winners))


def stale_candidates(layout: Layout, stale_from: list[int] | None) -> list[np.ndarray]:
    """ENGINE.md §6, the stale pools (on ubatch 0 of a batch): every pool of s whose
    rep pos >= stale_from[s], by sequence. A batch with every sequence clean (every
    step of parallel slots) has none, known without a pass over the sequences."""
    if stale_from is None or all_clean(stale_from):
        return []
    start = layout.pool_start()
    out = []
    for s, sq in enumerate(layout.seqs):
        if stale_from[s] == POS_CLEAN or not len(sq.pools):
            continue
        first = int(sq.rep_pos().searchsorted(stale_from[s], side="left"))
        out.append(np.arange(start[s] + first, start[s + 1], dtype=np.int64))
    return out


def token_pairs(seqs: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """(token, seq id) of each of a ubatch's tokens' seq ids, in the order given."""
    ids = one_id_each(seqs)  # of a batch's `SeqSets`: found once
    if ids is not None:  # one seq id a token: in C
        return np.arange(len(ids), dtype=np.int64), np.fromiter(ids, np.int64, len(ids))
    pair_tok = np.array([i for i, ss in enumerate(seqs) for _ in ss], dtype=np.int64)
    pair_seq = np.array([s for ss in seqs for s in ss], dtype=np.int64)
    return pair_tok, pair_seq


def pad_bound(n_pool_real: int) -> int:
    """`kpool_pad`: the gathered pool count, always one unused slot past the real ones."""
    return max(64, -(-(n_pool_real + 1) // 64) * 64)


def n_new_graph(n_new: int, n_tokens: int, n_seqs_unq: int, n_pool_real: int,
                kv_size: int, kpool: int, n_seq_max: int, repool_all: bool) -> int:
    """ENGINE.md §6: the graph size of the new list, stable across decode steps.
    Not re-pool-all, it is max(n_new, its value for n_new = 0): a floor a core may
    take before it marks (compiled/marking.py `mark_and_plan`)."""
    if repool_all:
        return max(n_new, 1)
    bound = n_tokens // kpool + n_seqs_unq
    n_pool_max = kv_size // kpool * n_seq_max
    return max(n_new, 1, min(bound, pad_bound(n_pool_real) - 1, n_pool_max))


def entries_bound(cells: int, kv_size: int, kpool: int, n_seq_max: int) -> int:
    """The most entries (`n_new_graph`) a ubatch's plan has when a sequence holds at
    most `cells` cells, a kpool-th of them pools: every pool, or one at least, or the
    padded size, which is under `pad_bound` (at most 63 past the pools) and never past
    the pools the cache has room for. Each entry is kpool rows wide (the memory
    budget's, backend/budget.py)."""
    n_pools = n_seq_max * (cells // kpool)
    return max(1, n_pools, min(pad_bound(n_pools) - 1, kv_size // kpool * n_seq_max))


def gen_zeroed(is_new_before: int, n_pool_real: int, first_of_batch: bool,
               once_per_rep: bool, n_rows: int) -> int:
    """Generation-array entries the real engine zero-fills for one ubatch (ENGINE.md
    §8): `is_new` grows to n_pool_real (zeros for the growth); rep-once's `rep_gen`
    is sized to kv_size * n_stream, zero-filled, on the first ubatch of every batch
    (the marking state is created afresh per batch)."""
    grow = max(0, n_pool_real - is_new_before)
    return grow + (n_rows if once_per_rep and first_of_batch else 0)
