"""Rules of the cache model (ENGINE.md §2-3) that no other test pinned: each test here
was written for a mutant of kpool_cli/cache/ that survived the mutation check
(docs/testing.md, tests/mutation/), and asserts what the rule says, derived by hand in
the test, not the mutant's text."""

from __future__ import annotations

import numpy as np
from conftest import toks

from kpool_cli.cache.batch import split_equal, validate
from kpool_cli.cache.kv import KvCache
from kpool_cli.trace.model import CacheConfig


def cache(kv_size: int = 16, n_seq_max: int = 2, unified: bool = True) -> KvCache:
    return KvCache(CacheConfig(kv_size=kv_size, kpool=4, n_seq_max=n_seq_max, unified=unified))


def decode(c: KvCache, seq: int, positions, ext=None) -> np.ndarray:
    """One ubatch of `seq` at `positions` (ext: one (x, y) per token); global rows."""
    pos = np.array(list(positions), dtype=np.int64)
    seqs = [(seq,)] * pos.size
    (pl,) = c.plan([(pos, seqs, None)])
    ext = None if ext is None else np.array(ext, dtype=np.int64)
    rows, _ = c.apply(pl, pos, ext, seqs)
    c.check_invariants()
    return rows


# -- §3: split_equal ---------------------------------------------------------------------


def test_s3_split_walk_skips_an_overlapping_set_and_goes_on():
    """ENGINE.md §3: each ubatch walks *every* unused token in batch order and collects
    its set when it overlaps none collected. Tokens {0}, {0, 1}, {2}: {0} is collected,
    {0, 1} overlaps it and is passed over, {2} is still collected: ubatch 0 = tokens 0
    and 2 (one lock-step round: {0} has no second token), ubatch 1 = token 1."""
    ubs = split_equal(toks((0, [0]), (0, [0, 1]), (0, [2])), 8, sequential=False)
    assert [u.tokens for u in ubs] == [(0, 2), (1,)]
    assert [u.n_seqs_unq for u in ubs] == [2, 2]


def test_s3_sequential_split_collects_one_set_past_n_ubatch():
    """ENGINE.md §3 (sequential): collect until *more than* n_ubatch sets are collected,
    and docs/ENGINE-NOTES.md: the first lock-step round is always taken. n_ubatch 2,
    one token each of seqs 0, 1, 2: three sets are collected (stop once 3 > 2), the
    first round takes all three tokens: one ubatch of n_ubatch + 1 = 3 tokens."""
    ubs = split_equal(toks((0, [0]), (0, [1]), (0, [2])), 2, sequential=True)
    assert [u.tokens for u in ubs] == [(0, 1, 2)]
    assert ubs[0].n_seqs_unq == 3


# -- §2: edits -------------------------------------------------------------------------------


def test_s2_seq_rm_every_sequence_with_empty_streams():
    """ENGINE.md §2: seq_rm(-1, p0, p1) removes every sequence's cells in range; a
    stream that holds no cell at all is simply left as it is (non-unified: each
    sequence's own stream; unified: the one stream, empty here)."""
    c = cache(kv_size=8, n_seq_max=2, unified=False)
    decode(c, 0, range(4))  # stream 0, cells 0..3; stream 1 stays empty
    c.seq_rm(-1, 1, 3)  # drops pos 1, 2: cells 1, 2 of stream 0; head = min(4, 1)
    c.check_invariants()
    assert [st.used for st in c.streams] == [2, 0]
    assert c.streams[0].pos[:4].tolist() == [0, -1, -1, 3]
    assert list(c.heads) == [1, 0]
    u = cache(kv_size=8)
    u.seq_rm(-1, -1, -1)  # nothing at all to remove
    u.check_invariants()
    assert u.streams[0].used == 0 and u.heads[0] == 0


