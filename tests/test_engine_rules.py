"""The rules of ENGINE.md §2-§7, one test (at least) per rule, each asserting values
derived by hand from the rules (the derivation is in the test's comments).

Where the real llama.cpp code disagrees with ENGINE.md, the real code wins and the
test says so ("research:"); docs/ENGINE-NOTES.md lists each place.

Every trace here is registered in `TRACES`, which test_reference_agreement.py replays
under both engines against the from-scratch reference.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import codes, drive, events, expects_ok, run, ubatches

from kpool_cli.cache.batch import SeqSets
from kpool_cli.contracts.records import ABORTED, APPLIED, REJECTED, OpEvent, UbatchRecord
from kpool_cli.engine.layout import POS_CLEAN, LayoutChange
from kpool_cli.engine.marking import token_pairs
from kpool_cli.replay import Replayer, replay
from kpool_cli.trace.load import load_trace_text
from kpool_cli.versions import REP_ONCE, VERSIONS

TRACES: list[str] = []
C = POS_CLEAN


def scenario(text: str) -> str:
    """Register a trace for the reference agreement tests and return it."""
    TRACES.append(text)
    return text


def seqs_of(st, c: int) -> tuple[int, ...]:
    """The seq ids cell c of stream `st` holds, from its raw `has` columns."""
    return tuple(s for j, s in enumerate(st.seq_ids) if st.has[j, c])


def capture(rp) -> dict:
    """A copy of the replayer's state: staleness, heads, cells, layout."""
    cache = rp.cache
    return {
        "stale": list(rp.staleness.stale),
        "head": list(cache.heads),
        "used": [st.used for st in cache.streams],
        "cells": [[(int(st.pos[c]), seqs_of(st, c)) for c in range(cache.kv_size)]
                  for st in cache.streams],
        "raw": [(st.pos.tolist(), st.has.tolist(), st.seq_count.tolist(), st.key_id.tolist(),
                 st.ext.tolist()) for st in cache.streams],
        "pairs": [list(zip(sq.pos.tolist(), sq.cells.tolist(), strict=True))
                  for sq in rp.layout.seqs],
        "pools": [sq.pools.view.tolist() for sq in rp.layout.seqs],
        "pos_max": [cache.seq_pos_max(s) for s in range(cache.config.n_seq_max)],
        "pos_min": [cache.seq_pos_min(s) for s in range(cache.config.n_seq_max)],
    }


def steps(text: str, engine: str = "rep-once") -> list[tuple[object, dict]]:
    """Every record with the state right after it (expect results left out)."""
    out = []
    for rec, rp in drive(text, engine):
        if isinstance(rec, OpEvent | UbatchRecord):
            out.append((rec, capture(rp)))
    return out


def by_op(st: list, op: int) -> list:
    """The (record, state) pairs of op number `op` of the trace."""
    return [(r, s) for r, s in st if r.op == op]


def marked(rec: UbatchRecord) -> list[tuple[int, int]]:
    return [(p.seq, p.k) for p in rec.pools if p.new]


def cells_of(state: dict, s: int, strm: int = 0) -> list[int]:
    return [c for c, (_p, ss) in enumerate(state["cells"][strm]) if s in ss]


def seqs_at(state: dict, cell: int, strm: int = 0) -> tuple[int, ...]:
    return state["cells"][strm][cell][1]


def findings(rec, code: str) -> list:
    return [f for f in rec.findings if f.code == code]


# =====================================================================================
# §3 + §5 + §6 + §7: a plain prefill, then one token at a time
# =====================================================================================

PREFILL = scenario(
    "kpool_trace: 1\n"
    "cache: {kv_size: 32, kpool: 4}\n"
    "ops:\n"
    "  - decode: {seq: 0, pos: 0..10}\n"
    + "".join(f"  - decode: {{seq: 0, pos: {p}}}\n" for p in range(10, 26))
)


def test_s5_s6_s7_prefill_pools_marking_and_plan(engine: str) -> None:
    """ENGINE.md §5 step 4 (position mode), §6 touched pools, §6 n_new_g, §7 plan.

    10 tokens, kpool 4: pools pos 0-3 and 4-7 (reps cells 3, 7), pos 8-9 wait for
    10-11. Both touched. n_new_g = max(2, 1, min(10//4 + 1, pad(2) - 1, 32//4 * 1)) = 3:
    one padding entry on the smallest row that is no rep: 0."""
    ub = ubatches(run(PREFILL, engine))[0]
    assert ub.token_rows.tolist() == list(range(10))
    assert ub.stale_batch == {}
    assert ub.n_pool_real == 2
    assert marked(ub) == [(0, 0), (0, 1)]
    assert [(p.first_pos, p.last_pos, p.rep) for p in ub.pools] == [(0, 3, 3), (4, 7, 7)]
    assert ub.n_new == 2 and ub.n_new_g == 3
    assert ub.scatter_rep.tolist() == [3, 7, 0]
    assert ub.scatter_rows.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 0, 0, 0]]
    assert ub.scatter_pad.tolist() == [False, False, True]
    # §7 visibility: the pools whose rep pos <= the token's pos
    assert ub.token_visible.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert ub.findings == ()


def test_s6_decode_makes_one_new_pool_per_kpool_tokens(engine: str) -> None:
    """ENGINE.md §6 touched pools: decoding pos 10..25 one at a time completes a pool at
    pos 11, 15, 19, 23 (rep pos = pos_min + 3 mod 4): exactly one new pool per kpool
    tokens, the pool ending at that token; every other step marks nothing and pads
    n_new_g = max(0, 1, min(1//4 + 1, ...)) = 1 entry on row 0."""
    recs = run(PREFILL, engine)
    singles = ubatches(recs)[1:]
    assert [int(u.token_pos[0]) for u in singles] == list(range(10, 26))
    new = {int(u.token_pos[0]): marked(u) for u in singles if u.n_new}
    assert new == {11: [(0, 2)], 15: [(0, 3)], 19: [(0, 4)], 23: [(0, 5)]}
    for u in singles:
        assert u.n_new_g == 1
        if not u.n_new:
            assert u.scatter_rep.tolist() == [0] and u.scatter_pad.tolist() == [True]
        else:
            p = int(u.token_pos[0])
            assert u.scatter_rep.tolist() == [p]  # cell == pos here
            assert u.scatter_rows.tolist() == [[p - 3, p - 2, p - 1, p]]
    assert not codes(recs)
    assert sum(u.n_new for u in singles) == 16 // 4


def test_s3_head_is_last_cell_plus_one_after_a_decode() -> None:
    """ENGINE.md §3: after a ubatch, head = last cell used + 1."""
    st = steps(PREFILL)
    assert st[0][1]["head"] == [10]
    assert st[1][1]["head"] == [11]


def test_s5_append_path_keeps_pools_and_scans_only_new_cells() -> None:
    """ENGINE.md §5 step 1: a clean sequence whose pos_min is unchanged only appends
    the pairs past its last one; its pools stay and the scan resumes (cost counter of
    §8: cells scanned = the appended pairs, 1 per single-token decode; the prefill
    copied all 10)."""
    st = steps(PREFILL)
    assert st[0][0].cost["cells_scanned"] == 10
    assert st[0][1]["pools"][0] == [0, 4]
    assert st[1][0].cost["cells_scanned"] == 1
    assert st[1][1]["pools"][0] == [0, 4]
    assert st[2][1]["pools"][0] == [0, 4, 8]  # pos 11 closes the pool at pairs 8..11


# =====================================================================================
# §2 seq_cp (whole) + §4 + §6: rep-once vs cache-safe (PR #29994)
# =====================================================================================

SEQ_CP = scenario("""
kpool_trace: 1
cache: {kv_size: 64, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..12}
  - seq_cp: {src: 0, dst: 1}
  - decode:
      tokens:
        - {pos: 12, seq: [0]}
        - {pos: 12, seq: [1]}
  - decode:
      tokens:
        - {pos: 13, seq: [0]}
        - {pos: 13, seq: [1]}
        - {pos: 14, seq: [0]}
        - {pos: 14, seq: [1]}
        - {pos: 15, seq: [0]}
        - {pos: 15, seq: [1]}
""")


def test_s2_unified_seq_cp_shares_cells_without_new_ones(engine: str) -> None:
    """ENGINE.md §2 seq_cp (unified): dst joins every cell of src, no cell is added;
    head does not move."""
    st = steps(SEQ_CP, engine)
    ev, state = st[1]
    assert isinstance(ev, OpEvent) and ev.status == APPLIED
    assert cells_of(state, 1) == list(range(12)) == cells_of(state, 0)
    assert all(seqs_at(state, c) == (0, 1) for c in range(12))
    assert state["used"] == [12] and state["head"] == [12]


def test_s4_s6_rep_once_marks_only_the_destinations_stale_pools() -> None:
    """ENGINE.md §4 (rep-once: seq_cp stales the destination only) and §6 rep-once.

    The decode of pos 12 in both sequences: seq 0 is clean (append path), seq 1 is
    rebuilt and its 3 pools (reps 3, 7, 11: the same rows as seq 0's) are stale; no
    token touches a pool (pos 12 > rep pos 11). n_new = 3, one scatter entry per row,
    n_new_g = max(3, 1, min(2//4 + 2, ...)) = 3: no KP001."""
    st = steps(SEQ_CP, "rep-once")
    assert st[1][0].stale == {1: 0}
    ub = st[2][0]
    assert ub.stale_batch == {1: 0}
    assert ub.token_rows.tolist() == [12, 13]
    assert ub.n_pool_real == 6
    assert marked(ub) == [(1, 0), (1, 1), (1, 2)]
    assert ub.scatter_rep.tolist() == [3, 7, 11] and ub.n_new_g == 3
    assert ub.findings == ()
    # lock-step decode: seq 0's tokens first (cells 14-16), then seq 1's (17-19);
    # each sequence closes pool 3: seq 0 = cells 12,14,15,16, seq 1 = 13,17,18,19
    ub2 = st[3][0]
    assert ub2.token_rows.tolist() == [14, 15, 16, 17, 18, 19]
    assert marked(ub2) == [(0, 3), (1, 3)]
    assert ub2.scatter_rows.tolist()[:2] == [[12, 14, 15, 16], [13, 17, 18, 19]]
    assert ub2.n_new_g == 3 and ub2.scatter_rep.tolist() == [16, 19, 0]
    assert not codes([r for r, _ in st])


def test_s4_s6_cache_safe_repools_everything_and_races_on_shared_reps() -> None:
    """ENGINE.md §4 (cache-safe: seq_cp stales src and dst), §5 step 3 (sharing) and
    §6 cache-safe: a shared layout marks every pool, n_new = n_new_g = n_pool_real,
    and the shared reps 3, 7, 11 are written by two entries each: KP001 (PR #29994)."""
    st = steps(SEQ_CP, "cache-safe")
    assert st[1][0].stale == {0: 0, 1: 0}
    ub = st[2][0]
    assert ub.n_pool_real == 6 and ub.n_new == 6 and ub.n_new_g == 6
    assert ub.scatter_rep.tolist() == [3, 7, 11, 3, 7, 11]
    (race,) = findings(ub, "KP001")
    assert race.rows == (3, 7, 11) and race.seqs == (0, 1)
    ub2 = st[3][0]
    assert ub2.n_new == ub2.n_new_g == ub2.n_pool_real == 8
    assert findings(ub2, "KP001")[0].rows == (3, 7, 11)


SHARED_NO_POOL = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..2}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: 0, pos: 2}
""")


def test_s6_s7_cache_safe_shared_layout_without_a_pool_pads_one_entry() -> None:
    """ENGINE.md §6 cache-safe: cells 0 and 1 shared (seq_cp), so every pool is marked,
    and there is none (3 and 2 pairs, kpool 4): n_new 0, n_new_g = max(0, 1) = 1. §7:
    that padding entry takes the smallest row no pool's rep holds, row 0, with members
    that row: rep [0], members [[0, 0, 0, 0]], pool -1."""
    ub = ubatches(run(SHARED_NO_POOL, "cache-safe"))[-1]
    assert (ub.n_pool_real, ub.n_new, ub.n_new_g) == (0, 0, 1)
    assert ub.scatter_rep.tolist() == [0] and ub.scatter_rows.tolist() == [[0, 0, 0, 0]]
    assert ub.scatter_pool.tolist() == [-1]


def test_shared_prefix_race_trace_expectations(engine: str) -> None:
    """traces/shared-prefix-race.yaml's own `expect`s hold."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "traces" / "shared-prefix-race.yaml").read_text()
    expects_ok(run(text, engine))


COUPLED_AFTER_CP = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..11}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: [0, 1], pos: 11}
""")


def test_s6_rep_once_stale_pools_are_marked_before_touched_ones() -> None:
    """ENGINE.md §6 order (rep-once): stale pools first, then tokens. Pos 11 (one cell
    for seqs 0 and 1) closes pool 2 of both, rep row 11 for both; seq 1's stale pool 2
    is marked first, so seq 0's touched pool 2 loses its rep row and is not marked."""
    ub = ubatches(run(COUPLED_AFTER_CP, "rep-once"))[-1]
    assert ub.token_rows.tolist() == [11]
    assert marked(ub) == [(1, 0), (1, 1), (1, 2)]
    assert ub.scatter_rep.tolist() == [3, 7, 11]
    assert ub.scatter_rows.tolist()[2] == [8, 9, 10, 11]
    assert ub.n_new_g == 3  # max(3, 1, min(1//4 + 2, ...))
    assert ub.findings == ()


def test_s6_cache_safe_coupled_token_after_cp_races() -> None:
    """ENGINE.md §6 cache-safe: shared, so all 6 pools, two entries per rep row."""
    ub = ubatches(run(COUPLED_AFTER_CP, "cache-safe"))[-1]
    assert ub.n_new == 6 and findings(ub, "KP001")[0].rows == (3, 7, 11)


# =====================================================================================
# §2 / §4: a partial seq_cp
# =====================================================================================

PARTIAL_CP = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..8}
  - seq_cp: {src: 0, dst: 1, p0: 4, p1: -1}
  - decode: {seq: 0, pos: 8}
  - decode: {seq: 1, pos: 8}
