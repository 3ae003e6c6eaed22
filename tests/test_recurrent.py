"""The hybrid memory's recurrent child (ENGINE.md §3 "The recurrent child"), rule by
rule, each test naming the llama.cpp function it follows
(src/llama-memory-recurrent.cpp, src/llama-memory-hybrid.cpp,
src/llama-memory-hybrid-idx.cpp, src/llama-batch.cpp). The numbers are derived by
hand in each docstring.
"""

from __future__ import annotations

import contextlib
import random

import pytest
from conftest import codes, drive, run, toks

from kpool_cli.cache.aborts import RecurrentAssert
from kpool_cli.cache.batch import split_equal
from kpool_cli.cache.recurrent import EditRefused, RecurrentChild
from kpool_cli.contracts.records import ABORTED, APPLIED, REJECTED, OpEvent, UbatchRecord


def child(n_seq_max: int = 4, n_rs_seq: int = 3) -> RecurrentChild:
    return RecurrentChild(n_seq_max, n_rs_seq)


def decoded(c: RecurrentChild, *sets: tuple[tuple[int, ...], int]) -> RecurrentChild:
    c.apply_ubatch(list(sets))
    return c


def state(c: RecurrentChild) -> list[tuple[int, list[int]]]:
    return [(cell.pos, sorted(cell.seqs)) for cell in c.cells]


# -- llama_memory_recurrent::seq_rm ---------------------------------------------------


def test_llama_memory_recurrent_seq_rm_accepts_a_rollback_within_n_rs_seq():
    """State at pos 9, n_rs_seq 3: seq_rm(0, 7, -1) is a rollback of 9 - (7 - 1) = 3
    tokens: accepted, pos 6, rs_idx 3 (pending), the cell keeps seq 0."""
    c = decoded(child(), ((0,), 9))
    c.seq_rm(0, 7, -1)
    assert c.seq_pos(0) == 6 and c.rs_idx[0] == 3 and c.tail[0] == 0
    assert state(c)[0] == (6, [0])


@pytest.mark.parametrize(("p0", "p1", "says"), [
    (6, -1, "removing 6..inf would cut it, and a rollback of 4 tokens needs n_rs_seq >= 4 "
            "(n_rs_seq is 3)"),
    (1, 12, "removing 1..12 would cut it, and a rollback of 9 tokens needs n_rs_seq >= 9 "
            "(n_rs_seq is 3)"),
])
def test_llama_memory_recurrent_seq_rm_refuses_a_deeper_cut(p0, p1, says):
    """State at pos 9, n_rs_seq 3: p0 6 is a rollback of 4 tokens, p0 1 (to 12) of 9:
    both cut into the state (0 < p0 <= 9 < p1) and are refused; nothing changes. The
    message names the state's pos, the range (half-open, "inf" for no end) and why."""
    c = decoded(child(), ((0,), 9))
    before = state(c), list(c.rs_idx), list(c.tail)
    with pytest.raises(EditRefused) as e:
        c.seq_rm(0, p0, p1)
    assert str(e.value) == f"the recurrent state of seq 0 is at pos 9: {says}"
    assert (state(c), list(c.rs_idx), list(c.tail)) == before


def test_llama_memory_recurrent_seq_rm_refuses_a_second_rollback_while_one_is_pending():
    """Pos 9: seq_rm(0, 9, -1) rolls back 1 token (pos 8, rs_idx 1). A second
    seq_rm(0, 8, -1), 1 token again, is refused: "pending rollback is single-use"."""
    c = decoded(child(), ((0,), 9))
    c.seq_rm(0, 9, -1)
    assert c.seq_pos(0) == 8 and c.rs_idx[0] == 1
    with pytest.raises(EditRefused) as e:
        c.seq_rm(0, 8, -1)
    assert str(e.value) == ("the recurrent state of seq 0 is at pos 8: removing 8..inf "
                            "would cut it, and a rollback is already pending (one per decode)")
    assert c.seq_pos(0) == 8 and c.rs_idx[0] == 1


def test_llama_memory_recurrent_seq_rm_with_n_rs_seq_0_refuses_every_tail_cut():
    """n_rs_seq 0 (no MTP): a rollback of even 1 token (1 <= 1 <= 0 fails) is refused."""
    c = decoded(child(n_rs_seq=0), ((0,), 5))
    with pytest.raises(EditRefused) as e:
        c.seq_rm(0, 5, -1)
    assert str(e.value).endswith("a rollback of 1 token needs n_rs_seq >= 1 (n_rs_seq is 0)")


@pytest.mark.parametrize(("p0", "p1", "pos", "tail"), [
    (-1, -1, None, -1),   # the whole sequence: p0 = 0, p1 = INT_MAX; cell emptied
    (0, 20, None, -1),    # p0 = 0 is not a cut (0 < p0 fails): the state goes
    (2, 5, 9, 0),       # ends before the last pos (a context shift): state kept
    (2, 9, 9, 0),       # ends at the last pos: [2, 9) does not hold pos 9
    (10, -1, 9, 0),     # starts after the last pos: nothing to cut
    (4, 4, 9, 0),       # an empty range
])
def test_llama_memory_recurrent_seq_rm_accepts_what_does_not_cut_the_state(p0, p1, pos, tail):
    """State at pos 9 (n_rs_seq 0): only `0 < p0 <= 9 < p1` cuts. The rest is accepted:
    a range holding pos 9 drops the tail and empties the cell (pos -1), one that does
    not leaves the state alone."""
    c = decoded(child(n_rs_seq=0), ((0,), 9))
    c.seq_rm(0, p0, p1)
    assert c.seq_pos(0) == pos and c.tail[0] == tail


