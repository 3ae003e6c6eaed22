"""The cache model's unit rules (ENGINE.md §2-3), and the places where kpool follows
the real llama.cpp code over ENGINE.md (docs/ENGINE-NOTES.md)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import toks
from hypothesis import given, settings
from hypothesis import strategies as st

from kpool_cli.cache import batch
from kpool_cli.cache.batch import (
    SeqSets,
    one_id_each,
    one_seq_each,
    one_set,
    split_equal,
    validate,
)
from kpool_cli.cache.cells import Stream
from kpool_cli.cache.kv import KvCache
from kpool_cli.trace.model import CacheConfig, Token


def cache(kv_size=16, n_seq_max=2, unified=True) -> KvCache:
    return KvCache(CacheConfig(kv_size=kv_size, kpool=4, n_seq_max=n_seq_max, unified=unified))


def decode(c: KvCache, seq: int, positions, ) -> np.ndarray:
    pos = np.array(list(positions), dtype=np.int64)
    seqs = [(seq,)] * pos.size
    (pl,) = c.plan([(pos, seqs, None)])
    rows, key_ids = c.apply(pl, pos, None, seqs)
    assert key_ids.tolist() == list(range(c.n_key_writes - pos.size + 1, c.n_key_writes + 1))
    c.check_invariants()
    return rows


def test_s3_find_slot_takes_empty_cells_from_head_and_moves_head_past_the_last():
    """ENGINE.md §3: scan from head, every empty cell; head = last cell used + 1."""
    c = cache()
    assert decode(c, 0, range(4)).tolist() == [0, 1, 2, 3]
    assert c.heads[0] == 4
    c.seq_rm(0, 1, 3)  # frees cells 1, 2: head = min(head, 1)
    assert c.heads[0] == 1
    # head (1) is not > used (2) + 2 * 2, so the scan starts at 1
    assert decode(c, 1, range(2)).tolist() == [1, 2]
    assert c.heads[0] == 3


def test_s3_find_slot_restarts_at_zero_when_head_is_far_past_used():
    """ENGINE.md §3: head > used + 2 * n_tokens: start at 0."""
    c = cache(kv_size=32)
    decode(c, 0, range(12))
    c.seq_rm(0, 0, 10)  # cells 0..9 free, head -> 0
    c._heads[0] = 12  # as if the frees had happened elsewhere
    # used = 2, n = 1: 12 > 2 + 2 -> restart at 0
    assert decode(c, 0, [12]).tolist() == [0]


def test_s3_find_slot_wraps_and_head_follows_placement_order():
    """ENGINE.md §3 + docs/ENGINE-NOTES.md: after a wrap, head = the last token's cell
    in placement order + 1, not the highest cell + 1."""
    c = cache(kv_size=8, n_seq_max=2)
    decode(c, 0, range(8))
    c.seq_rm(0, 0, 2)  # cells 0, 1 free
    st = c.streams[0]
    c._heads[0] = 7
    st.seq_rm(0, 6, 7)  # free cell 6 without moving head
    # head 7 is not > used (5) + 2 * 3: the scan starts at 7, wraps to 0, 1 ... 6
    rows = decode(c, 1, range(3))
    assert rows.tolist() == [0, 1, 6]
    assert c.heads[0] == 7
    st.seq_rm(0, 7, 8)
    st.seq_rm(1, 0, 3)
    c._heads[0] = 6
    # from 6: cells 6, 7, then wrap to 0
    assert decode(c, 1, range(3)).tolist() == [6, 7, 0]
    assert c.heads[0] == 1


def test_s3_no_room_places_nothing():
    """ENGINE.md §3: not enough empty cells: the whole decode fails."""
    c = cache(kv_size=8)
    decode(c, 0, range(6))
    before = c.streams[0].pos.copy()
    pos = np.arange(6, 9)
    assert c.plan([(pos, [(0,)] * 3, None)]) is None
    assert np.array_equal(c.streams[0].pos, before)


def test_failed_prepare_head_quirk():
    """docs/ENGINE-NOTES.md: llama_kv_cache::prepare restores `head = v_heads_old[s]`
    with s the index in the ubatch's stream list: in a non-unified cache a failed
    decode leaves stream 1 with stream 0's old head."""
    c = cache(kv_size=8, n_seq_max=2, unified=False)
    decode(c, 0, range(3))  # stream 0 head 3
    decode(c, 1, range(6))  # stream 1 head 6
    ub1 = (np.arange(6, 8), [(1,), (1,)], None)  # fits stream 1 (cells 6, 7)
    ub2 = (np.arange(8, 11), [(1,)] * 3, None)  # no room left in stream 1
    assert c.plan([ub1, ub2]) is None
    # ubatch 1 touched only stream 1, at index 0 of its stream list: head <- stream 0's
    assert c.heads[1] == 3
    assert c.heads[0] == 3


