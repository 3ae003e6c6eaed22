"""Memory follows the work, a budget known before the replay,
and the numba backend running where numba's cache cannot be written.

- the value backend stores only rows that hold data (slots), so a small decode on a
  huge cache, a `clear` and a cross-stream `seq_cp` cost the rows they touch;
- no op of the cache model (or the replay) allocates O(kv_size * n_stream);
- `budget.memory_bound` is an upper bound of what the replay holds, part by part,
  and `check_replay_memory` names the fields that drive it;
- the CLI replays with numba when no cache location is writable.
No test here is timed: they count bytes (the backend's `bytes_held`, tracemalloc) or
run a subprocess under RLIMIT_AS."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from conftest import ENGINES, trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_backend_incremental import VARIANTS, value_traces

from kpool_cli.backend import budget, keys
from kpool_cli.backend.facts import NEVER
from kpool_cli.backend.store import ValueBackend, make_backend
from kpool_cli.cache.cells import Stream
from kpool_cli.cache.kv import KvCache, Reach
from kpool_cli.contracts.records import UbatchRecord
from kpool_cli.replay import Replayer
from kpool_cli.trace.model import Trace
from kpool_cli.versions import VERSIONS

ROOT = Path(__file__).resolve().parent.parent
RACE = ROOT / "traces" / "shared-prefix-race.yaml"

# two hostile traces (dense: 6.3 GB and 6.6 GB)
HUGE_CLEAR = """
    kpool_trace: 1
    cache: {kv_size: 131072, kpool: 4, n_embd: 4096}
    ops:
      - decode: {seq: 0, pos: 0..8}
      - clear: {}
    """
HUGE_COPY = """
    kpool_trace: 1
    cache: {kv_size: 4194304, kpool: 4, n_seq_max: 2, unified: false, n_embd: 128}
    ops:
      - decode: {seq: 0, pos: 0..8}
      - seq_cp: {src: 0, dst: 1}
      - decode: {seq: 0, pos: 8}
    """


def replayed(t: Trace, backend: str = "numpy", engine: str = "rep-once", cell_map: bool = False
             ) -> tuple[Replayer, ValueBackend]:
    be = make_backend(backend, t)
    rp = Replayer(t, VERSIONS[engine], be, cell_map=cell_map)
    for _ in rp.run():
        pass
    return rp, be


# -- memory follows the work ---------------------------------------------------------------


def test_a_small_decode_on_a_huge_cache_holds_a_few_rows_and_clear_frees_them() -> None:
    t = trace(HUGE_CLEAR)
    be = ValueBackend(t.cache, t.seed, "numpy")
    rp = Replayer(t, VERSIONS["rep-once"], be)
    row_bytes = (4 + 1 + 4) * t.cache.n_embd  # key and pooled float32, gate logits int8
    for rec in rp.run():
        if isinstance(rec, UbatchRecord):
            assert be.n_slots == 8  # the 8 written rows (padding went to member rows)
    assert be.n_slots == 0  # after the clear
    # the per-row map and masks (4 + ROW_BYTES bytes a row) and SLOTS_MIN slots: not
    # 131072 rows
    slot_bytes = row_bytes + ValueBackend.SLOT_BYTES + 8 * t.cache.kpool  # pool_of: kpool
    assert be.bytes_held() <= (t.cache.n_rows * (4 + ValueBackend.ROW_BYTES)
                               + ValueBackend.SLOTS_MIN * slot_bytes)
    assert be.bytes_held() < 4 << 20  # dense: 6 GiB
    assert not be.row_values("key", np.arange(8)).any()  # cleared


def test_a_cross_stream_copy_costs_the_rows_written() -> None:
    t = trace(HUGE_COPY)
    _, be = replayed(t)
    assert be.n_slots == 17  # 8 rows of stream 0, their copies in stream 1, one more token
    kv = t.cache.kv_size
    src = be.row_values("key", np.arange(8))
    assert np.array_equal(be.row_values("key", kv + np.arange(8)), src) and src.any()
    # dense: 12 GiB
    assert be.bytes_held() < t.cache.n_rows * (4 + ValueBackend.ROW_BYTES) + (2 << 20)


def test_rows_are_stored_whole_and_slots_are_reused() -> None:
    """Growth past SLOTS_MIN, a stream copy that frees the destination's rows, a clear:
    slots follow the rows with data, and freed slots are handed out again."""
    t = trace("""
        kpool_trace: 1
        cache: {kv_size: 256, kpool: 2, n_seq_max: 2, unified: false, n_embd: 8}
        ops:
          - decode: {seq: 1, pos: 0..100}
          - decode: {seq: 0, pos: 0..10}
          - seq_cp: {src: 0, dst: 1}
          - decode: {seq: 0, pos: 10}
          - clear: {}
          - decode: {seq: 1, pos: 0..4}
        """)
    be = ValueBackend(t.cache, t.seed, "numpy")
    seen = []
    for rec in Replayer(t, VERSIONS["rep-once"], be).run():
        seen.append((be.n_slots, be.slots._cap))
        if isinstance(rec, UbatchRecord) and rec.op == 3:
            # the copy ran first: stream 1 holds stream 0's rows with values, and only
            # them (its own 100 rows were freed); then the decode wrote row 10
            src = set(np.flatnonzero(be.slots.slot_of[:256]).tolist())
            assert set(np.flatnonzero(be.slots.slot_of[256:]).tolist()) == src - {10}
            assert be.n_slots == 2 * len(src) - 1
    assert max(n for n, _ in seen) > ValueBackend.SLOTS_MIN  # it grew
    # after the clear, slots are handed out from 1 again: seq 1's 4 rows, padding row 0
    assert be.n_slots == 5 and be.slots._free.size == 0
    assert set(be.slots.slot_of[be.slots.slot_of > 0].tolist()) == {1, 2, 3, 4, 5}
    assert be.slots.slot_of[0] > 0 and (be.slots.slot_of[256:260] > 0).all()
    live = be.slots.live_rows()
    assert np.array_equal(be.slots.slot_row[be.slots.slot_of[live]], live)


def _resident_pages(a: np.ndarray) -> int:
    """How many of the pages under `a` are resident (mincore(2), Linux)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    lo = a.ctypes.data // page * page
    n = -(-(a.ctypes.data + a.nbytes - lo) // page)
    vec = (ctypes.c_ubyte * n)()
    assert libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(n * page), vec) == 0
    return sum(v & 1 for v in vec)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore(2) as Linux has it")