""")


def test_s4_rep_once_partial_seq_cp_aborts_and_stops_the_replay() -> None:
    """ENGINE.md §4: rep-once asserts `p0 <= 0 && p1 < 0` (PR #29994): KP005, the event
    is aborted and no later op produces a record."""
    recs = run(PARTIAL_CP, "rep-once")
    assert len(recs) == 2
    ev = recs[1]
    assert isinstance(ev, OpEvent) and ev.kind == "seq_cp" and ev.status == ABORTED
    assert codes(ev) == {"KP005"}


@pytest.mark.parametrize(("p0", "p1", "aborts"), [
    (0, -1, False), (-1, -1, False), (1, -1, True), (0, 4, True), (-1, 0, True),
])
def test_s4_rep_once_whole_range_is_p0_le_0_and_p1_lt_0(p0: int, p1: int, aborts: bool) -> None:
    """ENGINE.md §4 / PR #29994: whole = `p0 <= 0 && p1 < 0`."""
    recs = run(f"""
kpool_trace: 1
cache: {{kv_size: 16, kpool: 2, n_seq_max: 2}}
ops:
  - decode: {{seq: 0, pos: 0..4}}
  - seq_cp: {{src: 0, dst: 1, p0: {p0}, p1: {p1}}}
  - decode: {{seq: 0, pos: 4}}
""", "rep-once")
    assert recs[1].status == (ABORTED if aborts else APPLIED)
    assert len(recs) == (2 if aborts else 3)


def test_s2_cache_safe_partial_seq_cp_shares_the_range_and_goes_on() -> None:
    """ENGINE.md §2 (unified: dst joins src's cells in range) and §4 cache-safe (stale
    both). seq 1 = cells 4..7 (pos 4..7): pos_min 4, one pool with the same members and
    rep as seq 0's pool 1. Shared: every pool re-pooled, row 7 twice (KP001), but the
    members agree (no KP002)."""
    st = steps(PARTIAL_CP, "cache-safe")
    ev, state = st[1]
    assert ev.status == APPLIED and ev.stale == {0: 0, 1: 0}
    assert cells_of(state, 1) == [4, 5, 6, 7]
    ub = st[2][0]
    assert ub.n_pool_real == 3 and ub.n_new == 3
    assert ub.scatter_rep.tolist() == [3, 7, 7]
    assert codes(ub) == {"KP001"} and findings(ub, "KP001")[0].rows == (7,)
    assert isinstance(st[3][0], UbatchRecord)  # the replay goes on


KP002_TAIL = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..8}
  - decode: {seq: 1, pos: 0..2}
  - seq_cp: {src: 0, dst: 1, p0: 2, p1: -1}
  - decode:
      tokens:
        - {pos: 8, seq: [0]}
        - {pos: 8, seq: [1]}
""")


def test_s2_kp002_cache_safe_partial_seq_cp_of_a_tail() -> None:
    """ENGINE.md §2 (unified seq_cp keeps dst's own cells; research: dst's old cells are
    not removed) and §8 KP002. seq 1 = own cells 8, 9 (pos 0, 1) + seq 0's cells 2..7.
    Seq 1's pool 0 = cells 8, 9, 2, 3, seq 0's pool 0 = cells 0..3: one rep row 3 for
    two member sets (KP002); cache-safe scatters 3 and 7 twice (KP001)."""
    st = steps(KP002_TAIL, "cache-safe")
    assert cells_of(st[2][1], 1) == [2, 3, 4, 5, 6, 7, 8, 9]
    ub = st[3][0]
    assert ub.token_rows.tolist() == [10, 11]
    assert st[3][1]["pools"] == [[0, 4], [0, 4]]
    assert ub.scatter_rows.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 2, 3],
                                        [4, 5, 6, 7]]
    assert codes(ub) == {"KP001", "KP002"}
    kp2 = findings(ub, "KP002")[0]
    assert kp2.rows == (3,) and set(kp2.pools) == {(0, 0), (1, 0)}
    assert findings(ub, "KP001")[0].rows == (3, 7)
    assert codes(run(KP002_TAIL, "rep-once")) == {"KP005"}


KP002_COUPLED = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..2}
  - decode: {seq: 1, pos: 0..2}
  - decode: {seq: [0, 1], pos: 2..4}
""")


def test_s6_kp002_coupled_decode_rep_once_marks_the_first_seq_id() -> None:
    """ENGINE.md §3 (one cell per token with several seq ids), §6 rep-once and §8 KP002.
    seq 0 = cells 0, 1, seq 1 = cells 2, 3, then pos 2, 3 shared in cells 4, 5: pools
    [0,1,4,5] and [2,3,4,5] both end on row 5 (KP002). rep-once marks seq 0's (first
    seq id of the first token) only; n_new_g = max(1, 1, min(2//4 + 2, ...)) = 2, the
    padding row is 0."""
    ub = ubatches(run(KP002_COUPLED, "rep-once"))[-1]
    assert ub.token_rows.tolist() == [4, 5]
    assert marked(ub) == [(0, 0)]
    assert ub.scatter_rows.tolist() == [[0, 1, 4, 5], [0, 0, 0, 0]]
    assert ub.scatter_rep.tolist() == [5, 0]
    assert codes(ub) == {"KP002"}
    assert findings(ub, "KP002")[0].rows == (5,)


def test_s6_rep_once_order_of_seq_ids_decides_the_winner() -> None:
    """ENGINE.md §6 order: per token its seq ids in the order given. With [1, 0] seq 1's
    pool wins row 5."""
    text = KP002_COUPLED.replace("seq: [0, 1]", "seq: [1, 0]")
    ub = ubatches(run(text, "rep-once"))[-1]
    assert marked(ub) == [(1, 0)]
    assert ub.scatter_rows.tolist()[0] == [2, 3, 4, 5]


def test_s6_token_pairs_are_each_tokens_seq_ids_in_the_order_given() -> None:
    """ENGINE.md §6 order: marking reads a ubatch's (token, seq id) pairs, token by
    token, each token's seq ids in the order given (not sorted). Tokens with seq ids
    [0], [2, 1], [1] give the pairs (0, 0), (1, 2), (1, 1), (2, 1); a step of one seq
    id a token, its ids shared ([3], [3], [1]), gives one pair a token; none, none."""
    for sets in ([(0,), (2, 1), (1,)], SeqSets([(0,), (2, 1), (1,)])):
        tok, seq = token_pairs(sets)
        assert (tok.tolist(), seq.tolist()) == ([0, 1, 1, 2], [0, 2, 1, 1])
    for sets in ([(3,), (3,), (1,)], SeqSets([(3,), (3,), (1,)])):
        tok, seq = token_pairs(sets)
        assert (tok.tolist(), seq.tolist()) == ([0, 1, 2], [3, 3, 1])
        assert tok.dtype == seq.dtype == np.int64
    for sets in ([], SeqSets([])):
        tok, seq = token_pairs(sets)
        assert tok.size == seq.size == 0 and tok.dtype == seq.dtype == np.int64


def test_s6_kp002_coupled_decode_cache_safe_races() -> None:
    """ENGINE.md §5 step 3 / §6: the coupled cells are shared, so cache-safe re-pools
    both pools into row 5: KP001 and KP002."""
    ub = ubatches(run(KP002_COUPLED, "cache-safe"))[-1]
    assert ub.n_new == ub.n_new_g == 2
    assert ub.scatter_rep.tolist() == [5, 5]
    assert codes(ub) == {"KP001", "KP002"}


# =====================================================================================
# §2 seq_rm / §3 head / §4 stale_pos / §5 rebuild / §6 stale pools
# =====================================================================================

RM_BASE = """
kpool_trace: 1
cache: {kv_size: 32, kpool: 4}
ops:
  - decode: {seq: 0, pos: 0..16}
"""
RM_TAIL = scenario(RM_BASE.replace("kpool: 4}", "kpool: 4, n_rs_seq: 2}") + """\
  - seq_rm: {seq: 0, p0: 14, p1: -1}
  - decode: {seq: 0, pos: 14..16}
""")
RM_MIDDLE = scenario(RM_BASE + """\
  - seq_rm: {seq: 0, p0: 5, p1: 7}
  - decode: {seq: 0, pos: 16}
""")
RM_HEAD = scenario(RM_BASE + """\
  - seq_rm: {seq: 0, p0: -1, p1: 2}
  - decode: {seq: 0, pos: 16}
""")


def test_s2_s4_seq_rm_tail(engine: str) -> None:
    """ENGINE.md §2 seq_rm (a rollback of the 2 last tokens, which the recurrent child
    accepts with n_rs_seq 2, §3), §3 (head = min(head, first freed)), §4 (stale_pos = p0 when
    p0 > pos_min), §5 (a stale sequence is rebuilt whole, §8 cost) and §6 (only
    pools whose rep pos >= 14 are re-marked: pool 3, rebuilt on cells 12..15)."""
    st = steps(RM_TAIL, engine)
    ev, state = st[1]
    assert ev.stale == {0: 14} and state["stale"] == [14]
    assert [c for c in range(32) if state["cells"][0][c][0] == -1][:2] == [14, 15]
    assert state["used"] == [14] and state["head"] == [14]
    ub = st[2][0]
    assert ub.stale_batch == {0: 14}
    assert ub.token_rows.tolist() == [14, 15]
    # rebuilt whole: 16 pairs copied; cache-safe also scans them for sharing (§5 step 3)
    assert ub.cost["cells_scanned"] == (16 if engine == "rep-once" else 32)
    assert marked(ub) == [(0, 3)] and ub.n_new_g == 1


def test_s2_s4_s6_seq_rm_middle(engine: str) -> None:
    """ENGINE.md §2/§3/§4/§5/§6: removing pos 5, 6 frees cells 5, 6 (head 5), stale 5.
    The next token (pos 16) takes cell 5. Rebuild: pos 4 cannot start a pool (pos 7
    follows), so pools are pos 0-3, 8-11, 12-15 (pair starts 0, 6, 10); the two whose
    rep pos >= 5 are re-marked."""
    st = steps(RM_MIDDLE, engine)
    ev, state = st[1]
    assert ev.stale == {0: 5}
    assert state["cells"][0][5] == (-1, ()) and state["cells"][0][6] == (-1, ())
    assert state["head"] == [5] and state["used"] == [14]
    ub, after = st[2]
    assert ub.token_rows.tolist() == [5]
    assert after["pools"][0] == [0, 6, 10]
    assert marked(ub) == [(0, 1), (0, 2)]
    assert ub.scatter_rep.tolist() == [11, 15] and ub.n_new_g == 2
    assert ub.token_visible.tolist() == [3]


def test_s2_s4_s6_seq_rm_head_regroups_everything(engine: str) -> None:
    """ENGINE.md §4: p0 <= pos_min gives stale 0 (the whole sequence regroups); §5: the
    new pos_min is 2, pools are pos 2-5, 6-9, 10-13 (reps 5, 9, 13), all re-marked; the
    freed cells 0, 1 move head to 0, and the next token takes cell 0."""
    st = steps(RM_HEAD, engine)
    ev, state = st[1]
    assert ev.stale == {0: 0} and state["head"] == [0]
    ub = st[2][0]
    assert ub.token_rows.tolist() == [0]
    assert marked(ub) == [(0, 0), (0, 1), (0, 2)]
    assert [(p.first_pos, p.last_pos) for p in ub.pools] == [(2, 5), (6, 9), (10, 13)]
    assert ub.scatter_rep.tolist() == [5, 9, 13] and ub.n_new_g == 3


RM_ALL = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..6}
  - decode: {seq: 1, pos: 0..6}
  - seq_rm: {seq: -1, p0: 2, p1: 4}
  - decode: {seq: 0, pos: 6}
""")


def test_s2_seq_rm_of_every_sequence_over_a_part_is_refused_by_the_recurrent_child(
        engine: str) -> None:
    """Research (docs/ENGINE-NOTES.md): llama_memory_hybrid_idx::seq_rm asks the
    recurrent child first, and llama_memory_recurrent::seq_rm, for a negative id,
    accepts only a range that holds every position or none: seq_rm(-1, 2, 4) is KP008
    and changes nothing: the cells, head 12 and staleness stay; the next token of seq 0
    (pos 6) goes to cell 12."""
    st = steps(RM_ALL, engine)
    (before_rec, before), (ev, state) = st[1], st[2]
    assert isinstance(ev, OpEvent) and ev.status == REJECTED and codes(ev) == {"KP008"}
    assert "seq_id -1 over 2..4" in ev.message and ev.stale == {}
    _assert_nothing_applied(before_rec, before, state)
    ub = st[3][0]
    assert ub.token_rows.tolist() == [12]


RM_EVERYTHING = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 4, n_seq_max: 3}
ops:
  - decode: {seq: 0, pos: 0..4}
  - decode: {seq: 1, pos: 0..4}
  - seq_rm: {seq: -1}
  - decode: {seq: 2, pos: 0..2}
  - decode: {seq: 1, pos: 0..2}
""")


def test_llama_memory_recurrent_seq_rm_of_every_sequence_then_find_slot_asserts(
        engine: str) -> None:
    """angt/llama.cpp d5437c2, llama_memory_recurrent::seq_rm ("seq_id < 0 : match any
    sequence"): seq_rm(-1) over the whole range is applied: every cell is emptied
    (seq_pos_max -1 for 0 and 1), every sequence stale from 0 (mem_idx_stale_pos(-1)).
    Seq 2 never had a recurrent state: its decode runs (cells 0, 1: head was lowered
    to 0). Seq 1's tail still names state cell 1 (seq 0 took cell 0, seq 1 cell 1),
    which holds nothing: llama_memory_recurrent::find_slot's
    GGML_ASSERT(cell.has_seq_id(seq_id)) aborts the next decode of seq 1 (KP005)."""
    st = steps(RM_EVERYTHING, engine)
    ev = st[2][0]
    assert isinstance(ev, OpEvent) and ev.status == APPLIED and ev.stale == {0: 0, 1: 0, 2: 0}
    ub = st[3][0]
    assert isinstance(ub, UbatchRecord) and ub.token_rows.tolist() == [0, 1]
    ab = st[4][0]
    assert isinstance(ab, OpEvent) and ab.status == ABORTED and codes(ab) == {"KP005"}
    assert "seq 1's tail is state cell 1, which no longer holds it" in ab.message
    assert len(st) == 5