def test_s2_seq_add_head_rules():
    """ENGINE.md §3 + docs/ENGINE-NOTES.md: seq_add sets head to the first freed cell,
    else 0; a zero shift or an empty range leaves head alone."""
    c = cache(kv_size=16)
    decode(c, 0, range(6))
    st = c.streams[0]
    c.seq_add(0, 0, -1, 0)
    assert c.heads[0] == 6
    c.seq_add(0, 3, 3, 5)
    assert c.heads[0] == 6
    c.seq_add(0, 2, -1, 1)  # frees nothing
    assert c.heads[0] == 0
    c._heads[0] = 6
    c.seq_add(0, 0, 2, -1)  # pos 0 -> -1: cell 0 empties
    assert c.heads[0] == 0 and st.pos[0] == -1 and st.pos[1] == 0
    c.check_invariants()


def test_s2_seq_add_moves_a_shared_cell_for_every_sequence():
    """ENGINE.md §2: pos belongs to the cell."""
    c = cache()
    decode(c, 0, range(4))
    c.seq_cp(0, 1, -1, -1)
    c.seq_add(0, 2, -1, 10)
    assert c.seq_pos_max(1) == 13
    c.check_invariants()


def test_s2_seq_div_never_moves_head():
    c = cache()
    decode(c, 0, range(8))
    st = c.streams[0]
    c._heads[0] = 5
    c.seq_div(0, 0, -1, 2)
    assert c.heads[0] == 5
    assert sorted(st.pos[:8].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]
    c.check_invariants()


def test_s2_seq_keep_and_seq_rm_free_cells_and_lower_head():
    c = cache()
    decode(c, 0, range(4))
    decode(c, 1, range(4))
    c.seq_cp(0, 1, 0, 2)  # cells 0, 1 shared
    c.seq_keep(1)
    st = c.streams[0]
    assert st.pos[2] == -1 and st.pos[3] == -1 and st.pos[0] == 0
    assert [s for j, s in enumerate(st.seq_ids) if st.has[j, 0]] == [1]
    assert c.heads[0] == 2
    c.check_invariants()


def test_s2_unified_seq_cp_keeps_the_destinations_own_cells():
    c = cache()
    decode(c, 1, range(2))
    decode(c, 0, range(4))
    c.seq_cp(0, 1, 2, 4)
    keys = c.seq_keys(1)
    assert (keys >> 32).tolist() == [0, 1, 2, 3]
    c.check_invariants()


def test_s2_cross_stream_copy_ignores_the_range_and_copies_the_head():
    c = cache(unified=False)
    decode(c, 0, range(5))
    c.seq_cp(0, 1, -1, -1)
    assert (c.seq_keys(1) & 0xFFFFFFFF).tolist() == [0, 1, 2, 3, 4]
    assert c.heads[1] == c.heads[0] == 5
    assert c.take_update().copies == [(0, 1)]
    c.check_invariants()


def test_llama_kv_cache_clear_keeps_the_pending_stream_copies():
    """llama_kv_cache::clear resets cells and heads but not `sc_info`: the copy a
    cross-stream seq_cp queued is still applied at the next update."""
    c = cache(unified=False)
    decode(c, 0, range(5))
    c.seq_cp(0, 1, -1, -1)
    c.clear()
    assert all(h == 0 for h in c.heads)
    assert c.seq_pos_max(0) == c.seq_pos_max(1) == -1
    assert c.take_update().copies == [(0, 1)]
    assert c.take_update().copies == []  # taken once


# ENGINE.md §3, "The memory update": llama_kv_cells' has_shift, which
# llama_kv_cache::init_update reads (do_shift) and llama_kv_cache::update resets


def test_llama_kv_cells_pos_add_leaves_a_k_shift_for_llama_kv_cache_init_update():
    """A seq_add that moves a cell (llama_kv_cells::pos_add) sets has_shift: the next
    memory update runs (SUCCESS), and resets it (the one after is NO_UPDATE)."""
    c = cache()
    decode(c, 0, range(4))
    assert not c.take_update().ran  # nothing pending after a decode
    c.seq_add(0, 2, -1, 3)  # pos 2, 3 -> 5, 6
    got = c.take_update()
    assert (got.shift, got.copies, got.ran) == (True, [], True)
    assert not c.take_update().ran


