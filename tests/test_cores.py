"""The compiled core against the reference core (replay.CORES): byte-identical JSON
reports for every shipped and found trace under every engine and backend, identical
records on random traces of the fuzzer's generator (tests/campaign_cores.py runs
10,000), a core difference reported by `kpool fuzz` as a defect, and the kernels'
rules on hand-derived cases (numbers worked out in the comments).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kpool_cli.cli.main import cli
from kpool_cli.gen import fuzz
from kpool_cli.gen.random_trace import random_trace
from kpool_cli.replay import CORES, DEFAULT_CORE, auto_compiled_from, resolve_core
from kpool_cli.versions import VERSIONS

# the shipped versions that differ in some policy
DISTINCT = [name for i, (name, v) in enumerate(VERSIONS.items())
            if v.policies() not in [w.policies() for w in list(VERSIONS.values())[:i]]]

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "traces").glob("*.yaml")) + sorted((ROOT / "traces/found").glob("*.yaml"))
BACKENDS = ("none", "numpy", "numba")


def test_auto_runs_the_compiled_core_from_its_ubatch_count() -> None:
    """auto: compiled from auto_compiled_from(backend) ubatches, counted as
    split_equal's least (ceil(tokens / n_ubatch) per decode): one decode of
    n_ubatch * N - 1 tokens needs N ubatches. Fewer with the numba backend (numba is
    imported anyway)."""
    from kpool_cli.trace import model as m

    assert CORES == ("compiled", "reference") and DEFAULT_CORE == "auto"
    cfg = m.CacheConfig(kv_size=1 << 20, kpool=4, n_seq_max=1, n_ubatch=2)
    n = auto_compiled_from(None)
    assert auto_compiled_from("numba") < n == auto_compiled_from("numpy")

    def one_decode(tokens: int) -> m.Trace:
        return m.Trace(cfg, (m.Decode(tuple(m.Token(p, (0,)) for p in range(tokens))),))

    assert resolve_core("auto", one_decode(2 * n - 1)) == "compiled"  # ceil: n ubatches
    assert resolve_core("auto", one_decode(2 * n - 2)) == "reference"  # n - 1
    assert resolve_core("auto", one_decode(2 * n - 2), "numba") == "compiled"
    assert resolve_core("reference", one_decode(2 * n)) == "reference"
    assert resolve_core("compiled", one_decode(1)) == "compiled"


def _report(trace: Path, engine: str, backend: str, core: str, pools: str = "all"
            ) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["replay", str(trace), "--engine", engine, "--backend",
                                 backend, "--format", "json", "-q", "--pools", pools,
                                 "--core", core])
    return r.exit_code, r.output


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_shipped_and_found_traces_give_byte_identical_reports(trace: Path) -> None:
    """README: every shipped and found trace, every engine, every backend, in full
    listing; and in run form (whose runs each core finds its own way:
    contracts/runs.py, compiled/runs.py), which no backend changes."""
    assert len(TRACES) >= 25
    for engine in DISTINCT:
        for backend in BACKENDS:
            ref = _report(trace, engine, backend, "reference")
            assert ref[0] in (0, 1) and ref[1].startswith("{"), ref
            assert _report(trace, engine, backend, "compiled") == ref, (engine, backend)
        ref = _report(trace, engine, "none", "reference", "marked")
        assert _report(trace, engine, "none", "compiled", "marked") == ref, engine


# Corners of the compiled core's shortcuts that random traces rarely reach, each a
# trace the two cores must replay to the same report.

# A drift (ops 0-6): seq 0 holds pos 0..7 in cells 1..8 (op 0 took cell 0), shared by
# seq 1; op 5's seq_add moves pos 7 to 6 in cell 8, so seq 1's pairs are not the
# layout's (its last is still (pos 7, cell 8)); op 3 freed cell 0.
_DRIFT = """
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 3}
ops:
  - decode: {seq: 2, pos: 0}
  - decode: {seq: 0, pos: 0..8}
  - seq_cp: {src: 0, dst: 1}
  - seq_rm: {seq: 2}
  - decode: {seq: 2, pos: 0, cell: 20}
  - seq_add: {seq: 0, p0: 7, p1: 8, shift: -1}
  - decode: {seq: 2, pos: 1, cell: 21}
"""
CORNERS = {
    # compiled/layout.py `update`: the append shortcut needs s's pairs known equal to
    # the cache's. After _DRIFT, op 7 appends seq 1's pos 7 in cell 0, whose pair
    # sorts before the layout's last one: the engine's append finds the count off
    # and rebuilds (the reference: n_pool_real 2, no pool new). Without the guard the
    # compiled core appended and found a third pool.
    "append-after-a-drift": _DRIFT + """
  - decode: {seq: 1, pos: 7, cell: 0}
  - decode: {seq: 1, pos: 8}
  - decode: {seq: 1, pos: 9}
  - decode: {seq: 1, pos: 10}
  - decode: {seq: 1, pos: 11}
""",
    # the same drift met by a step of parallel slots (compiled/layout.py
    # `_append_all`): op 7 pushes seq 1's pos 7 (cell 0) past its cells' last pair,
    # (pos 6, cell 8), so the cache hands it to the layout with seq 2's, but seq 1's
    # pairs are not the layout's: the kernel must leave it to the engine's append,
    # whose count is off (a rebuild), as above.
    "parallel-append-after-a-drift": _DRIFT + """
  - decode: {tokens: [{seq: 1, pos: 7, cell: 0}, {seq: 2, pos: 2, cell: 22}]}
  - decode: {tokens: [{seq: 1, pos: 8}, {seq: 2, pos: 3}]}
  - decode: {tokens: [{seq: 1, pos: 9}, {seq: 2, pos: 4}]}
  - decode: {tokens: [{seq: 1, pos: 10}, {seq: 2, pos: 5}]}
  - decode: {tokens: [{seq: 1, pos: 11}, {seq: 2, pos: 6}]}
""",
    # KP007's watch skips the sequences the layout knows equal to their cells, and
    # must still forget their old drift: seq 1 drifts (op 3), is rebuilt (ops 5-6),
    # then drifts again (op 10), which is a second finding (`test_redrift_...`).
    "drift-repaired-then-again": """
kpool_trace: 1
cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..8}
  - seq_cp: {src: 0, dst: 1}
  - decode: {seq: 1, pos: 8..10}
  - seq_add: {seq: 0, p0: 4, p1: 8, shift: 1}
  - decode: {seq: 1, pos: 10}
  - seq_rm: {seq: 1, p0: 0, p1: -1}
  - decode: {seq: 1, pos: 0..4}
  - decode: {seq: 1, pos: 4}
  - seq_cp: {src: 1, dst: 0}
  - decode: {seq: 1, pos: 5}
  - seq_add: {seq: 0, p0: 2, p1: 5, shift: 1}
  - decode: {seq: 1, pos: 6}
  - decode: {seq: 1, pos: 7}