def test_llama_memory_recurrent_seq_rm_of_every_sequence_refused_by_the_unsigned_test(
) -> None:
    """ggml-org/llama.cpp 0054ee8 tests `(uint32_t) seq_id >= n_seq_max` first: the
    version with recurrent_seq_rm_matches_any = False refuses seq_rm(-1) (KP008) and
    nothing changes: seq 2 takes cells 8 and 9 (head 8), seq 1 continues at pos 4 in
    cell 10."""
    version = replace(REP_ONCE, name="rep-once-unsigned", recurrent_seq_rm_matches_any=False)
    text = RM_EVERYTHING.replace("decode: {seq: 1, pos: 0..2}", "decode: {seq: 1, pos: 4}")
    recs = list(replay(load_trace_text(text), version))
    ev = recs[2]
    assert isinstance(ev, OpEvent) and ev.status == REJECTED and codes(ev) == {"KP008"}
    assert recs[3].token_rows.tolist() == [8, 9] and recs[4].token_rows.tolist() == [10]


# =====================================================================================
# §2 seq_keep
# =====================================================================================

KEEP = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 3}
ops:
  - decode: {seq: 0, pos: 0..4}
  - decode: {seq: 1, pos: 0..4}
  - seq_cp: {src: 0, dst: 2}
  - seq_keep: {seq: 0}
  - decode: {seq: 0, pos: 4}
""")


def test_s2_s4_seq_keep(engine: str) -> None:
    """ENGINE.md §2 seq_keep: cells not holding 0 (4..7, seq 1's) become empty; cells
    holding 0 keep only 0 (seq 2 loses its shared cells); head = min(8, 4). §4: every
    sequence staled."""
    st = steps(KEEP, engine)
    ev, state = st[3]
    assert ev.stale == {0: 0, 1: 0, 2: 0}
    assert [state["cells"][0][c] for c in range(8)] == (
        [(p, (0,)) for p in range(4)] + [(-1, ())] * 4)
    assert state["head"] == [4] and state["used"] == [4]
    assert state["pos_max"] == [3, -1, -1]
    ub, after = st[4]
    assert ub.token_rows.tolist() == [4]
    assert after["pairs"][1] == after["pairs"][2] == []
    assert marked(ub) == [(0, 0)] and ub.n_pool_real == 1


# =====================================================================================
# §2 seq_add / seq_div
# =====================================================================================

ADD_NEG = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4}
ops:
  - decode: {seq: 0, pos: 0..12}
  - seq_add: {seq: 0, p0: 4, p1: -1, shift: -6}
  - decode: {seq: 0, pos: 6}
""")


def test_s2_s4_seq_add_negative_shift_empties_cells_below_zero(engine: str) -> None:
    """ENGINE.md §2 seq_add: pos 4..11 -> -2..5; cells 4, 5 drop below 0 and become
    empty; §3: head = first freed cell (4); §4: stale_pos(0, p0 + shift = -2) = 0.
    Pairs are then (0,0),(0,6),(1,1),(1,7),... : duplicates, so no pool forms (§5)."""
    st = steps(ADD_NEG, engine)
    ev, state = st[1]
    assert ev.stale == {0: 0}
    cells = state["cells"][0]
    assert cells[4] == (-1, ()) and cells[5] == (-1, ())
    assert [cells[c][0] for c in range(6, 12)] == [0, 1, 2, 3, 4, 5]
    assert [cells[c][0] for c in range(4)] == [0, 1, 2, 3]
    assert state["head"] == [4] and state["used"] == [10] and state["pos_max"] == [5]
    ub = st[2][0]
    assert ub.token_rows.tolist() == [4]
    assert ub.n_pool_real == 0 and ub.n_new == 0 and ub.n_new_g == 1
    assert ub.scatter_rep.tolist() == [0] and ub.scatter_pad.tolist() == [True]


ADD_PAST_INT32 = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 4}
ops:
  - decode: {seq: 0, pos: 0..5}
  - seq_add: {seq: 0, p0: 1, p1: -1, shift: 2147483647}
  - decode: {seq: 0, pos: 1..6}
""")


def test_llama_kv_cells_pos_add_wraps_a_position_past_int32(engine: str) -> None:
    """ENGINE.md §2 (positions are int32): pos 0..4 in cells 0..4. seq_add(0, 1, -1,
    INT32_MAX) moves pos 1..4: 1 + 2^31 - 1 = 2^31 is past INT32_MAX and wraps to
    -2^31 (2..4 to -2^31 + 1..3), below 0, so `llama_kv_cells::pos_add` empties
    cells 1..4; §3: head = the first freed cell, 1; §4: stale_pos(0, 1) = 1. The
    decode of pos 1..5 is valid (pos_max 0) and takes cells 1..5 from head 1. Pool 0
    is pos 0..3 in cells 0, 1, 2, 3, rep row 3, marked (rep pos 3 >= stale 1); pos 4
    and 5 make no pool yet, and touch none (4 and 5 are past pool 0's rep pos)."""
    st = steps(ADD_PAST_INT32, engine)
    ev, state = st[1]
    assert ev.stale == {0: 1}
    cells = state["cells"][0]
    assert [cells[c] for c in range(1, 5)] == [(-1, ())] * 4 and cells[0] == (0, (0,))
    assert state["head"] == [1] and state["pos_max"] == [0]
    ub = st[2][0]
    assert ub.token_rows.tolist() == [1, 2, 3, 4, 5]
    assert ub.n_new == 1 and ub.scatter_rep.tolist()[0] == 3
    assert ub.scatter_rows[0].tolist() == [0, 1, 2, 3]


ADD_WRAPS_STALE = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 4}
ops:
  - decode: {seq: 0, pos: 0..8}
  - seq_add: {seq: 0, p0: -1, p1: 4, shift: -2147483648}
  - decode: {seq: 0, pos: 8}
""")


def test_llama_memory_hybrid_idx_seq_add_sums_p0_and_shift_in_int32(engine: str) -> None:
    """ENGINE.md §4 seq_add: `stale_pos(s, shift < 0 ? p0 + shift : p0)` takes the raw
    p0 (-1 here) and sums in llama_pos: -1 + INT32_MIN wraps to INT32_MAX, POS_CLEAN,
    so nothing goes stale (the event names no sequence). The cells: pos 0..7 in cells
    0..7; the range [0, 4) (p0 -1 is 0 for the cells) moves pos 0..3 to -2^31 ..
    -2^31 + 3, below 0: emptied, head 0. Pos 8 takes cell 0, pos_min is 4: one pool,
    pos 4..7 in cells 4..7, rep row 7. Nothing stale, and pos 8 is past its rep pos
    7: no pool marked (n_new 0, one padding entry), under both engines (one
    sequence: the layout is cache-safe)."""
    st = steps(ADD_WRAPS_STALE, engine)
    ev, state = st[1]
    assert ev.status == APPLIED and ev.stale == {} and state["stale"] == [C]
    assert [state["cells"][0][c] for c in range(4)] == [(-1, ())] * 4
    assert state["head"] == [0] and state["pos_min"] == [4]
    ub, after = st[2]
    assert ub.token_rows.tolist() == [0] and after["pools"][0] == [0]
    assert ub.n_new == 0 and ub.n_new_g == 1 and ub.scatter_pad.tolist() == [True]


USED_WRAPS = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 4, n_seq_max: 4, n_rs_seq: 1}
ops:
  - decode: {seq: 0, pos: 0}
  - decode: {seq: 1, pos: 0}
  - decode: {seq: 2, pos: 0}
  - seq_cp: {src: 2, dst: 0}
  - seq_cp: {src: 2, dst: 1}
  - seq_rm: {seq: -1}
  - seq_cp: {src: 3, dst: 0}
  - seq_cp: {src: 3, dst: 1}
  - seq_cp: {src: 3, dst: 2}
  - decode: {seq: 3, pos: 0..3}
  - seq_rm: {seq: 3, p0: 2}
  - decode: {tokens: [{pos: 0, seq: [0]}, {pos: 0, seq: [1]}]}
  - seq_rm: {seq: 3, p0: 1}
""")


def test_llama_memory_recurrent_context_s_copy_after_used_wrapped():
    """What the uint32 `used` changes in a replay (ENGINE.md §3 "The recurrent
    child"; tests/test_recurrent.py's find_slot test derives the placement): seq 3's
    state takes cell 2 (head 2; used 2^32 - 3 after the three seq_cp), at pos 2 (pos
    0..3 is 0, 1, 2).
    seq_rm(3, 2, -1) rolls it back 2 - (2 - 1) = 1 token, within n_rs_seq 1: pos 1,
    pending. The two-set ubatch of seqs 0 and 1 (used 1, head 2: 2 > 1 + 4 is
    false): seq 0 takes the next empty cell from 2, cell 3, seq 1 the next after it,
    wrapping, cell 0; min 0, max 3: the ubatch reads cells [0, 4), and `s_copy`
    consumes the rollback of cell 2's smallest id, seq 3. So the second rollback,
    seq_rm(3, 1, -1), is accepted. (With a signed count seq 3 sat in cell 0, the
    ubatch took cells 1 and 2, read [1, 3), and left the rollback pending: the second
    one was refused, KP008.)"""
    recs = run(USED_WRAPS)
    last = recs[-1]
    assert isinstance(last, OpEvent) and last.status == APPLIED, last.message
    assert "KP008" not in codes(recs)


ADD_HEAD = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4}
ops:
  - decode: {seq: 0, pos: 0..12}
  - seq_add: {seq: 0, p0: 8, p1: -1, shift: 2}
  - decode: {seq: 0, pos: 14}
  - seq_add: {seq: 0, p0: 3, p1: 3, shift: 5}
  - seq_add: {seq: 0, p0: -1, p1: -1, shift: 0}
  - seq_add: {seq: 0, p0: 100, p1: -1, shift: 5}
""")


def test_s2_s3_s4_seq_add_positive_shift_head_and_stale(engine: str) -> None:
    """ENGINE.md §2/§3/§4 seq_add: cells 8..11 move to pos 10..13; nothing freed, so
    head = 0; stale_pos(0, 8) = 8. The next token (pos 14) is placed from cell 0: the
    first empty cell is 12. Pools: 0-3, 4-7 (pos 10 is not pos_min + 4k), none marked:
    no rep pos >= 8, no pool touched by pos 14.

    Research (real code wins): `if (shift == 0) return;` and `if (p0 == p1) return;`
    leave head alone; a range holding none of s's cells still sets head = 0. §4: the
    staleness is set "even when nothing moved"."""
    st = steps(ADD_HEAD, engine)
    ev, state = st[1]
    assert ev.stale == {0: 8} and state["head"] == [0]
    assert [state["cells"][0][c][0] for c in range(8, 12)] == [10, 11, 12, 13]
    ub, after = st[2]
    assert ub.token_rows.tolist() == [12]
    assert after["pools"][0] == [0, 4]
    assert ub.n_new == 0 and ub.stale_batch == {0: 8}
    assert after["head"] == [13]
    assert st[3][1]["head"] == [13] and st[3][0].stale == {0: 3}  # p0 == p1
    assert st[4][1]["head"] == [13] and st[4][0].stale == {0: 0}  # shift 0
    assert st[5][1]["head"] == [0]  # nothing in range: head 0


SEQ_DIV = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 2}
ops:
  - decode: {seq: 0, pos: 0..8}
  - seq_div: {seq: 0, p0: -1, p1: -1, d: 2}
  - decode: {seq: 0, pos: 4}
""")


def test_s2_s5_seq_div_and_the_greedy_pool_scan(engine: str) -> None:
    """ENGINE.md §2 seq_div (pos /= 2: 0,0,1,1,2,2,3,3; research: head never changes),
    §4 (stale 0) and §5 step 4 (kpool 2): pairs (0,0),(0,1),(1,2),(1,3),(2,4),(2,5),
    (3,6),(3,7),(4,8): j=0 fails (pos 0 then 0), j=1 starts a pool (cells 1, 2), j=3
    (pos 1) and j=4 (pos 2 then 2) fail, j=5 starts one (cells 5, 6), j=7 fails, j=8
    has no room. Both stale; the token at pos 4 touches none (rep pos 3 < 4)."""
    st = steps(SEQ_DIV, engine)
    ev, state = st[1]
    assert ev.stale == {0: 0} and state["head"] == [8]
    assert [state["cells"][0][c][0] for c in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    ub, after = st[2]
    assert ub.token_rows.tolist() == [8]
    assert after["pools"][0] == [1, 5]
    assert marked(ub) == [(0, 0), (0, 1)]
    assert ub.scatter_rows.tolist() == [[1, 2], [5, 6]] and ub.n_new_g == 2


DRIFT = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..9}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: 0, pos: 9}
  - seq_add: {seq: 0, p0: 4, p1: -1, shift: -2}
  - decode: {seq: 0, pos: 8}
  - decode: {seq: 0, pos: 9}
""")


def test_s2_kp007_seq_add_moves_a_shared_cell_of_a_clean_sequence(engine: str) -> None:
    """ENGINE.md §2 (pos belongs to the cell: a shared cell moves for every sequence),
    §4 (seq_add stales only seq 0, from p0 + shift = 2), §5 step 1-2 and §8 KP007.

    Seq 1 shares cells 0..8 (pos 0..8). The shift moves cells 4..9 to pos 2..7. At the
    next decode seq 1 is clean, its pos_min is still 0, no pair sorts after its last
    one (8, 8) and its count is still 9: no rebuild, its layout keeps pos 0..8 and
    pools 0, 4 while its cells now say 0,1,2,2,3,3,4,5,6: KP007, and the replay goes
    on. Seq 0 is rebuilt: pairs (0,0),(1,1),(2,2),(2,4),(3,3),(3,5),(4,6),(5,7),(6,8),
    (7,9),(8,10): one pool, pos 4-7 = cells 6..9 (rep pos 7 >= 2: stale, marked)."""
    st = steps(DRIFT, engine)
    ev, state = st[3]
    assert ev.stale == {0: 2} and state["head"] == [0]
    ub, after = st[4]
    assert ub.token_rows.tolist() == [10]
    (kp7,) = findings(ub, "KP007")
    assert kp7.seqs == (1,)
    assert after["pairs"][1] == [(p, p) for p in range(9)]
    assert after["pools"] == [[6], [0, 4]]
    if engine == "rep-once":
        assert marked(ub) == [(0, 0)] and ub.scatter_rows.tolist() == [[6, 7, 8, 9]]
    else:  # still shared: everything, the drifted pools included
        assert ub.n_new == 3
    nxt = st[5][0]
    assert isinstance(nxt, UbatchRecord) and not nxt.aborted
    assert "KP007" not in codes(nxt)  # reported where it appears


DRIFT_MANY = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 6}
ops:
  - decode: {seq: 0, pos: 0..9}
  - seq_cp: {src: 0, dst: 1}
  - seq_cp: {src: 0, dst: 2}
  - seq_cp: {src: 0, dst: 3}
  - seq_cp: {src: 0, dst: 4}
  - seq_cp: {src: 0, dst: 5}
  - decode: {seq: 0, pos: 9}
  - seq_add: {seq: 0, p0: 4, p1: -1, shift: -2}
  - decode: {seq: 0, pos: 8}
  - decode: {seq: 0, pos: 9}
""")