def test_llama_memory_recurrent_seq_rm_bounds():
    """p1 0 is a bound (only p1 < 0 means none): seq_rm(0, 5, 0) on pos 9 removes
    [5, 0), nothing, and is accepted. A state at pos 0 removed by seq_rm(0, 0, 5):
    p0 0 is not a cut (0 < p0 fails), p0 <= 0 < 5: the tail goes and the cell
    empties."""
    c = decoded(child(n_rs_seq=0), ((0,), 9))
    c.seq_rm(0, 5, 0)
    assert c.seq_pos(0) == 9
    c = decoded(child(n_rs_seq=0), ((0,), 0))
    c.seq_rm(0, 0, 5)
    assert c.tail[0] == -1 and c.seq_pos(0) is None and c.used == 0


def test_llama_memory_recurrent_seq_pos_of_no_state():
    """A sequence without a state: seq_pos_min and seq_pos_max are -1 (the functions'
    "none"), also for a seq id outside the child (-1), even when the last sequence
    has a state."""
    c = decoded(child(), ((3,), 7))
    for s in (0, -1, 4):
        assert c.seq_pos(s) is None
        assert (c.seq_pos_min(s), c.seq_pos_max(s)) == (-1, -1)


def test_llama_memory_recurrent_used_counts_the_cells_holding_a_sequence():
    """`used` (which find_slot's head rule reads): seqs 0, 1, 2 at pos 0 in cells 0,
    1, 2: 3. seq_cp(0, 1): seq 1 leaves cell 1 (empty: 2) and joins cell 0.
    seq_keep(2): cell 0 (pos 0, seqs 0 and 1) empties: 1. seq_keep(3), a sequence
    without a state: every cell empties: 0, and no tail is left."""
    c = decoded(child(), ((0,), 0), ((1,), 0), ((2,), 0))
    assert c.used == 3
    c.seq_cp(0, 1)
    assert c.used == 2 and c.tail[1] == 0
    c.seq_keep(2)
    assert c.used == 1 and c.tail == [-1, -1, 2, -1]
    c.seq_keep(3)
    assert c.used == 0 and c.tail == [-1] * 4 and c.head == 0


def test_llama_memory_recurrent_seq_cp_from_a_sequence_without_state():
    """seq_cp(2, 0) when seq 2 has no state: seq 0 leaves its cell (now empty, used
    0) and has no state either."""
    c = decoded(child(), ((0,), 4))
    c.seq_cp(2, 0)
    assert c.tail[0] == -1 and c.seq_pos(0) is None and c.used == 0


def test_llama_memory_recurrent_seq_rm_refuses_a_seq_id_at_or_above_n_seq_max():
    """`seq_id >= 0 && (uint32_t) seq_id >= n_seq_max`: 4 with n_seq_max 4 is refused,
    even for the whole range, and nothing changes."""
    c = decoded(child(), ((0,), 3))
    with pytest.raises(EditRefused, match="seq_id 4"):
        c.seq_rm(4, -1, -1)
    assert c.seq_pos(0) == 3


def test_llama_memory_recurrent_seq_rm_of_seq_minus_one_matches_every_sequence():
    """angt/llama.cpp d5437c2, llama_memory_recurrent::seq_rm: "seq_id < 0 : match any
    sequence". Seqs 0 and 1 in one ubatch: cell 0 holds 0 at pos 3, cell 1 holds 1 at
    pos 5. seq_rm(0, 3, -1) rolls seq 0 back 3 - (3 - 1) = 1 token (rs_idx[0] 1, pos
    2). seq_rm(-1, -1, -1), the whole range: set_rs_idx(-1, 0) zeroes every rs_idx;
    both cells (pos 2 and 5, in [0, inf)) are emptied, used 2 -> 0; the tails are left
    at 0 and 1, pointing at cells that no longer hold their sequences."""
    c = decoded(child(), ((0,), 3), ((1,), 5))
    c.seq_rm(0, 3, -1)
    assert c.rs_idx[0] == 1 and c.seq_pos(0) == 2
    # seq_pos_maxes (batch validation's, for a step of parallel slots) in any order
    assert c.seq_pos_maxes([1, 0, 2, 7]) == [5, 2, -1, -1]
    c.seq_rm(-1, -1, -1)
    assert state(c) == [(-1, [])] * 4 and c.rs_idx == [0, 0, 0, 0] and c.used == 0
    assert c.tail == [0, 1, -1, -1] and c.seq_pos(0) is None and c.seq_pos_max(1) == -1
    assert c.seq_pos_maxes([0, 1]) == [-1, -1]  # the tails dangle: no state
    # a tail on a cell that holds another sequence's state (pos 4) is no state either:
    # seq_pos_max scans the cells holding the sequence (seq 2 takes cell 0, the first
    # empty one, which seq 0's tail still names)
    decoded(c, ((2,), 4))
    assert c.tail[:3] == [0, 1, 0]
    assert (c.seq_pos_max(0), c.seq_pos_maxes([0, 2])) == (-1, [-1, 4])


def test_llama_memory_recurrent_seq_rm_of_seq_minus_one_needs_all_or_nothing():
    """"seq_id is negative, then the range should include everything or nothing":
    seq_rm(-1, 2, -1) is refused (nothing changes); seq_rm(-1, 5, 5) (p0 == p1) is
    accepted and removes nothing."""
    c = decoded(child(), ((0,), 3))
    with pytest.raises(EditRefused) as e:
        c.seq_rm(-1, 2, -1)
    assert str(e.value) == ("llama_memory_recurrent::seq_rm refuses seq_id -1 over 2..inf: "
                            "for every sequence the range must hold every position or none "
                            "(a state cannot be cut)")
    c.seq_rm(-1, 5, 5)
    assert c.seq_pos(0) == 3 and c.tail[0] == 0


def test_llama_memory_recurrent_seq_rm_of_seq_minus_one_refused_by_the_unsigned_test():
    """ggml-org/llama.cpp 0054ee8 tests `(uint32_t) seq_id >= n_seq_max` first: -1 is
    2^32 - 1, refused even for the whole range (the version's
    recurrent_seq_rm_matches_any = False)."""
    c = RecurrentChild(4, 3, negative_seq_rm_matches_any=False)
    decoded(c, ((0,), 3))
    with pytest.raises(EditRefused, match="seq_id -1"):
        c.seq_rm(-1, -1, -1)
    assert c.seq_pos(0) == 3