""",
}


@pytest.mark.parametrize("name", sorted(CORNERS))
def test_corner_traces_give_byte_identical_reports(name: str, tmp_path: Path) -> None:
    trace = tmp_path / f"{name}.yaml"
    trace.write_text(CORNERS[name])
    for engine in DISTINCT:
        for backend in ("none", "numba"):
            ref = _report(trace, engine, backend, "reference", "marked")
            assert ref[0] in (0, 1) and ref[1].startswith("{"), ref
            assert _report(trace, engine, backend, "compiled", "marked") == ref, (engine,
                                                                                  backend)


def test_redrift_is_a_second_kp007(tmp_path: Path) -> None:
    """ENGINE.md §8 KP007, by hand: seq 0 holds pos 0..7 in cells 0..7, shared with seq
    1, whose pos 8, 9 go to cells 8, 9. Op 3 moves pos 4..7 of seq 0 to 5..8 (pos
    belongs to the cell): seq 1's pair 4 is (pos 4, cell 4) in its layout, (pos 5,
    cell 4) in the cells, found at its next ubatch (op 4, whose token takes cell 10).
    Op 5 drops seq 1 (cells 8..10 free), op 6 rebuilds it at pos 0..3 in cells 8..11
    (no drift), op 8 gives those cells to seq 0 too, op 10 moves pos 2..4: seq 1's
    pair 2 is (pos 2, cell 10) against (pos 3, cell 10), found at op 11."""
    trace = tmp_path / "redrift.yaml"
    trace.write_text(CORNERS["drift-repaired-then-again"])
    for core in ("compiled", "reference"):
        code, out = _report(trace, "rep-once", "none", core, "marked")
        assert code == 1  # KP007 is an error
        found = [(u["op"], f["message"]) for u in json.loads(out)["ubatches"]
                 for f in u["findings"] if f["code"] == "KP007"]
        assert found == [
            (4, "seq 1: the layout's pair 4 is (pos 4, cell 4) but the cells say (pos 5, "
                "cell 4); the engine goes on with the drifted layout"),
            (11, "seq 1: the layout's pair 2 is (pos 2, cell 10) but the cells say (pos 3, "
                 "cell 10); the engine goes on with the drifted layout")], core


@pytest.mark.parametrize("chunk", range(10))
def test_500_random_traces_give_identical_records(chunk: int) -> None:
    """Seeds 0..499 of the fuzzer's generator (speculative removals, the recurrent
    child, non-unified caches, coupled sequences, spans, every edit), under every
    engine: `fuzz.run_checked` replays both cores and names any record that
    differs (INV_CORE); no exception escapes either."""
    for seed in range(chunk * 50, chunk * 50 + 50):
        t = random_trace(seed)
        for engine in DISTINCT:
            _, defects, _ = fuzz.run_checked(t, engine)
            assert [d for d in defects if d[0] in (fuzz.INV_CORE, fuzz.INV_CRASH)] == [], \
                (seed, engine)


def test_fuzz_reports_a_core_difference_as_a_defect(monkeypatch) -> None:
    """A compiled marking that drops its last winner is caught: the records part at
    the first ubatch that marks a pool, and run_checked says where."""
    from kpool_cli.compiled import marking as cm
    from kpool_cli.engine.marking import Marking

    real = cm.mark

    def broken(*a, **kw):  # type: ignore[no-untyped-def]
        got = real(*a, **kw)
        return Marking(got.marked[:-1], max(got.n_new - 1, 0), got.repool_all) \
            if got.n_new else got

    monkeypatch.setattr(cm, "mark", broken)
    from kpool_cli.trace.load import load_trace

    t = load_trace(ROOT / "traces/shared-prefix-race.yaml")
    _, defects, _ = fuzz.run_checked(t, "rep-once")
    core = [d for d in defects if d[0] == fuzz.INV_CORE]
    assert core and "differs from the reference core's" in core[0][2], defects


def test_fuzz_reports_a_difference_of_the_one_call_plan_as_a_defect(monkeypatch) -> None:
    """A one-call plan (`mark_and_plan`) whose tokens see one pool too many is caught:
    mtp3-speculative's drafts (one sequence by position) take the one call, and
    run_checked says the records differ."""
    import dataclasses

    from kpool_cli.compiled import marking as cm
    from kpool_cli.trace.load import load_trace

    real = cm.mark_and_plan
    broken_plans = []

    def broken(*a, **kw):  # type: ignore[no-untyped-def]
        got = real(*a, **kw)
        if got is None or got[1] is None:
            return got
        broken_plans.append(1)
        return got[0], dataclasses.replace(got[1], visible=got[1].visible + 1)

    monkeypatch.setattr(cm, "mark_and_plan", broken)
    t = load_trace(ROOT / "traces/mtp3-speculative.yaml")
    _, defects, _ = fuzz.run_checked(t, "rep-once")
    assert broken_plans
    core = [d for d in defects if d[0] == fuzz.INV_CORE]
    assert core and "differs from the reference core's" in core[0][2], defects


# -- the kernels' rules, by hand ----------------------------------------------------------


def test_find_slot_wraps_and_skips_taken_cells() -> None:
    """KvCache._find_slot: from head 3 take the first 3 empty cells not taken, then
    wrap: cells 3 (empty), 4 (pos 7), 5 (taken), then 0, 1 (pos 5), 2 -> [3, 0, 2]."""
    from kpool_cli.compiled import kernels as k

    pos = np.array([-1, 5, -1, -1, 7, -1], dtype=np.int64)
    out = np.empty(3, dtype=np.int64)
    assert k.find_slot(pos, 3, 3, np.array([5], dtype=np.int64), out) == 3
    assert out.tolist() == [3, 0, 2]
    # four wanted, three free and not taken: no room
    assert k.find_slot(pos, 3, 4, np.array([5], dtype=np.int64), np.empty(4, np.int64)) == 3


def test_sorted_add_appends_past_the_end_and_merges_inside() -> None:
    """SortedKeys.add: keys 10, 20 then 30, 25 -> 10, 20, 25, 30 (a merge); then 40
    (past the end)."""
    from kpool_cli.compiled import kernels as k

    a = np.zeros(8, dtype=np.int64)
    n = k.sorted_add(a, 0, np.array([20, 10], dtype=np.int64))
    n = k.sorted_add(a, n, np.array([30, 25], dtype=np.int64))
    n = k.sorted_add(a, n, np.array([40], dtype=np.int64))
    assert a[:n].tolist() == [10, 20, 25, 30, 40]


def test_layout_step_finds_the_pools_of_engine_md_5() -> None:
    """ENGINE.md §5 step 4, position mode, kpool 2, pos_min 0: positions 0 1 2 4 5 6
    in cells 10..15. Starts must be at pos % 2 == 0 with pos, pos + 1 consecutive:
    j=0 (0, 1) yes; j=2 (2, 4) broken; j=3 is pos 4 (4, 5) yes; j=5 is the last pair,
    no room. Pools start at j 0 and 3; reps are cells 11 and 14 (pos 1 and 5);
    j_next = max(3 + 2, last + 1 = 5) = 5."""
    from kpool_cli.compiled import kernels as k

    pos = np.array([0, 1, 2, 4, 5, 6], dtype=np.int64)
    sp = (pos << 32) | np.arange(10, 16)
    keys = np.zeros(8, dtype=np.int64)
    keys[:6] = sp
    cols = [np.zeros(4, dtype=np.int64) for _ in range(4)]
    got = k.layout_step(sp, keys, 6, False, 0, 0, 0, 2, False, 1, 100, *cols, 0,
                        np.ones(16, dtype=np.int32), False, False)
    n_keys, _kept, j_next, n_pools, shared, scanned, rebuild = got
    assert (n_keys, j_next, n_pools, shared, scanned, rebuild) == (6, 5, 2, False, 0, False)
    pools, rep_rows, rep_pos, first_pos = (c[:2].tolist() for c in cols)
    assert pools == [0, 3] and rep_pos == [1, 5] and first_pos == [0, 4]
    assert rep_rows == [100 + 11, 100 + 14]  # stream 1 of kv_size 100


def _rebuild_step(sp_pos, sp_cells, known_below=-1, seq_count=None):  # type: ignore[no-untyped-def]
    """`kernels.layout_rebuild_step` of the layout of positions 0..5 in cells 10..15
    (kpool 2, pos_min 0, stream 1 of kv_size 100: pools at pairs 0, 2, 4, rep rows
    111, 113, 115), stale from pos 4, against the cache's pairs `sp`: (what it
    returns, the pairs, and the pools' start, rep row, rep pos and first pos). With
    `seq_count`, the sharing scan (step 3) runs over it."""
    from kpool_cli.compiled import kernels as k

    old = (np.arange(6, dtype=np.int64) << 32) | np.arange(10, 16)
    keys = np.zeros(10, dtype=np.int64)
    keys[:6] = old
    cols = [np.zeros(5, dtype=np.int64) for _ in range(4)]
    for c, v in zip(cols, ([0, 2, 4], [111, 113, 115], [1, 3, 5], [0, 2, 4]), strict=True):
        c[:3] = v
    sp = (np.array(sp_pos, dtype=np.int64) << 32) | np.array(sp_cells, dtype=np.int64)
    got = k.layout_rebuild_step(sp, keys, 6, 4 << 32, known_below, 0, 2, False, 1, 100,
                                *cols, 3,
                                np.ones(32, dtype=np.int32) if seq_count is None else seq_count,
                                seq_count is not None)
    n = int(got[3]) if got[6] else 3
    return (tuple(int(x) for x in got), (keys[:int(got[0])] >> 32).tolist(),
            [c[:n].tolist() for c in cols])


def test_layout_rebuild_step_keeps_the_pools_below_the_stale_position() -> None:
    """ENGINE.md §5 step 2's rebuild of a stale sequence, then steps 3 and 4, in one
    call. Pos 4.. removed, then decoded again in cells 20, 21, 22 (pos 4, 5, 6): the
    pairs below pos 4 (4 of them) are the cache's, so the pools that end below pair
    4 stay (those at 0 and 2: 2 kept), the scan resumes at pair 2 + 2 = 4 and finds
    the pool at pair 4 (pos 4, 5: rep cell 21, row 121, rep pos 5); pair 5 is the
    last one a pool can start at, pos 5 is odd: j_next = max(4 + 2, 5 + 1) = 6. The
    sequence holds 7 pairs and 3 pools; nothing was scanned for sharing."""
    got, pos, cols = _rebuild_step([0, 1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 20, 21, 22])
    assert got == (7, 6, 2, 3, 0, 0, 1)
    assert pos == [0, 1, 2, 3, 4, 5, 6]
    assert cols == [[0, 2, 4], [111, 113, 121], [1, 3, 5], [0, 2, 4]]


def test_sharing_scan_of_a_one_sequence_cache_reads_no_count() -> None:
    """ENGINE.md §5 step 3 after the rebuild above (cache-safe resets `shared`, so the
    scan starts at pair 0 of the 7): no cell held twice, it scans all 7 and finds
    none; cell 12 (pair 2) held by two sequences, it stops there, 3 scanned. With no
    counts (compiled/layout.py `_counts`: a cache of one sequence, where no cell can
    be held twice) it gives the first answer without reading any."""
    sp = ([0, 1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 20, 21, 22])
    twice = np.ones(32, dtype=np.int32)
    twice[12] = 2
    got = [_rebuild_step(*sp, seq_count=c)[0] for c in (
        np.ones(32, dtype=np.int32), twice, np.zeros(0, dtype=np.int32))]
    assert [(g[4], g[5]) for g in got] == [(0, 7), (1, 3), (0, 7)]
    assert got[0][:4] == got[1][:4] == got[2][:4] == (7, 6, 2, 3)


def test_layout_rebuild_step_leaves_the_full_rebuild_to_step_2() -> None:
    """`layout_rebuild_step` writes nothing (done False) where the reference rebuilds
    from nothing: a pair below the stale position that is not the cache's (pos 1 now
    in cell 30), or a first position that is not pos_min (the cache's pairs start at
    pos 1, compared or not). The compare is skipped where the caller knows the pairs
    below a key equal (`known_below` at pos 4's key): then the pools at pairs 0 and 2
    are kept as they were; their count is checked all the same."""
    differ = ([0, 1, 2, 3, 4], [10, 30, 12, 13, 20])
    got, pos, cols = _rebuild_step(*differ)
    assert got[6] == 0 and pos == [0, 1, 2, 3, 4, 5]
    assert cols[0] == [0, 2, 4]
    for known_below in (-1, 4 << 32):  # compared or not
        got, pos, _ = _rebuild_step([1, 2, 3, 4], [11, 12, 13, 20], known_below)
        assert got[6] == 0 and pos == [0, 1, 2, 3, 4, 5]
    got, pos, cols = _rebuild_step(*differ, known_below=4 << 32)
    assert got[6] == 1 and got[2] == 2 and cols[1][:2] == [111, 113]
    assert pos == [0, 1, 2, 3, 4]  # the kept pairs, then sp's from pos 4
    # known or not, sp's count below the stale position is checked: two pairs, not 4
    assert _rebuild_step([0, 1, 4], [10, 11, 20], known_below=4 << 32)[0][6] == 0


def test_one_call_for_a_stale_sequences_rebuild_changes_no_report(monkeypatch) -> None:
    """compiled/layout.py `_update_one` runs step 2's rebuild of a stale sequence and
    steps 3 and 4 in one call (`_rebuild_run`) under an engine without the fork's
    truncate. With it answering None throughout (step 2, then the step kernel, as
    before), the compiled core's JSON reports of these traces, under both engines,
    are byte-identical."""
    from kpool_cli.compiled.layout import CompiledLayout

    traces = [ROOT / "traces" / f"{name}.yaml" for name in (
        "mtp3-speculative", "seq-add-drift", "state-restore", "partial-copy",
        "server-session", "shared-prefix-race", "non-unified")]
    calls = {"one call": 0}
    one_call = CompiledLayout._rebuild_run

    def counted(self, *args):  # type: ignore[no-untyped-def]
        got = one_call(self, *args)
        calls["one call"] += got is not None
        return got

    monkeypatch.setattr(CompiledLayout, "_rebuild_run", counted)
    fast = _compiled_reports(traces)
    assert calls["one call"] > 10, calls
    monkeypatch.setattr(CompiledLayout, "_rebuild_run", lambda self, *args: None)
    assert _compiled_reports(traces) == fast


def test_pools_of_pairs_by_pos_finds_each_tokens_pool_in_its_sequence() -> None:
    """engine/marking.py `mark` by position (ENGINE.md §6), for tokens of several
    sequences at once over the whole-layout columns. Sequence 0 has pools at global
    0, 1 (pos 0..3, 4..7), sequence 1 none, sequence 2 pools at global 2, 3 (pos 8..11,
    16..19). Pos 5 of seq 0: pool 1; pos 8 of seq 0: past its last rep, none; pos 3
    of seq 1: no pools, none; pos 12 of seq 2: after pool 2's rep, before pool 3,
    none; pos 16 and 19 of seq 2: pool 3; pos 7 of seq 2: before its first pool, none
    (seq 0's pool 1 holds pos 7, but it is another sequence's)."""
    from kpool_cli.compiled import kernels as k

    first_pos = np.array([0, 4, 8, 16], dtype=np.int64)
    rep_pos = np.array([3, 7, 11, 19], dtype=np.int64)
    start = np.array([0, 2, 2, 4], dtype=np.int64)
    pair_seq = np.array([0, 0, 1, 2, 2, 2, 2], dtype=np.int64)
    pair_pos = np.array([5, 8, 3, 12, 16, 19, 7], dtype=np.int64)
    out = np.empty(pair_seq.size, dtype=np.int64)
    k.pools_of_pairs_by_pos(first_pos, rep_pos, start, pair_seq, pair_pos, out)
    assert out.tolist() == [1, -1, -1, -1, 3, 3, -1]


def test_seq_and_k_numbers_every_pool_within_its_sequence() -> None:
    """engine/layout.py `pool_seq` and `Layout._every_k` in one pass: sequence 0 holds
    global pools 0..2, sequence 1 none, sequence 2 pools 3, 4, sequence 3 none. By
    hand: seq 0 0 0 2 2, k 0 1 2 0 1."""
    from kpool_cli.compiled import kernels as k

    start = np.array([0, 3, 3, 5, 5], dtype=np.int64)
    seq, kk = np.full(5, -9, dtype=np.int64), np.full(5, -9, dtype=np.int64)
    k.seq_and_k(start, seq, kk)
    assert seq.tolist() == [0, 0, 0, 2, 2] and kk.tolist() == [0, 1, 2, 0, 1]


def test_visible_by_pos_counts_each_tokens_pools_with_rep_pos_at_or_before_it() -> None:
    """engine/scatter.py `visible_pools` by position (ENGINE.md §7), for tokens of
    several sequences at once. Sequence 0's pools have rep pos 3, 7 (global 0, 1),
    sequence 1 none, sequence 2's 11, 19 (global 2, 3). Seq 0 at pos 7 sees both (7 <=
    7), at pos 6 one; seq 1 at pos 30 none; seq 2 at pos 10 none, at 11 one, at 50 two."""
    from kpool_cli.compiled import kernels as k

    rep_pos = np.array([3, 7, 11, 19], dtype=np.int64)
    start = np.array([0, 2, 2, 4], dtype=np.int64)
    first = np.array([0, 0, 1, 2, 2, 2], dtype=np.int64)
    pos = np.array([7, 6, 30, 10, 11, 50], dtype=np.int64)
    out = np.empty(first.size, dtype=np.int64)
    k.visible_by_pos(rep_pos, start, first, pos, out)
    assert out.tolist() == [2, 1, 0, 0, 1, 2]


def _compiled_reports(traces: list[Path]) -> list[str]:
    """`kpool replay TRACE --engine E --core compiled --backend numba --format json -q`
    of each trace under both engines: the reports, as the CLI prints them."""
    out = []
    for trace in traces:
        for engine in ("rep-once", "cache-safe"):
            r = CliRunner().invoke(cli, ["replay", str(trace), "--engine", engine, "--core",
                                         "compiled", "--backend", "numba", "--format", "json",
                                         "-q"])
            assert r.exit_code in (0, 1), r.output
            out.append(r.output)
    return out


def _mark_plan(keys, pools, rep_pos, pool_cells, pos, stale, *, base=0, g_floor=3,
               pad=(0, 1, 2), row_base=8):  # type: ignore[no-untyped-def]
    """`kernels.mark_plan_one_sequence` of one sequence of kpool 2 by position (rep-once),
    its `seen` scratch checked all False after, on the padding rows `pad`: (marked,
    entries written, the entries' pools, member rows and rep rows, the tokens' visible
    pools)."""
    from kpool_cli.compiled import kernels as k

    a = [np.array(x, dtype=np.int64) for x in (keys, pools, rep_pos, pool_cells, pos, stale)]
    keys, pools, rep_pos, pool_cells, pos, stale = a
    first_pos = rep_pos - 1
    room = max(stale.size + pos.size, g_floor)
    rows, rep, entry = np.empty((room, 2), np.int64), np.empty(room, np.int64), \
        np.empty(room, np.int64)
    visible = np.empty(pos.size, np.int64)
    seen = np.zeros(64, dtype=bool)
    marked, n_g = k.mark_plan_one_sequence(
        keys, pools, pools.size, first_pos, rep_pos, pos, pos.copy(), 2, base, stale,
        pool_cells, True, seen, np.empty(5 * (stale.size + pos.size), np.int64), row_base,
        g_floor, np.array(pad, dtype=np.int64), rows, rep, entry, visible)
    assert not seen.any()
    return (marked.tolist(), int(n_g), entry[:n_g].tolist(), rows[:n_g].tolist(),
            rep[:n_g].tolist(), visible.tolist())


def test_mark_plan_one_sequence_marks_and_plans_as_the_two_steps() -> None:
    """compiled/kernels.py `mark_plan_one_sequence`: ENGINE.md §6's marking, then §7's
    plan, in one call. One sequence of kpool 2 on stream 1 of a cache of 8 cells (its
    rows 8..15), pos p at cell p: pools at pairs 0, 2, 4 (pos 0-1, 2-3, 4-5), rep rows
    9, 11, 13. Tokens at pos 4, 5 fall in pool 2; pool 1 is stale. Candidates 1, 2, 2:
    marked 1, 2. The graph holds max(2, 3) = 3 entries: pool 1 (rows 10, 11, rep 11),
    pool 2 (12, 13, rep 13), and one padding entry on the first padding row (the
    smallest rows that are no pool's rep: 0, 1, 2), row 0. Token at pos 4 sees the
    pools with rep pos <= 4 (1, 3): 2; at pos 5, 3. Below the graph's floor (g_floor
    1), no padding: two entries."""
    keys = [(p << 32) | p for p in range(6)]
    pools, rep_pos, reps = [0, 2, 4], [1, 3, 5], [9, 11, 13]
    assert _mark_plan(keys, pools, rep_pos, reps, [4, 5], [1]) == (
        [1, 2], 3, [1, 2, -1], [[10, 11], [12, 13], [0, 0]], [11, 13, 0], [2, 3])
    assert _mark_plan(keys, pools, rep_pos, reps, [4, 5], [1], g_floor=1)[1:5] == (
        2, [1, 2], [[10, 11], [12, 13]], [11, 13])


def test_mark_plan_one_sequence_leaves_to_build_plan_what_it_does_not_plan() -> None:
    """`mark_plan_one_sequence` writes no plan (0 entries), only the marking, where
    engine/scatter.py `build_plan` has more to say: nothing marked (a token at pos 6,
    past the pools, none stale: padding alone, which `build_plan` keeps by identity);
    the first token's pos not among the pairs (pos 7, then pos 4 of pool 2: GGML_ASSERT);
    too few padding rows (none found: GGML_ASSERT); a stale pool of another sequence (this
    one's pools start at global pool 1, and pool 0 is stale)."""
    keys = [(p << 32) | p for p in range(6)]
    pools, rep_pos, reps = [0, 2, 4], [1, 3, 5], [9, 11, 13]
    assert _mark_plan([*keys, 6 << 32 | 6], pools, rep_pos, reps, [6], [])[:2] == ([], 0)
    assert _mark_plan(keys, pools, rep_pos, reps, [7, 4], [])[:2] == ([2], 0)
    assert _mark_plan(keys, pools, rep_pos, reps, [4, 5], [], pad=())[:2] == ([2], 0)
    assert _mark_plan(keys, pools, rep_pos, [0, *reps], [4, 5], [0], base=1)[1] == 0


def test_one_call_for_marking_and_plan_changes_no_report(monkeypatch) -> None:
    """replay.py `_ubatch` asks the compiled core's `mark_and_plan` for a ubatch of one
    sequence by position under an engine whose padding takes rows of its own, and
    marks and plans apart otherwise. With it answering None throughout, the compiled
    core's JSON reports of these traces, under both engines and with the numba value
    backend, are byte-identical. prefill-decode's six decodes of one slot that close
    no pool and clear's one are plans of padding alone it makes (seven a version)."""
    from kpool_cli.compiled import marking as cm

    traces = [ROOT / "traces" / f"{name}.yaml" for name in (
        "shared-prefix-race", "partial-copy", "non-unified", "mtp3-speculative",
        "server-session", "state-restore", "seq-add-drift", "prefill-decode", "clear")]
    planned = {"both": 0, "padding alone": 0}
    both = cm.mark_and_plan

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        got = both(*args, **kwargs)
        planned["both"] += got is not None and got[1] is not None
        planned["padding alone"] += got is not None and got[1] is not None and not got[0].n_new
        return got

    monkeypatch.setattr(cm, "mark_and_plan", counted)
    one_call = _compiled_reports(traces)
    assert planned["both"] > 20 and planned["padding alone"] >= 14, planned
    monkeypatch.setattr(cm, "mark_and_plan", lambda *args, **kwargs: None)
    assert _compiled_reports(traces) == one_call


def test_a_held_plan_gives_pool_cells_when_asked_until_the_next_update() -> None:
    """compiled/marking.py `mark_and_plan` of a ubatch whose sequence holds every pool
    (mtp3-speculative's drafts, one slot) reads that sequence's rep rows in place and
    leaves the layout's whole column unbuilt: its plan's `pool_cells` is that column,
    built when a reader asks during the ubatch (KP004 would), and asking after the
    layout's next update is kpool's bug (AssertionError), not a stale column."""
    from kpool_cli.replay import Replayer
    from kpool_cli.trace.load import load_trace

    held = []

    def observe(rec, ctx) -> None:  # type: ignore[no-untyped-def]
        plan = ctx.plan
        if plan is not None and not isinstance(plan.cells, np.ndarray):
            assert ctx.layout._pool_cells is None  # not built by the plan
            assert plan.pool_cells.tolist() == ctx.layout.pool_cells().tolist()
            held.append(plan)

    t = load_trace(ROOT / "traces/mtp3-speculative.yaml")
    list(Replayer(t, VERSIONS["rep-once"], observer=observe, core="compiled").run())
    assert len(held) > 5
    with pytest.raises(AssertionError, match="after the next update"):
        held[0].pool_cells  # noqa: B018


_DRIFTED_SLOT = """kpool_trace: 1
cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
ops:
  - decode: {seq: 0, pos: 0..4}
  - seq_cp: {src: 0, dst: 1}
  - seq_rm: {seq: 1, p0: 2, p1: 3}
  - decode: {seq: 0, pos: 4}
  - seq_add: {seq: 0, shift: -2}
  - seq_rm: {seq: 0}
  - decode: {seq: 1, pos: 2..4}
"""


def test_a_one_slot_plan_after_a_memory_update_is_the_same_on_both_cores(
        tmp_path: Path) -> None:
    """The last decode's sequence (1) holds every pool once seq 0 is removed. The
    shift of seq 0 (op 4) emptied two of seq 1's shared cells and moved a third: the
    decode's memory update (ENGINE.md §3, "The memory update") rebuilds seq 1 before
    its tokens are written (3 pairs against 1 cell), so its first token (pos 2, cell
    0) is in its layout and its one pool (cells 3, 0: pos 1, 2) is marked: rep-once
    marks 1 pool in a graph of 2 entries (n_tokens / kpool + 1 sequence), and the
    cores' reports are byte-identical, through `mark_and_plan`'s one call on the
    compiled core. (Before the memory update was modelled, seq 1's layout stayed
    drifted and this ubatch aborted on its first token, which a review of 39b7bfc used
    to hold the one call's abort after the marking's counts.)"""
    trace = tmp_path / "drifted-slot.yaml"
    trace.write_text(_DRIFTED_SLOT)
    reports = {}
    for core in ("compiled", "reference"):
        for engine in ("rep-once", "cache-safe"):
            r = CliRunner().invoke(cli, ["replay", str(trace), "--engine", engine, "--core",
                                         core, "--format", "json", "-q"])
            # cache-safe races seq 0's and seq 1's pool on row 1 at op 3 (KP001)
            assert r.exit_code == (1 if engine == "cache-safe" else 0), r.output
            reports[core, engine] = r.output
    for engine in ("rep-once", "cache-safe"):
        assert reports["compiled", engine] == reports["reference", engine]
    last = json.loads(reports["compiled", "rep-once"])["ubatches"][-1]
    assert (last["n_new"], last["n_new_g"]) == (1, 2)
    assert last["findings"] == []


def test_race_groups_kernel_groups_as_the_context_does() -> None:
    """kernels.race_groups (a radix sort by row, 11 bits a pass, past 64 entries; a
    merge sort below) gives engine/context.py's grouping, and its raced groups
    (`groups_raced`) from the same pass: by hand, entries 0..69
    writing rows 5000, 3, 5000, 2051, 3, five at a time (rows 3 and 2051 = 2048 + 3
    share their low 11 bits: only the second pass tells them apart), so row 3 is
    entries 1, 4, 6, 9, ... (28), row 2051 entries 3, 8, ... (14), row 5000 entries
    0, 2, 5, ... (28); then random entries over caches of 1 to 2**26 rows (one to
    three passes), few and many."""
    from kpool_cli.compiled import kernels as k
    from kpool_cli.engine.context import groups_raced, race_groups

    rep = np.array([5000, 3, 5000, 2051, 3] * 14, dtype=np.int64)
    order, starts, rows, raced = k.race_groups(rep, 8192)
    assert rows.tolist() == [3, 2051, 5000]
    assert starts.tolist() == [0, 28, 42, 70]
    assert raced.tolist() == [0, 1, 2]  # every group holds two entries or more
    assert order[:4].tolist() == [1, 4, 6, 9] and order[28:30].tolist() == [3, 8]
    assert order[42:45].tolist() == [0, 2, 5]
    rng = np.random.default_rng(23)
    for n_rows in (1, 7, 2048, 2049, 262_144, 1 << 22, (1 << 22) + 1, 1 << 26):
        for n in (0, 1, 64, 65, 3000):
            rep = rng.integers(0, n_rows, n).astype(np.int64)
            got, want = k.race_groups(rep, n_rows), race_groups(rep)
            for g, w in zip(got, (*want, groups_raced(want[1])), strict=True):
                assert np.array_equal(g, w), (n_rows, n)


def _grown(old_rep: np.ndarray, before: list[int], added: list[list[int]]
           ) -> tuple[np.ndarray, int, bool, tuple[np.ndarray, ...], np.ndarray]:
    """kernels.grown_race_groups of the plan `old_rep` (segments at `before`) grown by
    appending the rows `added[j]` to segment j: (the new rep rows, then the kernel's
    groups, its verdict on the raced ones, the old groups and the new order)."""
    from kpool_cli.compiled import kernels as k
    from kpool_cli.engine.context import groups_raced, race_groups

    parts = [np.concatenate((old_rep[before[j]:before[j + 1]], np.array(a, dtype=np.int64)))
             for j, a in enumerate(added)]
    rep = np.concatenate(parts).astype(np.int64)
    start = np.concatenate(([0], np.cumsum([p.size for p in parts]))).astype(np.int64)
    b = np.array(before, dtype=np.int64)
    old = race_groups(old_rep)
    raced = groups_raced(old[1])
    n = rep.size
    order, starts, rows = (np.empty(n, dtype=np.int64), np.empty(n + 1, dtype=np.int64),
                           np.empty(n, dtype=np.int64))
    g, same = k.grown_race_groups(*old, int(raced[-1]) if raced.size else -1, rep, b,
                                  np.diff(b), start,
                                  np.empty(old_rep.size, dtype=np.int64),
                                  np.empty(8, dtype=np.int64), order, starts, rows)
    return rep, g, bool(same), old, (order, starts[:g + 1], rows[:g])


def test_race_groups_grown_by_appended_entries_are_the_sorted_ones() -> None:
    """kernels.grown_race_groups (compiled/marking.py `GrowingGroups`): the race groups of
    a plan grown by entries appended to its segments (a cache-safe slot closing a
    pool) are engine/context.py's of the grown plan. By hand: segments [7, 3, 7] and
    [3, 9] (rows 3: entries 1, 3; 7: 0, 2; 9: 4). Appending row 12 to segment 0 (entry
    3): groups 3: 1, 4; 7: 0, 2; 9: 5; 12: 3, the raced ones (rows 3, 7, groups 0
    and 1) as they were. Appending row 9 to segment 0 instead joins row 9's group
    (entries 3, 5): a new raced group. Appending row 1 to segment 1 puts a group
    before the raced ones: they move. Then random plans, few rows (races) and many,
    against the sort, with the verdict checked by its definition."""
    from kpool_cli.engine.context import groups_raced, race_groups

    old_rep = np.array([7, 3, 7, 3, 9], dtype=np.int64)
    rep, g, same, _, (order, starts, rows) = _grown(old_rep, [0, 3, 5], [[12], []])
    assert rows.tolist() == [3, 7, 9, 12] and starts.tolist() == [0, 2, 4, 5, 6]
    assert order.tolist() == [1, 4, 0, 2, 5, 3] and g == 4 and same
    assert rep.tolist() == [7, 3, 7, 12, 3, 9]
    assert not _grown(old_rep, [0, 3, 5], [[9], []])[2]
    assert not _grown(old_rep, [0, 3, 5], [[], [1]])[2]
    rng = np.random.default_rng(5)
    n_same = n_moved = 0
    for _ in range(3000):
        n_seg = int(rng.integers(1, 5))
        n_rows = int(rng.choice([4, 40, 4000]))
        old_rep = rng.integers(0, n_rows, int(rng.integers(0, 30))).astype(np.int64)
        before = sorted([0, old_rep.size, *rng.integers(0, old_rep.size + 1, n_seg - 1)])
        added = [rng.integers(0, n_rows, int(rng.integers(0, 3))).tolist()
                 for _ in range(n_seg)]
        if sum(map(len, added)) > 8:
            continue
        rep, _, same, old, got = _grown(old_rep, before, added)
        want = race_groups(rep)
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a, b)
        # the verdict: the raced groups at the same indices, with the same entries
        # moved where their segments moved (their rows then the same)
        old_raced, new_raced = groups_raced(old[1]), groups_raced(want[1])
        shift = np.repeat(np.cumsum([0, *map(len, added)])[:-1], np.diff(before))
        moved = old[0] + shift[old[0]]
        kept = np.array_equal(old_raced, new_raced) and all(
            np.array_equal(moved[old[1][h]:old[1][h + 1]], want[0][want[1][h]:want[1][h + 1]])
            for h in old_raced.tolist())
        assert same == kept, (old_rep, before, added)
        n_same += same
        n_moved += not same
    assert n_same > 300 and n_moved > 300