def test_llama_kv_cache_seq_add_that_moves_nothing_leaves_no_k_shift():
    """A zero shift, an empty range, a reversed one, or a range with none of the
    sequence's cells: no pos_add runs, so no has_shift."""
    c = cache()
    decode(c, 0, range(4))
    for p0, p1, shift in ((0, -1, 0), (2, 2, 5), (3, 1, 5), (10, -1, 5)):
        c.seq_add(0, p0, p1, shift)
        assert not c.take_update().ran, (p0, p1, shift)


def test_llama_kv_cells_pos_div_leaves_a_k_shift_even_when_no_pos_moves():
    """pos_div sets has_shift for every cell it divides, even one whose pos stays (pos
    0 // 2 == 0); d == 1 returns before the loop."""
    c = cache()
    decode(c, 0, range(4))
    c.seq_div(0, 0, 1, 2)  # only cell 0 (pos 0), which stays at pos 0
    assert (c.seq_keys(0) >> 32).tolist() == [0, 1, 2, 3]
    assert c.take_update().shift
    c.seq_div(0, 0, -1, 1)
    assert not c.take_update().ran


def test_llama_kv_cells_reset_forgets_the_k_shift():
    """llama_kv_cache::clear resets every stream's cells, has_shift with them: a shift
    pending before a clear runs no memory update."""
    c = cache()
    decode(c, 0, range(4))
    c.seq_add(0, 0, -1, 2)
    c.clear()
    assert not c.take_update().ran


def test_a_cross_stream_copy_resets_the_destination_streams_k_shift():
    """A cross-stream seq_cp resets dst's stream (llama_kv_cells::reset), whose shift
    goes with it; the source stream's stays, and the copy itself is queued: the
    memory update runs either way."""
    c = cache(unified=False)
    decode(c, 0, range(4))
    decode(c, 1, range(4))
    c.seq_add(1, 0, -1, 1)  # stream 1's shift
    c.seq_cp(0, 1, -1, -1)
    assert [st.has_shift for st in c.streams] == [False, False]
    got = c.take_update()
    assert (got.shift, got.copies) == (False, [(0, 1)]) and got.ran


def check(tokens: tuple[Token, ...], c: KvCache, *, mrope: bool = False, embd: bool = False
          ) -> str | None:
    """Batch validation against the attention cache alone."""
    return validate(tokens, c, c.config.n_seq_max, mrope=mrope, embd=embd)


def test_s3_validation_y_equals_x_plus_one():
    c = cache()
    decode(c, 0, range(4))
    assert check(toks((4, [0])), c) is None
    assert "Y = X + 1" in check(toks((5, [0])), c)
    # an empty sequence may start anywhere
    assert check(toks((7, [1])), c) is None


def test_continuity_counts_distinct_positions():
    """docs/ENGINE-NOTES.md: [5, 5, 6] is continuous for llama.cpp (a std::set)."""
    c = cache()
    decode(c, 0, range(5))
    assert check(toks((5, [0]), (5, [0]), (6, [0])), c) is None
    assert "not continuous" in check(toks((5, [0]), (7, [0])), c)
    # one sequence's tokens: an id out of range is token 0's, whatever the positions
    assert check(toks((5, [2]), (7, [2])), c) == "token 0: invalid seq_id 2 (n_seq_max = 2)"
    assert check(toks((5, [-1]), (6, [-1])), c) == (
        "token 0: invalid seq_id -1 (n_seq_max = 2)")


def test_s3_validation_of_one_token_per_sequence():
    """ENGINE.md §3 for a step of parallel slots (each token its own sequence): seq ids
    checked in token order, then each sequence's Y = X + 1 in seq id order."""
    c = cache(n_seq_max=3)
    decode(c, 0, range(4))  # seq 0: X = 3
    assert check(toks((4, [0]), (9, [2])), c) is None  # seq 2 is empty: any Y
    decode(c, 1, range(2))  # seq 1: X = 1
    # both break Y = X + 1: seq 0 is named, first by id though second in the batch
    assert check(toks((9, [1]), (5, [0])), c) == (
        "seq 0: the cache's last position is X = 3 but the batch starts at Y = 5; it is "
        "required that Y = X + 1")
    assert check(toks((5, [0]), (0, [3])), c) == "token 1: invalid seq_id 3 (n_seq_max = 3)"
    # a stream per sequence: each one's X is its own stream's (seq 1: X = 1 in stream 1)
    c = cache(n_seq_max=3, unified=False)
    decode(c, 0, range(4))
    decode(c, 1, range(2))
    assert check(toks((4, [0]), (2, [1]), (0, [2])), c) is None
    assert check(toks((4, [0]), (4, [1])), c) == (
        "seq 1: the cache's last position is X = 1 but the batch starts at Y = 4; it is "
        "required that Y = X + 1")