def test_llama_memory_recurrent_find_slot_asserts_on_a_dangling_tail():
    """After seq_rm(-1, -1, -1), seq 0's tail is cell 0, which holds nothing:
    find_slot's `GGML_ASSERT(cell.has_seq_id(seq_id))` for seq 0 as a set's first id.
    prepare (on a copy, before the attention cache's) fails the same way; coupled
    after the first id, seq 0 leaves its cell instead (tail -1), so a set (2, 0) passes;
    seq 2, which never had a state, passes alone."""
    c = decoded(child(), ((0,), 3))
    c.seq_rm(-1, -1, -1)
    with pytest.raises(RecurrentAssert, match="seq 0's tail is state cell 0"):
        c.prepare([[(2,)], [(0,)]])
    c.prepare([[(2, 0)], [(0,)]])
    c.prepare([[(2,)]])
    with pytest.raises(RecurrentAssert):
        c.find_slot([((0,), 4)])


def test_llama_memory_recurrent_seq_cp_lets_a_sequence_leave_its_dangling_tail():
    """seq_cp(2, 0): dst 0 leaves its tail cell 0 (tail -1; used 0 - 1, as the code
    decrements it for an emptied cell, in its uint32_t: 2^32 - 1), and seq 2 has no
    state to share: find_slot of seq 0 then takes a fresh cell."""
    c = decoded(child(), ((0,), 3))
    c.seq_rm(-1, -1, -1)
    c.seq_cp(2, 0)
    assert c.tail[0] == -1 and c.used == (1 << 32) - 1
    decoded(c, ((0,), 0))
    assert c.seq_pos(0) == 0 and c.used == 1


def test_llama_memory_recurrent_seq_rm_of_the_whole_sequence_clears_a_pending_rollback():
    """`rm_all` (p0 0, p1 INT_MAX) sets rs_idx to 0 before anything else."""
    c = decoded(child(), ((0,), 9))
    c.seq_rm(0, 8, -1)
    assert c.rs_idx[0] == 2
    c.seq_rm(0, -1, -1)
    assert c.rs_idx[0] == 0 and c.seq_pos(0) is None


def test_llama_memory_recurrent_seq_rm_head_moves_to_the_first_freed_cell():
    """Seqs 0, 1, 2 own cells 0, 1, 2 (one ubatch, cells from head 0); head is then 0
    (find_slot: head = min). Moving head on: decode seq 3 alone: its cell is 3, head 3.
    Removing seq 1 frees cell 1: head = min(3, 1) = 1."""
    c = decoded(child(), ((0,), 0), ((1,), 0), ((2,), 0))
    decoded(c, ((3,), 0))
    assert c.head == 3
    c.seq_rm(1, -1, -1)
    assert c.head == 1 and state(c)[1] == (-1, [])


# -- seq_cp, seq_keep, seq_add, seq_div, clear ------------------------------------------


def test_llama_memory_recurrent_seq_cp_shares_the_tail_and_ignores_the_range():
    """seq_cp(0, 1, 2, 5): the range is ignored; seq 1 joins seq 0's cell (pos 9).
    Seq 1's own old cell (pos 4) is left empty. Pending rollbacks are untouched."""
    c = decoded(child(), ((0,), 9), ((1,), 4))
    c.seq_rm(0, 9, -1)  # pending for seq 0
    c.seq_cp(0, 1)
    assert c.tail[1] == c.tail[0] == 0 and state(c)[:2] == [(8, [0, 1]), (-1, [])]
    assert c.rs_idx == [1, 0, 0, 0]


def test_llama_memory_recurrent_seq_keep_empties_every_other_cell():
    """seq_keep(1): cell 0 (seq 0) empties, cell 1 (seqs 1, 2 after a seq_cp) keeps
    only seq 1; every tail but seq 1's is -1."""
    c = decoded(child(), ((0,), 3), ((1,), 5))
    c.seq_cp(1, 2)
    c.seq_keep(1)
    assert state(c)[:2] == [(-1, []), (5, [1])]
    assert c.tail == [-1, 1, -1, -1]


@pytest.mark.parametrize(("p0", "p1", "shift", "pos"), [
    (4, -1, -4, 5), (0, 9, -4, 9), (10, -1, 2, 9), (9, 10, 0, 9), (9, 9, 5, 9),
    (0, 0, 5, 9), (4, -1, 1, 10)])
def test_llama_memory_recurrent_seq_add_moves_the_state_pos_in_range(p0, p1, shift, pos):
    """State pos 9: [4, inf) holds it: 9 - 4 = 5 (and + 1 = 10); [0, 9) does not;
    [10, inf) not;
    shift 0 and an empty range ([9, 9), and [0, 0): p1 0 is a bound, not "no bound")
    return early. A seq id past the child's size changes nothing."""
    c = decoded(child(), ((0,), 9))
    c.seq_add(0, p0, p1, shift)
    c.seq_add(4, 0, -1, shift)
    assert c.seq_pos(0) == pos


def test_llama_memory_recurrent_seq_add_wraps_the_state_pos_past_int32():
    """`cell.pos += shift` in llama_pos (int32_t), ENGINE.md §2 (positions are
    int32): state pos 9, seq_add(0, 0, -1, INT32_MAX) gives 9 + 2^31 - 1 = 2^31 + 8,
    past INT32_MAX: -2^31 + 8. The cell keeps seq 0 (a negative pos does not free a
    recurrent cell)."""
    c = decoded(child(), ((0,), 9))
    c.seq_add(0, 0, -1, (1 << 31) - 1)
    assert state(c)[0] == (-(1 << 31) + 8, [0]) and c.tail[0] == 0


