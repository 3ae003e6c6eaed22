"""The backend rechecks only the pools whose verdict may have changed
(new or rebuilt pools, rep rows whose pooled value changed, pools with a member whose
key changed); a full recomputation over every pool after every ubatch must find
exactly the same bad pools. Random traces built to reach bad pools (coupled tokens,
whole and partial copies, shifts, restores, drops, row-zero padding), under both
engines and a row-zero-padding variant."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from conftest import ENGINES, trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kpool_cli.backend import recheck, reference
from kpool_cli.backend.guards import RECHECKED, SCATTERED, WROTE_NOTHING
from kpool_cli.backend.store import ValueBackend
from kpool_cli.contracts.records import UbatchRecord
from kpool_cli.engine.layout import LayoutChange
from kpool_cli.replay import Replayer
from kpool_cli.report.json_report import event_json, ubatch_json
from kpool_cli.trace import model as m
from kpool_cli.versions import REP_ONCE, VERSIONS, EngineVersion


def pooling(be: ValueBackend, members: np.ndarray) -> np.ndarray:
    """The pooling of member slots `members` [n, kpool] by the numpy twin, on the
    backend's key and gate rows."""
    return reference.pool(be.slots.key, be.slots.gate, members)

ROW_ZERO = dataclasses.replace(REP_ONCE, name="rep-once-row-zero", padding="row-zero")
VARIANTS = {**VERSIONS, ROW_ZERO.name: ROW_ZERO}


def full_bad(be: ValueBackend, layout) -> list[np.ndarray]:
    """Every sequence's bad pools, recomputed over every pool: the oracle of the
    incremental `be.bad`."""
    out = []
    for sq in layout.seqs:
        ks = np.arange(len(sq.pools), dtype=np.int64)
        out.append(be.verifier.differ(sq.members(ks, be.kpool, be.kv_size), sq.rep_rows.view[ks])
                   if ks.size else np.zeros(0, dtype=bool))
    return out


def check_incremental(t: m.Trace, version: EngineVersion, core: str = "reference",
                      backend: str = "numpy") -> tuple[int, int]:
    """Replay with the numpy backend on `core`; after every ubatch the incremental bad
    pools (and the sequences holding one) must equal a full recomputation, and KP003
    must name exactly the tokens that see one. The compiled core's layout knows when
    its pairs equal the cache's, and the verification then finds the changed pools by
    looking the changed cells up (`Verifier._candidates`); the reference's never
    claims it, and it scans.
    Returns (ubatches, ubatches with a bad pool)."""
    be = ValueBackend(t.cache, t.seed, backend)
    rp = Replayer(t, version, be, core=core)
    n = n_bad = 0
    for rec in rp.run():
        lay = rp.layout  # what the verification asks of it, for every sequence at once
        assert lay.known_equal_seqs(rp.cache).tolist() == [
            lay.known_equal(rp.cache, s) for s in range(len(lay.seqs))]
        if not isinstance(rec, UbatchRecord) or rec.aborted:
            continue
        n += 1
        full = full_bad(be, rp.layout)
        for s, (inc, want) in enumerate(zip(be.bad, full, strict=True)):
            assert np.array_equal(inc, want), (f"ubatch {rec.index} seq {s}: incremental "
                                               f"{np.flatnonzero(inc)} != full "
                                               f"{np.flatnonzero(want)}")
        assert be.verifier.bad_seqs == {s for s, b in enumerate(full) if b.any()}
        n_bad += any(b.any() for b in full)
        kp3 = [f for f in rec.findings if f.code == "KP003"]
        readers = {(int(p), ss[0]) for p, ss, v in zip(rec.token_pos.tolist(), rec.token_seqs,
                                                       rec.token_visible.tolist(), strict=True)
                   if full[ss[0]][:v].any()}
        assert set(kp3[0].tokens if kp3 else ()) == readers
    return n, n_bad


def _state(cfg: m.CacheConfig, ops: list) -> Replayer:
    rp = Replayer(m.Trace(cfg, tuple(ops)), REP_ONCE)
    for _ in rp.run():
        pass
    return rp


_SEVERAL = st.integers(2, 3)  # value_traces' sequences, unless asked


@st.composite
def value_traces(draw, n_seq: st.SearchStrategy[int] = _SEVERAL) -> m.Trace:
    """Decodes that pass validation (each step looks at the cache the ops so far
    leave, under rep-once), mixed with the edits that move rows and keys; `n_seq`
    draws n_seq_max."""
    unified = draw(st.integers(0, 3)) > 0
    cfg = m.CacheConfig(kv_size=draw(st.sampled_from([16, 24, 32])),
                        kpool=draw(st.integers(2, 4)), n_seq_max=draw(n_seq),
                        unified=unified, n_ubatch=draw(st.sampled_from([3, 512])), n_embd=4)
    n = cfg.n_seq_max
    seq = st.integers(0, n - 1)
    ops: list = []
    slots: list[str] = []
    kinds = ["decode"] * 5 + ["coupled"] * 6 + ["seq_cp", "seq_cp_part", "seq_rm", "seq_add",
                                                 "state_write", "state_read", "state_drop",
                                                 "seq_keep", "clear"]
    for i in range(draw(st.integers(2, 12))):
        cache = _state(cfg, ops).cache if ops else None
        kind = "decode" if i == 0 else draw(st.sampled_from(kinds))

        def next_pos(s: int, cache=cache) -> int:
            return cache.seq_pos_max(s) + 1 if cache is not None else 0

        if kind == "coupled" and unified:
            pairs = [(a, b) for a in range(n) for b in range(n) if a != b
                     and cache.seq_pos_min(a) == cache.seq_pos_min(b)
                     and cache.seq_pos_max(a) == cache.seq_pos_max(b)]
            if pairs:
                a, b = draw(st.sampled_from(pairs))
                p = next_pos(a)
                ops.append(m.Decode(tuple(m.Token(p + k, (a, b))
                                          for k in range(draw(st.integers(1, 3))))))
                continue
            kind = "decode"
        if kind in ("decode", "coupled"):
            # one length for every sequence of the decode keeps them aligned, so coupled
            # tokens can follow cells of their own (the rep conflicts of KP002/KP003)
            ss = sorted(set(draw(st.lists(seq, min_size=1, max_size=n))))
            length = draw(st.integers(1, 5))
            toks = [m.Token(next_pos(s) + k, (s,)) for s in ss for k in range(length)]
            ops.append(m.Decode(tuple(toks)))
        elif kind == "seq_cp":
            ops.append(m.SeqCp(draw(seq), draw(seq)))
        elif kind == "seq_cp_part":
            ops.append(m.SeqCp(draw(seq), draw(seq), draw(st.integers(0, 6)),
                               draw(st.integers(-1, 9))))
        elif kind == "seq_rm":
            ops.append(m.SeqRm(draw(seq), draw(st.integers(-1, 8)), -1))
        elif kind == "seq_add":
            ops.append(m.SeqAdd(draw(seq), draw(st.integers(-1, 6)), -1,
                                draw(st.integers(-3, 3))))
        elif kind == "state_write":
            slot = draw(st.sampled_from("ab"))
            ops.append(m.StateWrite(draw(seq), slot))
            slots.append(slot)
        elif kind == "state_read" and slots:
            ops.append(m.StateRead(draw(seq), draw(st.sampled_from(slots))))
        elif kind == "state_drop":
            ops.append(m.StateDrop(draw(seq)))
        elif kind == "seq_keep":
            ops.append(m.SeqKeep(draw(seq)))
        elif kind == "clear":
            ops.append(m.Clear())
    return m.Trace(cfg, tuple(ops), seed=draw(st.integers(0, 3)))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(t=value_traces(), engine=st.sampled_from(sorted(VARIANTS)),
       core=st.sampled_from(["reference", "compiled"]))
def test_incremental_bad_pools_equal_a_full_recomputation(t: m.Trace, engine: str,
                                                          core: str) -> None:
    check_incremental(t, VARIANTS[engine], core)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(t=value_traces(), engine=st.sampled_from(sorted(VARIANTS)),
       core=st.sampled_from(["reference", "compiled"]))