def test_s3_validation_of_a_server_step_from_its_columns():
    """ENGINE.md §3 for a batch of one seq id a token, some ids shared (a server's step:
    one slot's prompt chunk, others' decodes), of `COLUMNS_FROM` tokens or more: checked
    from its seq id and pos columns, by the rules of a batch checked token by token.
    Seq 0 holds 0..3 (X = 3), seq 1 0..1 (X = 1); the numbers below are by hand."""
    c = cache(kv_size=128, n_seq_max=3)
    decode(c, 0, range(4))
    decode(c, 1, range(2))
    n = batch.COLUMNS_FROM
    # seq 1's decode (pos 2) ahead of seq 0's chunk 4..4+n-1, in descending order, and
    # a new seq 2's token: seq 0 holds n distinct positions from 4, continuous
    chunk = [(p, [0]) for p in range(4 + n - 1, 3, -1)]
    assert check(toks((2, [1]), *chunk, (7, [2])), c) is None
    # pos 5 twice: n tokens, n - 1 distinct positions 4..n+2, so continuous still
    # (a std::set), but one short of 4..n+3
    twice = [(5 if p == 6 else p, [0]) for p in range(4, 4 + n)]
    assert check(toks(*twice, (2, [1])), c) == (
        f"seq 0: positions 4..{n + 3} are not continuous")
    # seq 1's first position is not X + 1, seq 2's any: seq 1 named
    assert check(toks(*chunk, (3, [1]), (9, [2])), c) == (
        "seq 1: the cache's last position is X = 1 but the batch starts at Y = 3; it is "
        "required that Y = X + 1")
    # the first id out of range is named by its token, as token by token
    assert check(toks(*chunk, (2, [1]), (0, [3]), (0, [-1])), c) == (
        f"token {n + 1}: invalid seq_id 3 (n_seq_max = 3)")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(-1, 3)), max_size=80),
       st.integers(1, 40), st.booleans(), st.integers(0, 3), st.booleans())
def test_batches_of_one_seq_id_a_token_are_checked_and_split_alike_both_ways(
        specs, n_ubatch, sequential, keep, mrope) -> None:
    """cache/batch.py: a batch of one seq id a token (ids maybe shared, maybe out of
    range; positions in any order, maybe repeated) gets the same validation message
    and the same split (or refusal or abort) from its columns (`COLUMNS_FROM` 0) as
    token by token (`COLUMNS_FROM` past any batch)."""
    c = cache(kv_size=64, n_seq_max=3)
    decode(c, 0, range(4))
    decode(c, 1, range(2))
    tokens = toks(*((p, [s]) for p, s in specs))
    answers = []
    for columns_from in (0, 10**9):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(batch, "COLUMNS_FROM", columns_from)
            got = [check(tokens, c, mrope=mrope)]
            if all(0 <= s < 3 for _, s in specs):
                try:
                    got.append(split_equal(tokens, n_ubatch, sequential, keep))
                except batch.KeepTailAssert as e:
                    got.append(str(e))
            answers.append(got)
    assert answers[0] == answers[1]


def test_s3_decreasing_positions_are_accepted_as_the_code_does():
    c = cache()
    decode(c, 0, range(8))
    assert check(toks((9, [0]), (8, [0])), c) is None


def test_s3_coupled_sequences_must_not_have_diverged():
    c = cache()
    decode(c, 0, range(4))
    assert "diverged" in check(toks((4, [0, 1])), c)
    c.seq_cp(0, 1, -1, -1)
    assert check(toks((4, [0, 1])), c) is None


@pytest.mark.parametrize(("embd", "start", "ok"), [
    (False, 3, False), (False, 4, True), (True, 3, True), (True, 2, False)])
