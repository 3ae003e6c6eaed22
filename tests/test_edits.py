"""engine/edits.py: ENGINE.md §4's staleness table and the asserts an edit hits, on
the module itself (test_engine_rules.py pins the same rules through whole replays).
Numbers derived by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kpool_cli.engine.edits import Staleness, check_edit
from kpool_cli.engine.layout import POS_CLEAN as C
from kpool_cli.engine.marking import EngineAbort
from kpool_cli.trace import model as m
from kpool_cli.versions import CACHE_SAFE, REP_ONCE


@pytest.mark.parametrize(("op", "pos_min", "want"), [
    (m.SeqRm(0, 5, -1), 0, 5),     # p0 5 > pos_min 0: from 5
    (m.SeqRm(0, 5, -1), 5, 0),     # p0 <= pos_min: the whole sequence regroups
    (m.SeqAdd(0, 4, -1, shift=-2), 0, 2),   # shifts down: p0 + shift = 2
    (m.SeqAdd(0, 4, -1, shift=-4), 0, 0),   # 4 - 4 = 0 <= pos_min
    (m.SeqAdd(0, 4, -1, shift=3), 0, 4),    # shifts up: p0
    (m.SeqDiv(0, 4, -1, d=2), 0, 0),        # seq_div: always 0
])
def test_s4_stale_pos_is_taken_before_the_edit(op, pos_min, want):
    assert Staleness(1, REP_ONCE).before(op, lambda s: pos_min, lambda *a: True) == want


@pytest.mark.parametrize("base", [REP_ONCE, CACHE_SAFE])
@pytest.mark.parametrize(("holds", "want"), [(False, None), (True, 5)])
def test_s4_the_noop_seq_rm_patch_stales_nothing_when_nothing_is_removed(base, holds, want):
    """docs/versions.md, the no-op seq_rm patch (`seq_rm_noop_keeps_clean`): seq_rm(0,
    5, -1) with pos_min 0 stales from 5 when the sequence holds a cell at 5 or later,
    and nothing (None) when it holds none; the bases stale from 5 either way, and
    so does every other edit under the patch."""
    patched = replace(base, seq_rm_noop_keeps_clean=True)
    asked = []

    def holds_in(s, p0, p1):
        asked.append((s, p0, p1))
        return holds

    rm = m.SeqRm(0, 5, -1)
    assert Staleness(1, patched).before(rm, lambda s: 0, holds_in) == want
    assert asked == [(0, 5, -1)]
    assert Staleness(1, base).before(rm, lambda s: 0, holds_in) == 5
    add = m.SeqAdd(0, 4, -1, shift=-2)
    assert Staleness(1, patched).before(add, lambda s: 0, holds_in) == 2
    st = Staleness(2, patched)
    st.after(rm, None, layout_shared=True)  # cache-safe's restale-all is skipped too
    assert st.stale == [C, C] and st.take_changed() == {}


def test_s4_stale_set_keeps_the_minimum_and_lists_what_it_set():
    """stale_set(0, 7) then (0, 9): stays 7; (1, -3): max(-3, 0) = 0; -1: every one."""
    st = Staleness(3, REP_ONCE)
    st.stale_set(0, 7)
    st.stale_set(0, 9)
    st.stale_set(1, -3)
    assert st.stale == [7, 0, C] and st.take_changed() == {0: 7, 1: 0}
    st.stale_set(-1, 4)
    assert st.stale == [4, 0, 4] and st.take_changed() == {0: 4, 1: 0, 2: 4}
    st.clean()
    assert st.stale == [C, C, C]


@pytest.mark.parametrize(("op", "shared", "rep_once", "cache_safe"), [
    (m.SeqCp(0, 1), False, {1: 0}, {0: 0, 1: 0}),
    (m.SeqRm(1, 5, -1), False, {1: 5}, {1: 5}),
    (m.SeqRm(1, 5, -1), True, {1: 5}, {0: 0, 1: 0, 2: 0}),
    (m.StateRead(2, "a"), True, {2: 0}, {0: 0, 1: 0, 2: 0}),
    (m.StateDrop(2), True, {2: 0}, {0: 0, 1: 0, 2: 0}),
    (m.SeqAdd(1, 5, -1, shift=1), True, {1: 5}, {1: 5}),  # seq_add never re-stales
    (m.SeqKeep(1), False, {0: 0, 1: 0, 2: 0}, {0: 0, 1: 0, 2: 0}),
    (m.Clear(), False, {0: 0, 1: 0, 2: 0}, {0: 0, 1: 0, 2: 0}),
    (m.StateWrite(0, "a"), True, {}, {}),
])
def test_s4_the_table_per_version(op, shared, rep_once, cache_safe):
    """ENGINE.md §4: rep-once stales what the edit touched; cache-safe also stales the
    seq_cp source, and every sequence after seq_rm / state_read / state_drop while
    the layout is shared."""
    for version, want in ((REP_ONCE, rep_once), (CACHE_SAFE, cache_safe)):
        st = Staleness(3, version)
        st.after(op, 5 if isinstance(op, m.SeqRm | m.SeqAdd) else 0, layout_shared=shared)
        assert st.take_changed() == want, version.name


def test_edit_asserts():
    """rep-once aborts a partial seq_cp; a cross-stream copy must be full by
    llama_kv_cache::seq_cp's test (bounds strictly inside (0, kv_size - 1) are
    partial: p1 15 of kv_size 16 is not); M-RoPE refuses seq_add and seq_div."""
    cfg = m.CacheConfig(kv_size=16, kpool=4, n_seq_max=2)
    streams = m.CacheConfig(kv_size=16, kpool=4, n_seq_max=2, unified=False)
    with pytest.raises(EngineAbort, match="partial seq_cp"):
        check_edit(m.SeqCp(0, 1, 0, 4), REP_ONCE, cfg)
    check_edit(m.SeqCp(0, 1, 0, 4), CACHE_SAFE, cfg)
    with pytest.raises(EngineAbort, match="is_full"):
        check_edit(m.SeqCp(0, 1, 0, 4), CACHE_SAFE, streams)
    check_edit(m.SeqCp(0, 1, 0, 15), CACHE_SAFE, streams)
    mrope = m.CacheConfig(kv_size=16, kpool=4, by_order=True)
    for op in (m.SeqAdd(0, 0, -1, shift=1), m.SeqDiv(0, 0, -1, d=2)):
        with pytest.raises(EngineAbort, match=f'"{op.kind}\\(\\) is only supported'):
            check_edit(op, REP_ONCE, mrope)


@pytest.mark.parametrize(("p0", "p1", "partial"), [
    (1, -1, True), (14, -1, True), (15, -1, False), (0, 1, True), (0, 14, True),
    (0, 15, False), (-1, 16, False)])
def test_llama_kv_cache_seq_cp_is_full_test_bounds(p0, p1, partial):
    """A cross-stream seq_cp on kv_size 16: a bound is partial only when it lies
    strictly inside (0, 15), so 1 and 14 are, 0, 15 and 16 are not."""
    cfg = m.CacheConfig(kv_size=16, kpool=4, n_seq_max=2, unified=False)
    op = m.SeqCp(0, 1, p0, p1)
    if partial:
        with pytest.raises(EngineAbort, match="is_full"):
            check_edit(op, CACHE_SAFE, cfg)
    else:
        check_edit(op, CACHE_SAFE, cfg)
