"""compiled/arena.py: an arena's rows are GrowArrays and SortedKeys (cache/cells.py),
each holding what one of those given the same calls holds, whatever the other rows
do (one row's growth widens them all)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kpool_cli.cache.cells import GrowArray, SortedKeys, make_keys
from kpool_cli.compiled.arena import Arena, ArenaKeys, ArenaRow

_OPS = st.lists(st.tuples(st.integers(0, 2), st.sampled_from(
    ["extend", "append", "assign", "spare", "truncate"]), st.integers(0, 40)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(_OPS)
def test_an_arena_row_holds_what_a_grow_array_holds(ops):
    arena = Arena(3, cap_max=1000, cap=2)
    rows = [ArenaRow(arena, s) for s in range(3)]
    plain = [GrowArray() for _ in range(3)]
    value = 0
    for s, op, n in ops:
        for a in (rows[s], plain[s]):
            values = np.arange(value, value + n, dtype=np.int64)
            if op == "extend":
                a.extend(values)
            elif op == "append":
                a.append(value)
            elif op == "assign":
                a.assign(values)
            elif op == "spare":  # a kernel writes past the end, then sets the length
                buf = a.spare(len(a) + n)
                buf[len(a):len(a) + n] = values
                a.set_len(len(a) + n)
            else:
                a.truncate(n)
        value += n + 1
        for r, g in zip(rows, plain, strict=True):
            assert r.view.tolist() == g.view.tolist()
            assert len(r) == len(g)
            if len(g):
                assert r.last() == g.last()
            assert r.capacity >= len(r)


def test_a_row_grows_every_row_and_keeps_their_values():
    """Row 1 asks for 5 values in an arena 2 wide: every row is widened (to 5, past
    doubling), row 0's two values kept; cap_max stops the doubling, never a need."""
    arena = Arena(2, cap_max=6, cap=2)
    r0, r1 = ArenaRow(arena, 0), ArenaRow(arena, 1)
    r0.extend(np.array([7, 8]))
    r1.extend(np.arange(5))
    assert arena.cap == 5 and r0.view.tolist() == [7, 8] and r1.view.tolist() == [0, 1, 2, 3, 4]
    r1.append(5)  # 6: doubling would give 10, cap_max 6
    assert arena.cap == 6
    r1.append(6)  # a need past cap_max is met
    assert arena.cap == 7 and r1.view.tolist() == list(range(7))
    assert arena.lens.tolist() == [2, 7]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.sampled_from(["add", "push", "remove", "range"]),
                          st.lists(st.integers(0, 60), max_size=8)), max_size=40))
def test_an_arena_keys_row_holds_what_sorted_keys_hold(ops):
    """ArenaKeys (a stream's index in the compiled core) against SortedKeys, given the
    same inserts (of absent keys), pushes, removals (of present keys) and ranges, two
    rows sharing one arena 2 wide."""
    arena = Arena(2, cap_max=1000, cap=2)
    rows = [ArenaKeys(arena, s) for s in range(2)]
    plain = [SortedKeys() for _ in range(2)]
    for s, op, values in ops:
        have = set(plain[s].view.tolist())
        if op == "add":
            keys = np.array(sorted(set(values) - have), dtype=np.int64)
            rows[s].add(keys)
            plain[s].add(keys)
        elif op == "push":
            for v in values:
                assert rows[s].push(v) == plain[s].push(v)
        elif op == "remove":
            keys = np.array(sorted(set(values) & have), dtype=np.int64)
            rows[s].remove(keys)
            plain[s].remove(keys)
        else:
            lo, hi = (min(values, default=0), max(values, default=0) + 1)
            assert rows[s].range(lo, hi).tolist() == plain[s].range(lo, hi).tolist()
        for r, p in zip(rows, plain, strict=True):
            assert r.view.tolist() == p.view.tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 3)), max_size=40, unique=True),
       st.integers(0, 17), st.integers(1, 6), st.integers(0, 1))
def test_cutting_a_range_is_removing_the_keys_the_range_finds(pairs, p0, width, s):
    """SortedKeys.cut_range (a seq_rm's removal, cache/cells.py) is `range` then
    `remove` of what it found, on both kinds of index: the same keys returned, the
    same keys left. Keys are (pos, cell) pairs, positions 0..15, a range of 1..6
    positions from p0 (past the last key, inside, or the tail)."""
    keys = np.array(sorted(make_keys(np.array([p for p, _ in pairs], dtype=np.int64),
                                     np.array([c for _, c in pairs], dtype=np.int64))
                           .tolist()), dtype=np.int64)
    arena = Arena(2, cap_max=1000, cap=2)
    want = SortedKeys()
    want.add(keys)
    found = want.range(p0, p0 + width).copy()
    want.remove(found)
    for index in (SortedKeys(), ArenaKeys(arena, s)):
        index.add(keys)
        assert index.cut_range(p0, p0 + width).tolist() == found.tolist()
        assert index.view.tolist() == want.view.tolist()