def test_s3_mrope_checks_only_x_below_y(embd, start, ok):
    """ENGINE.md §3: M-RoPE text needs X < Y, image embeddings X <= Y; no continuity."""
    c = cache()
    decode(c, 0, range(4))  # X = 3
    got = check(toks((start, [0]), (start + 5, [0])), c, mrope=True, embd=embd)
    assert (got is None) == ok


def test_s3_split_equal_100_plus_1():
    """ENGINE.md §3: 100 tokens of seq 0 and 1 of seq 1: a 2-token ubatch, then 99."""
    tokens = toks(*[(p, [0]) for p in range(100)], (0, [1]))
    ubs = split_equal(tokens, 512, sequential=False)
    assert [len(u.tokens) for u in ubs] == [2, 99]
    assert ubs[0].tokens == (0, 100)
    assert ubs[0].n_seqs_unq == 2


def test_split_equal_first_round_is_unconditional():
    """docs/ENGINE-NOTES.md: with more than n_ubatch sets the first round still runs."""
    tokens = toks(*[(0, [s]) for s in range(4)])
    ubs = split_equal(tokens, 2, sequential=False)
    assert [len(u.tokens) for u in ubs] == [3, 1]


def test_s3_split_equal_one_token_per_sequence():
    """ENGINE.md §3, parallel slots: n_ubatch or fewer tokens, each its own sequence,
    are every set collected and one round taking each set's token: one ubatch in batch
    order, whatever n_keep_tail (each set's remainder is 0). One more token than
    n_ubatch is still one ubatch (the unconditional first round, above); two more
    leave the last token for a second."""
    tokens = toks((5, [3]), (0, [0]), (9, [2]))
    for keep in (0, 2):
        (ub,) = split_equal(tokens, 3, sequential=False, n_keep_tail=keep)
        assert ub.tokens == (0, 1, 2) and ub.n_seqs_unq == 3
    assert [u.tokens for u in split_equal(tokens, 2, sequential=False)] == [(0, 1, 2)]
    assert [u.tokens for u in split_equal(tokens + toks((1, [1])), 2, sequential=False)
            ] == [(0, 1, 2), (3,)]
    # a sequence with two tokens is split as ever: its second token waits for a round
    two = toks((5, [3]), (0, [0]), (6, [3]))
    assert [u.tokens for u in split_equal(two, 3, sequential=False)] == [(0, 1), (2,)]


def test_s3_sequential_split_refuses_coupled_sequences():
    assert isinstance(split_equal(toks((0, [0, 1])), 8, sequential=True), str)


def test_s3_sequential_split_takes_consecutive_seq_ids():
    tokens = toks((0, [0]), (0, [2]), (0, [1]))
    ubs = split_equal(tokens, 8, sequential=True)
    assert [u.tokens for u in ubs] == [(0, 2), (1,)]


def test_llama_batch_allocr_split_equal_sequential_retries_every_token():
    """llama_batch_allocr::split_equal (src/llama-batch.cpp), sequential: every unused
    token is tried in batch order against the last collected seq id. Tokens seq 0, 2,
    1, 2: 0 is taken, 2 is passed over (not 0 + 1), 1 is taken, then the second token
    of seq 2 is (1 + 1): all three sequences in the first ubatch, each set starting
    at its first unused token (batch index 1 for seq 2). The first specification said
    a set is tried at its first unused token only; the real code wins (ENGINE.md §3,
    docs/ENGINE-NOTES.md)."""
    tokens = toks((0, [0]), (0, [2]), (0, [1]), (1, [2]))
    ubs = split_equal(tokens, 8, sequential=True)
    assert [u.tokens for u in ubs] == [(0, 2, 1), (3,)]
    assert ubs[0].n_seqs_unq == 3


def test_split_equal_sequential_chain_stops_at_a_missing_seq_id():
    """The walk never goes back: after seq 1 at index 3, no later token of seq 2."""
    tokens = toks((0, [0]), (0, [2]), (1, [0]), (0, [1]))
    ubs = split_equal(tokens, 8, sequential=True)
    assert ubs[0].tokens == (0, 3)


@pytest.mark.parametrize(("gone", "left"), [
    ([50, 40], [10, 20, 30]),  # the tail, named out of order
    ([20, 40], [10, 30, 50]),  # inside: rebuilt
    ([10, 20, 30, 40, 50], []),
    ([30, 40, 50], [10, 20]),
])
def test_sorted_keys_remove_keeps_the_rest_in_order(gone, left) -> None:
    """SortedKeys.remove, whether the keys removed are its tail or not: the keys left,
    ascending; then an add past the end still appends."""
    from kpool_cli.cache.cells import SortedKeys

    sk = SortedKeys()
    sk.add(np.array([30, 10, 50, 20, 40], dtype=np.int64))
    sk.remove(np.array(gone, dtype=np.int64))
    assert sk.view.tolist() == left
    sk.add(np.array([60], dtype=np.int64))
    assert sk.view.tolist() == [*left, 60]