def test_s2_seq_add_and_seq_div_move_a_range_of_one_cell():
    """ENGINE.md §2: seq_add adds `shift` to the pos of every cell of s in range, and
    seq_div divides it, however many cells the range holds, one included. pos 0..5 in
    cells 0..5: seq_add(0, 5, -1, +3) moves cell 5 to pos 8 (nothing freed: head = 0,
    docs/ENGINE-NOTES.md); seq_div(0, 8, -1, 2) then moves it to 4."""
    c = cache()
    decode(c, 0, range(6))
    st = c.streams[0]
    c.seq_add(0, 5, -1, 3)
    assert st.pos[:6].tolist() == [0, 1, 2, 3, 4, 8]
    assert c.seq_pos_max(0) == 8 and c.heads[0] == 0
    c.seq_div(0, 8, -1, 2)
    assert st.pos[:6].tolist() == [0, 1, 2, 3, 4, 4]
    assert c.seq_pos_max(0) == 4
    c.check_invariants()


def test_s2_seq_add_reversed_range_resets_head_and_moves_nothing():
    """docs/ENGINE-NOTES.md (seq_add head): a reversed range (p0 > p1) moves no cell but
    still sets head to 0 (no cell was freed)."""
    c = cache()
    decode(c, 0, range(6))
    st = c.streams[0]
    assert c.heads[0] == 6
    c.seq_add(0, 4, 2, 3)
    assert c.heads[0] == 0
    assert st.pos[:6].tolist() == list(range(6))
    c.check_invariants()


def test_s2_a_zero_p1_is_an_empty_range_not_the_end():
    """ENGINE.md §2: only p1 < 0 means infinity; p1 = 0 bounds the range [p0, 0), which
    holds nothing: seq_rm, seq_cp, seq_add and seq_div with p1 = 0 change no cell."""
    c = cache()
    decode(c, 0, range(4))
    st = c.streams[0]
    before = st.pos.copy()
    c.seq_rm(0, -1, 0)
    c.seq_cp(0, 1, -1, 0)
    c.seq_add(0, -1, 0, 5)
    c.seq_div(0, -1, 0, 2)
    assert np.array_equal(st.pos, before)
    assert c.seq_pos_min(0) == 0 and c.seq_pos_max(0) == 3
    assert c.seq_pos_max(1) == -1
    c.check_invariants()


def test_s2_seq_rm_to_the_end_reaches_a_position_shifted_near_int32_max():
    """ENGINE.md §2: seq_rm(s, -1, -1) drops s from every cell, whatever its pos: p1 < 0
    is llama.cpp's INT32_MAX, and the range [0, INT32_MAX) holds a cell that a seq_add
    moved to pos 2**31 - 2."""
    c = cache()
    decode(c, 0, [0])
    c.seq_add(0, -1, -1, 2**31 - 2)
    assert c.seq_pos_max(0) == 2**31 - 2
    c.seq_rm(0, -1, -1)
    assert c.seq_pos_max(0) == -1 and c.streams[0].used == 0
    c.check_invariants()


# -- §2: state_write / state_read / state_drop ---------------------------------------------


def test_s2_state_ops_report_global_rows():
    """ENGINE.md §2: a global row is strm * kv_size + cell. Non-unified, kv_size 8: seq 1
    lives in stream 1, so its cells 0..2 are rows 8..10 for state_write's snapshot,
    state_read's restore (seq_rm frees them, find_slot takes them again from head 0)
    and state_drop's zeroed rows."""
    c = cache(kv_size=8, n_seq_max=2, unified=False)
    assert decode(c, 1, range(3)).tolist() == [8, 9, 10]
    c.state_write(1, "a")
    assert c.snapshots["a"].rows.tolist() == [8, 9, 10]
    ok, rows = c.state_read(1, "a")
    assert ok and rows.tolist() == [8, 9, 10]
    assert c.state_drop(1).tolist() == [8, 9, 10]
    c.check_invariants()
    u = cache(kv_size=8)  # unified: stream 0, rows are cells
    decode(u, 0, range(2))
    decode(u, 1, range(3))  # cells 2..4
    u.state_write(1, "b")
    assert u.snapshots["b"].rows.tolist() == [2, 3, 4]
    assert u.state_drop(1).tolist() == [2, 3, 4]