def test_judging_by_generation_finds_the_bad_pools_pooling_finds(t: m.Trace, engine: str,
                                                                core: str) -> None:
    """The numba backend judges a rep row that holds its pooling by the slots'
    generations (`kernels.pools_differ`); the numpy twin pools every checked pool
    again. Replayed in lockstep, after every op both have the same bad pools and the
    same records."""
    by_gen, pooled = (ValueBackend(t.cache, t.seed, b) for b in ("numba", "numpy"))
    for a, b in zip(Replayer(t, VARIANTS[engine], by_gen, core=core).run(),
                    Replayer(t, VARIANTS[engine], pooled, core=core).run(), strict=True):
        assert [x.tolist() for x in by_gen.bad] == [x.tolist() for x in pooled.bad]
        assert as_json(a, t) == as_json(b, t)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(t=value_traces(n_seq=st.just(1)), engine=st.sampled_from(sorted(VARIANTS)),
       core=st.sampled_from(["reference", "compiled"]),
       backend=st.sampled_from(["numpy", "numba"]))
def test_one_sequence_bad_pools_equal_a_full_recomputation(t: m.Trace, engine: str,
                                                          core: str, backend: str) -> None:
    """A layout of one sequence is verified in one kernel call where its way is NONE or
    NEW (`Verifier._one_sequence`), by both kernel twins: after every ubatch its bad
    pools equal a full recomputation, as the general way's do."""
    check_incremental(t, VARIANTS[engine], core, backend)


def _check_one_sequence_traces() -> None:
    """`check_incremental` of 100 one-sequence random traces (`value_traces`), each
    under an engine variant and a core, on the numba backend: the probes below count
    what the kernels answered."""
    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck),
              database=None, derandomize=True)
    @given(t=value_traces(n_seq=st.just(1)), engine=st.sampled_from(sorted(VARIANTS)),
           core=st.sampled_from(["reference", "compiled"]))
    def check(t: m.Trace, engine: str, core: str) -> None:
        check_incremental(t, VARIANTS[engine], core, "numba")

    check()


def test_one_sequence_verification_takes_both_ways() -> None:
    """The property above is not vacuous: on its traces the one-call verification
    answers most ubatches, with both ways (NONE, NEW), and hands some to the general way
    (the reference core's layout, which never knows its pairs equal the cache's,
    scans). A layout of one sequence holds no rep conflict, so these traces reach no
    bad pool: `test_a_new_pool_not_pooled_is_bad_in_one_call` makes one."""
    from kpool_cli.backend import recheck
    from kpool_cli.backend.guarded import GuardedKernels

    ways: list[int | None] = []
    real, real_step = GuardedKernels.recheck_one, GuardedKernels.one_step

    def counted(self, *args):  # type: ignore[no-untyped-def]
        got = real(self, *args)
        ways.append(None if got is None else got[0])
        return got

    def counted_step(self, *args):  # type: ignore[no-untyped-def]
        # the one call's verification: its way, or None where it hands back
        got = real_step(self, *args)
        if got is not None and got[0] >= SCATTERED:
            ways.append(got[6] if got[0] == RECHECKED else None)
        return got

    GuardedKernels.recheck_one = counted  # type: ignore[method-assign]
    GuardedKernels.one_step = counted_step  # type: ignore[method-assign]
    try:
        _check_one_sequence_traces()
    finally:
        GuardedKernels.recheck_one = real  # type: ignore[method-assign]
        GuardedKernels.one_step = real_step  # type: ignore[method-assign]
    assert ways.count(recheck.NONE) > 50 and ways.count(recheck.NEW) > 50, ways
    assert ways.count(None) >= 10, ways


def test_one_step_twins_agree_and_reach_every_stage(monkeypatch) -> None:
    """store.py `ValueBackend._one_step` (`kernels.one_step`: a ubatch of one sequence's
    write, scatter and verification in one numba call): on the one-sequence random
    traces above, each call gives what its numpy twin (reference.py `one_step`: that
    module's `write_rows`, `scatter_singles` and `recheck_one` in turn, each held to
    its numba twin elsewhere) gives from a copy of the same state: the same answer,
    and every array either writes the same, bit for bit. The calls reach a scatter
    whose verification hands back (a look-up or a scan), all three parts, and the
    write and verification of a plan that stands (no scatter); the other stages are
    test_backend_kernels.py's, by hand."""
    from kpool_cli.backend import guards, kernels, reference

    reached: list[int] = []
    stood = [0]  # the calls of a plan that stands: no scatter
    real = kernels.one_step

    def twinned(*args):  # type: ignore[no-untyped-def]
        copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        want = reference.one_step(*copies)
        got = real(*args)
        assert (got is None) == (want is None)
        if got is not None:
            reached.append(got[0])
            stood[0] += not args[-1]
            assert got[:3] == want[:3] and got[5:7] == want[5:7], (got, want)
            for x, y in (*zip(got[3:5], want[3:5], strict=True), (got[7], want[7])):
                assert x.dtype == y.dtype and np.array_equal(x, y), (got, want)
        for a, c in zip(args, copies, strict=True):
            if isinstance(a, np.ndarray):
                assert a.tobytes() == c.tobytes()
        return got

    monkeypatch.setattr(kernels, "one_step", twinned)

    _check_one_sequence_traces()
    seen = {stage: reached.count(stage) for stage in (guards.SCATTERED, guards.RECHECKED)}
    assert min(seen.values()) > 100 and stood[0] > 10, (seen, stood)


def test_the_random_traces_reach_bad_pools() -> None:
    """`test_incremental_bad_pools_equal_a_full_recomputation` is not vacuous: its
    generator reaches bad pools often."""
    seen = []

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck),
              database=None, derandomize=True)
    @given(t=value_traces(), engine=st.sampled_from(sorted(VARIANTS)))
    def probe(t: m.Trace, engine: str) -> None:
        seen.append(check_incremental(t, VARIANTS[engine], "compiled")[1] > 0)

    probe()
    assert sum(seen) >= 3, f"{sum(seen)} of {len(seen)} traces reached a bad pool"


def test_incremental_check_on_a_scripted_trace() -> None:
    """Pools go bad (coupled rep conflict) and are repaired (seq_rm and re-decode),
    then a state drop and restore."""
    t = trace("""
        kpool_trace: 1
        cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 0..2}
          - decode: {seq: 1, pos: 0..2}
          - decode: {seq: [0, 1], pos: 2}
          - decode: {seq: [0, 1], pos: 3}
          - decode: {seq: 1, pos: 4}
          - seq_rm: {seq: 1, p0: 0, p1: -1}
          - decode: {seq: 1, pos: 0..9}
          - state_write: {seq: 0, slot: a}
          - state_drop: {seq: 0}
          - state_read: {seq: 0, slot: a}
          - decode: {seq: 0, pos: 4..9}
        """)
    for engine in ENGINES:  # both verification paths, each with numba's kernels too
        for core, backend in (("reference", "numpy"), ("compiled", "numpy"),
                              ("reference", "numba"), ("compiled", "numba")):
            n, n_bad = check_incremental(t, VERSIONS[engine], core, backend)
            assert n > 5 and n_bad > 0


BASE = """
    kpool_trace: 1
    cache: {kv_size: 32, kpool: 2, n_seq_max: 3, n_embd: 4}
    ops:
      - decode: {seq: 0, pos: 0..3}
      - decode: {seq: 1, pos: 0..3}
      - decode: {seq: [0, 1], pos: 3..6}
      - decode: {seq: 2, pos: 0..9}
    """


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(moves=st.lists(st.tuples(st.sampled_from(["keys", "zero", "restore", "pooled", "clear"]),
                                st.lists(st.integers(0, 31), min_size=1, max_size=4,
                                         unique=True),
                                st.lists(st.integers(0, 31), min_size=1, max_size=4,
                                         unique=True)),
                      min_size=1, max_size=6),
       core=st.sampled_from(["reference", "compiled"]))