def test_sorted_keys_push_appends_only_past_the_end() -> None:
    """SortedKeys.push, a decode's insert: a key after every key held is appended (past
    the first capacity of 16 too); one that sorts inside is refused and changes nothing."""
    from kpool_cli.cache.cells import SortedKeys

    sk = SortedKeys()
    assert sk.push(5)  # empty: any key is past the end
    assert not sk.push(3) and not sk.push(5)  # before, or equal to, the last
    assert sk.view.tolist() == [5]
    for key in range(6, 30):
        assert sk.push(key)
    assert sk.view.tolist() == list(range(5, 30))


def test_grow_array_append_is_extend_by_one() -> None:
    """GrowArray.append, the compiled layout's one pair of a decode step: each value
    lands after the live part, past the first capacity of 16 too, and a value a
    truncate dropped is overwritten, not kept."""
    from kpool_cli.cache.cells import GrowArray

    ga = GrowArray()
    for v in range(20):
        ga.append(v * 3)
    assert ga.view.tolist() == [v * 3 for v in range(20)] and ga.capacity >= 20
    ga.truncate(5)
    ga.append(-1)
    assert ga.view.tolist() == [0, 3, 6, 9, 12, -1]


@pytest.mark.parametrize(("unified", "sets", "want"), [
    (True, [(3,), (0, 5), (7,)], 0),  # one stream holds every sequence
    (False, [(2,), (2, 1)], 2),  # each set's first id: stream 2
    (False, [(2,), (1,)], None),  # two streams
])
def test_one_stream_is_the_stream_of_every_sets_first_id(unified, sets, want) -> None:
    """KvCache.one_stream, the compiled find_slot's one-stream test: the stream of each
    set's first seq id (its own sequence's when not unified), when they agree."""
    kv = KvCache(CacheConfig(kv_size=16, kpool=4, n_seq_max=8, unified=unified))
    assert kv.one_stream(sets) == want


def test_state_positions_of_parallel_slots_and_of_shared_sets() -> None:
    """replay.py `_state_positions`, what the recurrent child's find_slot records: each
    sequence set in the order of its first token, with its last token's pos. A step of
    parallel slots is each token's own set; sets met again keep their first place."""
    from kpool_cli.replay import _state_positions

    pos = np.array([5, 7, 9], dtype=np.int64)
    assert _state_positions(pos, [(2,), (0,), (1,)]) == [((2,), 5), ((0,), 7), ((1,), 9)]
    assert _state_positions(pos, [(2,), (0,), (2,)]) == [((2,), 9), ((0,), 7)]
    assert _state_positions(pos, [(0, 1), (1, 0), (3,)]) == [((0, 1), 7), ((3,), 9)]
    # one set (a decode of one sequence): its last token's pos
    assert _state_positions(pos, [(1, 0), (1, 0), (1, 0)]) == [((1, 0), 9)]
    assert _state_positions(pos[:1], [(4,)]) == [((4,), 5)]