def test_s2_state_read_restores_ext():
    """ENGINE.md §2: state_write snapshots pos, ext and the key rows; state_read puts
    them back whole. M-RoPE image tokens share a pos and differ in ext."""
    c = cache(kv_size=8)
    decode(c, 0, [0, 1, 1, 2], ext=[(0, 0), (3, 4), (5, 6), (0, 0)])
    c.state_write(0, "a")
    c.seq_rm(0, -1, -1)
    ok, rows = c.state_read(0, "a")
    st = c.streams[0]
    cells = rows % 8
    assert ok
    assert st.pos[cells].tolist() == [0, 1, 1, 2]
    assert st.ext[cells].tolist() == [[0, 0], [3, 4], [5, 6], [0, 0]]
    c.check_invariants()


def test_s2_state_read_of_an_empty_snapshot_or_without_room_restores_no_row():
    """ENGINE.md §2: an empty snapshot leaves s untouched (no row restored); with no room
    the restore fails, s has been removed and no row is restored either: the rows
    returned are those of the cells s held alone (0, 1), which the indexer cache's
    state_clear zeroes (ENGINE-NOTES.md, "the rows a failed restore zeroes")."""
    c = cache(kv_size=8)
    c.state_write(1, "empty")  # seq 1 holds nothing
    decode(c, 0, range(4))
    ok, rows = c.state_read(0, "empty")
    assert ok and rows.size == 0
    assert c.seq_pos_max(0) == 3  # untouched
    c.state_write(0, "four")
    c.seq_rm(0, 2, -1)  # seq 0 keeps 2 cells
    decode(c, 1, range(6))  # 2 + 6 = 8: the cache is full
    ok, rows = c.state_read(0, "four")  # seq_rm frees 2 cells, 4 are needed
    assert not ok and rows.tolist() == [0, 1]
    assert c.seq_pos_max(0) == -1
    c.check_invariants()


def test_s2_a_snapshot_of_the_whole_cache_restores():
    """ENGINE.md §2: a snapshot larger than kv_size fails; one of exactly kv_size cells
    (a sequence filling the cache) is restored whole."""
    c = cache(kv_size=8)
    decode(c, 0, range(8))
    c.state_write(0, "all")
    ok, rows = c.state_read(0, "all")
    assert ok and sorted(rows.tolist()) == list(range(8))
    assert c.seq_pos_min(0) == 0 and c.seq_pos_max(0) == 7
    c.check_invariants()


# -- §3: validation --------------------------------------------------------------------------


def test_s3_seq_ids_are_below_n_seq_max():
    """ENGINE.md §3: seq ids in [0, n_seq_max): with 2 sequences, id 2 is refused."""
    c = cache(n_seq_max=2)
    assert validate(toks((0, [1])), c, c.config.n_seq_max, mrope=False, embd=False) is None
    assert validate(toks((0, [2])), c, c.config.n_seq_max, mrope=False, embd=False) is not None


def test_s3_y_equals_x_plus_one_from_a_last_position_of_0():
    """ENGINE.md §3: a sequence whose last pos is X = 0 must go on at Y = 1."""
    c = cache()
    decode(c, 0, [0])
    assert validate(toks((1, [0])), c, c.config.n_seq_max, mrope=False, embd=False) is None
    assert validate(toks((2, [0])), c, c.config.n_seq_max, mrope=False, embd=False) is not None
    assert validate(toks((0, [0])), c, c.config.n_seq_max, mrope=False, embd=False) is not None


def test_s3_mrope_checks_every_sequence_and_names_the_relation():
    """ENGINE.md §3, M-RoPE: text needs X < Y, image embeddings X <= Y, for every
    sequence of the batch. X = 0 counts as a last position (seq 0 holds pos 0): text at
    Y = 0 breaks X < Y, an image at Y = 0 does not. Seq 0 fine and seq 1 (X = 3) not:
    the batch is refused for seq 1. The refusal states the relation that broke."""
    c = cache()
    decode(c, 0, [0])
    decode(c, 1, range(4))
    text = validate(toks((0, [0])), c, c.config.n_seq_max, mrope=True, embd=False)
    assert text is not None and "X < Y" in text
    assert validate(toks((0, [0])), c, c.config.n_seq_max, mrope=True, embd=True) is None
    both = toks((1, [0]), (2, [1]))
    msg = validate(both, c, c.config.n_seq_max, mrope=True, embd=False)
    assert msg is not None and msg.startswith("seq 1") and "X < Y" in msg
    msg = validate(toks((1, [0]), (2, [1])), c, c.config.n_seq_max, mrope=True, embd=True)
    assert msg is not None and msg.startswith("seq 1") and "X <= Y" in msg


