"""Rules of the engine (ENGINE.md §4-§8) that no other test pinned: each test here was
written for a mutant of kpool_cli/engine/ that survived the mutation check
(docs/testing.md, tests/mutation/), and asserts what the rule says, derived by hand in
the test, not the mutant's text."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import run, trace, ubatches

from kpool_cli.contracts.records import OpEvent, UbatchRecord
from kpool_cli.engine.marking import gen_zeroed, n_new_graph, pad_bound
from kpool_cli.engine.scatter import first_token_missing, padding_rows
from kpool_cli.replay import Replayer
from kpool_cli.versions import PADDING_POLICIES, REP_ONCE

# -- §6: graph sizes ----------------------------------------------------------------------


def test_s6_pad_is_max_64_and_n_plus_1_rounded_up_to_64():
    """ENGINE.md §6: pad(n) = max(64, roundup(n + 1, 64)): always one unused slot."""
    want = {0: 64, 1: 64, 62: 64, 63: 64, 64: 128, 100: 128, 127: 128, 128: 192, 200: 256}
    assert {n: pad_bound(n) for n in want} == want
    assert all(type(pad_bound(n)) is int for n in want)


def test_s6_n_new_g_is_capped_by_pad_minus_one():
    """ENGINE.md §6: n_new_g = max(n_new, 1, min(n_tokens / kpool + n_seqs_unique,
    pad(n_pool_real) - 1, kv_size / kpool * n_seq_max)). A 1024-token ubatch of one
    sequence on a cache of 4096 cells with no pool yet: min(256 + 1, 64 - 1, 1024) = 63;
    with 100 pools: min(257, 128 - 1, 1024) = 127."""
    assert n_new_graph(0, 1024, 1, 0, 4096, 4, 1, False) == 63
    assert n_new_graph(0, 1024, 1, 100, 4096, 4, 1, False) == 127
    assert n_new_graph(200, 1024, 1, 100, 4096, 4, 1, False) == 200  # n_new wins


def test_s6_n_new_g_pool_bound_divides_integers():
    """ENGINE.md §6: kv_size / kpool is the integer division of the C code: kv_size 10,
    kpool 4, 2 sequences: 10 / 4 * 2 = 4 pools at most (not 5); the bound is an int."""
    got = n_new_graph(0, 64, 1, 0, 10, 4, 2, False)
    assert got == 4 and type(got) is int


def test_s6_cache_safe_repool_all_is_max_n_new_1():
    """ENGINE.md §6: when sharing switched cache-safe to re-pool everything, the graph
    size is max(n_new, 1): no padding."""
    assert n_new_graph(5, 1024, 1, 5, 4096, 4, 1, True) == 5
    assert n_new_graph(0, 1024, 1, 0, 4096, 4, 1, True) == 1


def test_s8_generation_zero_fill_counts():
    """ENGINE.md §8: `is_new` grows to n_pool_real (the growth is zero-filled, it never
    shrinks); rep-once also sizes `rep_gen` to kv_size * n_stream, zero-filled, at the
    first ubatch of every batch, and only there."""
    assert gen_zeroed(4, 6, True, True, 128) == 2 + 128
    assert gen_zeroed(4, 6, False, True, 128) == 2
    assert gen_zeroed(4, 6, True, False, 128) == 2  # cache-safe: no per-row array
    assert gen_zeroed(6, 6, True, True, 128) == 128
    assert gen_zeroed(8, 6, False, True, 128) == 0  # fewer pools: nothing to zero
    assert gen_zeroed(0, 0, False, False, 128) == 0


# -- §7: padding --------------------------------------------------------------------------


def test_s7_row_zero_padding_puts_every_padding_entry_on_row_0():
    """EngineVersion.padding "row-zero" (a naive engine, versions.py): every padding
    entry writes row 0, whatever the real pools' rep rows; "unused-rows" (ENGINE.md §7)
    takes the smallest rows that are no pool's rep. The readers (KP004): the pools whose
    rep row is a padding row, pool 0 (rep row 0) under row-zero, none otherwise. The
    compiled core's twin gives the same."""
    from kpool_cli.compiled.marking import Padding

    reps = np.array([0, 1, 5], dtype=np.int64)
    for pick in (padding_rows, Padding()):
        rows, readers = pick(reps, 3, 64, True)
        assert rows.tolist() == [0, 0, 0] and readers.tolist() == [0]
        rows, readers = pick(reps, 3, 64, False)
        assert rows.tolist() == [2, 3, 4] and readers.tolist() == []


