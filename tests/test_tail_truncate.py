"""The third shipped version, tail-truncate (versions.py, TAIL_TRUNCATE; ENGINE.md
§5 step 2 as a fork's MTP patch changes it): a stale sequence with no shared cell is
truncated at its stale position instead of rebuilt. Numbers derived by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from conftest import codes, run, trace, ubatches

from kpool_cli.versions import VERSIONS

ROOT = Path(__file__).resolve().parent.parent


def kpool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kpool_cli", *args], capture_output=True,
                          text=True, cwd=ROOT)


MTP_STEP = """
    kpool_trace: 1
    cache: {kv_size: 32, kpool: 4, n_seq_max: 1, n_rs_seq: 3}
    ops:
      - decode: {seq: 0, pos: 0..10}
      - seq_rm: {seq: 0, p0: 8, p1: -1}
      - decode: {seq: 0, pos: 8..12}
    """


def test_the_shipped_versions_are_the_bases_the_port_and_the_fork_as_it_ships():
    assert list(VERSIONS)[:4] == ["cache-safe", "rep-once", "tail-truncate",
                                  "cache-safe+tail-truncate"]
    tt, ro = VERSIONS["tail-truncate"], VERSIONS["rep-once"]
    assert tt == replace(ro, name="tail-truncate", description=tt.description,
                         truncate_stale_tail=True, truncate_spares="no-shared-cell")
    fork, cs = VERSIONS["cache-safe+tail-truncate"], VERSIONS["cache-safe"]
    assert fork == replace(cs, name=fork.name, description=fork.description,
                           truncate_stale_tail=True, truncate_spares="flagged-shared")


def test_s5_a_rejected_tail_is_truncated_not_rebuilt():
    """ENGINE.md §5 step 2. Pos 0..9 on cells 0..9 (kpool 4): pools at pos 0 and 4,
    pos 8, 9 no pool yet; the first update copies the 10 pairs under both versions.
    seq_rm [8, inf) (a rollback of 2 <= n_rs_seq 3) stales seq 0 at 8; pos 8..11 are
    decoded. rep-once rebuilds: it copies all 12 pairs. tail-truncate keeps the 8 pairs
    below pos 8 and the 2 pools ending in them, and the append path copies the 4 new
    pairs: 4. Both find pool 2 (pos 8..11) and mark it alone (n_new 1)."""
    t = trace(MTP_STEP)
    got = {}
    for engine in ("rep-once", "tail-truncate"):
        ubs = ubatches(run(t, engine))
        got[engine] = [u.cost["cells_scanned"] for u in ubs]
        assert [u.n_new for u in ubs] == [2, 1] and [u.n_pool_real for u in ubs] == [2, 3]
        assert ubs[1].pools.marked() == ((0, 2),)
        assert not codes(run(t, engine))
    assert got == {"rep-once": [10, 12], "tail-truncate": [10, 4]}


def test_s5_a_shared_sequence_still_rebuilds():
    """Seq 1 shares seq 0's 8 cells (whole seq_cp), then seq 0's tail [6, inf) goes and
    pos 6, 7 come back on new cells. Seq 0 still shares cells 0..5 with seq 1: the patch
    rebuilds it, as rep-once does: the same cells scanned under both versions."""
    t = trace("""
        kpool_trace: 1
        cache: {kv_size: 32, kpool: 2, n_seq_max: 2, n_rs_seq: 3}
        ops:
          - decode: {seq: 0, pos: 0..8}
          - seq_cp: {src: 0, dst: 1}
          - seq_rm: {seq: 0, p0: 6, p1: -1}
          - decode: {seq: 0, pos: 6..8}
        """)
    costs = {e: [u.cost["cells_scanned"] for u in ubatches(run(t, e))]
             for e in ("rep-once", "tail-truncate")}
    assert costs["rep-once"] == costs["tail-truncate"]


def test_s5_the_count_check_still_rebuilds_a_truncated_sequence():
    """Found by `kpool fuzz --engine tail-truncate --base rep-once` (seed 872): seq_cp
    from an empty seq 1 resets seq 0's recurrent state, so pos 3 is accepted for seq 0
    below its cell at pos 4. The truncation at the stale position 5 keeps (4, cell 0),
    and the append path takes only pairs after it: (3, cell 2) is not appended. The
    layout then holds 1 pair for 2 cells; step 2's count check rebuilds it, as
    rep-once does (without it: KP007, then KP005)."""
    t = trace("""
        kpool_trace: 1
        cache: {kv_size: 4, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 4}
          - seq_cp: {src: 1, dst: 0}
          - decode: {seq: 1, pos: 3}
          - seq_rm: {seq: 0, p0: 5}
          - decode: {seq: 0, pos: 3}
        """)
    for engine in ("rep-once", "tail-truncate"):
        assert not codes(run(t, engine)) - {"KP006"}, engine


def test_a_differential_fuzz_run_finds_a_behaviour_difference_and_shrinks_it():
    """`kpool fuzz --engine E --base B` (gen/fuzz.diverges): the race trace differs
    between rep-once and cache-safe (KP001, n_new), never between an engine and
    itself; a run whose random trace differs reports ("diff", "diff/rep-once") and its
    shrunk trace still differs."""
    from pathlib import Path

    from kpool_cli.gen.fuzz import DIVERGED, FuzzTask, diverges, fuzz_one
    from kpool_cli.trace.load import load_trace, load_trace_text

    race = load_trace(Path(__file__).resolve().parent.parent / "traces/shared-prefix-race.yaml")
    assert diverges(race, "rep-once", "cache-safe")
    assert not diverges(race, "rep-once", "rep-once")
    assert not diverges(race, "rep-once", "tail-truncate")
    seed = next(s for s in range(200)
                if fuzz_one(FuzzTask(s, "cache-safe", shrink=False, base="rep-once")).findings)
    out = fuzz_one(FuzzTask(seed, "cache-safe", base="rep-once"))
    assert out.findings == ((DIVERGED, f"{DIVERGED}/rep-once"),)
    (small,) = out.shrunk
    assert small.n_ops <= out.n_ops
    assert diverges(load_trace_text(small.yaml), "rep-once", "cache-safe")


def test_s5_a_cut_inside_a_pool_drops_that_pool():
    """kpool 4: pos 0..11 on cells 0..11, pools 0, 1, 2 (pos 8..11, rep cell 11).
    seq_rm [10, inf) cuts pool 2 in half (stale 10). Seq 1 then takes cells 10, 11 (its
    ubatch: rep-once rebuilds seq 0's 10 pairs and copies seq 1's 2, 12; tail-truncate
    keeps seq 0's 10 pairs, copies nothing for it, 2). Only the pools that end below the
    cut survive (0 and 1: pool 2 started at pair 8 > 10 - kpool); pos 10..12 land on
    cells 12..14 and the scan finds pool 2 again on cells 8, 9, 12, 13, rep 13 (not 11),
    marked new in both; 3 pairs appended."""
    t = trace("""
        kpool_trace: 1
        cache: {kv_size: 32, kpool: 4, n_seq_max: 2, n_rs_seq: 3}
        ops:
          - decode: {seq: 0, pos: 0..12}
          - seq_rm: {seq: 0, p0: 10, p1: -1}
          - decode: {seq: 1, pos: 0..2}
          - decode: {seq: 0, pos: 10..13}
        """)
    got = {}
    for engine in ("rep-once", "tail-truncate"):
        ubs = ubatches(run(t, engine))
        got[engine] = [u.cost["cells_scanned"] for u in ubs]
        (p,) = ubs[2].pools
        assert (p.seq, p.k, p.rep, p.new) == (0, 2, 13, True)
        assert p.cells == (8, 9, 12, 13)
        assert not codes(run(t, engine))
    assert got == {"rep-once": [12, 12, 3], "tail-truncate": [12, 2, 3]}


def test_s5_the_forks_patch_on_its_own_base_cache_safe():
    """The fork's patch as it ships (audiagentic/bigcherry
    patches/1292_kpool_tail_truncate/patch.py, on the pre-PR #29994 code): cache-safe
    plus the cut. The trace of the first test (no sharing): cache-safe's update copies
    the 10 pairs and its sharing scan (step 3) reads all 10 (no cell shared): 20.
    After seq_rm [8, inf), cache-safe rebuilds and rescans 12 + 12 = 24; the patch keeps
    the 8 pairs below pos 8 (`n_kept` = 8), appends the 4 new ones and scans only
    those (the scan starts at n_kept): 4 + 4 = 8. Pools and marking as rep-once's."""
    t = trace(MTP_STEP)
    got = {}
    for engine in ("cache-safe", "cache-safe+tail-truncate"):
        ubs = ubatches(run(t, engine))
        got[engine] = [u.cost["cells_scanned"] for u in ubs]
        assert [u.n_new for u in ubs] == [2, 1] and ubs[1].pools.marked() == ((0, 2),)
    assert got == {"cache-safe": [20, 24], "cache-safe+tail-truncate": [20, 8]}


def test_s5_the_forks_gate_is_the_sq_shared_flag():
    """`!sq.shared` (patch.py's cut condition) reads the flag step 3 set at the last
    update. Seq 0 and 1 share pos 0..3 (a token with both seq ids sets the flag of
    both, cache-safe's sharing scan); seq 0 alone then decodes 4..9, and a seq_rm of
    its tail [8, inf) under cache-safe... while the layout is shared every sequence is
    staled from 0 (ENGINE.md §4), so both rebuild, flag or not: the cut needs a stale
    position above pos_min. A seq_add of the tail keeps the stale position at 8: seq 0
    is flagged shared, so the fork rebuilds it (pos 0..7, the shifted 10, 11 and the new
    12: 11 pairs copied; the sharing scan stops at its first shared cell, pair 0: 1),
    the same as cache-safe. And the gate reads the flag, not the cells: a sequence
    flagged shared whose cells no other sequence holds is spared all the same (the
    port, which reads the cells, cuts it)."""
    t = trace("""
        kpool_trace: 1
        cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {tokens: [{pos: 0, seq: [0, 1]}, {pos: 1, seq: [0, 1]},
                              {pos: 2, seq: [0, 1]}, {pos: 3, seq: [0, 1]}]}
          - decode: {seq: 0, pos: 4..10}
          - seq_add: {seq: 0, p0: 8, p1: -1, shift: 2}
          - decode: {seq: 0, pos: 12}
        """)
    costs = {e: [u.cost["cells_scanned"] for u in ubatches(run(t, e))]
             for e in ("cache-safe", "cache-safe+tail-truncate")}
    assert costs["cache-safe"] == costs["cache-safe+tail-truncate"]
    assert costs["cache-safe"][-1] == 11 + 1

    from kpool_cli.cache.kv import KvCache
    from kpool_cli.engine.layout import Layout, SeqLayout

    cache = KvCache(trace(MTP_STEP).cache)
    flagged = SeqLayout(shared=True)
    flagged.keys.assign(cache.seq_keys(0))
    layout = Layout(1, 4, False, 32)
    assert layout._spared(cache, flagged, "flagged-shared")
    assert not layout._spared(cache, flagged, "no-shared-cell")


def test_a_patch_that_cannot_apply_is_exit_2_naming_both(tmp_path):
    """The fork's anchors (`size_t n_kept = 0;`, `!sq.shared`) do not exist after PR
    #29994: `rep-once+tail-truncate` is refused before any replay, as is the port on
    the base before it and two patches changing one policy."""
    for spec, base, patch in (("rep-once+tail-truncate", "rep-once", "tail-truncate"),
                              ("cache-safe+tail-truncate-port", "cache-safe",
                               "tail-truncate-port")):
        r = kpool("replay", "traces/shared-prefix-race.yaml", "--engine", spec)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert f"patch {patch!r} cannot apply to base {base!r}" in r.stderr, r.stderr
    r = kpool("replay", "traces/shared-prefix-race.yaml", "--engine",
              "cache-safe+tail-truncate+tail-truncate")
    assert r.returncode == 2 and "both change truncate_stale_tail" in r.stderr
    r = kpool("replay", "traces/shared-prefix-race.yaml", "--engine", "rep-once+nope")
    assert r.returncode == 2 and "unknown patch 'nope'" in r.stderr


def test_a_patch_refused_on_a_base_names_what_to_run_there_instead():
    """`rep-once+tail-truncate` is refused, and the refusal says what to run: the port
    onto rep-once (`Patch.port_of`), which ships as `tail-truncate` (not the patch of
    that name); the port on cache-safe is pointed back at the fork's patch, and in a
    longer spec only the refused patch is replaced."""
    from kpool_cli.versions import VersionError, compose, instead

    r = kpool("replay", "traces/shared-prefix-race.yaml", "--engine", "rep-once+tail-truncate")
    assert r.returncode == 2, r.stderr
    said = " ".join(r.stderr.split())
    assert ("for rep-once, use its port: rep-once+tail-truncate-port, the shipped version "
            "`tail-truncate` (not the patch of that name)") in said, said
    assert instead("cache-safe", "tail-truncate-port") == (
        "use the patch it ports: cache-safe+tail-truncate")
    assert instead("rep-once", "noop-seq-rm") == ""
    try:
        compose("rep-once+noop-seq-rm+tail-truncate")
    except VersionError as e:
        assert str(e).endswith("for rep-once, use its port: "
                               "rep-once+noop-seq-rm+tail-truncate-port"), e
    else:
        raise AssertionError("composed")


def test_the_fork_as_it_ships_has_the_race_pr_29994_fixes():
    """Done when of issue 24: the fork's pin is cache-safe plus the cut, so the shared
    prompt of traces/shared-prefix-race.yaml races (KP001) as on cache-safe: twice, at
    the two ubatches after the seq_cp; the port onto rep-once does not."""
    r = kpool("replay", "traces/shared-prefix-race.yaml", "--engine",
              "cache-safe+tail-truncate", "--format", "json")
    doc = json.loads(r.stdout)
    found = [f["code"] for u in doc["ubatches"] for f in u["findings"]]
    assert found == ["KP001", "KP001"] and r.returncode == 1
    assert doc["engine"] == "cache-safe+tail-truncate"


def test_kpool_layout_update_bigcherry_cut_needs_pos_min_at_the_cells_first_pos():
    """patch.py's cut condition includes `sq.pos_min == sp.begin()->first`: a layout
    (pos 4 on cell 0, pos_min 4) whose cells now start lower (pos 3 on cell 2, then 4
    and 5 on cells 0, 3), stale at 5, is not cut: step 2 rebuilds it, copying the 3
    pairs. (A cut would keep (4, 0), append (5, 3), then the count check would rebuild
    it anyway: 1 + 3 pairs copied.)"""
    import numpy as np

    from kpool_cli.cache.cells import make_keys
    from kpool_cli.cache.kv import KvCache
    from kpool_cli.engine.layout import Layout, SeqLayout

    cache = KvCache(trace(MTP_STEP).cache)
    sq = SeqLayout(pos_min=4)
    sq.keys.assign(make_keys(np.array([4]), np.array([0])))
    sp = make_keys(np.array([3, 4, 5]), np.array([2, 0, 3]))
    layout = Layout(1, 4, False, 32)
    for spares in ("no-shared-cell", "flagged-shared"):
        assert layout.step_2(cache, sq, sp, 5, spares, 0, 0) == (0, 0, 3, True)
        sq.keys.assign(make_keys(np.array([4]), np.array([0])))
        sq.pos_min = 4
