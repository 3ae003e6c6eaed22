"""The value kernels and their safety.

- the numba kernels (kernels.py) against their numpy twin (reference.py), bit for
  bit, on arrays built here;
- the wrappers (`ValueBackend` in store.py, and each kernel's door in guarded.py)
  check every index before a kernel runs:
  bad rows from the replay (out of range, repeated where a kernel takes one writer
  per row, not integers, the wrong shape), a doctored scatter plan, a corrupt slot
  map: each is a `PlanError` naming the row or slot, never a write outside an
  array, and a refused plan leaves the backend as it was;
- this module runs again in a subprocess with NUMBA_BOUNDSCHECK=1 and a fresh
  NUMBA_CACHE_DIR (`test_kernel_tests_pass_with_numba_boundscheck`), with the
  numba replays of the shipped traces. The directory must be fresh: numba's cache
  does not key on boundscheck, so kernels compiled without it would be loaded and
  run unchecked. There `test_numba_boundscheck_is_on` proves the checks took: an
  out-of-range index raises IndexError inside the kernel itself.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numba
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import ENGINES

from kpool_cli.backend import guards, keys, recheck, reference
from kpool_cli.backend.store import PlanError, ValueBackend, kernel_module
from kpool_cli.cache.cells import CELL_MASK
from kpool_cli.cli.main import cli
from kpool_cli.contracts.records import UbatchRecord
from kpool_cli.engine.context import UbatchContext
from kpool_cli.engine.layout import FlatColumns
from kpool_cli.replay import Replayer
from kpool_cli.trace.load import load_trace
from kpool_cli.trace.model import CacheConfig
from kpool_cli.versions import VERSIONS

ROOT = Path(__file__).resolve().parent.parent
TRACE_FILES = sorted((ROOT / "traces").glob("*.yaml"))
kernels = kernel_module("numba")
BACKENDS = ("numba", "numpy")
BOUNDSCHECK = bool(numba.config.BOUNDSCHECK)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


# -- the kernels: numba == numpy, bit for bit --------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2**63 + 5])
def test_key_rows_agree_and_are_in_range(seed: int) -> None:
    rng = np.random.default_rng(seed % 1000)
    n_rows, n_embd = 300, 48
    rows = rng.permutation(n_rows)[:200].astype(np.int64)
    ids = rng.integers(0, 2**40, 200).astype(np.int64)
    ids[:7] = 0
    state = keys.seed_state(seed)
    got = [np.zeros((n_rows, n_embd), dt) for dt in (np.float32, np.int8) * 2]
    kernels.write_keys(state, rows, ids, got[0], got[1])
    reference.write_keys(state, rows, ids, got[2], got[3])
    assert same(got[0], got[2]) and same(got[1], got[3])
    k, g = keys.key_rows_from_state(keys.seed_state(seed), ids, n_embd)
    assert same(got[0][rows], k) and same(got[1][rows], g)
    assert np.all(k[:7] == 0) and np.all(g[:7] == 0)  # key id 0: a zeroed row
    assert k.min() >= -1 and k.max() < 1
    assert set(np.unique(g[7:]).tolist()) == set(range(-keys.GATE_MAX, keys.GATE_MAX + 1))


def test_parallel_builds_agree() -> None:
    """The opt-in parallel builds (KPOOL_NUMBA_PARALLEL=1) give the serial results."""
    n = 3000
    rows = np.arange(n, dtype=np.int64)[::-1].copy()
    ids = np.arange(1, n + 1, dtype=np.int64)
    a = [np.zeros((n, 16), dt) for dt in (np.float32, np.int8) * 2]
    sig = kernels._WRITE_KEYS_SIG
    kernels._parallel("write_keys", kernels._write_keys, sig)(np.uint64(9), rows, ids, a[0],
                                                              a[1])
    kernels._write_keys_serial(np.uint64(9), rows, ids, a[2], a[3])
    assert same(a[0], a[2]) and same(a[1], a[3])
    members = np.random.default_rng(0).integers(0, n, (2000, 4)).astype(np.int64)
    out = np.empty((2000, 16), np.float32)
    kernels._parallel("pool", kernels._pool_into_parallel, kernels._POOL_SIG)(
        a[0], a[1], members, out, *kernels._scratch(4, 16))
    assert same(out, reference.pool(a[2], a[3], members))


def test_a_large_write_takes_its_keys_from_the_parallel_build(monkeypatch) -> None:
    """Past the work threshold, with the parallel builds on, `write_rows` leaves the
    key rows to `write_keys`' parallel build (used, and recorded as used), and writes
    what the serial pass writes."""
    n = 300
    rows = np.arange(n, dtype=np.int64)[::-1].copy()
    ids = np.arange(1, n + 1, dtype=np.int64)
    got = []
    for parallel in (False, True):
        monkeypatch.setattr(kernels, "PARALLEL", parallel)
        monkeypatch.setattr(kernels, "PARALLEL_MIN_KEYS", 16 * n)
        monkeypatch.setitem(kernels.PARALLEL_USED, "write_keys", False)
        a = _slot_table(n + 1, n, 16, np.int32)
        out = np.empty(n, np.int64)
        assert _write_rows(kernels, np.uint64(9), rows, ids, np.empty(0, np.int64), 1, 1, a,
                           out) == (guards.WROTE, n)
        assert kernels.PARALLEL_USED["write_keys"] is parallel
        got.append(a)
    for name in got[0]:
        assert np.array_equal(got[0][name].view(np.uint8), got[1][name].view(np.uint8)), name


def test_many_fresh_entries_pool_in_the_parallel_build(monkeypatch) -> None:
    """Past the work threshold, with the parallel builds on, `scatter_fresh` pools its
    fresh entries in `pool`'s parallel build (used, and recorded as used) and writes
    what the serial pass writes."""
    rng = np.random.default_rng(1)
    n_rows, n_embd, kpool, n = 300, 32, 4, 600
    key, gate = np.zeros((n_rows, n_embd), np.float32), np.zeros((n_rows, n_embd), np.int8)
    reference.write_keys(keys.seed_state(3), np.arange(n_rows), rng.integers(0, 10**6, n_rows),
                         key, gate)
    members = rng.integers(0, n_rows, (n, kpool)).astype(np.int64)
    reps = rng.integers(0, n_rows, n).astype(np.int64)
    keep = rng.random(n) < 0.3
    st = rng.permutation(n_rows)[:200].astype(np.int64)
    src = rng.integers(0, n, 200).astype(np.int64)
    got = []
    for parallel in (False, True):
        monkeypatch.setattr(kernels, "PARALLEL", parallel)
        monkeypatch.setattr(kernels, "PARALLEL_MIN_POOL", kpool * n_embd * 100)
        monkeypatch.setitem(kernels.PARALLEL_USED, "pool", False)
        pooled = np.full((n_rows, n_embd), 0.25, np.float32)
        gens = (np.zeros((n_rows, kpool), np.int64), np.zeros(n_rows, np.int64))
        vals = np.empty((n, n_embd), np.float32)
        changed = kernels.scatter_fresh(key, gate, pooled, *gens, 3, members, reps, keep, st,
                                        src, vals)
        assert kernels.PARALLEL_USED["pool"] is parallel
        got.append((bits(pooled), *gens, bits(vals), changed))
    assert all(np.array_equal(a, b) for a, b in zip(*got, strict=True))


@pytest.mark.parametrize("kpool", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 37, 5000])
def test_pool_scatter_gather_check_agree(kpool: int, n: int) -> None:
    rng = np.random.default_rng(kpool * 100 + n)
    n_rows, n_embd = 256, 32
    key = np.zeros((n_rows, n_embd), np.float32)
    gate = np.zeros((n_rows, n_embd), np.int8)
    ids = rng.integers(0, 10**6, n_rows).astype(np.int64)
    ids[::17] = 0
    reference.write_keys(keys.seed_state(3), np.arange(n_rows), ids, key, gate)
    members = rng.integers(0, n_rows, (n, kpool)).astype(np.int64)
    pk = kernels.pool(key, gate, members)
    pn = reference.pool(key, gate, members)
    assert same(pk, pn)
    # scatter_fresh (distinct rows; a third of the entries that are no row's source
    # kept, so every row written holds a pooling) and gather
    pooled_k = rng.standard_normal((n_rows, n_embd)).astype(np.float32)
    pooled_n = pooled_k.copy()
    m = min(n, n_rows)
    rows = rng.permutation(n_rows)[:m].astype(np.int64)
    src = rng.integers(0, max(n, 1), m).astype(np.int64)
    reps = rng.integers(0, n_rows, n).astype(np.int64)
    keep = (rng.random(n) < 0.3) & ~np.isin(np.arange(n), src)
    gens = [(np.zeros((n_rows, kpool), np.int64), np.zeros(n_rows, np.int64)) for _ in "kn"]
    vals_k, vals_n = (np.empty((n, n_embd), np.float32) for _ in "kn")
    got_k = kernels.scatter_fresh(key, gate, pooled_k, *gens[0], 5, members, reps, keep, rows,
                                  src, vals_k)
    got_n = reference.scatter_fresh(key, gate, pooled_n, *gens[1], 5, members, reps, keep,
                                    rows, src, vals_n)
    assert same(vals_k, vals_n) and same(pooled_k, pooled_n)
    assert np.array_equal(got_k, got_n)
    assert all(np.array_equal(a, b) for a, b in zip(*gens, strict=True))
    pk = pn = vals_k
    look = rng.integers(0, n_rows, 50).astype(np.int64)
    assert same(kernels.gather(pooled_k, look), reference.gather(pooled_n, look))
    # the check: rows just scattered agree with their pooling, perturbed ones do not
    if m:
        members_m = members[src]
        key_gen = np.zeros(n_rows, np.int64)  # no key written since the scatter
        for (_pool_of, pool_gen), pooled in ((gens[0], pooled_k), (gens[1], pooled_n)):
            pooled[rows[0], 0] += 1
            pool_gen[rows[0]] = 0  # a pooled row written outside a scatter (slots.py)
        dk = kernels.pools_differ(key, gate, pooled_k, *gens[0], key_gen, members_m, rows)
        dn = reference.pools_differ(key, gate, pooled_n, *gens[1], key_gen, members_m, rows)
        assert np.array_equal(dk, dn)
        assert dk[0] and not dk[1:].any()


def test_pools_differ_judges_a_kept_pooling_by_its_generations() -> None:
    """Slots 5 and 6 hold the pooling of member slots (1, 2) and (3, 4), pooled at
    generation 3, every key written at generation 1. The numba twin reads the
    generations (slots.py's invariants): with both rows zeroed behind them (a state
    no writer leaves, made here to see which entries are pooled again) it finds
    neither differs, where the numpy twin, which pools every entry, finds both do.
    Each part of the rule sends an entry to the pooling, which then differs from
    the zeroed row: members other than `pool_of` ((2, 1)), a member key written at
    the pooling's generation (key_gen 3), a pooled row of generation 0."""
    rng = np.random.default_rng(7)
    n_slots, n_embd = 8, 4
    key = rng.uniform(-1, 1, (n_slots, n_embd)).astype(np.float32)
    gate = rng.integers(-2, 3, (n_slots, n_embd)).astype(np.int8)
    members, rows = np.array([[1, 2], [3, 4]], np.int64), np.array([5, 6], np.int64)
    pooled = np.zeros((n_slots, n_embd), np.float32)
    pool_of, pool_gen = np.zeros((n_slots, 2), np.int64), np.zeros(n_slots, np.int64)
    key_gen = np.ones(n_slots, np.int64)
    pool_of[rows], pool_gen[rows] = members, 3

    def differ(twin, m=members, kg=key_gen, pg=pool_gen):
        return twin.pools_differ(key, gate, pooled, pool_of, pg, kg, m, rows).tolist()

    assert differ(kernels) == [False, False]
    assert differ(reference) == [True, True]
    assert differ(kernels, m=np.array([[2, 1], [3, 4]], np.int64)) == [True, False]
    assert differ(kernels, kg=np.where(np.arange(n_slots) == 4, 3, key_gen)) == [False, True]
    assert differ(kernels, pg=np.where(np.arange(n_slots) == 5, 0, pool_gen)) == [True, False]


def _random_slot_values(rng: np.random.Generator, n_slots: int, kpool: int
                        ) -> tuple[np.ndarray, ...]:
    """Random key, gate (in the gates' range) and pooled rows (n_embd 8), poolings and
    generations (0..3) of n_slots slots: a slot table's values for the twins'
    agreement tests."""
    key = rng.standard_normal((n_slots, 8)).astype(np.float32)
    gate = rng.integers(-keys.GATE_MAX, keys.GATE_MAX + 1, (n_slots, 8)).astype(np.int8)
    pooled = rng.standard_normal((n_slots, 8)).astype(np.float32)
    pool_of = rng.integers(0, n_slots, (n_slots, kpool)).astype(np.int64)
    pool_gen = rng.integers(0, 4, n_slots).astype(np.int64)
    key_gen = rng.integers(0, 4, n_slots).astype(np.int64)
    return key, gate, pooled, pool_of, pool_gen, key_gen


def test_rows_differ_reads_each_row_through_the_slot_map() -> None:
    """`rows_differ`: `pools_differ` of entries given by rows. Rows 10, 11, 12, 13,
    20, 21 are slots 1, 2, 3, 4, 5, 6 (slot_of int32, 6 + 1 slots handed out); slot 5
    holds the pooling of slots 1, 2 (generation 3, keys at 1), slot 6 a zeroed row.
    Entry (10, 11 -> 20) holds its pooling: False for the numba twin, though row 20's
    pooled values are zeroed behind it (judged by the generations), True for the
    numpy twin, which pools every entry (`test_pools_differ_judges_a_kept_pooling_by_
    its_generations`); (12, 13 -> 21) differs: True. Each twin answers as its own
    `pools_differ` does for the same entries as slots. A row past the 30 rows, a
    negative one, a row whose slot is past those handed out: None, in a member or the
    rep row alike."""
    rng = np.random.default_rng(3)
    n_slots, n_embd = 8, 4
    key = rng.uniform(-1, 1, (n_slots, n_embd)).astype(np.float32)
    gate = rng.integers(-2, 3, (n_slots, n_embd)).astype(np.int8)
    pooled = np.zeros((n_slots, n_embd), np.float32)
    pool_of, pool_gen = np.zeros((n_slots, 2), np.int64), np.zeros(n_slots, np.int64)
    key_gen = np.ones(n_slots, np.int64)
    pool_of[5], pool_gen[5] = (1, 2), 3
    slot_of = np.zeros(30, np.int32)
    slot_of[[10, 11, 12, 13, 20, 21]] = 1, 2, 3, 4, 5, 6
    slot_of[25] = 7  # past the 7 slots handed out
    members = np.array([[10, 11], [12, 13]], np.int64)
    reps = np.array([20, 21], np.int64)
    for k in (kernels, reference):
        def differ(m=members, r=reps, k=k):
            got = k.rows_differ(slot_of, 7, key, gate, pooled, pool_of, pool_gen, key_gen,
                                m, r)
            return None if got is None else got.tolist()

        by_slots = k.pools_differ(key, gate, pooled, pool_of, pool_gen, key_gen,
                                  np.array([[1, 2], [3, 4]], np.int64),
                                  np.array([5, 6], np.int64)).tolist()
        assert differ() == by_slots == ([False, True] if k is kernels else [True, True]), k
        assert differ(m=members[:0], r=reps[:0]) == [], k
        for m, r in ((np.array([[10, 30], [12, 13]]), reps), (members, np.array([20, -1])),
                     (np.array([[10, 11], [25, 13]]), reps), (members, np.array([25, 21]))):
            assert differ(m=m.astype(np.int64), r=r.astype(np.int64)) is None, (k, m, r)