def test_llama_memory_recurrent_seq_div_divides_the_state_pos_in_range():
    """State pos 9, seq_div(0, 0, -1, 2): 9 / 2 = 4; d 1 returns early."""
    c = decoded(child(), ((0,), 9))
    c.seq_div(0, 0, -1, 1)
    assert c.seq_pos(0) == 9
    c.seq_div(0, 0, -1, 2)
    assert c.seq_pos(0) == 4


def test_llama_memory_recurrent_clear_forgets_every_state_and_rollback_not_the_saved():
    """clear: every cell empty, head 0, rs_idx all 0; a state saved by state_write (it
    lives outside the memory) can still be restored."""
    c = decoded(child(), ((0,), 9))
    c.state_write(0, "a")
    c.seq_rm(0, 9, -1)
    c.clear()
    assert c.seq_pos(0) is None and c.rs_idx == [0] * 4 and c.head == 0
    c.state_read(2, "a")
    assert c.seq_pos(2) == 9  # saved before the rollback


# -- state_write / state_read / state_drop -----------------------------------------------


def test_llama_memory_recurrent_state_read_restores_the_pos_and_clears_the_rollback():
    """state_write(0) saves pos 9; state_read(1): seq_rm(1, -1, -1), find_slot of one
    cell at pos 9 for seq 1, rs_idx[1] = 0 (it had a pending rollback)."""
    c = decoded(child(), ((0,), 9), ((1,), 6))
    c.state_write(0, "a")
    c.seq_rm(1, 6, -1)
    assert c.rs_idx[1] == 1
    c.state_read(1, "a")
    assert c.seq_pos(1) == 9 and c.rs_idx[1] == 0 and c.tail[1] != c.tail[0]


def test_llama_memory_recurrent_state_read_meta_of_an_empty_state_drops_the_sequence():
    """An empty saved state (seq 3 had none): state_read_meta calls seq_rm(dest, -1,
    -1) before it looks at the cell count, so seq 1 is left without a state."""
    c = decoded(child(), ((1,), 6))
    c.state_write(3, "empty")
    c.state_read(1, "empty")
    assert c.seq_pos(1) is None


def test_llama_memory_recurrent_state_read_restores_a_negative_pos():
    """seq_add can move a state below pos 0 (seq_add(0, 0, -1, -2) on pos 0: -2). A
    state written then is one cell (state_write_meta writes its pos as it is), and
    state_read restores it: seq 1's state is at -2. llama_memory_recurrent::
    seq_pos_min is then -2 and seq_pos_max max(-1, -2) = -1."""
    c = decoded(child(), ((0,), 0))
    c.seq_add(0, 0, -1, -2)
    c.state_write(0, "s")
    c.state_read(1, "s")
    assert c.seq_pos(1) == -2 and c.tail[1] >= 0
    assert (c.seq_pos_min(1), c.seq_pos_max(1)) == (-2, -1)
    assert c.seq_pos_maxes([1]) == [-1]


def test_llama_memory_hybrid_idx_state_drop_ignores_the_refusal():
    """state_drop calls the child's seq_rm(s, -1, -1) directly: a whole-sequence
    removal, always accepted for 0 <= s < n_seq_max."""
    c = decoded(child(), ((1,), 6))
    c.state_drop(1)
    assert c.seq_pos(1) is None


# -- find_slot and s_copy ----------------------------------------------------------------


def test_llama_memory_recurrent_find_slot_gives_each_first_seq_id_a_cell_of_its_own():
    """Seq 0 at pos 3 in cell 0; seq_cp(0, 1) shares it. A ubatch of seq 1 (pos 4):
    cell 0 holds 2 seqs, so seq 1 moves to the next empty cell from head 0, cell 1,
    taking pos 3 along, then pos 4. Seq 0 keeps cell 0 at pos 3."""
    c = decoded(child(), ((0,), 3))
    c.seq_cp(0, 1)
    decoded(c, ((1,), 4))
    assert state(c)[:2] == [(3, [0]), (4, [1])]
    assert c.tail[:2] == [0, 1]


def test_llama_memory_recurrent_find_slot_detaches_coupled_ids_and_shares_one_cell():
    """A token of seqs (2, 0): id 0 (not first) leaves its cell 0 (pos 3, emptied);
    seq 2 has none: the next empty cell from head 0 is cell 0 again. Both share it at
    the set's last pos 4."""
    c = decoded(child(), ((0,), 3))
    decoded(c, ((2, 0), 4))
    assert state(c)[0] == (4, [0, 2]) and c.tail[0] == c.tail[2] == 0


def test_llama_memory_recurrent_find_slot_swaps_cells_into_set_order():
    """Seq 1 in cell 0, seq 0 in cell 1 (decoded in that order). A ubatch of sets
    (0, 1): min = 0, so set 0 (seq 0) must be in cell 0: the cells swap; then the
    positions are the sets' last ones."""
    c = decoded(child(), ((1,), 5))
    decoded(c, ((0,), 2))
    assert c.tail[:2] == [1, 0]
    decoded(c, ((0,), 3), ((1,), 6))
    assert c.tail[:2] == [0, 1] and state(c)[:2] == [(3, [0]), (6, [1])]


def test_llama_memory_recurrent_find_slot_of_sets_already_in_place():
    """A step of parallel slots: seqs 2, 0, 1 each alone in cells 0, 1, 2 (decoded in
    that order, each moving to the next empty cell), then a ubatch of those sets in
    that order: nothing moves, each cell takes its set's last pos, head = 0 and n = 3.
    The same sets in another order (0, 1, 2) are not in place: min = 0, and the cells
    are swapped into set order (seq 0 to cell 0, seq 1 to 1, seq 2 to 2)."""
    c = decoded(child(), ((2,), 4))
    decoded(c, ((0,), 7))
    decoded(c, ((1,), 9))
    assert c.tail[:3] == [1, 2, 0]
    decoded(c, ((2,), 5), ((0,), 8), ((1,), 10))
    assert c.tail[:3] == [1, 2, 0] and (c.head, c.n, c.used) == (0, 3, 3)
    assert state(c)[:3] == [(5, [2]), (8, [0]), (10, [1])]
    decoded(c, ((0,), 9), ((1,), 11), ((2,), 6))
    assert c.tail[:3] == [0, 1, 2] and (c.head, c.n) == (0, 3)
    assert state(c)[:3] == [(9, [0]), (11, [1]), (6, [2])]


