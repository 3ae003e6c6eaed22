"""KP002 rep-conflict: one rep row is the rep of pools whose members differ.

Owns: the code, its explanation, `conflicts` (the condition over a layout),
`Conflicts` (the same condition kept up to date from each update's LayoutChange, at
the cost of the pools the update changed), `finding` and `Check`, which reports the
condition once, in the ubatch where it appears (it persists until the layout
changes).

Invariants: a conflict is a rep row shared by pools of which two have different
member rows; the finding names those rows ascending and, per row, every pool on it.
A layout of one sequence has none: each of its pairs is a cell of its own, so no two
of its pools share a rep row, and `Check` asks nothing of it.
`Conflicts.now()` equals `conflicts(layout)` after every update it was fed
(tests/test_engine_rules.py holds them equal on random traces).
"""

from __future__ import annotations

import numpy as np

from ... import wording as words
from ...arrays import rows_equal, unique
from ...contracts.finding import Code, Finding, PoolIds, RowIds
from ...engine.context import UbatchContext
from ...engine.layout import Layout, LayoutChange, RepRowCounts, pools_past
from ..rule import LAYOUT, AppearanceFilter, Explanation, doc
from ..rule import Check as RuleCheck

CODE = Code("KP002", "rep-conflict", "error",
            "one rep row is the rep of pools whose members differ")

EXPLANATION = Explanation(
    CODE,
    oneline="one pooled row cannot hold two different poolings: some sequence reads "
            "the wrong one",
    what=doc("""
        Flags the ubatch where a rep row becomes the rep of two or more pools whose
        member rows differ (reported once, where the condition appears; it persists
        until the layout changes)."""),
    why=doc("""
        A rep row has a single pooled slot. Pools that share it must share their
        members too, or the slot holds one pool's value and the other pools are read
        wrong (KP003), or it is raced every ubatch (KP001 with different values).
        It arises from partial seq_cp (a shared cell that ends pools of different
        groupings) and from coupled tokens (one cell carrying several sequences whose
        earlier cells differ)."""),
    example=doc("""
        kpool_trace: 1
        name: kp002-rep-conflict
        cache: {kv_size: 16, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 0..2}
          - decode: {seq: 1, pos: 0..2}
          - decode: {seq: [0, 1], pos: 2..4}"""),
    engine="rep-once",
    fix=doc("""
        Never let a shared cell end pools of different groupings: refuse partial
        copies (PR #29994 asserts a whole-sequence seq_cp), and give a sequence whose
        pool would end on a cell shared with a differently grouped sequence a pooled
        row of its own (or refuse coupled tokens whose sequences' cells differ)."""),
)


def conflicts(layout: Layout) -> dict[int, tuple[tuple[int, int], ...]]:
    """Rep rows shared by pools whose member rows differ: {row: the (seq, k) pools
    on it}."""
    pc = layout.pool_cells()
    if pc.size < 2:
        return {}
    order = np.argsort(pc, kind="stable")
    spc = pc[order]
    same = spc[1:] == spc[:-1]
    if not same.any():
        return {}
    return _conflicts_among(layout, np.sort(order[np.isin(spc, spc[1:][same])]))


def _conflicts_among(layout: Layout, ips: np.ndarray) -> dict[int, tuple[tuple[int, int], ...]]:
    """The conflicts on the rep rows of pools `ips` (ascending global indices, every
    pool on those rows): {row: its (seq, k) pools, in layout order}, rows ascending."""
    pc = layout.pool_cells()
    ips = ips[np.argsort(pc[ips], kind="stable")]  # by row, in layout order on each
    rows = pc[ips]
    members = layout.members_of(ips)
    group_start = np.concatenate(([True], rows[1:] != rows[:-1]))
    first_idx = np.maximum.accumulate(np.where(group_start, np.arange(ips.size), 0))
    differs = ~rows_equal(members, members[first_idx])
    bad_rows = unique(rows[differs])
    out: dict[int, tuple[tuple[int, int], ...]] = {}
    for r in bad_rows.tolist():
        seq, k = layout.locate(ips[rows == r])
        out[r] = tuple(zip(seq.tolist(), k.tolist(), strict=True))
    return out


