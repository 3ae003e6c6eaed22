"""What a layout update changed (ENGINE.md §5), as the value backend and the verdicts
read it: `LayoutChange.kept[s]` pools of sequence s are the pools it had before, the
rest are new or regrouped; and a stale sequence whose pairs below the stale position
are its layout's own keeps the pools inside them, with the same result as the
engine's full rebuild. Numbers derived by hand in each test."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run
from hypothesis import given
from hypothesis import strategies as st

from kpool_cli.cache.cells import make_keys
from kpool_cli.cache.kv import KvCache
from kpool_cli.compiled.cache import CompiledKvCache
from kpool_cli.compiled.layout import CompiledLayout
from kpool_cli.engine.layout import POS_CLEAN, Layout, SeqLayout, scan_pools
from kpool_cli.trace.model import CacheConfig

C = POS_CLEAN


def setup(kpool: int = 4, n_seq_max: int = 2) -> tuple[KvCache, Layout]:
    cfg = CacheConfig(kv_size=64, kpool=kpool, n_seq_max=n_seq_max)
    return KvCache(cfg), Layout(n_seq_max, kpool, False, 64)


def decode(c: KvCache, seq: int, positions) -> None:
    pos = np.array(list(positions), dtype=np.int64)
    seqs = [(seq,)] * pos.size
    (pl,) = c.plan([(pos, seqs, None)])
    c.apply(pl, pos, None, seqs)


def pools(lay: Layout, s: int = 0) -> list[tuple[int, int]]:
    sq = lay.seqs[s]
    return list(zip(sq.first_pos().tolist(), sq.rep_pos().tolist(), strict=True))


def test_s5_an_append_keeps_every_pool_and_a_first_build_none():
    """Seq 0, pos 0..9: the first update builds it (count 0 against 10: rebuild):
    kept 0, pools pos 0-3 and 4-7, 10 pairs scanned. Pos 10, 11 appended: both old
    pools kept (kept 2), pool 8-11 new, 2 pairs scanned. Seq 1 has nothing: kept 0."""
    c, lay = setup()
    decode(c, 0, range(10))
    ch = lay.update(c, [C, C], False)
    assert ch.kept == (0, 0) and ch.cells_scanned == 10
    assert pools(lay) == [(0, 3), (4, 7)]
    decode(c, 0, [10, 11])
    ch = lay.update(c, [C, C], False)
    assert ch.kept == (2, 0) and ch.cells_scanned == 2
    assert pools(lay) == [(0, 3), (4, 7), (8, 11)]
    assert ch.new_pools(0, 3).tolist() == [2]


def test_s5_a_stale_tail_keeps_the_pools_below_it():
    """Pos 0..11 (pools 0-3, 4-7, 8-11); seq_rm(0, 10, -1), stale 10: the pairs below
    pos 10 are the layout's first 10: pools ending below index 10 are kept (starts 0
    and 4; start 8 ends at index 11): kept 2. The rest (pos 8, 9) forms no pool. The
    cost is the engine's full rebuild: 10 pairs."""
    c, lay = setup()
    decode(c, 0, range(12))
    lay.update(c, [C, C], False)
    c.seq_rm(0, 10, -1)
    ch = lay.update(c, [10, C], False)
    assert ch.kept == (2, 0) and ch.cells_scanned == 10
    assert pools(lay) == [(0, 3), (4, 7)]


def test_s5_a_pool_ending_just_below_the_stale_position_is_kept():
    """Pos 0..11, stale 8: pool 4-7 ends at index 7, the last below 8: kept with pool
    0-3 (kept 2); pool 8-11 is found again."""
    c, lay = setup()
    decode(c, 0, range(12))
    lay.update(c, [C, C], False)
    ch = lay.update(c, [8, C], False)
    assert ch.kept == (2, 0) and pools(lay) == [(0, 3), (4, 7), (8, 11)]


def test_s5_a_stale_position_inside_a_pool_regroups_it():
    """Pos 0..11, stale 5 (nothing removed): only pool 0 (indices 0..3 < 5) is kept;
    pools 4-7 and 8-11 are found again by the scan, so they count as regrouped:
    kept 1, 3 pools."""
    c, lay = setup()
    decode(c, 0, range(12))
    lay.update(c, [C, C], False)
    ch = lay.update(c, [5, C], False)
    assert ch.kept == (1, 0) and pools(lay) == [(0, 3), (4, 7), (8, 11)]


