"""The compiled core's marking, padding rows, visibility and race groups (ENGINE.md
§6-7): engine/marking.py's `mark`, engine/scatter.py's `padding_rows` and
`visible_pools` (which the reference `build_plan` takes) and engine/context.py's
`race_groups` and `raced_writers`, with their loops over tokens, pools and rows in
kernels (compiled/kernels.py).

Owns: `mark`, `Padding`, `visible`, `GrowingGroups`, `raced_writers`, each the reference
function's result for the same arguments (the same arrays, the same EngineAbort
messages), which the tests hold byte for byte; `mark_and_plan`, `mark` and then the
reference `build_plan` of a one-sequence ubatch in one kernel call, the same marking
and plan, or None where it leaves them to the two; `GrowingGroups` also says when the
raced groups are the last ones (`RaceGroups.raced_kept`), which the reference's
`plan_groups` never claims. The decisions (which candidate wins,
which rows pad) are the reference's rules, cited in the kernels; the stale candidates
and the grouping by sequence are the reference's own functions.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from ..cache.aborts import EngineAbort
from ..cache.batch import one_set
from ..cache.cells import GrowArray, global_row
from ..engine.context import PAD_WRITER, RaceGroups, groups_raced
from ..engine.layout import (
    Layout,
    LayoutChange,
    PoolGrowth,
    RepRowCounts,
    SeqLayout,
    by_sequence,
)
from ..engine.marking import NONE_MARKED, Marking, stale_candidates, token_pairs
from ..engine.scatter import (
    NO_ROW_LEFT,
    PaddingEntries,
    ScatterPlan,
    first_token_missing,
    padding_entries,
    reps_sorted,
    visible_in,
    visible_pools,
)
from . import kernels as k
from .layout import CompiledLayout


def mark(layout: CompiledLayout, pos: np.ndarray, seqs: list[tuple[int, ...]],
         token_cells: np.ndarray, stale_from: list[int] | None, *,
         repool_all: bool, once_per_rep: bool) -> Marking:
    """engine/marking.py `mark` (ENGINE.md §6)."""
    kpool = layout.kpool
    start = layout.pool_start()
    n_pool = int(start[-1])
    if repool_all:
        return Marking(layout.every_pool(), n_pool, True)
    candidates = stale_candidates(layout, stale_from)
    s = _one_sequence(seqs)
    if s is not None:  # one call
        sq = layout.seqs[s]
        stale = _joined(candidates)
        marked, ok = k.mark_one_sequence(
            sq.keys.view, len(sq.pools), sq.first_pos(), sq.rep_pos(), pos, token_cells,
            layout.by_order, kpool, int(start[s]), stale, layout.pool_cells(),
            once_per_rep, layout.scratch(n_pool))
        if not ok:
            raise EngineAbort(f"GGML_ASSERT(r >= 0): a token of seq {s} is not in its "
                              "sequence's layout (by-order rank lookup)")
        return Marking.of(marked)
    pair_tok, pair_seq = token_pairs(seqs)
    pair_ip = np.empty(pair_tok.size, dtype=np.int64)
    if not layout.by_order:  # by position: every sequence's tokens in one call
        k.pools_of_pairs_by_pos(layout.pool_first_pos(), layout.pool_rep_pos(), start,
                                pair_seq, pos[pair_tok], pair_ip)
    else:  # by order: a rank among each sequence's own pairs
        for s, sel in by_sequence(pair_seq):
            sq = layout.seqs[s]
            got = np.empty(sel.size, dtype=np.int64)
            tok = pair_tok[sel]
            k.pools_of_tokens(sq.keys.view, len(sq.pools), sq.first_pos(), sq.rep_pos(),
                              pos[tok], token_cells[tok], True, kpool, int(start[s]), got)
            if (got == -2).any():
                raise EngineAbort(f"GGML_ASSERT(r >= 0): a token of seq {s} is not in its "
                                  "sequence's layout (by-order rank lookup)")
            pair_ip[sel] = got
    candidates.append(pair_ip[pair_ip >= 0])
    cand = np.concatenate(candidates) if len(candidates) > 1 else candidates[0]
    if cand.size == 0:
        return Marking.of(cand)
    seen = layout.scratch(n_pool)
    return Marking.of(k.first_winners(cand, layout.pool_cells(), once_per_rep, seen))


def _one_sequence(seqs: list[tuple[int, ...]]) -> int | None:
    """The sequence every token holds alone, or None."""
    first = one_set(seqs)
    return first[0] if first is not None and len(first) == 1 else None


def _joined(candidates: list[np.ndarray]) -> np.ndarray:
    """`stale_candidates`' arrays end to end."""
    return (np.concatenate(candidates) if len(candidates) > 1 else candidates[0]
            if candidates else np.empty(0, dtype=np.int64))