def test_engine_version_padding_policy_is_checked():
    """versions.py: `padding` is one of PADDING_POLICIES; a version naming another is
    refused with a message that lists them."""
    assert replace(REP_ONCE, name="mine", padding="row-zero").padding == "row-zero"
    assert replace(REP_ONCE, name="mine", padding="unused-rows").padding == "unused-rows"
    with pytest.raises(ValueError) as e:
        replace(REP_ONCE, name="mine", padding="rows-zero")
    assert all(p in str(e.value) for p in PADDING_POLICIES)


# -- §6: touched pools ------------------------------------------------------------------

FIRST_POS_LAST = """
kpool_trace: 1
cache: {kv_size: 16, kpool: 4, n_ubatch: 3}
ops:
  - decode: {seq: 0, pos: [1, 2, 3, 0]}
"""


def test_s6_a_token_at_a_pools_first_position_marks_that_pool(engine: str):
    """ENGINE.md §6 touched pools (position mode): a token at pos p marks the last pool
    of its sequence whose first pos <= p, if p <= its rep pos; `<=`, so a token at the
    pool's own first position counts.
    One batch, pos 1, 2, 3, 0 with n_ubatch 3 (§3): ubatch 0 = pos 1..3 (cells 0..2,
    pos_min 1, no complete pool), ubatch 1 = pos 0 (cell 3). §5: pos_min moves to 0, the
    sequence is rebuilt and pos 0..3 form pool 0, rep = cell 2 (pos 3). Only the token
    at pos 0, the pool's first position, is in ubatch 1: it must mark pool 0, so that
    the pool is scattered into row 2 (n_new_g = max(1, 1, min(1 / 4 + 1, 63, 4)) = 1,
    no padding). The token sees no pool (rep pos 3 > 0)."""
    ubs = ubatches(run(FIRST_POS_LAST, engine))
    assert [u.token_pos.tolist() for u in ubs] == [[1, 2, 3], [0]]
    ub = ubs[1]
    assert ub.token_rows.tolist() == [3]
    assert ub.n_pool_real == 1 and ub.n_new == 1 and ub.n_new_g == 1
    assert [(p.seq, p.k) for p in ub.pools if p.new] == [(0, 0)]
    assert ub.scatter_rep.tolist() == [2] and not ub.scatter_pad.any()
    assert ub.scatter_rows.tolist() == [[3, 0, 1, 2]]
    assert ub.token_visible.tolist() == [0]
    assert not ub.findings


# -- §5: what an update changed, and what it cost ------------------------------------------

TWO_SEQS = """
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2, n_rs_seq: 1}
ops:
  - decode: {seq: 0, pos: 0..4}
  - decode:
      tokens:
        - {pos: 4, seq: [0]}
        - {pos: 0, seq: [1]}
  - decode:
      tokens:
        - {pos: 5, seq: [0]}
        - {pos: 1, seq: [1]}
  - seq_rm: {seq: 0, p0: 5, p1: -1}
  - decode: {seq: 0, pos: 5}
"""


def test_s8_cells_scanned_counts_pairs_copied_into_the_layout():
    """ENGINE.md §8 cost counter: the cells the layout update scans: the pairs appended,
    or a stale (or new) sequence's pairs whole. rep-once (no sharing scan):
    op 0: seq 0 built from 4 pairs: 4; op 1: seq 0 appends 1, seq 1 is built from 1: 2;
    op 2: each appends 1: 2; op 4: seq 0 (stale after its seq_rm) re-read whole once
    the token is written, 6 pairs (pos 0..5), seq 1 appends nothing: 6."""
    scanned = [u.cost["cells_scanned"] for u in ubatches(run(TWO_SEQS, "rep-once"))]
    assert scanned == [4, 2, 2, 6]


SHARED = """
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: 0, pos: 4}
"""


def test_s5_s8_cache_safe_sharing_scan_stops_at_the_first_shared_cell():
    """ENGINE.md §5 step 3 (cache-safe, unified): a sequence not yet shared scans its
    cells from n_kept and stops at the first cell holding several sequences; §8 counts
    it. op 0: seq 0 built (4) and scanned whole, nothing shared (4): 8. op 2: seq_cp
    staled both (cache-safe stales src too): seq 0 rebuilt (5 pairs) and its scan stops
    at cell 0, shared (1); seq 1 rebuilt (4) and stops at cell 0 (1): 11."""
    scanned = [u.cost["cells_scanned"] for u in ubatches(run(SHARED, "cache-safe"))]
    assert scanned == [8, 11]


FIRST_EDIT = """
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - seq_rm: {seq: 0, p0: 1, p1: -1}
  - state_drop: {seq: 1}
"""