def test_s2_kp007_every_clean_sequence_sharing_the_moved_cells_drifts(engine: str) -> None:
    """`test_s2_kp007_seq_add_moves_a_shared_cell_of_a_clean_sequence` with five
    sequences sharing seq 0's cells where it had one: the shift moves them for all
    five, none of which is staled, so at the next decode each of seqs 1..5 has
    drifted, one KP007 each, reported where it appears. Six sequences are read (seq 0
    stale, the five touched): more than the rule asks one by one
    (`_ASKED_ONE_BY_ONE`), so its array of every sequence's flags answers."""
    from kpool_cli.verdict.rules import kp007_layout_drift

    st = steps(DRIFT_MANY, engine)
    ub = st[8][0]
    assert isinstance(ub, UbatchRecord) and ub.op == 8
    assert len(ub.token_pos) == 1 and kp007_layout_drift._ASKED_ONE_BY_ONE < 6
    assert sorted(f.seqs for f in findings(ub, "KP007")) == [(1,), (2,), (3,), (4,), (5,)]
    nxt = st[9][0]
    assert isinstance(nxt, UbatchRecord) and nxt.op == 9 and "KP007" not in codes(nxt)


REBUILD_COUNT = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..9}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: 0, pos: 9}
  - seq_add: {seq: 0, p0: 4, p1: -1, shift: 2}
  - decode: {seq: 0, pos: 12}
""")


def test_s5_clean_sequence_rebuilds_when_its_count_differs(engine: str) -> None:
    """ENGINE.md §5 step 2: the positive shift moves seq 1's shared cells 4..8 to pos
    6..10; seq 1 is clean and appends (9,7), (10,8) past its last pair (8,8): 11 pairs
    against 9 cells, so it is rebuilt: pools only pos 0-3 (pos 6 breaks the grid). No
    drift. Seq 0 (stale 4): pools 0-3 and 8-11 (cells 6..9, marked)."""
    st = steps(REBUILD_COUNT, engine)
    ub, after = st[4]
    assert "KP007" not in codes(ub)
    assert ub.token_rows.tolist() == [10]
    assert after["pairs"][1] == [(0, 0), (1, 1), (2, 2), (3, 3), (6, 4), (7, 5), (8, 6),
                                 (9, 7), (10, 8)]
    assert after["pools"] == [[0, 6], [0]]
    if engine == "rep-once":
        assert marked(ub) == [(0, 1)] and ub.scatter_rep.tolist() == [9]
    else:
        assert ub.n_new == 3


# =====================================================================================
# §2 state_write / state_read / state_drop
# =====================================================================================

STATE = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - state_write: {seq: 0, slot: a}
  - decode: {seq: 1, pos: 0..2}
  - seq_rm: {seq: 0, p0: 1, p1: 2}
  - state_read: {seq: 1, slot: a}
  - decode: {seq: 1, pos: 4}
""")


def test_s2_state_read_places_the_snapshot_by_find_slot(engine: str) -> None:
    """ENGINE.md §2 state_read(1): seq_rm(1, -1, -1) frees cells 4, 5 (head stays 1, the
    cell seq_rm(0, 1, 2) freed), then find_slot places the 4 saved cells (pos 0..3) in
    the first empty cells from head 1: 1, 4, 5, 6 (not contiguous), each holding only
    seq 1; head = 7. §4: stale_set(1, 0).
    Next decode (pos 4 -> cell 7): seq 0 = (0,0),(2,2),(3,3): pool pos 2-3 (rep pos 3 >=
    stale 1); seq 1 = (0,1),(1,4),(2,5),(3,6),(4,7): pools reps 4, 6; all 3 stale."""
    st = steps(STATE, engine)
    ev, state = st[4]
    assert ev.kind == "state_read" and ev.status == APPLIED and ev.stale == {1: 0}
    assert cells_of(state, 1) == [1, 4, 5, 6]
    assert [state["cells"][0][c] for c in (1, 4, 5, 6)] == [(p, (1,)) for p in range(4)]
    assert cells_of(state, 0) == [0, 2, 3]
    assert state["head"] == [7] and state["stale"] == [1, 0]
    ub = st[5][0]
    assert ub.stale_batch == {0: 1, 1: 0}
    assert ub.token_rows.tolist() == [7]
    assert marked(ub) == [(0, 0), (1, 0), (1, 1)]
    assert ub.scatter_rows.tolist() == [[2, 3], [1, 4], [5, 6]]
    assert ub.n_new_g == 3


STATE_NOROOM = scenario("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - state_write: {seq: 0, slot: a}
  - decode: {seq: 1, pos: 0..2}
  - decode: {seq: 0, pos: 4..6}
  - state_read: {seq: 1, slot: a}
  - decode: {seq: 1, pos: 0}
""")


def test_s2_state_read_without_room_drops_the_sequence(engine: str) -> None:
    """ENGINE.md §2: no room for the 4 saved cells once seq 1's 2 cells are freed (the
    cache holds 6 of seq 0): the restore fails and seq 1 is dropped (state_drop):
    its cells 4, 5 are empty, head = 4, stale_set(1, 0). The replay goes on."""
    st = steps(STATE_NOROOM, engine)
    ev, state = st[4]
    assert ev.kind == "state_read" and ev.status == REJECTED
    assert "KP005" not in codes(ev)
    assert cells_of(state, 1) == [] and state["pos_max"][1] == -1
    assert state["cells"][0][4] == (-1, ()) and state["cells"][0][5] == (-1, ())
    assert state["head"] == [4] and ev.stale == {1: 0}
    ub = st[5][0]
    assert ub.token_rows.tolist() == [4]


STATE_NOROOM_SHARED = scenario("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - state_write: {seq: 0, slot: a}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: 1, pos: 4..6}
  - decode: {seq: 0, pos: 4..6}
  - state_read: {seq: 1, slot: a}
  - decode: {seq: 1, pos: 0}
""")


def test_llama_kv_cache_state_clear_zeroes_the_rows_a_failed_restore_left(engine: str) -> None:
    """A failed state_read: llama_memory_hybrid_idx::state_read restores the attention
    cache first; its state_read_meta runs seq_rm(1, -1, -1), find_slot finds no room,
    and it throws before the indexer cache's restore runs. The catch calls
    state_drop(1), whose mem_idx->state_clear(1) (ggml-org/llama.cpp
    src/llama-kv-cache.cpp at 035aa95, angt/llama.cpp at d5437c2) finds seq 1's old
    cells still in the indexer cache and zeroes the rows of those that hold seq 1
    alone (`seq_has(i, 1) && seq_count(i) == 1`), then seq_rm's them.

    By hand (kv_size 8, one stream: global row = cell): seq 0 decodes pos 0..3 into
    cells 0..3, seq_cp(0, 1) shares them, seq 1 decodes pos 4, 5 into cells 4, 5 (seq 1
    alone), seq 0 decodes pos 4, 5 into cells 6, 7: the cache is full. state_read(1) of
    4 saved cells: seq_rm(1) frees cells 4, 5 only (0..3 keep seq 0): 2 empty cells < 4,
    no room. The indexer's rows 4 and 5 (seq 1's alone) are zeroed; rows 0..3 (shared
    with seq 0) keep their data. The next decode of seq 1 (pos 0) writes cell 4 (head
    = 4): row 5 stays zero."""
    from kpool_cli.backend.store import ValueBackend

    t = load_trace_text(STATE_NOROOM_SHARED)
    backend = ValueBackend(t.cache, t.seed, "numpy")
    rp = Replayer(t, VERSIONS[engine], backend)
    seen = {}
    for rec in rp.run():
        if isinstance(rec, OpEvent) and rec.kind == "state_read":
            assert rec.status == REJECTED
            seen["freed"] = backend.row_values("key", np.array([4, 5]))
            seen["shared"] = backend.row_values("key", np.arange(4))
    assert not np.any(seen["freed"])  # rows 4, 5: zeroed by the indexer's state_clear
    assert np.all(np.any(seen["shared"] != 0, axis=-1))  # rows 0..3: kept (seq 0's too)
    assert not np.any(backend.row_values("key", np.array([5])))  # still zero after
    assert np.any(backend.row_values("key", np.array([4])))  # the decode's own row
    st = rp.cache.streams[0]
    assert int(st.key_id[5]) == 0  # the empty cell holds no key


STATE_EMPTY = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
ops:
  - state_write: {seq: 1, slot: e}
  - decode: {seq: 0, pos: 0..4}
  - state_read: {seq: 0, slot: e}
  - decode: {seq: 0, pos: 4}
""")


def test_s2_state_read_of_an_empty_snapshot_leaves_the_target(engine: str) -> None:
    """ENGINE.md §2 (research agrees: `if (cell_count == 0) continue;` before the
    seq_rm): the target keeps its cells and head, but it is still staled."""
    st = steps(STATE_EMPTY, engine)
    before, after = st[1][1], st[2][1]
    ev = st[2][0]
    assert ev.status == APPLIED and ev.stale == {0: 0}
    assert after["cells"] == before["cells"] and after["head"] == before["head"] == [4]
    ub = st[3][0]
    assert ub.stale_batch == {0: 0} and marked(ub) == [(0, 0), (0, 1)]


SHARED_BASE = """
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: 1, pos: 4..6}
"""
STATE_DROP = scenario(SHARED_BASE + """\
  - state_drop: {seq: 1}
  - decode: {seq: 0, pos: 4}
""")
RM_SHARED = scenario(SHARED_BASE.replace("n_seq_max: 2}", "n_seq_max: 2, n_rs_seq: 1}") + """\
  - seq_rm: {seq: 1, p0: 5, p1: -1}
  - decode: {seq: 0, pos: 4}
""")
READ_SHARED = scenario(SHARED_BASE + """\
  - state_write: {seq: 0, slot: a}
  - state_read: {seq: 1, slot: a}
  - decode: {seq: 0, pos: 4}
""")


def test_s2_state_drop_frees_only_the_cells_it_alone_held(engine: str) -> None:
    """ENGINE.md §2 state_drop(1): seq 1 leaves cells 0..5; cells 4, 5 (only seq 1's)
    become empty, cells 0..3 keep seq 0; head = min(6, 4). §4: stale_set(1, 0), and
    cache-safe (the layout was shared at its last update) stales every sequence.
    Next decode: rep-once appends to clean seq 0 (nothing marked, one padding entry);
    cache-safe rebuilds it and re-marks its two pools (no longer shared)."""
    st = steps(STATE_DROP, engine)
    ev, state = st[3]
    assert ev.stale == ({1: 0} if engine == "rep-once" else {0: 0, 1: 0})
    assert [state["cells"][0][c] for c in range(6)] == (
        [(p, (0,)) for p in range(4)] + [(-1, ())] * 2)
    assert state["head"] == [4]
    ub = st[4][0]
    assert ub.token_rows.tolist() == [4]
    if engine == "rep-once":
        assert ub.n_new == 0 and ub.scatter_rep.tolist() == [0]
    else:
        assert marked(ub) == [(0, 0), (0, 1)] and ub.scatter_rep.tolist() == [1, 3]
        assert ub.n_new_g == 2


def test_s4_cache_safe_restales_everything_while_shared(engine: str) -> None:
    """ENGINE.md §4 table: seq_rm / state_read on a shared layout stale every sequence
    in cache-safe; rep-once stales only the edited one (stale_pos(1, 5) = 5 > pos_min)."""
    rm = steps(RM_SHARED, engine)[3][0]
    rd = steps(READ_SHARED, engine)[4][0]
    if engine == "rep-once":
        assert rm.stale == {1: 5} and rd.stale == {1: 0}
    else:
        assert rm.stale == {0: 0, 1: 0} and rd.stale == {0: 0, 1: 0}


def test_s2_state_read_into_a_shared_sequence_unshares_it() -> None:
    """ENGINE.md §2: state_read(1) = seq_rm(1) (cells 4, 5 freed, head 4) then 4 new
    cells 4..7 holding only seq 1."""
    st = steps(READ_SHARED)
    state = st[4][1]
    assert cells_of(state, 0) == [0, 1, 2, 3] and cells_of(state, 1) == [4, 5, 6, 7]
    assert all(seqs_at(state, c) == (1,) for c in range(4, 8))
    assert state["head"] == [8]


CLEAR = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - decode: {seq: 1, pos: 0..4}
  - clear: {}
  - decode: {seq: 1, pos: 7..9}
  - state_drop: {seq: -1}
""")


def test_s2_clear_and_state_drop_all(engine: str) -> None:
    """ENGINE.md §2 clear: every cell empty, head 0, every sequence stale; state_drop(-1)
    is clear."""
    st = steps(CLEAR, engine)
    ev, state = st[2]
    assert ev.stale == {0: 0, 1: 0}
    assert state["used"] == [0] and state["head"] == [0]
    ub = st[3][0]
    assert ub.token_rows.tolist() == [0, 1]  # an empty sequence may start anywhere
    ev, state = st[4]
    assert ev.stale == {0: 0, 1: 0} and state["used"] == [0] and state["head"] == [0]


# =====================================================================================
# §2 / §3 / §7: a non-unified cache
# =====================================================================================