def test_a_decode_leaves_the_pooled_rows_of_slots_never_handed_out_untouched() -> None:
    """slots.py `pristine`: a decode's new slots come from the anonymous maps, zero
    already, so write_rows zeroes the pooled row of a slot only when it was handed
    out before (a rewritten row, a slot reused after a clear); the pooled rows of
    new slots stay untouched pages until a scatter writes a rep's."""
    t = trace(HUGE_CLEAR)  # n_embd 4096: a pooled row is 16 KB, four pages
    be = ValueBackend(t.cache, t.seed, "numpy")
    be.write_rows(np.arange(1000), np.arange(1, 1001))
    assert be.slots.pristine == 1001
    assert _resident_pages(be.slots.pooled[1:1001]) == 0
    assert _resident_pages(be.slots.key[1:1001]) == 1000 * 4
    # a slot handed out before holds what was written there: zeroed when handed again
    be.slots.pooled[1:3] = 7.0
    be.clear()
    be.write_rows(np.arange(500, 502), np.arange(1001, 1003))
    assert np.array_equal(be.slots.slot_of[500:502], [1, 2])
    assert not be.row_values("pooled", np.arange(500, 502)).any()
    # and a row written again keeps no pooled value either
    be.slots.pooled[1] = 7.0
    be.write_rows(np.arange(500, 501), np.arange(1003, 1004))
    assert not be.row_values("pooled", np.arange(500, 501)).any()
    assert be.slots.pristine == 1001  # a clear hands the used slots out again


def test_growth_is_safe_while_a_view_of_the_rows_is_alive() -> None:
    """The slot arrays grow in place; with a view still alive (the map cannot move) they
    are copied to a new map instead, and both the view and the rows stay intact."""
    t = trace(HUGE_CLEAR)
    be = ValueBackend(t.cache, t.seed, "numpy")
    be.write_rows(np.arange(4), np.arange(1, 5))
    view = be.slots.key[1:5]
    first = view.copy()
    be.write_rows(np.arange(4, 1000), np.arange(5, 1001))
    assert be.slots._cap >= 1001 and np.array_equal(view, first)
    assert np.array_equal(be.row_values("key", np.arange(4)), first)
    k, _ = keys.key_rows_from_state(keys.seed_state(t.seed), np.arange(1, 1001),
                                   t.cache.n_embd)
    assert np.array_equal(be.row_values("key", np.arange(1000)), k)