@pytest.mark.parametrize("compiled", [False, True])
def test_a_stream_keeps_the_least_pair_each_sequence_changed(compiled: bool):
    """`Stream.changed_from`: of each sequence touched since the owner took `touched`,
    a key at or below every pair added or removed. Keys are pos << 32 | cell. Seq 0
    holds pos 0..5 at cells 0..5, taken; seq_rm(0, 3, 6) removes (3, 3) (4, 4) (5, 5):
    (3, 3); a write of pos 3 at cell 6 adds (3, 6), above it: (3, 3) stays; seq_cp to
    seq 1 of pos 0..2 adds (0, 0) to seq 1: 0; seq_add(0, 0, 2, +10) moves (0, 0) and
    (1, 1) of seqs 0 and 1 (cell 0 is shared): 0 for both; taking clears them, and the
    cache hands them on (`KvCache.changed_from`); a clear touches every holder: -1."""
    from kpool_cli.compiled.cache import CompiledKvCache

    cfg = CacheConfig(kv_size=16, kpool=4, n_seq_max=2)
    c = CompiledKvCache(cfg) if compiled else KvCache(cfg)
    st = c.streams[0]

    def write(seq: int, positions: list[int]) -> None:
        pos = np.array(positions, dtype=np.int64)
        seqs = [(seq,)] * pos.size
        (pl,) = c.plan([(pos, seqs, None)])
        c.apply(pl, pos, None, seqs)

    def key(pos: int, cell: int) -> int:
        return (pos << 32) | cell

    write(0, list(range(6)))
    assert c.take_touched() == {0} and c.changed_from == {0: key(0, 0)}
    c.seq_rm(0, 3, -1)
    assert st.changed_from == {0: key(3, 3)}
    write(0, [3])
    assert st.changed_from == {0: key(3, 3)}
    c.seq_cp(0, 1, 0, 3)
    assert st.changed_from == {0: key(3, 3), 1: key(0, 0)}
    assert c.take_touched() == {0, 1} and c.changed_from == {0: key(3, 3), 1: key(0, 0)}
    assert st.changed_from == {} and st.touched == set()
    c.seq_add(0, 0, 2, 10)
    assert st.changed_from == {0: key(0, 0), 1: key(0, 0)}
    c.take_touched()
    c.clear()
    assert st.changed_from == {0: -1, 1: -1}


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 12)), max_size=12),
       st.permutations(range(5)), st.lists(st.integers(0, 14), min_size=5, max_size=5),
       st.integers(1, 5), st.booleans(), st.booleans())
@settings(deadline=None)  # the first example may compile its kernels (a fresh cache)
def test_a_compiled_step_of_parallel_slots_writes_as_the_stream(
        before, order, step_pos, n_slots, with_ext, rows_are_ids):
    """`CompiledStream.write` of a step of parallel slots (one `kernels.write_slots`
    call: the cells, then each key pushed onto its sequence's row, the others
    inserted) against `Stream.write` on the same stream: earlier tokens of five
    sequences one at a time (a pos each may repeat: then skipped), then one token in
    each of n_slots of them, in a random order, at random positions (below a
    sequence's last pair too: inserted, not pushed), on the next empty cells; the
    same pos, ext, holders, counts, key ids, used, pairs, last positions
    (`seq_pos_maxes`) and `touched`, and a `changed_from` at or below the
    stream's. The arena starts one key wide (a step past it widens it), and its rows
    are the seq ids or not (a stream of another's sequences)."""
    from kpool_cli.compiled.cache import CompiledStream

    ids = list(range(5)) if rows_are_ids else [7, 3, 9, 4, 8]
    ref, got = Stream(48, ids), CompiledStream(48, ids)
    got.index.buf = np.empty((len(ids), 1), dtype=np.int64)  # one key a row, for now
    held: dict[int, set[int]] = {s: set() for s in ids}
    cell = 0

    def write(tokens: list[tuple[int, int]]) -> None:
        nonlocal cell
        cells = np.arange(cell, cell + len(tokens), dtype=np.int64)
        cell += len(tokens)
        pos = np.array([p for _, p in tokens], dtype=np.int64)
        ext = (np.array([[p, p + 1] for _, p in tokens], dtype=np.int64) if with_ext
               else None)
        for stream in (ref, got):
            stream.write(cells, pos, ext, [(s,) for s, _ in tokens],
                         np.arange(1, len(tokens) + 1, dtype=np.int64) + cell)

    for i, p in before:
        if p not in held[ids[i]]:
            held[ids[i]].add(p)
            write([(ids[i], p)])
    step = [(ids[i], step_pos[i]) for i in order[:n_slots] if step_pos[i] not in held[ids[i]]]
    if step:
        write(step)
    assert np.array_equal(got.pos, ref.pos) and np.array_equal(got.ext, ref.ext)
    assert np.array_equal(got.has, ref.has) and np.array_equal(got.seq_count, ref.seq_count)
    assert np.array_equal(got.key_id, ref.key_id) and got.used == ref.used
    for s in ids:
        assert got.seq_keys[s].view.tolist() == ref.seq_keys[s].view.tolist()
    for asked in (ids[:3], ids[::-1] + ids):  # a few read one by one, more in a kernel
        assert got.seq_pos_maxes(asked) == ref.seq_pos_maxes(asked)
    # `changed_from` is a key at or below each sequence's changed pairs: the step's
    # least key, for each of its sequences at once
    assert got.touched == ref.touched and got.changed_from.keys() == ref.changed_from.keys()
    assert all(got.changed_from[s] <= ref.changed_from[s] for s in ref.changed_from)
    got.check_invariants()
    if step:  # a cell that is not empty: refused, nothing written
        with pytest.raises(AssertionError, match="not empty"):
            got.write(np.array([0, 47]), np.array([40, 41]), None, [(ids[0],), (ids[1],)],
                      np.array([90, 91]))
        assert got.pos[47] == -1 and got.used == ref.used