NONUNI = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2, unified: false}
ops:
  - decode: {seq: 0, pos: 0..6}
  - decode: {seq: 1, pos: 0..3}
  - seq_cp: {src: 0, dst: 1}
  - decode:
      tokens:
        - {pos: 6, seq: [0]}
        - {pos: 6, seq: [1]}
  - seq_keep: {seq: 0}
  - decode: {seq: 1, pos: 7}
""")


def test_s2_s7_non_unified_streams_and_global_rows(engine: str) -> None:
    """ENGINE.md §2: stream s belongs to seq s; global row = strm * kv_size + cell.
    Seq 1's cells 0..2 are rows 16..18; its pool (pos 0, 1) has rep row 17. §6:
    n_new_g = max(1, 1, min(3//2 + 1, pad(4) - 1, 16//2 * 2)) = 2; the padding row is
    the smallest row that is no rep (reps 1, 3, 5, 17): 0."""
    st = steps(NONUNI, engine)
    ub, state = st[1]
    assert ub.token_rows.tolist() == [16, 17, 18]
    assert state["head"] == [6, 3]
    assert ub.n_pool_real == 4 and marked(ub) == [(1, 0)]
    assert ub.scatter_rep.tolist() == [17, 0]


def test_s2_non_unified_seq_cp_copies_cells_and_head_across_streams(engine: str) -> None:
    """ENGINE.md §2/§3: dst's stream is reset, src's cells are copied at the same indices
    (holding only dst), and the head is the source's (6).
    Next decode: cell 6 of each stream (rows 6, 22). rep-once: seq 1's three stale
    pools (rows 17, 19, 21); cache-safe stales both and, non-unified, never switches
    to re-pool-all (§5 step 3 is unified only): 6 pools, distinct rows, no KP001."""
    st = steps(NONUNI, engine)
    ev, state = st[2]
    assert ev.stale == ({1: 0} if engine == "rep-once" else {0: 0, 1: 0})
    assert state["cells"][1][:7] == [(p, (1,)) for p in range(6)] + [(-1, ())]
    assert state["head"] == [6, 6]
    ub = st[3][0]
    assert ub.token_rows.tolist() == [6, 22]
    if engine == "rep-once":
        assert marked(ub) == [(1, 0), (1, 1), (1, 2)]
        assert ub.scatter_rep.tolist() == [17, 19, 21] and ub.n_new_g == 3
    else:
        assert ub.n_new == ub.n_new_g == 6
        assert ub.scatter_rep.tolist() == [1, 3, 5, 17, 19, 21]
    assert "KP001" not in codes(ub)


def test_s2_non_unified_seq_keep_touches_only_its_stream(engine: str) -> None:
    """ENGINE.md §2 seq_keep (non-unified: only s's own stream) and §4 (every sequence
    stale): seq 1's stream is unchanged. The next decode of seq 1 rebuilds and re-marks
    all 3 + 4 pools (seq 1's pos 6, 7 = cells 6, 7 = rep row 23)."""
    st = steps(NONUNI, engine)
    before, (ev, after) = st[3][1], st[4]
    assert ev.stale == {0: 0, 1: 0}
    assert after["cells"] == before["cells"] and after["head"] == before["head"]
    ub = st[5][0]
    assert ub.token_rows.tolist() == [23]
    assert ub.n_pool_real == 7 and ub.n_new == 7
    assert ub.scatter_rep.tolist() == [1, 3, 5, 17, 19, 21, 23]


@pytest.mark.parametrize("version", ["angt-f46848f", "cache-safe+seq-keep-every-stream"])
def test_llama_kv_cache_seq_keep_of_angt_empties_every_stream(version: str) -> None:
    """docs/ENGINE-NOTES.md "seq_keep on a non-unified cache": angt's
    `llama_kv_cache::seq_keep` (angt/llama.cpp src/llama-kv-cache.cpp, d5437c2) keeps
    seq 0 in every stream. Stream 0 holds only seq 0's cells (pos 0..6 in cells 0..6):
    unchanged. Stream 1 holds only seq 1's (pos 0..6 in cells 0..6): every cell empties,
    and its head drops to the first freed cell, min(7, 0) = 0. The next decode of seq 1
    (pos 7: the hybrid memory's seq_pos_max(1) is -1 once seq_keep dropped its recurrent
    state, so any pos starts it) takes cell 0 of stream 1, row 16. Seq 1's one pair
    makes no pool of 2; seq 0's seven make three (reps 1, 3, 5), all re-marked (§4: every
    sequence stale from 0)."""
    st = steps(NONUNI, version)
    before, (ev, after) = st[3][1], st[4]
    assert ev.stale == {0: 0, 1: 0}
    assert after["cells"][0] == before["cells"][0]
    assert before["cells"][1][:7] == [(p, (1,)) for p in range(7)]
    assert after["cells"][1] == [(-1, ())] * 16
    assert after["head"] == [before["head"][0], 0]
    ub = st[5][0]
    assert ub.token_rows.tolist() == [16]
    assert ub.n_pool_real == 3 and marked(ub) == [(0, 0), (0, 1), (0, 2)]
    assert ub.scatter_rep.tolist()[:3] == [1, 3, 5]


NONUNI_COUPLED = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2, unified: false}
ops:
  - decode: {seq: 0, pos: 0..2}
  - decode: {seq: 1, pos: 0..2}
  - decode: {seq: [0, 1], pos: 2}
""")


def test_s3_non_unified_refuses_coupled_sequences(engine: str) -> None:
    """ENGINE.md §3: the sequential split (non-unified) refuses a batch with coupled
    sequences, although validation passes (both 0..1): KP006, nothing applied."""
    st = steps(NONUNI_COUPLED, engine)
    ev, state = st[2]
    assert ev.status == REJECTED and codes(ev) == {"KP006"}
    assert state["raw"] == st[1][1]["raw"] and state["head"] == st[1][1]["head"]


NONUNI_PARTIAL = """
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2, unified: false}
ops:
  - decode: {seq: 0, pos: 0..6}
  - seq_cp: {src: 0, dst: 1, p0: 2, p1: -1}
"""
NONUNI_P1_ZERO = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2, unified: false}
ops:
  - decode: {seq: 0, pos: 0..6}
  - seq_cp: {src: 0, dst: 1, p0: -1, p1: 0}
  - decode: {seq: 1, pos: 6}
""")


def test_s2_non_unified_partial_seq_cp_aborts_in_both_versions(engine: str) -> None:
    """ENGINE.md §2: non-unified, a partial range aborts in both versions
    (GGML_ASSERT is_full)."""
    recs = run(NONUNI_PARTIAL, engine)
    assert recs[-1].status == ABORTED and codes(recs[-1]) == {"KP005"}


def test_s2_non_unified_seq_cp_ignores_the_range_is_full_is_loose() -> None:
    """Research (real code wins): kv-cache's is_full is false only for a bound strictly
    inside (0, kv_size - 1), so cache-safe accepts p1 = 0, and the copy ignores the
    range: every cell of seq 0 is copied. rep-once's own assert (p1 < 0) aborts."""
    st = steps(NONUNI_P1_ZERO, "cache-safe")
    ev, state = st[1]
    assert ev.status == APPLIED
    assert state["cells"][1][:6] == [(p, (1,)) for p in range(6)]
    assert isinstance(st[2][0], UbatchRecord)
    assert run(NONUNI_P1_ZERO, "rep-once")[1].status == ABORTED


# =====================================================================================
# §3 / §5 / §6 / §7: by-order pooling (M-RoPE images)
# =====================================================================================

BY_ORDER = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 2, by_order: true}
ops:
  - decode: {seq: 0, pos: 0}
  - decode:
      tokens:
        - {pos: 1, seq: [0], ext: [0, 0]}
        - {pos: 1, seq: [0], ext: [0, 1]}
        - {pos: 1, seq: [0], ext: [1, 0]}
        - {pos: 1, seq: [0], ext: [1, 1]}
  - decode: {seq: 0, pos: 2}
  - decode: {seq: 0, pos: 2}
  - decode: {seq: 0, pos: 7}
  - seq_add: {seq: 0, p0: 0, p1: -1, shift: 1}
  - decode: {seq: 0, pos: 8}
