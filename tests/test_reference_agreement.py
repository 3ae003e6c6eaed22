"""The incremental engine against the from-scratch reference (tests/reference.py).

For every trace the engine tests use, every file in traces/*.yaml, and random small
traces (hypothesis), under both engine versions, ubatch by ubatch:
- each sequence's layout (pairs and pools) equals a rebuild from the raw cells, except
  for sequences the replay reported drifted (KP007): a difference must be reported
  where it appears, and a reported drift must be a real difference (ENGINE.md §8);
- while no sequence is drifted: marking (§6), the graph size n_new_g (§6), the scatter
  plan with its padding rows (§7), visibility (§7) and the static findings KP001,
  KP002 and KP004 agree with the reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import reference as ref
from conftest import ENGINES, drive, trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine_rules import TRACES

from kpool_cli.contracts.records import UbatchRecord
from kpool_cli.gen.random_trace import PositionTracker
from kpool_cli.trace.load import load_trace
from kpool_cli.trace.model import (
    CacheConfig,
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


def _conflicts(lay: ref.RefLayout) -> set[int]:
    """KP002's condition on the reference layout: rep rows of pools whose members differ."""
    by_rep: dict[int, list[list[int]]] = {}
    for ip in range(lay.n_pool_real):
        by_rep.setdefault(lay.rep_row(ip), []).append(lay.members(ip))
    return {r for r, ms in by_rep.items() if any(m != ms[0] for m in ms)}


def check_agreement(t: Trace, engine: str, rules: str | None = None) -> dict[str, int]:
    """Replay `t` under `engine` and compare every ubatch with the reference, whose
    marking follows `rules` ("rep-once" or "cache-safe"; default: `engine`).
    Returns a few counts (ubatches compared, drifted ubatches) for sanity checks."""
    cfg = t.cache
    differing: set[int] = set()
    ever_drifted = False
    prev_conflicts: set[int] = set()
    stats = {"ubatches": 0, "compared": 0, "drifted": 0}
    for rec, rp in drive(t, engine):
        if not isinstance(rec, UbatchRecord):
            continue
        stats["ubatches"] += 1
        lay = ref.rebuild(rp.cache)

        # -- §5: the layout, sequence by sequence
        now_diff = set()
        for s in range(cfg.n_seq_max):
            sq = rp.layout.seqs[s]
            pairs = list(zip(sq.pos.tolist(), sq.cells.tolist(), strict=True))
            pools = sq.pools.view.tolist()
            if pairs != lay.seqs[s].pairs or pools != lay.seqs[s].pools:
                now_diff.add(s)
        kp7 = {s for f in rec.findings if f.code == "KP007" for s in f.seqs}
        for s in now_diff - differing:
            assert s in kp7, (f"ubatch {rec.index}: seq {s}'s layout differs from the "
                              "rebuild but no KP007 was reported")
        assert kp7 <= now_diff, f"ubatch {rec.index}: KP007 for {kp7} but layouts agree"
        differing = now_diff
        if differing:
            ever_drifted = True
            stats["drifted"] += 1
            continue

        # -- §6: marking, from the reference layout, the stale snapshot and the tokens
        stats["compared"] += 1
        assert rec.n_pool_real == lay.n_pool_real
        toks = ref.token_list(rec, cfg.kv_size)
        stale_from = None
        if rec.batch_ubatch == 0:
            # the replayer clears its stale array only after ubatch 0 has been yielded
            stale_from = list(rp.staleness.stale)
            assert rec.stale_batch == {s: p for s, p in enumerate(stale_from)
                                       if p != ref.CLEAN}
        m = ref.mark(lay, toks, stale_from, rules or engine)
        if m.abort:
            assert rec.aborted and "KP005" in {f.code for f in rec.findings}
            return stats
        n_seqs_unq = len({s for _p, ss, _c in toks for s in ss})
        n_g = ref.n_new_g(len(m.marked), rec.n_tokens, n_seqs_unq, lay.n_pool_real,
                          cfg.kv_size, cfg.kpool, cfg.n_seq_max, m.repool_all)
        plan = ref.plan(lay, m.marked, n_g, toks, cfg.n_rows)
        codes = {f.code for f in rec.findings}
        if plan.abort:  # §7: no row left for a padding entry
            assert rec.aborted and "KP005" in codes, "padding ran out of rows"
            return stats
        assert not rec.aborted, rec.findings
        assert rec.n_new == len(m.marked)
        assert rec.scatter_pool[: rec.n_new].tolist() == m.marked
        assert rec.n_new_g == n_g
        # -- §7: the scatter plan, padding included
        assert rec.scatter_rep.tolist() == plan.entry_rep
        assert rec.scatter_rows.tolist() == plan.entry_rows
        assert rec.scatter_pad.tolist() == plan.entry_pad
        assert rec.token_visible.tolist() == plan.visible
        # -- §8 static findings
        dup = len(set(plan.entry_rep)) != len(plan.entry_rep)
        assert ("KP001" in codes) == dup
        assert "KP004" not in codes
        if not ever_drifted:
            conflicts = _conflicts(lay)
            fresh = conflicts - prev_conflicts
            prev_conflicts = conflicts
            kp2 = [f for f in rec.findings if f.code == "KP002"]
            assert bool(kp2) == bool(fresh)
            if kp2:
                assert set(kp2[0].rows) == fresh
    return stats