def test_race_groups_are_not_grown_past_a_dropped_pool_or_the_room_for_new_ones() -> None:
    """kernels.grown_race_groups says -1 (`GrowingGroups` then sorts) when a pool of
    the plan before was dropped (segment 0 keeps one of its two entries and gains
    one) or when the new entries outnumber its scratch (two new, one a segment, room
    for one); with room for two it grows them (the groups of rows 3: entries 1, 4;
    7: 0, 2; 8: 3, 6; 9: 5)."""
    from kpool_cli.compiled import kernels as k
    from kpool_cli.engine.context import race_groups

    old_rep = np.array([7, 3, 7, 3, 9], dtype=np.int64)
    old = race_groups(old_rep)

    def grown(rep, before, kept, start, room):  # type: ignore[no-untyped-def]
        n = len(rep)
        out = (np.empty(n, dtype=np.int64), np.empty(n + 1, dtype=np.int64),
               np.empty(n, dtype=np.int64))
        g, _ = k.grown_race_groups(*old, 1, np.array(rep, dtype=np.int64),
                                   *(np.array(x, dtype=np.int64) for x in (before, kept, start)),
                                   np.empty(5, dtype=np.int64), np.empty(room, dtype=np.int64),
                                   *out)
        return g, out

    # segment 0 (entries 0..2) keeps 2, drops its third, gains row 8: a pool dropped
    assert grown([7, 3, 8, 3, 9], [0, 3, 5], [2, 2], [0, 3, 5], 4)[0] == -1
    rep = [7, 3, 7, 8, 3, 9, 8]  # each segment kept whole, a row 8 appended to each
    assert grown(rep, [0, 3, 5], [3, 2], [0, 4, 7], 1)[0] == -1
    g, (order, starts, rows) = grown(rep, [0, 3, 5], [3, 2], [0, 4, 7], 2)
    want = race_groups(np.array(rep))
    assert g == 4 and rows[:g].tolist() == want[2].tolist() == [3, 7, 8, 9]
    assert order.tolist() == want[0].tolist() == [1, 4, 0, 2, 3, 6, 5]
    assert starts[:g + 1].tolist() == want[1].tolist()