def mark_and_plan(layout: CompiledLayout, change: LayoutChange, pos: np.ndarray,
                  seqs: list[tuple[int, ...]], token_cells: np.ndarray,
                  stale_from: list[int] | None, *, repool_all: bool, once_per_rep: bool,
                  padding_policy: str, g_floor: int, n_rows: int, padding: Padding,
                  padding_alone: PaddingEntries = padding_entries
                  ) -> tuple[Marking, ScatterPlan | None] | None:
    """`mark` and then engine/scatter.py `build_plan` in one
    `kernels.mark_plan_one_sequence` call, for a ubatch that is not re-pool-all,
    whose every token holds one sequence, by position, under padding rows of their
    own ("unused-rows", from `padding`, the one `build_plan` is given, which keeps
    its rows for the next): a prefill's ubatches, a draft's (W3's steps). `g_floor`:
    engine/marking.py `n_new_graph` of no marked pool, so the graph's size is
    max(n_new, g_floor). `change`: the layout's update of this ubatch.

    Where the sequence holds every pool (a cache of one slot: W1's, W3's), its own rep
    rows are the layout's `pool_cells`: they are read in place, and the padding rows
    are kept while the rep rows below them stand (`Padding`'s `held`), so a step
    costs what its update changed, not a pass over every pool. The plan's
    `pool_cells` is then the column built if a reader asks. Such a ubatch that marks
    nothing is planned here too: padding alone (`build_plan`'s plan, its entries
    from `padding_alone`, the one `build_plan` is given: the same arrays while the
    padding rows stand).

    Returns None for any other ubatch, and for one whose tokens, by position, are in
    no pool with no pool stale (nothing is marked) where the sequence does not hold
    every pool: the caller marks, then plans.
    (the marking, None) when the kernel marked and left the plan to `build_plan`: a
    stale pool of another sequence, what `build_plan` refuses. Else (the marking,
    its plan), the arrays the two steps give."""
    if repool_all or padding_policy != "unused-rows" or layout.by_order:
        return None
    s = _one_sequence(seqs)
    if s is None:
        return None
    sq = layout.seqs[s]
    rep_pos = sq.rep_pos()
    candidates = stale_candidates(layout, stale_from)
    start = layout.pool_start()
    n_pool = int(start[-1])
    holds = 0 < rep_pos.size == n_pool  # s holds every pool (start[s] is 0)
    if not candidates and (not rep_pos.size or (
            pos.min() if pos.size > 1 else pos[0]) > rep_pos[rep_pos.size - 1]):
        if holds and g_floor >= 1:  # nothing is marked
            return _padded_alone(layout, sq, seqs, (change, s), pos, g_floor, n_rows,
                                 padding, padding_alone, padding_policy)
        if holds:
            padding.follow(sq.rep_rows.view, change, s)
        return None  # the caller marks and plans
    stale = _joined(candidates)
    if holds:
        pool_cells, held = sq.rep_rows.view, (change, s)
        cells: np.ndarray | Callable[[], np.ndarray] = layout.pool_cells_until_update()
    else:
        pool_cells = cells = layout.pool_cells()
        held = None
    n_cand = stale.size + pos.size
    room = max(n_cand, g_floor)
    kpool = layout.kpool
    # one allocation: the entries' rows, rep rows and pools, the tokens' visible pools
    at = room * (kpool + 2)
    out = np.empty(at + pos.size, dtype=np.int64)
    rows = out[:room * kpool].reshape(room, kpool)
    rep, entry_pool, visible = out[room * kpool:at - room], out[at - room:at], out[at:]
    # a plan marks one pool at least: at most g_floor - 1 padding entries
    if g_floor > 1:
        pad = padding.up_to(pool_cells, g_floor - 1, n_rows, held)
    else:  # no padding row: the rows held follow the update all the same
        pad = _NO_ROWS
        if held is not None:
            padding.follow(pool_cells, *held)
    marked, n_g = k.mark_plan_one_sequence(
        sq.keys.view, sq.pools.view, rep_pos.size, sq.first_pos(), rep_pos, pos,
        token_cells, kpool, int(start[s]), stale, pool_cells, once_per_rep,
        layout.scratch(n_pool), np.empty(5 * n_cand, dtype=np.int64),
        global_row(sq.strm, 0, layout.kv_size), g_floor, pad, rows, rep, entry_pool, visible)
    marking = Marking.of(marked)
    if not n_g:
        return marking, None
    rows, rep, entry_pool = rows[:n_g], rep[:n_g], entry_pool[:n_g]
    if out.nbytes > max(_KEEP_BYTES, 2 * (rows.nbytes + 2 * rep.nbytes + visible.nbytes)):
        # a record keeps its plan: not the room a large ubatch's entries had
        rows, rep, entry_pool, visible = rows.copy(), rep.copy(), entry_pool.copy(), \
            visible.copy()
    n_new = marking.n_new
    return marking, ScatterPlan(cells, entry_pool, rows, rep, visible, n_new,
                                reps_sorted(n_pool, n_g - n_new, padding_policy),
                                _NO_READERS)


