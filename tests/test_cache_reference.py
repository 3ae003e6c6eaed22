"""kpool's replay against the independent §2-§4 reference (tests/ref_cache.py).

Side by side, record by record (every event, every ubatch), for both engine versions:
- the records themselves: kind, op, status, stale positions an event set
  (`OpEvent.stale`), which decodes are refused (KP006), which seq_rm the recurrent
  child refuses (KP008) and what aborts (KP005), each
  ubatch's placement (`token_rows`, `token_pos`, `token_seqs`) and `stale_batch`;
- the state after each record: every stream's cells (pos, the set of sequences, ext in
  M-RoPE traces), every head, the queued cross-stream copies, the whole stale array
  (at events), the state snapshots; the recurrent child's cells (pos, sequences),
  tails, pending rollbacks (rs_idx), head and used, and its saved states;
- what tests/reference.py compares (ENGINE.md §5-§7), here on the reference's own
  incremental layout, drifted or not: each sequence's layout (pairs and pools), marking,
  n_new_g, the scatter plan with its padding, visibility, KP001, KP002 and KP007.

Inputs: every trace of traces/*.yaml and of test_engine_rules.py, hypothesis random
traces (tests/test_reference_agreement.py's generator) and a corner generator that
steers toward the rules most easily got wrong (and checks that it reaches them).
Derandomized, so CI runs the same examples every time.
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import ref_cache as rc
from conftest import ENGINES, drive, trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine_rules import TRACES
from test_reference_agreement import draw_n_rs_seq, random_traces

from kpool_cli.cache import batch
from kpool_cli.cache.aborts import KeepTailAssert
from kpool_cli.cache.batch import split_equal
from kpool_cli.contracts.records import ExpectResult, OpEvent, UbatchRecord
from kpool_cli.trace.load import load_trace
from kpool_cli.trace.model import (
    CacheConfig,
    Clear,
    Decode,
    SeqAdd,
    SeqCp,
    SeqDiv,
    SeqKeep,
    SeqRm,
    StateDrop,
    StateRead,
    StateWrite,
    Token,
    Trace,
)

TRACE_FILES = sorted((Path(__file__).parent.parent / "traces").glob("*.yaml"))


# -- reading kpool's state through its public attributes -------------------------------------


def engine_cells(rp) -> list[list[tuple]]:
    """Per stream, per cell: (pos, frozenset of seqs), from `rp.cache.streams`."""
    out = []
    for st_ in rp.cache.streams:
        pos = st_.pos.tolist()
        seqs: list[set[int]] = [set() for _ in pos]
        for col, s in enumerate(st_.seq_ids):
            for c in np.flatnonzero(st_.has[col]).tolist():
                seqs[c].add(s)
        out.append([(p, frozenset(ss)) for p, ss in zip(pos, seqs, strict=True)])
    return out


def ref_cells(ref: rc.RefReplay) -> list[list[tuple]]:
    return [[(c.pos[i], frozenset(c.seq[i])) for i in range(c.size)]
            for c in ref.cache.v_cells]


def check_state(rp, ref: rc.RefReplay, where: str, heads: bool = True) -> None:
    cfg = ref.cfg
    got, want = engine_cells(rp), ref_cells(ref)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            diff = [(c, g[c], w[c]) for c in range(len(g)) if g[c] != w[c]]
            raise AssertionError(f"{where}: stream {k} cells differ (cell, kpool, reference): "
                                 f"{diff[:6]}")
    if cfg.by_order:
        for k, (st_, c) in enumerate(zip(rp.cache.streams, ref.cache.v_cells, strict=True)):
            live = [i for i in range(c.size) if c.pos[i] != -1]
            assert [tuple(st_.ext[i].tolist()) for i in live] == [c.ext[i] for i in live], \
                f"{where}: stream {k} ext differs"
    if heads:
        got_h = list(rp.cache.heads)
        assert got_h == ref.cache.v_heads, \
            f"{where}: heads {got_h} != reference {ref.cache.v_heads}"
    assert [tuple(p) for p in rp.cache.pending_copies] == ref.cache.sc_info, \
        f"{where}: queued stream copies {rp.cache.pending_copies} != {ref.cache.sc_info}"
    got_shift = [st_.has_shift for st_ in rp.cache.streams]
    want_shift = [c.has_shift for c in ref.cache.v_cells]
    assert got_shift == want_shift, \
        f"{where}: K-shift pending per stream {got_shift} != reference {want_shift}"
    check_recurrent(rp, ref, where)


def check_recurrent(rp, ref: rc.RefReplay, where: str) -> None:
    """The recurrent child: every cell (pos, sequences), the tails, the pending
    rollbacks, head and used (`rp.recurrent`)."""
    got, want = rp.recurrent, ref.rec
    cells = [(c.pos, frozenset(c.seqs)) for c in got.cells]
    ref_cells_ = [(want.pos[i], frozenset(want.seq[i])) for i in range(want.size)]
    assert cells == ref_cells_, \
        f"{where}: recurrent cells {cells} != reference {ref_cells_}"
    assert list(got.tail) == want.tail, f"{where}: tails {got.tail} != reference {want.tail}"
    assert list(got.rs_idx) == want.rs_idx, \
        f"{where}: rs_idx {got.rs_idx} != reference {want.rs_idx}"
    assert (got.head, got.used) == (want.head, want.used), \
        f"{where}: recurrent head, used {(got.head, got.used)} != reference " \
        f"{(want.head, want.used)}"


def check_event(rec: OpEvent, want: rc.RefEvent, rp, ref: rc.RefReplay, where: str) -> None:
    assert (rec.op, rec.kind, rec.status) == (want.op, want.kind, want.status), \
        f"{where}: {rec.kind} {rec.status} != reference {want.kind} {want.status}"
    assert rec.stale == want.stale, f"{where}: stale set {rec.stale} != reference {want.stale}"
    codes = frozenset(f.code for f in rec.findings)
    assert codes == want.codes, f"{where}: findings {set(codes)} != reference {set(want.codes)}"
    stale = list(rp.staleness.stale)
    assert stale == ref.stale, f"{where}: stale {stale} != reference {ref.stale}"
    if want.kind == "state_write":
        op = ref.trace.ops[want.op]
        assert rp.cache.snapshots[op.slot].pos.tolist() == \
            [p for p, _e in ref.cache.snapshots[op.slot]], f"{where}: snapshot differs"
        saved = ref.rec.saved[op.slot]
        assert rp.recurrent.saved[op.slot] == (saved[-1] if saved else None), \
            f"{where}: recurrent saved state {rp.recurrent.saved[op.slot]} != {saved}"


def check_ubatch(rec: UbatchRecord, want: rc.RefUbatch, rp, ref: rc.RefReplay,
                 where: str) -> None:
    assert (rec.op, rec.batch_ubatch) == (want.op, want.batch_ubatch), \
        f"{where}: ubatch {rec.batch_ubatch} of op {rec.op} != reference " \
        f"{want.batch_ubatch} of op {want.op}"
    # §3: the split and the placement
    assert list(rec.token_seqs) == want.token_seqs, \
        f"{where}: token seqs {rec.token_seqs} != reference {want.token_seqs}"
    assert rec.token_pos.tolist() == want.token_pos, f"{where}: token pos differ"
    assert rec.token_rows.tolist() == want.token_rows, \
        f"{where}: rows {rec.token_rows.tolist()} != reference {want.token_rows}"
    # §4: the batch's stale snapshot
    assert rec.stale_batch == want.stale_batch, \
        f"{where}: stale_batch {rec.stale_batch} != reference {want.stale_batch}"
    if rec.batch_ubatch > 0:
        assert all(p == rc.CLEAN for p in rp.staleness.stale), f"{where}: stale after ubatch 0"
    # §5: the incremental layout, sequence by sequence
    lay = want.layout
    for s, sq in enumerate(rp.layout.seqs):
        pairs = list(zip(sq.pos.tolist(), sq.cells.tolist(), strict=True))
        assert pairs == lay.seqs[s].pairs, f"{where}: seq {s}'s layout pairs differ"
        assert sq.pools.view.tolist() == lay.seqs[s].pools, f"{where}: seq {s}'s pools differ"
        if s not in want.drifted:
            # the reference's own incremental layout equals its from-scratch rebuild
            assert lay.seqs[s].pools == rc.ref57.scan_pools(lay.seqs[s].pairs, ref.cfg.kpool,
                                                            ref.cfg.by_order)
    assert rec.n_pool_real == lay.n_pool_real, f"{where}: n_pool_real"
    # §8: findings
    codes = frozenset(f.code for f in rec.findings)
    assert codes == want.codes, f"{where}: findings {set(codes)} != reference {set(want.codes)}"
    kp7 = {s for f in rec.findings if f.code == "KP007" for s in f.seqs}
    assert kp7 == want.kp7_seqs, f"{where}: KP007 for {kp7} != reference {want.kp7_seqs}"
    kp2 = {r for f in rec.findings if f.code == "KP002" for r in f.rows}
    assert kp2 == want.kp2_rows, f"{where}: KP002 rows {kp2} != reference {want.kp2_rows}"
    assert rec.aborted == want.aborted, f"{where}: aborted {rec.aborted} != {want.aborted}"
    if want.aborted:
        return
    # §6-§7
    plan = want.plan
    assert rec.n_new == len(want.marked), f"{where}: n_new {rec.n_new} != {len(want.marked)}"
    assert rec.scatter_pool[: rec.n_new].tolist() == want.marked, f"{where}: marked pools"
    assert rec.n_new_g == want.n_new_g, f"{where}: n_new_g {rec.n_new_g} != {want.n_new_g}"
    assert rec.scatter_rep.tolist() == plan.entry_rep, f"{where}: scatter rows"
    assert rec.scatter_rows.tolist() == plan.entry_rows, f"{where}: scatter members"
    assert rec.scatter_pad.tolist() == plan.entry_pad, f"{where}: padding entries"
    assert rec.token_visible.tolist() == plan.visible, f"{where}: visibility"


# kpool's versions the reference models, each as the reference's rules and options,
# read from the source (not from kpool): angt's f46848f is PR #29994's engine on angt's
# own kv cache, whose seq_keep empties every stream (src/llama-kv-cache.cpp, d5437c2)
REF_VERSIONS: dict[str, tuple[str, dict[str, bool]]] = {
    "rep-once": ("rep-once", {}), "cache-safe": ("cache-safe", {}),
    "angt-f46848f": ("rep-once", {"seq_keep_every_stream": True})}


def compare(t: Trace, engine: str, seen: Counter | None = None) -> Counter:
    """Replay `t` under `engine` (a version of `REF_VERSIONS`) in kpool and in the
    reference, side by side, and compare every record and the state after it. Returns
    what was seen (coverage)."""
    seen = seen if seen is not None else Counter()
    rules, options = REF_VERSIONS[engine]
    ref = rc.RefReplay(t, rules, seen, **options)
    mine = ref.run()
    got = ((rec, rp) for rec, rp in drive(t, engine) if not isinstance(rec, ExpectResult))
    for n, (pair, want) in enumerate(itertools.zip_longest(got, mine)):
        assert pair is not None, f"record {n}: kpool stopped, the reference expects {want}"
        rec, rp = pair
        where = f"record {n} (op {rec.op})"
        assert want is not None, f"{where}: the reference expects no more records, kpool " \
                                 f"yields {rec}"
        if isinstance(want, rc.RefEvent):
            assert isinstance(rec, OpEvent), f"{where}: kpool ran a ubatch, reference: {want}"
            check_event(rec, want, rp, ref, where)
            seen[f"event {want.kind} {want.status}"] += 1
        else:
            assert isinstance(rec, UbatchRecord), f"{where}: kpool yields {rec}, the " \
                                                  "reference a ubatch"
            check_ubatch(rec, want, rp, ref, where)
            seen["ubatch"] += 1
        # heads: after every event and every decode (RefCache.prepare says why not between
        # two ubatches of one decode)
        check_state(rp, ref, where, heads=isinstance(want, rc.RefEvent) or want.last)
    return seen


# -- the reference against the documented facts (independent of kpool) ------------------------


def _ref(yaml_text: str, engine: str = "rep-once") -> tuple[rc.RefReplay, list]:
    t = trace(yaml_text)
    ref = rc.RefReplay(t, engine)
    return ref, list(ref.run())


def test_reference_head_quirk_of_a_failed_prepare() -> None:
    """docs/ENGINE-NOTES.md: prepare restores `head = v_heads_old[s]`, s the index in the
    ubatch's stream list: stream 1 gets stream 0's old head (3, not its own 6)."""
    ref, recs = _ref("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 4, n_seq_max: 2, unified: false, n_ubatch: 2}
ops:
  - decode: {seq: [0], pos: 0..3}
  - decode: {seq: [1], pos: 0..6}
  - decode: {seq: [1], pos: 6..11}
""")
    assert recs[-1].status == rc.REJECTED and recs[-1].codes == {"KP006"}
    assert ref.cache.v_heads == [3, 3]
    assert ref.cache.v_cells[1].pos == [0, 1, 2, 3, 4, 5, -1, -1]