@given(st.lists(st.tuples(st.integers(0, 30), st.sets(st.integers(0, 2), min_size=1)),
                min_size=0, max_size=40),
       st.integers(0, 2), st.integers(0, 34), st.integers(1, 36))
def test_a_compiled_seq_rm_is_the_streams_own(tokens, s, p0, width):
    """`CompiledStream.seq_rm` (one kernel pass) against `Stream.seq_rm` on the same
    random cells: tokens of up to three sequences each (a cell per token, its pos drawn
    with repeats across sequences, its set shared or not), then a seq_rm of s over
    [p0, p0 + width): the same cells made empty (ascending), and the same pos, ext,
    holders, counts, used, pairs, `touched` and `changed_from` after it."""
    from kpool_cli.compiled.cache import CompiledStream

    ref, got = Stream(64, [0, 1, 2]), CompiledStream(64, [0, 1, 2])
    placed: dict[int, set[int]] = {q: set() for q in range(3)}
    cells, pos, seqs = [], [], []
    for c, (p, ss) in enumerate(tokens):
        if any(p in placed[q] for q in ss):  # a sequence holds a pos once
            continue
        for q in ss:
            placed[q].add(p)
        cells.append(c)
        pos.append(p)
        seqs.append(tuple(sorted(ss)))
    for stream in (ref, got):
        if cells:
            stream.write(np.array(cells, dtype=np.int64), np.array(pos, dtype=np.int64),
                         None, seqs, np.arange(1, len(cells) + 1, dtype=np.int64))
        stream.touched, stream.changed_from = set(), {}
    want_freed = ref.seq_rm(s, p0, p0 + width)
    got_freed = got.seq_rm(s, p0, p0 + width)
    assert got_freed.tolist() == want_freed.tolist()
    assert np.array_equal(got.pos, ref.pos) and np.array_equal(got.ext, ref.ext)
    assert np.array_equal(got.has, ref.has) and np.array_equal(got.seq_count, ref.seq_count)
    assert got.used == ref.used
    for q in range(3):
        assert got.seq_keys[q].view.tolist() == ref.seq_keys[q].view.tolist()
    assert (got.touched, got.changed_from) == (ref.touched, ref.changed_from)
    got.check_invariants()


def test_one_set_and_one_seq_each_by_hand():
    """cache/batch.py: `one_set` is the seq ids every token holds when all hold the same
    (a decode of seq 3, or of seqs (0, 1) alike), else None (and for no token);
    `one_seq_each` the tokens' one seq id each when no two share one (parallel slots),
    else None."""
    assert one_set([(3,), (3,), (3,)]) == (3,) and one_set([(0, 1), (0, 1)]) == (0, 1)
    assert one_set([(3,), (4,)]) is None and one_set([(0, 1), (0,)]) is None
    assert one_set([]) is None  # no token: no set (an empty batch's split and validation)
    assert one_seq_each([(2,), (0,), (5,)]) == (2, 0, 5)
    assert one_seq_each([(2,), (2,)]) is None and one_seq_each([(2,), (0, 1)]) is None
    # `one_id_each`: the one seq id of each token, two maybe the same
    assert one_id_each([(2,), (2,), (0,)]) == (2, 2, 0)
    assert one_id_each([(2,), (0, 1)]) is None and one_id_each([(2,), ()]) is None


@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple), max_size=6))
def test_one_set_and_one_seq_each_of_seq_sets_are_their_definitions(sets) -> None:
    """cache/batch.py: `one_set`, `one_seq_each` and `one_id_each` of any sets, a list or
    a `SeqSets` (which keeps the answers once found: asked twice, the same), are what their
    docstrings define, set by set."""
    same = sets[0] if sets and all(ss == sets[0] for ss in sets) else None
    ids = [ss[0] for ss in sets]
    one_each = tuple(ids) if all(len(ss) == 1 for ss in sets) else None
    each = one_each if one_each is not None and len(set(ids)) == len(ids) else None
    held = SeqSets(sets)
    for form in (sets, held, held):
        assert one_set(form) == same and one_seq_each(form) == each
        assert one_id_each(form) == one_each