def _padded_alone(layout: CompiledLayout, sq: SeqLayout, seqs: list[tuple[int, ...]],
                  held: tuple[LayoutChange, int], pos: np.ndarray, n_pad: int, n_rows: int,
                  padding: Padding, padding_alone: PaddingEntries, padding_policy: str
                  ) -> tuple[Marking, ScatterPlan] | None:
    """engine/scatter.py `build_plan` of a ubatch that marks no pool, whose tokens hold
    sequence `sq`, which holds every pool (`held`), by position: `n_pad` padding
    entries on rows of their own. None where `build_plan` would abort (the first token
    not in the sequence's layout, no row left): the caller marks and plans, and the
    abort comes after the marking's counts, as there."""
    if first_token_missing(layout, seqs, pos) is not None:
        return None
    pad = padding.given(sq.rep_rows.view, n_pad, n_rows, held)
    if pad is None:
        return None
    entry_pool, rows, rep = padding_alone(pad, kpool=layout.kpool)
    return Marking.of(NONE_MARKED), ScatterPlan(
        layout.pool_cells_until_update(), entry_pool, rows, rep, visible_in(sq, pos), 0,
        reps_sorted(len(sq.pools), n_pad, padding_policy), _NO_READERS)


# `mark_and_plan`: a plan's arrays are copied out of their room past this many bytes
_KEEP_BYTES = 4096
_NO_ROWS = np.empty(0, dtype=np.int64)  # no padding row (writable, as `up_to`'s)


