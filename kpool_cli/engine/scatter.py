"""The scatter plan of one ubatch (ENGINE.md §7, llama.cpp's set_input_kpool).

Owns: `ScatterPlan` and `build_plan`: the gather list `pool_cells`, the scatter
entries (members' global rows and the rep row each writes), padding entries, what
each token of the ubatch sees (`visible_pools`; of one sequence's tokens by
position, `visible_in`) and the check that the ubatch's first token is in its
sequence's layout (`first_token_missing`): a core's one-call plan asks the last two.
A plan's `pool_cells` may be built when first read (`ScatterPlan.cells`), which is
before the layout's next update.

Invariants: entries 0 .. n_new-1 are the marked pools in layout order; entries
n_new .. n_new_g-1 are padding, each writing `rep` from `kpool` copies of that row.

A plan *stands* when its arrays are the very arrays of the plan before (the readers
that keep what they built from a plan, by `arrays.SameArrays`, hand it on then): a
re-pool-all ubatch's on pools that stand (its entries are the layout's own columns),
or a padded ubatch's that marks no pool, on rep rows that stand (the compiled core's
padding gives the same rows, and `padding_entries` the same entries).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..cache.aborts import EngineAbort
from ..cache.batch import first_seq_ids
from ..cache.cells import CELL_BITS, global_row, make_keys
from .layout import Layout, SeqLayout, by_sequence
from .marking import pad_bound


@dataclass(frozen=True, slots=True)
class ScatterPlan:
    # `pool_cells`, or what builds it when first read (`Layout.pool_cells_until_update`:
    # a one-sequence plan reads its sequence's own rep rows, not the column)
    cells: np.ndarray | Callable[[], np.ndarray]
    entry_pool: np.ndarray  # [n_new_g] | e | global pool index, -1 for padding
    entry_rows: np.ndarray  # [n_new_g, kpool] | e, member | global member rows
    entry_rep: np.ndarray  # [n_new_g] | e | global row the entry writes
    visible: np.ndarray  # [n_tokens] | i | pools of the token's first seq it sees
    n_new: int
    reps_sorted: int  # rep rows sorted to pick padding rows (0 when nothing is padded)
    # [n] | ascending | pools whose rep row a padding entry writes with other rows than
    # the pool's own members (KP004: garbage in a real pool's row)
    pad_readers: np.ndarray

    @property
    def pool_cells(self) -> np.ndarray:
        """[n_pool_real] | ip | global rep row of pool ip."""
        cells = self.cells
        return cells if isinstance(cells, np.ndarray) else cells()

    @property
    def n_new_g(self) -> int:
        return int(self.entry_rep.size)

    @property
    def pad(self) -> np.ndarray:
        return self.entry_pool < 0


NO_ROW_LEFT = "GGML_ASSERT(pad_cell < kv_size*n_stream): no row left for a padding entry"

Padding = Callable[[np.ndarray, int, int, bool], tuple[np.ndarray, np.ndarray]]
Visibility = Callable[[Layout, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
PaddingEntries = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]


def padding_rows(pool_cells: np.ndarray, n_pad: int, n_rows: int, row_zero: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """ENGINE.md §7: each padding entry takes its own row, the smallest global rows that
    are no real pool's rep (a `row-zero` engine puts them all on row 0). Running out of
    rows is a GGML_ASSERT. Returns (the rows, the pools whose rep row one of them is:
    KP004's readers)."""
    if row_zero:
        rows = np.zeros(n_pad, dtype=np.int64)
    else:
        span = n_pad + pool_cells.size
        taken = np.zeros(span, dtype=bool)
        taken[pool_cells[pool_cells < span]] = True
        rows = np.flatnonzero(~taken)[:n_pad].astype(np.int64)
        if rows.size < n_pad or (rows.size and rows[-1] >= n_rows):
            raise EngineAbort(NO_ROW_LEFT)
    return rows, np.flatnonzero(np.isin(pool_cells, rows))


def repeated_pool(layout: Layout, seqs: list[tuple[int, ...]]
                  ) -> tuple[np.ndarray, int, np.ndarray]:
    """`padding="repeat-pool"` (ggml-org/llama.cpp `src/llama-kv-cache-kpool.cpp` at
    048799f0, the glm5next branch, lines 496-513: "some complete pool exists: repeat
    it ... the duplicate write is a no-op in effect"): every padding entry pools the
    members of the first pool, in layout order, of a sequence the ubatch holds
    (`any_rep_src`) into its rep row; with no such pool, `kpool` copies of cell 0 of
    the first token's stream into that cell. Returns (members, rep row, the pools
    whose rep row that is and whose members those are not: KP004's readers)."""
    start = layout.pool_start()
    held = sorted({s for ss in seqs for s in ss})
    src = next((int(start[s]) for s in held if start[s + 1] > start[s]), None)
    pool_cells = layout.pool_cells()
    if src is not None:
        return layout.members_of(np.array([src], dtype=np.int64))[0], int(pool_cells[src]), \
            np.empty(0, dtype=np.int64)
    row = global_row(layout.seqs[seqs[0][0]].strm, 0, layout.kv_size)
    return (np.full(layout.kpool, row, dtype=np.int64), int(row),
            np.flatnonzero(pool_cells == row))


def visible_pools(layout: Layout, first: np.ndarray, pos: np.ndarray,
                  token_cells: np.ndarray) -> np.ndarray:
    """[n_tokens] the pools each token sees (ENGINE.md §7): a token sees the pools of
    its first seq id (`first`) whose rep pos <= its pos (by-order: the first
    (rank + 1) // kpool pools)."""
    visible = np.empty(first.size, dtype=np.int64)
    for s, sel in by_sequence(first):
        sq = layout.seqs[s]
        if layout.by_order:
            rank = sq.keys.view.searchsorted(make_keys(pos[sel], token_cells[sel]))
            visible[sel] = np.minimum(len(sq.pools), (rank + 1) // layout.kpool)
        else:
            visible[sel] = visible_in(sq, pos[sel])
    return visible


def visible_in(sq: SeqLayout, pos: np.ndarray) -> np.ndarray:
    """`visible_pools` of tokens of sequence `sq` by position: its pools whose rep pos
    <= each token's pos."""
    return sq.rep_pos().searchsorted(pos, side="right")


def first_token_missing(layout: Layout, seqs: list[tuple[int, ...]], pos: np.ndarray
                        ) -> str | None:
    """The ubatch's first token, looked up by pos in its first seq's layout, serves the
    padded gathers; a drifted layout can miss it: the GGML_ASSERT's message, else None."""
    keys = layout.seqs[seqs[0][0]].keys.view
    at = int(keys.searchsorted(np.int64(pos[0]) << CELL_BITS, side="left"))
    if at >= keys.size or int(keys[at] >> CELL_BITS) != int(pos[0]):
        return (f"GGML_ASSERT: the ubatch's first token (seq {seqs[0][0]}, pos "
                f"{int(pos[0])}) is not in its sequence's layout")
    return None


def padding_entries(pad: np.ndarray, *, kpool: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(entry_pool, entry_rows, entry_rep) of a plan of padding entries alone, on
    rows `pad`. A core whose padding gives the same rows while the rep rows stand
    hands `build_plan` this through `arrays.SameArrays`, one per replay (so one
    kpool): a decode step that marks no pool then pads with the same arrays, and what
    is built from the plan alone is kept (the race groups, the listing, the value
    backend's standing scatter). Nothing may write them."""
    rows = np.empty((pad.size, kpool), dtype=np.int64)
    rows[:] = pad[:, None]
    return np.full(pad.size, -1, dtype=np.int64), rows, pad.astype(np.int64, copy=True)


def build_plan(layout: Layout, marked: np.ndarray, n_new_g: int, pos: np.ndarray,
               seqs: list[tuple[int, ...]], token_cells: np.ndarray, n_rows: int,
               padding_policy: str, padding: Padding = padding_rows,
               visibility: Visibility = visible_pools,
               padding_alone: PaddingEntries = padding_entries) -> ScatterPlan:
    """ENGINE.md §7 for one ubatch; `padding_policy` is `EngineVersion.padding`;
    `padding` picks the rows of the policies that give padding rows of their own
    (`padding_rows`, or a core's equal twin), `visibility` what each token sees
    (`visible_pools`, or a core's equal twin), `padding_alone` the entries of a plan
    of padding alone (`padding_entries`, or the same kept by identity)."""
    kpool = layout.kpool
    pool_cells = layout.pool_cells()
    missing = first_token_missing(layout, seqs, pos)
    if missing is not None:
        raise EngineAbort(missing)

    n_new = int(marked.size)
    first = first_seq_ids(seqs)
    if n_new_g == n_new and layout.is_every_pool(marked):
        # re-pool-all, unpadded: the entries are the layout's own columns, the same
        # arrays while its pools stand (so what is built from them alone is kept by
        # their identity: arrays.SameArrays)
        return ScatterPlan(pool_cells, marked, layout.pool_members(), pool_cells,
                           visibility(layout, first, pos, token_cells), n_new, 0,
                           np.empty(0, dtype=np.int64))
    readers = np.empty(0, dtype=np.int64)
    pad = None
    if n_new_g > n_new and padding_policy != "repeat-pool":  # rows of their own
        pad, readers = padding(pool_cells, n_new_g - n_new, n_rows,
                               padding_policy == "row-zero")
    if pad is not None and n_new == 0:
        # padding alone: its entries are its rows', the same arrays while `padding`
        # gives the same rows (the compiled core's, while the rep rows stand)
        entry_pool, rows, rep = padding_alone(pad, kpool=kpool)
    else:
        rows = np.empty((n_new_g, kpool), dtype=np.int64)
        rep = np.empty(n_new_g, dtype=np.int64)
        entry_pool = np.full(n_new_g, -1, dtype=np.int64)
        entry_pool[:n_new] = marked
        rows[:n_new] = layout.members_of(marked)
        rep[:n_new] = pool_cells[marked]
        if pad is not None:
            rep[n_new:] = pad
            rows[n_new:] = pad[:, None]
        elif n_new_g > n_new:  # repeat-pool
            members, rep[n_new:], readers = repeated_pool(layout, seqs)
            rows[n_new:] = members[None, :]

    visible = visibility(layout, first, pos, token_cells)
    assert pad_bound(pool_cells.size) > pool_cells.size
    return ScatterPlan(pool_cells, entry_pool, rows, rep, visible, n_new,
                       reps_sorted(pool_cells.size, n_new_g - n_new, padding_policy), readers)


def reps_sorted(n_pool: int, n_pad: int, padding_policy: str) -> int:
    """The rep rows a plan sorts to pick its `n_pad` padding rows (a cost the report
    counts): every pool's (`n_pool`) when padding entries take rows of their own, else
    none."""
    return int(n_pool) if n_pad > 0 and padding_policy != "repeat-pool" else 0