def test_incremental_check_after_any_row_change(moves, core: str) -> None:
    """Every way a row can change between two checks, applied directly to the backend
    while the layout stays put (no pool new, no sequence rebuilt): the recheck of
    the changed rows' pools must find what a full recomputation finds, and a pooling
    the scatter would keep must equal pooling again (a member row rewritten alone
    included, which an engine's edits rarely reach)."""
    t = trace(BASE)
    be = ValueBackend(t.cache, t.seed, "numpy")
    rp = Replayer(t, REP_ONCE, be, core=core)
    for _ in rp.run():
        pass
    lay = rp.layout
    next_id = 1000
    for kind, a, b in moves:
        rows = np.array(a, dtype=np.int64)
        if kind == "keys":
            be.write_rows(rows, np.arange(next_id, next_id + rows.size))
            next_id += rows.size
        elif kind == "zero":
            be.zero_rows(rows)
        elif kind == "restore":
            n = min(len(a), len(b))
            be.snapshot("x", rows[:n])
            be.restore("x", np.array(b[:n], dtype=np.int64))
        elif kind == "pooled":
            # a scatter of row b's correct pooling elsewhere (what a stray entry does)
            src = np.array(b[: len(a)], dtype=np.int64)
            members = np.repeat(src[:, None], 2, axis=1)
            slots = be.slots.own(rows[: src.size], zero_new=True)
            be.slots.pooled[slots] = reference.pool(be.slots.key, be.slots.gate,
                                                    be.slots.of(members))
            be.slots.pool_gen[slots] = 0  # as every write of a pooled row but the scatter's
            be.verifier.touch(rows[: src.size], False, True)
        else:
            be.clear()
        # a scatter now of every pool: what it keeps equals pooling again
        for sq in lay.seqs:
            ks = np.arange(len(sq.pools), dtype=np.int64)
            members = be.slots.of(sq.members(ks, be.kpool, be.kv_size))
            reps = be.slots.of(sq.rep_rows.view[ks])
            keep = reference.kept(be.slots.pool_of, be.slots.pool_gen, be.slots.key_gen,
                                  members, reps)
            assert np.array_equal(be.slots.pooled[reps[keep]].view(np.uint32),
                                  pooling(be, members[keep]).view(np.uint32)), (kind, a, b)
        be.verifier.verify(lay, LayoutChange(tuple(len(sq.pools) for sq in lay.seqs),
                                             frozenset(), frozenset(), 0), rp.cache)
        full = full_bad(be, lay)
        for inc, want in zip(be.bad, full, strict=True):
            assert np.array_equal(inc, want), (kind, a, b)
        assert be.verifier.bad_seqs == {s for s, w in enumerate(full) if w.any()}


def test_a_new_key_on_the_last_kept_tail_is_looked_up() -> None:
    """The verification's shortcut (`Verifier._sequences`: no sequence is looked up when
    the least changed pair lies past the greatest kept tail) at its bound: a new key
    on the rep row of seq 2's last pool, whose pair is the greatest tail itself. Seqs 0
    and 1 hold cells 0..8 (pos 0..5 each, 3..5 shared); seq 2, pos 0..8, cells 9..17:
    kpool 2 pools at pos 0, 2, 4, 6, the last one's rep pos 7 in cell 16, global row
    16. It must be looked up and that pool found bad, as a full recomputation finds
    it; a `<` for the `<=` missed it."""
    t = trace(BASE)
    be = ValueBackend(t.cache, t.seed, "numpy")
    rp = Replayer(t, REP_ONCE, be, core="compiled")
    for _ in rp.run():
        pass
    lay = rp.layout
    sq = lay.seqs[2]
    assert sq.rep_pos_.view.tolist() == [1, 3, 5, 7] and sq.rep_rows.view.tolist() == [
        10, 12, 14, 16]
    assert bool(lay.known_equal_seqs(rp.cache)[2])
    assert not be.bad[2].any()
    be.write_rows(np.array([16]), np.array([1000]))
    be.verifier.verify(lay, LayoutChange(tuple(len(q.pools) for q in lay.seqs), frozenset(),
                                         frozenset(), 0), rp.cache)
    assert be.bad[2].tolist() == [False, False, False, True]
    assert [b.tolist() for b in be.bad] == [b.tolist() for b in full_bad(be, lay)]


@pytest.mark.parametrize("core", ["reference", "compiled"])
def test_after_a_clear_every_kept_pool_of_one_sequence_is_rechecked(core: str) -> None:
    """`Verifier.verify` after the backend's clear (`all_changed`) rechecks every pool,
    even those the layout says it kept, and for one sequence alone as for many: seq 0
    holds pos 0..7 in cells 0..7, kpool 4, so pools at pos 0..3 and 4..7 with rep rows
    3 and 7. A new key on member row 1 makes pool 0 bad; after a clear every row is a
    zero row, whose pooling (of zero keys) is the zero rep row, so no pool is bad,
    although the layout kept both."""
    t = trace("""
    kpool_trace: 1
    cache: {kv_size: 16, kpool: 4, n_seq_max: 1, n_embd: 4}
    ops:
      - decode: {seq: 0, pos: 0..8}
    """)
    be = ValueBackend(t.cache, t.seed, "numpy")
    rp = Replayer(t, REP_ONCE, be, core=core)
    for _ in rp.run():
        pass
    lay = rp.layout
    assert lay.seqs[0].rep_rows.view.tolist() == [3, 7]
    kept = LayoutChange((2,), frozenset(), frozenset(), 0)  # both pools, as they stand
    be.write_rows(np.array([1]), np.array([1000]))
    be.verifier.verify(lay, kept, rp.cache)
    assert be.bad[0].tolist() == [True, False] and be.verifier.bad_seqs == {0}
    be.clear()
    be.verifier.verify(lay, kept, rp.cache)
    assert be.bad[0].tolist() == [False, False] and be.verifier.bad_seqs == set()
    assert [b.tolist() for b in be.bad] == [b.tolist() for b in full_bad(be, lay)]


def _two_pools(backend: str) -> tuple[ValueBackend, Replayer]:
    """seq 0 at pos 0..7 in cells 0..7, kpool 4, replayed on the compiled core: pools
    on rows 0..3 and 4..7, rep rows 3 and 7, each pooled by the scatter (its slot
    records the member slots and when), none bad."""
    t = trace("""
    kpool_trace: 1
    cache: {kv_size: 16, kpool: 4, n_seq_max: 1, n_embd: 4}
    ops:
      - decode: {seq: 0, pos: 0..8}
    """)
    be = ValueBackend(t.cache, t.seed, backend)
    rp = Replayer(t, REP_ONCE, be, core="compiled")
    for _ in rp.run():
        pass
    assert rp.layout.seqs[0].rep_rows.view.tolist() == [3, 7]
    assert be.bad[0].tolist() == [False] * 2
    return be, rp


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_member_key_written_after_the_pooling_makes_the_pool_bad(backend: str) -> None:
    """`_two_pools`. A new key on member row 1, with no scatter since: the rep slot of
    pool 0 still names the same member slots, but one was written after the pooling,
    so the numba twin, which judges by generation, must pool it again: pool 0 is bad,
    pool 1 is not, as the numpy twin (which pools every pool) finds."""
    be, rp = _two_pools(backend)
    be.write_rows(np.array([1]), np.array([1000]))
    be.verifier.verify(rp.layout, LayoutChange((2,), frozenset(), frozenset(), 0), rp.cache)
    assert be.bad[0].tolist() == [True, False]


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_new_pool_not_pooled_is_bad_in_one_call(backend: str) -> None:
    """`_two_pools`. A new key on row 5, then an update said to keep pool 0 alone: pool
    1 is past the kept ones (NEW), the changed pair (5, cell 5) lies past the kept
    tail (pool 0's rep pair, (3, cell 3)), so the one-call verification
    (`Verifier._one_sequence`) answers, and finds pool 1 bad (a member written after
    its pooling) and pool 0 as it was: [False, True], what a full recomputation
    finds."""
    from kpool_cli.backend import recheck

    be, rp = _two_pools(backend)
    be.write_rows(np.array([5]), np.array([1000]))
    ways = []
    door = be.kernels.recheck_one
    be.kernels.recheck_one = lambda *a: ways.append(got := door(*a)) or got  # type: ignore
    be.verifier.verify(rp.layout, LayoutChange((1,), frozenset(), frozenset(), 0), rp.cache)
    assert [w if w is None else w[0] for w in ways] == [recheck.NEW]
    assert be.bad[0].tolist() == [False, True] and be.verifier.bad_seqs == {0}
    assert [b.tolist() for b in be.bad] == [b.tolist() for b in full_bad(be, rp.layout)]


# -- a layout of many sequences in one call ----------------------------------------------