class Padding:
    """engine/scatter.py `padding_rows` through `kernels.padding_rows`: the rows it
    picks are no pool's rep, so they have no reader (row zero: the pools on row 0).

    One per replay. It keeps the last rows it found while the layout's rep rows
    stand: called again with the same `pool_cells` array (the layout's whole-layout
    column, one array until the pools change: every rep-once decode that closes no
    pool) and at most as many rows, it gives the first `n_pad` of them, without the
    pass over every pool. They are the rows a pass would find: the smallest rows
    that are no pool's rep, in ascending order, so the n smallest are the first n
    of any more. A pass finds as many rows as the most any call asked (a decode step
    of W2's 64 slots pads 16 entries when it closes pools, 80 when it does not), so
    the steps after it keep them; that most never falls, and costs a pass no more
    than its pad's length (the pools are most of its span). The array is held
    weakly (a dead one never matches a new array at its address), and nothing
    writes it.

    Asked again for as many rows as the last call, it gives the very array it gave
    then (one object while the rep rows stand: a decode step that marks no pool pads
    the same entries each time, and `build_plan` keeps what it builds from them by
    identity), read-only.

    Held (`up_to`'s `held`: one sequence holds every pool, and `pool_cells` is its
    own rep rows, read in place: a new array each call), the kept rows serve while
    the rep rows below the greatest of them are the same set: then the smallest rows
    that are no rep are the same rows. What changed is the update's: the sequence's
    pools past `LayoutChange.kept` went, and its pools from there on are new, so the
    test reads the pools the update replaced and the new ones alone, against the
    pools counted by rep row (`_Low`, which follows every update it is shown), while
    each call's update is the very next one (`LayoutChange.serial`). A W3 step (a
    draft's 4 tokens, the rejected tail removed) changes a pool or two of 8,192
    (65,536 at 8 times its prefill): no pass, where its every step had one."""

    __slots__ = ("_given", "_held", "_last", "_low", "_most")

    def __init__(self) -> None:
        self._last: tuple[weakref.ref, int, np.ndarray, int] | None = None
        self._given: np.ndarray | None = None  # the last rows given, of the kept ones
        self._most = 0
        # held: (the sequence, the serial of the update) the kept rows were last found
        # or held for, None when the last call was not held; that sequence's pools
        # counted by rep row (`_Low`, which follows the same updates)
        self._held: tuple[int, int] | None = None
        self._low = _Low()

    def __call__(self, pool_cells: np.ndarray, n_pad: int, n_rows: int, row_zero: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
        if row_zero:
            return np.zeros(n_pad, dtype=np.int64), np.flatnonzero(pool_cells == 0)
        given = self.given(pool_cells, n_pad, n_rows)
        if given is None:
            raise EngineAbort(NO_ROW_LEFT)
        return given, _NO_READERS

    def given(self, pool_cells: np.ndarray, n_pad: int, n_rows: int,
              held: tuple[LayoutChange, int] | None = None) -> np.ndarray | None:
        """The rows a call gives (the very array while they stand, read-only), or None
        where fewer than `n_pad` are found below `n_rows` (where the call raises)."""
        last = self._kept(pool_cells, n_pad, n_rows, held)
        if last[3] < n_pad:  # the rows found below n_rows, smallest first
            return None
        given = self._given
        if given is None or given.size != n_pad:
            given = self._given = last[2][:n_pad]
            given.flags.writeable = False
        return given

    def up_to(self, pool_cells: np.ndarray, n_pad: int, n_rows: int,
              held: tuple[LayoutChange, int] | None = None) -> np.ndarray:
        """The rows a call for `n_pad` would give, or as many of them as are found
        below `n_rows` (where the call raises), from the same kept rows (a view:
        nothing may write it). `held`: (the update that left `pool_cells`, the
        sequence s that holds every pool), where `pool_cells` is s's own rep rows
        (the class docstring)."""
        _ref, _n_rows, kept, found = self._kept(pool_cells, n_pad, n_rows, held)
        return kept[:min(n_pad, found)]

    def _kept(self, pool_cells: np.ndarray, n_pad: int, n_rows: int,
              held: tuple[LayoutChange, int] | None = None
              ) -> tuple[weakref.ref, int, np.ndarray, int]:
        """(the rep rows' array, n_rows, the rows kept, how many of them are below
        n_rows), from a pass unless the kept rows serve (the class docstring)."""
        last = self._last
        if last is not None and last[1] == n_rows and n_pad <= last[2].size and (
                last[0]() is pool_cells
                or (held is not None and self._stands(pool_cells, *held))):
            return last
        # a pass
        self._most = most = max(self._most, n_pad)
        kept = np.full(most, -1, dtype=np.int64)  # past the rows found: none
        found = int(k.padding_rows(pool_cells, most, n_rows, kept,
                                   np.zeros(most + pool_cells.size, dtype=bool)))
        last = self._last = (weakref.ref(pool_cells), n_rows, kept, found)
        self._given = None
        self._held = None
        if held is not None and found == most:  # else every row below n_rows counts
            change, s = held
            self._low.follow(pool_cells, change, s)
            self._held = (s, change.serial)
        return last

    def follow(self, pool_cells: np.ndarray, change: LayoutChange, s: int) -> None:
        """`up_to`'s `held` (`pool_cells` sequence s's rep rows as `change` left them)
        where no row is asked: a ubatch that pads nothing (a one-token decode that
        closes a pool, W1's one in four) keeps the held rows in step with the
        updates, so the next call that asks need not pass."""
        if self._held is not None and not self._stands(pool_cells, change, s):
            self._held = None

    def _stands(self, pool_cells: np.ndarray, change: LayoutChange, s: int) -> bool:
        """The kept rows serve the rep rows `pool_cells` of sequence s, which holds
        every pool, as `change` (the next update after the one the kept rows were
        held for) left them: the rep rows at or below the greatest kept row are the
        same set. The counts follow the update, whatever the answer."""
        if self._held != (s, change.serial - 1) or self._last is None:
            return False
        self._held = (s, change.serial)
        moved = self._low.follow(pool_cells, change, s)
        if moved is None:  # counted afresh: nothing to compare with
            return False
        bound = int(self._last[2][-1])
        gone, came = moved
        return {r for r in gone if r <= bound} == {r for r in came if r <= bound}


class _Low:
    """`Padding`'s held sequence's pools counted by rep row: each pool's rep row as the
    last update it followed left them (a copy: the next update rewrites its tail), how
    many pools are on each row (`RepRowCounts`), and that update
    (`LayoutChange.serial`). An update replaces the pools from some k0 on (those past
    `LayoutChange.kept`): the counts follow it at the cost of those pools alone, so a
    step that changes a pool or two of 8,192 costs those, and a pass counts no pool
    again while the updates come one after another. (A pool of one token, `kpool: 1`,
    takes the first padding row at every step, so every step passes; when each pass
    counted every pool again, in Python, such a replay grew with the square of its
    tokens.) The counts are built afresh when an update was missed."""

    __slots__ = ("_at", "_cells", "_counts")

    def __init__(self) -> None:
        self._at: tuple[int, int] | None = None  # (the sequence, the update's serial)
        self._cells = GrowArray()  # each pool's rep row, by pool
        self._counts = RepRowCounts()

    def follow(self, pool_cells: np.ndarray, change: LayoutChange, s: int
               ) -> tuple[set[int], set[int]] | None:
        """The counts brought to `pool_cells`, sequence s's rep rows as `change` left
        them: (the rows no pool is on any more, the rows a pool is on where none was),
        or None where they were counted afresh for a missed update (not of the update
        before `change`): nothing to compare with."""
        at, was = (s, change.serial), self._at
        self._at = at
        if was == at:
            return set(), set()
        cells = self._cells
        if was != (s, change.serial - 1):
            cells.assign(pool_cells)
            self._counts.recount(pool_cells)
            return None
        k0 = change.kept[s]
        new = pool_cells[k0:]
        gone, came = self._counts.follow(cells.view[k0:], new, pool_cells)
        cells.truncate(k0)
        cells.extend(new)
        return gone, came


_NO_READERS = np.empty(0, dtype=np.int64)
_NO_READERS.flags.writeable = False


def visible(layout: Layout, first: np.ndarray, pos: np.ndarray,
            token_cells: np.ndarray) -> np.ndarray:
    """engine/scatter.py `visible_pools` (which the reference `build_plan` takes): by
    position, every token in one `kernels.visible_by_pos` call over the whole-layout
    rep pos; by order, the reference's own."""
    if layout.by_order:
        return visible_pools(layout, first, pos, token_cells)
    out = np.empty(first.size, dtype=np.int64)
    k.visible_by_pos(layout.pool_rep_pos(), layout.pool_start(), first, pos, out)
    return out


class GrowingGroups:
    """engine/context.py `plan_groups` for a cache of n_rows global rows, one per
    replay: the groups of a plan through `kernels.race_groups`, the last ones again
    for the same rep array (a re-pool-all plan's entries while the pools stand, a
    plan of padding alone while the rep rows do: `raced_kept`), and those of a
    re-pool-all plan (every pool, unpadded) whose layout's pools only grew, by pools
    appended to its sequences, since the last groups, a plan of the same kind
    (`Layout.every_growth`), grown from those (`kernels.grown_race_groups`): a
    cache-safe slot closing a pool costs a pass that copies the groups, not a sort
    of every entry. The grown groups say whether the raced ones stand
    (`RaceGroups.raced_kept`: the kernel saw none gain an entry or move, and no new
    one); then `raced` is the last array again."""

    # the new entries the grown groups take; past them, a sort
    FRESH_MOST = 256

    __slots__ = ("_again", "_every_rows", "_last", "_n_rows", "_new", "_rep")

    def __init__(self, n_rows: int) -> None:
        self._n_rows = n_rows
        self._last: RaceGroups | None = None
        self._again: RaceGroups | None = None  # the last, as the same plan's again
        self._rep: weakref.ref | None = None  # the last plan's rep rows
        self._every_rows: np.ndarray | None = None  # its member rows, a re-pool-all's
        self._new = np.empty(self.FRESH_MOST, dtype=np.int64)  # the kernel's scratch

    def __call__(self, plan: ScatterPlan, layout: Layout) -> RaceGroups:
        rep, last, again = plan.entry_rep, self._last, self._again
        if last is not None and self._rep is not None and self._rep() is rep:
            if again is None:  # the same plan's, made once it is met again
                again = self._again = last._replace(raced_kept=True)
            return again
        # a re-pool-all plan, unpadded (a padded one's entries are arrays of their own)
        every = (layout.is_every_pool(plan.entry_pool)
                 and plan.entry_rows is layout.pool_members())
        growth = layout.every_growth() if every else None
        got = None
        if growth is not None and last is not None and growth.old_members is self._every_rows:
            got = self._grown(rep, last, growth)
        if got is None:
            got = RaceGroups(*k.race_groups(rep, self._n_rows))
        self._last, self._rep, self._again = got, weakref.ref(rep), None
        self._every_rows = plan.entry_rows if every else None
        return got

    def _grown(self, rep: np.ndarray, last: RaceGroups, growth: PoolGrowth
               ) -> RaceGroups | None:
        """The groups of `rep` grown from `last` by `growth`; None when a pool was
        dropped, or past FRESH_MOST new entries."""
        _, before, kept, start = growth
        n = rep.size
        assert start[-1] == n and before[-1] == last.order.size  # what the kernel indexes
        order = np.empty(n, dtype=np.int64)
        starts = np.empty(n + 1, dtype=np.int64)
        rows = np.empty(n, dtype=np.int64)
        last_raced = int(last.raced[-1]) if last.raced.size else -1
        g, same = k.grown_race_groups(last.order, last.starts, last.rows, last_raced, rep,
                                      before, kept, start,
                                      np.empty(last.order.size, dtype=np.int64), self._new,
                                      order, starts, rows)
        if g < 0:
            return None
        starts, rows = starts[:g + 1], rows[:g]
        return RaceGroups(order, starts, rows, last.raced if same else groups_raced(starts),
                          bool(same))


def raced_writers(order: np.ndarray, starts: np.ndarray, entry_pool: np.ndarray,
                  layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """engine/context.py `raced_writers` through `kernels.raced_writers`: one pass over
    the groups and one over the entries, where the reference's numpy takes ten (KP001
    reads them again whenever a cache-safe plan gains a pool)."""
    n = order.size
    writers = np.empty((n, 2), dtype=np.int64)
    group = np.empty(n, dtype=np.int64)
    m = k.raced_writers(order, starts, entry_pool, layout.pool_start(), *PAD_WRITER, writers,
                        group)
    return writers[:m], group[:m]