def test_rows_differ_agrees() -> None:
    """On random tables (a third of the entries told by their generations that they
    hold their pooling, some rows outside the map or on slots past those handed out),
    each twin's verdicts are its own `pools_differ`'s on the rows' slots, and both
    twins answer None alike."""
    rng = np.random.default_rng(5)
    seen = {"none": 0, "differ": 0, "same": 0}
    for kpool in (1, 2, 4):
        for n in (0, 1, 9, 80):
            for _ in range(15):
                n_rows, n_slots = 300, 200
                slot_of = rng.integers(0, n_slots, n_rows).astype(np.int32)
                n_handed = n_slots - int(rng.random() < 0.2) * 20  # some slots past it
                key, gate, pooled, pool_of, pool_gen, key_gen = _random_slot_values(
                    rng, n_slots, kpool)
                members = rng.integers(0, n_rows, (n, kpool)).astype(np.int64)
                reps = rng.integers(0, n_rows, n).astype(np.int64)
                if n and rng.random() < 0.1:
                    reps[rng.integers(n)] = n_rows  # past the rows
                for e in range(n):
                    if rng.random() < 0.3:
                        r, m = slot_of[reps[e]] if reps[e] < n_rows else 0, slot_of[members[e]]
                        pool_of[r], pool_gen[r], key_gen[m] = m, 5, 4
                args = (slot_of, n_handed, key, gate, pooled, pool_of, pool_gen, key_gen,
                        members, reps)
                got = [k.rows_differ(*args) for k in (kernels, reference)]
                if got[1] is None:
                    assert got[0] is None
                    seen["none"] += 1
                    continue
                for k, verdicts in zip((kernels, reference), got, strict=True):
                    by_slots = k.pools_differ(
                        key, gate, pooled, pool_of, pool_gen, key_gen,
                        slot_of[members].astype(np.int64), slot_of[reps].astype(np.int64))
                    assert verdicts is not None and np.array_equal(verdicts, by_slots), k
                seen["differ"] += int(got[0].sum())
                seen["same"] += int((~got[0]).sum())
    assert min(seen.values()) > 0, seen


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernels_are_timed_when_asked(backend: str) -> None:
    """A backend's kernels run unclocked until `time_kernels`; from then on each
    kernel's door adds the seconds inside it (the benchmark's breakdown)."""
    be = written(backend)
    assert be.kernel_time == {}
    be.time_kernels()
    be.write_rows(np.array([9, 10]), np.array([3, 4]))
    assert list(be.kernel_time) == ["write_keys"] and be.kernel_time["write_keys"] > 0


def test_scatter_fresh_by_hand() -> None:
    """`scatter_fresh`, kpool 2, n_embd 4: entry 0 pools slots 1, 2 (not kept), entry
    1 is kept (its rep slot 3's value), entry 2 pools 2, 1; groups write slot 3 with
    entry 0 and slot 4 with entry 2 (src 0, 2). Every value is read before the first
    write: entry 1 takes slot 3's old value though slot 3 is written. Slot 3's bits
    change; slot 4 held entry 2's pooling already: written, not changed. Each written
    slot records its source's members and generation 7; slots 0..2 keep theirs."""
    st = keys.seed_state(2)
    for k in (kernels, reference):
        key = np.zeros((5, 4), np.float32)
        gate = np.zeros((5, 4), np.int8)
        reference.write_keys(st, np.arange(1, 5), np.array([11, 12, 13, 14]), key, gate)
        members = np.array([[1, 2], [3, 4], [2, 1]], np.int64)
        pools = reference.pool(key, gate, members)
        pooled = np.full((5, 4), 0.5, np.float32)
        pooled[4] = pools[2]
        old3 = pooled[3].copy()
        pool_of = np.full((5, 2), 9, np.int64)
        pool_gen = np.full(5, 9, np.int64)
        vals = np.empty((3, 4), np.float32)
        changed = k.scatter_fresh(key, gate, pooled, pool_of, pool_gen, 7, members,
                                  np.array([0, 3, 0], np.int64), np.array([False, True, False]),
                                  np.array([3, 4], np.int64), np.array([0, 2], np.int64), vals)
        assert same(vals, np.stack([pools[0], old3, pools[2]])), k
        assert same(pooled[3], pools[0]) and same(pooled[4], pools[2]), k
        assert (pooled[:3] == 0.5).all(), k
        assert changed.tolist() == [True, False], k
        assert pool_of.tolist() == [[9, 9]] * 3 + [[1, 2], [2, 1]], k
        assert pool_gen.tolist() == [9, 9, 9, 7, 7], k


def test_kept_is_the_pooling_of_the_same_unwritten_members() -> None:
    """slots.py's invariants by slots (the rule numpy's `fresh_groups` is built on; the
    numba kernel's is held to it below), by hand: rep slot 5 pooled slots 1, 2 at generation 3.
    Entry 0 asks for those members: kept. Entry 1 names members 2, 1 (another pooling):
    not kept. Entry 2: slot 2's key was rewritten at generation 3, not before it: not
    kept. Entry 3: rep slot 6 was never pooled (pool_gen 0): not kept. Entry 4: rep
    slot 7 pooled 3, 4 at generation 2, their keys at 1 and 0: kept."""
    pool_of = np.zeros((8, 2), np.int64)
    pool_gen = np.zeros(8, np.int64)
    key_gen = np.zeros(8, np.int64)
    pool_of[5], pool_gen[5] = (1, 2), 3
    pool_of[7], pool_gen[7] = (3, 4), 2
    key_gen[[1, 2, 3]] = 2, 2, 1
    key_gen2 = key_gen.copy()
    key_gen2[2] = 3
    members = np.array([[1, 2], [2, 1], [1, 2], [1, 2], [3, 4]], np.int64)
    reps = np.array([5, 5, 5, 6, 7], np.int64)
    got = reference.kept(pool_of, pool_gen, key_gen, members, reps)
    assert got.tolist() == [True, False, True, False, True]
    got2 = reference.kept(pool_of, pool_gen, key_gen2, members, reps)
    assert got2.tolist() == [False, False, False, False, True]


def test_fresh_groups_are_the_race_groups_with_an_entry_not_kept() -> None:
    """`kept` by rows, per race group, by hand (kpool 2). Rows 10, 11 are slots 1, 2;
    row 15 is slot 5, which pooled slots 1, 2 at generation 3 (their keys at 2); row
    16 is slot 6, never pooled; row 17 is slot 7, which pooled slots 2, 1 at
    generation 3; row 0 has no slot (a zero row). Entries (member rows -> rep row):
    0 and 2 pool 10, 11 -> 15 (kept, each); 1 pools 10, 11 -> 16 (never pooled: not
    kept); 4 pools 0, 10 -> 16 (not kept); 3 pools 11, 10 -> 17 (kept); 5 pools
    10, 11 -> 17 (another pooling: not kept). The race groups, by rep row: 15 (entries
    0 2), 16 (1 4), 17 (3 5): the first holds kept entries alone, the second none, the
    third one; entries 0, 2 and 3 kept."""
    slot_of = np.zeros(20, np.int32)
    slot_of[[10, 11, 15, 16, 17]] = 1, 2, 5, 6, 7
    pool_of = np.zeros((8, 2), np.int64)
    pool_gen = np.zeros(8, np.int64)
    key_gen = np.zeros(8, np.int64)
    pool_of[5], pool_gen[5] = (1, 2), 3
    pool_of[7], pool_gen[7] = (2, 1), 3
    key_gen[[1, 2]] = 2
    entry_rows = np.array([[10, 11], [10, 11], [10, 11], [11, 10], [0, 10], [10, 11]],
                          np.int64)
    rep = np.array([15, 16, 15, 17, 16, 17], np.int64)
    order = np.array([0, 2, 1, 4, 3, 5], np.int64)
    starts = np.array([0, 2, 4, 6], np.int64)
    rows = np.array([15, 16, 17], np.int64)
    for k in (kernels, reference):
        fresh, keep, n_kept, in_fresh = k.fresh_groups(slot_of, pool_of, pool_gen, key_gen,
                                                       entry_rows, rep, order, starts, rows)
        assert fresh.tolist() == [False, True, True] and n_kept == 3
        assert keep.tolist() == [True, False, True, True, False, False]
        # the fresh groups' entries: 1, 4 (row 16) and 3, 5 (row 17), not 0, 2 (row 15)
        assert in_fresh.tolist() == [False, True, False, True, True, True]
        fresh, keep, n_kept, in_fresh = k.fresh_groups(
            slot_of.astype(np.int64), pool_of, pool_gen, key_gen, entry_rows[:0], rep[:0],
            order[:0], starts[:1], rows[:0])
        assert fresh.tolist() == [] and n_kept == 0 and keep.size == 0 == in_fresh.size
    # an entry, a row, a slot, a group end outside its array: IndexError, naming the
    # first group that holds one
    far_slot = slot_of.copy()
    far_slot[17] = 8  # entries 3 and 5's rep row: a slot past the 8-slot arrays
    far_member = entry_rows.copy()
    far_member[3, 1] = 20  # a member row past the 20 rows
    far_member_slot = slot_of.copy()
    far_member_slot[0] = 8  # entry 4's member row 0 (a member alone): a slot past them
    outside = [(slot_of, entry_rows, [0, 2, 1, 9, 3, 5], starts, rows, 1),
               (slot_of, entry_rows, [0, 2, -1, 4, 3, 5], starts, rows, 1),
               (slot_of, far_member, order, starts, rows, 2),
               (far_slot, entry_rows, order, starts, rows, 2),
               (far_member_slot, entry_rows, order, starts, rows, 1),
               (slot_of, entry_rows, order, [0, 2, 4, 7], rows, 2)]
    # groups that are not the race groups of the rep rows: ValueError, naming the first
    not_groups = [(slot_of, entry_rows, order, starts, [15, 16, 18], 2),  # 17 != 18
                  (slot_of, entry_rows, order, starts, [15, 15, 17], 1),  # not ascending
                  (slot_of, entry_rows, order, [0, 2, 2, 6], rows, 1),  # an empty group
                  (slot_of, entry_rows, order, [0, 2, 4, 5], rows, 2),  # entry 5 in none
                  (slot_of, entry_rows, order, [1, 2, 4, 6], rows, 0),  # entry 0 in none
                  (slot_of, entry_rows, [0, 1, 2, 4, 3, 5], starts, rows, 0),  # 15 != 16
                  (slot_of, entry_rows, order, starts, [15, 16], 0)]  # a row short
    for k in (kernels, reference):
        for cases, error in ((outside, IndexError), (not_groups, ValueError)):
            for sl, er, o, st, rw, g in cases:
                with pytest.raises(error, match=f"^race group {g}: "):
                    k.fresh_groups(sl, pool_of, pool_gen, key_gen, er, rep,
                                   np.array(o, np.int64), np.array(st, np.int64),
                                   np.array(rw, np.int64))


@pytest.mark.parametrize("kpool", [1, 2, 4])
def test_fresh_groups_agrees(kpool: int) -> None:
    """On random scatters (some groups kept whole, some with an entry that is not, a
    few with an index outside its array or groups that are not race groups), the
    kernel and its twin give the same groups, the same count, or refuse at the same
    group for the same reason."""
    rng = np.random.default_rng(kpool)
    n_rows, n_slots, n = 512, 64, 3000
    slot_of = rng.integers(0, n_slots, n_rows).astype(np.int32)
    pool_of = rng.integers(0, n_slots, (n_slots, kpool)).astype(np.int64)
    pool_gen = rng.integers(0, 4, n_slots).astype(np.int64)
    key_gen = rng.integers(0, 3, n_slots).astype(np.int64)
    rep = rng.integers(0, n_rows, n).astype(np.int64)
    # half the entries name rows whose slots are their rep's pooling: the gens decide
    by_slot = {int(sl): np.flatnonzero(slot_of == sl) for sl in range(n_slots)}
    entry_rows = rng.integers(0, n_rows, (n, kpool)).astype(np.int64)
    for e in range(0, n, 2):
        for q, sl in enumerate(pool_of[slot_of[rep[e]]].tolist()):
            if by_slot[sl].size:
                entry_rows[e, q] = by_slot[sl][0]
    order = np.argsort(rep, kind="stable").astype(np.int64)
    srep = rep[order]
    head = np.flatnonzero(np.concatenate(([True], srep[1:] != srep[:-1])))
    starts = np.concatenate((head, [n])).astype(np.int64)
    rows = srep[head]
    cases = [(slot_of, entry_rows, order, starts, rows)]
    for trial in range(40):
        sl, er, o = slot_of.copy(), entry_rows.copy(), order.copy()
        st, rw = starts.copy(), rows.copy()
        at = int(rng.integers(0, n))
        low = trial % 10 < 5  # below or past the array
        if trial % 5 == 0:
            sl[rng.integers(0, n_rows)] = -1 if low else n_slots + 5
        elif trial % 5 == 1:
            er[at, rng.integers(0, kpool)] = -1 if low else n_rows
        elif trial % 5 == 2:
            o[at] = -1 if low else n
        elif trial % 5 == 3:
            st[int(rng.integers(1, st.size))] = n + 1
        else:  # a group's row moved: not that group's rep row, or out of order
            rw[int(rng.integers(0, rw.size))] += 1 if low else -1
        cases.append((sl, er, o, st, rw))
    n_refused = set()
    for sl, er, o, st, rw in cases:
        got = want = None
        try:
            got = kernels.fresh_groups(sl, pool_of, pool_gen, key_gen, er, rep, o, st, rw)
        except (IndexError, ValueError) as e:
            got = repr(e)
        try:
            want = reference.fresh_groups(sl, pool_of, pool_gen, key_gen, er, rep, o, st, rw)
        except (IndexError, ValueError) as e:
            want = repr(e)
        if isinstance(got, str):
            n_refused.add(got.split("(")[0])
            assert got == want
        else:
            assert isinstance(want, tuple)
            assert np.array_equal(got[0], want[0]) and got[2] == want[2]
            assert np.array_equal(got[1], want[1]) and got[2] == np.count_nonzero(got[1])
            assert np.array_equal(got[3], want[3])
            assert 0 < got[2] < n and 0 < np.count_nonzero(got[0]) < starts.size - 1
    assert n_refused == {"IndexError", "ValueError"}  # both refusals are exercised


def test_dirty_pools_are_those_with_a_dirty_member() -> None:
    """By hand, kpool 2: pairs at cells 7, 3, 5, 1, 4 (pos 10..14); pools start at
    pairs 0 and 2 (cells 7, 3 and 5, 1); pair 4 (cell 4) is in no pool. Dirty cells 3
    and 4: pool 0 only (cell 4 is past the last pool). Dirty cell 1 too: pools 0, 1."""
    cells = np.array([7, 3, 5, 1, 4], np.int64)
    keys = (np.arange(10, 15, dtype=np.int64) << 32) | cells
    starts = np.array([0, 2], np.int64)
    dirty = np.zeros(8, bool)
    dirty[[3, 4]] = True
    for k in (kernels, reference):
        assert k.dirty_pools(keys, starts, 2, dirty).tolist() == [0]
        dirty[1] = True
        assert k.dirty_pools(keys, starts, 2, dirty).tolist() == [0, 1]
        dirty[1] = False
        assert k.dirty_pools(keys, starts, 2, np.zeros(8, bool)).tolist() == []
        assert k.dirty_pools(keys, starts[:0], 2, dirty).tolist() == []