# -- §2: the per-sequence order -----------------------------------------------------------


def test_s2_unified_seq_cp_into_a_one_cell_sequence_keeps_pos_order():
    """ENGINE.md §2: per sequence the cache keeps its (pos, cell) pairs ordered by pos,
    then cell. Seq 1 holds one cell at pos 10; copying seq 0's pos 0..3 into it
    (unified: dst keeps its own cells, docs/ENGINE-NOTES.md) gives seq 1 pos 0..10:
    pos_min 0, pos_max 10."""
    c = cache()
    decode(c, 1, [10])  # cell 0
    decode(c, 0, range(4))  # cells 1..4
    c.seq_cp(0, 1, -1, -1)
    assert c.seq_pos_min(1) == 0 and c.seq_pos_max(1) == 10
    assert (c.seq_keys(1) >> 32).tolist() == [0, 1, 2, 3, 10]
    c.check_invariants()


# -- §3: find_slot --------------------------------------------------------------------------


def test_s3_find_slot_head_rule_is_strictly_greater():
    """ENGINE.md §3: start at 0 only if head > used + 2 * n_tokens. Cells 0..3 free,
    4, 5 used, head 6, n = 2: 6 > 2 + 4 is false: the scan starts at head (cells 6, 7)."""
    c = cache()
    decode(c, 0, range(6))
    c.seq_rm(0, 0, 4)
    c._heads[0] = 6  # as if the frees had happened elsewhere
    assert decode(c, 0, [6, 7]).tolist() == [6, 7]


def test_s3_find_slot_from_head_at_the_end_starts_at_cell_0():
    """ENGINE.md §3: head = kv_size (the last ubatch ended in the last cell): the scan
    starts at 0, where a cell is free, and cell 0 comes first."""
    c = cache(kv_size=8)
    decode(c, 0, range(8))
    c.seq_rm(0, 0, 2)  # cells 0, 1 free
    c._heads[0] = 8
    assert decode(c, 1, [0]).tolist() == [0]


def test_s3_later_ubatches_skip_cells_an_earlier_one_took_after_a_wrap():
    """ENGINE.md §3: each ubatch of a decode sees the cells the earlier ones took. kv 8,
    cells 2, 3 used, 0, 1 free, head 6: ubatch 0 (3 tokens) takes 6, 7, then wraps to 0
    (head = 0 + 1, docs/ENGINE-NOTES.md); ubatch 1 (2 tokens) scans from 1 and takes 1,
    4: not 6 or 7, which ubatch 0 took and which are still empty."""
    c = cache(kv_size=8)
    decode(c, 0, range(4))
    c.seq_rm(0, 0, 2)
    c._heads[0] = 6
    ubs = [(np.array([4, 5, 6]), [(0,)] * 3, None), (np.array([7, 8]), [(0,)] * 2, None)]
    pl = c.plan(ubs)
    assert [p.cells.tolist() for p in pl] == [[6, 7, 0], [1, 4]]


def test_s3_later_ubatches_count_the_used_cells_of_earlier_ones():
    """ENGINE.md §3: `used` in the head rule counts the cells in use, those the earlier
    ubatches of the decode took included. kv 32, cells 2..11 used (10), 0, 1 free, head
    12: ubatch 0 (2 tokens): 12 > 10 + 4 is false, cells 12, 13, head 14; ubatch 1:
    used = 12, 14 > 12 + 4 is false: cells 14, 15 (not a restart at 0)."""
    c = cache(kv_size=32)
    decode(c, 0, range(12))
    c.seq_rm(0, 0, 2)
    c._heads[0] = 12
    ubs = [(np.array([12, 13]), [(0,)] * 2, None), (np.array([14, 15]), [(0,)] * 2, None)]
    assert [p.cells.tolist() for p in c.plan(ubs)] == [[12, 13], [14, 15]]