def test_zeroing_a_row_without_a_slot_allocates_nothing() -> None:
    t = trace(HUGE_CLEAR)
    be = ValueBackend(t.cache, t.seed, "numpy")
    be.zero_rows(np.arange(1000, 2000))
    assert be.n_slots == 0
    assert be.content(1500).kind == NEVER


@pytest.mark.parametrize("text", [HUGE_CLEAR, HUGE_COPY], ids=["clear", "seq_cp"])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_hostile_traces_replay_under_a_2_gib_address_space(text: str, backend: str,
                                                           tmp_path: Path) -> None:
    """In a subprocess under RLIMIT_AS 2 GiB (the dense arrays alone were 6 and 12 GiB
    of address space): the CLI replays them, exit 0."""
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent(text))
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from kpool_cli.cli import cli
        sys.argv = ["kpool", "replay", {str(path)!r}, "--backend", {backend!r}, "-q"]
        cli()
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "PASS" in r.stdout


def test_no_op_allocates_kv_size_times_n_stream() -> None:
    """8 streams of 2**20 cells: after the cache and backend exist, no record of the
    replay (decodes, a cross-stream copy, state ops, seq_rm -1, seq_keep, a clear)
    allocates more than a few hundred KiB at its peak (n_rows is 8 Mi)."""
    for unified in ("false", "true"):
        t = trace(f"""
            kpool_trace: 1
            cache: {{kv_size: 1048576, kpool: 4, n_seq_max: 8, unified: {unified}, n_embd: 4}}
            ops:
              - decode: {{seq: 0, pos: 0..8}}
              - decode: {{seq: 1, pos: 0..8}}
              - seq_cp: {{src: 0, dst: 2}}
              - decode: {{seq: 0, pos: 8}}
              - state_write: {{seq: 0, slot: a}}
              - state_read: {{seq: 3, slot: a}}
              - seq_rm: {{seq: -1, p0: 4, p1: 6}}
              - decode: {{seq: 1, pos: 8}}
              - seq_keep: {{seq: 1}}
              - decode: {{seq: 1, pos: 9}}
              - state_drop: {{seq: 1}}
              - clear: {{}}
              - decode: {{seq: 0, pos: 0..4}}
            """)
        for engine in ENGINES:
            tracemalloc.start()
            try:
                rp = Replayer(t, VERSIONS[engine], make_backend("numpy", t))
                tracemalloc.reset_peak()
                worst = 0
                for _ in rp.run():
                    cur, peak = tracemalloc.get_traced_memory()
                    worst = max(worst, peak - cur)
                    tracemalloc.reset_peak()
            finally:
                tracemalloc.stop()
            assert worst < 512 << 10, (unified, engine, worst)


def _find_slot_whole(empty: np.ndarray, used: int, head: int, n: int) -> np.ndarray | None:
    """find_slot as it was written over a whole-stream mask (the reference)."""
    size = empty.size
    if n > size:
        return None
    if head > used + 2 * n or head >= size:
        head = 0
    got = np.flatnonzero(empty[head:])[:n] + head
    if got.size < n:
        got = np.concatenate((got, np.flatnonzero(empty[:head])[: n - got.size]))
    return got if got.size == n else None


@settings(max_examples=300, deadline=None)
@given(data=st.data(), kv=st.integers(1, 200), chunk=st.sampled_from([1, 3, 4096]))
def test_find_slot_reads_in_chunks_what_the_whole_mask_says(data, kv: int, chunk: int,
                                                            ) -> None:
    """ENGINE.md §3: the chunked scan from head (skipping the cells earlier ubatches of
    the decode took) places exactly the cells the whole-stream mask placed."""
    st_ = Stream(kv, [0])
    st_.SCAN_CHUNK = chunk
    live = np.array(data.draw(st.lists(st.booleans(), min_size=kv, max_size=kv)))
    st_.pos[live] = 7
    taken = np.array(sorted(data.draw(st.sets(st.integers(0, kv - 1), max_size=kv))),
                     dtype=np.int64)
    taken = taken[~live[taken]]
    empty = ~live
    empty[taken] = False
    used = int(live.sum()) + int(taken.size)
    head = data.draw(st.integers(0, kv + 3))
    n = data.draw(st.integers(1, kv + 1))
    got = KvCache._find_slot(st_, used, head, n, taken)
    want = _find_slot_whole(empty, used, head, n)
    assert (got is None) == (want is None)
    if want is not None:
        assert np.array_equal(got, want)