def test_reference_sequential_split_takes_a_passed_over_seq() -> None:
    """docs/ENGINE-NOTES.md: tokens of seqs 0, 2, 1, 2: one ubatch of seqs 0, 1, 2."""
    toks = tuple(Token(p, (s,)) for p, s in ((0, 0), (0, 2), (0, 1), (1, 2)))
    assert rc.split_equal(toks, 512, sequential=True) == [[0, 2, 1], [3]]
    # non-sequential: the sets in batch order (seqs 0, 2, 1), one round each
    assert rc.split_equal(toks, 512, sequential=False) == [[0, 1, 2], [3]]


def test_reference_split_equal_100_plus_1_and_the_first_round() -> None:
    """ENGINE.md §3: 100 tokens of seq 0 and 1 of seq 1 give 2 then 99 tokens;
    docs/ENGINE-NOTES.md: the first round is always taken (3 sets, n_ubatch 2)."""
    toks = (*(Token(p, (0,)) for p in range(100)), Token(0, (1,)))
    assert [len(u) for u in rc.split_equal(toks, 512, sequential=False)] == [2, 99]
    three = tuple(Token(0, (s,)) for s in range(3))
    assert rc.split_equal(three, 2, sequential=False) == [[0, 1, 2]]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(seqs=st.lists(st.integers(0, 5), min_size=1, max_size=60),
       n_ubatch=st.integers(1, 40), keep=st.integers(0, 3), sequential=st.booleans())