def _two_sequences(backend: str) -> tuple[ValueBackend, Replayer, list]:
    """seq 0 at pos 0..7 in cells 0..7, then seq 1 at pos 0..7 in cells 8..15, kpool 4,
    one unified stream, on the compiled core (whose layout knows both sequences' pairs
    equal the cache's): pools on rows 0..3, 4..7 (rep rows 3, 7) and 8..11, 12..15 (rep
    rows 11, 15), each pooled by the scatter, none bad. Returns the backend, the
    replay, and what each later `recheck_many` door call answered."""
    t = trace("""
    kpool_trace: 1
    cache: {kv_size: 32, kpool: 4, n_seq_max: 2, n_embd: 4}
    ops:
      - decode: {seq: 0, pos: 0..8}
      - decode: {seq: 1, pos: 0..8}
    """)
    be = ValueBackend(t.cache, t.seed, backend)
    rp = Replayer(t, REP_ONCE, be, core="compiled")
    for _ in rp.run():
        pass
    lay = rp.layout
    assert [sq.rep_rows.view.tolist() for sq in lay.seqs] == [[3, 7], [11, 15]]
    assert [sq.rep_pos_.view.tolist() for sq in lay.seqs] == [[3, 7], [3, 7]]
    assert lay.known_equal_seqs(rp.cache).tolist() == [True, True]
    assert [b.tolist() for b in be.bad] == [[False, False]] * 2
    answers: list = []
    door = be.kernels.recheck_many
    be.kernels.recheck_many = (  # type: ignore[method-assign]
        lambda *a: answers.append(got := door(*a)) or got)
    return be, rp, answers


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_member_written_after_its_pooling_is_bad_in_one_call_of_many(backend: str) -> None:
    """`_two_sequences`. A new key on row 5 (seq 0's pos 5, a member of its pool 1,
    written after that pool's pooling), then an update said to keep seq 0's pool 0
    and both of seq 1's (seq 0's pools changed: its pool 1 is new). By hand: seq 0
    kept 1 of its 2 pools with 2 verdicts: NEW, pool 1 to judge; seq 1 kept 2 of 2
    with 2 verdicts: NONE. Both are known equal and kept pools, so each has a tail,
    its last kept pool's rep pair: seq 0's (pos 3, cell 3), seq 1's (pos 7, cell 15).
    The changed pair, (pos 5, cell 5), lies past seq 0's tail but before seq 1's, so
    the lowest pair each sequence holds is asked: seq 1 does not hold cell 5, so no
    sequence looks up, and the one call (`Verifier._many_sequences`) answers.
    Pool 1 of seq 0 (rows 4..7 -> 7): its rep slot names rows 4..7's slots, but row
    5's key was written after the pooling, so the numba twin pools it again, as the
    numpy twin always does, and the new key makes it differ: bad. Seq 0: [False,
    True] (pool 0 as it was), seq 1 untouched: [False, False]; bad_seqs {0}; 1 pool
    checked; what a full recomputation finds. Then a new key on row 4 too, the same
    update: the pool is judged again, now with seq 0's verdicts held (it is in
    bad_seqs), and stays bad, pool 0 as it was."""
    be, rp, answers = _two_sequences(backend)
    checked = be.verifier.pools_checked
    be.write_rows(np.array([5]), np.array([1000]))
    be.verifier.verify(rp.layout, LayoutChange((1, 2), frozenset(), frozenset({0}), 0),
                       rp.cache)
    assert len(answers) == 1 and answers[0] is not None
    how, verdicts = answers[0]
    assert how.tolist() == [recheck.NEW, recheck.NONE] and verdicts.tolist() == [True]
    assert [b.tolist() for b in be.bad] == [[False, True], [False, False]]
    assert be.verifier.bad_seqs == {0} and be.verifier.n_checked.tolist() == [2, 2]
    assert be.verifier.pools_checked == checked + 1
    assert [b.tolist() for b in be.bad] == [b.tolist() for b in full_bad(be, rp.layout)]
    be.write_rows(np.array([4]), np.array([1001]))
    be.verifier.verify(rp.layout, LayoutChange((1, 2), frozenset(), frozenset({0}), 0),
                       rp.cache)
    assert len(answers) == 2 and answers[1] is not None
    assert answers[1][1].tolist() == [True]
    assert [b.tolist() for b in be.bad] == [[False, True], [False, False]]
    assert be.verifier.bad_seqs == {0}


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_changed_pair_before_a_tail_it_holds_is_left_to_the_general_way(backend: str
                                                                         ) -> None:
    """`_two_sequences`. A new key on row 13 (seq 1's pos 5, a member of its pool 1,
    rows 12..15), and an update said to keep seq 0's pool 0 (its pool 1 new) and both
    of seq 1's: seq 0 is NEW, seq 1 NONE, but the changed pair (pos 5, cell 13) lies
    before seq 1's tail (pos 7, cell 15) and seq 1 holds it, so seq 1 must look its
    pools up (LOOK): the one call refuses (None) and the general way answers, finding
    seq 0's pool 1 as it was (its rows untouched since the scatter pooled them) and
    pool 1 of seq 1 bad (its member written after the pooling): [False, False] and
    [False, True], bad_seqs {1}, what a full recomputation finds. An update that
    changed no sequence's pools is not asked at all (every way NONE, LOOK or SCAN):
    the general way answers it."""
    be, rp, answers = _two_sequences(backend)
    be.write_rows(np.array([13]), np.array([1000]))
    be.verifier.verify(rp.layout, LayoutChange((1, 2), frozenset(), frozenset({0}), 0),
                       rp.cache)
    assert answers == [None]
    assert [b.tolist() for b in be.bad] == [[False, False], [False, True]]
    assert be.verifier.bad_seqs == {1}
    assert [b.tolist() for b in be.bad] == [b.tolist() for b in full_bad(be, rp.layout)]
    be.write_rows(np.array([12]), np.array([1001]))
    be.verifier.verify(rp.layout, LayoutChange((2, 2), frozenset(), frozenset(), 0),
                       rp.cache)
    assert answers == [None]  # not asked
    assert [b.tolist() for b in be.bad] == [[False, False], [False, True]]
    assert [b.tolist() for b in be.bad] == [b.tolist() for b in full_bad(be, rp.layout)]


def _check_many_sequence_traces(check) -> None:
    """`check(t, version)` of 150 random traces of two or three sequences
    (`value_traces`), each under an engine variant."""
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck),
              database=None, derandomize=True)
    @given(t=value_traces(), engine=st.sampled_from(sorted(VARIANTS)))
    def run(t: m.Trace, engine: str) -> None:
        check(t, VARIANTS[engine])

    run()


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_the_one_call_of_many_sequences_equals_the_general_way(backend: str) -> None:
    """On random traces of several sequences, replayed in lockstep on the compiled
    core by two backends, one of them with the one-call verification of many
    sequences forced off (`Verifier._many_sequences` never answers, so `_sequences`
    and `_recheck` do): after every op both have the same verdicts of every pool, the
    same sequences with a bad pool, the same counts (verdicts per sequence, pools
    checked) and the same records. The one call answers the ubatches whose update
    changed pools, with bad pools among its verdicts and held, and hands some back."""
    calls = {"answered": 0, "bad": 0, "held": 0, "refused": 0}

    def check(t: m.Trace, version: EngineVersion) -> None:
        one, general = (ValueBackend(t.cache, t.seed, backend) for _ in range(2))
        general.verifier._many_sequences = lambda *a: False  # type: ignore[method-assign]
        real, door = one.verifier._many_sequences, one.kernels.recheck_many
        got: list = []
        one.kernels.recheck_many = (  # type: ignore[method-assign]
            lambda *a: got.append(r := door(*a)) or r)

        def counted(layout, change, cache) -> bool:  # type: ignore[no-untyped-def]
            held = bool(one.verifier.bad_seqs)
            got.clear()
            answered = real(layout, change, cache)
            if got:
                calls["answered" if answered else "refused"] += 1
                calls["bad"] += answered and bool(got[0][1].any())
                calls["held"] += answered and held
            return answered

        one.verifier._many_sequences = counted  # type: ignore[method-assign]
        for a, b in zip(Replayer(t, version, one, core="compiled").run(),
                        Replayer(t, version, general, core="compiled").run(), strict=True):
            assert [x.tolist() for x in one.bad] == [x.tolist() for x in general.bad]
            assert one.verifier.bad_seqs == general.verifier.bad_seqs
            assert one.verifier.n_checked.tolist() == general.verifier.n_checked.tolist()
            assert one.verifier.pools_checked == general.verifier.pools_checked
            assert as_json(a, t) == as_json(b, t)

    _check_many_sequence_traces(check)
    assert calls["answered"] > 200 and calls["refused"] > 3, calls
    assert calls["bad"] > 3 and calls["held"] > 5, calls