class Conflicts:
    """`conflicts` of a layout, kept from the updates it is fed, at the cost of the
    pools an update changed: the pools counted by rep row (`RepRowCounts`, from the
    whole layout's rep rows as the last update left them), and the conflicts found.
    An update takes away the rows of a sequence's pools past its `kept` count, adds
    those of its new ones, and rechecks the rows they were on that now hold two or
    more pools (a decode's new pool, alone on its own cell, costs no recheck). When
    the counts were taken afresh (an update that replaced most pools: a seq_keep after
    a whole seq_cp, each step), the rows held twice are those of the recount, found
    by numpy, not row by row in Python."""

    def __init__(self) -> None:
        self._counts = RepRowCounts()
        self._cells = np.empty(0, dtype=np.int64)  # Layout.pool_cells, last update's
        self._start: np.ndarray | None = None  # Layout.pool_start, last update's
        self._bad: dict[int, tuple[tuple[int, int], ...]] = {}

    def update(self, layout: Layout, change: LayoutChange) -> None:
        cells, start = layout.pool_cells(), layout.pool_start()
        before = self._start if self._start is not None else np.zeros_like(start)
        # the rows of the pools past each sequence's kept ones, before and now, in one
        # look-up each: a step of parallel slots changes every slot's
        kept = np.asarray(change.kept, dtype=np.int64)
        gone = self._cells[pools_past(before, kept)]
        come = cells[pools_past(start, kept)]
        touched = unique(np.concatenate((gone, come)))
        self._counts.follow(gone, come, cells)
        shared = self._counts.held_twice(touched)
        if self._bad:  # most often none: no row to look up
            bad = np.fromiter(self._bad, dtype=np.int64, count=len(self._bad))
            for r in bad[np.isin(bad, touched)].tolist():
                del self._bad[r]
        if shared:
            self._bad.update(_conflicts_among(layout, np.flatnonzero(np.isin(cells, shared))))
        self._cells, self._start = cells, start

    def now(self) -> dict[int, tuple[tuple[int, int], ...]]:
        return {r: self._bad[r] for r in sorted(self._bad)}


def finding(conflicts: dict[int, tuple[tuple[int, int], ...]]) -> Finding:
    """The finding of some conflicts (as `conflicts` gives them; at least one)."""
    rows = sorted(conflicts)
    pools = tuple(p for r in rows for p in conflicts[r])
    seqs = tuple(sorted({s for s, _ in pools}))
    first = rows[0]
    return Finding(
        CODE,
        f"{words.counted(len(rows), 'rep row', number=str)} "
        f"{'holds' if len(rows) == 1 else 'hold'} pools with different members: row "
        f"{first} is the rep of pools {words.pools(conflicts[first])}"
        + (f" (+{words.counted(len(rows) - 1, 'more row', number=str)})"
           if len(rows) > 1 else ""),
        rows=RowIds(rows), seqs=seqs, pools=PoolIds(pools),
    )


class Check(RuleCheck):
    """The conflicts of one replay's layout, reported where they appear. They depend
    on the pools only: recomputed when the layout update changed some."""

    reads = LAYOUT

    def __init__(self) -> None:
        self._seen = AppearanceFilter()
        self._tracked = Conflicts()
        self._conflicts: dict[int, tuple[tuple[int, int], ...]] = {}

    def at_ubatch(self, ctx: UbatchContext) -> list[Finding]:
        if len(ctx.layout.seqs) < 2:
            # one sequence: each of its pairs is a cell of its own, so its pools' rep
            # rows are distinct and no row is the rep of two (W1's, W3's every ubatch)
            return []
        if ctx.change.changed:
            self._tracked.update(ctx.layout, ctx.change)
            self._conflicts = self._tracked.now()
        now = self._conflicts
        fresh = self._seen.new(set(now))
        return [finding({r: now[r] for r in sorted(fresh)})] if fresh else []