@pytest.mark.parametrize(("n_cp", "cell"), [(3, 6), (4, 0)])
def test_llama_memory_recurrent_find_slot_restarts_from_0_when_head_is_far(n_cp, cell):
    """n_seq_max 8. Seqs 0..5 decode one ubatch each: cells 0..5, head 5 (find_slot:
    head = min of the ubatch's cells), used 6. seq_cp(5, d) for d = 0, 1, 2 (, 3)
    empties d's cell (used 3, or 2; seq_cp leaves head alone). A ubatch of seq 6:
    `head > used + 2 * n_seqs` is 5 > 5, false: the scan starts at head 5 (cell 5
    is full) and takes cell 6; with used 2, 5 > 4: it starts at 0 and takes cell 0."""
    c = child(n_seq_max=8)
    for s in range(6):
        decoded(c, ((s,), 0))
    assert (c.head, c.used) == (5, 6)
    for d in range(n_cp):
        c.seq_cp(5, d)
    assert c.used == 6 - n_cp
    decoded(c, ((6,), 0))
    assert c.tail[6] == cell


def test_llama_memory_recurrent_find_slot_reads_used_as_uint32():
    """`used` and `head` are uint32_t (ENGINE.md §3 "The recurrent child"). Seqs 0, 1,
    2 decode one ubatch each: cells 0, 1, 2, head 2 (the last ubatch's cell), used 3.
    seq_cp(2, 0) and seq_cp(2, 1): seqs 0 and 1 leave cells 0 and 1 (used 1) and
    share cell 2. seq_rm(-1, -1, -1) empties cell 2 (used 0; head stays 2, its first
    freed cell) and leaves the tails of 0, 1 and 2 on it. seq_cp(3, d) for d = 0, 1,
    2: each d leaves the empty cell 2, for which the code decrements used each time:
    0 - 3 = 2^32 - 3. A ubatch of seq 3 (one set): `head > used + 2*n_seqs` is
    2 > 2^32 - 1, false, so the scan starts at head 2 and seq 3's state takes cell 2
    (a signed count, -3 + 2 = -1, would restart at 0 and give it cell 0)."""
    c = child()
    for s in range(3):
        decoded(c, ((s,), 0))
    assert (c.head, c.used) == (2, 3)
    c.seq_cp(2, 0)
    c.seq_cp(2, 1)
    assert c.used == 1 and c.tail[:3] == [2, 2, 2]
    c.seq_rm(-1, -1, -1)
    assert (c.head, c.used) == (2, 0)
    for d in range(3):
        c.seq_cp(3, d)
    assert c.used == (1 << 32) - 3
    decoded(c, ((3,), 3))
    assert c.tail[3] == 2 and (c.head, c.used) == (2, 1)


def test_llama_memory_recurrent_find_slot_gives_fresh_sets_the_next_empty_cells():
    """Four sequences without a state in one ubatch: cells 0, 1, 2, 3 from head 0,
    one each (the scan goes on after each), so head 0 and n 4."""
    c = decoded(child(n_seq_max=6), ((0,), 0), ((1,), 0), ((2,), 0), ((3,), 0))
    assert (c.head, c.n) == (0, 4) and c.tail[:4] == [0, 1, 2, 3]


def test_llama_memory_recurrent_find_slot_swaps_an_outside_sequence_away():
    """Seqs 0, 1, 2 in cells 0, 1, 2; a ubatch of sets (0,), (2,): min 0, so set 1
    (seq 2) must sit in cell 1: cells 1 and 2 swap and seq 1, not in the ubatch,
    follows its cell to 2. n = max - min + 1 = 3. Seq 3 (no state) keeps no tail."""
    c = decoded(child(), ((0,), 0), ((1,), 0), ((2,), 0))
    decoded(c, ((0,), 1), ((2,), 1))
    assert c.tail == [0, 2, 1, -1] and (c.head, c.n) == (0, 3)
    assert state(c)[:3] == [(1, [0]), (1, [2]), (0, [1])]


def test_llama_memory_recurrent_find_slot_head_rule_counts_every_set():
    """n_seq_max 8, seqs 0..5 in cells 0..5 (head 5), seq_cp(5, d) for d = 0..3:
    used 2. A ubatch of two new sets (6,), (7,): head 5 > used 2 + 2 * 2 = 6 is
    false, so the scan starts at 5: cells 6 and 7 (head 6)."""
    c = child(n_seq_max=8)
    for s in range(6):
        decoded(c, ((s,), 0))
    for d in range(4):
        c.seq_cp(5, d)
    decoded(c, ((6,), 0), ((7,), 0))
    assert c.tail[6:] == [6, 7] and c.head == 6


def test_llama_memory_recurrent_seq_keep_lowers_head_for_the_next_ubatch():
    """Seqs 0, 1, 2 in cells 0..2, then seq 3 in cell 3 (head 3). seq_keep(3) empties
    cells 0..2: head = min(3, 0) = 0, and seq 4's ubatch scans from 0: cell 0."""
    c = decoded(child(n_seq_max=5), ((0,), 0), ((1,), 0), ((2,), 0))
    decoded(c, ((3,), 0))
    assert c.head == 3
    c.seq_keep(3)
    assert c.head == 0
    decoded(c, ((4,), 0))
    assert c.tail[4] == 0