def test_recheck_many_twins_agree_on_random_traces(monkeypatch) -> None:
    """kernels.recheck_many (numba) on the random traces of several sequences above:
    each call gives what its numpy twin (reference.py `recheck_many`) gives from a
    copy of the same arrays (the same answer, or None alike; the same ways and
    verdicts bit for bit), and neither writes any array it is handed. Both answers and
    refusals are reached."""
    from kpool_cli.backend import kernels

    seen = {"answered": 0, "refused": 0}
    real = kernels.recheck_many

    def twinned(*args):  # type: ignore[no-untyped-def]
        copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        want = reference.recheck_many(*copies)
        got = real(*args)
        assert (got is None) == (want is None)
        if got is not None:
            for x, y in zip(got, want, strict=True):
                assert x.dtype == y.dtype and np.array_equal(x, y), (got, want)
        seen["refused" if got is None else "answered"] += 1
        for a, c in zip(args, copies, strict=True):
            if isinstance(a, np.ndarray):
                assert a.tobytes() == c.tobytes()
        return got

    monkeypatch.setattr(kernels, "recheck_many", twinned)
    _check_many_sequence_traces(
        lambda t, version: check_incremental(t, version, "compiled", "numba"))
    assert seen["answered"] > 200 and seen["refused"] > 3, seen


# -- a pooling kept, not recomputed -------------------------------------------------------