def compiled_setup(kpool: int = 4, n_seq_max: int = 2) -> tuple[KvCache, Layout]:
    cfg = CacheConfig(kv_size=64, kpool=kpool, n_seq_max=n_seq_max)
    return CompiledKvCache(cfg), CompiledLayout(n_seq_max, kpool, False, 64, 64)


@pytest.mark.parametrize("made", [setup, compiled_setup], ids=["reference", "compiled"])
def test_s5_pairs_changed_below_the_stale_position_rebuild_whole(made):
    """Pos 0..11, then pos 1 removed while the update is told stale 5 (a staleness
    that does not cover the change, as when a shared cell moved): the pairs below
    pos 5 differ from the layout's, so the rebuild is the engine's full one: kept 0;
    pos_min 0, pos 1 missing: pools 4-7 and 8-11 only. The compiled layout, which
    trusts the pairs below the least changed pair (`Stream.changed_from`, here pos 1)
    without comparing them, compares here: pos 5 is above it."""
    c, lay = made()
    decode(c, 0, range(12))
    lay.update(c, [C, C], False)
    c.seq_rm(0, 1, 2)
    ch = lay.update(c, [5, C], False)
    assert ch.kept == (0, 0) and pools(lay) == [(4, 7), (8, 11)]


def test_s5_the_compiled_layout_trusts_the_pairs_below_the_least_change(monkeypatch):
    """Pos 0..11 (pools 0-3, 4-7, 8-11), seq_rm(0, 10, -1), stale 10, then pos 10
    again: the least pair changed since the update is pos 10's, at the stale
    position's key, so the compiled layout keeps pools 0-3 and 4-7 without comparing
    the 10 pairs below it, and finds pool 8-11 again: kept 2, the reference's result.
    The reference layout compares them (once)."""
    import kpool_cli.engine.layout as layout_module

    class Counted:  # the layout module's numpy, its compares counted
        def __init__(self) -> None:
            self.compares = 0

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(np, name)

        def array_equal(self, *args):  # type: ignore[no-untyped-def]
            self.compares += 1
            return np.array_equal(*args)

    got = []
    for made in (setup, compiled_setup):
        c, lay = made()
        decode(c, 0, range(12))
        lay.update(c, [C, C], False)
        c.seq_rm(0, 10, -1)
        decode(c, 0, [10, 11])
        counted = Counted()
        with monkeypatch.context() as m:
            m.setattr(layout_module, "np", counted)
            ch = lay.update(c, [10, C], False)
        got.append((ch.kept, pools(lay), counted.compares))
    assert got[0] == ((2, 0), [(0, 3), (4, 7), (8, 11)], 1)  # the reference compares
    assert got[1] == ((2, 0), [(0, 3), (4, 7), (8, 11)], 0)  # the compiled trusts


def test_s5_a_moved_pos_min_rebuilds_whole():
    """Pos 0..11, seq_rm(0, 0, 2), stale 0 (p0 <= pos_min): pos_min moves to 2, which
    regroups every pool: kept 0, pools 2-5 and 6-9 (10, 11 are too few)."""
    c, lay = setup()
    decode(c, 0, range(12))
    lay.update(c, [C, C], False)
    c.seq_rm(0, 0, 2)
    ch = lay.update(c, [0, C], False)
    assert ch.kept == (0, 0) and pools(lay) == [(2, 5), (6, 9)]


@given(st.lists(st.integers(0, 40), min_size=0, max_size=30, unique=True),
       st.lists(st.integers(0, 40), min_size=0, max_size=30, unique=True),
       st.integers(0, 45), st.integers(1, 5), st.booleans())