def test_race_groups_grow_only_from_the_plan_the_growth_names() -> None:
    """compiled/marking.py `GrowingGroups`, on stand-in plans and layouts: a growth
    of the layout's every-pool columns from plan A's member rows grows A's groups
    (A rows [7, 3, 7], then a pool of row 9 appended: its groups grown, the raced
    one kept); but after a plan B in between (not every pool, rows [5, 5, 6]), the
    same growth names A's rows, not B's: C's groups are found by a sort, as
    engine/context.py `race_groups` gives them, never B's grown."""
    from types import SimpleNamespace

    from kpool_cli.compiled.marking import GrowingGroups
    from kpool_cli.engine.context import race_groups
    from kpool_cli.engine.layout import PoolGrowth

    def plan(rep, every):  # type: ignore[no-untyped-def]
        rep = np.array(rep, dtype=np.int64)
        rows = np.repeat(rep[:, None], 2, axis=1)
        pool = np.arange(rep.size)
        layout = SimpleNamespace(is_every_pool=lambda ips: every and ips is pool,
                                 pool_members=lambda: rows, every_growth=lambda: None)
        return SimpleNamespace(entry_rep=rep, entry_pool=pool, entry_rows=rows), layout

    a, lay_a = plan([7, 3, 7], True)
    growth = PoolGrowth(a.entry_rows, np.array([0, 3]), np.array([3]), np.array([0, 4]))
    c, lay_c = plan([7, 3, 7, 9], True)
    lay_c.every_growth = lambda: growth
    for between in (False, True):
        groups = GrowingGroups(64)
        groups(a, lay_a)
        if between:
            groups(*plan([5, 5, 6], False))
        got = groups(c, lay_c)
        assert [g.tolist() for g in got[:3]] == [w.tolist() for w in race_groups(c.entry_rep)]
        assert got.raced_kept is not between  # grown from A (raced row 7 kept), or sorted