def test_split_equal_of_one_seq_id_a_token_agrees(seqs: list[int], n_ubatch: int,
                                                   keep: int, sequential: bool) -> None:
    """kpool's split_equal (cache/batch.py, with its shortcut for a step of parallel
    slots: each token its own sequence, and its grouping by a sort of the seq ids
    from `COLUMNS_FROM` tokens) against the reference's, on tokens of one seq id each,
    distinct or not: the same ubatches, or the same refusal or abort."""
    toks = tuple(Token(p, (s,)) for p, s in enumerate(seqs))
    for columns_from in (batch.COLUMNS_FROM, 1):  # as shipped; every batch by its columns
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(batch, "COLUMNS_FROM", columns_from)
            got, want = _both_splits(toks, n_ubatch, sequential, keep)
        if got is None:  # both aborted alike
            continue
        assert not isinstance(got, str) and want is not None
        assert [list(u.tokens) for u in got] == want
        assert [u.n_seqs_unq for u in got] == [len({seqs[i] for i in u}) for u in want]


def _both_splits(toks: tuple[Token, ...], n_ubatch: int, sequential: bool, keep: int):
    """(kpool's split_equal, the reference's) of `toks`; (None, None) once both
    abort alike (GGML_ASSERT(n_ubatch > n_keep_tail)); else the reference's is no
    abort."""
    want = rc.split_equal(toks, n_ubatch, sequential, n_keep_tail=keep)
    try:
        got = split_equal(toks, n_ubatch, sequential, keep)
    except KeepTailAssert:
        assert want == rc.SPLIT_ABORT
        return None, None
    assert want != rc.SPLIT_ABORT
    return got, want


@settings(max_examples=300, deadline=None, derandomize=True)
@given(seq=st.sets(st.integers(0, 3), min_size=1, max_size=3), n=st.integers(1, 14),
       n_ubatch=st.integers(1, 12), keep=st.integers(0, 3), sequential=st.booleans())
def test_split_equal_of_one_sequence_set_agrees(seq: set[int], n: int, n_ubatch: int,
                                                 keep: int, sequential: bool) -> None:
    """kpool's split_equal (cache/batch.py, with its shortcut for the tokens of one
    sequence set that fit one ubatch: a decode step, a draft) against the reference's,
    on n tokens of one set, coupled or not: the same ubatches, or the same refusal
    or abort."""
    got, want = _both_splits(tuple(Token(p, tuple(sorted(seq))) for p in range(n)),
                             n_ubatch, sequential, keep)
    if got is None:
        return
    if isinstance(got, str):  # a sequential split of coupled sequences
        assert want is None
        return
    assert want is not None
    assert [list(u.tokens) for u in got] == want
    assert [u.n_seqs_unq for u in got] == [len(seq)] * len(want)


def test_reference_clear_keeps_the_queued_stream_copies() -> None:
    """docs/ENGINE-NOTES.md: clear leaves sc_info alone; the next valid decode takes it."""
    ref, _ = _ref("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 2, unified: false}
ops:
  - decode: {seq: [0], pos: 0..5}
  - seq_cp: {src: 0, dst: 1}
  - clear: {}
""")
    assert ref.cache.sc_info == [(0, 1)] and ref.cache.v_heads == [0, 0]
    list(ref.step(3, Decode((Token(0, (0,)),))))
    assert ref.cache.sc_info == []


def test_reference_cross_stream_copy_ignores_the_range_at_the_is_full_boundary() -> None:
    """llama_kv_cache::seq_cp: p0 = kv_size - 1 is not partial, the range is ignored;
    p1 = kv_size - 2 is partial: abort in both versions (rep-once earlier, for any
    range)."""
    text = """
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 2, unified: false}
ops:
  - decode: {seq: [0], pos: 0..5}
  - seq_cp: {src: 0, dst: 1, p0: 7, p1: 0}
  - seq_cp: {src: 0, dst: 1, p0: 0, p1: 6}