def test_s5_keeping_pools_below_the_stale_position_equals_the_full_rebuild(
        before, after, stale, kpool, by_order):
    """For any old and new pairs (one cell per pos) and any stale position, the layout
    `Layout._rebuild` leaves equals SeqLayout.rebuild + a full scan: same pairs, same
    pools, same rep rows and j_next; the pools it says it kept are the old ones."""
    def keys(ps: list[int]) -> np.ndarray:
        ps = sorted(ps)
        return make_keys(np.array(ps, dtype=np.int64), np.array(ps, dtype=np.int64) + 1)

    def scanned(sq: SeqLayout) -> SeqLayout:
        starts, sq.j_next = scan_pools(sq.keys.view, sq.j_next, sq.pos_min, kpool, by_order)
        if starts.size:
            sq.add_pools(starts, kpool, 64)
        return sq

    lay = Layout(1, kpool, by_order, 64)
    old = lay.seqs[0]
    old.rebuild(keys(before))
    scanned(old)
    old_pools = old.pools.view.copy()
    kept = lay._rebuild(old, keys(after), stale)
    got = scanned(old)
    want = SeqLayout()
    want.rebuild(keys(after))
    scanned(want)
    assert np.array_equal(got.keys.view, want.keys.view)
    for a, b in ((got.pools, want.pools), (got.rep_rows, want.rep_rows),
                 (got.rep_pos_, want.rep_pos_), (got.first_pos_, want.first_pos_)):
        assert np.array_equal(a.view, b.view)
    assert (got.j_next, got.pos_min, got.shared) == (want.j_next, want.pos_min, want.shared)
    assert np.array_equal(got.pools.view[:kept], old_pools[:kept])