def test_s4_cache_safe_edits_before_any_layout_stale_only_their_sequence():
    """ENGINE.md §4: cache-safe re-stales every sequence after seq_rm / state_drop only
    if the layout is shared, i.e. a layout exists and its cache_safe flag was false at
    its last update. Before the first decode there is no layout: seq_rm(0, 1) stales
    seq 0 at stale_pos(0, 1) = 1 (seq 0 is empty: seq_pos_min = -1, and 1 > -1),
    state_drop(1) stales seq 1 at 0. rep-once stales the same."""
    for engine in ("cache-safe", "rep-once"):
        evs = [r for r in run(FIRST_EDIT, engine) if isinstance(r, OpEvent)]
        assert [e.stale for e in evs] == [{0: 1}, {1: 0}], engine


# -- §3 / §7: the memory update rebuilds, before the first token's lookup -------------------

DRIFT_ONE_TOKEN = """
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..8}
  - seq_cp: {src: 0, dst: 1}
  - seq_rm: {seq: 1, p0: 0, p1: 1}
  - seq_rm: {seq: 1, p0: 6, p1: 7}
  - decode: {seq: 0, pos: 8}
  - seq_add: {seq: 0, p0: 0, p1: -1, shift: -2}
  - decode: {seq: 1, pos: 6}
"""


def test_s3_s7_the_memory_update_rebuilds_before_a_one_token_ubatch():
    """ENGINE.md §3 "The memory update", §5, §7. Seq 1 shares seq 0's cells 0..7 (pos
    0..7), then drops pos 0 and 6: op 4 rebuilds it (stale) to (1,1) (2,2) (3,3) (4,4)
    (5,5) (7,7). The shift of seq 0 by -2 empties cells 0, 1 (seq 1 loses (1,1)) and
    moves the shared cells 2..5, 7 to pos 0..3, 5; seq 1 is not staled, the shift is
    pending. The decode of seq 1 (op 6) runs the memory update first: seq 1's pos_min 1
    against its cells' first pos 0 (no append), 6 pairs against 5 cells: rebuilt,
    (0,2) (1,3) (2,4) (3,5) (5,7), one pool (cells 2..5). Its token, pos 6, goes to cell
    0 (head = the first freed cell) and is appended after (5,7): no drift, no abort.
    Marking: seq 0's stale pool (cells 2..5 at pos 0..3, rep row 5); the token is past
    seq 1's pool. (Without the memory update the layout stayed drifted, KP007, and the
    token's pos 6 was not in it: KP005.)"""
    recs = run(DRIFT_ONE_TOKEN, "rep-once")
    ub = recs[-1]
    assert isinstance(ub, UbatchRecord) and ub.op == 6 and not ub.aborted
    assert ub.token_pos.tolist() == [6] and ub.token_rows.tolist() == [0]
    assert [(p.seq, p.k) for p in ub.pools if p.new] == [(0, 0)]
    assert ub.scatter_rep.tolist() == [5] and ub.findings == ()


DRIFT_PAST_THE_END = SHARED + """\
  - seq_add: {seq: 0, p0: 0, p1: 1, shift: -5}
  - seq_add: {seq: 0, p0: -1, p1: -1, shift: 20}
  - decode: {seq: 1, pos: 4}
"""


def test_s3_s7_the_memory_update_rebuilds_a_layout_the_token_is_past():
    """ENGINE.md §3 "The memory update", §5. Seq 1's layout (rebuilt at op 2) is pos
    0..3 in cells 0..3. Seq 0's first shift empties cell 0 (seq 1 loses it), the second
    moves the shared cells 1..3 to pos 21..23; seq 1 is never staled. Seq 1's recurrent
    state did not move, so the hybrid memory's seq_pos_max(1) is min(23, 3) = 3 and
    seq 1 goes on at pos 4. The memory update rebuilds seq 1 (4 pairs against 3 cells)
    to (21,1) (22,2) (23,3) and seq 0 (stale) to pos 21..24, one pool (rep cell 4). The
    token (pos 4, cell 0) sorts before (21,1): the ubatch's update rebuilds seq 1 again
    (pos_min 21 against 4): (4,0) (21,1) (22,2) (23,3), no pool. No drift, no abort; seq
    0's stale pool is marked. (Without the memory update seq 1 kept pos 0..3, 4 pairs
    against 4 cells, and pos 4 was past them: KP005 and KP007.)"""
    recs = run(DRIFT_PAST_THE_END, "rep-once")
    ub = recs[-1]
    assert isinstance(ub, UbatchRecord) and ub.op == 5 and not ub.aborted
    assert ub.token_pos.tolist() == [4] and ub.token_rows.tolist() == [0]
    assert ub.n_pool_real == 1 and [(p.seq, p.k) for p in ub.pools if p.new] == [(0, 0)]
    assert ub.scatter_rep.tolist() == [4] and ub.findings == ()