class PoolEveryEntry(ValueBackend):
    """The backend with every scatter entry pooled afresh, no plan standing: what the
    kept poolings must be bit-equal to."""

    def _standing_slots(self, arrays: tuple[np.ndarray, ...]) -> np.ndarray | None:
        return None

    def _vouched(self, ctx) -> None:
        return None

    def _fresh(self, entry_rows: np.ndarray, rep: np.ndarray, order: np.ndarray,
               starts: np.ndarray, rows: np.ndarray, grown: np.ndarray | None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        # every group fresh, every entry pooled afresh
        return (np.arange(rows.size), np.arange(rep.size), np.zeros(rep.size, dtype=bool),
                0)

    def _scatter_singles(self, *plan: np.ndarray) -> None:
        return None  # the pass that pools every entry afresh (`_fresh`), not the one pass

    def _one_step(self, ctx, rows: np.ndarray, key_ids: np.ndarray) -> tuple[int, None]:
        return WROTE_NOTHING, None  # each part on its own, as above: not the one call


def as_json(rec, t: m.Trace) -> dict:
    """A record as the report writes it (findings with their value evidence)."""
    if isinstance(rec, UbatchRecord):
        return ubatch_json(rec)
    return event_json(rec)


def kept_equals_pooled(t: m.Trace, version: EngineVersion, core: str = "reference"
                       ) -> ValueBackend:
    """Replay on `core` with and without kept poolings (and standing plans) in
    lockstep: every row's pooled value, its writer and every verdict must be equal
    after each op. Returns the backend that keeps them (`pools_kept`,
    `ubatches_standing`: a plan stands only on the compiled core, whose re-pool-all
    plans and race groups are the same arrays while the pools stand, and its plans of
    padding alone while the rep rows stand)."""
    kept, fresh = ValueBackend(t.cache, t.seed, "numpy"), PoolEveryEntry(t.cache, t.seed, "numpy")
    rows = range(t.cache.n_rows)
    for a, b in zip(Replayer(t, version, kept, core=core).run(),
                    Replayer(t, version, fresh, core=core).run(), strict=True):
        assert as_json(a, t) == as_json(b, t)
        assert np.array_equal(kept.row_values("pooled").view(np.uint32),
                              fresh.row_values("pooled").view(np.uint32))
        assert [kept.content(r) for r in rows] == [fresh.content(r) for r in rows]
    assert fresh.pools_kept == 0 and fresh.ubatches_standing == 0
    return kept


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(t=value_traces(), engine=st.sampled_from(sorted(VARIANTS)))
def test_a_kept_pooling_equals_pooling_again(t: m.Trace, engine: str) -> None:
    kept_equals_pooled(t, VARIANTS[engine])


def test_cache_safe_keeps_the_unchanged_pools_and_repools_a_rewritten_one() -> None:
    """kpool 2, cache-safe; seq 1 shares seq 0's cells 0..3, so every ubatch marks every
    pool (ENGINE.md §6). Ubatch 0 (pos 0..3) pools 0:0 and 0:1 (rows 0,1 and 2,3).
    Ubatch 1 (pos 4, row 4) marks 0:0 0:1 1:0 1:1, each on a rep row (1, 3) that holds
    the pooling of the same member rows, unwritten since: 4 kept. Ubatch 2 (pos 5)
    adds 0:2 (rows 4, 5: new) and keeps the other 4: 8. seq_rm 0 from pos 2 and pos
    2..5 again: 0:1 lands on rows 4, 5 with new keys (row 5 held the pooling of rows
    4, 5, written since: pooled again), 0:2 on rows 6, 7; 0:0, 1:0, 1:1 kept: 11."""
    t = trace("""
        kpool_trace: 1
        cache: {kv_size: 16, kpool: 2, n_seq_max: 2, n_embd: 4, n_rs_seq: 8}
        ops:
          - decode: {seq: 0, pos: 0..4}
          - seq_cp: {src: 0, dst: 1}
          - decode: {seq: 0, pos: 4}
          - decode: {seq: 0, pos: 5}
          - seq_rm: {seq: 0, p0: 2, p1: -1}
          - decode: {seq: 0, pos: 2..6}
        """)
    be = ValueBackend(t.cache, t.seed, "numpy")
    kept, reps = [], []
    for rec in Replayer(t, VERSIONS["cache-safe"], be).run():
        if isinstance(rec, UbatchRecord):
            kept.append(be.pools_kept)
            reps.append(rec.scatter_rep.tolist())
    assert reps[3] == [1, 5, 7, 1, 3]
    assert kept == [0, 4, 8, 11]
    assert kept_equals_pooled(t, VERSIONS["cache-safe"]).pools_kept == 11


def _asked(be: ValueBackend) -> list[int]:
    """Spies on `be`'s `fresh_groups` kernel, and on `scatter_singles`, which asks it
    of every entry too: the entries of each call, as they come."""
    calls: list[int] = []
    real, one_pass = be.kernels.fresh_groups, be.kernels.scatter_singles

    def spy(entry_rows, *rest):
        calls.append(len(entry_rows))
        return real(entry_rows, *rest)

    def spy_one_pass(entry_rows, *rest):
        calls.append(len(entry_rows))
        return one_pass(entry_rows, *rest)
    be.kernels.fresh_groups = spy  # type: ignore[method-assign]
    be.kernels.scatter_singles = spy_one_pass  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("core", ["reference", "compiled"])
def test_cache_safe_asks_only_the_pools_an_update_added(core: str) -> None:
    """store.py `_Standing.new_entries`. kpool 2, cache-safe, seq 1 shares seq 0's
    cells 0..3 (every ubatch marks every pool from then on). Ubatch 0 (pos 0..3):
    pools 0:0, 0:1 and a padding entry (n_new_g 3), asked, none kept. Ubatch 1 (pos
    4): the update adds 1:0, 1:1 and keeps 0:0, 0:1, whose entries the standing plan
    vouches for; the groups of rows 1 and 3 are asked (4 entries), all kept: 4.
    Ubatch 2 (pos 5): it adds 0:2 (rows 4, 5): one entry asked, new keys, not kept;
    the other 4 vouched: 8. Ubatch 3 (pos 6): no pool added, none asked (the compiled
    core's plan stands; the reference's new arrays are all vouched for): 13. Ubatch 4
    (pos 7): 0:3 (rows 6, 7), one entry asked: 18. seq_rm of seq 1 makes both
    sequences stale from pos 0 (their cells were shared): ubatch 5 (pos 8) rebuilds
    seq 0, unshared now, and marks its 4 pools as stale, not every pool: all 4
    asked, all kept (their rows untouched): 22."""
    t = trace("""
        kpool_trace: 1
        cache: {kv_size: 16, kpool: 2, n_seq_max: 2, n_embd: 4}
        ops:
          - decode: {seq: 0, pos: 0..4}
          - seq_cp: {src: 0, dst: 1}
          - decode: {seq: 0, pos: 4}
          - decode: {seq: 0, pos: 5}
          - decode: {seq: 0, pos: 6}
          - decode: {seq: 0, pos: 7}
          - seq_rm: {seq: 1}
          - decode: {seq: 0, pos: 8}
        """)
    be = ValueBackend(t.cache, t.seed, "numpy")
    asked = _asked(be)
    kept = [be.pools_kept for rec in Replayer(t, VERSIONS["cache-safe"], be, core=core).run()
            if isinstance(rec, UbatchRecord)]
    assert kept == [0, 4, 8, 13, 18, 22]
    assert asked == [3, 4, 1, 1, 4]
    assert kept_equals_pooled(t, VERSIONS["cache-safe"], core).pools_kept == 22


def test_a_standing_every_pool_plan_vouches_for_the_very_next_update_alone() -> None:
    """store._Standing.new_entries, by hand: a standing plan of every pool (members
    0..3, rep 3), left by update 5 with 2 pools in seq 0 and 1 in seq 1 (pool_start
    0, 2, 3). Update 6 keeps 2 pools of seq 0 and 1 of seq 1 and leaves 3 and 1
    (pool_start 0, 3, 4): the entries it does not vouch for are seq 0's third pool,
    entry 2, and it dropped none of the plan's pools (`dropped_none`). The same change
    as update 7 (one in between, not scattered), a plan that is not every pool, or a
    touched row of the plan: none. Left with 3 and 1 pools (pool_start 0, 3, 4), the
    same update dropped seq 0's third."""
    from types import SimpleNamespace as NS

    from kpool_cli.backend.store import _Standing

    standing = _Standing(16)
    members = np.arange(4, dtype=np.int64)[None, :]
    standing.set((members,), members, np.array([3]), np.array([1]), (5, np.array([0, 2, 3])))
    every = np.arange(4)
    layout = NS(is_every_pool=lambda ips: ips is every,
                pool_start=lambda: np.array([0, 3, 4]))

    def new(serial: int, pools: np.ndarray = every, touched: tuple[int, ...] = (9,)):
        change = LayoutChange((2, 1), frozenset(), frozenset(), 0, serial)
        got = standing.new_entries(layout, change, pools,  # type: ignore[arg-type]
                                   lambda: np.array(touched, dtype=np.int64))
        return None if got is None else got.tolist()

    assert new(6) == [2]
    change = LayoutChange((2, 1), frozenset(), frozenset(), 0, 6)
    assert standing.dropped_none(change)
    assert new(7) is None and new(6, np.arange(4)) is None and new(6, touched=(1,)) is None
    standing.set((members,), members, np.array([3]), np.array([1]), (5, np.array([0, 3, 4])))
    assert new(6) == [2] and not standing.dropped_none(change)


def test_shipped_traces_keep_poolings_bit_equal() -> None:
    """Every shipped trace, both engines, both cores: kept poolings equal pooling
    again, and cache-safe keeps some (it re-marks unchanged pools), some of them by a
    standing plan."""
    from pathlib import Path

    from kpool_cli.trace.load import load_trace
    n_kept = n_standing = 0
    for path in sorted(Path(__file__).resolve().parent.parent.glob("traces/*.yaml")):
        t = load_trace(path)
        for engine in ENGINES:
            for core in ("reference", "compiled"):
                be = kept_equals_pooled(t, VERSIONS[engine], core)
                if engine == "cache-safe":
                    n_kept += be.pools_kept
                    n_standing += be.ubatches_standing
    assert n_kept > 0 and n_standing > 0


def test_a_stream_copy_forgets_the_destination_poolings() -> None:
    """Non-unified, kv 8: row 9 (stream 1) holds the pooling of rows 8, 9 as a scatter
    leaves it. A cross-stream copy 0 -> 1 brings row 1's pooled value (here 7s, no
    pooling at all) into row 9 and rows 0, 1's keys into 8, 9: the rows 8, 9 entry must
    be pooled again, not keep row 9's value."""
    cfg = m.CacheConfig(kv_size=8, kpool=2, n_seq_max=2, unified=False, n_embd=4)
    be = ValueBackend(cfg, 0, "numpy")
    be.write_rows(np.array([0, 1, 8, 9]), np.array([1, 2, 3, 4]))
    s = be.slots.of(np.array([0, 1, 8, 9]))
    be.slots.next_gen()  # what a scatter does: a pooling of rows 8, 9 into row 9
    be.slots.pooled[s[3]] = pooling(be, s[None, 2:])[0]
    be.slots.pool_of[s[3]], be.slots.pool_gen[s[3]] = s[2:], be.slots.gen
    members, rep = s[None, 2:].copy(), s[3:]

    def kept() -> list[bool]:  # the scatter's question of one entry, rows 8, 9 -> row 9
        return be.kernels.fresh_groups(np.array([[8, 9]]), np.array([9]), np.array([0]),
                                       np.array([0, 1]), np.array([9]))[1].tolist()

    assert kept() == [True]  # kept: the pooling is still right
    assert be.slots.pooled[rep].tobytes() == pooling(be, members).tobytes()
    be.slots.pooled[s[1]] = 7
    be.copy_stream(0, 1)
    assert (be.row_values("pooled", np.array([9])) == 7).all()
    assert kept() == [False]


# kpool 4, cache-safe: a prompt of two pools that seq 1 then shares, and five decodes
SHARED_PROMPT = """
    kpool_trace: 1
    cache: {kv_size: 32, kpool: 4, n_seq_max: 2, n_embd: 4}
    ops:
      - decode: {seq: 0, pos: 0..8}
      - seq_cp: {src: 0, dst: 1}
      - decode: {seq: 0, pos: 8}
      - decode: {seq: 0, pos: 9}
      - decode: {seq: 0, pos: 10}
      - decode: {seq: 0, pos: 11}
      - decode: {seq: 0, pos: 12}
    """


def test_a_ubatch_of_kept_poolings_touches_no_pooled_row() -> None:
    """store.ValueBackend._scatter: what changed costs, not what was marked. kpool 4,
    cache-safe: the prompt (pos 0..7) pools 0:0 (cells 0..3, rep row 3) and 0:1 (4..7,
    rep 7), plus one padding entry on row 0: 3 pooled, 3 rows scattered. seq_cp 0 -> 1
    shares cells 0..7, so every later ubatch marks 0:0 0:1 1:0 1:1 (ENGINE.md §6), on
    rep rows 3 and 7 that hold the pooling of the same, unwritten member rows: pos 8,
    9 and 10 keep all four, and no value kernel runs (nothing pooled, gathered or
    scattered). pos 11 completes 0:2 (cells 8..11, rep 11): one entry pooled, one row
    scattered, the other four kept. pos 12 keeps all five."""
    t = trace(SHARED_PROMPT)
    be = ValueBackend(t.cache, t.seed, "numpy")
    # (entries pooled, entries of fresh groups kept, rows written), of `scatter_fresh`
    # or of `scatter_singles` (whose fresh groups are one entry each: none kept)
    calls: list[tuple[int, int, int]] = []
    real, one_pass = be.kernels.scatter_fresh, be.kernels.scatter_singles

    def spy(members, reps, keep, s, src):
        calls.append((int((~keep).sum()), int(keep.sum()), len(s)))
        return real(members, reps, keep, s, src)

    def spy_one_pass(entry_rows, *rest):
        got = one_pass(entry_rows, *rest)
        if got is not None and len(entry_rows) > got[2]:
            calls.append((len(entry_rows) - got[2], 0, len(entry_rows) - got[2]))
        return got
    be.kernels.scatter_fresh = spy  # type: ignore[method-assign]
    be.kernels.scatter_singles = spy_one_pass  # type: ignore[method-assign]
    seen = []
    for rec in Replayer(t, VERSIONS["cache-safe"], be).run():
        if isinstance(rec, UbatchRecord):
            seen.append((rec.scatter_rep.tolist(), list(calls), be.pools_kept))
            calls.clear()
    assert seen == [
        ([3, 7, 0], [(3, 0, 3)], 0),
        ([3, 7, 3, 7], [], 4),
        ([3, 7, 3, 7], [], 8),
        ([3, 7, 3, 7], [], 12),
        ([3, 7, 11, 3, 7], [(1, 0, 1)], 16),
        ([3, 7, 11, 3, 7], [], 21),
    ]


def test_a_standing_plan_asks_nothing_of_its_pools() -> None:
    """store._Standing, by hand, on SHARED_PROMPT (as above). The prompt's plan has a
    padding entry, pos 8's is every pool of both sequences (0:0 0:1 1:0 1:1, the
    layout's own columns): both are asked of all their entries (3, then 4), and every
    entry of pos 8's keeps its pooling. pos 9 and 10 write rows 9 and 10, in no pool:
    the plan stands and nothing is asked. pos 11 completes 0:2, a new plan of 5 entries,
    of which the standing plan vouches for its own 4 (the update only added 0:2): 0:2's
    entry alone is asked. pos 12 writes row 12, in no pool: it stands again. (The
    compiled core: its race groups of a re-pool-all plan are the same arrays while the
    pools stand.)"""
    t = trace(SHARED_PROMPT)
    be = ValueBackend(t.cache, t.seed, "numpy")
    calls = _asked(be)
    seen = []
    for rec in Replayer(t, VERSIONS["cache-safe"], be, core="compiled").run():
        if isinstance(rec, UbatchRecord):
            seen.append((list(calls), be.ubatches_standing, be.pools_kept))
            calls.clear()
    assert seen == [([3], 0, 0), ([4], 0, 4), ([], 1, 8), ([], 2, 12), ([1], 2, 16),
                    ([], 3, 21)]


def test_a_member_written_between_ubatches_breaks_the_standing_plan() -> None:
    """store._Standing, by hand: SHARED_PROMPT up to pos 9, whose plan stands (0:0 and
    1:0 on rep row 3, members rows 0..3). A new key in row 1 (a member of both) before
    pos 10, and a verification right after it (which empties its own lists of what
    changed, not the scatter's): the plan is asked again (4 entries), and row 3 then
    holds the pooling of rows 0..3 with that key, where it held another; no pool is
    bad."""
    t = trace(SHARED_PROMPT)
    be = ValueBackend(t.cache, t.seed, "numpy")
    calls = _asked(be)
    n_ubatch, before = 0, None
    rp = Replayer(t, VERSIONS["cache-safe"], be, core="compiled")
    for rec in rp.run():
        if not isinstance(rec, UbatchRecord):
            continue
        n_ubatch += 1
        if n_ubatch == 3:  # pos 9, standing
            assert calls == [3, 4] and be.ubatches_standing == 1
            before = be.row_values("pooled", np.array([3])).copy()
            be.write_rows(np.array([1]), np.array([1000]))
            lay = rp.layout
            be.verifier.verify(lay, LayoutChange(tuple(len(q.pools) for q in lay.seqs),
                                                 frozenset(), frozenset(), 0), rp.cache)
            calls.clear()
        if n_ubatch == 4:  # pos 10
            break
    assert calls == [4] and be.ubatches_standing == 1
    members = be.slots.of(np.arange(4, dtype=np.int64))[None, :]
    now = be.row_values("pooled", np.array([3]))
    assert now.tobytes() == pooling(be, members).tobytes() != before.tobytes()
    assert not any(b.any() for b in be.bad)


def test_a_standing_plan_is_broken_by_its_own_rows_alone_across_plans_and_the_wrap() -> None:
    """store._Standing's stamps, by hand, on 16 rows. Plan A (members 0..3, rep 3) is
    met again: stamped. Plan B (members 4..7, rep 7) replaces it: row 1, A's alone,
    touched, leaves B standing (a new plan unstamps nothing); row 5 breaks it. Then
    the stamps wrap: plan C (members 8..11, rep 11) is stamped right after the last
    stamp: rows 1 and 5, stamped before the wrap, leave C standing; row 9 breaks it."""
    from kpool_cli.backend.store import _Standing

    standing = _Standing(16)
    slots = np.array([42])

    def plan(first: int) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray]:
        members = np.arange(first, first + 4, dtype=np.int64)[None, :]
        rep = np.array([first + 3])
        return (members, rep), members, rep

    def asks(arrays, touched: list[int]) -> bool:
        return standing.slots(arrays, lambda: np.array(touched, dtype=np.int64)) is slots

    a = plan(0)
    standing.set(*a, slots)
    assert asks(a[0], [12]) and not asks(a[0], [1])
    b = plan(4)
    standing.set(*b, slots)
    assert asks(b[0], [1]) and asks(b[0], [3]) and not asks(b[0], [5])
    standing._stamp = standing._STAMP_LAST
    c = plan(8)
    standing.set(*c, slots)
    assert asks(c[0], [1, 5]) and not asks(c[0], [9])