# -- the traces of the engine tests and of traces/ ---------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("i", range(len(TRACES)))
def test_engine_rule_traces_agree_with_reference(i: int, engine: str) -> None:
    """ENGINE.md §5-§7 and §8 (KP007): every scenario of test_engine_rules.py."""
    check_agreement(trace(TRACES[i]), engine)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", TRACE_FILES, ids=lambda p: p.name)
def test_trace_files_agree_with_reference(path: Path, engine: str) -> None:
    stats = check_agreement(load_trace(path), engine)
    assert stats["ubatches"] > 0


def test_the_drift_scenario_is_exercised() -> None:
    """The agreement check must see at least one drifted ubatch somewhere, or its
    KP007 branch is dead."""
    total = sum(check_agreement(trace(t), "rep-once")["drifted"] for t in TRACES)
    assert total > 0


# -- random traces ----------------------------------------------------------------------


N_UBATCHES = (2, 3, 5, 8, 512)


def draw_n_rs_seq(draw, n_ubatch: int, choices=N_UBATCHES, need: bool = False
                  ) -> tuple[int, int]:
    """(n_rs_seq, n_ubatch): half the time (unless `need`) no rollback snapshots; else
    1..4, with n_ubatch > n_rs_seq + 1 (from `choices`) except now and then (a decode
    then aborts: GGML_ASSERT(n_ubatch > n_keep_tail))."""
    n_rs = draw(st.integers(1, 4)) if need or draw(st.booleans()) else 0
    if n_rs and n_ubatch <= n_rs + 1 and draw(st.integers(0, 4)) != 0:
        n_ubatch = draw(st.sampled_from([n for n in choices if n > n_rs + 1]))
    return n_rs, n_ubatch


@st.composite
def random_traces(draw) -> Trace:
    unified = draw(st.booleans())
    by_order = draw(st.integers(0, 4)) == 0
    n_rs_seq, n_ubatch = draw_n_rs_seq(draw, draw(st.sampled_from(N_UBATCHES)))
    cfg = CacheConfig(
        kv_size=draw(st.integers(16, 64)), kpool=draw(st.integers(2, 4)),
        n_seq_max=draw(st.integers(1, 3)), unified=unified, by_order=by_order,
        n_ubatch=n_ubatch, n_rs_seq=n_rs_seq,
    )
    tr = PositionTracker(cfg)
    n = cfg.n_seq_max
    seq = st.integers(0, n - 1)
    bound = st.integers(-1, 24)
    ops = []
    written: list[str] = []
    kinds = ["decode"] * 6 + ["seq_rm", "seq_rm", "seq_cp", "seq_cp", "seq_keep",
                              "state_write", "state_read", "state_drop", "seq_cp_part",
                              "spec", "spec", "seq_rm_all"]
    if not by_order:
        kinds += ["seq_add", "seq_add", "seq_add", "seq_div"]
        if n > 1:
            kinds += ["drift"] * 2
    for i in range(draw(st.integers(1, 14))):
        kind = "decode" if i == 0 else draw(st.sampled_from(kinds))
        if kind == "decode":
            ops.append(_draw_decode(draw, tr, cfg))
            tr.decode(list(ops[-1].tokens))
        elif kind == "seq_rm":
            s, p0, p1 = draw(seq), draw(bound), draw(bound)
            ops.append(SeqRm(s, p0, p1))
            tr.seq_rm(s, p0, p1)
        elif kind == "spec":
            # speculative decoding: the draft's 0..4 trailing tokens rejected (a rollback
            # of the recurrent state), sometimes twice before the next decode, which
            # then continues from the kept position
            s = draw(seq)
            for _ in range(draw(st.sampled_from([1, 1, 2]))):
                p = max(tr.next_pos(s) - draw(st.integers(0, 4)), 0)
                ops.append(SeqRm(s, p, -1))
                tr.seq_rm(s, p, -1)
            if draw(st.booleans()):
                ops.append(Decode(tokens=tuple(
                    Token(tr.next_pos(s) + k, (s,)) for k in range(draw(st.integers(1, 5))))))
                tr.decode(list(ops[-1].tokens))
        elif kind == "seq_rm_all":  # seq -1: the recurrent child always refuses it
            p0, p1 = draw(st.sampled_from([(-1, -1), (0, -1)]) | st.tuples(bound, bound))
            ops.append(SeqRm(-1, p0, p1))
            tr.seq_rm(-1, p0, p1)
        elif kind == "seq_cp":
            a, b = draw(seq), draw(seq)
            ops.append(SeqCp(a, b))
            tr.seq_cp(a, b)
        elif kind == "drift":
            # share a whole sequence, let the copy's layout be built, then move shared
            # cells through the source only: the copy may drift (KP007)
            a, b = draw(seq), draw(seq)
            ops.append(SeqCp(a, b))
            tr.seq_cp(a, b)
            ops.append(Decode(tokens=(Token(tr.next_pos(a), (a,)),)))
            tr.decode(list(ops[-1].tokens))
            p0 = draw(st.integers(1, max(1, tr.pmax(a))))
            if draw(st.booleans()):
                shift = draw(st.integers(-4, 2))
                ops.append(SeqAdd(a, p0, -1, shift))
                tr.seq_add(a, p0, -1, shift)
            else:
                ops.append(SeqDiv(a, p0, -1, 2))
                tr.seq_div(a, p0, -1, 2)
        elif kind == "seq_cp_part":  # rep-once aborts here; cache-safe shares a range
            a, b, p0, p1 = draw(seq), draw(seq), draw(bound), draw(bound)
            ops.append(SeqCp(a, b, p0, p1))
            if cfg.unified:
                tr.seq_cp(a, b, p0, p1)
            elif (0 < p0 < cfg.kv_size - 1) or (0 < p1 < cfg.kv_size - 1):
                break  # a cross-stream partial copy aborts in both versions
            else:
                tr.seq_cp(a, b)
        elif kind == "seq_keep":
            s = draw(seq)
            ops.append(SeqKeep(s))
            tr.seq_keep(s)
        elif kind == "seq_add":
            s, p0, p1 = draw(seq), draw(bound), draw(bound)
            shift = draw(st.integers(-6, 6))
            ops.append(SeqAdd(s, p0, p1, shift))
            tr.seq_add(s, p0, p1, shift)
        elif kind == "seq_div":
            s, p0, p1, d = draw(seq), draw(bound), draw(bound), draw(st.integers(1, 3))
            ops.append(SeqDiv(s, p0, p1, d))
            tr.seq_div(s, p0, p1, d)
        elif kind == "state_write":
            s = draw(seq)
            slot = draw(st.sampled_from(["a", "b"]))
            ops.append(StateWrite(s, slot))
            tr.state_write(s, slot)
            written.append(slot)
        elif kind == "state_read" and written:
            s, slot = draw(seq), draw(st.sampled_from(written))
            ops.append(StateRead(s, slot))
            tr.state_read(s, slot)
        elif kind == "state_drop":
            s = draw(seq)
            ops.append(StateDrop(s))
            tr.state_drop(s)
    return Trace(cache=cfg, ops=tuple(ops), seed=draw(st.integers(0, 3)))