def _padding_passes(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """The rows asked of each pass of `kernels.padding_rows` from now on. The kernel
    is loaded first: a first-call stub puts the kernel in its module, over the
    counter (so alone, as the first test to pad, a test counted one pass more)."""
    from kpool_cli.compiled import kernels as k

    k.padding_rows(np.zeros(1, dtype=np.int64), 0, 8, np.empty(0, dtype=np.int64),
                   np.zeros(1, dtype=bool))
    kernel, passes = k.padding_rows, []

    def counted(*args):  # type: ignore[no-untyped-def]
        passes.append(args[1])
        return kernel(*args)

    monkeypatch.setattr(k, "padding_rows", counted)
    return passes


def test_padding_keeps_its_rows_while_the_rep_rows_stand(monkeypatch) -> None:
    """engine/scatter.py `padding_rows` (ENGINE.md §7): the smallest rows that are no
    pool's rep. Reps 3, 0, 6, 1 of a cache of 8 rows: free rows 2, 4, 5, 7. Two pads:
    2, 4 (a pass); then one, from the same array: 2, kept (no pass); three: 2, 4, 5
    (more than kept: a pass); five: only four are free, GGML_ASSERT; four: 2, 4, 5, 7,
    kept from the failed pass; five again aborts, kept. Another cache size is a new
    pass (7 rows: 2, 4, 5 are below it, four pads abort), and so is a new array (reps
    0, 2: free 1, 3, 4, 5, 6): 1, 3. A pass finds as many rows as the most asked so
    far (five, from the fourth call on)."""
    from kpool_cli.cache.aborts import EngineAbort
    from kpool_cli.compiled.marking import Padding

    passes = _padding_passes(monkeypatch)
    pad = Padding()
    cells = np.array([3, 0, 6, 1], dtype=np.int64)
    assert pad(cells, 2, 8, False)[0].tolist() == [2, 4]
    assert pad(cells, 1, 8, False)[0].tolist() == [2]
    assert pad(cells, 3, 8, False)[0].tolist() == [2, 4, 5]
    with pytest.raises(EngineAbort):
        pad(cells, 5, 8, False)
    assert pad(cells, 4, 8, False)[0].tolist() == [2, 4, 5, 7]
    with pytest.raises(EngineAbort):
        pad(cells, 5, 8, False)
    assert passes == [2, 3, 5]
    with pytest.raises(EngineAbort):
        pad(cells, 4, 7, False)
    assert pad(np.array([0, 2], dtype=np.int64), 2, 8, False)[0].tolist() == [1, 3]
    assert passes == [2, 3, 5, 5, 5]


def test_padding_gives_the_same_rows_again_while_they_stand() -> None:
    """`Padding` asked again for as many rows, with the same rep rows and cache size,
    gives the very array it gave (what lets `build_plan` keep a plan of padding
    alone); another count, or a pass (a new rep-row array, even of equal values),
    gives another. Rep rows 3, 0, 6, 1 leave 2, 4, 5, 7 free below 8."""
    from kpool_cli.compiled.marking import Padding

    pad = Padding()
    cells = np.array([3, 0, 6, 1], dtype=np.int64)
    two = pad(cells, 2, 8, False)[0]
    assert two.tolist() == [2, 4] and pad(cells, 2, 8, False)[0] is two
    one = pad(cells, 1, 8, False)[0]
    assert one.tolist() == [2] and one is not two and pad(cells, 1, 8, False)[0] is one
    again = pad(cells.copy(), 1, 8, False)[0]
    assert again.tolist() == [2] and again is not one


def test_padding_equals_the_reference_over_calls_that_keep_and_pass() -> None:
    """`Padding` against engine/scatter.py `padding_rows` on 3,000 calls that alternate
    between three rep-row arrays and draw the pads and the cache size at random: the
    same rows, or the same GGML_ASSERT, whether its answer was kept or passed for."""
    from kpool_cli.cache.aborts import EngineAbort
    from kpool_cli.compiled.marking import Padding
    from kpool_cli.engine.scatter import padding_rows

    rng = np.random.default_rng(29994)
    arrays = [rng.choice(96, size=n, replace=False).astype(np.int64) for n in (10, 40, 80)]
    pad = Padding()

    def answer(pick, cells, n_pad, n_rows):  # type: ignore[no-untyped-def]
        try:
            return pick(cells, n_pad, n_rows, False)[0].tolist()
        except EngineAbort:
            return "abort"

    aborts = 0
    for _ in range(3000):
        cells = arrays[int(rng.integers(3)) if rng.random() < 0.2 else 0]
        n_pad, n_rows = int(rng.integers(1, 40)), int(rng.choice([96, 100, 128]))
        want = answer(padding_rows, cells, n_pad, n_rows)
        assert answer(pad, cells, n_pad, n_rows) == want, (cells.size, n_pad, n_rows)
        aborts += want == "abort"
    assert 0 < aborts < 3000


def _change(kept: int, serial: int):  # type: ignore[no-untyped-def]
    """A one-sequence layout update that kept `kept` pools (engine/layout.py)."""
    from kpool_cli.engine.layout import LayoutChange

    return LayoutChange((kept,), frozenset({0}), frozenset({0}), 0, serial)


def test_padding_held_keeps_its_rows_while_the_reps_below_them_stand(monkeypatch) -> None:
    """`Padding` held (one sequence holds every pool; its rep rows a new array each
    call): the rows kept serve while the rep rows at or below the greatest of them are
    the same set after each update, judged from the pools the update did not keep,
    without a pass. By hand, n_rows 32, 3 rows a call:
    reps 3, 7, 11, 15 leave 0, 1, 2 (a pass); the update keeps 3 pools and pool 3's
    rep moves to 19: none at or below 2 changed, no pass; kept 1, reps 3, 1, 9: row 1
    is a rep now, a pass gives 0, 2, 4; kept 3, reps 3, 1, 9, 4 (a new pool on row 4,
    a kept row): a pass gives 0, 2, 5; kept 1, reps 3, 6 (rows 1 and 4 freed, 6 past
    5): a pass gives 0, 1, 2; kept 2 and a new rep past the bound, no pass; an
    update skipped (serial 8 after 6): a pass, though nothing below changed; a call
    that is not held (another array, build_plan's) and then a held one: passes;
    updates that ask no row followed (`follow`: a decode that pads nothing), the
    next call keeping, or passing after one took row 1; rows that run out below the
    cache's end: a pass each call."""
    from kpool_cli.compiled.marking import Padding
    from kpool_cli.engine.scatter import padding_rows

    passes = _padding_passes(monkeypatch)
    pad = Padding()

    def rows(reps: list[int], kept: int, serial: int) -> list[int]:
        cells = np.array(reps, dtype=np.int64)
        got = pad.up_to(cells, 3, 32, (_change(kept, serial), 0)).tolist()
        assert got == padding_rows(cells, 3, 32, False)[0].tolist()  # the reference's
        return got

    assert rows([3, 7, 11, 15], 0, 1) == [0, 1, 2] and len(passes) == 1
    assert rows([3, 7, 11, 19], 3, 2) == [0, 1, 2] and len(passes) == 1
    assert rows([3, 1, 9], 1, 3) == [0, 2, 4] and len(passes) == 2
    assert rows([3, 1, 9, 4], 3, 4) == [0, 2, 5] and len(passes) == 3
    assert rows([3, 6], 1, 5) == [0, 1, 2] and len(passes) == 4
    assert rows([3, 6, 40], 2, 6) == [0, 1, 2] and len(passes) == 4
    assert rows([3, 6, 40], 3, 8) == [0, 1, 2] and len(passes) == 5
    assert pad(np.array([3, 6, 40], dtype=np.int64), 3, 32, False)[0].tolist() == [0, 1, 2]
    assert len(passes) == 6
    assert rows([3, 6, 40], 3, 9) == [0, 1, 2] and len(passes) == 7
    # updates that ask no row are followed: the next call keeps, or passes if one of
    # them took a row below the bound
    pad.follow(np.array([3, 6, 40, 44], dtype=np.int64), _change(3, 10), 0)
    assert rows([3, 6, 40, 44, 48], 4, 11) == [0, 1, 2] and len(passes) == 7
    pad.follow(np.array([3, 6, 1], dtype=np.int64), _change(2, 12), 0)
    assert rows([3, 6, 1], 3, 13) == [0, 2, 4] and len(passes) == 8
    # below 2 rows, 0 and 1 of 3 are found; then row 1 is a rep: every row below the
    # cache's end counts, so a pass (no bound from rows that were not found)
    held = (_change(0, 14), 0)
    assert pad.up_to(np.array([3, 7], dtype=np.int64), 3, 2, held).tolist() == [0, 1]
    held = (_change(2, 15), 0)
    assert pad.up_to(np.array([3, 7, 1], dtype=np.int64), 3, 2, held).tolist() == [0]
    assert len(passes) == 10


def _marking_lines(run: Callable[[], None]) -> int:
    """How many lines of compiled/marking.py and engine/layout.py (whose `RepRowCounts`
    keeps the padding's counts) Python runs during `run()` (sys.settrace): the
    Python-level work of its steps, whatever form it takes, and no clock."""
    from kpool_cli.compiled import marking
    from kpool_cli.engine import layout

    where, lines = {marking.__file__, layout.__file__}, 0

    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal lines
        if frame.f_code.co_filename not in where:
            return None
        lines += event == "line"
        return tracer

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return lines


def test_padding_held_counts_the_pools_once_across_passes(monkeypatch) -> None:
    """compiled/marking.py `_Low`: `Padding` held counts the sequence's pools by rep row
    once, and then each update costs the pools it replaced, passes included. A pool of
    one token (`kpool: 1`) takes the first padding row at every step, so every step
    passes; when each pass counted every pool again, in Python, such a replay grew
    with the square of its tokens. By hand: rep rows 0..t after step t (t + 1 pools,
    each update keeping the t before), 2 rows a call of a 512-row cache: rows t + 1,
    t + 2, a pass each step. The Python lines the steps run do not grow with the
    pools (steps 350-399 against 0-49, at 350-400 pools against 1-50), and the pools
    are counted at the first step alone; an update missed (serial 403 after 401)
    counts them afresh. Then `_Low.follow` itself: rep rows 5, 2, 9 counted afresh
    (None); pool 2 replaced by one on row 7: row 9 gone, row 7 came; a pool appended on
    row 7: neither (7 holds one already); both on row 7 cut: row 7 gone; every pool
    replaced by rows 4, 2, 8: row 5 gone, rows 4 and 8 came; an update missed:
    afresh."""
    from kpool_cli.compiled.marking import Padding, _Low
    from kpool_cli.engine import layout
    from kpool_cli.engine.scatter import padding_rows

    passes = _padding_passes(monkeypatch)
    pad = Padding()

    def steps(first: int, last: int) -> Callable[[], None]:
        def run() -> None:
            for t in range(first, last):
                cells = np.arange(t + 1, dtype=np.int64)
                got = pad.up_to(cells, 2, 512, (_change(t, t + 1), 0)).tolist()
                assert got == [t + 1, t + 2] == padding_rows(cells, 2, 512, False)[0].tolist()
        return run

    early = _marking_lines(steps(0, 50))
    steps(50, 350)()
    late = _marking_lines(steps(350, 400))
    assert len(passes) == 400 and late <= early * 1.2, (early, late)
    counted: list[int] = []

    class Counting(Counter):  # type: ignore[type-arg]
        def __init__(self, *args):  # type: ignore[no-untyped-def]
            if args:
                counted.append(len(args[0]))
            super().__init__(*args)

    monkeypatch.setattr(layout, "Counter", Counting)  # `RepRowCounts`'s
    steps(400, 401)()
    assert counted == []  # followed, not counted
    cells = np.arange(403, dtype=np.int64)
    assert pad.up_to(cells, 2, 512, (_change(401, 402 + 1), 0)).tolist() == [403, 404]
    assert counted == [403]

    low = _Low()
    reps = [[5, 2, 9], [5, 2, 7], [5, 2, 7, 7], [5, 2]]
    kept = [0, 2, 3, 2]
    got = [low.follow(np.array(r, dtype=np.int64), _change(k, i + 1), 0)
           for i, (r, k) in enumerate(zip(reps, kept, strict=True))]
    assert got == [None, ({9}, {7}), (set(), set()), ({7}, set())]
    # most pools replaced (kept 0 of 2: a seq_keep or seq_cp each step), counted afresh
    # and compared row by row: row 5 gone, rows 4 and 8 came (row 2, on both sides,
    # may be named in both sets or in neither: `Padding._stands` compares the two)
    moved = low.follow(np.array([4, 2, 8], dtype=np.int64), _change(0, 5), 0)
    assert moved is not None
    assert (moved[0] - moved[1], moved[1] - moved[0]) == ({5}, {4, 8})
    assert low.follow(np.array([5], dtype=np.int64), _change(1, 7), 0) is None
    # and that costs no Python line a pool: 100 pools replaced, then 2,000
    few = _marking_lines(lambda: low.follow(np.arange(100), _change(0, 8), 0))
    many = _marking_lines(lambda: low.follow(np.arange(2000) + 1, _change(0, 9), 0))
    assert many <= few + 2, (few, many)


def test_padding_held_equals_the_reference_over_updates(monkeypatch) -> None:
    """`Padding` held against engine/scatter.py `padding_rows` over 3,000 updates of one
    sequence's rep rows drawn at random (pools past a random kept count replaced by
    0-3 new ones, each on a random row, so rows below the kept padding rows are taken
    and freed; one update in twenty skipped, one in five asking no row (`follow`),
    one call in twenty with another cache size, now too small), the pads drawn too:
    the same rows, or the same GGML_ASSERT, whether kept or passed for; most calls
    keep."""
    from kpool_cli.cache.aborts import EngineAbort
    from kpool_cli.compiled.marking import Padding
    from kpool_cli.engine.scatter import padding_rows

    passes = _padding_passes(monkeypatch)
    rng = np.random.default_rng(29994)
    pad = Padding()
    reps = [int(r) for r in rng.choice(200, size=40, replace=False)]

    def answer(cells, n_pad, n_rows):  # type: ignore[no-untyped-def]
        try:
            return padding_rows(cells, n_pad, n_rows, False)[0].tolist()
        except EngineAbort:
            return "abort"

    def held_answer(cells, n_pad, n_rows, held):  # type: ignore[no-untyped-def]
        rows = pad.given(cells, n_pad, n_rows, held)  # None where the call aborts
        return "abort" if rows is None else rows.tolist()

    serial, aborts = 0, 0
    for _ in range(3000):
        kept = int(rng.integers(max(len(reps) - 4, 0), len(reps) + 1))
        reps = reps[:kept] + [int(r) for r in rng.integers(0, 120, size=int(rng.integers(4)))]
        serial += 2 if rng.random() < 0.05 else 1
        cells = np.array(reps, dtype=np.int64)
        if rng.random() < 0.2:  # an update that asks no row: followed
            pad.follow(cells, _change(kept, serial), 0)
            continue
        n_pad = int(rng.integers(1, 8))
        n_rows = int(rng.choice([2, 400])) if rng.random() < 0.05 else 120
        want = answer(cells, n_pad, n_rows)
        assert held_answer(cells, n_pad, n_rows, (_change(kept, serial), 0)) == want
        aborts += want == "abort"
    assert aborts > 0 and len(passes) < 1000, (aborts, len(passes))


def test_compiled_cache_tells_the_sequences_a_step_only_appended_to() -> None:
    """`CompiledKvCache.take_appended` after a step of parallel slots (one token each,
    noted together: `CompiledStream._note_all`): a sequence is an append when its new
    pair sorts after its last and nothing touched it since the last `take_touched`.
    By hand: seqs 0, 1, 2 write pos 0, then pos 1 (both steps: all three appends);
    seq 1's pos 1 is removed (touched, not taken); then pos 2, 1, 0: seq 0 appends,
    seq 1 writes past its end but was touched, seq 2's pos 0 sorts before its pos 1."""
    from kpool_cli.compiled.cache import CompiledKvCache
    from kpool_cli.trace import model as m

    c = CompiledKvCache(m.CacheConfig(kv_size=16, kpool=4, n_seq_max=4))

    def step(pos: list[int]) -> tuple[set[int], set[int]]:
        p, seqs = np.array(pos, dtype=np.int64), [(0,), (1,), (2,)]
        placed = c.plan([(p, seqs, None)])
        assert placed is not None
        c.apply(placed[0], p, None, seqs)
        return c.take_appended(), c.take_touched()

    assert step([0, 0, 0]) == ({0, 1, 2}, {0, 1, 2})
    assert step([1, 1, 1]) == ({0, 1, 2}, {0, 1, 2})
    c.seq_rm(1, 1, 2)
    assert step([2, 1, 0]) == ({0}, {0, 1, 2})
    assert c.seq_keys(2).tolist() == sorted(c.seq_keys(2).tolist())  # the pair inserted


def test_a_one_stream_placement_names_its_stream_and_applies_as_any_other() -> None:
    """`CompiledKvCache.plan` of a one-stream decode names the stream in its
    `Placement` (`stream`), so `apply` skips asking the tokens' streams; the same
    cells placed without the name (-1) are written the same way. Non-unified, seq 1
    is stream 1 (kv_size 8: global rows 8..15): its 3 tokens go to cells 0, 1, 2,
    rows 8, 9, 10, key ids 1, 2, 3."""
    from kpool_cli.cache.kv import Placement
    from kpool_cli.compiled.cache import CompiledKvCache
    from kpool_cli.trace import model as m

    cfg = m.CacheConfig(kv_size=8, kpool=4, n_seq_max=2, unified=False)
    pos, seqs = np.arange(3, dtype=np.int64), [(1,)] * 3
    named, unnamed = CompiledKvCache(cfg), CompiledKvCache(cfg)
    placed = named.plan([(pos, seqs, None)])
    assert placed is not None and placed[0].stream == 1
    rows, ids = named.apply(placed[0], pos, None, seqs)
    assert rows.tolist() == [8, 9, 10] and ids.tolist() == [1, 2, 3]
    again = unnamed.apply(Placement(placed[0].strm, placed[0].cells), pos, None, seqs)
    assert again[0].tolist() == [8, 9, 10] and again[1].tolist() == [1, 2, 3]
    assert named.seq_keys(1).tolist() == unnamed.seq_keys(1).tolist()


def test_compiled_cache_hands_the_layout_the_pairs_a_step_appended() -> None:
    """`CompiledKvCache.take_added` after a step of parallel slots: each sequence's new
    pair (`pos << 32 | cell`), when every one of the step's sequences appended (the
    layout then runs their steps in one `kernels.layout_appends` call); nothing when
    one of them was touched since the last `take_touched` (it is no append, and its
    pairs are read from the cache). By hand: seqs 0, 1 write pos 0 in cells 0, 1, then
    pos 1 in cells 2, 3; seq 1's pos 1 is removed (cell 3 touched and freed); pos 2
    and pos 1 are pushed past each one's last pair, but seq 1 was touched."""
    from kpool_cli.compiled.cache import CompiledKvCache
    from kpool_cli.trace import model as m

    c = CompiledKvCache(m.CacheConfig(kv_size=16, kpool=4, n_seq_max=2))

    def step(pos: list[int]):  # type: ignore[no-untyped-def]
        p, seqs = np.array(pos, dtype=np.int64), [(0,), (1,)]
        placed = c.plan([(p, seqs, None)])
        assert placed is not None
        c.apply(placed[0], p, None, seqs)
        appended, added = c.take_appended(), c.take_added()
        c.take_touched()
        return appended, None if added is None else [a.tolist() for a in added]

    assert step([0, 0]) == ({0, 1}, [[0, 1], [0, 1, 2], [0, 1]])
    assert step([1, 1]) == ({0, 1}, [[0, 1], [0, 1, 2], [(1 << 32) | 2, (1 << 32) | 3]])
    c.seq_rm(1, 1, 2)
    assert step([2, 1]) == ({0}, None)
    assert [key >> 32 for key in c.seq_keys(1).tolist()] == [0, 1]  # pushed all the same


def test_the_reference_planner_names_a_ubatchs_one_stream_and_not_two() -> None:
    """`KvCache.plan` names the stream of a ubatch whose tokens all go to one
    (`Placement.stream`, what `CompiledKvCache.apply` reads), and -1 for one whose
    tokens go to two. Non-unified, two sequences (stream s is seq s's): a ubatch of
    seq 1's two tokens is stream 1's; one of seq 0's token and seq 1's is neither."""
    from kpool_cli.cache.kv import KvCache
    from kpool_cli.trace import model as m

    cfg = m.CacheConfig(kv_size=8, kpool=4, n_seq_max=2, unified=False)
    pos = np.arange(2, dtype=np.int64)
    one = KvCache(cfg).plan([(pos, [(1,), (1,)], None)])
    two = KvCache(cfg).plan([(pos, [(0,), (1,)], None)])
    assert one is not None and one[0].stream == 1 and one[0].strm.tolist() == [1, 1]
    assert two is not None and two[0].stream == -1 and two[0].strm.tolist() == [0, 1]