@pytest.mark.parametrize("kpool", [1, 3, 4])
def test_dirty_pools_agrees(kpool: int) -> None:
    rng = np.random.default_rng(kpool)
    kv = 4096
    cells = rng.permutation(kv)[:3000].astype(np.int64)
    keys = (np.arange(cells.size, dtype=np.int64) << 32) | cells
    # pools at random non-overlapping starts, some pairs left between them
    starts = np.flatnonzero(rng.random(cells.size // kpool) < 0.7).astype(np.int64) * kpool
    for p_dirty in (0.001, 0.05):
        dirty = rng.random(kv) < p_dirty
        got = kernels.dirty_pools(keys, starts, kpool, dirty)
        want = reference.dirty_pools(keys, starts, kpool, dirty)
        assert np.array_equal(got, want)
        assert 0 < got.size < starts.size


def test_pools_of_pairs_finds_members_and_reps_by_their_pairs() -> None:
    """By hand, kpool 2, the pairs of the test above (cells 7, 3, 5, 1, 4 at pos
    10..14; pools at pairs 0 and 2). As members: (11, 3) is pool 0's second, (12, 5)
    pool 1's first, (14, 4) in no pool: pools 0, 1. As reps: (11, 3) is pool 0's rep,
    (12, 5) is no pool's rep: pool 0. A pair not among them, (11, 5): None."""
    cells = np.array([7, 3, 5, 1, 4], np.int64)
    keys = (np.arange(10, 15, dtype=np.int64) << 32) | cells
    starts = np.array([0, 2], np.int64)

    def pair(pos: int, cell: int) -> int:
        return (pos << 32) | cell

    members = np.array([pair(12, 5), pair(11, 3), pair(14, 4)], np.int64)
    reps = np.array([pair(11, 3), pair(12, 5)], np.int64)
    none = np.empty(0, np.int64)
    for k in (kernels, reference):
        assert k.pools_of_pairs(keys, starts, 2, members, none).tolist() == [0, 1]
        assert k.pools_of_pairs(keys, starts, 2, none, reps).tolist() == [0]
        assert k.pools_of_pairs(keys, starts, 2, members, reps).tolist() == [0, 1]
        assert k.pools_of_pairs(keys, starts[:0], 2, members, reps).tolist() == []
        assert k.pools_of_pairs(keys, starts, 2, np.array([pair(11, 5)]), none) is None
        assert k.pools_of_pairs(keys[:0], starts[:0], 2, none, np.array([pair(1, 1)])) is None


@pytest.mark.parametrize("kpool", [1, 3, 4])
def test_pools_of_pairs_agrees_with_the_scan(kpool: int) -> None:
    """The look-up finds what `dirty_pools` finds by a pass over every pooled pair (and,
    for reps, what a pass over every pool's rep finds)."""
    rng = np.random.default_rng(kpool)
    kv = 4096
    cells = rng.permutation(kv)[:3000].astype(np.int64)
    keys = (np.arange(cells.size, dtype=np.int64) * 3 << 32) | cells
    starts = np.flatnonzero(rng.random(cells.size // kpool) < 0.7).astype(np.int64) * kpool
    for n in (1, 40, 600):
        j = np.sort(rng.choice(cells.size, n, replace=False))
        dirty = np.zeros(kv, bool)
        dirty[cells[j]] = True
        none = np.empty(0, np.int64)
        want = reference.dirty_pools(keys, starts, kpool, dirty)
        want_rep = np.flatnonzero(dirty[cells[starts + kpool - 1]])
        for k in (kernels, reference):
            assert np.array_equal(k.pools_of_pairs(keys, starts, kpool, keys[j], none), want)
            assert np.array_equal(k.pools_of_pairs(keys, starts, kpool, none, keys[j]),
                                  want_rep)
        assert want.size or n == 1  # one pair may fall outside every pool


def test_held_pairs_are_each_columns_cells_with_their_pos() -> None:
    """By hand: a stream of 6 cells; column 0 holds cells 1, 4, column 1 cells 4, 5,
    column 2 none; positions 10..15. Cells asked: 4, 1, 5, 3: column 0 gets (14, 4),
    (11, 1) in that order, column 1 (14, 4), (15, 5), column 2 nothing."""
    has = np.zeros((3, 6), bool)
    has[0, [1, 4]] = True
    has[1, [4, 5]] = True
    pos = np.arange(10, 16, dtype=np.int64)
    cells = np.array([4, 1, 5, 3], np.int64)
    for k in (kernels, reference):
        off, pairs = k.held_pairs(cells, has, pos)
        assert off.tolist() == [0, 2, 4, 4]
        assert pairs.tolist() == [(14 << 32) | 4, (11 << 32) | 1, (14 << 32) | 4,
                                  (15 << 32) | 5]


def test_held_pairs_agrees() -> None:
    rng = np.random.default_rng(7)
    has = rng.random((64, 2048)) < 0.3
    pos = rng.integers(0, 1 << 30, 2048).astype(np.int64)
    cells = rng.integers(0, 2048, 300).astype(np.int64)
    got, want = kernels.held_pairs(cells, has, pos), reference.held_pairs(cells, has, pos)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert got[1].size > 1000


def test_recheck_ways_by_hand() -> None:
    """recheck.py's rule by hand, kv_size 100, five sequences with 3, 2, 0, 2 and 2
    pools (start 0, 3, 5, 5, 7, 9); every pool's rep at pos 10 * (its index + 1), rep
    row 100 + its index (cell = row % 100: the index).
    - s0: kept 3 of 3, 3 verdicts, known: nothing new; its tail is pool 2's rep pair
      (30, cell 2);
    - s1: kept 1 of 2 (a pool added), 1 verdict, not known: NEW, and SCAN once a row
      changed;
    - s2: no pool, none kept, 1 verdict (its pool was cut): NEW; not known but poolless,
      so no scan;
    - s3: kept 2, 3 verdicts (a pool cut), known: NEW; tail pool 6 (70, cell 6);
    - s4: kept none of its 2 pools, no verdict, known: NEW (2 pools past its verdicts),
      and no tail (it kept no pool), so no look-up and no scan, even with too many.
    With no row changed there is no tail and no scan; with too many, s0 and s3 (known,
    kept pools) scan.

    `before`, whether the least changed pair lies at or before a tail (the tails
    (30, 2) and (70, 6)): cell 5 of a stream whose cell 5 is at pos 40 makes the pair
    (40, 5), past s0's tail but before s3's: True; at pos 80, past both: False; no
    changed cell: False; another stream's least pair (30, 2), s0's tail itself: True
    ("at or before"); with no tail (no row changed, or too many) nothing is before
    one, whatever the pairs."""
    start = np.array([0, 3, 5, 5, 7, 9], np.int64)
    n_bad = np.array([3, 1, 1, 3, 0], np.int64)
    kept = np.array([3, 1, 0, 2, 0], np.int64)
    known = np.array([True, False, False, True, True])
    rep_pos = 10 * np.arange(1, 10, dtype=np.int64)
    rep_rows = 100 + np.arange(9, dtype=np.int64)
    NONE, NEW, SCAN = recheck.NONE, recheck.NEW, recheck.SCAN
    no, none = recheck.NO_TAIL, recheck.NO_PAIR
    cell5 = np.array([5], np.int64)
    at40, at80 = (np.array([0, 0, 0, 0, 0, p], np.int64) for p in (40, 80))
    empty = np.empty(0, np.int64)
    for k in (kernels, reference):
        how, tail, before = k.recheck_ways(start, n_bad, kept, known, rep_pos, rep_rows, 100,
                                           True, False, cell5, at40, none)
        assert how.tolist() == [NONE, SCAN, NEW, NEW, NEW]
        assert tail.tolist() == [(30 << 32) | 2, no, no, (70 << 32) | 6, no]
        assert before is True
        assert k.recheck_ways(start, n_bad, kept, known, rep_pos, rep_rows, 100, True,
                              False, cell5, at80, none)[2] is False
        assert k.recheck_ways(start, n_bad, kept, known, rep_pos, rep_rows, 100, True,
                              False, empty, at80, none)[2] is False
        assert k.recheck_ways(start, n_bad, kept, known, rep_pos, rep_rows, 100, True,
                              False, cell5, at80, (30 << 32) | 2)[2] is True
        how, tail, before = k.recheck_ways(start, n_bad, kept, known, rep_pos, rep_rows, 100,
                                           False, False, cell5, at40, none)
        assert how.tolist() == [NONE, NEW, NEW, NEW, NEW] and tail.tolist() == [no] * 5
        assert before is False
        how, tail, before = k.recheck_ways(start, n_bad, kept, known, rep_pos, rep_rows, 100,
                                           True, True, cell5, at40, none)
        assert how.tolist() == [SCAN, SCAN, NEW, SCAN, NEW] and tail.tolist() == [no] * 5
        assert before is False
        with pytest.raises(IndexError, match="sequence 3"):  # pool 6 past the columns
            k.recheck_ways(start, n_bad, kept, known, rep_pos[:6], rep_rows, 100, True,
                           False, cell5, at40, none)
        with pytest.raises(IndexError, match=r"cells\[1\] is cell 6, outside the stream"):
            k.recheck_ways(start, n_bad, kept, known, rep_pos, rep_rows, 100, True,
                           False, np.array([5, 6], np.int64), at40, none)


def test_recheck_ways_agrees() -> None:
    rng = np.random.default_rng(11)
    for n in (0, 1, 2, 64):
        for _ in range(50):
            n_pools = rng.integers(0, 6, n)
            start = np.concatenate(([0], np.cumsum(n_pools))).astype(np.int64)
            kept = rng.integers(0, n_pools + 1).astype(np.int64)  # none to every pool
            n_bad = rng.integers(0, 7, n).astype(np.int64)
            known = rng.random(n) < 0.5
            rep_pos = rng.integers(0, 1 << 20, int(start[-1])).astype(np.int64)
            rep_rows = rng.integers(0, 3 * 512, int(start[-1])).astype(np.int64)
            # a stream's changed cells (some freed: pos -1) and another stream's least
            pos = rng.integers(-1, 1 << 20, 512).astype(np.int64)
            cells = rng.choice(512, int(rng.integers(0, 5)), replace=False).astype(np.int64)
            least = int(rng.choice([recheck.NO_PAIR, int(rng.integers(0, 1 << 52))]))
            for dirty, too_many in ((True, False), (True, True), (False, False)):
                args = (start, n_bad, kept, known, rep_pos, rep_rows, 512, dirty, too_many,
                        cells, pos, least)
                got, want = kernels.recheck_ways(*args), reference.recheck_ways(*args)
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
                assert got[2] is want[2]


def _one_sequence(rng: np.random.Generator, n_rows: int, kpool: int, n_pools: int
                  ) -> tuple[np.ndarray, ...]:
    """A sequence of n_pools pools of kpool pairs each on distinct random rows of one
    stream of n_rows cells (row0 0), its pair j at pos j: (its pairs, its pools' first
    pairs, their rep rows and rep positions, the stream's cell positions)."""
    cells = rng.choice(n_rows, n_pools * kpool, replace=False).astype(np.int64)
    pos = np.full(n_rows, -1, np.int64)
    pos[cells] = np.arange(cells.size)
    pairs = (np.arange(cells.size, dtype=np.int64) << 32) | cells
    pools = np.arange(0, cells.size, kpool, dtype=np.int64)
    return pairs, pools, cells[pools + kpool - 1], pools + kpool - 1, pos


def test_recheck_one_is_the_way_then_the_new_pools_rows_differ() -> None:
    """`recheck_one` of one sequence: three pools of kpool 2 on rows 10..15 (pairs at
    pos 0..5; pool k on rows 10 + 2k, 11 + 2k, its rep row 11 + 2k at pos 1 + 2k),
    rows 10..15 on slots 1..6. Slot 4 (row 13) holds the pooling of slots 3, 4
    (generation 3, keys at 1); slot 6 (row 15) a zeroed row never pooled.
    - one pool kept of three, one verdict, known, row 14 changed (pair (4, 14), past
      the kept tail (1, 11)): NEW, and pools 1 and 2 judged as each twin's
      `rows_differ` judges rows (12, 13 -> 13) and (14, 15 -> 15): the numba twin
      False, True (slot 4 holds its pooling by the generations), the numpy twin
      pools both;
    - every pool kept and judged, nothing changed: NONE, no verdict;
    - row 10 changed (pair (0, 10), at or before the tail): None (a look-up);
      not known: None (a scan); too many changed rows: None;
    - a pool's first pair past the pairs, a pool with no first pair, a member's slot
      past those handed out, a changed cell outside the stream: None."""
    rng = np.random.default_rng(4)
    n_slots, n_embd, kpool = 8, 4, 2
    key = rng.uniform(-1, 1, (n_slots, n_embd)).astype(np.float32)
    gate = rng.integers(-2, 3, (n_slots, n_embd)).astype(np.int8)
    pooled = np.zeros((n_slots, n_embd), np.float32)
    pool_of, pool_gen = np.zeros((n_slots, kpool), np.int64), np.zeros(n_slots, np.int64)
    key_gen = np.ones(n_slots, np.int64)
    pool_of[4], pool_gen[4] = (3, 4), 3
    slot_of = np.zeros(20, np.int32)
    slot_of[10:16] = np.arange(1, 7)
    pairs = (np.arange(6, dtype=np.int64) << 32) | np.arange(10, 16)
    pools = np.array([0, 2, 4], np.int64)
    rep_rows, rep_pos = np.array([11, 13, 15], np.int64), np.array([1, 3, 5], np.int64)
    pos = np.full(20, -1, np.int64)
    pos[10:16] = np.arange(6)
    NONE, NEW = recheck.NONE, recheck.NEW
    for k in (kernels, reference):
        def one(n_bad=1, kept=1, known=True, dirty=True, too_many=False, cells=(14,),
                pools=pools, n_handed=7, k=k):
            return k.recheck_one(np.array([0, 3], np.int64), np.array([n_bad], np.int64),
                                 np.array([kept], np.int64), np.array([known]), rep_pos,
                                 rep_rows, 20, dirty, too_many, np.array(cells, np.int64),
                                 pos, pairs, pools, 0, slot_of, n_handed, key, gate, pooled,
                                 pool_of, pool_gen, key_gen)

        way, verdicts = one()
        want = k.rows_differ(slot_of, 7, key, gate, pooled, pool_of, pool_gen, key_gen,
                             np.array([[12, 13], [14, 15]], np.int64),
                             np.array([13, 15], np.int64))
        assert way == NEW and verdicts.tolist() == want.tolist(), k
        assert verdicts.tolist() == ([False, True] if k is kernels else [True, True])
        way, verdicts = one(n_bad=3, kept=3, dirty=False, cells=())
        assert way == NONE and verdicts.size == 0
        assert one(cells=(10,)) is None and one(known=False) is None
        assert one(too_many=True) is None
        assert one(pools=np.array([0, 2, 5], np.int64)) is None
        assert one(pools=np.array([0, 2], np.int64)) is None  # pool 2 has no first pair
        assert one(n_handed=5) is None
        assert one(cells=(20,)) is None


def test_recheck_one_agrees() -> None:
    """On random sequences and tables, each twin's `recheck_one` is its own
    `recheck_ways` of the sequence, then for NEW its own `rows_differ` of the pools
    past the kept ones (None where that way looks up or scans, or a pair is before the
    tail), and the twins answer None alike."""
    rng = np.random.default_rng(9)
    seen = {"none": 0, "new": 0, "never": 0}
    for kpool in (1, 2, 4):
        for _ in range(60):
            n_rows, n_slots = 64, 80
            n_pools = int(rng.integers(0, 6))
            pairs, pools, rep_rows, rep_pos, pos = _one_sequence(rng, n_rows, kpool, n_pools)
            slot_of = rng.integers(0, n_slots, n_rows).astype(np.int64)
            n_handed = n_slots - int(rng.random() < 0.2) * 10
            key, gate, pooled, pool_of, pool_gen, key_gen = _random_slot_values(
                rng, n_slots, kpool)
            kept = int(rng.integers(0, n_pools + 1))
            n_bad = int(rng.integers(0, n_pools + 1))
            known = bool(rng.random() < 0.8)
            cells = rng.choice(n_rows, int(rng.integers(0, 3)), replace=False).astype(np.int64)
            dirty = bool(cells.size) or bool(rng.random() < 0.3)
            args = (np.array([0, n_pools], np.int64), np.array([n_bad], np.int64),
                    np.array([kept], np.int64), np.array([known]), rep_pos, rep_rows, n_rows,
                    dirty, False, cells, pos, pairs, pools, 0, slot_of, n_handed, key, gate,
                    pooled, pool_of, pool_gen, key_gen)
            got = [k.recheck_one(*args) for k in (kernels, reference)]
            if got[1] is None:
                assert got[0] is None
                seen["none"] += 1
                continue
            for k, (way, verdicts) in zip((kernels, reference), got, strict=True):
                how, _tail, before = k.recheck_ways(*args[:11], recheck.NO_PAIR)
                assert not before and way == how[0], k
                if way == recheck.NONE:
                    assert verdicts.size == 0
                    seen["never"] += 1
                    continue
                ks = np.arange(kept, n_pools)
                members = pairs[pools[ks][:, None] + np.arange(kpool)] & CELL_MASK
                want = k.rows_differ(slot_of, n_handed, key, gate, pooled, pool_of,
                                     pool_gen, key_gen, members, rep_rows[ks])
                assert want is not None and np.array_equal(verdicts, want), k
                seen["new"] += 1
    assert min(seen.values()) > 0, seen


def _many(n_keys: list[int], n_pools: list[int], kpool: int, cap: int = 0
          ) -> tuple[np.ndarray, ...]:
    """Sequences on one stream, s holding n_keys[s] pairs at pos 0.. on its own cells
    (s's cells after the sequences before it's, in order) and n_pools[s] pools of
    kpool pairs from its first: (start, every pool's rep pos and rep row in layout
    order, the stream's positions, its holders, the flat columns keys, n_keys,
    pools, rep rows and streams, `cap` columns wide at least)."""
    n = len(n_keys)
    cap = max(cap, *n_keys, 1)
    keys = np.zeros((n, cap), np.int64)
    pools, reps = np.zeros((n, cap), np.int64), np.zeros((n, cap), np.int64)
    n_cells = sum(n_keys) + 4  # and four cells no sequence holds
    pos = np.full(n_cells, -1, np.int64)
    has = np.zeros((n, n_cells), bool)
    rep_pos, rep_rows = [], []
    c0 = 0
    for s, (m, p) in enumerate(zip(n_keys, n_pools, strict=True)):
        cells = np.arange(c0, c0 + m, dtype=np.int64)
        pos[cells] = np.arange(m)
        has[s, cells] = True
        keys[s, :m] = (np.arange(m, dtype=np.int64) << 32) | cells
        pools[s, :p] = np.arange(0, p * kpool, kpool)
        reps[s, :p] = cells[pools[s, :p] + kpool - 1]
        rep_pos += (pools[s, :p] + kpool - 1).tolist()
        rep_rows += reps[s, :p].tolist()
        c0 += m
    start = np.concatenate(([0], np.cumsum(n_pools))).astype(np.int64)
    return (start, np.array(rep_pos, np.int64), np.array(rep_rows, np.int64), pos, has,
            keys, np.array(n_keys, np.int64), pools, reps, np.zeros(n, np.int64))


def test_recheck_many_is_the_ways_then_the_new_pools_rows_differ() -> None:
    """`recheck_many` by hand, kpool 2, one stream of 12 cells: seq 0 at pos 0..3 on
    cells 0..3 (pools (0, 1 -> 1) and (2, 3 -> 3)), seq 1 at pos 0..3 on cells 4..7
    (pools (4, 5 -> 5) and (6, 7 -> 7)), seq 2 none; rows are cells (stream 0). Rows
    0..7 are slots 1..8. Slot 4 (row 3) holds the pooling of slots 3, 4 (rows 2, 3),
    bit for bit, at generation 3, every key written at generation 1. Seq 0 kept 1
    pool and 1 verdict (NEW: pool 1 is new), seq 1 kept both and both verdicts (NONE),
    seq 2 nothing (NONE); all known equal. Cell 3 changed: its pair (3, cell 3) is past
    seq 0's tail (1, cell 1) but before seq 1's (3, cell 7), so the lowest pair each
    sequence holds is asked: seq 1 holds none of it, so no look-up, and pool 1 of seq
    0 is judged: it holds its pooling, False for both twins (the numpy twin pools it
    again and finds the same bits). Then slot 3's key is written again after that
    pooling (generation 4): both twins pool it again and find it differs: True.
    None, where the general way answers: cell 6 changed (seq 1 holds (2, cell 6), at
    or before its tail: a look-up); seq 1 not known (a scan); too many changed rows
    (seqs 0 and 1 scan); seq 0 said to keep 3 of its 2 pools; seq 0's pool 1 past its
    live pairs; a rep row's slot past those handed out; a holder column naming
    sequence 3; a changed cell outside the stream."""
    rng = np.random.default_rng(5)
    kpool, n_slots = 2, 9
    start, rep_pos, rep_rows, pos, has, keys_, n_keys, pools, reps, strm = _many(
        [4, 4, 0], [2, 2, 0], kpool)
    key = rng.uniform(-1, 1, (n_slots, 8)).astype(np.float32)
    gate = rng.integers(-2, 3, (n_slots, 8)).astype(np.int8)
    pool_of, pool_gen = np.zeros((n_slots, kpool), np.int64), np.zeros(n_slots, np.int64)
    key_gen = np.ones(n_slots, np.int64)
    pooled = np.zeros((n_slots, 8), np.float32)
    pool_of[4], pool_gen[4] = (3, 4), 3
    pooled[4] = reference.pool(key, gate, np.array([[3, 4]], np.int64))[0]
    slot_of = np.zeros(12, np.int32)
    slot_of[:8] = np.arange(1, 9)
    ids = np.arange(3, dtype=np.int64)
    NONE, NEW = recheck.NONE, recheck.NEW
    for k in (kernels, reference):
        def many(kept=(1, 2, 0), known=(True, True, True), too_many=False, cells=(3,),
                 n_keys=n_keys, n_handed=n_slots, ids=ids, key_gen=key_gen, key=key, k=k):
            return k.recheck_many(start, np.array([1, 2, 0], np.int64),
                                  np.array(kept, np.int64), np.array(known), rep_pos,
                                  rep_rows, 12, True, too_many, np.array(cells, np.int64),
                                  pos, has, ids, keys_, n_keys, pools, reps, strm, slot_of,
                                  n_handed, key, gate, pooled, pool_of, pool_gen, key_gen)

        how, verdicts = many()
        assert how.tolist() == [NEW, NONE, NONE] and verdicts.tolist() == [False], k
        # before, as `recheck_ways` says: (3, cell 3) at or before seq 1's tail
        assert k.recheck_ways(start, np.array([1, 2, 0], np.int64),
                              np.array([1, 2, 0], np.int64), np.ones(3, bool), rep_pos,
                              rep_rows, 12, True, False, np.array([3], np.int64), pos,
                              recheck.NO_PAIR)[2] is True
        rewritten = key.copy()
        rewritten[3] += 1
        how, verdicts = many(key=rewritten, key_gen=np.array([1, 1, 1, 4, 1, 1, 1, 1, 1]))
        assert how.tolist() == [NEW, NONE, NONE] and verdicts.tolist() == [True], k
        assert many(cells=(6,)) is None and many(known=(True, False, True)) is None
        assert many(too_many=True) is None and many(kept=(3, 2, 0)) is None
        assert many(n_keys=np.array([3, 4, 0], np.int64)) is None
        assert many(n_handed=4) is None  # row 3's slot is 4
        assert many(ids=np.array([0, 1, 3], np.int64)) is None
        assert many(cells=(12,)) is None


def test_recheck_many_agrees() -> None:
    """On random layouts of one stream and random tables, the twins' `recheck_many`
    answer alike (None alike), and an answer is each twin's own `recheck_ways` of
    every sequence (no sequence holding a changed pair at or before its tail, as
    `_DirtyPairs.lowest` pairs them), then its own `rows_differ` of the pools past
    each NEW sequence's kept ones, sequence after sequence."""
    rng = np.random.default_rng(13)
    seen = {"none": 0, "new": 0, "before": 0}
    for kpool in (1, 2, 4):
        for _ in range(80):
            n = int(rng.integers(1, 7))
            n_pools = rng.integers(0, 4, n)
            n_keys = [int(p * kpool + rng.integers(0, kpool + 1)) for p in n_pools]
            start, rep_pos, rep_rows, pos, has, keys_, nk, pools, reps, strm = _many(
                n_keys, n_pools.tolist(), kpool, int(rng.integers(0, 20)))
            n_cells, n_slots = pos.size, 40
            has |= rng.random(has.shape) < 0.05  # a few cells shared
            slot_of = rng.integers(0, n_slots, n_cells).astype(np.int64)
            n_handed = n_slots - int(rng.random() < 0.1) * 10
            key, gate, pooled, pool_of, pool_gen, key_gen = _random_slot_values(
                rng, n_slots, kpool)
            kept = rng.integers(0, n_pools + 1).astype(np.int64)
            n_bad = np.where(rng.random(n) < 0.7, n_pools, rng.integers(0, 4, n))
            known = rng.random(n) < 0.9
            cells = rng.choice(n_cells, int(rng.integers(0, 4)), replace=False)
            args = (start, n_bad.astype(np.int64), kept, known, rep_pos, rep_rows, n_cells,
                    True, False, cells.astype(np.int64), pos, has, np.arange(n,
                                                                         dtype=np.int64),
                    keys_, nk, pools, reps, strm, slot_of, n_handed, key, gate, pooled,
                    pool_of, pool_gen, key_gen)
            got = [k.recheck_many(*args) for k in (kernels, reference)]
            if got[1] is None:
                assert got[0] is None
                seen["none"] += 1
                continue
            for k, (how, verdicts) in zip((kernels, reference), got, strict=True):
                want, tail, before = k.recheck_ways(*args[:11], recheck.NO_PAIR)
                assert np.array_equal(how, want), k
                seen["before"] += before
                for s in np.flatnonzero(tail != recheck.NO_TAIL).tolist():
                    held = cells[has[s, cells]]
                    assert not ((pos[held] << 32 | held) <= tail[s]).any(), k
                new = np.flatnonzero(how == recheck.NEW)
                seq = np.repeat(new, n_pools[new] - kept[new])
                ks = np.concatenate([np.arange(kept[s], n_pools[s]) for s in new] or [[]])
                ks = ks.astype(np.int64)
                j = pools[seq, ks][:, None] + np.arange(kpool)
                members = np.ascontiguousarray(keys_[seq[:, None], j] & CELL_MASK)
                want_v = k.rows_differ(slot_of, n_handed, key, gate, pooled, pool_of,
                                       pool_gen, key_gen, members, reps[seq, ks])
                assert want_v is not None and np.array_equal(verdicts, want_v), k
                seen["new"] += bool(verdicts.size)
    assert min(seen.values()) > 0, seen


def _a_one_step(monkeypatch) -> tuple:
    """The arguments of a `one_step` call that ran all three parts: the first of
    traces/mtp3-speculative.yaml (one sequence) under rep-once on the compiled core
    (whose layout knows its pairs equal the cache's), copied before it ran."""
    calls: list[tuple] = []
    real = kernels.one_step

    def kept(*args):  # type: ignore[no-untyped-def]
        copies = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
        got = real(*args)
        if got is not None and got[0] == guards.RECHECKED and not calls:
            calls.append(copies)
        return got

    monkeypatch.setattr(kernels, "one_step", kept)
    t = load_trace(ROOT / "traces" / "mtp3-speculative.yaml")
    list(Replayer(t, VERSIONS["rep-once"], ValueBackend(t.cache, t.seed, "numba"),
                  core="compiled").run())
    monkeypatch.undo()
    return calls[0]


# `one_step`'s arguments by name, in its order
_ONE_STEP_ARGS = (
    "state", "rows", "key_ids", "slot_of", "free", "n_handed", "pristine", "gen", "n_ubatch",
    "decode_kind", "key", "gate", "pooled", "slot_row", "key_gen", "pool_gen", "pool_of",
    "w_kind", "w_ubatch", "w_a", "w_b", "entry_rows", "rep", "order", "grows", "entry_pool",
    "pool_start", "pooled_kind", "padding_kind", "start", "n_bad", "kept", "known", "rep_pos",
    "rep_rows", "kv_size", "lookup_max", "dirty_before", "pos", "keys", "pools", "row0",
    "scatter")


def test_one_step_stops_where_a_part_hands_back(monkeypatch) -> None:
    """`one_step` (both twins) from a real call's state (`_a_one_step`): rows written
    twice are refused before anything is written (NOT_DISTINCT); slot arrays one row
    short of a new slot are refused before anything is written (NO_ROOM, with the
    rows that would get one); a plan whose last group writes a row without a slot
    (the highest row, which the trace never wrote) stops after the write
    (ROWS_WRITTEN: the rows' slots and keys written, no pooled row); without its
    scatter (a plan that stands) it writes and verifies alone (RECHECKED, no slot of
    a group, no pooled row); the call itself runs all three (RECHECKED). The twins
    give the same answers and leave the same arrays."""
    base = dict(zip(_ONE_STEP_ARGS, _a_one_step(monkeypatch), strict=True))
    n_handed = base["n_handed"]
    free_row = base["slot_of"].size - 1
    assert base["slot_of"][free_row] == 0 and base["rep"].size == base["grows"].size
    last = base["grows"].size - 1  # the last group (its row the highest), its entry e
    e = int(base["order"][last])
    variants = {
        "as it ran": ({}, guards.RECHECKED, None),
        "a row twice": ({"rows": np.repeat(base["rows"][:1], 2),
                         "key_ids": np.repeat(base["key_ids"][:1], 2)},
                        guards.WROTE_NOTHING, guards.NOT_DISTINCT),
        "no room": ({"key": base["key"][:n_handed].copy()}, guards.WROTE_NOTHING,
                    guards.NO_ROOM),
        "a row without a slot": ({"rep": _with(base["rep"], e, free_row),
                                  "grows": _with(base["grows"], last, free_row)},
                                 guards.ROWS_WRITTEN, guards.WROTE),
        "no scatter": ({"scatter": False}, guards.RECHECKED, guards.WROTE),
    }
    for name, (changes, stage, why) in variants.items():
        outs = []
        for k in (kernels, reference):
            args = {a: v.copy() if isinstance(v, np.ndarray) else v
                    for a, v in {**base, **changes}.items()}
            got = k.one_step(*args.values())
            assert got is not None and got[0] == stage, (name, k, got)
            if why is not None:
                assert got[1] == why, (name, k, got)
            outs.append((got, args))
        (got, a), (want, b) = outs
        assert got[:3] == want[:3] and got[5:7] == want[5:7], name
        for x, y in (*zip(got[3:5], want[3:5], strict=True), (got[7], want[7])):
            assert np.array_equal(x, y), name
        for arg in _ONE_STEP_ARGS:
            if isinstance(a[arg], np.ndarray):
                assert a[arg].tobytes() == b[arg].tobytes(), (name, arg)
        if stage == guards.WROTE_NOTHING:  # nothing written
            assert all(a[arg].tobytes() == (changes.get(arg, base[arg])).tobytes()
                       for arg in _ONE_STEP_ARGS if isinstance(a[arg], np.ndarray)), name
        if name == "no room":
            assert got[2] == np.count_nonzero(base["slot_of"][base["rows"]] == 0) > 0
        if name == "no scatter":  # the plan stands: no group's slot, no pooled row
            assert got[3].size == got[4].size == got[5] == 0
        if name in ("a row without a slot", "no scatter"):  # the rows' slots and keys alone
            s = a["slot_of"][base["rows"]]
            assert (s > 0).all() and not np.array_equal(a["key"][s], base["key"][s])
            pooled = base["pooled"].copy()
            pooled[s] = 0  # `write_rows` zeroes a written row's pooled row
            assert a["pooled"].tobytes() == pooled.tobytes()


def test_least_pair_by_hand() -> None:
    """Cells 4, 1, 5 at pos 14, 11, -1 (cell 5 freed): the least pair is the freed
    cell's, (-1 << 32) | 5; without it, (11, cell 1); of no cell, INT64_MAX."""
    pos = np.array([10, 11, 12, 13, 14, -1], np.int64)
    for k in (kernels, reference):
        assert k.least_pair(np.array([4, 1, 5], np.int64), pos) == (-1 << 32) | 5
        assert k.least_pair(np.array([4, 1], np.int64), pos) == (11 << 32) | 1
        assert k.least_pair(np.empty(0, np.int64), pos) == np.iinfo(np.int64).max
        with pytest.raises(IndexError, match=r"cells\[1\] is cell 6"):
            k.least_pair(np.array([4, 6], np.int64), pos)


def _slot_table(n_slots: int, n_rows: int, n_embd: int, slot_dtype: type
                ) -> dict[str, np.ndarray]:
    """The arrays `write_rows` reads and writes, every one holding 9 (slot_of 0)."""
    return dict(slot_of=np.zeros(n_rows, slot_dtype),
                key=np.full((n_slots, n_embd), 9, np.float32),
                gate=np.full((n_slots, n_embd), 9, np.int8),
                pooled=np.full((n_slots, n_embd), 9, np.float32),
                slot_row=np.full(n_slots, 9, np.int64), key_gen=np.full(n_slots, 9, np.int64),
                pool_gen=np.full(n_slots, 9, np.int64), w_kind=np.full(n_slots, 9, np.int8),
                w_ubatch=np.full(n_slots, 9, np.int64), w_a=np.full(n_slots, 9, np.int64),
                w_b=np.full(n_slots, 9, np.int64))


def _write_rows(k, state: np.uint64, rows: np.ndarray, key_ids: np.ndarray,
                free: np.ndarray, n_handed: int, pristine: int, a: dict[str, np.ndarray],
                out: np.ndarray) -> tuple[int, int]:
    """`k.write_rows` at generation 5, ubatch 7, writer kind 3."""
    return k.write_rows(state, rows, key_ids, a["slot_of"], free, n_handed, pristine, 5, 7,
                        3, a["key"], a["gate"], a["pooled"], a["slot_row"], a["key_gen"],
                        a["pool_gen"], a["w_kind"], a["w_ubatch"], a["w_a"], a["w_b"], out)


def test_write_rows_by_hand() -> None:
    """`write_rows`, the slot table's `own` and a decode's writes in one pass. Slots
    1..5 handed out (n_handed 6), free list [2, 4], pristine 7. Rows 10, 11, 12, 13
    with key ids 21, 0, 22, 23: row 10 has slot 3; the three others take the free
    list's two slots in its order (11: 2, 12: 4), then the new slot 6. Each slot gets
    its key id's rows (key id 0: zeros), a zeroed pooled row (slot 6 too: below
    pristine 7), key_gen 5, pool_gen 0 and the writer (3, 7, -1, -1); slots 0, 1, 5,
    7, 8 and rows 14, 15 keep what they held. One new row takes the free list's last
    slot (4); past pristine a pooled row is not written (it holds zeros already)."""
    st = keys.seed_state(4)
    rows = np.array([10, 11, 12, 13], np.int64)
    ids = np.array([21, 0, 22, 23], np.int64)
    want_key, want_gate = keys.key_rows_from_state(st, ids, 8)
    for k in (kernels, reference):
        for slot_dtype in (np.int32, np.int64):
            a = _slot_table(9, 16, 8, slot_dtype)
            a["slot_of"][10] = 3
            out = np.full(4, -9, np.int64)
            got = _write_rows(k, st, rows, ids, np.array([2, 4], np.int64), 6, 7, a, out)
            assert got == (guards.WROTE, 3), k
            assert out.tolist() == [3, 2, 4, 6], k
            assert a["slot_of"].tolist() == [0] * 10 + [3, 2, 4, 6, 0, 0], k
            assert a["slot_row"].tolist() == [9, 9, 11, 9, 12, 9, 13, 9, 9], k  # row 10: 3's
            assert same(a["key"][out], want_key) and same(a["gate"][out], want_gate), k
            assert not a["key"][2].any() and not a["gate"][2].any(), k  # key id 0
            assert (a["pooled"][out] == 0).all(), k
            for name, value in (("key_gen", 5), ("pool_gen", 0), ("w_kind", 3),
                                ("w_ubatch", 7), ("w_a", -1), ("w_b", -1)):
                assert (a[name][out] == value).all(), (k, name)
            untouched = [0, 1, 5, 7, 8]
            for name in ("key", "gate", "pooled", "key_gen", "pool_gen", "w_kind",
                         "w_ubatch", "w_a", "w_b"):
                assert (a[name][untouched] == 9).all(), (k, name)
        a = _slot_table(9, 16, 8, np.int32)
        out = np.empty(1, np.int64)
        assert _write_rows(k, st, rows[1:2], ids[1:2], np.array([2, 4], np.int64), 6, 7, a,
                           out) == (guards.WROTE, 1)
        assert out.tolist() == [4], k
        # past pristine a slot holds zeros already: not written again
        a = _slot_table(9, 16, 8, np.int32)
        out = np.empty(2, np.int64)
        assert _write_rows(k, st, rows[:2], ids[:2], np.empty(0, np.int64), 6, 7, a,
                           out) == (guards.WROTE, 2)
        assert out.tolist() == [6, 7], k
        assert (a["pooled"][6] == 0).all() and (a["pooled"][7] == 9).all(), k


def test_write_rows_refuses_before_it_writes() -> None:
    """What `write_rows` refuses, naming where, having written nothing: the room it
    lacks (NO_ROOM, the rows that would get a slot: 2 new slots past 4 slots of
    room), a row outside the slot map, a row whose slot is 0's or past those handed
    out, a free slot that is."""
    st = keys.seed_state(1)
    rows = np.array([3, 5, 6], np.int64)
    ids = np.array([1, 2, 3], np.int64)
    cases = [
        (dict(n_handed=3), (guards.NO_ROOM, 2)),
        (dict(rows=np.array([3, 16, 6], np.int64)), (guards.ROW_OUTSIDE, 1)),
        (dict(rows=np.array([3, 5, -1], np.int64)), (guards.ROW_OUTSIDE, 2)),
        (dict(slot=(6, 3)), (guards.SLOT_OUTSIDE, 2)),
        (dict(slot=(5, -2)), (guards.SLOT_OUTSIDE, 1)),
        (dict(free=np.array([1, 0], np.int64)), (guards.FREE_OUTSIDE, 1)),
        (dict(free=np.array([2, 1, 2], np.int64)), (guards.FREE_OUTSIDE, 2)),
    ]
    for k in (kernels, reference):
        for spoiled, want in cases:
            a = _slot_table(4, 16, 8, np.int32)
            a["slot_of"][3] = 1
            if "slot" in spoiled:
                a["slot_of"][spoiled["slot"][0]] = spoiled["slot"][1]
            held = {name: x.copy() for name, x in a.items()}
            got = _write_rows(k, st, spoiled.get("rows", rows), ids,
                              spoiled.get("free", np.empty(0, np.int64)),
                              spoiled.get("n_handed", 2), 2, a, np.empty(3, np.int64))
            assert got == want, (k, spoiled)
            assert all(np.array_equal(a[name], held[name]) for name in a), (k, spoiled)


def test_write_rows_agrees() -> None:
    """On random slot tables (rows with and without slots, free lists long and short,
    key id 0 among the ids, pristine anywhere past the slots handed out), the kernel
    and its twin write the same slots, rows and writers, bit for bit."""
    rng = np.random.default_rng(47)
    st = keys.seed_state(12)
    for n in (0, 1, 5, 64, 700):
        n_rows, n_slots = 2000, 1600
        n_handed = int(rng.integers(1, 800))
        live = rng.permutation(n_handed - 1)[:int(rng.integers(0, n_handed))] + 1
        free = np.setdiff1d(np.arange(1, n_handed), live).astype(np.int64)
        free = rng.permutation(free)
        with_slot = rng.permutation(n_rows)[:live.size]
        rows = rng.permutation(n_rows)[:n].astype(np.int64)
        ids = rng.integers(0, 50, n).astype(np.int64)
        pristine = n_handed + int(rng.integers(0, 20))
        tables = []
        for k in (kernels, reference):
            a = _slot_table(n_slots, n_rows, 16, np.int32)
            a["slot_of"][with_slot] = live
            out = np.empty(n, np.int64)
            got = _write_rows(k, st, rows, ids, free, n_handed, pristine, a, out)
            tables.append((got, out, a))
        (g1, o1, a1), (g2, o2, a2) = tables
        assert g1 == g2 and g1[0] == guards.WROTE and np.array_equal(o1, o2), n
        for name in a1:
            assert np.array_equal(a1[name].view(np.uint8), a2[name].view(np.uint8)), (n, name)


def _writer_arrays(n_slots: int) -> tuple[np.ndarray, ...]:
    """A slot table's writer columns (w_kind int8, w_ubatch, w_a, w_b), all 9."""
    return (np.full(n_slots, 9, np.int8), *(np.full(n_slots, 9, np.int64) for _ in range(3)))


def test_stamp_winners_by_hand() -> None:
    """`stamp_winners`: each race group's row gets its last entry as writer. Entries
    0..4 write rows (groups) A: entries 3, 0 (last 0, pool 5), B: 1 (padding), C: 4, 2
    (last 2, pool 10); pool_start [0, 5, 5, 12] (sequence 1 empty), so pool 5 is (2,
    0) and pool 10 is (2, 5); the rows' slots are 3, 1, 2 of 5; ubatch 7, kinds
    POOLED = 1 and PADDING = 2 here. Slots 0 and 4 keep what they held (9)."""
    order = np.array([3, 0, 1, 4, 2], np.int64)
    starts = np.array([0, 2, 3, 5], np.int64)
    entry_pool = np.array([5, -1, 10, 0, 11], np.int64)
    pool_start = np.array([0, 5, 5, 12], np.int64)
    slots = np.array([3, 1, 2], np.int64)
    for k in (kernels, reference):
        kind, ubatch, a, b = _writer_arrays(5)
        k.stamp_winners(order, starts, entry_pool, pool_start, slots, 7, 1, 2, kind,
                        ubatch, a, b)
        assert kind.tolist() == [9, 2, 1, 1, 9], k
        assert ubatch.tolist() == [9, 7, 7, 7, 9], k
        assert a.tolist() == [9, -1, 2, 2, 9] and b.tolist() == [9, -1, 5, 0, 9], k
        # refused, naming the first group at fault, and nothing written: a group's end
        # past the entries, its last entry outside them, its pool past the layout's,
        # its slot the zero row's or past the table; groups that are not the slots'
        refusals = [
            (IndexError, 1, dict(starts=np.array([0, 2, 6, 5], np.int64))),
            (IndexError, 0, dict(order=np.array([3, 5, 1, 4, 2], np.int64))),
            (IndexError, 2, dict(order=np.array([3, 0, 1, 4, -1], np.int64))),
            (IndexError, 2, dict(entry_pool=np.array([5, -1, 12, 0, 11], np.int64))),
            (IndexError, 1, dict(slots=np.array([3, 0, 2], np.int64))),
            (IndexError, 2, dict(slots=np.array([3, 1, 5], np.int64))),
            (ValueError, 0, dict(slots=np.array([3, 1], np.int64))),
        ]
        for error, g, spoiled in refusals:
            args = dict(order=order, starts=starts, entry_pool=entry_pool,
                        pool_start=pool_start, slots=slots) | spoiled
            held = _writer_arrays(5)
            with pytest.raises(error, match=f"^race group {g}: "):
                k.stamp_winners(args["order"], args["starts"], args["entry_pool"],
                                args["pool_start"], args["slots"], 7, 1, 2, *held)
            assert all((h == 9).all() for h in held), (k, spoiled)


def test_stamp_winners_agrees() -> None:
    """On random scatters (groups of one to six entries, a tenth padding, pools over
    sequences some of them empty, distinct slots), the kernel and its twin stamp the
    same writers."""
    rng = np.random.default_rng(31)
    for n in (0, 1, 7, 500, 3000):
        counts = rng.integers(1, 50, 8) * (rng.random(8) < 0.7)
        pool_start = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        sizes = rng.integers(1, 7, max(n, 1))
        sizes = sizes[:np.searchsorted(np.cumsum(sizes), n, side="right")]
        if sizes.sum() < n:
            sizes = np.append(sizes, n - sizes.sum())
        starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        order = rng.permutation(n).astype(np.int64)
        entry_pool = rng.integers(0, max(int(pool_start[-1]), 1), n).astype(np.int64)
        entry_pool[(rng.random(n) < 0.1) | (pool_start[-1] == 0)] = -1
        n_slots = 2 * sizes.size + 1
        slots = (1 + rng.permutation(n_slots - 1)[:sizes.size]).astype(np.int64)
        got, want = _writer_arrays(n_slots), _writer_arrays(n_slots)
        kernels.stamp_winners(order, starts, entry_pool, pool_start, slots, 3, 1, 2, *got)
        reference.stamp_winners(order, starts, entry_pool, pool_start, slots, 3, 1, 2, *want)
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g, w), n


def _singles_table(slot_dtype: type = np.int32) -> dict[str, np.ndarray]:
    """The slot table of `test_scatter_singles_by_hand`: kpool 2, n_embd 4, 8 slots,
    slots 1..7 handed out; rows 10..13 are slots 1..4 (keys of key ids 11..14), rows
    20, 21, 24 slots 5, 6, 7; row 25 a zero row. Slot 5 pooled slots 1, 2 at
    generation 3 (their keys at 2); slot 7 holds slots 2, 1's pooling, unknown
    (pool_gen 0); the other pooled rows hold 0.5; every writer column 9."""
    st = keys.seed_state(2)
    a = _slot_table(8, 30, 4, slot_dtype)
    a["key"][:] = a["gate"][:] = 0
    reference.write_keys(st, np.arange(1, 5), np.array([11, 12, 13, 14]), a["key"], a["gate"])
    a["slot_of"][[10, 11, 12, 13, 20, 21, 24]] = 1, 2, 3, 4, 5, 6, 7
    a["slot_row"][:] = -1
    a["slot_row"][1:] = 10, 11, 12, 13, 20, 21, 24
    a["pooled"][:] = 0.5
    a["pooled"][7] = reference.pool(a["key"], a["gate"], np.array([[2, 1]], np.int64))[0]
    a["pool_of"] = np.full((8, 2), 9, np.int64)
    a["pool_of"][5] = 1, 2
    a["pool_gen"][:] = 0
    a["pool_gen"][5] = 3
    a["key_gen"][:] = 2
    return a


def _scatter_singles(k, a: dict[str, np.ndarray], **plan: np.ndarray):
    """`k.scatter_singles` on table `a` at generation 7, ubatch 9, POOLED = 1 and
    PADDING = 2 here, of `plan` (entry_rows, rep, order, rows, entry_pool, pool_start)."""
    return k.scatter_singles(a["slot_of"], a["slot_row"], 8, a["key"], a["gate"], a["pooled"],
                             a["pool_of"], a["pool_gen"], a["key_gen"], 7, plan["entry_rows"],
                             plan["rep"], plan["order"], plan["rows"], plan["entry_pool"],
                             plan["pool_start"], 9, 1, 2, a["w_kind"], a["w_ubatch"],
                             a["w_a"], a["w_b"])


def test_scatter_singles_by_hand() -> None:
    """`scatter_singles`: `fresh_groups`, `scatter_fresh` and `stamp_winners` of race
    groups of one entry each, in one pass (the table: `_singles_table`). Entries 0
    (members rows 12, 13 -> rep row 21, padding), 1 (10, 11 -> 20, pool 4) and 2
    (11, 10 -> 24, pool 5); pool_start [0, 3, 6] (pools 4, 5 are seq 1's k 1, 2); the
    groups by row: 20, 21, 24 (entries 1, 0, 2), slots 5, 6, 7.
    - group 0: slot 5 holds the pooling of slots 1, 2, unwritten since: kept, its row
      (0.5) and pooling left as they were; stamped (POOLED, seq 1, k 1);
    - group 1: slot 6 never pooled: pooled from slots 3, 4, whose bits change (from
      0.5), pool_of [3, 4], generation 7; stamped PADDING (-1, -1);
    - group 2: slot 7 not known to hold a pooling: pooled from 2, 1, written with the
      bits it held (not changed), pool_of [2, 1], generation 7; stamped (1, 1, 2).
    So slots [5, 6, 7], changed [1], one entry kept; ubatch 9 on the three slots;
    slots 0..4 keep what they held."""
    plan = dict(entry_rows=np.array([[12, 13], [10, 11], [11, 10]], np.int64),
                rep=np.array([21, 20, 24], np.int64), order=np.array([1, 0, 2], np.int64),
                rows=np.array([20, 21, 24], np.int64),
                entry_pool=np.array([-1, 4, 5], np.int64),
                pool_start=np.array([0, 3, 6], np.int64))
    for k in (kernels, reference):
        for slot_dtype in (np.int32, np.int64):
            a = _singles_table(slot_dtype)
            want = reference.pool(a["key"], a["gate"], np.array([[3, 4], [2, 1]], np.int64))
            s, changed, n_kept = _scatter_singles(k, a, **plan)
            assert (s.tolist(), changed.tolist(), n_kept) == ([5, 6, 7], [1], 1), k
            assert (a["pooled"][:7][[0, 1, 2, 3, 4, 5]] == 0.5).all(), k
            assert same(a["pooled"][6], want[0]) and same(a["pooled"][7], want[1]), k
            assert a["pool_of"][5:].tolist() == [[1, 2], [3, 4], [2, 1]], k
            assert a["pool_gen"].tolist() == [0, 0, 0, 0, 0, 3, 7, 7], k
            assert a["w_kind"].tolist() == [9] * 5 + [1, 2, 1], k
            assert a["w_ubatch"].tolist() == [9] * 5 + [9, 9, 9], k
            assert a["w_a"].tolist() == [9] * 5 + [1, -1, 1], k
            assert a["w_b"].tolist() == [9] * 5 + [1, -1, 2], k
    # refused, naming the first group at fault, or None (a zero row, whose slot is
    # handed out first), and nothing written either way
    refusals = [
        (None, 2, dict(rows=np.array([20, 21, 25], np.int64),
                       rep=np.array([21, 20, 25], np.int64))),  # row 25 has no slot
        (IndexError, 1, dict(order=np.array([1, 3, 2], np.int64))),  # no entry 3
        (IndexError, 2, dict(rows=np.array([20, 21, 30], np.int64),
                             rep=np.array([21, 20, 30], np.int64))),  # past the 30 rows
        (IndexError, 2, dict(entry_pool=np.array([-1, 4, 6], np.int64))),  # past pool 5
        (IndexError, 0, dict(entry_rows=np.array([[12, 13], [10, 30], [11, 10]],
                                                 np.int64))),  # a member row past them
        (ValueError, 1, dict(rep=np.array([22, 20, 24], np.int64))),  # 22 != 21
        (ValueError, 1, dict(rows=np.array([21, 20, 24], np.int64),
                             order=np.array([0, 1, 2], np.int64))),  # not ascending
        (ValueError, 0, dict(order=np.array([1, 0], np.int64))),  # an entry in no group
    ]
    for k in (kernels, reference):
        for error, g, spoiled in refusals:
            a = _singles_table()
            held = {name: v.copy() for name, v in a.items()}
            if error is None:
                assert _scatter_singles(k, a, **(plan | spoiled)) is None, (k, spoiled)
            else:
                with pytest.raises(error, match=f"^race group {g}: "):
                    _scatter_singles(k, a, **(plan | spoiled))
            assert all(np.array_equal(held[name], v) for name, v in a.items()), (k, spoiled)
        a = _singles_table()
        a["slot_row"][6] = 22  # slot 6 is not row 21's alone: refused, nothing written
        held = {name: v.copy() for name, v in a.items()}
        with pytest.raises(IndexError, match=r"^race group 1: "):
            _scatter_singles(k, a, **plan)
        assert all(np.array_equal(held[name], v) for name, v in a.items()), k


def test_scatter_singles_agrees() -> None:
    """On random scatters of single-entry groups over random slot tables (some entries
    keeping a pooling, some rows holding their entry's value already, a tenth padding,
    now and then a zero row), the kernel and its twin answer and write alike."""
    rng = np.random.default_rng(41)
    seen = dict.fromkeys(("none", "kept", "changed"), 0)
    for kpool in (1, 2, 4):
        for n in (1, 3, 60):
            for _ in range(20):
                n_rows, n_slots = 400, 300
                slot_of = np.zeros(n_rows, np.int32)
                held = rng.choice(n_rows, n_slots - 1, replace=False)
                slot_of[held] = 1 + rng.permutation(n_slots - 1)
                slot_row = np.full(n_slots, -1, np.int64)
                slot_row[slot_of[held]] = held
                if rng.random() < 0.2:  # a zero row among the groups' rows, maybe
                    held = np.append(held, np.flatnonzero(slot_of == 0)[:1])
                rows = np.sort(rng.choice(held, n, replace=False)).astype(np.int64)
                order = rng.permutation(n).astype(np.int64)
                rep = np.empty(n, np.int64)
                rep[order] = rows
                entry_rows = rng.choice(held, (n, kpool)).astype(np.int64)
                pool_start = np.array([0, 40, 40, 100], np.int64)
                entry_pool = rng.integers(0, 100, n).astype(np.int64)
                entry_pool[rng.random(n) < 0.1] = -1
                key, gate, pooled, pool_of, pool_gen, key_gen = _random_slot_values(
                    rng, n_slots, kpool)
                for e in range(n):  # a third keep their pooling, some rows hold it
                    r, m = slot_of[rep[e]], slot_of[entry_rows[e]]
                    if r and rng.random() < 0.3:
                        pool_of[r], pool_gen[r], key_gen[m] = m, 5, 4
                    elif r and rng.random() < 0.3:
                        pooled[r] = reference.pool(key, gate, m[None, :].astype(np.int64))[0]
                tables = [[a.copy() for a in (slot_of, slot_row, key, gate, pooled, pool_of,
                                              pool_gen, key_gen)] + list(_writer_arrays(n_slots))
                          for _ in range(2)]
                got = []
                for k, t in zip((kernels, reference), tables, strict=True):
                    so, sr, ky, gt, pl, po, pg, kg, *w = t
                    got.append(k.scatter_singles(so, sr, n_slots, ky, gt, pl, po, pg, kg, 6,
                                                 entry_rows, rep, order, rows, entry_pool,
                                                 pool_start, 3, 1, 2, *w))
                if got[0] is None or got[1] is None:
                    assert got[0] is got[1] is None
                    seen["none"] += 1
                else:
                    seen["kept"] += got[0][2]
                    seen["changed"] += got[0][1].size
                    assert all(np.array_equal(x, y) for x, y in zip(got[0][:2], got[1][:2],
                                                                      strict=True))
                    assert got[0][2] == got[1][2]
                for x, y in zip(*tables, strict=True):
                    assert np.array_equal(x.view(np.uint8), y.view(np.uint8))
    assert min(seen.values()) > 0, seen


def _json_reports(traces: list[Path], backend: str) -> list[str]:
    """`kpool replay TRACE --engine E --backend B --format json -q` of each trace under
    each engine: the reports, as the CLI prints them."""
    out = []
    for trace in traces:
        for engine in ENGINES:
            r = CliRunner().invoke(cli, ["replay", str(trace), "--engine", engine,
                                         "--backend", backend, "--format", "json", "-q"])
            assert r.exit_code in (0, 1), r.output
            out.append(r.output)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_scatter_of_single_entry_groups_is_one_call_and_changes_no_report(
        backend: str, monkeypatch) -> None:
    """store.py `_scatter`: a plan whose race groups hold one entry each, none racing
    and none vouched for by the standing plan (rep-once's, most ubatches), is
    scattered by `scatter_singles` in one call (or, a layout of one sequence, by
    `one_step`, with its write and verification). With both doors answering None, as
    for a zero row, every scatter takes the pass of three kernels instead: the JSON
    reports of these traces, under both engines, are byte-identical either way."""
    from kpool_cli.backend.guarded import GuardedKernels
    from kpool_cli.backend.guards import SCATTERED

    traces = [ROOT / "traces" / f"{name}.yaml" for name in (
        "shared-prefix-race", "partial-copy", "non-unified", "mtp3-speculative",
        "server-session", "state-restore")]
    calls = {"one pass": 0, "one step": 0}
    one_pass, one_step = GuardedKernels.scatter_singles, GuardedKernels.one_step

    def counted(self, *args):
        got = one_pass(self, *args)
        calls["one pass"] += got is not None
        return got

    def counted_step(self, *args):
        got = one_step(self, *args)
        calls["one step"] += got is not None and got[0] >= SCATTERED
        return got

    monkeypatch.setattr(GuardedKernels, "scatter_singles", counted)
    monkeypatch.setattr(GuardedKernels, "one_step", counted_step)
    fast = _json_reports(traces, backend)
    # of these replays, 52 scatters: 38 by scatter_singles, 14 by one_step
    assert calls["one pass"] > 30 and calls["one step"] > 10, calls
    monkeypatch.setattr(GuardedKernels, "scatter_singles", lambda self, *args: None)
    monkeypatch.setattr(GuardedKernels, "one_step", lambda self, *args: None)
    assert _json_reports(traces, backend) == fast


def test_one_step_grows_the_slot_arrays_and_changes_no_report(tmp_path: Path,
                                                              monkeypatch) -> None:
    """`GuardedKernels.one_step`: a one-sequence decode whose write lacks the room
    (the slot arrays hold `SLOTS_MIN`, 64, slots at first) is answered NO_ROOM with
    nothing written, and the door grows the arrays and calls again. A 60-token
    prefill, then 30 one-token decodes, each a ubatch the one call takes: the kernel
    answers NO_ROOM at least once, every call but those ends having scattered (on the
    default core of so short a trace, the reference one, the verification then hands
    back: its layout never knows its pairs equal the cache's), and the JSON reports
    under both engines equal those with the one-call door shut."""
    from kpool_cli.backend.guarded import GuardedKernels

    decodes = "\n".join(f"  - decode: {{seq: 0, pos: {p}}}" for p in range(60, 90))
    trace = tmp_path / "growth.yaml"
    trace.write_text("kpool_trace: 1\nname: one-step-growth\n"
                     "cache: {kv_size: 128, kpool: 4, n_ubatch: 64, n_embd: 8}\n"
                     f"ops:\n  - decode: {{seq: 0, pos: 0..60}}\n{decodes}\n")
    answers: list[tuple[int, int]] = []
    real = kernels.one_step

    def counted(*args):  # type: ignore[no-untyped-def]
        got = real(*args)
        if got is not None:
            answers.append((got[0], got[1]))
        return got

    monkeypatch.setattr(kernels, "one_step", counted)
    fast = _json_reports([trace], "numba")
    grown = answers.count((guards.WROTE_NOTHING, guards.NO_ROOM))
    assert grown >= 1, answers
    # each ubatch (the prefill's, 60 rows, and the 30 decodes') once a call, both engines
    assert len(answers) - grown == 2 * 31
    assert all(stage >= guards.SCATTERED for stage, _ in answers if stage != 0), answers
    monkeypatch.setattr(GuardedKernels, "one_step", lambda self, *args: None)
    assert _json_reports([trace], "numba") == fast


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_verification_reads_its_rows_in_the_kernel_and_changes_no_report(
        backend: str, monkeypatch) -> None:
    """verify.py `Verifier.differ`: the pools a verification rechecks are judged by
    `rows_differ`, which reads their rows through the slot map in the kernel, and
    `pools_differ`'s door is never asked on replays whose rows are all in the map;
    with `rows_differ` answering None, as for a row outside it, every check takes the
    long way (rows checked, then looked up): the JSON reports of these traces, under
    both engines, are byte-identical either way."""
    from kpool_cli.backend.guarded import GuardedKernels

    traces = [ROOT / "traces" / f"{name}.yaml" for name in (
        "shared-prefix-race", "partial-copy", "non-unified", "mtp3-speculative",
        "state-restore", "seq-add-drift")]
    calls = {"by rows": 0, "by slots": 0}
    by_rows, by_slots = GuardedKernels.rows_differ, GuardedKernels.pools_differ

    def counted_rows(self, *args):
        calls["by rows"] += 1
        return by_rows(self, *args)

    def counted_slots(self, *args):
        calls["by slots"] += 1
        return by_slots(self, *args)

    monkeypatch.setattr(GuardedKernels, "rows_differ", counted_rows)
    monkeypatch.setattr(GuardedKernels, "pools_differ", counted_slots)
    fast = _json_reports(traces, backend)
    assert calls["by rows"] > 30 and calls["by slots"] == 0, calls  # 39 checks
    monkeypatch.setattr(GuardedKernels, "rows_differ", lambda self, *args: None)
    assert _json_reports(traces, backend) == fast
    assert calls["by slots"] > 30, calls


def test_pool_is_the_base2_softmax_mean() -> None:
    """A hand-checked pool: gates (1, 0) weigh 2/3 and 1/3."""
    key = np.array([[0.5], [-0.25]], np.float32)
    gate = np.array([[1], [0]], np.int8)
    for mod in (kernels, reference):
        out = mod.pool(key, gate, np.array([[0, 1]], np.int64))
        w0 = np.float32(1) / np.float32(1.5)
        w1 = np.float32(0.5) / np.float32(1.5)
        assert out[0, 0] == np.float32(w0 * key[0, 0]) + np.float32(w1 * key[1, 0])


def test_pool_bits_construction_matches_the_pow2_table():
    """kernels._pool_entry builds 2**-(max - g) from float32 bits; keys.POW2 is the
    table the numpy twin reads: they must be the same numbers for every gate gap."""
    GATE_MAX = keys.GATE_MAX
    gaps = np.arange(2 * GATE_MAX + 1)
    # one entry per gap: member 0 has gate GATE_MAX, member 1 has GATE_MAX - gap
    n_embd = 1
    key = np.ones((2 * gaps.size, n_embd), dtype=np.float32)
    key[1::2] = 0.0  # the pooled value is member 0's weight: 1 / (1 + 2**-gap)
    gate = np.empty(key.shape, dtype=np.int8)
    gate[0::2, 0] = GATE_MAX
    gate[1::2, 0] = GATE_MAX - gaps
    members = np.arange(2 * gaps.size, dtype=np.int64).reshape(-1, 2)
    a = kernels.pool(key, gate, members)
    b = reference.pool(key, gate, members)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    p = (2.0 ** -gaps).astype(np.float32)  # exact
    assert np.array_equal(a[:, 0], np.float32(1.0) / (np.float32(1.0) + p))


# -- the wrappers check every index before a kernel runs ---------------------------------

CFG = CacheConfig(kv_size=16, kpool=4, n_seq_max=2)  # 16 rows, one stream
CFG_STREAMS = CacheConfig(kv_size=8, kpool=2, n_seq_max=2, unified=False)  # 2 streams


def state(be: ValueBackend) -> tuple:
    """Everything a refused call must leave as it was (arrays as bytes)."""
    t, n = be.slots, be.slots.n_handed
    arrays = (t.slot_of, t._free, t.key[:n], t.gate[:n], t.pooled[:n], t.w_kind[:n],
              t.w_ubatch[:n], t.slot_row[:n], be.verifier._kdirty, be.verifier._pdirty, *be.bad)
    return (n, be.n_ubatch, sorted(be.alt), sorted(be.snapshots),
            tuple((a.shape, a.tobytes()) for a in arrays))


def written(name: str, cfg: CacheConfig = CFG, rows=range(8)) -> ValueBackend:
    be = ValueBackend(cfg, 3, name)
    rows = np.asarray(list(rows), dtype=np.int64)
    be.write_rows(rows, rows + 1)
    return be


def refused(where: str, says: str):
    """pytest.raises(PlanError) whose message starts with `where: says` (literally)."""
    return pytest.raises(PlanError, match="^" + re.escape(f"{where}: {says}"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("rows", "ids", "says"), [
    ([3, 16], [1, 2], "rows[1] is row 16, but it may only name rows 0..15 (a bug in kpool"),
    ([-1, 2], [1, 2], "rows[0] is row -1,"),
    ([1 << 40], [1], "rows[0] is row 1099511627776,"),
    (np.array([1 << 63], dtype=np.uint64), [1], "rows[0] is row -9223372036854775808,"),
    ([2, 5, 2], [1, 2, 3], "row 2 is in rows more than once"),
    ([1.0, 2.0], [1, 2], "rows holds float64 values"),
    ([True], [1], "rows holds bool values"),
    ([[1, 2]], [1, 2], "rows has shape (1, 2), expected shape (n,)"),
    ([1, 2], [1], "key_ids has shape (1,), expected shape (2,)"),
    ([1, 2], [1.5, 2.5], "key_ids holds float64"),
])
def test_write_rows_refuses_bad_rows(backend: str, rows, ids, says: str) -> None:
    be = written(backend)
    before = state(be)
    with refused("write_rows", says) as e:
        be.write_rows(np.asarray(rows), np.asarray(ids))
    assert e.value.where == "write_rows"
    assert state(be) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_rows_takes_any_integer_rows_in_any_layout(backend: str) -> None:
    """int32, uint8, a strided view: converted to int64 C-contiguous, same result."""
    want = written(backend, rows=[1, 3, 5, 7])
    wide = np.array([1, 0, 3, 0, 5, 0, 7, 0], dtype=np.int32)[::2]
    assert not wide.flags.c_contiguous
    for rows in (wide, np.array([1, 3, 5, 7], dtype=np.uint8)):
        be = ValueBackend(CFG, 3, backend)
        be.write_rows(rows, np.asarray(rows, dtype=np.int16) + 1)
        for name in ("key", "gate", "pooled"):
            assert same(be.row_values(name), want.row_values(name)), (rows.dtype, name)


def _big_members(i: int, j: int, row: int) -> np.ndarray:
    """30 entries' member rows (120 rows: numpy's check), all 0 but [i, j] = row."""
    members = np.zeros((30, 4), dtype=np.int64)
    members[i, j] = row
    return members


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_row_taking_method_refuses_bad_rows(backend: str) -> None:
    be = written(backend)
    be.snapshot("a", np.arange(4))
    before = state(be)
    calls = [
        ("zero_rows", lambda: be.zero_rows(np.array([2, 99])), "rows[1] is row 99,"),
        ("zero_rows", lambda: be.zero_rows(np.array([4, 4])), "row 4 is in rows more"),
        ("snapshot", lambda: be.snapshot("b", np.array([-3])), "rows[0] is row -3,"),
        ("restore", lambda: be.restore("a", np.array([8, 9, 10, 16])), "rows[3] is row 16,"),
        ("restore", lambda: be.restore("a", np.array([8, 9])), "2 rows for snapshot 'a' of 4"),
        ("restore", lambda: be.restore("a", np.array([8, 9, 9, 10])), "row 9 is in rows"),
        ("row_values", lambda: be.row_values("key", np.array([0, -1])), "rows[1] is row -1,"),
        ("check", lambda: be.verifier.differ(np.array([[0, 1, 2, 16]]), np.array([3])),
         "member rows[0, 3] is row 16,"),
        ("check", lambda: be.verifier.differ(np.array([[0, 1, 2, 3]]), np.array([3, 4])),
         "rep rows has shape (2,), expected shape (1,)"),
        ("check", lambda: be.verifier.differ(np.array([[0, 1, 2]]), np.array([3])),
         "member rows has shape (1, 3), expected shape (n, 4)"),
        # past 48 elements numpy checks them (rows from 0: one pass, as unsigned)
        ("check", lambda: be.verifier.differ(_big_members(20, 1, -1), np.zeros(30, dtype=int)),
         "member rows[20, 1] is row -1,"),
        ("check", lambda: be.verifier.differ(_big_members(25, 3, 16), np.zeros(30, dtype=int)),
         "member rows[25, 3] is row 16,"),
        ("gather", lambda: be.gather(SimpleNamespace(pool_cells=lambda: np.array([3, 40]))),
         "the layout's pool_cells[1] is row 40,"),
    ]
    for where, call, says in calls:
        with refused(where, says):
            call()
        assert state(be) == before, where


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy_stream_refuses_a_stream_that_is_not_there(backend: str) -> None:
    be = written(backend, CFG_STREAMS)
    before = state(be)
    for src, dst, says in ((0, 2, "dst is stream 2"), (-1, 1, "src is stream -1")):
        with refused("copy_stream", f"{says}, outside the 2 streams 0..1"):
            be.copy_stream(src, dst)
    assert state(be) == before


def _with(a: np.ndarray, at, value) -> np.ndarray:
    a = a.copy()
    a[at] = value
    return a


# name: how the plan is spoiled (plan, n_rows, layout), and a regex of what the
# error says ({n}: n_rows)
BAD_PLANS = {
    "member row past the last": (
        lambda p, n, lay: dataclasses.replace(p, entry_rows=_with(p.entry_rows, (0, -1), n)),
        r"the plan's entry_rows\[0, \d+\] is row {n}, but it may only name rows 0\.\.{m}"),
    "negative member row": (
        lambda p, n, lay: dataclasses.replace(p, entry_rows=_with(p.entry_rows, (-1, 0), -1)),
        r"the plan's entry_rows\[\d+, 0\] is row -1,"),
    "rep row past the last": (
        lambda p, n, lay: dataclasses.replace(p, entry_rep=_with(p.entry_rep, 0, n + 7)),
        r"the plan's entry_rep\[0\] is row {n7},"),
    "negative rep row": (
        lambda p, n, lay: dataclasses.replace(p, entry_rep=_with(p.entry_rep, -1, -5)),
        r"the plan's entry_rep\[\d+\] is row -5,"),
    "a member short": (
        lambda p, n, lay: dataclasses.replace(p, entry_rows=p.entry_rows[:, :-1].copy()),
        r"the plan's entry_rows has shape \(\d+, \d+\), expected shape \(\d+, \d+\)"),
    "an entry without its rep": (
        lambda p, n, lay: dataclasses.replace(p, entry_rep=p.entry_rep[:-1].copy()),
        r"the plan's entry_rows has shape"),
    "float member rows": (
        lambda p, n, lay: dataclasses.replace(p, entry_rows=p.entry_rows.astype(np.float64)),
        r"the plan's entry_rows holds float64 values"),
    "pool past the layout's": (
        lambda p, n, lay: dataclasses.replace(p, entry_pool=_with(p.entry_pool, 0,
                                                                  lay.n_pool_real)),
        r"the plan's entry_pool\[0\] is pool \d+, but it may only name pools -1\.\."),
}


# a context whose race groups are not its plan's (a context is built by
# UbatchContext.of, which groups its own plan's entries)
GROUPS_OF_ANOTHER_PLAN = "race groups of another plan"


class Doctored(ValueBackend):
    """Hands run_ubatch every spoiled version of each plan first, each with the
    ubatch's write as the replay hands it in (each must be refused, leaving the
    backend as the write alone leaves it: a refused plan changes nothing, and the
    one-call path, `_one_step`, writes no value of it), then the real one."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.refused: set[str] = set()

    def run_ubatch(self, ctx, written=None):
        plan, layout = ctx.plan, ctx.layout
        if plan.n_new_g:
            if written is not None:
                # the state the write leaves (written again, as each call below does,
                # the rows hold the same slots, keys and writers)
                self.write_rows(*written)
            n = self.n_rows
            spoiled = {name: (UbatchContext.of(ctx.cache, layout, ctx.change,
                                               spoil(plan, n, layout), None, ctx.token_pos,
                                               ctx.token_seqs), says)
                       for name, (spoil, says) in BAD_PLANS.items()}
            spoiled[GROUPS_OF_ANOTHER_PLAN] = (
                dataclasses.replace(ctx, rows=ctx.rows + 1),
                r"(kept|scatter): race group 0: not a race group of the entries' rep rows")
            for name, (bad, says) in spoiled.items():
                before = state(self)
                with pytest.raises(PlanError) as e:
                    super().run_ubatch(bad, written)
                # the plan's arrays are checked as they come in; the groups by the
                # kernel that reads them
                says = says if name == GROUPS_OF_ANOTHER_PLAN else "run_ubatch: " + says
                assert re.match(says.format(n=n, m=n - 1, n7=n + 7),
                                str(e.value)), (name, str(e.value))
                assert state(self) == before, name
                self.refused.add(name)
        return super().run_ubatch(ctx, written)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", [p for p in TRACE_FILES
                                  if p.stem in ("shared-prefix-race", "partial-copy",
                                                "non-unified", "mtp3-speculative")],
                         ids=lambda p: p.stem)
def test_a_spoiled_plan_is_refused_and_changes_nothing(path: Path, engine: str,
                                                       backend: str) -> None:
    t = load_trace(path)
    doctored = Doctored(t.cache, t.seed, backend)
    got = list(Replayer(t, VERSIONS[engine], doctored).run())
    clean = ValueBackend(t.cache, t.seed, backend)
    want = list(Replayer(t, VERSIONS[engine], clean).run())
    assert doctored.refused == {*BAD_PLANS, GROUPS_OF_ANOTHER_PLAN}

    def messages(records: list) -> list:
        return [[(f.code, f.message) for f in r.findings] for r in records
                if isinstance(r, UbatchRecord)]

    assert messages(got) == messages(want)
    for name in ("key", "gate", "pooled"):
        assert same(doctored.row_values(name), clean.row_values(name)), name


def test_the_generation_arrays_are_checked_again_once_replaced() -> None:
    """`SlotTable.check_generations` checks the three generation arrays whole once and
    then only their room, while they are the same arrays: 8 rows written (9 slots
    handed out), checked; a pool_gen replaced by an int32 copy, or by one of 2 slots,
    is refused; the array back, it passes; more slots handed out than the arrays hold
    are refused though the arrays are the ones checked."""
    t = written("numba").slots
    t.check_generations("x")
    good = t.pool_gen
    t.pool_gen = good.astype(np.int32)
    with refused("x", "the pool_gen array is int32"):
        t.check_generations("x")
    t.pool_gen = good[:2]
    with refused("x", "the pool_gen array is int64 (2,), not a C-contiguous int64 array "
                      "of 9 slots"):
        t.check_generations("x")
    t.pool_gen = good
    t.check_generations("x")
    handed, t.n_handed = t.n_handed, good.size + 1
    with refused("x", "the pool_of array is int64"):
        t.check_generations("x")
    t.n_handed = handed


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_corrupt_slot_map_is_refused_before_any_kernel(backend: str) -> None:
    """Slots are checked at the kernel's door too: a row whose slot is not in use
    (a slot-map bug) is an error naming the slot, not a write past the arrays."""
    be = written(backend)
    n = be.slots.n_handed
    far = be.slots._cap + 1000  # past the arrays' end: the kernel would write outside them
    be.slots.slot_of[3] = far
    said = f"is slot {far}, but it may only name slots 0..{n - 1}"
    calls = [
        ("write_keys", lambda: be.write_rows(np.array([3]), np.array([9])),
         f"slots[0] is slot {far}, but it may only name slots 1..{n - 1}"),
        ("check", lambda: be.verifier.differ(np.array([[0, 1, 2, 3]]), np.array([2])),
         f"member slots[0, 3] {said}"),
        ("check", lambda: be.verifier.differ(np.array([[0, 1, 2, 4]]), np.array([3])),
         f"rep slots[0] {said}"),
        ("gather", lambda: be.gather(SimpleNamespace(pool_cells=lambda: np.array([1, 3]))),
         f"slots[1] {said}"),
    ]
    for where, call, says in calls:
        with refused(where, says):
            call()
    be.slots.slot_of[3] = 0
    # the kernels' own doors, with what the slot map cannot express

    def fresh(**spoiled):
        args = dict(members=np.array([[1, 2, 3, 4], [4, 3, 2, 1]]), reps=np.array([1, 2]),
                    keep=np.array([False, True]), s=np.array([1, 2]), src=np.array([0, 1]))
        return be.kernels.scatter_fresh(**(args | spoiled))

    flat = FlatColumns(np.zeros((2, 8), np.int64), np.zeros(2, np.int64),
                       np.zeros((2, 4), np.int64), np.zeros((2, 4), np.int64),
                       np.zeros(2, np.int64))

    def many(**spoiled):  # two sequences, no pool, no changed cell, on an 8-cell stream
        args = dict(start=np.zeros(3, np.int64), n_bad=np.zeros(2, np.int64),
                    kept=np.zeros(2, np.int64), known=np.ones(2, bool),
                    rep_pos=np.arange(0), rep_rows=np.arange(0), dirty=True, too_many=False,
                    cells=np.arange(0), pos=np.zeros(8, np.int64), has=np.zeros((2, 8), bool),
                    ids=np.arange(2), cols=flat)
        return be.kernels.recheck_many(**(args | spoiled))
    doors = [
        ("write_keys", lambda: be.kernels.write_rows(np.array([3]), np.array([1, 2]), 0, 3),
         "2 key ids for 1 rows"),
        ("write_keys", lambda: be.kernels.write_rows(np.array([3], np.int32), np.array([1]),
                                                     0, 3),
         "the rows are not a C-contiguous 1-D int64 array"),
        ("write_keys", lambda: be.kernels.write_rows(np.array([2, be.n_rows]),
                                                     np.array([1, 2]), 0, 3),
         f"rows[1] is row {be.n_rows}, but it may only name rows 0..{be.n_rows - 1}"),
        ("scatter", lambda: fresh(members=np.array([[0, 1, 2, n], [1, 2, 3, 4]])),
         f"member slots[0, 3] is slot {n},"),
        ("scatter", lambda: fresh(members=np.zeros((2, 0), np.int64)),
         "member slots has shape (2, 0), expected shape (n, 4)"),
        ("scatter", lambda: fresh(reps=np.array([1, n])), f"rep slots[1] is slot {n},"),
        ("scatter", lambda: fresh(reps=np.array([1])), "rep slots has shape (1,)"),
        ("scatter", lambda: fresh(keep=np.array([0, 1])),
         "the kept flags are not a C-contiguous bool array of 2"),
        ("scatter", lambda: fresh(src=np.array([0, 2])),
         "sources[1] is entry 2, but it may only name entries 0..1"),
        ("scatter", lambda: fresh(src=np.array([0])), "sources has shape (1,)"),
        ("scatter", lambda: fresh(s=np.array([2, 2])), "slot 2 is in slots more than once"),
        ("scatter", lambda: fresh(s=np.array([0, 2])), "slots[0] is slot 0,"),
        ("gather", lambda: be.kernels.gather(np.array([-1])), "slots[0] is slot -1,"),
        ("check", lambda: be.kernels.pools_differ(np.array([[1, 2, 3, 4]]), np.array([1, 2])),
         "rep slots has shape (2,)"),
        ("kept", lambda: be.kernels.fresh_groups(np.array([[0, 1, 2, 3]]), np.array([3]),
                                                 np.array([0], np.int32), np.array([0, 1]),
                                                 np.array([3])),
         "the group entries are not a C-contiguous 1-D int64 array"),
        ("kept", lambda: be.kernels.fresh_groups(np.array([[0, 1, 2, 3]]), np.array([3]),
                                                 np.array([0]), np.array([0, 1]),
                                                 np.array([3.0])),
         "the group rows are not a C-contiguous 1-D int64 array"),
        ("kept", lambda: be.kernels.fresh_groups(np.array([[0, 1, 2]]), np.array([3]),
                                                 np.array([0]), np.array([0, 1]),
                                                 np.array([3])),
         "the member rows are not a C-contiguous int64 array of 1 x 4"),
        ("kept", lambda: be.kernels.fresh_groups(np.array([[0, 1, 2, 3]]),
                                                 np.array([be.n_rows]), np.array([0]),
                                                 np.array([0, 1]), np.array([be.n_rows])),
         "race group 0: an entry, row or slot outside the arrays"),
        ("kept", lambda: be.kernels.fresh_groups(np.array([[0, 1, 2, 3]]), np.array([3]),
                                                 np.array([0]), np.array([0, 1]),
                                                 np.array([4])),
         "race group 0: not a race group of the entries' rep rows"),
        ("scatter", lambda: be.kernels.scatter_singles(
            np.array([[0, 1, 2, 3]]), np.array([3]), np.array([0]), np.array([3], np.int32),
            np.array([-1]), np.array([0, 1]), 0, 1, 2),
         "the group rows are not a C-contiguous 1-D int64 array"),
        ("scatter", lambda: be.kernels.scatter_singles(
            np.array([[0, 1, 2]]), np.array([3]), np.array([0]), np.array([3]),
            np.array([-1]), np.array([0, 1]), 0, 1, 2),
         "the member rows are not a C-contiguous int64 array of 1 x 4"),
        ("scatter", lambda: be.kernels.scatter_singles(
            np.array([[0, 1, 2, 3]]), np.array([be.n_rows]), np.array([0]),
            np.array([be.n_rows]), np.array([-1]), np.array([0, 1]), 0, 1, 2),
         "race group 0: an entry, row or slot outside the arrays"),
        ("scatter", lambda: be.kernels.scatter_singles(
            np.array([[0, 1, 2, 3]]), np.array([3]), np.array([0]), np.array([4]),
            np.array([-1]), np.array([0, 1]), 0, 1, 2),
         "race group 0: not a race group of the entries' rep rows"),
        ("dirty pools", lambda: be.kernels.dirty_pools(
            np.arange(8, dtype=np.int64), np.array([0, 4], np.int32), np.zeros(8, bool)),
         "the pool starts are not a C-contiguous 1-D int64 array"),
        ("held pairs", lambda: be.kernels.held_pairs(
            np.array([1]), np.zeros((2, 8), bool), np.zeros(7, np.int64)),
         "the holders are not a C-contiguous bool array of n x 7"),
        ("pools of pairs", lambda: be.kernels.pools_of_pairs(
            np.arange(8, dtype=np.int64), np.array([0, 4]), np.arange(8.0), np.array([1])),
         "the member pairs are not a C-contiguous 1-D int64 array"),
        ("recheck ways", lambda: be.kernels.recheck_ways(
            np.array([0, 2]), np.array([2]), np.array([2]), np.array([1]), np.arange(2),
            np.arange(2), True, False, np.arange(1), np.zeros(8, np.int64), 0),
         "the known-equal flags are not a C-contiguous 1-D bool array"),
        ("recheck ways", lambda: be.kernels.recheck_ways(
            np.array([0, 2, 2]), np.array([2]), np.array([2]), np.array([True]),
            np.arange(2), np.arange(2), True, False, np.arange(1), np.zeros(8, np.int64), 0),
         "3 pool starts, 1 kept verdicts and 1 known-equal flags for 1 sequences"),
        ("recheck ways", lambda: be.kernels.recheck_ways(
            np.array([0, 2]), np.array([2]), np.array([2]), np.array([True]),
            np.arange(2), np.arange(2), True, False, np.arange(1.0), np.zeros(8, np.int64),
            0),
         "the cells are not a C-contiguous 1-D int64 array"),
        ("recheck one", lambda: be.kernels.recheck_one(
            2, 2, 2, True, np.arange(2), np.arange(2), True, False, np.arange(1),
            np.zeros(8, np.int64), np.arange(8, dtype=np.int64), np.array([0, 4], np.int32),
            0),
         "the pools' first pairs are not a C-contiguous 1-D int64 array"),
        ("recheck one", lambda: be.kernels.recheck_one(
            2, 2, -1, True, np.arange(2), np.arange(2), True, False, np.arange(1),
            np.zeros(8, np.int64), np.arange(8, dtype=np.int64), np.array([0, 4]), 0),
         "2 pools, 2 kept verdicts and -1 kept pools"),
        ("recheck many", lambda: many(known=np.ones(2, np.int8)),
         "the known-equal flags are not a C-contiguous 1-D bool array"),
        ("recheck many", lambda: many(n_bad=np.array([2])),
         "3 pool starts, 1 kept verdicts and 2 known-equal flags for 2 sequences"),
        ("recheck many", lambda: many(has=np.zeros((2, 7), bool)),
         "holders of shape (2, 7) for 2 sequence ids and 8 cells"),
        ("recheck many", lambda: many(has=np.zeros((8, 2), bool).T),
         "the holders are not a C-contiguous 2-D bool array"),
        ("recheck many", lambda: many(cols=flat._replace(pools=flat.pools[:, 0])),
         "the pools' first pairs are not a C-contiguous 2-D int64 array"),
        ("recheck many", lambda: many(cols=flat._replace(strm=flat.strm.astype(np.int32))),
         "the streams are not a C-contiguous 1-D int64 array"),
    ]
    before = state(be)
    for where, call, says in doors:
        with refused(where, says):
            call()
        assert state(be) == before, (where, says)
    # the kernels check each index as they read it (numpy's twins, before they read)
    for cells in ([0, 8], [0, -1]):
        with refused("held pairs", f"cells[1] is cell {cells[1]}, outside the stream"):
            be.kernels.held_pairs(np.array(cells), np.zeros((2, 8), bool),
                                  np.zeros(8, np.int64))
    for starts in ([0, 6], [0, -1], [0, (1 << 63) - 1]):  # pool 1 would read past the pairs
        with refused("dirty pools", "pool 1: a member pair or cell outside the arrays"):
            be.kernels.dirty_pools(np.arange(8, dtype=np.int64), np.array(starts),
                                   np.zeros(8, bool))
    with refused("dirty pools", "pool 0: a member pair or cell outside the arrays"):
        be.kernels.dirty_pools(np.arange(8, dtype=np.int64) + 8, np.array([0]),
                               np.zeros(8, bool))  # cell 8 of an 8-cell stream
    with refused("recheck ways", "sequence 0: its last kept pool is outside the layout's "
                                 "columns"):  # 3 kept of 2 pools: the last past the columns
        be.kernels.recheck_ways(np.array([0, 2]), np.array([2]), np.array([3]),
                                np.array([True]), np.arange(2), np.arange(2), True, False,
                                np.arange(1), np.zeros(8, np.int64), recheck.NO_PAIR)
    with refused("recheck ways", "cells[1] is cell 8, outside the stream"):
        be.kernels.recheck_ways(np.array([0, 2]), np.array([2]), np.array([2]),
                                np.array([True]), np.arange(2), np.arange(2), True, False,
                                np.array([0, 8]), np.zeros(8, np.int64), recheck.NO_PAIR)
    with refused("least pair", "cells[1] is cell 8, outside the stream"):
        be.kernels.least_pair(np.array([0, 8]), np.zeros(8, np.int64))
    # a free slot outside those handed out: refused before the first row is written
    free = be.slots._free
    be.slots._free = np.array([2, n + 5], np.int64)
    before = state(be)
    with refused("write_keys", f"free slots[1] is slot {n + 5}, but it may only name "
                               f"slots 1..{n - 1}"):
        be.kernels.write_rows(np.array([3, 12]), np.array([1, 2]), 0, 3)  # 12: no slot
    assert state(be) == before
    be.slots._free = free
    pooled = be.slots.pooled
    be.slots.pooled = np.asfortranarray(pooled)
    with refused("gather", "the pooled array is float32"):
        be.kernels.gather(np.array([1]))
    be.slots.pooled = pooled
    key_gen = be.slots.key_gen
    be.slots.key_gen = key_gen[:1].copy()
    with refused("kept", "the key_gen array is int64 (1,)"):
        be.kernels.fresh_groups(np.array([[0, 1, 2, 3]]), np.array([3]), np.array([0]),
                                np.array([0, 1]), np.array([3]))
    be.slots.key_gen = key_gen


def test_the_cli_reports_a_refused_plan_as_an_internal_error() -> None:
    """`kpool replay` with a backend handed a bad row: exit 2 and the PlanError's
    message (the CLI's internal-error path), no traceback, no crash."""
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from kpool_cli.backend import store\n"
        "real = store.ValueBackend.write_rows\n"
        "def spoiled(self, rows, key_ids):\n"
        "    rows = np.array(rows)\n"
        "    rows[-1] = self.n_rows + 3\n"
        "    real(self, rows, key_ids)\n"
        "store.ValueBackend.write_rows = spoiled\n"
        "from kpool_cli.cli import main\n"
        "sys.argv = ['kpool', 'replay', 'traces/shared-prefix-race.yaml', '--backend', "
        "'numba']\n"
        "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "NO_COLOR": "1"}, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "internal error" in r.stderr
    assert "PlanError: write_rows: rows[11] is row 67, but it may only name rows 0..63" \
        in r.stderr
    assert "Traceback" not in r.stderr


# -- numba's bounds checking -----------------------------------------------------------


@pytest.mark.skipif(not BOUNDSCHECK, reason="numba's bounds checking is off (NUMBA_BOUNDSCHECK)")
def test_numba_boundscheck_is_on() -> None:
    """Run with NUMBA_BOUNDSCHECK=1 (and a fresh cache): each kernel, handed an index
    past its arrays directly (no wrapper), raises IndexError itself. A read comes
    first, so a run without the checks fails there, before any write."""
    p = np.zeros((4, 8), np.float32)
    g = np.zeros((4, 8), np.int8)  # gate logits
    with pytest.raises(IndexError):
        kernels.gather(p, np.array([4], np.int64))
    one = np.array([[0, 1]], np.int64)
    gens = (np.zeros((4, 2), np.int64), np.zeros(4, np.int64))
    for spoiled in (dict(st=np.array([4])), dict(src=np.array([1])), dict(reps=np.array([4]))):
        args = dict(reps=np.array([0]), keep=np.array([True]), st=np.array([0]),
                    src=np.array([0])) | spoiled
        with pytest.raises(IndexError):
            kernels.scatter_fresh(p, g, p.copy(), *gens, 1, one, args["reps"], args["keep"],
                                  args["st"], args["src"], np.zeros((1, 8), np.float32))
    with pytest.raises(IndexError):
        kernels.pool(p, g, np.array([[0, 1, 2, 4]], np.int64))
    with pytest.raises(IndexError):
        kernels.pools_differ(p, g, p, *gens, np.zeros(4, np.int64), np.array([[0, 1]], np.int64),
                             np.array([-5], np.int64))
    with pytest.raises(IndexError):
        kernels.write_keys(np.uint64(1), np.array([4], np.int64), np.array([3], np.int64),
                           p.copy(), g.copy())


@pytest.mark.skipif(BOUNDSCHECK, reason="already running with numba's bounds checking")
def test_kernel_tests_pass_with_numba_boundscheck(tmp_path: Path) -> None:
    """This module, the numba replays of the shipped traces and the JSON writer's
    listing kernels' tests, again, in a fresh interpreter with NUMBA_BOUNDSCHECK=1
    and an empty NUMBA_CACHE_DIR: every kernel
    they call compiled with the checks, which is nearly all this test costs. So the
    child compiles each kernel once (one process, `-n 0`, not the suite's two
    workers each compiling every kernel) and without LLVM's optimisation
    (NUMBA_OPT=0: numba emits the checks while it lowers, before LLVM runs, and
    these inputs are small; docs/performance.md, "thirty-fourth session")."""
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "NUMBA_OPT": "0", "KPOOL_NUMBA_PARALLEL": "", "NO_COLOR": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "-n", "0",
         "tests/test_backend_kernels.py",
         "tests/test_shipped_traces.py::test_every_expectation_holds",
         "tests/test_report_runs.py",
         "-k", "test_backend_kernels.py or numba or listing_kernel"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "PASSED tests/test_backend_kernels.py::test_numba_boundscheck_is_on" in out, out[-3000:]
    assert "PASSED tests/test_shipped_traces.py::test_every_expectation_holds" in out, out[-3000:]
    assert "already running with numba's bounds checking" in out, out[-3000:]  # no recursion
    # the JSON writer's listing kernels write into a buffer their caller sized
    longest = "test_the_listing_kernel_writes_every_int64_and_the_longest_objects"
    assert f"PASSED tests/test_report_runs.py::{longest}" in out, out[-3000:]
    # the kernels were compiled there, with the checks, not loaded from elsewhere
    assert any((tmp_path / "numba").rglob("*.nbi")), "numba cached nothing in the fresh dir"


def test_recheck_many_scratch_is_each_threads_own() -> None:
    """`kernels.recheck_many` keeps its scratch from call to call, the verdicts among
    it until it copies them out: a Dask worker runs its tasks on threads, so two
    threads must never share it (each gets arrays of its own, held for its next
    call)."""
    import threading

    from kpool_cli.backend import kernels as k

    got: dict[str, tuple[np.ndarray, ...]] = {}

    def take(name: str) -> None:
        got[name] = k._many_scratch(4, 8, 16, 4, 8)

    threads = [threading.Thread(target=take, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, y in zip(got["a"], got["b"], strict=True):
        assert not np.shares_memory(x, y)
    take("c")
    assert all(np.shares_memory(x, y) for x, y in zip(got["c"], k._many_scratch(4, 8, 16, 4, 8),
                                                        strict=True))