# -- the budget ------------------------------------------------------------------------------


def test_fixed_sizes_are_the_allocations() -> None:
    """The per-cell and per-row facts of the bounds are what the constructors allocate."""
    for n_col in (1, 3):
        s = Stream(1000, list(range(n_col)))
        held = s.pos.nbytes + s.ext.nbytes + s.has.nbytes + s.seq_count.nbytes + s.key_id.nbytes
        assert held == 1000 * (Stream.CELL_BYTES + n_col)
    t = trace(HUGE_CLEAR)
    be = ValueBackend(t.cache, t.seed, "numpy")
    # a slot: its key and pooled rows (float32) and its gate logits (int8)
    slots = ValueBackend.SLOTS_MIN * ((4 + 1 + 4) * t.cache.n_embd + ValueBackend.SLOT_BYTES
                                      + 8 * t.cache.kpool)
    assert be.bytes_held() == t.cache.n_rows * (ValueBackend.ROW_BYTES + 4) + slots


def _cache_bytes(cache: KvCache) -> int:
    n = sum(st.pos.nbytes + st.ext.nbytes + st.has.nbytes + st.seq_count.nbytes
            + st.key_id.nbytes + sum(k._a.nbytes for k in st.seq_keys.values())
            for st in cache.streams)
    return n + sum(s.pos.nbytes + s.ext.nbytes + s.key_id.nbytes + s.rows.nbytes
                   for s in cache.snapshots.values())


def _layout_bytes(rp: Replayer) -> int:
    return sum(c._a.nbytes for sq in rp.layout.seqs
               for c in (sq.keys, sq.pools, sq.rep_rows, sq.rep_pos_, sq.first_pos_))


def _check_bounds(t: Trace, engine) -> None:
    reach = Reach.of(t)
    cfg = t.cache
    be = ValueBackend(cfg, t.seed, "numpy")
    rp = Replayer(t, engine, be)
    cache_max = KvCache.bytes_bound(cfg, reach)
    values_max = ValueBackend.bytes_bound(cfg, reach, "numpy")
    engine_max = budget.engine_bytes_bound(cfg, reach)
    for _ in rp.run():
        assert _cache_bytes(rp.cache) <= cache_max
        assert be.bytes_held() <= values_max
        assert _layout_bytes(rp) <= engine_max
        assert be.n_slots <= reach.value_rows
        assert max(st.used for st in rp.cache.streams) <= reach.cells


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(t=value_traces(), engine=st.sampled_from(sorted(VARIANTS)))
def test_the_bounds_hold_on_random_traces(t: Trace, engine: str) -> None:
    _check_bounds(t, VARIANTS[engine])


@pytest.mark.parametrize("path", sorted((ROOT / "traces").glob("*.yaml")), ids=lambda p: p.name)
def test_the_bounds_hold_on_shipped_traces(path: Path) -> None:
    from kpool_cli.trace.load import load_trace

    for engine in ENGINES:
        _check_bounds(load_trace(path), VERSIONS[engine])


def test_the_bound_covers_what_a_replay_allocates() -> None:
    """tracemalloc's peak over a whole replay (numpy backend: its arrays are traced)
    stays under the bound, runtime excluded, on traces where the arrays dominate."""
    for text in (HUGE_CLEAR, HUGE_COPY, """
        kpool_trace: 1
        cache: {kv_size: 65536, kpool: 4, n_seq_max: 2, n_embd: 64}
        ops:
          - decode: {seq: 0, pos: 0..4096}
          - seq_cp: {src: 0, dst: 1}
          - state_write: {seq: 0, slot: a}
          - decode: {seq: 0, pos: 4096..4100}
          - state_read: {seq: 1, slot: a}
          - decode: {seq: [0, 1], pos: 4100}
        """):
        t = trace(text)
        for cell_map in (False, True):  # the rich view's cell maps: O(n_rows) a ubatch
            b = budget.memory_bound(t, "numpy", cell_map=cell_map)
            tracemalloc.start()
            try:
                tracemalloc.reset_peak()
                replayed(t, engine="cache-safe", cell_map=cell_map)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak <= b.total - b.parts["runtime"], (cell_map, peak, b.parts)