def test_s3_recorded_cells_are_used_as_given():
    """A trace may record each token's cell (docs/FORMATS.md): plan places the tokens
    there, not where find_slot would."""
    c = cache()
    pl = c.plan([(np.array([0, 1]), [(0,), (0,)], np.array([5, 3]))])
    assert pl[0].cells.tolist() == [5, 3]


def test_s3_find_slot_on_a_large_cache_takes_exactly_n_cells():
    """ENGINE.md §3: take every empty cell from head until the ubatch has one per token,
    however far the scan reads (it reads in growing chunks, Stream.empty_cells, the
    first of 4096 cells). kv 16384, cells 0..4094 used, head 0 (0 > 4095 + 4 is false):
    the first chunk has one free cell, the next one more: cells 4095 and 4096, nothing
    more."""
    c = cache(kv_size=16384)
    decode(c, 0, range(4095))
    c._heads[0] = 0
    assert decode(c, 0, [4095, 4096]).tolist() == [4095, 4096]
    assert c.streams[0].used == 4097 and c.heads[0] == 4097


def test_s2_state_read_wraps_when_no_cell_after_head_is_free():
    """ENGINE.md §2: state_read places the snapshot with find_slot, which wraps once. kv
    8: seq 1's snapshot holds 2 cells; cells 2..7 used, 0, 1 free, head 4: nothing is
    free from head to the end, so seq 2 (empty: its seq_rm frees nothing) gets 0, 1."""
    c = cache(kv_size=8, n_seq_max=3)
    decode(c, 0, range(4))  # cells 0..3
    decode(c, 1, range(2))  # cells 4, 5
    c.state_write(1, "two")
    decode(c, 0, [4, 5])  # cells 6, 7: the cache is full
    c.seq_rm(0, 0, 2)  # cells 0, 1 free
    c._heads[0] = 4  # as if the frees had happened elsewhere
    ok, rows = c.state_read(2, "two")
    assert ok and rows.tolist() == [0, 1]
    assert c.seq_pos_min(2) == 0 and c.seq_pos_max(2) == 1
    c.check_invariants()


# -- the key write counter --------------------------------------------------------------


def test_key_ids_count_writes_from_1():
    """kv.py (`n_key_writes`): every written cell gets the next key id, 1, 2, ...; 0 is
    the zeroed row. ENGINE.md §8: keys are deterministic from the seed and this counter,
    so a trace gets the same keys in every run."""
    c = cache()
    pos = np.arange(3)
    (pl,) = c.plan([(pos, [(0,)] * 3, None)])
    _, ids = c.apply(pl, pos, None, [(0,)] * 3)
    assert ids.tolist() == [1, 2, 3]
    assert c.streams[0].key_id[:3].tolist() == [1, 2, 3]


def test_s3_prepare_remembers_every_earlier_ubatchs_cells():
    """ENGINE.md §3 (llama_kv_cache::prepare places every ubatch before applying any):
    kv_size 8, cells 2..5 used, 0, 1, 6, 7 free, head 6. Three ubatches of 2 tokens:
    ubatch 0 takes 6, 7 (head 8 -> wraps to 0); ubatch 1 takes 0, 1 (head 2); ubatch 2
    finds 2..5 used, 6, 7 promised to ubatch 0 and 0, 1 to ubatch 1: no room, the whole
    decode fails."""
    c = cache(kv_size=8)
    decode(c, 0, range(6))
    c.seq_rm(0, 0, 2)
    c._heads[0] = 6  # as a later decode past the end would leave it
    ubs = [(np.array([p, p + 1]), [(1,), (1,)], None) for p in (0, 2, 4)]
    assert c.plan(ubs) is None
    assert [p.cells.tolist() for p in c.plan(ubs[:2])] == [[6, 7], [0, 1]]