def test_llama_memory_recurrent_find_slot_range_is_the_ubatchs_cells():
    """Seq 0 in cell 0, seq 1 in cell 1 (one ubatch each); seq 1 rolls back (pending).
    A ubatch of seq 0 alone: min = max = cell 0, n = 1, so s_copy reads cell 0 only:
    seq 1 keeps its rollback."""
    c = decoded(child(), ((0,), 5))
    decoded(c, ((1,), 5))
    c.seq_rm(1, 5, -1)
    decoded(c, ((0,), 6))
    assert (c.head, c.n) == (0, 1) and c.rs_idx[1] == 1


def test_llama_memory_recurrent_context_s_copy_consumes_every_rollback_in_its_range():
    """Cells 0, 1, 2 hold seqs 0, 1, 2 (one ubatch); each rolls back (pending 1, 1, 2).
    A ubatch of seqs 0 and 2 finds their cells 0 and 2: min 0, max 2, n = 3 (seq 2 is
    then swapped into cell 1, seq 1 into cell 2). s_copy reads every cell of [0, 3)
    and resets the rollback of each one's smallest seq id: seq 1, not in the ubatch,
    loses its rollback too."""
    c = decoded(child(), ((0,), 5), ((1,), 5), ((2,), 5))
    c.seq_rm(0, 5, -1)
    c.seq_rm(1, 5, -1)
    c.seq_rm(2, 4, -1)
    assert c.rs_idx[:3] == [1, 1, 2]
    decoded(c, ((0,), 5), ((2,), 4))
    assert (c.head, c.n) == (0, 3) and c.tail[:3] == [0, 2, 1]
    assert c.rs_idx[:3] == [0, 0, 0]


def test_llama_memory_recurrent_context_s_copy_spares_a_larger_id_sharing_the_cell():
    """Seq 3 (cell 1) rolls back 1 token (pending); seq_cp(0, 3) moves it into seq 0's
    cell 0 (seq_cp leaves rs_idx alone); seq 0 rolls back too: pending for both. A
    ubatch of seq 1 alone takes cell 1, so [head, head + n) = [1, 2): neither is
    consumed. A ubatch of the coupled set (0, 3) uses cell 0, whose smallest seq id
    is 0: only seq 0's rollback is consumed; seq 3 keeps its own."""
    c = decoded(child(), ((0,), 5), ((3,), 5))
    c.seq_rm(3, 5, -1)
    c.seq_cp(0, 3)
    c.seq_rm(0, 5, -1)
    assert c.rs_idx == [1, 0, 0, 1]
    decoded(c, ((1,), 0))
    assert (c.head, c.n) == (1, 1) and c.rs_idx == [1, 0, 0, 1]
    decoded(c, ((0, 3), 5))
    assert c.rs_idx == [0, 0, 0, 1]


# -- in the replay: llama_memory_hybrid_idx -----------------------------------------------

SPEC = """
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_rs_seq: %d}
ops:
  - decode: {seq: 0, pos: 0..10}
  - seq_rm: {seq: 0, p0: 8, p1: -1}
  - decode: {seq: 0, pos: 8..10}
"""


def test_llama_memory_hybrid_idx_seq_rm_asks_the_recurrent_child_first():
    """n_rs_seq 2: seq_rm(0, 8, -1) on pos 0..9 is a rollback of 2: accepted, the
    attention cells 8, 9 freed (head 8), stale 8; the decode of 8, 9 goes to cells 8,
    9. n_rs_seq 1: refused: KP008, the event is rejected, stales nothing, and the
    cells stay, so the decode at pos 8 is refused too (X = 9, KP006)."""
    ok = run(SPEC % 2)
    ev = ok[1]
    assert isinstance(ev, OpEvent) and ev.status == APPLIED and ev.stale == {0: 8}
    assert ok[2].token_rows.tolist() == [8, 9]
    no = run(SPEC % 1)
    ev = no[1]
    assert ev.status == REJECTED and ev.stale == {} and codes(ev) == {"KP008"}
    assert "n_rs_seq >= 2 (n_rs_seq is 1)" in ev.message
    assert no[2].status == REJECTED and codes(no[2]) == {"KP006"}


def test_a_refused_seq_rm_changes_nothing_in_any_cache():
    """After the refusal the attention cells, the layout, the staleness and the
    recurrent state are what they were after the prefill."""
    seen = []
    for rec, rp in drive(SPEC % 0):
        if isinstance(rec, OpEvent | UbatchRecord) and rec.op < 2:
            seen.append((rp.cache.streams[0].pos.tolist(), list(rp.staleness.stale),
                         rp.layout.seqs[0].pools.view.tolist(), rp.recurrent.seq_pos(0),
                         list(rp.recurrent.rs_idx)))
    assert seen[0] == seen[1]


def test_llama_memory_hybrid_seq_pos_max_is_the_recurrent_states_last_pos():
    """A decode of positions [1, 0]: the attention cache's max is 1, the recurrent
    state's pos is that of the last token, 0. The hybrid memory's seq_pos_max is
    min(1, 0) = 0, so llama_batch_allocr::init wants Y = 1: pos 2 is refused, pos 1
    accepted."""
    base = "kpool_trace: 1\ncache: {kv_size: 8, kpool: 2}\nops:\n" \
           "  - decode: {seq: 0, pos: [1, 0]}\n  - decode: {seq: 0, pos: %d}\n"
    r2 = run(base % 2)[1]
    assert r2.status == REJECTED and "X = 0" in r2.message
    assert isinstance(run(base % 1)[1], UbatchRecord)


def test_llama_memory_hybrid_seq_pos_min_lets_coupled_states_at_one_pos_pass():
    """Seq 0 holds pos 0..3, seq 1 pos 1..3; both states are at pos 3. The coupled
    check compares seq_pos_min = max(attention min, 3) = 3 for both, and seq_pos_max 3
    for both: a token of seqs (0, 1) at pos 4 is accepted (the attention cache alone
    would say 0..3 vs 1..3, diverged)."""
    recs = run("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - decode: {seq: 1, pos: 1..4}
  - decode: {seq: [0, 1], pos: 4}
""")
    assert isinstance(recs[2], UbatchRecord)


def test_an_empty_restore_leaves_the_sequence_free_to_start_anywhere():
    """state_write of an empty seq 1, then state_read into seq 0 (pos 0..3): the
    attention cache keeps seq 0's cells (an empty snapshot leaves it untouched), but
    the recurrent child's state_read_meta removed its state, so seq_pos_max(0) =
    min(3, -1) = -1 and a decode of seq 0 at pos 10 is accepted."""
    recs = run("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - state_write: {seq: 1, slot: e}
  - state_read: {seq: 0, slot: e}
  - decode: {seq: 0, pos: 10}
""")
    assert recs[2].status == APPLIED and isinstance(recs[3], UbatchRecord)