def test_a_grown_plan_carries_the_stamp_and_stamps_its_new_entries_alone() -> None:
    """store._Standing.set with `new`, by hand, on 16 rows. Plan A (members 0..3, rep
    3; members 8..11, rep 11) is met again: stamped. Plan B keeps A's first entry and
    adds members 4..7, rep 7 (entry 1, new): the stamp carries (it does not move)
    and rows 4..7 take it. Row 5 (B's new entry) and row 1 (its kept one) break B;
    row 9, of the entry B dropped, still holds the stamp and breaks it too (the
    conservative side: a full scatter then stamps afresh); row 12 leaves it standing."""
    from kpool_cli.backend.store import _Standing

    standing = _Standing(16)
    slots = np.array([42])

    def asks(arrays, touched: list[int]) -> bool:
        return standing.slots(arrays, lambda: np.array(touched, dtype=np.int64)) is slots

    a_members = np.array([[0, 1, 2, 3], [8, 9, 10, 11]], dtype=np.int64)
    a_rep = np.array([3, 11])
    standing.set((a_members, a_rep), a_members, a_rep, slots)
    assert asks((a_members, a_rep), [12])
    stamp = standing._stamp
    b_members = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=np.int64)
    b_rep = np.array([3, 7])
    b = (b_members, b_rep)
    standing.set(b, b_members, b_rep, slots, new=np.array([1]))
    assert standing._stamp == stamp
    assert [asks(b, [r]) for r in (5, 1, 9, 12)] == [False, False, False, True]


def test_standing_plans_equal_pooling_again_on_fuzzer_traces() -> None:
    """The fuzzer's random traces (kpool_cli.gen.random_trace: every edit, restores,
    clears, non-unified caches) under cache-safe on the compiled core, with and
    without standing plans and kept poolings: equal in lockstep
    (`kept_equals_pooled`), and some plans stand."""
    from kpool_cli.gen.random_trace import random_trace
    n_standing = 0
    for seed in range(150):
        n_standing += kept_equals_pooled(random_trace(seed), VERSIONS["cache-safe"],
                                         "compiled").ubatches_standing
    assert n_standing > 0


def standing_trace(seed: int) -> m.Trace:
    """A random trace built to stand plans and then break them (`_Standing`): a
    shared prompt of 2-4 pools that seq 0 copies to the others (so cache-safe marks
    every pool of a layout that stands while no pool closes), then mostly one-token
    decodes, between which any edit may come: a tail removed, a state written or read
    back, a partial copy, a shift, a clear, a decode that closes pools."""
    rng = random.Random(seed)
    n = rng.randint(2, 3)
    kpool = rng.randint(2, 4)
    cfg = m.CacheConfig(kv_size=rng.choice([32, 48, 64]), kpool=kpool, n_seq_max=n,
                        unified=rng.random() < 0.8, n_ubatch=512, n_embd=4)
    ops: list = [m.Decode(tuple(m.Token(p, (0,)) for p in range(kpool * rng.randint(2, 4))))]
    ops += [m.SeqCp(0, s) for s in range(1, n)]
    slots: list[str] = []
    for _ in range(rng.randint(10, 30)):
        cache = _state(cfg, ops).cache
        s = rng.randrange(n)
        top = cache.seq_pos_max(s)
        kind = rng.choice(["one"] * 8 + ["many", "rm_tail", "state_write", "state_read",
                                         "cp_part", "add", "clear"])
        if kind in ("one", "many"):  # every sequence a token, as parallel slots step
            ss = sorted(rng.sample(range(n), rng.randint(1, n))) if rng.random() < 0.3 \
                else list(range(n))
            length = 1 if kind == "one" else rng.randint(2, kpool + 1)
            ops.append(m.Decode(tuple(m.Token(cache.seq_pos_max(q) + 1 + k, (q,))
                                      for q in ss for k in range(length))))
        elif kind == "rm_tail" and top >= 0:
            ops.append(m.SeqRm(s, max(0, top - rng.randint(0, 2)), -1))
        elif kind == "state_write":
            slot = rng.choice("ab")
            ops.append(m.StateWrite(s, slot))
            slots.append(slot)
        elif kind == "state_read" and slots:
            ops.append(m.StateRead(s, rng.choice(slots)))
        elif kind == "cp_part" and top >= 0:
            ops.append(m.SeqCp(s, rng.randrange(n), rng.randint(0, top), -1))
        elif kind == "add" and top >= 0:
            ops.append(m.SeqAdd(s, rng.randint(0, top), -1, rng.randint(-2, 2)))
        elif kind == "clear":
            ops.append(m.Clear())
    return m.Trace(cfg, tuple(ops), seed=seed % 4)