"""
    ref, recs = _ref(text, "cache-safe")
    assert [r.status for r in recs[1:]] == [rc.APPLIED, rc.ABORTED]
    assert ref.cache.v_cells[1].pairs(1) == [(p, p) for p in range(5)]
    assert ref.cache.v_heads == [5, 5]
    _ref2, recs = _ref(text, "rep-once")
    assert [r.status for r in recs[1:]] == [rc.ABORTED]


def test_reference_find_slot_wraps_and_restarts() -> None:
    """ENGINE.md §3: from head, wrapping once; head = last cell in placement order + 1
    (docs/ENGINE-NOTES.md); head > used + 2 n: start at 0. (Without recorded cells or
    the failed-prepare quirk every cell below head is in use, so neither can happen.)"""
    ref, _ = _ref("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 1}
ops:
  - decode:
      tokens: [{pos: 0, seq: [0], cell: 2}, {pos: 1, seq: [0], cell: 3},
               {pos: 2, seq: [0], cell: 4}, {pos: 3, seq: [0], cell: 6}]
  - decode: {seq: [0], pos: 4..7}
""")
    # head 7, used 4: 7 > 4 + 6 is false; cell 7, then wrap to 0, 1; head = 1 + 1
    assert [c for p, c in ref.cache.v_cells[0].pairs(0) if p >= 4] == [7, 0, 1]
    assert ref.cache.v_heads == [2]
    ref, _ = _ref("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 1}
ops:
  - decode:
      tokens: [{pos: 0, seq: [0], cell: 5}, {pos: 1, seq: [0], cell: 6},
               {pos: 2, seq: [0], cell: 7}]
  - decode: {seq: [0], pos: 3}
""")
    # head 8 > used 3 + 2: restart at 0
    assert ref.cache.v_cells[0].pairs(0)[-1] == (3, 0) and ref.cache.v_heads == [1]


def test_reference_recurrent_rollbacks() -> None:
    """llama_memory_recurrent::seq_rm: a partial seq_rm of a sequence's tail is a
    rollback of at most n_rs_seq tokens, one pending at a time; s_copy (a ubatch whose
    cell range holds the state) consumes it. seq -1 over a part of the range is
    refused (KP008, nothing changes anywhere); over the whole range it matches every
    sequence (angt/llama.cpp d5437c2): every rs_idx 0, every cell with pos >= 0
    emptied, the tails left as they were."""
    ref, recs = _ref("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2, n_rs_seq: 2}
ops:
  - decode: {seq: [0], pos: 0..6}
  - seq_rm: {seq: 0, p0: 3}
  - seq_rm: {seq: 0, p0: 4}
  - seq_rm: {seq: 0, p0: 3}
  - decode: {seq: [0], pos: 4}
  - seq_rm: {seq: 0, p0: 2}
  - seq_rm: {seq: 0, p0: 4}
  - seq_rm: {seq: -1, p0: 1}
""")
    got = [(r.status, set(r.codes)) for r in recs if isinstance(r, rc.RefEvent)]
    refused = (rc.REJECTED, {"KP008"})
    assert got == [refused, (rc.APPLIED, set()), refused, refused, (rc.APPLIED, set()),
                   refused]
    # too deep (3), pos 5 back to 3 (rs_idx 2), pending, consumed by the decode of pos 4,
    # too deep, pos 4 back to 3, seq -1 from pos 1 (partial)
    assert ref.rec.pos[0] == 3 and ref.rec.rs_idx == [1, 0] and ref.rec.tail == [0, -1]
    assert ref.cache.seq_pos_max(0) == 3  # the accepted seq_rm removed the attention cells
    # seq -1 over everything: accepted, the pending rollback gone, cell 0 emptied, its
    # tail still 0; the attention cells gone too
    (ev,) = [r for r in ref.step(7, SeqRm(-1)) if isinstance(r, rc.RefEvent)]
    assert (ev.status, set(ev.codes)) == (rc.APPLIED, set())
    assert ref.rec.pos[0] == -1 and ref.rec.seq[0] == set() and ref.rec.rs_idx == [0, 0]
    assert ref.rec.tail == [0, -1] and ref.cache.seq_pos_max(0) == -1


def test_reference_split_equal_keeps_the_tail() -> None:
    """split_equal's n_keep_tail step (n_rs_seq + 1): set 0 cut back so that n_keep_tail
    tokens remain, or extended to its end; a set that cannot keep them deferred; the
    assert n_ubatch > n_keep_tail, after the sequential split's coupled refusal."""
    def toks(*sp):
        return tuple(Token(p, (s,)) for s, p in sp)
    six = toks(*((0, p) for p in range(6)))
    assert rc.split_equal(six, 5, False, None, 3) == [[0, 1, 2], [3, 4, 5]]  # cut back
    two = toks((0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2))
    assert rc.split_equal(two, 5, False, None, 3) == [[0, 2, 4], [1, 3, 5]]  # extended
    late = toks((0, 0), (1, 0), (0, 1), (1, 1), (1, 2), (1, 3))
    assert rc.split_equal(late, 5, False, None, 3) == [[0, 2], [1, 3, 4, 5]]  # deferred
    assert rc.split_equal(late, 5, False, None, 0) == [[0, 2, 1, 3], [4, 5]]
    assert rc.split_equal(toks((0, 0)), 3, False, None, 3) == rc.SPLIT_ABORT
    assert rc.split_equal((Token(0, (0, 1)),), 3, True, None, 3) is None


def test_reference_hybrid_positions() -> None:
    """llama_memory_hybrid::seq_pos_min/max: a coupled batch is checked against
    max(attention min, recurrent pos) and min(attention max, recurrent pos): seq 1
    from pos 2 only (its recurrent pos is seq 0's) passes; seq 1's empty state
    restored (its recurrent state gone, its attention cells seq 0's) is refused."""
    _ref1, recs = _ref("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
ops:
  - decode: {seq: [0], pos: 0..4}
  - decode: {seq: [1], pos: 2..4}
  - decode: {seq: [0, 1], pos: 4}
""")
    assert isinstance(recs[-1], rc.RefUbatch) and recs[-1].token_seqs == [(0, 1)]
    _ref2, recs = _ref("""
kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
ops:
  - state_write: {seq: 1, slot: e}
  - decode: {seq: [0], pos: 0..4}
  - seq_cp: {src: 0, dst: 1}
  - state_read: {seq: 1, slot: e}
  - decode: {seq: [0, 1], pos: 4}
""")
    assert recs[-1].status == rc.REJECTED and recs[-1].codes == {"KP006"}


# kpool disagreements with the reference (and llama.cpp): see the reasons

NON_UNIFIED_COUPLED_KEEP_TAIL = """
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 2, unified: false, n_ubatch: 2, n_rs_seq: 1}
ops:
  - decode:
      tokens: [{pos: 0, seq: [0, 1]}]
