"""KP002 rep-conflict: one rep row is the rep of pools whose members differ.

Owns: the code, its explanation, `conflicts` (the condition over a layout),
`Conflicts` (the same condition kept up to date from each update's LayoutChange, at
the cost of the pools the update changed), `finding` and `Check`, which reports the
condition once, in the ubatch where it appears (it persists until the layout
changes).

Invariants: a conflict is a rep row shared by pools of which two have different
member rows; the finding names those rows ascending and, per row, every pool on it.
`Conflicts.now()` equals `conflicts(layout)` after every update it was fed
(tests/test_engine_rules.py holds them equal on random traces).
"""

from __future__ import annotations

import numpy as np

from ... import wording as words
from ...arrays import rows_equal, unique
from ...contracts.finding import Code, Finding, PoolIds, RowIds
from ...engine.context import UbatchContext
from ...engine.layout import Layout, LayoutChange
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
    ips = order[np.isin(spc, spc[1:][same])]  # every pool on a shared rep row, by row
    ips = ips[np.argsort(pc[ips], kind="stable")]
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
    """`conflicts` of a layout, kept from the updates it is fed: per sequence the rep
    row and member rows of each pool (as the layout had them), per rep row the pools
    on it. An update drops a sequence's pools past its `kept` count and adds its
    new ones, and rechecks only the rows they were on."""

    def __init__(self) -> None:
        self._pools: dict[int, list[tuple[int, tuple[int, ...]]]] = {}  # seq -> by k
        self._on_row: dict[int, dict[tuple[int, int], tuple[int, ...]]] = {}
        self._bad: set[int] = set()

    def update(self, layout: Layout, change: LayoutChange) -> None:
        rows: set[int] = set()
        for s in sorted(change.changed):
            mine = self._pools.setdefault(s, [])
            kept = change.kept[s]
            for k in range(kept, len(mine)):
                row = mine[k][0]
                del self._on_row[row][(s, k)]
                rows.add(row)
            del mine[kept:]
            sq = layout.seqs[s]
            n = len(sq.pools)
            if n > kept:
                reps = sq.rep_rows.view[kept:n].tolist()
                members = sq.members(np.arange(kept, n), layout.kpool, layout.kv_size)
                for k, row, mem in zip(range(kept, n), reps, members.tolist(), strict=True):
                    t = tuple(mem)
                    mine.append((row, t))
                    self._on_row.setdefault(row, {})[(s, k)] = t
                    rows.add(row)
        for row in rows:
            on = self._on_row.get(row)
            if on is not None and not on:
                del self._on_row[row]
                on = None
            if on is not None and len(set(on.values())) > 1:
                self._bad.add(row)
            else:
                self._bad.discard(row)

    def now(self) -> dict[int, tuple[tuple[int, int], ...]]:
        return {r: tuple(sorted(self._on_row[r])) for r in sorted(self._bad)}


def finding(conflicts: dict[int, tuple[tuple[int, int], ...]]) -> Finding:
    """The finding of some conflicts (as `conflicts` gives them; at least one)."""
    rows = sorted(conflicts)
    pools = tuple(p for r in rows for p in conflicts[r])
    seqs = tuple(sorted({s for s, _ in pools}))
    first = rows[0]
    return Finding(
        CODE,
        f"{len(rows)} rep row(s) hold pools with different members: row {first} is the rep "
        f"of pools {words.pools(conflicts[first])}"
        + (f" (+{len(rows) - 1} more rows)" if len(rows) > 1 else ""),
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
        if ctx.change.changed:
            self._tracked.update(ctx.layout, ctx.change)
            self._conflicts = self._tracked.now()
        now = self._conflicts
        fresh = self._seen.new(set(now))
        return [finding({r: now[r] for r in sorted(fresh)})] if fresh else []