def _draw_decode(draw, tr: PositionTracker, cfg: CacheConfig) -> Decode:
    n = cfg.n_seq_max
    chosen = sorted(set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n))))
    tokens: list[Token] = []
    if cfg.unified and len(chosen) >= 2 and draw(st.integers(0, 3)) == 0:
        a, b = chosen[0], chosen[1]
        if tr.hmin(a) == tr.hmin(b) and tr.hmax(a) == tr.hmax(b):
            start = tr.next_pos(a)
            pair = (a, b) if draw(st.booleans()) else (b, a)
            for k in range(draw(st.integers(1, 5))):
                tokens.append(Token(start + k, pair))
            chosen = chosen[2:]
    for s in chosen:
        start = tr.next_pos(s)
        if draw(st.integers(0, 9)) == 0:  # a decode that validation may refuse
            start += draw(st.sampled_from([-1, 1, 2]))
            start = max(start, 0)
        if cfg.by_order and draw(st.integers(0, 2)) == 0:
            m = draw(st.integers(1, 6))
            tokens += [Token(start, (s,), (k // 3, k % 3)) for k in range(m)]
            continue
        tokens += [Token(start + k, (s,)) for k in range(draw(st.integers(1, 7)))]
    if not tokens:
        tokens = [Token(tr.next_pos(0), (0,))]
    if cfg.by_order and any(t.ext is not None for t in tokens):
        # ext means "image" and needs by_order; a text token of an image batch gets one too
        tokens = [t if t.ext is not None else Token(t.pos, t.seq, (0, 0)) for t in tokens]
    return Decode(tokens=tuple(tokens))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=random_traces(), engine=st.sampled_from(ENGINES))
def test_random_traces_agree_with_reference(t: Trace, engine: str) -> None:
    """ENGINE.md §5-§7 on random small traces, both engine versions."""
    check_agreement(t, engine)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=random_traces())
def test_tail_truncate_agrees_with_the_full_rebuild_reference(t: Trace) -> None:
    """tail-truncate's claim (docs/versions.md), against the reference's full rebuild
    of §5: its layouts, marking and plan are rep-once's (the reference of rep-once)."""
    check_agreement(t, "tail-truncate", rules="rep-once")