def test_split_equal_asserts_n_ubatch_above_n_keep_tail():
    """llama_batch_allocr::split_equal: GGML_ASSERT(n_ubatch > n_keep_tail). n_rs_seq
    3 gives n_keep_tail 4; n_ubatch 4 is not above it: the engine aborts (KP005) at
    the first decode that is split, and the replay stops."""
    recs = run("kpool_trace: 1\ncache: {kv_size: 16, kpool: 2, n_ubatch: 4, n_rs_seq: 3}\n"
               "ops:\n  - decode: {seq: 0, pos: 0..2}\n  - decode: {seq: 0, pos: 2}\n")
    assert len(recs) == 1 and recs[0].status == ABORTED and codes(recs[0]) == {"KP005"}
    assert "n_ubatch > n_keep_tail" in recs[0].message


def test_split_equal_refuses_a_coupled_sequential_batch_before_its_n_keep_tail_assert():
    """llama_batch_allocr::split_equal returns "sequential split is not supported when
    there are coupled sequences" before it reaches GGML_ASSERT(n_ubatch > n_keep_tail):
    on a non-unified cache with n_ubatch 2 and n_rs_seq 1 (n_keep_tail 2), a token of
    seqs (0, 1) is refused (KP006), not an abort."""
    recs = run("kpool_trace: 1\ncache: {kv_size: 8, kpool: 2, n_seq_max: 2, unified: false,"
               " n_ubatch: 2, n_rs_seq: 1}\nops:\n  - decode: {seq: [0, 1], pos: 0}\n")
    assert [(r.status, codes(r)) for r in recs] == [(REJECTED, {"KP006"})]


# -- llama_batch_allocr::split_equal's n_keep_tail step -----------------------------------


def sizes(tokens, n_ubatch, n_keep_tail, sequential=False):
    ubs = split_equal(tokens, n_ubatch, sequential, n_keep_tail=n_keep_tail)
    return [[tokens[i].pos for i in ub.tokens] for ub in ubs]


def test_split_equal_n_keep_tail_gives_tokens_back_until_the_tail_remains():
    """One sequence of 10 tokens, n_ubatch 8, n_keep_tail 4: the lock-step takes 8,
    2 remain (< 4): no set may be kept, the first is cut: 8 + 2 > 8, so tokens go
    back until 4 remain: 6, then 4. Without the step: 8, then 2."""
    t = toks(*[(p, [0]) for p in range(10)])
    assert sizes(t, 8, 4) == [list(range(6)), list(range(6, 10))]
    assert sizes(t, 8, 0) == [list(range(8)), [8, 9]]


def test_split_equal_n_keep_tail_finishes_the_first_set_when_it_fits():
    """Seqs 0 and 1, 10 tokens each, n_ubatch 8, n_keep_tail 4. Ubatch 0: 4 of each,
    6 remain each (>= 4): both kept. Ubatch 1: 4 of each, 2 remain each: seq 0 is the
    first offender, n_keep 0; 4 + 2 <= 8: seq 0 takes its last 2 (6 tokens), seq 1's
    4 go back. Ubatch 2: seq 1's last 6."""
    t = toks(*[(p, [s]) for p in range(10) for s in (0, 1)])
    ubs = split_equal(t, 8, False, n_keep_tail=4)
    got = [[(t[i].seq[0], t[i].pos) for i in ub.tokens] for ub in ubs]
    assert got == [[(0, p) for p in range(4)] + [(1, p) for p in range(4)],
                   [(0, p) for p in range(4, 10)],
                   [(1, p) for p in range(4, 10)]]


def test_split_equal_n_keep_tail_keeps_the_leading_sets_and_defers_the_rest():
    """Seq 0 has 9 tokens, seq 1 has 5, seq 2 has 9; n_ubatch 9, n_keep_tail 3. The
    lock-step takes 3 of each (9); remaining 6, 2, 6: seq 0 is kept, seq 1 (2 < 3) is
    the first offender: it and seq 2 give theirs back. Ubatch 0: seq 0's 0..2."""
    t = toks(*[(p, [0]) for p in range(9)], *[(p, [1]) for p in range(5)],
             *[(p, [2]) for p in range(9)])
    ub0 = split_equal(t, 9, False, n_keep_tail=3)[0]
    assert [(t[i].seq[0], t[i].pos) for i in ub0.tokens] == [(0, 0), (0, 1), (0, 2)]


def test_split_equal_n_keep_tail_keeps_a_set_whose_remainder_is_exactly_the_tail():
    """Seqs 0 and 1, 8 tokens each, n_ubatch 8, n_keep_tail 4: the lock-step takes 4
    of each, 4 remain of each: 4 >= 4, so both are kept (the rule gives back only a
    set with 0 < remaining < n_keep_tail). Ubatches: 4 + 4, then 4 + 4."""
    t = toks(*[(p, [s]) for p in range(8) for s in (0, 1)])
    ubs = split_equal(t, 8, False, n_keep_tail=4)
    got = [sorted((t[i].seq[0], t[i].pos) for i in ub.tokens) for ub in ubs]
    assert got == [sorted((s, p) for s in (0, 1) for p in range(4)),
                   sorted((s, p) for s in (0, 1) for p in range(4, 8))]