def test_check_replay_memory_names_the_fields_that_drive_the_need() -> None:
    t = trace(HUGE_COPY)
    b = budget.check_replay_memory(t, "numba", 4 << 30)
    assert b.total == budget.memory_bound(t, "numba").total < 4 << 30
    with pytest.raises(budget.ReplayTooLarge) as e:
        budget.check_replay_memory(t, "numba", 300 << 20)
    msg = str(e.value)
    assert "cache.kv_size 4194304 x n_stream 2" in msg and "--max-memory" in msg
    assert "cache.n_embd 128" in msg and "9 decoded tokens" in msg
    assert e.value.fields[:2] == ("cache.kv_size", "cache.n_seq_max")
    assert e.value.budget == 300 << 20 and e.value.bound.total > 300 << 20
    # the model-only replay needs no value rows, and no numba
    assert budget.memory_bound(t, "none").total < b.total
    assert budget.check_replay_memory(t, "none", None).total > 0


def test_the_value_rows_bound_follows_the_ops() -> None:
    r = Reach.of(trace(HUGE_COPY))
    assert (r.tokens, r.restored, r.copied, r.cells) == (9, 0, 8, 17)
    # a decode: its rows and padding rows (2 n + n // kpool); the copy doubles them
    assert r.value_rows == (2 * 8 + 8 // 4) * 2 + 2
    r = Reach.of(trace("""
        kpool_trace: 1
        cache: {kv_size: 64, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 0..10}
          - state_write: {seq: 0, slot: a}
          - state_read: {seq: 1, slot: a}
          - state_read: {seq: 1, slot: a}
        """))
    assert (r.restored, r.snapshot_rows, r.cells, r.rows) == (20, 20, 30, 30)


def test_parse_memory_and_the_default_budget() -> None:
    assert budget.parse_memory("512M") == 512 << 20
    assert budget.parse_memory("8 GiB") == 8 << 30
    assert budget.parse_memory("2.5GB") == 2_500_000_000
    assert budget.parse_memory("1000") == 1000
    assert budget.parse_memory("none") is None and budget.parse_memory("0") is None
    for bad in ("lots", "-1G", "5X", "nan", ""):
        with pytest.raises(ValueError):
            budget.parse_memory(bad)
    d = budget.default_max_memory()
    assert d is None or d > 0


# -- point 7: numba where its cache cannot be written ----------------------------------------


def test_numba_replays_where_no_cache_location_is_writable(tmp_path: Path) -> None:
    """A copy of the package whose `__pycache__` cannot be a directory (a file holds
    the name: unwritable even for root), HOME and NUMBA_CACHE_DIR under a file too:
    numba's every locator fails. The replay runs (exit 1: KP001 under cache-safe),
    caching in a private directory under TMPDIR."""
    pkg = tmp_path / "site"
    shutil.copytree(ROOT / "kpool_cli", pkg / "kpool_cli",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "kpool_cli" / "backend" / "__pycache__").write_text("not a directory\n")
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # NUMBA_OPT=0: where the kernels are cached is what this asks, not how fast they
    # run; compiled unoptimised, they cost the test less
    env = {**os.environ, "PYTHONPATH": str(pkg), "HOME": str(blocker / "home"),
           "XDG_CACHE_HOME": str(blocker / "cache"), "NUMBA_CACHE_DIR": str(blocker / "numba"),
           "TMPDIR": str(tmp), "PYTHONDONTWRITEBYTECODE": "1", "NUMBA_OPT": "0"}
    cmd = [sys.executable, "-m", "kpool_cli", "replay", str(RACE), "--backend", "numba",
           "--engine", "cache-safe"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=pkg, env=env)
    assert "cannot cache function" not in r.stderr
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "KP001" in r.stdout
    private = tmp / f"kpool-numba-{os.getuid()}"
    assert private.is_dir() and (private.stat().st_mode & 0o777) == 0o700
    assert any(private.rglob("*.nbi"))  # numba's cache index files


def test_a_private_cache_dir_someone_else_could_write_is_refused(tmp_path: Path,
                                                                 monkeypatch) -> None:
    from kpool_cli import jit

    monkeypatch.setattr(jit.tempfile, "gettempdir", lambda: str(tmp_path))
    path = tmp_path / f"kpool-numba-{os.getuid()}"
    assert jit._private_cache_dir() == str(path)
    path.chmod(0o777)  # group and others may write: a cache loaded with pickle, refused
    assert jit._private_cache_dir() is None
    path.rmdir()
    path.write_text("")  # not a directory
    assert jit._private_cache_dir() is None
    # no locator and no private directory: the kernels are jitted without a cache
    monkeypatch.setattr(jit, "_numba_can_cache", lambda probe: False)
    assert jit._choose_cache(jit.kernel) == ""
