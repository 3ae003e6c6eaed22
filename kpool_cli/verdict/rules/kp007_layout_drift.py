"""KP007 layout-drift: a sequence's incremental layout no longer matches a rebuild from
its cells.

Owns: the code, its explanation, `finding` (the drift of one sequence) and `Watch`,
which reports a sequence's drift once, in the ubatch where it appears (the engine
goes on with the drifted layout, so it persists until the sequence is rebuilt).

Invariants: a sequence's drift is rechecked only where a layout update read its
pairs (the other sequences' cells did not change, nor did their drift).
"""

from __future__ import annotations

import numpy as np

from ...cache.kv import KvCache
from ...contracts.finding import Code, Finding
from ...engine.context import UbatchContext
from ...engine.layout import Layout
from ..rule import LAYOUT, AppearanceFilter, Explanation, doc
from ..rule import Check as RuleCheck

CODE = Code("KP007", "layout-drift", "error",
            "a sequence's incremental layout no longer matches a rebuild from its cells")

EXPLANATION = Explanation(
    CODE,
    oneline="the layout's cached positions no longer match the cells: pools are "
            "grouped wrong from here on",
    what=doc("""
        Flags the ubatch where a sequence's incremental layout (the (pos, cell)
        pairs it appended to since its last rebuild) stops matching a rebuild from
        the sequence's cells. The replay goes on with the drifted layout, as the
        engine does."""),
    why=doc("""
        Pools are groups of positions. An edit that moves positions without staling
        every sequence it affects (a seq_add on cells another sequence shares: pos
        belongs to the cell) leaves that sequence's layout with old positions: its
        pools group the wrong cells, its new tokens append after the wrong pair, and
        a later ubatch may not find its first token at all (KP005)."""),
    example=doc("""
        kpool_trace: 1
        name: kp007-layout-drift
        cache: {kv_size: 16, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 0..8}
          - seq_cp: {src: 0, dst: 1}
          - decode: {seq: 1, pos: 8..10}
          - seq_add: {seq: 0, p0: 4, p1: 8, shift: 1}
          - decode: {seq: 1, pos: 10}"""),
    engine="rep-once",
    fix=doc("""
        Stale every sequence an edit moves: in seq_add/seq_div, stale each sequence
        that shares a moved cell (or every sequence while cells are shared), from
        the smallest moved position."""),
)


def finding(layout: Layout, cache: KvCache, s: int) -> Finding | None:
    """The drift of sequence s, or None when its layout matches a rebuild."""
    d = layout.drift(cache, s)
    if d is None:
        return None
    j, have, want = d
    return Finding(
        CODE,
        f"seq {s}: the layout's pair {j} is {_pair(have)} but the cells say {_pair(want)}; "
        "the engine goes on with the drifted layout",
        seqs=(s,), evidence={"index": j, "layout": have, "cells": want},
    )


def _pair(p: tuple[int, int] | None) -> str:
    return "absent" if p is None else f"(pos {p[0]}, cell {p[1]})"


class Check(RuleCheck):
    """The drifted sequences of one replay, each reported where its drift appears."""

    reads = LAYOUT

    def __init__(self) -> None:
        self._seen = AppearanceFilter()
        self._drifts: dict[int, Finding] = {}  # each drifted sequence's finding

    def at_ubatch(self, ctx: UbatchContext) -> list[Finding]:
        read = ctx.change.read
        if read:
            # a sequence the layout knows equal to its cells has no drift (`drift`
            # says None without a look): its old drift, if any, is gone, and only the
            # others are looked at. A few sequences (a decode's) are asked one by one,
            # many (a step of parallel slots) in one array
            if len(read) <= _ASKED_ONE_BY_ONE:
                known_of = ctx.layout.known_equal
                unknown = [s for s in read if not known_of(ctx.cache, s)]
                known = read.difference(unknown) if self._drifts else ()
            else:
                seqs = np.fromiter(read, dtype=np.int64, count=len(read))
                flags = ctx.layout.known_equal_seqs(ctx.cache)[seqs]
                known = seqs[flags].tolist() if self._drifts else ()
                unknown = seqs[~flags].tolist()
            for s in known:
                self._drifts.pop(s, None)
            for s in unknown:
                f = finding(ctx.layout, ctx.cache, s)
                if f is None:
                    self._drifts.pop(s, None)
                else:
                    self._drifts[s] = f
        return [self._drifts[s] for s in sorted(self._seen.new(set(self._drifts)))]


# up to this many sequences read, each is asked `known_equal` alone: a decode's one
# sequence costs 0.5 us so, against 4 us for the array of every sequence's flags
_ASKED_ONE_BY_ONE = 4