""")


def test_s5_s6_s7_by_order_pools_image_tokens_by_rank(engine: str) -> None:
    """ENGINE.md §5 step 4 by-order: pools every kpool pairs, positions ignored; §6: a
    token's pool is rank // kpool; §7: it sees (rank + 1) // kpool pools.
    Pairs (0,0),(1,1),(1,2),(1,3),(1,4): pools at 0 (cells 0, 1) and 2 (cells 2, 3)
    (position mode would find only pos 0-1). Image tokens have ranks 1..4: pools 0, 1,
    1, none. n_new_g = max(2, 1, min(4//2 + 1, ...)) = 3, one padding row (0)."""
    st = steps(BY_ORDER, engine)
    ub, after = st[1]
    assert ub.token_rows.tolist() == [1, 2, 3, 4]
    assert ub.token_ext.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert after["pools"][0] == [0, 2]
    assert marked(ub) == [(0, 0), (0, 1)]
    assert ub.scatter_rows.tolist() == [[0, 1], [2, 3], [0, 0]]
    assert ub.token_visible.tolist() == [1, 1, 2, 2]
    ub2 = st[2][0]
    assert ub2.token_rows.tolist() == [5] and marked(ub2) == [(0, 2)]
    assert ub2.token_visible.tolist() == [3]


def test_s3_by_order_validation_and_s2_seq_add_abort(engine: str) -> None:
    """ENGINE.md §3 M-RoPE validation: text needs X < Y (pos 2 after pos 2: refused),
    no continuity check (pos 7 after 2 is accepted); §2: seq_add aborts on an M-RoPE
    model (KP005), and the replay stops."""
    recs = run(BY_ORDER, engine)
    rej = recs[3]
    assert isinstance(rej, OpEvent) and rej.status == REJECTED and codes(rej) == {"KP006"}
    ok = recs[4]
    assert isinstance(ok, UbatchRecord) and ok.token_pos.tolist() == [7]
    assert ok.token_visible.tolist() == [3]  # rank 6: min(3 pools, 7 // 2)
    ab = recs[5]
    assert ab.kind == "seq_add" and ab.status == ABORTED and codes(ab) == {"KP005"}
    assert len(recs) == 6


def test_s3_by_order_image_batch_accepts_x_equal_y() -> None:
    """ENGINE.md §3: image embeddings need only X <= Y."""
    recs = run("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 2, by_order: true}
ops:
  - decode: {seq: 0, pos: 0..2}
  - decode: {seq: 0, pos: 1, ext: [0, 0]}
  - decode: {seq: 0, pos: 0, ext: [0, 0]}
""")
    assert isinstance(recs[1], UbatchRecord)
    assert recs[2].status == REJECTED


# =====================================================================================
# §3 validation and refusals (KP006: nothing applied)
# =====================================================================================

REFUSE = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 3}
ops:
  - decode: {seq: 0, pos: 0..4}
  - decode: {seq: 0, pos: 5}
  - decode: {seq: 0, pos: 3}
  - decode: {seq: 0, pos: [4, 6]}
  - decode: {seq: 1, pos: 1..4}
  - decode: {seq: [0, 2], pos: 4}
  - decode: {seq: 0, pos: [5, 4]}
  - decode: {seq: 1, pos: [4, 4, 5]}
""")


def _assert_nothing_applied(before_rec, before: dict, after: dict) -> None:
    assert after["raw"] == before["raw"]
    assert after["head"] == before["head"] and after["used"] == before["used"]
    stale = before["stale"]
    if isinstance(before_rec, UbatchRecord):  # cleaned once that ubatch was yielded
        stale = [C] * len(stale)
    assert after["stale"] == stale
    assert after["pairs"] == before["pairs"] and after["pools"] == before["pools"]


@pytest.mark.parametrize(("op", "why"), [
    (1, "Y = 5 != X + 1 = 4"),
    (2, "Y = 3 = X"),
    (3, "positions 4, 6 are not continuous"),
    (5, "coupled seqs 0 (3..3) and 2 (empty) have diverged"),
])
def test_s3_refused_decodes_change_nothing(engine: str, op: int, why: str) -> None:
    """ENGINE.md §3 validation; a refused batch is KP006 (event rejected) and changes
    nothing: cells, heads, staleness and layout are the same before and after."""
    st = steps(REFUSE, engine)
    (ev, after), = by_op(st, op)
    before_rec, before = [(r, s) for r, s in st if r.op < op][-1]
    assert isinstance(ev, OpEvent) and ev.kind == "decode" and ev.status == REJECTED, why
    assert codes(ev) == {"KP006"}
    _assert_nothing_applied(before_rec, before, after)


def test_s3_accepted_odd_batches(engine: str) -> None:
    """ENGINE.md §3: an empty sequence may start anywhere (seq 1 at pos 1); positions
    [5, 4] are accepted (the "decreasing positions" check never fires) and placed in
    batch order; research: continuity counts distinct positions ([4, 4, 5] passes)."""
    st = steps(REFUSE, engine)
    (ub, _), = by_op(st, 4)
    assert isinstance(ub, UbatchRecord) and ub.token_rows.tolist() == [4, 5, 6]
    (ub, state), = by_op(st, 6)
    assert ub.token_pos.tolist() == [5, 4] and ub.token_rows.tolist() == [7, 8]
    assert state["cells"][0][7] == (5, (0,)) and state["cells"][0][8] == (4, (0,))
    (ub, _), = by_op(st, 7)
    assert isinstance(ub, UbatchRecord) and ub.token_rows.tolist() == [9, 10, 11]


NOROOM = scenario("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_ubatch: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - decode: {seq: 0, pos: 4}
  - state_write: {seq: 0, slot: a}
  - decode: {seq: 0, pos: 5..9}
  - decode: {seq: 0, pos: 5..8}
""")


def test_s3_no_free_cell_rejects_the_whole_decode(engine: str) -> None:
    """ENGINE.md §3: 4 tokens need 4 cells, 3 are free: ubatch 0 (2 tokens) would fit,
    ubatch 1 does not, so the whole decode fails (KP006) and nothing of ubatch 0 is
    applied either: cells, heads, staleness and layout are unchanged. 3 tokens then
    fit (ubatches of 2 and 1)."""
    st = steps(NOROOM, engine)
    (ev, after), = by_op(st, 3)
    before_rec, before = by_op(st, 2)[-1]
    assert ev.status == REJECTED and codes(ev) == {"KP006"}
    _assert_nothing_applied(before_rec, before, after)
    assert before["head"] == [5]
    ubs = [r for r, _ in by_op(st, 4)]
    assert [u.token_rows.tolist() for u in ubs] == [[5, 6], [7]]


def test_s4_a_refused_decode_keeps_the_staleness() -> None:
    """ENGINE.md §4: only a decode whose first ubatch succeeds cleans `stale`."""
    st = steps("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_rs_seq: 2}
ops:
  - decode: {seq: 0, pos: 0..6}
  - seq_rm: {seq: 0, p0: 4, p1: -1}
  - decode: {seq: 0, pos: 9}
  - decode: {seq: 0, pos: 4}
""")
    assert st[2][0].status == REJECTED and st[2][1]["stale"] == [4]
    assert st[3][0].stale_batch == {0: 4}


# =====================================================================================
# §3 find_slot
# =====================================================================================

RESTART_BASE = """
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..10}
  - decode: {seq: 1, pos: 0..10}
  - seq_rm: {seq: 0, p0: -1, p1: -1}
  - seq_add: {seq: 1, p0: -1, p1: -1, shift: -3}
"""
RESTART = scenario(RESTART_BASE + "  - decode: {seq: 1, pos: 7}\n")
NO_RESTART = scenario(RESTART_BASE + "  - decode: {seq: 1, pos: 7..9}\n")


def test_s3_find_slot_restarts_at_0_when_head_is_past_used_plus_2n(engine: str) -> None:
    """ENGINE.md §3: seq 0's cells 0..9 are freed (head 0); the shift frees cells 10..12
    of seq 1 (pos < 0) and sets head to 10, used = 7. One token: 10 > 7 + 2*1, so the
    scan starts at 0 (cell 0); two tokens: 10 > 7 + 2*2 is false, so they take cells
    10, 11. Head = last cell + 1."""
    st = steps(RESTART, engine)
    assert st[3][1]["head"] == [10] and st[3][1]["used"] == [7]
    ub, state = st[4]
    assert ub.token_rows.tolist() == [0] and state["head"] == [1]
    ub, state = steps(NO_RESTART, engine)[4]
    assert ub.token_rows.tolist() == [10, 11] and state["head"] == [12]


WRAP = scenario("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - decode: {seq: 1, pos: 0..4}
  - seq_rm: {seq: 0, p0: -1, p1: -1}
  - seq_add: {seq: 1, p0: -1, p1: -1, shift: -1}
  - decode: {seq: 1, pos: 3..5}
""")


def test_s3_find_slot_wraps_and_head_follows_the_last_token(engine: str) -> None:
    """ENGINE.md §3 (research: head = the last token's cell + 1 in placement order):
    head reaches kv_size (8); after the edits head = 4 (the cell the shift freed), used
    = 3; the scan takes cell 4, skips 5..7, wraps and takes cell 0: head = 1, not 5.
    Seq 1 = (0,5),(1,6),(2,7),(3,4),(4,0): pool pos 0-3, rep cell 4, stale-marked."""
    st = steps(WRAP, engine)
    assert st[1][1]["head"] == [8]
    assert st[3][1]["head"] == [4] and st[3][1]["used"] == [3]
    ub, state = st[4]
    assert ub.token_rows.tolist() == [4, 0] and state["head"] == [1]
    assert marked(ub) == [(1, 0)] and ub.scatter_rows.tolist() == [[5, 6, 7, 4]]


HEAD_QUIRK = scenario("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 2, unified: false, n_ubatch: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - decode: {seq: 1, pos: 0..6}
  - decode: {seq: 1, pos: 6..9}
""")


def test_s3_failed_prepare_restores_heads_by_stream_list_index() -> None:
    """Research (real code wins over the first specification's "nothing applied" for
    heads, ENGINE.md §3):
    prepare() restores `head = v_heads_old[s]` with s the index in the ubatch's stream
    list. Seq 1's 3 tokens: ubatch 0 fits stream 1's last 2 cells, ubatch 1 does not;
    the restore gives stream 1 the old head of stream 0 (4), not its own (6). Cells
    are unchanged."""
    st = steps(HEAD_QUIRK)
    before, (ev, after) = st[-2][1], st[-1]
    assert ev.status == REJECTED
    assert before["head"] == [4, 6]
    assert after["head"] == [4, 4]
    assert after["raw"] == before["raw"]


# =====================================================================================
# §3 split_equal
# =====================================================================================


def _hundred_and_one(n_ubatch: int) -> str:
    toks = "".join(f"        - {{pos: {p}, seq: [0]}}\n" for p in range(100))
    return (
        "kpool_trace: 1\n"
        f"cache: {{kv_size: 128, kpool: 4, n_seq_max: 2, n_ubatch: {n_ubatch}}}\n"
        "ops:\n"
        "  - decode:\n"
        "      tokens:\n" + toks + "        - {pos: 0, seq: [1]}\n"
    )


SPLIT_101 = scenario(_hundred_and_one(512))
SPLIT_101_SMALL = scenario(_hundred_and_one(32))


def test_s3_split_equal_100_plus_1(engine: str) -> None:
    """ENGINE.md §3: 100 tokens of seq 0 and 1 of seq 1: a 2-token ubatch (one of each,
    seq 0's first), then 99. n_new_g of ubatch 0 = max(0, 1, min(2//4 + 2, 63, 64)) = 2:
    padding rows 0, 1. Ubatch 1: 25 pools (pos 0-3 = cells 0, 2, 3, 4), all touched,
    n_new_g = max(25, 1, min(99//4 + 1, pad(25) - 1, 64)) = 25."""
    ub0, ub1 = ubatches(run(SPLIT_101, engine))
    assert ub0.token_seqs == ((0,), (1,)) and ub0.token_pos.tolist() == [0, 0]
    assert ub0.token_rows.tolist() == [0, 1]
    assert ub0.n_new == 0 and ub0.n_new_g == 2 and ub0.scatter_rep.tolist() == [0, 1]
    assert ub1.n_tokens == 99 and ub1.token_pos.tolist() == list(range(1, 100))
    assert ub1.stale_batch == {} and ub1.batch_ubatch == 1
    assert ub1.n_new == 25 and ub1.n_new_g == 25
    assert ub1.scatter_rows.tolist()[0] == [0, 2, 3, 4]


def test_s3_split_equal_100_plus_1_small_ubatches() -> None:
    """ENGINE.md §3: with n_ubatch 32 the 99 remaining tokens go 32 at a time."""
    sizes = [u.n_tokens for u in ubatches(run(SPLIT_101_SMALL))]
    assert sizes == [2, 32, 32, 32, 3]


SPLIT_FIRST_ROUND = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 3, n_ubatch: 2}
ops:
  - decode:
      tokens:
        - {pos: 0, seq: [0]}
        - {pos: 0, seq: [1]}
        - {pos: 0, seq: [2]}
        - {pos: 1, seq: [0]}
""")


def test_s3_split_equal_first_round_is_unconditional() -> None:
    """Research (ENGINE.md §3 refined): 3 sets are collected (collection stops once more
    than n_ubatch = 2 are), and the first lock-step round is taken before the size
    check: a 3-token ubatch, then seq 0's second token."""
    ub0, ub1 = ubatches(run(SPLIT_FIRST_ROUND))
    assert ub0.token_seqs == ((0,), (1,), (2,)) and ub1.token_seqs == ((0,),)
    assert ub0.n_new_g == max(0, 1, min(3 // 2 + 3, 63, 24))


SPLIT_LOCKSTEP = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 2, n_seq_max: 2, n_ubatch: 4}
ops:
  - decode:
      tokens:
        - {pos: 0, seq: [1]}
        - {pos: 0, seq: [0]}
        - {pos: 1, seq: [0]}
        - {pos: 2, seq: [0]}
        - {pos: 1, seq: [1]}
        - {pos: 2, seq: [1]}
        - {pos: 3, seq: [0]}
        - {pos: 4, seq: [0]}
        - {pos: 3, seq: [1]}
        - {pos: 4, seq: [1]}
""")


def test_s3_split_equal_lock_step_rounds() -> None:
    """ENGINE.md §3: sets in batch order ({1} first), one token of each per round while
    another round stays within n_ubatch = 4: 4, 4, 2 tokens, each ubatch listing the
    first set's tokens, then the second's."""
    ubs = ubatches(run(SPLIT_LOCKSTEP))
    assert [u.n_tokens for u in ubs] == [4, 4, 2]
    assert ubs[0].token_seqs == ((1,), (1,), (0,), (0,))
    assert ubs[0].token_pos.tolist() == [0, 1, 0, 1]
    assert ubs[2].token_pos.tolist() == [4, 4]


SPLIT_SEQUENTIAL = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 3, unified: false}
ops:
  - decode:
      tokens:
        - {pos: 0, seq: [0]}
        - {pos: 0, seq: [2]}
        - {pos: 1, seq: [0]}
        - {pos: 1, seq: [2]}
  - decode:
      tokens:
        - {pos: 2, seq: [2]}
        - {pos: 0, seq: [1]}
        - {pos: 2, seq: [0]}
""")


def test_s3_split_equal_sequential_needs_consecutive_seq_ids() -> None:
    """ENGINE.md §3 (non-unified, sequential): a set joins only if its first seq id is
    the previous one's + 1. Seqs 0 and 2: two ubatches. Batch order 2, 1, 0: {2} is
    collected first and neither 1 nor 0 is 3, so {2}; then {1} (0 is not 2); then {0}.
    Stream 2's cells are global rows 32, 33."""
    ubs = ubatches(run(SPLIT_SEQUENTIAL))
    assert [u.token_seqs for u in ubs[:2]] == [((0,), (0,)), ((2,), (2,))]
    assert [u.token_seqs for u in ubs[2:]] == [((2,),), ((1,),), ((0,),)]
    assert ubs[1].token_rows.tolist() == [32, 33]


def test_llama_batch_allocr_split_equal_sequential_takes_a_passed_over_seq() -> None:
    """llama_batch_allocr::split_equal, sequential (non-unified cache): the walk tries
    every unused token, so seq 2, passed over at its first token (2 is not 0 + 1), is
    taken at its second (after seq 1): the first ubatch holds seqs 0, 1 and 2, one
    token each, seq 2's being its first (pos 0); pos 1 of seq 2 is the second ubatch.
    Non-unified: seq s's cells are stream s's, global rows 8 * s + cell."""
    ubs = ubatches(run(scenario("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 3, unified: false}
ops:
  - decode:
      tokens:
        - {pos: 0, seq: [0]}
        - {pos: 0, seq: [2]}
        - {pos: 0, seq: [1]}
        - {pos: 1, seq: [2]}
""")))
    assert [u.token_seqs for u in ubs] == [((0,), (1,), (2,)), ((2,),)]
    assert ubs[0].token_pos.tolist() == [0, 0, 0]
    assert ubs[0].token_rows.tolist() == [0, 8, 16]
    assert ubs[1].token_rows.tolist() == [17]


def test_s3_split_equal_overlapping_sets_go_to_separate_ubatches() -> None:
    """ENGINE.md §3: {0, 1} and {0} overlap: not collected together."""
    ubs = ubatches(run(scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
ops:
  - decode:
      tokens:
        - {pos: 0, seq: [0, 1]}
        - {pos: 1, seq: [0]}
        - {pos: 1, seq: [1]}
""")))
    assert [u.token_seqs for u in ubs] == [((0, 1),), ((0,), (1,))]


# =====================================================================================
# §6 n_new_g and §7 padding rows
# =====================================================================================

PAD_ROWS = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 3}
ops:
  - decode: {seq: 0, pos: 0..4}
  - decode: {seq: 1, pos: 0..2}
  - decode:
      tokens:
        - {pos: 4, seq: [0]}
        - {pos: 2, seq: [1]}
        - {pos: 0, seq: [2]}
""")


def test_s6_s7_n_new_g_and_padding_rows_skip_rep_rows(engine: str) -> None:
    """ENGINE.md §6: n_new_g = max(n_new, 1, min(n_tokens // kpool + n_seqs_unq,
    pad(n_pool_real) - 1, kv_size // kpool * n_seq_max)); §7: padding entries take the
    smallest global rows that are no real pool's rep, one row each, members = the row.
    Seq 1's decode: n_new 1, n_new_g = max(1, 1, min(2//2 + 1, 63, 24)) = 2, padding row
    0. The 3-sequence decode marks nothing: n_new_g = min(3//2 + 3, 63, 24) = 4,
    padding rows 0, 2, 4, 6 (1, 3, 5 are reps)."""
    ub1, ub2 = ubatches(run(PAD_ROWS, engine))[1:]
    assert marked(ub1) == [(1, 0)] and ub1.n_new_g == 2
    assert ub1.scatter_rep.tolist() == [5, 0]
    assert ub2.token_rows.tolist() == [6, 7, 8]
    assert ub2.n_pool_real == 3 and ub2.n_new == 0 and ub2.n_new_g == 4
    assert ub2.scatter_rep.tolist() == [0, 2, 4, 6]
    assert ub2.scatter_rows.tolist() == [[0, 0], [2, 2], [4, 4], [6, 6]]
    assert ub2.scatter_pad.tolist() == [True] * 4
    assert not codes(ub2)


def test_s6_n_new_g_is_capped_by_n_pool_max() -> None:
    """ENGINE.md §6: kv_size // kpool * n_seq_max = 8 // 4 * 1 = 2 caps the bound
    8 // 4 + 1 = 3: no padding entry."""
    ub = ubatches(run(scenario("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 4}
ops:
  - decode: {seq: 0, pos: 0..8}
""")))[0]
    assert ub.n_new == 2 and ub.n_new_g == 2 and ub.scatter_rep.tolist() == [3, 7]


PAD_ABORT = scenario("""
kpool_trace: 1
cache: {kv_size: 4, kpool: 2, n_seq_max: 4}
ops:
  - decode: {seq: 0, pos: 0..2}
  - seq_cp: {src: 0, dst: 1}
  - seq_cp: {src: 0, dst: 2}
  - seq_cp: {src: 0, dst: 3}
  - decode:
      tokens:
        - {pos: 2, seq: [0]}
        - {pos: 2, seq: [1, 2, 3]}
  - decode: {seq: 0, pos: 3}
""")


def test_s7_padding_running_out_of_rows_aborts() -> None:
    """ENGINE.md §7: rep-once marks seq 1's stale pool (row 1) once; n_new_g =
    max(1, 1, min(2//2 + 4, 63, 4//2 * 4)) = 5 needs 4 padding rows, but only rows 0, 2,
    3 are no rep: GGML_ASSERT, KP005, the replay stops."""
    recs = run(PAD_ABORT, "rep-once")
    ub = recs[-1]
    assert isinstance(ub, UbatchRecord) and ub.aborted and ub.op == 4
    assert "KP005" in codes(ub)


def test_s6_cache_safe_repool_all_sizes_the_list_to_n_new() -> None:
    """ENGINE.md §6: cache-safe re-pooling everything uses n_new_g = max(n_new, 1): 4
    pools on row 1, no padding (so no abort), KP001 on row 1."""
    ub = ubatches(run(PAD_ABORT, "cache-safe"))[1]
    assert ub.n_new == ub.n_new_g == 4 and not ub.aborted
    assert ub.scatter_rep.tolist() == [1, 1, 1, 1]
    assert findings(ub, "KP001")[0].rows == (1,)


# =====================================================================================
# §3 "The memory update": llama_context::memory_update before init_batch
# =====================================================================================

MEMORY_UPDATE_HEALS = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..10}
  - seq_cp: {src: 0, dst: 1}
  - seq_rm: {seq: 1, p0: 5, p1: 6}
  - decode: {seq: 0, pos: 10}
  - seq_add: {seq: 0, p0: -1, p1: -1, shift: -5}
  - decode: {seq: 1, pos: 5..10}
  - decode: {seq: 0, pos: 6}
""")


def test_llama_context_memory_update_rebuilds_a_sequence_that_lost_shared_cells(
        engine: str) -> None:
    """ENGINE.md §3 "The memory update" and §5: seq 1's layout (rebuilt after its
    seq_rm, op 3) holds pos 0..4, 6..9 on cells 0..4, 6..9. The shift of seq 0 by -5
    empties cells 0..4 (for seq 1 too) and moves cells 6..9 to pos 1..4; seq 1 is not
    staled, and the shift is pending. The decode of seq 1 (op 5) is valid (its max pos
    is 4), so llama_context::memory_update runs it and init_full's layout update:
    seq 1, clean, has pos_min 0 against its cells' first pos 1 (no append), 9 pairs
    against 4 cells: rebuilt, pos 1..4 on cells 6..9. Only then are its tokens (pos
    5..9) written, on cells 0..4 (head 0: the shift freed cell 0 first), and its
    ubatch's update appends them after (4, cell 9): 9 pairs, 9 cells, two pools (rep
    cells 9 and 3). No drift, and the first token is found: before the memory update
    was modelled, kpool appended nothing there (the tokens sort before the stale last
    pair (9, 9), and 9 pairs met 9 cells), left seq 1 drifted (KP007) and aborted
    (KP005) on its first token."""
    recs = run(MEMORY_UPDATE_HEALS, engine)
    ub = [r for r in ubatches(recs) if r.op == 5]
    assert len(ub) == 1 and not ub[0].aborted
    assert ub[0].token_rows.tolist() == [0, 1, 2, 3, 4]
    assert not codes(recs) & {"KP005", "KP007"}
    rp = Replayer(load_trace_text(MEMORY_UPDATE_HEALS), VERSIONS[engine])
    for rec in rp.run():
        if getattr(rec, "op", None) == 5:
            break
    sq = rp.layout.seqs[1]
    assert list(zip(sq.pos.tolist(), sq.cells.tolist(), strict=True)) == [
        (1, 6), (2, 7), (3, 8), (4, 9), (5, 0), (6, 1), (7, 2), (8, 3), (9, 4)]
    assert sq.rep_rows.view.tolist() == [9, 3]


MEMORY_UPDATE_CACHE_SAFE = scenario("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 4, n_seq_max: 3}
ops:
  - decode: {seq: 0, pos: 0..9}
  - decode: {seq: 2, pos: 0..5}
  - seq_cp: {src: 0, dst: 1}
  - seq_add: {seq: 1, p0: 8, p1: -1, shift: 1}
  - decode: {seq: 2, pos: 5..13}
  - seq_rm: {seq: 1, p0: -1, p1: -1}
  - decode: {seq: 2, pos: 5}
""")


def test_llama_context_memory_update_recomputes_cache_safe_before_a_refused_decode() -> None:
    """ENGINE.md §3 "The memory update", §4 (cache-safe) and §5: seq 0 holds cells
    0..8 (pos 0..8), seq 2 cells 9..13 (pos 0..4); the last update saw no shared cell.
    seq_cp 0 -> 1 shares cells 0..8 (staling seqs 0 and 1), and seq_add moves cell 8
    (pos 8 -> 9): a K-shift is pending. The decode of 8 tokens of seq 2 (op 4) is
    valid, so its memory update runs the layout update first: seqs 0 and 1 are
    rebuilt and the sharing scan finds their shared cells (`cache_safe` false); then
    find_slot finds 2 free cells of 16 and the decode is refused (KP006). The
    whole-range seq_rm of seq 1 (op 5) then reads a shared layout and stales every
    sequence from 0, seq 2 included. The last decode (op 6) marks seq 0's two pools and
    seq 2's one: 3 pools. Before the memory update was modelled, the layout's flag
    was the last ubatch's (no sharing): op 5 staled seqs 0 and 1 alone, and 2 pools
    were marked."""
    recs = run(MEMORY_UPDATE_CACHE_SAFE, "cache-safe")
    refused = [e for e in events(recs) if e.op == 4]
    assert len(refused) == 1 and refused[0].status == "rejected" and codes(refused[0]) == {
        "KP006"}
    (rm,) = [e for e in events(recs) if e.op == 5]
    assert rm.stale == {0: 0, 1: 0, 2: 0}
    last = ubatches(recs)[-1]
    assert last.op == 6 and last.stale_batch == {0: 0, 1: 0, 2: 0}
    assert marked(last) == [(0, 0), (0, 1), (2, 0)] and last.n_new == 3


MEMORY_UPDATE_DRIFTS = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..8}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: 1, pos: 8}
  - seq_add: {seq: 0, p0: 4, p1: 8, shift: 100}
  - decode: {seq: 0, pos: 108..132}
  - seq_add: {seq: 0, p0: 104, p1: -1, shift: -100}
  - decode: {seq: 0, pos: 8}
""")


def test_llama_context_memory_update_drifts_a_layout_at_a_refused_decode() -> None:
    """ENGINE.md §3 "The memory update", §5 and §8 (KP007), rep-once: seq 1 holds
    cells 0..7 (shared with seq 0, pos 0..7) and cell 8 (pos 8). seq_add moves cells
    4..7 to pos 104..107, for seq 1 too, which is not staled. The decode of 24 tokens
    (op 4) is valid; its memory update appends seq 1's pairs past (8, cell 8), (104, 4)
    .. (107, 7): 13 pairs against 9 cells, so seq 1 is rebuilt from its cells as they
    are now; then find_slot finds 23 free cells and refuses it (KP006). The second
    seq_add moves cells 4..7 back to pos 4..7. The next decode's memory update finds
    seq 1's pairs (0..3, 8, 104..107) with the same pos_min and nothing past (107, 7)
    to append: 9 pairs, 9 cells, no rebuild. The engine goes on with the drifted
    layout: KP007 at op 6, whose first differing pair is index 4. Before the memory
    update was modelled, seq 1 kept its first layout, which the cells match again."""
    recs = run(MEMORY_UPDATE_DRIFTS, "rep-once")
    assert [e.status for e in events(recs) if e.op == 4] == ["rejected"]
    last = ubatches(recs)[-1]
    assert last.op == 6 and not last.aborted
    (kp7,) = findings(last, "KP007")
    assert kp7.seqs == (1,)
    assert "pair 4 is (pos 8, cell 8) but the cells say (pos 4, cell 4)" in kp7.message


def test_a_memory_updates_change_and_its_ubatchs_read_as_one() -> None:
    """engine/layout.py `LayoutChange.then`, by hand: the memory update kept 3 pools of
    seq 0 and 5 of seq 1, the ubatch's update 4 and 2 of what that left: the pools both
    kept are the first 3 and 2; the sequences either read or changed; both updates'
    cells; the later serial (so a reader keyed on the one before sees a gap)."""
    first = LayoutChange((3, 5), frozenset({0}), frozenset({0}), 7, 4)
    later = LayoutChange((4, 2), frozenset({1}), frozenset(), 2, 5)
    assert first.then(later) == LayoutChange((3, 2), frozenset({0, 1}), frozenset({0}), 9, 5)
    assert LayoutChange.joined(None, later) is later
    assert LayoutChange.joined(first, later) == first.then(later)


def test_no_memory_update_runs_without_a_pending_shift_or_copy() -> None:
    """ENGINE.md §3 "The memory update": a refused decode after edits that move no cell
    (a seq_rm, a zero shift) leaves the layout as the last ubatch left it: the trace
    above with its seq_add shifts made zero refuses the same decode and shows no drift,
    and its layout is updated only at ubatches (the layout's update count)."""
    text = MEMORY_UPDATE_DRIFTS.replace("shift: 100}", "shift: 0}").replace(
        "shift: -100}", "shift: 0}").replace("pos: 108..132", "pos: 8..32")
    rp = Replayer(load_trace_text(text), REP_ONCE)
    recs = list(rp.run())
    assert [e.status for e in events(recs) if e.op == 4] == ["rejected"]
    assert not codes(recs) & {"KP007"}
    assert rp.layout.n_updates == len(ubatches(recs)) == 3


# =====================================================================================
# §4: the staleness table, edit by edit
# =====================================================================================

STALE_BASE = """
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2, n_rs_seq: 3}
ops:
  - decode: {seq: 0, pos: 0..8}
  - decode: {seq: 1, pos: 0..4}
  - state_write: {seq: 0, slot: a}
"""


@pytest.mark.parametrize(("edit", "rep_once", "cache_safe"), [
    ("seq_rm: {seq: 0, p0: 5, p1: -1}", {0: 5}, {0: 5}),
    ("seq_rm: {seq: 0, p0: -1, p1: 5}", {0: 0}, {0: 0}),
    ("seq_rm: {seq: 0, p0: 0, p1: 5}", {0: 0}, {0: 0}),
    ("seq_cp: {src: 0, dst: 1}", {1: 0}, {0: 0, 1: 0}),
    ("seq_keep: {seq: 1}", {0: 0, 1: 0}, {0: 0, 1: 0}),
    ("seq_add: {seq: 0, p0: 4, p1: -1, shift: -2}", {0: 2}, {0: 2}),
    ("seq_add: {seq: 0, p0: 4, p1: -1, shift: -4}", {0: 0}, {0: 0}),
    ("seq_add: {seq: 0, p0: 4, p1: -1, shift: 3}", {0: 4}, {0: 4}),
    ("seq_add: {seq: 0, p0: 20, p1: -1, shift: 3}", {0: 20}, {0: 20}),
    ("seq_div: {seq: 0, p0: 4, p1: -1, d: 2}", {0: 0}, {0: 0}),
    ("clear: {}", {0: 0, 1: 0}, {0: 0, 1: 0}),
    ("state_read: {seq: 1, slot: a}", {1: 0}, {1: 0}),
    ("state_drop: {seq: 0}", {0: 0}, {0: 0}),
    ("state_write: {seq: 1, slot: b}", {}, {}),
])
def test_s4_staleness_table(engine: str, edit: str, rep_once: dict, cache_safe: dict) -> None:
    """ENGINE.md §4: stale_pos(s, p0) = 0 if p0 <= seq_pos_min(s) (or s < 0), else p0,
    (seq_rm 5.. rolls seq 0's last 3 tokens back: n_rs_seq 3, ENGINE.md §3)
    taken before the edit; seq_add uses p0 + shift when shift < 0 (4 - 2 = 2; 4 - 4 =
    0 <= pos_min), even when nothing moved (p0 20). No sharing here, so cache-safe
    differs only for seq_cp (it stales the source too)."""
    st = steps(STALE_BASE + f"  - {edit}\n", engine)
    ev, state = st[-1]
    want = rep_once if engine == "rep-once" else cache_safe
    assert ev.status == APPLIED and ev.stale == want
    assert {s: p for s, p in enumerate(state["stale"]) if p != C} == want


STALE_UB = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_ubatch: 4, n_rs_seq: 2}
ops:
  - decode: {seq: 0, pos: 0..8}
  - seq_rm: {seq: 0, p0: 6, p1: -1}
  - decode: {seq: 0, pos: 6..11}
""")


def test_s4_only_ubatch_0_uses_the_stale_snapshot(engine: str) -> None:
    """ENGINE.md §4: stale_batch is taken when the batch starts and used by ubatch 0
    only; after ubatch 0 every stale[s] is CLEAN. The split (§3, n_keep_tail = n_rs_seq
    + 1 = 3): ubatch 0 collects pos 6..9, leaving 1 token (< 3), so it gives 9 and 8
    back. Ubatch 0 (pos 6, 7) rebuilds pool 1 (pos 4-7, rep pos 7 >= 6: marked);
    ubatch 1 (pos 8, 9, 10) would re-mark it if it used the snapshot, and does not."""
    st = steps(STALE_UB, engine)
    (ub0, _), (ub1, s1) = by_op(st, 2)
    assert ub0.stale_batch == {0: 6} and marked(ub0) == [(0, 1)]
    assert ub1.stale_batch == {} and ub1.n_new == 0
    assert s1["stale"] == [C]
    assert ub1.token_rows.tolist() == [8, 9, 10]


# =====================================================================================
# §3 a decode larger than its stream
# =====================================================================================

OVERSIZED = scenario("""
kpool_trace: 1
cache: {kv_size: 96, kpool: 4, n_seq_max: 2, unified: false}
ops:
  - decode: {seq: 0, pos: 0..102}
  - decode: {seq: 0, pos: 0..8}
""")


def test_llama_kv_cache_prepare_refuses_a_decode_larger_than_its_stream(engine: str) -> None:
    """Research (docs/ENGINE-NOTES.md): 102 tokens of seq 0 in its stream's 96 cells,
    on a non-unified cache of two streams (n_ctx 192, so n_batch may be 192: the
    assert on it passes). llama_decode validates the batch (pos 0, the sequence is
    empty: accepted), splits it, and llama_kv_cache::prepare finds no room for the
    whole: init_batch logs "failed to prepare attention ubatches", llama_decode
    "failed to find a memory slot for batch of size 102" and returns 1. KP006; the
    server goes on: the next decode runs (stream 0's cells 0..7)."""
    st = steps(OVERSIZED, engine)
    ev = st[0][0]
    assert isinstance(ev, OpEvent) and ev.status == REJECTED and codes(ev) == {"KP006"}
    assert ev.message == (
        "failed to find a memory slot for batch of size 102 (init_batch: failed to prepare "
        "attention ubatches): its tokens need 102 cells of stream 0 (sequence 0's own), "
        "which has 96")
    assert st[1][0].token_rows.tolist() == list(range(8))


PAST_THE_CONTEXT = scenario("""
kpool_trace: 1
cache: {kv_size: 96, kpool: 4}
ops:
  - decode: {seq: 0, pos: 0..102}
  - decode: {seq: 0, pos: 0..8}
""")


@pytest.mark.parametrize("text, n, n_ctx, streams", [
    (PAST_THE_CONTEXT, 102, 96, "1 stream"),
    # non-unified: n_ctx = n_ctx_seq (kv_size) x n_seq_max = 8 x 2
    ("kpool_trace: 1\ncache: {kv_size: 8, kpool: 2, n_seq_max: 2, unified: false}\n"
     "ops:\n  - decode: {seq: 1, pos: 0..17}\n", 17, 16, "2 streams"),
])
def test_llama_context_decode_asserts_a_batch_past_the_context(
        engine: str, text: str, n: int, n_ctx: int, streams: str) -> None:
    """docs/ENGINE-NOTES.md "a decode larger than its stream": llama_context::decode
    asserts `n_tokens_all <= cparams.n_batch` once the batch is valid, and the
    context's constructor caps n_batch at n_ctx (causal attention), n_ctx being the
    cache's cells over its streams (src/llama-context.cpp). 102 tokens in a unified
    cache of 96 cells (17 in two streams of 8) pass validation (the sequence is empty)
    and abort: KP005, before the memory update and the split; nothing is placed and
    the replay ends."""
    st = steps(text, engine)
    assert len(st) == 1
    ev, state = st[0]
    assert isinstance(ev, OpEvent) and ev.status == ABORTED and codes(ev) == {"KP005"}
    assert ev.message == (
        f"GGML_ASSERT(n_tokens_all <= cparams.n_batch): a batch of {n} tokens, more than "
        f"the context's {n_ctx} cells (kv_size {n_ctx // int(streams[0])} x {streams}), "
        "which bound n_batch: llama_decode aborts")
    assert all(p == -1 for stream in state["cells"] for p, _ in stream)


PAST_N_BATCH = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_ubatch: 8, n_batch: 6}
ops:
  - decode: {seq: 0, pos: 0..6}
  - decode: {seq: 0, pos: 6..13}
""")


def test_llama_context_decode_asserts_a_batch_past_n_batch(engine: str) -> None:
    """ENGINE.md §3: the context's constructor (`llama_context::llama_context`, src/
    llama-context.cpp) takes cparams.n_batch = min(n_ctx 32, params.n_batch 6) = 6 and
    cparams.n_ubatch = min(6, 8) = 6. A decode of 6 tokens (pos 0..5) passes
    `GGML_ASSERT(n_tokens_all <= cparams.n_batch)`: one ubatch, cells 0..5, pool 0 (pos
    0..3, rep row 3) touched and marked. A decode of 7 (pos 6..12) is past it:
    llama_decode aborts (KP005) before the memory update, nothing placed, the replay
    ends. The trace's n_batch names the bound; the context's 32 cells do not."""
    st = steps(PAST_N_BATCH, engine)
    assert len(st) == 2
    ub, state = st[0]
    assert ub.token_rows.tolist() == [0, 1, 2, 3, 4, 5] and ub.n_new == 1
    ev, after = st[1]
    assert isinstance(ev, OpEvent) and ev.status == ABORTED and codes(ev) == {"KP005"}
    assert ev.message == ("GGML_ASSERT(n_tokens_all <= cparams.n_batch): a batch of 7 "
                          "tokens, more than n_batch (6, cache.n_batch): llama_decode "
                          "aborts")
    assert after["cells"] == state["cells"]


N_UBATCH_CAPPED = scenario("""
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_ubatch: 8, n_batch: 4, n_rs_seq: 3}
ops:
  - decode: {seq: 0, pos: 0..3}
""")


def test_llama_context_caps_n_ubatch_at_n_batch(engine: str) -> None:
    """ENGINE.md §3: cparams.n_ubatch = min(cparams.n_batch, params.n_ubatch) =
    min(4, 8) = 4 (`llama_context::llama_context`). With n_rs_seq 3 the split keeps
    n_keep_tail = 4 tokens together and asserts `n_ubatch > n_keep_tail`: 4 > 4 fails,
    the decode of 3 tokens aborts (KP005). The trace's n_ubatch 8 alone would pass
    (docs/ENGINE-NOTES.md, "Not followed": a build that raises both to n_rs_seq + 2
    would too)."""
    st = steps(N_UBATCH_CAPPED, engine)
    ev, _ = st[0]
    assert isinstance(ev, OpEvent) and ev.status == ABORTED and codes(ev) == {"KP005"}
    assert "n_ubatch 4 cannot keep the 4 trailing tokens" in ev.message
    assert steps(N_UBATCH_CAPPED.replace(", n_batch: 4", ""), engine)[0][0].n_new == 0


PAST_THE_CONTEXT_WITH_A_COPY = """
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 2, unified: false}
ops:
  - decode: {seq: 0, pos: 0..4}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: 1, pos: 4..21}
"""


def test_llama_context_decode_asserts_before_the_memory_update(engine: str) -> None:
    """The assert comes before `memory_update(false)` in llama_context::decode: the
    stream copy that seq_cp queued (stream 0 to 1) is still queued when the 17-token
    decode of seq 1 (the context: 2 x 8) aborts, and no layout update ran for it."""
    last = [(rec, rp) for rec, rp in drive(PAST_THE_CONTEXT_WITH_A_COPY, engine)
            if rec.op == 2]
    assert len(last) == 1
    rec, rp = last[0]
    assert isinstance(rec, OpEvent) and rec.status == ABORTED
    assert rp.cache.pending_copies == [(0, 1)]
    assert rp.layout.n_updates == 1  # the first decode's only


HEAD_QUIRK_SPAN = scenario("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 2, unified: false, n_ubatch: 4}
ops:
  - decode: {seq: 0, pos: 0..5}
  - decode: {seq: 1, pos: 0..3}
  - decode: {seq: 1, pos: 3..12}
  - decode: {seq: 1, pos: 3}
""")


def test_llama_kv_cache_prepare_of_a_decode_larger_than_its_stream_moves_the_head(
        engine: str) -> None:
    """Stream 0: cells 0-4, head 5; stream 1: cells 0-2, head 3, 5 free. Seq 1's 9
    tokens (pos 3..12) cannot fit 8 cells: KP006, decided from the range's ends. But
    prepare placed the first ubatch (4 tokens <= 5 free) before failing, and its undo
    sets `head = v_heads_old[s]` with s = 0: stream 1 gets stream 0's head, 5
    (test_failed_prepare_head_quirk). The next token of seq 1: find_slot from head 5
    (5 <= used 3 + 2: no restart) takes cell 5, row 8 + 5 = 13 (with head 3: 11)."""
    st = steps(HEAD_QUIRK_SPAN, engine)
    ((ev, state),) = by_op(st, 2)
    assert isinstance(ev, OpEvent) and codes(ev) == {"KP006"}
    assert "stream 1 (sequence 1's own), which has 8" in ev.message
    assert state["head"] == [5, 5]
    assert by_op(st, 3)[0][0].token_rows.tolist() == [13]


def test_a_decode_larger_than_its_stream_whose_first_ubatch_does_not_fit_moves_nothing(
) -> None:
    """Stream 1 holds 6 of 8 cells (head 6): the first ubatch of the 9-token decode (4
    tokens) finds only 2 free cells, so prepare places nothing and no head moves."""
    text = HEAD_QUIRK_SPAN.replace("pos: 0..3}", "pos: 0..6}").replace(
        "pos: 3..12}", "pos: 6..15}").replace("pos: 3}\n", "pos: 6}\n")
    st = steps(text)
    ((ev, state),) = by_op(st, 2)
    assert codes(ev) == {"KP006"} and state["head"] == [5, 6]
    assert by_op(st, 3)[0][0].token_rows.tolist() == [8 + 6]


def test_kp002_conflicts_kept_from_updates_equal_the_condition_over_the_layout() -> None:
    """ENGINE.md §8 KP002: `Conflicts`, fed each ubatch's LayoutChange, equals
    `conflicts(layout)` recomputed from every pool, after every ubatch of the shipped,
    found and 150 random traces
    (shared prefixes, partial copies, edits that regroup) under every engine; and a
    layout of one sequence has none (`Check` asks nothing of it)."""
    from kpool_cli.gen.random_trace import random_trace
    from kpool_cli.replay import Replayer
    from kpool_cli.trace.load import load_trace
    from kpool_cli.verdict.rules.kp002_rep_conflict import Conflicts, conflicts

    root = Path(__file__).resolve().parent.parent / "traces"
    paths = sorted(root.glob("*.yaml")) + sorted(root.glob("found/*.yaml"))
    shipped = [load_trace(p) for p in paths]
    seen_conflict = seen_one = 0
    for seed, t in enumerate([*shipped, *(random_trace(seed) for seed in range(150))]):
        for name in VERSIONS:
            tracked = Conflicts()

            def look(rec, ctx, tracked=tracked, where=(seed, name)) -> None:
                nonlocal seen_conflict, seen_one
                tracked.update(ctx.layout, ctx.change)
                want = conflicts(ctx.layout)
                assert tracked.now() == want, (where, rec.index)
                seen_conflict += bool(want)
                if len(ctx.layout.seqs) == 1:
                    assert not want, (where, rec.index)
                    seen_one += ctx.layout.n_pool_real > 1

            for _ in Replayer(t, VERSIONS[name], observer=look).run():
                pass
    assert seen_conflict > 10  # ubatches with a conflict: the traces reach the condition
    assert seen_one > 100  # ubatches of one sequence with pools to share a row


NOOP_RM = """
kpool_trace: 1
cache: {{kv_size: 8, kpool: 2, n_seq_max: 1}}
ops:
  - decode: {{seq: 0, pos: 0..4}}
  - seq_rm: {{seq: {seq}, p0: 2, p1: 2}}
  - decode: {{seq: 0, pos: 4}}
"""
scenario(NOOP_RM.format(seq=-1))


@pytest.mark.parametrize("base", ["rep-once", "cache-safe"])
@pytest.mark.parametrize("seq", [0, -1])
def test_llama_qsa_noop_inspect_skips_the_staleness_of_a_seq_rm_of_seq_0_only(
        base: str, seq: int) -> None:
    """Research (docs/ENGINE-NOTES.md, "the no-op seq_rm of one sequence"):
    ariera-j/llama.cpp-evox2-windows `src/llama-qsa-noop-policy.h` at 8f421386,
    `llama_qsa_noop::inspect`, returns `d.eligible && sequence == 0 && !shared && ...`,
    and `llama_memory_hybrid_idx::seq_rm` (`src/llama-memory-hybrid-idx.cpp`, same
    commit) suppresses the staleness only of an inspected seq_rm; a seq_rm(-1) is never
    inspected and stales as on the base.

    One sequence, kpool 2: pos 0..3 on cells 0..3 make pools pos 0-1 (rep row 1) and
    2-3 (rep row 3). seq_rm(s, 2, 2) removes nothing (the range [2, 2) is empty; the
    recurrent child takes an empty range for -1 too). The next token, pos 4 on cell 4,
    is in no complete pool.
    - s = 0: stale_pos(0, 2) = 2 (> pos_min 0). The bases stale seq 0 from 2 and mark
      pool 1 (rep pos 3 >= 2): n_new 1, n_new_g = max(1, 1, min(1 // 2 + 1, 63, 8 // 2))
      = 1, row 3. The patch (the fork: inspected, 4 cells before and after) stales
      nothing: n_new 0, n_new_g 1, one padding entry on row 0 (no rep).
    - s = -1: stale_pos(-1, 2) = 0 and stale_set(-1, 0): seq 0 from 0, under the patch
      too (kpool skipped it): both pools, n_new 2, n_new_g = max(2, 1, 1) = 2, rows
      1, 3, no padding. kpool's `noop-seq-rm` (the general question, no fork's gate)
      still skips it."""
    patched = f"{base}+noop-seq-rm-one-seq"
    text = NOOP_RM.format(seq=seq)
    for engine in (base, patched, f"{base}+noop-seq-rm"):
        recs = run(text, engine)
        ev, ub = events(recs)[0], ubatches(recs)[1]
        assert ev.status == APPLIED
        skipped = engine != base and (seq == 0 or engine.endswith("+noop-seq-rm"))
        if skipped:
            assert (ev.stale, ub.stale_batch) == ({}, {}), engine
            assert (ub.n_new, ub.n_new_g) == (0, 1), engine
            assert ub.scatter_rep.tolist() == [0] and ub.scatter_pad.tolist() == [True]
        elif seq == 0:
            assert (ev.stale, ub.stale_batch) == ({0: 2}, {0: 2}), engine
            assert marked(ub) == [(0, 1)] and ub.n_new_g == 1, engine
            assert ub.scatter_rep.tolist() == [3] and ub.scatter_pad.tolist() == [False]
        else:
            assert (ev.stale, ub.stale_batch) == ({0: 0}, {0: 0}), engine
            assert marked(ub) == [(0, 0), (0, 1)] and ub.n_new_g == 2, engine
            assert ub.scatter_rep.tolist() == [1, 3] and not ub.scatter_pad.any()
        assert not codes(recs), engine