"""

NEGATIVE_SAVED_POS = """
kpool_trace: 1
cache: {kv_size: 6, kpool: 2, n_seq_max: 2}
ops:
  - decode: {seq: [0], pos: 0}
  - seq_add: {seq: 0, shift: -1}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: [0], pos: 0}
  - state_write: {seq: 1, slot: s}
  - state_read: {seq: 0, slot: s}
"""


def test_reference_on_the_kpool_disagreements() -> None:
    """The reference's side of the two comparisons below (kpool once got both wrong).
    (1) llama_batch_allocr::split_equal refuses a coupled batch in a sequential
    (non-unified) split before it reaches GGML_ASSERT(n_ubatch > n_keep_tail): a
    refusal (KP006), not an abort. (2) A saved recurrent state whose pos is < 0
    (seq_add moved it there) is one cell (state_write_meta writes it, cell_count 1):
    state_read restores it."""
    _ref1, recs = _ref(NON_UNIFIED_COUPLED_KEEP_TAIL)
    assert [(r.status, set(r.codes)) for r in recs] == [(rc.REJECTED, {"KP006"})]
    ref, _ = _ref(NEGATIVE_SAVED_POS)
    assert ref.rec.saved["s"] == [-1]
    assert ref.rec.pos[ref.rec.tail[0]] == -1 and ref.rec.seq[ref.rec.tail[0]] == {0}


@pytest.mark.parametrize("engine", ENGINES)
def test_non_unified_coupled_batch_with_n_keep_tail(engine: str) -> None:
    compare(trace(NON_UNIFIED_COUPLED_KEEP_TAIL), engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_saved_negative_recurrent_pos_is_restored(engine: str) -> None:
    compare(trace(NEGATIVE_SAVED_POS), engine)


# -- side by side with kpool -------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", TRACE_FILES, ids=lambda p: p.name)
def test_trace_files_agree_with_the_cache_reference(path: Path, engine: str) -> None:
    assert compare(load_trace(path), engine)["ubatch"] > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_rule_traces_agree_with_the_cache_reference(engine: str) -> None:
    """Every scenario of test_engine_rules.py (one test per engine)."""
    for text in TRACES:
        compare(trace(text), engine)


@settings(max_examples=250, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(t=random_traces(), engine=st.sampled_from(sorted(REF_VERSIONS)))
def test_random_traces_agree_with_the_cache_reference(t: Trace, engine: str) -> None:
    compare(t, engine)


# -- the corner generator --------------------------------------------------------------------


THEMES = ("wrap", "quirk", "share", "restale", "cross_range", "clear_pending", "split",
          "no_room", "first_pos", "rollback", "span", "keep_tail", "hybrid", "any")


@st.composite
def corner_traces(draw) -> tuple[Trace, str]:
    """Small caches, edits with their bounds at the interesting places (a sequence's
    first and last positions, the is_full boundary kv_size - 2 / kv_size - 1), decodes
    that fill a stream to the brim, shared sequences. Each example has a theme, a corner
    it aims at with a few ops between random ones (THEMES): find_slot's wrap-around and
    restart rule, a refused decode after a placed ubatch (the head quirk), a seq_add /
    seq_div moving a shared sequence's first position (drift), cache-safe's re-stale
    while shared, cross-stream copies with ranges at the is_full boundary, a clear with
    stream copies queued, the sequential split taking a passed-over seq, a restore with
    no room; and the recurrent child: speculative rollbacks (accepted, too deep, a
    second one pending, consumed by a ubatch, maybe another sequence's), splits moved
    by n_keep_tail, coupled batches the hybrid positions let through or refuse where
    the attention's alone would not. Most examples set n_rs_seq (0..4). The reference
    itself tracks the state to aim the next op; the trace is built for one engine, so
    it stops at that engine's first abort."""
    theme = draw(st.sampled_from(THEMES))
    engine = "cache-safe" if theme == "restale" else draw(st.sampled_from(ENGINES))
    if theme in ("share", "restale", "hybrid", "span"):
        unified = True
    elif theme in ("quirk", "cross_range", "clear_pending", "split"):
        unified = False
    else:
        unified = draw(st.booleans())
    lo = 3 if theme in ("split", "span") else 2 if theme != "any" or not unified else 1
    n_seq = draw(st.integers(lo, 3))
    by_order = theme in ("any", "wrap", "no_room") and draw(st.integers(0, 5)) == 0
    n_ubatch = draw(st.sampled_from([1, 2, 3] if theme == "quirk" else [1, 2, 3, 5, 512]))
    n_rs_seq = 0
    if theme != "quirk":
        need = theme in ("rollback", "span", "keep_tail", "hybrid")
        n_rs_seq, n_ubatch = draw_n_rs_seq(draw, n_ubatch, (3, 5, 6, 8, 512), need=need)
    cfg = CacheConfig(kv_size=draw(st.sampled_from([6, 8, 12, 16])),
                      kpool=draw(st.integers(2, 3)), n_seq_max=n_seq, unified=unified,
                      by_order=by_order, n_ubatch=n_ubatch, n_rs_seq=n_rs_seq)
    kv = cfg.kv_size
    ref = rc.RefReplay(Trace(cache=cfg, ops=()), engine)
    cache = ref.cache
    seq = st.integers(0, n_seq - 1)
    kinds = (["decode"] * 5 + ["fill"] * 2 + ["seq_rm"] * 2 + ["seq_cp"] * 2
             + ["seq_cp_range", "seq_keep", "clear", "state_write", "state_read",
                "state_drop", "spec"])
    if not by_order:
        kinds += ["seq_add"] * 3 + ["seq_div"]
    if theme != "any":
        kinds += ["theme"] * (len(kinds) // 2)
    ops: list = []
    written: list[str] = []

    def emit(op) -> bool:
        """Append op and run it through the reference; False once it aborted."""
        ops.append(op)
        for _rec in ref.step(len(ops) - 1, op):
            pass
        return not ref.aborted

    def next_tokens(s: int, n: int) -> tuple[Token, ...]:
        start = next_pos(ref, s)
        return tuple(Token(start + k, (s,), (0, 0) if by_order else None) for k in range(n))

    def bound(s: int) -> st.SearchStrategy[int]:
        pmin, pmax = cache.seq_pos_min(s), cache.seq_pos_max(s)
        return st.sampled_from(sorted({-1, 0, 1, pmin, pmin + 1, pmax, pmax + 1, kv - 1})
                               ) | st.integers(-1, kv + 2)

    def other(a: int) -> int:
        return draw(st.sampled_from([x for x in range(n_seq) if x != a]))

    first = "fill" if theme in ("wrap", "quirk", "no_room", "any") else "decode"
    for _ in range(draw(st.integers(2, 14))):
        kind = draw(st.sampled_from(kinds)) if ops else first
        if kind == "theme":
            kind = theme
        op = None
        if kind in ("decode", "fill", "any"):
            op = _draw_corner_decode(draw, ref, fill=kind == "fill")
        elif kind == "wrap":
            # a recorded placement on free cells just below the top free one leaves head
            # with free cells above and below it: a decode then wraps (or restarts at 0)
            s = draw(seq)
            cells = cache.cells_of(s)
            free = [i for i in range(cells.size) if cells.is_empty(i)]
            if len(free) < 3:
                op = SeqRm(s, -1, cache.seq_pos_max(s) // 2 + 1)
            else:
                k = draw(st.integers(1, len(free) - 2))
                toks = next_tokens(s, k)
                rec = tuple(Token(t.pos, t.seq, t.ext, c)
                            for t, c in zip(toks, free[-k - 1:-1], strict=True))
                if not emit(Decode(rec)):
                    break
                # n tokens; n = (head - used) / 2 sits on the restart rule's boundary
                head = cache.v_heads[cache.seq_to_stream(s)]
                edge = (head - cells.get_used()) // 2
                n = draw(st.integers(2, len(free) - k) | st.sampled_from([edge, edge + 1]))
                op = Decode(next_tokens(s, max(1, n)))
        elif kind == "quirk":
            # a decode of one sequence, several ubatches, one too many for its stream: the
            # ubatches placed before the failure leave their stream another's old head
            s = draw(seq)
            cells = cache.cells_of(s)
            op = Decode(next_tokens(s, cells.size - cells.get_used() + draw(st.integers(1, 3))))
        elif kind == "share":
            # share a whole sequence, let a decode build the copy's layout, then move the
            # source's first positions: the copy's cells move, unstaled (KP007)
            a = draw(seq)
            b = other(a)
            cramped = cache.cells_of(a).size - cache.cells_of(a).get_used() < 4
            if cramped and not (emit(Clear())
                                and emit(Decode(next_tokens(a, draw(st.integers(2, 4)))))):
                break
            if not (emit(SeqCp(a, b)) and emit(Decode(next_tokens(a, 1)))):
                break
            p0 = draw(st.sampled_from([-1, 0, max(0, cache.seq_pos_min(a)), 1, 2]))
            if draw(st.booleans()):
                move = SeqAdd(a, p0, draw(st.sampled_from([-1, 3])),
                              draw(st.sampled_from([-3, -2, -1, 1, 2])))
            else:
                move = SeqDiv(a, p0, -1, 2)
            if not emit(move):
                break
            op = Decode(next_tokens(draw(st.sampled_from([a, a, b])), 1))
        elif kind == "restale":
            # cache-safe: a shared layout, then seq_rm / state_read / state_drop
            a = draw(seq)
            b = other(a)
            if not (emit(SeqCp(a, b)) and emit(Decode(next_tokens(a, 1)))
                    and emit(StateWrite(b, "s"))):
                break
            written.append("s")
            op = draw(st.sampled_from([SeqRm(b, 1, -1), StateDrop(b), StateRead(a, "s"),
                                       SeqRm(a, -1, -1)]))
        elif kind == "first_pos":
            # an edit whose bound is exactly a sequence's first position, that position
            # not 0 (a removed prefix), the sequence clean (decoded since): ENGINE.md §4's
            # stale_pos compares p0 <= seq_pos_min(s)
            s = draw(seq)
            if cache.seq_pos_max(s) < 3:
                op = Decode(next_tokens(s, 4))
            elif cache.seq_pos_min(s) == 0:
                op = SeqRm(s, -1, draw(st.integers(1, 2)))
            else:
                if not emit(Decode(next_tokens(s, 1))):
                    break
                pmin = cache.seq_pos_min(s)
                if by_order:
                    op = SeqRm(s, pmin, pmin + 1)
                else:
                    d = draw(st.integers(-2, 2))
                    op = draw(st.sampled_from([SeqRm(s, pmin, pmin + 1),
                                               SeqAdd(s, pmin - min(d, 0), -1, d or 1)]))
        elif kind == "cross_range":
            edge = st.sampled_from([-1, 0, 1, kv - 2, kv - 1, kv, kv + 3])
            a = draw(seq)
            op = SeqCp(a, other(a), draw(edge), draw(edge))
        elif kind == "clear_pending":
            a = draw(seq)
            if not emit(SeqCp(a, other(a))):
                break
            op = Clear()
        elif kind == "split":
            op = _draw_corner_decode(draw, ref, fill=False, every_seq=True)
        elif kind == "no_room":
            # a snapshot of one sequence restored into another that has no room left
            a = draw(seq)
            b = other(a)
            if not emit(StateWrite(a, "r")):
                break
            written.append("r")
            room = (cache.cells_of(b).size - cache.cells_of(b).get_used()
                    - cache.cells_of(a).get_used())
            if room > 0 and not emit(Decode(next_tokens(b, room + draw(st.integers(0, 1))))):
                break
            op = StateRead(b, "r")
        elif kind in ("spec", "rollback", "span"):
            # speculative decoding: the draft's last k tokens are rejected, seq_rm(s, p,
            # -1): a rollback of s's recurrent state (k <= n_rs_seq, none pending); one
            # or two of them, then a decode of s, of the others or of all
            s = draw(seq)
            # span: one ubatch of (a, s, c) puts s's state between a's and c's, so that a
            # later ubatch of a and c alone spans s's cell and consumes its rollback
            span = kind == "span" or (kind == "rollback" and unified and n_seq >= 3
                                      and draw(st.booleans()))
            if span:
                a, c = (x for x in range(n_seq) if x != s)
                if ((cache.v_cells[0].size - cache.v_cells[0].get_used() < 7
                     and not emit(Clear()))
                        or not emit(Decode(next_tokens(s, 2)))
                        or not emit(Decode(tuple(t for x in (a, s, c)
                                                 for t in next_tokens(x, 1))))):
                    break
            elif (kind == "rollback" and next_pos(ref, s) < 5
                    and not emit(Decode(next_tokens(s, draw(st.integers(4, 6)))))):
                break
            for j in range(draw(st.sampled_from([1, 1, 2]))):
                if span and j == 0:
                    k = draw(st.integers(1, max(1, min(cfg.n_rs_seq, next_pos(ref, s) - 1))))
                else:
                    k = draw(st.integers(0, cfg.n_rs_seq + 1) | st.integers(1, 4))
                if not emit(SeqRm(s, max(0, next_pos(ref, s) - k), -1)):
                    break
            if ref.aborted:
                break
            who = "span" if span else draw(st.sampled_from(["s", "others", "all", "none"]))
            if who == "span":
                op = Decode(next_tokens(a, 1) + next_tokens(c, 1))
            elif who == "s":
                op = Decode(next_tokens(s, draw(st.integers(1, cfg.n_rs_seq + 2))))
            elif who != "none" and (n_seq > 1 or who == "all"):
                toks = [t for x in range(n_seq) if who == "all" or x != s
                        for t in next_tokens(x, draw(st.integers(1, 3)))]
                op = Decode(tuple(toks))
        elif kind == "keep_tail":
            # a decode whose sets do not split evenly: n_keep_tail (n_rs_seq + 1) keeps a
            # sequence's last tokens together, deferring sets, extending or cutting set 0
            chosen = sorted(set(draw(st.lists(seq, min_size=1, max_size=n_seq))))
            per = {x: next_tokens(x, draw(st.integers(1, cfg.n_ubatch + cfg.n_rs_seq + 2)
                                          if cfg.n_ubatch < 64 else st.integers(1, 8)))
                   for x in chosen}
            toks = []
            while any(per.values()):
                x = draw(st.sampled_from([x for x in chosen if per[x]]))
                toks.append(per[x][0])
                per[x] = per[x][1:]
            op = Decode(tuple(toks))
        elif kind == "hybrid":
            # a coupled batch (a, b) checked against the hybrid positions: max(attention
            # min, recurrent pos), min(attention max, recurrent pos)
            a = draw(seq)
            b = other(a)
            if next_pos(ref, a) < 3 and not emit(Decode(next_tokens(a, 3))):
                break
            how = draw(st.sampled_from(["late_start", "shared_rollback", "empty_restore"]))
            if how == "empty_restore":
                # b's empty state restored: its attention cells (a's, shared) stay, its
                # recurrent state is gone: the attention alone would let (a, b) through
                if not (emit(SeqRm(b, -1, -1)) and emit(StateWrite(b, "e"))
                        and emit(SeqCp(a, b)) and emit(StateRead(b, "e"))):
                    break
                written.append("e")
            elif how == "late_start":
                # b from scratch, its first position after a's: only the recurrent
                # positions (a's last, b's last) agree
                pa = next_pos(ref, a)
                if pa < 2 or not (emit(SeqRm(b, -1, -1))
                        and emit(Decode(tuple(Token(p, (b,)) for p in range(
                            draw(st.integers(1, pa - 1)), pa))))):
                    break
            else:
                # b shares a's cells, rolls back: the shared recurrent cell moves a too
                if not (emit(SeqCp(a, b)) and emit(SeqRm(b, max(1, next_pos(ref, b) - 1), -1))):
                    break
            start = max(next_pos(ref, a), 0)
            pair = (a, b) if draw(st.booleans()) else (b, a)
            op = Decode(tuple(Token(start + k, pair) for k in range(draw(st.integers(1, 3)))))
        elif kind == "seq_rm":
            s = draw(st.integers(-1, n_seq - 1))
            b = bound(max(s, 0))
            # whole, now and then: seq_rm(-1) of every sequence leaves the recurrent
            # states' tails dangling, which the next decode's find_slot asserts on
            op = SeqRm(s) if s < 0 and draw(st.integers(0, 2)) == 0 else SeqRm(
                s, draw(b), draw(b))
        elif kind == "seq_cp":
            op = SeqCp(draw(seq), draw(seq))
        elif kind == "seq_cp_range":
            edge = st.sampled_from([-1, 0, 1, kv - 2, kv - 1, kv, kv + 3])
            op = SeqCp(draw(seq), draw(seq), draw(edge), draw(edge))
        elif kind == "seq_keep":
            op = SeqKeep(draw(seq))
        elif kind == "clear":
            op = Clear()
        elif kind == "seq_add":
            s = draw(seq)
            op = SeqAdd(s, draw(bound(s)), draw(bound(s)), draw(st.integers(-4, 4)))
        elif kind == "seq_div":
            s = draw(seq)
            op = SeqDiv(s, draw(bound(s)), draw(bound(s)), draw(st.integers(1, 3)))
        elif kind == "state_write":
            slot = draw(st.sampled_from(["a", "b"]))
            op = StateWrite(draw(seq), slot)
            written.append(slot)
        elif kind == "state_read" and written:
            op = StateRead(draw(seq), draw(st.sampled_from(written)))
        elif kind == "state_drop":
            op = StateDrop(draw(st.integers(-1, n_seq - 1)))
        if op is not None and not emit(op):
            break
    return Trace(cache=cfg, ops=tuple(ops), seed=0), engine


def next_pos(ref: rc.RefReplay, s: int) -> int:
    """The position a decode of s continues from: after the hybrid memory's last one
    (what validation checks), or after the attention's when that is < 0."""
    x = ref.hybrid.seq_pos_max(s)
    return x + 1 if x >= 0 else ref.cache.seq_pos_max(s) + 1


def _draw_corner_decode(draw, ref: rc.RefReplay, fill: bool, every_seq: bool = False
                        ) -> Decode:
    cfg, cache = ref.cfg, ref.cache
    n = cfg.n_seq_max
    chosen = (list(range(n)) if every_seq else
              sorted(set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n)))))
    per_seq: dict[int, list[Token]] = {}
    coupled: list[Token] = []
    if cfg.unified and len(chosen) >= 2 and draw(st.integers(0, 2)) == 0:
        a, b = chosen[0], chosen[1]
        hy = ref.hybrid
        if (hy.seq_pos_min(a), hy.seq_pos_max(a)) == (hy.seq_pos_min(b), hy.seq_pos_max(b)):
            start = next_pos(ref, a)
            pair = (a, b) if draw(st.booleans()) else (b, a)
            coupled = [Token(start + k, pair) for k in range(draw(st.integers(1, 4)))]
            chosen = chosen[2:]
    for s in chosen:
        start = next_pos(ref, s)
        if draw(st.integers(0, 11)) == 0:  # a decode validation may refuse
            start = max(0, start + draw(st.sampled_from([-1, 1])))
        if fill:
            free = cache.cells_of(s).size - cache.cells_of(s).get_used()
            if cfg.unified:  # the sequences share the stream's free cells: a batch past
                free //= len(chosen)  # all of them is past the context (KP005) at once
            count = max(1, free + draw(st.integers(-2, 1)))
        else:
            count = draw(st.integers(1, 5))
        ext = cfg.by_order and draw(st.integers(0, 2)) == 0
        positions = [start if ext else start + k for k in range(count)]
        if count >= 2 and draw(st.integers(0, 5)) == 0:
            # a repeated position (continuity counts distinct ones), maybe with a gap
            positions[1] = positions[0]
            if count == 2 or draw(st.booleans()):
                positions[-1] += 1
        per_seq[s] = [Token(p, (s,), (k // 3, k % 3) if ext else None)
                      for k, p in enumerate(positions)]
    # interleave the sequences (batch order matters to the split): at random, or the
    # lowest seq first, then rounds in descending seq order (0, 2, 1, 0, 2, 1: the
    # sequential split passes seq 2 over, then takes it at a later token)
    tokens: list[Token] = list(coupled)
    queues = [list(v) for v in per_seq.values()]
    if not every_seq and draw(st.booleans()):
        while any(queues):
            q = draw(st.sampled_from([q for q in queues if q]))
            tokens.append(q.pop(0))
    else:
        if queues:
            tokens.append(queues[0].pop(0))
        while any(queues):
            for q in reversed(queues):
                if q:
                    tokens.append(q.pop(0))
    if not tokens:
        tokens = [Token(next_pos(ref, 0), (0,))]
    if cfg.by_order and any(t.ext is not None for t in tokens):
        tokens = [t if t.ext is not None else Token(t.pos, t.seq, (0, 0)) for t in tokens]
    ubatches = None
    if draw(st.integers(0, 7)) == 0 and len(tokens) > 1:
        cut = draw(st.integers(1, len(tokens) - 1))
        ubatches = (tuple(range(cut)), tuple(range(cut, len(tokens))))
    elif draw(st.integers(0, 4)) == 0:
        tokens = _recorded(draw, cache, tokens)
    return Decode(tokens=tuple(tokens), ubatches=ubatches)


def _recorded(draw, cache: rc.RefCache, tokens: list[Token]) -> list[Token]:
    """Give every token a recorded cell: distinct empty cells of its stream (as a
    trace from a real run would), or no cell at all when a stream has too few."""
    free: dict[int, list[int]] = {}
    for k, cells in enumerate(cache.v_cells):
        free[k] = [i for i in range(cells.size) if cells.is_empty(i)]
    need = Counter(cache.seq_to_stream(t.seq[0]) for t in tokens)
    if any(len(free[k]) < c for k, c in need.items()):
        return tokens
    high = draw(st.booleans())  # the highest free cells: head ends near the stream's end
    out = []
    for t in tokens:
        k = cache.seq_to_stream(t.seq[0])
        c = free[k][len(free[k]) - need[k]] if high else draw(st.sampled_from(free[k]))
        need[k] -= 1
        free[k].remove(c)
        out.append(Token(t.pos, t.seq, t.ext, c))
    return out


CORNERS = (
    "decode past the context (n_batch assert)",
    "find_slot wrap-around",
    "find_slot restart at 0",
    "find_slot: head == used + 2 n (no restart)",
    "failed prepare after a placed ubatch (non-unified)",
    "failed prepare: head quirk",
    "seq_add/seq_div moves a shared sequence's first position",
    "cross-stream seq_cp with a range",
    "cross-stream seq_cp at the is_full boundary",
    "clear with copies pending",
    "memory update with a K-shift",
    "memory update with stream copies",
    "decode refused after the memory update's layout update",
    "sequential split takes a passed-over seq",
    "cache-safe re-stale while shared",
    "layout drift (KP007)",
    "state_read without room",
    "stale_pos at a first position > 0",
    "batch with a repeated position",
    # the recurrent child
    "recurrent rollback accepted",
    "recurrent rollback refused: too deep",
    "recurrent rollback refused: one is pending",
    "recurrent rollback consumed",
    "recurrent rollback consumed outside the ubatch",
    "recurrent rollback of a shared cell",
    "recurrent seq_rm of every sequence accepted",
    "recurrent seq_rm of every sequence refused: a partial range",
    "recurrent find_slot asserts on a dangling tail",
    "recurrent find_slot moves a sequence off a shared cell",
    "recurrent find_slot swaps two cells",
    "split_equal n_keep_tail: set 0 extended to its end",
    "split_equal n_keep_tail: set 0 cut back",
    "split_equal n_keep_tail: sets deferred",
    "split_equal: GGML_ASSERT(n_ubatch > n_keep_tail)",
    "coupled batch passes by the hybrid positions (attention alone: no)",
    "coupled batch refused by the hybrid positions (attention alone: ok)",
)


def test_corner_traces_agree_and_reach_the_corners() -> None:
    """The corner generator, both engines, and proof that it reaches every corner
    (counted by the reference as it goes)."""
    seen: Counter = Counter()

    # derandomized: 350 examples reach every corner 3 times at least (250 miss one)
    @settings(max_examples=350, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(case=corner_traces())
    def run_case(case: tuple[Trace, str]) -> None:
        compare(case[0], case[1], seen)

    run_case()
    missing = [c for c in CORNERS if seen[c] == 0]
    assert not missing, f"the corner generator never reached: {missing} (seen: {seen})"