def test_split_equal_n_keep_tail_finishes_a_set_that_exactly_fills_the_ubatch():
    """Seqs 0 and 1, 8 tokens each, n_ubatch 8, n_keep_tail 5: 4 of each taken, 4
    remain of each (< 5): seq 0 is the first offender, and 4 taken + 4 remaining = 8
    <= n_ubatch: it finishes alone. Then seq 1's 8 tokens, alone and whole."""
    t = toks(*[(p, [s]) for p in range(8) for s in (0, 1)])
    ubs = split_equal(t, 8, False, n_keep_tail=5)
    got = [[(t[i].seq[0], t[i].pos) for i in ub.tokens] for ub in ubs]
    assert got == [[(0, p) for p in range(8)], [(1, p) for p in range(8)]]


def test_split_equal_without_n_keep_tail_splits_one_token_ubatches():
    """No n_keep_tail (the default, no recurrent rollback): n_ubatch 1 is a valid
    split, one token per ubatch (the assert needs n_keep_tail > 0)."""
    t = toks((0, [0]), (1, [0]), (2, [0]))
    assert [ub.tokens for ub in split_equal(t, 1, False)] == [(0,), (1,), (2,)]


def test_split_equal_n_keep_tail_counts_every_token_to_the_end():
    """One sequence of 12 tokens, n_ubatch 3, n_keep_tail 2: each ubatch takes 3 and
    leaves 9, 6, 3 (>= 2, kept), then the last 3: four ubatches, every token used."""
    t = toks(*[(p, [0]) for p in range(12)])
    assert [len(ub.tokens) for ub in split_equal(t, 3, False, n_keep_tail=2)] == [3] * 4


def test_llama_batch_allocr_init_coupled_check_reads_both_hybrid_bounds():
    """Seq 0 holds pos 0..3 and seq 1 pos 1..3; an empty saved state read into each
    leaves them without a recurrent state (state_read_meta's seq_rm), so the hybrid
    seq_pos_max of both is min(3, -1) = -1 (any start is fine) while seq_pos_min is
    max(0, -1) = 0 and max(1, -1) = 1: a token of seqs (0, 1) at pos 10 is refused as
    diverged (the mins differ, the maxes do not)."""
    recs = run("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 3}
ops:
  - decode: {seq: 0, pos: 0..4}
  - decode: {seq: 1, pos: 1..4}
  - state_write: {seq: 2, slot: e}
  - state_read: {seq: 0, slot: e}
  - state_read: {seq: 1, slot: e}
  - decode: {seq: [0, 1], pos: 10}
""")
    assert recs[-1].status == REJECTED and "diverged" in recs[-1].message


# -- the derived state, after random op sequences ----------------------------------------


def _random_op(c: RecurrentChild, rng: random.Random) -> None:
    """One random op on c, as the replay calls them (a refusal or an assert included):
    edits of one sequence or of every one (seq -1), saved states, and ubatches of
    parallel slots (most often in place), of coupled sets and of a few sequences."""
    n = c.size
    s = rng.randrange(n)
    pos = rng.randrange(-2, 12)
    kind = rng.randrange(11)
    if kind == 0:
        c.seq_rm(rng.choice([s, s, -1]), rng.randrange(-1, 8), rng.randrange(-1, 12))
    elif kind == 1:
        c.seq_rm(rng.choice([s, -1]), -1, -1)
    elif kind == 2:
        c.seq_cp(s, rng.randrange(n))
    elif kind == 3:
        c.seq_keep(s)
    elif kind == 4:
        c.seq_add(s, rng.randrange(-1, 6), rng.randrange(-1, 12), rng.randrange(-6, 6))
    elif kind == 5:
        c.seq_div(s, rng.randrange(-1, 6), rng.randrange(-1, 12), rng.randrange(1, 4))
    elif kind == 6:
        c.state_write(s, rng.choice("ab"))
    elif kind == 7 and c.saved:
        c.state_read(s, rng.choice(sorted(c.saved)))
    elif kind == 8:
        c.state_drop(s)
    elif kind == 9:
        sets = [((q,), pos + q) for q in range(n)]  # a step of parallel slots
        if rng.random() < 0.3:
            rng.shuffle(sets)
        c.prepare([[ss for ss, _ in sets]])
        c.apply_ubatch(sets)
    else:
        seqs = rng.sample(range(n), rng.randrange(1, n + 1))
        sets = []
        while seqs:
            k = rng.randrange(1, len(seqs) + 1)
            sets.append((tuple(seqs[:k]), pos))
            seqs = seqs[k:]
        c.prepare([[ss for ss, _ in sets]])
        c.apply_ubatch(sets)


@pytest.mark.parametrize("seed", range(40))
def test_llama_memory_recurrent_derived_state_stays_the_scans_after_random_ops(seed):
    """After every op of a random sequence (refused edits and find_slot's asserts on a
    dangling tail included): `check_invariants` (the `_dangling` set is the scan of
    every tail, so `prepare` may skip its scan when it is empty); `seq_pos_maxes` is
    `_state_pos`'s definition of every sequence, in and out of range (`check_invariants`
    also holds a kept `_placed` to `_in_place`'s scan)."""
    rng = random.Random(seed)
    c = RecurrentChild(rng.choice([1, 2, 4, 6]), rng.choice([0, 1, 3]),
                       negative_seq_rm_matches_any=rng.random() < 0.8)
    n = c.size
    for _ in range(300):
        with contextlib.suppress(EditRefused, RecurrentAssert):
            _random_op(c, rng)
        c.check_invariants()
        asked = [*range(n), -1, n]
        rng.shuffle(asked)
        for some in (asked[:2], asked * 3):  # a few, and many (read at once)
            assert c.seq_pos_maxes(some) == [
                -1 if p is None else max(p, -1) for p in c._state_pos(some)]
        in_range = [s for s in asked * 3 if 0 <= s < n]
        assert c.seq_pos_maxes(in_range) == [
            -1 if p is None else max(p, -1) for p in c._state_pos(in_range)]