def test_s7_the_first_token_lookup_names_the_token_its_layout_does_not_hold():
    """ENGINE.md §7: the ubatch's first token is looked up by pos in its first seq's
    layout (engine/scatter.py `first_token_missing`, the GGML_ASSERT's model); a pos the
    layout does not hold gives the assert's message, one it holds gives None. Seq 0's
    layout after a prefill of pos 0..9 holds pos 0..9, nothing else. (No trace reaches
    a miss since the memory update is modelled: docs/ENGINE.md §7.)"""
    rp = Replayer(trace(PREFILL_TEN), REP_ONCE)
    list(rp.run())
    one = [(0,)]
    assert first_token_missing(rp.layout, one, np.array([5])) is None
    assert first_token_missing(rp.layout, one, np.array([9])) is None
    assert first_token_missing(rp.layout, one, np.array([10])) == (
        "GGML_ASSERT: the ubatch's first token (seq 0, pos 10) is not in its sequence's "
        "layout")


PREFILL_TEN = """
kpool_trace: 1
cache: {kv_size: 16, kpool: 4}
ops:
  - decode: {seq: 0, pos: 0..10}
"""


# -- §7 / §8: padding rows, their cost, and the plan's arrays -------------------------------

PAD = """
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: [1, 0]}
  - decode: {seq: 1, pos: 0}
"""


def _replay(version) -> list[UbatchRecord]:
    return [r for r in Replayer(trace(PAD), version).run() if isinstance(r, UbatchRecord)]


def test_s7_padding_rows_follow_the_engines_policy_and_s8_counts_the_sort():
    """ENGINE.md §7, §8. Op 0: pos 1, 0 in cells 0, 1; pool 0 = (pos 0, cell 1),
    (pos 1, cell 0): rep row 0. Both tokens mark it: n_new 1, n_new_g = max(1, 1,
    min(2 / 2 + 1, 63, 8)) = 2: one padding entry. Op 1: seq 1's pos 0 (cell 2)
    completes no pool (seq 0 could not go on at pos 2: its recurrent state is at pos 0,
    the last token of op 0, so the hybrid memory's seq_pos_max is 0): n_new 0,
    n_new_g = max(0, 1, min(0 + 1, 63, 8)) = 1: one padding entry.
    "unused-rows" (§7) pads with the smallest row that is no pool's rep: 1; "row-zero"
    (versions.py) pads row 0, the rep of pool 0: a pad collision (KP004) at op 0.
    §8: whenever n_new_g > n_new the rep rows of every real pool (1) are sorted."""
    ubs = _replay(REP_ONCE)
    assert [(u.n_new, u.n_new_g) for u in ubs] == [(1, 2), (0, 1)]
    assert [u.scatter_rep.tolist() for u in ubs] == [[0, 1], [1]]
    assert [u.scatter_pad.tolist() for u in ubs] == [[False, True], [True]]
    assert [u.cost["reps_sorted"] for u in ubs] == [1, 1]
    assert not any(f.code == "KP004" for u in ubs for f in u.findings)
    rz = _replay(replace(REP_ONCE, name="row-zero-test", padding="row-zero"))
    assert [u.scatter_rep.tolist() for u in rz] == [[0, 0], [0]]
    assert any(f.code == "KP004" for f in rz[0].findings)


def test_s8_no_padding_no_sort():
    """ENGINE.md §8: set_input_kpool sorts the rep rows only when n_new_g > n_new. In
    FIRST_POS_LAST ubatch 0 pads (n_new 0, n_new_g 1, no pool yet: 0 rows sorted) and
    ubatch 1 does not (n_new = n_new_g = 1): 0."""
    ubs = ubatches(run(FIRST_POS_LAST))
    assert [(u.n_new, u.n_new_g) for u in ubs] == [(0, 1), (1, 1)]
    assert [u.cost["reps_sorted"] for u in ubs] == [0, 0]


def test_records_hold_rows_and_indices_as_integers(engine: str):
    """records.py: a UbatchRecord's rows are global rows, its pools and visibility are
    indices: integer arrays (the JSON report prints them as integers, and the value
    backend indexes with them)."""
    for t in (PAD, FIRST_POS_LAST, TWO_SEQS):
        for u in ubatches(run(t, engine)):
            for a in (u.token_rows, u.token_visible, u.scatter_rep, u.scatter_rows,
                      u.scatter_pool, u.pools.seq, u.pools.k, u.pools.first_pos,
                      u.pools.last_pos, u.pools.cells, u.pools.rep):
                assert a.dtype.kind == "i", (a.dtype, u)