def test_s5_a_sequence_that_loses_a_shared_cell_to_anothers_seq_add_is_read():
    """Seqs 0 and 1 share pos 0..3 (seq_cp), seq 0 goes on at pos 4. seq_add(0, 0, 1,
    -5) moves the shared cell of pos 0 below 0: it empties, and seq 1 loses it although
    only seq 0 is staled (ENGINE.md §4). The next update must read seq 1 too: its
    count (3 pairs against its layout's 4) rebuilds it, pos 1..3 form no pool; seq 0
    (stale) rebuilds on pos 1..5: one pool, pos 1..4. So one real pool, not two."""
    recs = run("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: 0, pos: 4}
  - seq_add: {seq: 0, p0: 0, p1: 1, shift: -5}
  - decode: {seq: 0, pos: 5}
""")
    last = recs[-1]
    assert last.op == 4 and last.n_pool_real == 1
    assert [(p.seq, p.first_pos, p.last_pos) for p in last.pools] == [(0, 1, 4)]


def test_locate_reads_the_same_seq_and_k_by_search_and_by_pool_seq():
    """Layout.locate, both ways: seq 0 holds pos 0..31 (pools 0-15), seq 1 nothing, seq
    2 pos 0..3 (pools 0-1), kpool 2: pool_start [0, 16, 16, 18]. Global pool 16 asked
    alone is searched (fewer than 18 // 8 pools, the column not built): (2, 0), seq
    1 holding none. Pools
    17, 0, 15, 16, 1 build `pool_seq` (16 zeros, then 2, 2) and read it: (2, 1),
    (0, 0), (0, 15), (2, 0), (0, 1). An update that adds pool 16 to seq 0 drops the
    column: global pools 16 and 18 are then (0, 16) and (2, 1)."""
    c, lay = setup(kpool=2, n_seq_max=3)
    decode(c, 0, range(32))
    decode(c, 2, range(4))
    lay.update(c, [C, C, C], False)
    assert lay.pool_start().tolist() == [0, 16, 16, 18]
    seq, k = lay.locate(np.array([16]))
    assert (seq.tolist(), k.tolist()) == ([2], [0]) and lay._pool_seq is None
    seq, k = lay.locate(np.array([17, 0, 15, 16, 1]))
    assert lay.pool_seq().tolist() == [0] * 16 + [2, 2]
    assert (seq.tolist(), k.tolist()) == ([2, 0, 0, 2, 0], [1, 0, 15, 0, 1])
    decode(c, 0, range(32, 34))
    lay.update(c, [C, C, C], False)
    assert lay._pool_seq is None
    seq, k = lay.locate(np.array([16, 18]))
    assert (seq.tolist(), k.tolist()) == ([0, 2], [16, 1])


def test_every_pool_is_one_array_while_the_pools_stand():
    """Layout.every_pool, pool_members and columns: kpool 2, seq 0 pos 0..5 (pools 0-2,
    members rows 0,1 / 2,3 / 4,5), seq 1 pos 0..3 (cells 6..9: pools 3, 4, members
    6,7 / 8,9). every_pool is [0..4] and pool_members those rows; `columns` of it are
    the whole-layout columns (seq 0 0 0 1 1, k 0 1 2 0 1). A decode of seq 0 that
    closes no pool (pos 6: cell 10) leaves the same arrays; the next (pos 7, cell 11)
    adds pool 3 of seq 0 (members 10, 11): a new every_pool [0..5], and the old array
    is no longer `is_every_pool`."""
    c, lay = setup(kpool=2)
    decode(c, 0, range(6))
    decode(c, 1, range(4))
    lay.update(c, [C, C], False)
    every = lay.every_pool()
    assert every.tolist() == [0, 1, 2, 3, 4] and lay.is_every_pool(every)
    assert lay.pool_members().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert not lay.is_every_pool(np.arange(5))  # the same values are not the array
    seq, k, first, last = lay.columns(every)
    assert (seq.tolist(), k.tolist()) == ([0, 0, 0, 1, 1], [0, 1, 2, 0, 1])
    assert seq is lay.pool_seq() and first is lay.pool_first_pos()
    assert (first.tolist(), last.tolist()) == ([0, 2, 4, 0, 2], [1, 3, 5, 1, 3])
    members = lay.pool_members()
    decode(c, 0, [6])
    lay.update(c, [C, C], False)
    assert lay.every_pool() is every and lay.pool_members() is members
    decode(c, 0, [7])
    lay.update(c, [C, C], False)
    assert not lay.is_every_pool(every)
    assert lay.every_pool().tolist() == [0, 1, 2, 3, 4, 5]
    assert lay.pool_members().tolist() == [[0, 1], [2, 3], [4, 5], [10, 11], [6, 7], [8, 9]]


def test_pool_members_carry_the_kept_pools_over_a_change_and_look_up_the_new():
    """CompiledLayout `_every_members`: kpool 2, seq 0 pos 0..5 (cells 0..5: pools
    members 0,1 / 2,3 / 4,5), seq 1 pos 0..3 (cells 6..9: 6,7 / 8,9). Asked once, then
    seq 0 pos 6, 7 (cells 10, 11) closes a pool: the kept five keep their rows (read
    from the columns built before) and seq 0's new pool 3 is [10, 11], placed before
    seq 1's. Then two changes with no ask between (seq 1 pos 4, 5 and pos 6, 7: cells
    12..15), so nothing is carried from columns two changes old: seq 1 gains [12, 13]
    and [14, 15]. Each answer is also the reference's look-up of every pool."""
    c = KvCache(CacheConfig(kv_size=64, kpool=2, n_seq_max=2))
    lay = CompiledLayout(2, 2, False, 64, 64)
    decode(c, 0, range(6))
    decode(c, 1, range(4))
    lay.update(c, [C, C], False)
    assert lay.pool_members().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    decode(c, 0, [6, 7])
    lay.update(c, [C, C], False)
    want = [[0, 1], [2, 3], [4, 5], [10, 11], [6, 7], [8, 9]]
    assert lay.pool_members().tolist() == want
    decode(c, 1, [4, 5])
    lay.update(c, [C, C], False)
    decode(c, 1, [6, 7])
    lay.update(c, [C, C], False)
    want += [[12, 13], [14, 15]]
    assert lay.pool_members().tolist() == want
    assert Layout._look_up_members(lay, lay.every_pool()).tolist() == want


@pytest.mark.parametrize("compiled", [False, True])
def test_members_of_reads_pool_members_while_the_pools_stand(compiled: bool):
    """Layout.members_of once pool_members is built (a re-pool-all ubatch's marking
    builds it; its plan, verification and listing ask again): the layout of
    `test_every_pool_is_one_array_while_the_pools_stand` (members 0,1 / 2,3 / 4,5 /
    6,7 / 8,9). Pools 4, 0, 2, out of order: [8, 9], [0, 1], [4, 5], read in the built
    columns (a spoiled copy of them shows it), in a new array (writing it leaves them
    as they were). Once seq 0's pos 6, 7 (cells 10, 11) close a pool, the columns are
    gone and pools 3, 5 are looked up: [10, 11] (seq 0's new pool 3) and [8, 9]."""
    c = KvCache(CacheConfig(kv_size=64, kpool=2, n_seq_max=2))
    lay = CompiledLayout(2, 2, False, 64, 64) if compiled else Layout(2, 2, False, 64)
    decode(c, 0, range(6))
    decode(c, 1, range(4))
    lay.update(c, [C, C], False)
    ips = np.array([4, 0, 2])
    assert lay.members_of(ips).tolist() == [[8, 9], [0, 1], [4, 5]]  # looked up
    members = lay.pool_members()
    members[4] = [60, 61]  # spoiled, to see where the answer comes from
    got = lay.members_of(ips)
    assert got.tolist() == [[60, 61], [0, 1], [4, 5]]
    members[4] = [8, 9]
    got[:] = -1
    assert lay.pool_members().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    decode(c, 0, [6, 7])
    lay.update(c, [C, C], False)
    assert lay._every is None
    assert lay.members_of(np.array([3, 5])).tolist() == [[10, 11], [8, 9]]


def test_compiled_members_look_up_reads_every_sequence_in_one_call(monkeypatch):
    """CompiledLayout `_look_up_members` looks up pools of several sequences, in any
    order, in one `kernels.members` call over the flat columns. Kpool 2, seq 0 pos
    0..5 (cells 0..5: pools 0, 1, 2 = members 0,1 / 2,3 / 4,5), seq 1 pos 0..3 (cells
    6..9: pools 3, 4 = 6,7 / 8,9). Pools 3, 0, 2: [6, 7], [0, 1], [4, 5]. Seq 0's pos
    6, 7 (cells 10, 11) close its pool 3, placed before seq 1's: pools 2, 3, 5 are now
    [4, 5], [10, 11], [8, 9]."""
    from kpool_cli.compiled import kernels as k

    calls = []
    # the kernel loaded first: a first-call stub puts the kernel in its module, over
    # the counter
    lay = CompiledLayout(2, 2, False, 64, 64)
    lay.members_of(np.zeros(0, dtype=np.int64))
    kernel = k.members

    def counted(*args):  # type: ignore[no-untyped-def]
        calls.append(args[4].tolist())
        return kernel(*args)

    monkeypatch.setattr(k, "members", counted)
    c = KvCache(CacheConfig(kv_size=64, kpool=2, n_seq_max=2))
    decode(c, 0, range(6))
    decode(c, 1, range(4))
    lay.update(c, [C, C], False)
    assert lay.members_of(np.array([3, 0, 2])).tolist() == [[6, 7], [0, 1], [4, 5]]
    assert calls == [[3, 0, 2]]
    decode(c, 0, [6, 7])
    lay.update(c, [C, C], False)
    assert lay.members_of(np.array([2, 3, 5])).tolist() == [[4, 5], [10, 11], [8, 9]]
    assert calls == [[3, 0, 2], [2, 3, 5]]


@pytest.mark.parametrize("compiled", [False, True])
def test_rep_pos_now_reads_the_one_sequences_own_array_and_else_the_column(compiled: bool):
    """Layout.pool_rep_pos_now, by hand, kpool 2: seq 1 alone holds pools (pos 0..5,
    reps at pos 1, 3, 5): its own array, a view (no copy, and none kept). Once seq 0
    holds pools too (pos 0..3: reps 1, 3), the whole column in layout order, seq 0's
    first: [1, 3, 1, 3, 5]; once `pool_rep_pos` has built it, that very array."""
    c = KvCache(CacheConfig(kv_size=64, kpool=2, n_seq_max=2))
    lay = CompiledLayout(2, 2, False, 64, 64) if compiled else Layout(2, 2, False, 64)
    decode(c, 1, range(6))
    lay.update(c, [C, C], False)
    now = lay.pool_rep_pos_now()
    assert now.tolist() == [1, 3, 5] == lay.seqs[1].rep_pos().tolist()
    assert lay._pool_rep_pos is None and now.base is not None  # a view, kept by no one
    decode(c, 0, range(4))
    lay.update(c, [C, C], False)
    whole = lay.pool_rep_pos_now()
    assert whole.tolist() == [1, 3, 1, 3, 5]
    assert lay.pool_rep_pos() is lay.pool_rep_pos_now()