def test_standing_plans_equal_pooling_again_between_any_edits() -> None:
    """`standing_trace`s under cache-safe on the compiled core: equal in lockstep to a
    backend that pools every entry afresh (`kept_equals_pooled`), with many plans
    standing between the edits that break them."""
    n_standing = 0
    for seed in range(40):
        n_standing += kept_equals_pooled(standing_trace(seed), VERSIONS["cache-safe"],
                                         "compiled").ubatches_standing
    assert n_standing > 40  # 51: a plan stands while the sequences share the prompt


def test_a_scatter_that_hands_out_a_slot_does_not_stand() -> None:
    """store._Standing, by hand, on the backend alone: one pool, member rows 0 and 1,
    rep row 1, row 1 never written (a zero row, slot 0). The first scatter reads the
    members as slots (1, 0), then hands row 1 a slot of its own to write: its recorded
    pooling names slot 0, which row 1 no longer has, so `fresh_groups` pools the entry
    again at the second scatter, and the plan must not stand: no entry is kept, and
    row 1 holds what the backend that never stands gives it."""
    from types import SimpleNamespace as NS
    cfg = m.CacheConfig(kv_size=16, kpool=2, n_seq_max=1, n_embd=4)
    plan = NS(entry_rep=np.array([1]), entry_rows=np.array([[0, 1]]), entry_pool=np.array([0]))
    start = np.array([0, 1])
    layout = NS(n_pool_real=1, pool_start=lambda: start, is_every_pool=lambda ips: False,
                locate=lambda ips: (np.zeros(ips.size, dtype=np.int64), ips.copy()))
    ctx = NS(layout=layout, plan=plan, order=np.array([0]), starts=np.array([0, 1]),
             rows=np.array([1]), change=None)
    got = []
    for cls in (ValueBackend, PoolEveryEntry):
        be = cls(cfg, 0, "numpy")
        be.write_rows(np.array([0]), np.array([5]))
        for _ in range(2):
            be._scatter(ctx)  # type: ignore[arg-type]
            be.writers.n_ubatch += 1
        got.append((be.ubatches_standing, be.pools_kept,
                    be.row_values("pooled", np.array([1])).tobytes()))
    assert got[0][:2] == (0, 0) and got[0][2] == got[1][2]


def test_padded_steps_stand_on_the_compiled_core() -> None:
    """A decode step that marks no pool pads the same entries as the step before while
    the rep rows stand: the compiled core's `Padding` gives the very rows it gave,
    engine/scatter.py `build_plan` the very entry arrays (and `Marking.of` one empty
    marked array), so the listing's memo, the race groups and the value backend's
    standing scatter are kept by identity, equal in lockstep to pooling every entry
    (`kept_equals_pooled`).

    By hand: kpool 4, an 8-token prompt of seq 0 (pools at pos 0-3 and 4-7) copied to
    seq 1, then steps of one token per slot at pos 8 .. 14. Pos 8 marks seq 1's two
    copied pools (the update gives seq 1 its pools); pos 9 and 10 mark none and pad 2
    entries (rows 0 and 1, the smallest that are no pool's rep: 3 and 7 are); pos 11
    closes pool 2 of each slot (reps 14 and 15 in the cells they took, 8 .. 15 in
    turn); pos 12 .. 14 mark none again. The first padded step after the pools change
    (pos 9, pos 12) finds its rows (a new rep column) and scatters them; each padded
    step after it (pos 10, 13, 14: three) is the same plan and stands. The reference
    core builds fresh arrays each step, and none stands."""
    t = trace("\n".join([
        "kpool_trace: 1",
        "cache: {kv_size: 64, kpool: 4, n_seq_max: 2, n_ubatch: 16, n_embd: 8}",
        "ops:",
        "  - decode: {seq: 0, pos: 0..8}",
        "  - seq_cp: {src: 0, dst: 1}",
        *(f"  - decode: {{tokens: [{{pos: {p}, seq: 0}}, {{pos: {p}, seq: 1}}]}}"
          for p in range(8, 15))]))
    for core, standing in (("compiled", [10, 13, 14]), ("reference", [])):
        prev = None
        same = []
        for rec in Replayer(t, REP_ONCE, ValueBackend(t.cache, t.seed, "numpy"),
                            core=core).run():
            if isinstance(rec, UbatchRecord):
                if rec.n_new == 0:
                    assert rec.scatter_rep.tolist() == [0, 1]
                if prev is not None and rec.scatter_rep is prev.scatter_rep:
                    assert rec.scatter_rows is prev.scatter_rows
                    assert rec.scatter_pad is prev.scatter_pad  # the listing's memo
                    same.append(int(rec.token_pos[0]))
                prev = rec
        assert same == standing, core
        assert kept_equals_pooled(t, REP_ONCE, core).ubatches_standing == len(standing)


class _Watched(ValueBackend):
    """ValueBackend that checks, at every scatter of a plan the standing one grew
    into, what the shortcuts take: the slots `_owned` gives are each group row's own
    (`SlotTable.of`, after it), and counts the scatters that checked the new entries
    alone and that inserted the standing plan's slots."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.partial = self.inserted = 0

    def _check_plan(self, *args, new=None, **kw):
        self.partial += new is not None
        return super()._check_plan(*args, new=new, **kw)

    def _owned(self, rows, grown, grown_from):
        s = super()._owned(rows, grown, grown_from)
        if grown_from is not None and grown is not None and \
                grown_from.size == rows.size - grown.size:
            self.inserted += 1
        assert np.array_equal(s, self.slots.of(rows)), "a slot out of place"
        return s


@pytest.mark.parametrize("core", ["reference", "compiled"])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_cache_safe_plan_grown_by_appended_pools_checks_and_owns_its_new_entries(
        core: str, backend: str) -> None:
    """store.py `_scatter`: two slots share an 8-token prompt, then step one token
    each, so every fourth step closes a pool in each and the plan grows by two
    appended pools from the standing one. Those scatters check the new entries alone
    and insert the standing plan's slots (both counted), every slot `_owned` gives is
    its row's own, and the rows hold what a backend without the shortcuts holds (the
    doctored plans of test_backend_kernels.py check the full way still refuses)."""
    t = trace("""
        kpool_trace: 1
        cache: {kv_size: 64, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 0..8}
          - seq_cp: {src: 0, dst: 1}
""" + "".join(f"          - decode: {{tokens: [{{pos: {p}, seq: [0]}}, "
                  f"{{pos: {p}, seq: [1]}}]}}\n" for p in range(8, 24)))
    watched = _Watched(t.cache, t.seed, backend)
    got = list(Replayer(t, VERSIONS["cache-safe"], watched, core=core).run())
    assert watched.partial >= 3 and watched.inserted >= 3
    plain = ValueBackend(t.cache, t.seed, backend)
    want = list(Replayer(t, VERSIONS["cache-safe"], plain, core=core).run())
    assert [ubatch_json(r) for r in got if isinstance(r, UbatchRecord)] == \
        [ubatch_json(r) for r in want if isinstance(r, UbatchRecord)]
    for name in ("key", "gate", "pooled"):
        assert np.array_equal(watched.row_values(name), plain.row_values(name)), name
