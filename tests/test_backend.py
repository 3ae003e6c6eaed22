"""The value backend (ENGINE.md §8): keys, the numba kernels against their numpy
twin (bit for bit), and the value verdicts KP001 (values), KP003 and KP004."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import ENGINES, trace
from test_engine_rules import TRACES

from kpool_cli.backend import keys, reference
from kpool_cli.backend.store import ValueBackend, kernel_module, make_backend
from kpool_cli.engine.versions import REP_ONCE, VERSIONS, EngineVersion
from kpool_cli.records import OpEvent, UbatchRecord
from kpool_cli.replay import Replayer
from kpool_cli.trace.load import load_trace, load_trace_text
from kpool_cli.trace.model import Trace

ROOT = Path(__file__).resolve().parent.parent
TRACE_FILES = sorted((ROOT / "traces").glob("*.yaml"))
kernels = kernel_module("numba")


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


def replay_values(t: Trace, engine: str | EngineVersion, backend: str = "numba"
                  ) -> tuple[list, ValueBackend]:
    version = VERSIONS[engine] if isinstance(engine, str) else engine
    be = make_backend(backend, t)
    return list(Replayer(t, version, be).run()), be


def findings(records: list, code: str) -> list:
    return [f for r in records if isinstance(r, UbatchRecord) for f in r.findings
            if f.code == code]


# -- the kernels: numba == numpy, bit for bit --------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2**63 + 5])
def test_key_rows_agree_and_are_in_range(seed: int) -> None:
    rng = np.random.default_rng(seed % 1000)
    n_rows, n_embd = 300, 48
    rows = rng.permutation(n_rows)[:200].astype(np.int64)
    ids = rng.integers(0, 2**40, 200).astype(np.int64)
    ids[:7] = 0
    state = keys.seed_state(seed)
    got = [np.zeros((n_rows, n_embd), np.float32) for _ in range(4)]
    kernels.write_keys(state, rows, ids, got[0], got[1])
    reference.write_keys(state, rows, ids, got[2], got[3])
    assert same(got[0], got[2]) and same(got[1], got[3])
    k, g = keys.key_rows(seed, ids, n_embd)
    assert same(got[0][rows], k) and same(got[1][rows], g)
    assert np.all(k[:7] == 0) and np.all(g[:7] == 0)  # key id 0: a zeroed row
    assert k.min() >= -1 and k.max() < 1
    assert set(np.unique(g[7:]).tolist()) == set(range(-keys.GATE_MAX, keys.GATE_MAX + 1))


def test_parallel_builds_agree() -> None:
    """The opt-in parallel builds (KPOOL_NUMBA_PARALLEL=1) give the serial results."""
    n = 3000
    rows = np.arange(n, dtype=np.int64)[::-1].copy()
    ids = np.arange(1, n + 1, dtype=np.int64)
    a = [np.zeros((n, 16), np.float32) for _ in range(4)]
    sig = kernels._WRITE_KEYS_SIG
    kernels._parallel("write_keys", kernels._write_keys, sig)(np.uint64(9), rows, ids, a[0],
                                                              a[1])
    kernels._write_keys_serial(np.uint64(9), rows, ids, a[2], a[3])
    assert same(a[0], a[2]) and same(a[1], a[3])
    members = np.random.default_rng(0).integers(0, n, (2000, 4)).astype(np.int64)
    out = np.empty((2000, 16), np.float32)
    kernels._parallel("pool", kernels._pool_into, kernels._POOL_SIG)(a[0], a[1], members, out)
    assert same(out, reference.pool(a[2], a[3], members))


@pytest.mark.parametrize("kpool", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 37, 5000])
def test_pool_scatter_gather_check_agree(kpool: int, n: int) -> None:
    rng = np.random.default_rng(kpool * 100 + n)
    n_rows, n_embd = 256, 32
    key = np.zeros((n_rows, n_embd), np.float32)
    gate = np.zeros((n_rows, n_embd), np.float32)
    ids = rng.integers(0, 10**6, n_rows).astype(np.int64)
    ids[::17] = 0
    reference.write_keys(keys.seed_state(3), np.arange(n_rows), ids, key, gate)
    members = rng.integers(0, n_rows, (n, kpool)).astype(np.int64)
    pk = kernels.pool(key, gate, members)
    pn = reference.pool(key, gate, members)
    assert same(pk, pn)
    # scatter (distinct rows) and gather
    pooled_k = rng.standard_normal((n_rows, n_embd)).astype(np.float32)
    pooled_n = pooled_k.copy()
    m = min(n, n_rows)
    rows = rng.permutation(n_rows)[:m].astype(np.int64)
    src = rng.integers(0, max(n, 1), m).astype(np.int64)
    kernels.scatter(pooled_k, rows, pk, src)
    reference.scatter(pooled_n, rows, pn, src)
    assert same(pooled_k, pooled_n)
    look = rng.integers(0, n_rows, 50).astype(np.int64)
    assert same(kernels.gather(pooled_k, look), reference.gather(pooled_n, look))
    # the check: rows just scattered agree with their pooling, perturbed ones do not
    if m:
        members_m = members[src]
        pooled_k[rows[0], 0] += 1
        pooled_n[rows[0], 0] += 1
        dk = kernels.pools_differ(key, gate, pooled_k, members_m, rows)
        dn = reference.pools_differ(key, gate, pooled_n, members_m, rows)
        assert np.array_equal(dk, dn)
        assert dk[0] and not dk[1:].any()


def test_pool_is_the_base2_softmax_mean() -> None:
    """A hand-checked pool: gates (1, 0) weigh 2/3 and 1/3."""
    key = np.array([[0.5], [-0.25]], np.float32)
    gate = np.array([[1.0], [0.0]], np.float32)
    for mod in (kernels, reference):
        out = mod.pool(key, gate, np.array([[0, 1]], np.int64))
        w0 = np.float32(1) / np.float32(1.5)
        w1 = np.float32(0.5) / np.float32(1.5)
        assert out[0, 0] == np.float32(w0 * key[0, 0]) + np.float32(w1 * key[1, 0])


def _final_state_agrees(t: Trace, engine: str) -> None:
    recs_k, bk = replay_values(t, engine, "numba")
    recs_n, bn = replay_values(t, engine, "numpy")
    for name in ("key", "gate", "pooled"):
        assert same(bk.row_values(name), bn.row_values(name)), name
    msgs = [[(f.code, f.message) for f in r.findings] for r in recs_k
            if isinstance(r, UbatchRecord)]
    assert msgs == [[(f.code, f.message) for f in r.findings] for r in recs_n
                    if isinstance(r, UbatchRecord)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", TRACE_FILES, ids=lambda p: p.name)
def test_backends_agree_on_shipped_traces(path: Path, engine: str) -> None:
    _final_state_agrees(load_trace(path), engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_backends_agree_on_engine_test_traces(engine: str) -> None:
    for text in TRACES:
        _final_state_agrees(trace(text), engine)


# -- keys: identity (issue point 1) -----------------------------------------------------


def _rows_after(text: str, engine: str = "rep-once") -> ValueBackend:
    _, be = replay_values(trace(text), engine)
    return be


def test_freed_and_rewritten_cell_gets_a_new_key() -> None:
    before = _rows_after("""
        kpool_trace: 1
        cache: {kv_size: 8, kpool: 2}
        ops:
          - decode: {seq: 0, pos: 0..4}
        """)
    after = _rows_after("""
        kpool_trace: 1
        cache: {kv_size: 8, kpool: 2}
        ops:
          - decode: {seq: 0, pos: 0..4}
          - seq_rm: {seq: 0, p0: 2, p1: -1}
          - decode: {seq: 0, pos: 2..4}
        """)
    bk, ak = before.row_values("key"), after.row_values("key")
    assert same(bk[:2], ak[:2])
    for r in (2, 3):  # cells 2 and 3 were freed and rewritten
        assert not np.array_equal(bk[r], ak[r])


def test_same_pos_in_two_sequences_differs() -> None:
    be = _rows_after("""
        kpool_trace: 1
        cache: {kv_size: 8, kpool: 2, n_seq_max: 2}
        ops:
          - decode:
              tokens: [{pos: 0, seq: [0]}, {pos: 0, seq: [1]}]
        """)
    key = be.row_values("key")
    assert not np.array_equal(key[0], key[1])
    assert np.any(key[0] != 0) and np.any(key[1] != 0)


def test_seq_cp_across_streams_copies_rows_whole() -> None:
    """Non-unified seq_cp: the rows (pooled slots included) are copied at the next decode."""
    be = _rows_after("""
        kpool_trace: 1
        cache: {kv_size: 8, kpool: 2, n_seq_max: 2, unified: false}
        ops:
          - decode: {seq: 0, pos: 0..4}
          - seq_cp: {src: 0, dst: 1}
          - decode: {seq: 0, pos: 4}
        """)
    key, gate, pooled = (be.row_values(n) for n in ("key", "gate", "pooled"))
    assert same(key[8:12], key[0:4]) and same(gate[8:12], gate[0:4])
    assert same(pooled[9:12:2], pooled[1:4:2]) and np.any(pooled[1] != 0)


def test_state_read_keeps_the_key_it_restores() -> None:
    t = """
        kpool_trace: 1
        cache: {kv_size: 16, kpool: 2, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 0..4}
          - state_write: {seq: 0, slot: a}
          - state_read: {seq: 1, slot: a}
        """
    be = _rows_after(t)
    key, pooled = be.row_values("key"), be.row_values("pooled")
    assert same(key[4:8], key[0:4]) and same(pooled[4:8], pooled[0:4])
    more = t.rstrip() + "\n          - decode: {seq: 1, pos: 4}\n"
    recs, _ = replay_values(trace(more), "rep-once")
    assert not findings(recs, "KP003")  # seq 1's restored pools read right


def test_backend_none_is_the_model_only_replay() -> None:
    t = load_trace(ROOT / "traces" / "shared-prefix-race.yaml")
    assert make_backend("none", t) is None
    with pytest.raises(ValueError):
        kernel_module("cuda")


# -- verdicts ---------------------------------------------------------------------------


def test_whole_copy_race_has_equal_values_under_cache_safe() -> None:
    recs, _ = replay_values(load_trace(ROOT / "traces" / "shared-prefix-race.yaml"),
                            "cache-safe")
    kp1 = findings(recs, "KP001")
    assert kp1 and all("values equal" in f.message for f in kp1)
    assert kp1[0].rows == (3, 7, 11)
    ev = kp1[0].evidence["values"]
    assert set(ev) == {3, 7, 11}
    assert ev[3] == {"equal": True, "writers": [[0, 0], [1, 0]]}
    assert not findings(recs, "KP003")


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_coupled_rep_conflict_stale_read_names_reader_pool_and_writer(backend: str) -> None:
    recs, _ = replay_values(load_trace(ROOT / "traces" / "coupled-rep-conflict.yaml"),
                            "rep-once", backend)
    assert all(r.ok for r in recs if not isinstance(r, UbatchRecord) and hasattr(r, "ok"))
    kp3 = findings(recs, "KP003")
    assert len(kp3) == 1
    f = kp3[0]
    assert f.tokens == ((4, 1),) and f.pools == ((1, 0),) and f.rows == (5,)
    assert "token (pos 4, seq 1)" in f.message and "pool 1:0" in f.message
    assert "pool 0:0's value" in f.message
    assert findings(recs, "KP002")


def test_coupled_rep_conflict_under_cache_safe_races_with_different_values() -> None:
    recs, _ = replay_values(load_trace(ROOT / "traces" / "coupled-rep-conflict.yaml"),
                            "cache-safe")
    kp1 = findings(recs, "KP001")
    assert kp1 and all("values differ" in f.message for f in kp1)
    assert "seqs 0, 1 may lose their value" in kp1[0].message
    assert kp1[0].evidence["values"][5]["equal"] is False
    kp3 = findings(recs, "KP003")
    assert any(f.tokens[0] == (4, 1) and "pool 0:0's value" in f.message for f in kp3)


def test_expects_of_the_coupled_trace_hold_under_both_engines() -> None:
    t = load_trace(ROOT / "traces" / "coupled-rep-conflict.yaml")
    for engine in ENGINES:
        recs, _ = replay_values(t, engine)
        bad = [r.message for r in recs if hasattr(r, "ok") and not r.ok]
        assert not bad, (engine, bad)


ROW_ZERO = dataclasses.replace(REP_ONCE, name="rep-once-row-zero", padding="row-zero")

# cell 0 is the rep of pool 0 (members at cells 1, 2, 3, 0): padding to row 0 hits it
PAD_HITS_REP = """
    kpool_trace: 1
    cache: {kv_size: 16, kpool: 4}
    ops:
      - decode:
          tokens:
            - {pos: 0, seq: [0], cell: 1}
            - {pos: 1, seq: [0], cell: 2}
            - {pos: 2, seq: [0], cell: 3}
            - {pos: 3, seq: [0], cell: 0}
      - decode: {seq: 0, pos: 4}
    """


def test_pad_collision_with_row_zero_padding_corrupts_a_real_pool() -> None:
    recs, _ = replay_values(trace(PAD_HITS_REP), ROW_ZERO)
    kp4 = findings(recs, "KP004")
    assert kp4 and kp4[0].rows == (0,) and kp4[0].pools == ((0, 0),)
    kp3 = findings(recs, "KP003")
    assert kp3 and kp3[-1].pools == ((0, 0),) and "a padding entry's value" in kp3[-1].message
    recs, _ = replay_values(trace(PAD_HITS_REP), "rep-once")
    assert not findings(recs, "KP004") and not findings(recs, "KP003")


def test_cli_backend_option() -> None:
    from click.testing import CliRunner

    from kpool_cli.cli import cli

    path = str(ROOT / "traces" / "coupled-rep-conflict.yaml")
    for backend in ("numba", "numpy", "none"):
        r = CliRunner().invoke(cli, ["replay", path, "--backend", backend, "--format", "json",
                                     "--engine", "rep-once"])
        assert r.exit_code == 1, r.output
        assert f'"backend": {"null" if backend == "none" else chr(34) + backend + chr(34)}' \
            in r.output
        summary = json.loads(r.output)["summary"]["findings"]
        assert ("KP003" in summary) == (backend != "none")


def test_repooling_one_side_of_a_rep_conflict_stales_the_other() -> None:
    """rep-once: re-pooling pool 1:0 (seq 1 staled by a zero seq_add) overwrites row 5,
    so seq 0's pool 0:0, neither new nor rebuilt, now reads seq 1's value."""
    recs, _ = replay_values(trace("""
        kpool_trace: 1
        cache: {kv_size: 32, kpool: 4, n_seq_max: 2}
        ops:
          - decode: {seq: 0, pos: 0..2}
          - decode: {seq: 1, pos: 0..2}
          - decode: {seq: [0, 1], pos: 2}
          - decode: {seq: [0, 1], pos: 3}
          - seq_add: {seq: 1, p0: 0, p1: -1, shift: 0}
          - decode: {seq: 1, pos: 4}
          - decode: {seq: 0, pos: 4}
        """), "rep-once")
    kp3 = findings(recs, "KP003")
    assert [f.tokens for f in kp3] == [((4, 0),)]
    assert "pool 1:0's value (written at ubatch 4)" in kp3[0].message


def test_pool_bits_construction_matches_the_pow2_table():
    """kernels._pool_entry builds 2**-(max - g) from float32 bits; keys.POW2 is the
    table the numpy twin reads: they must be the same numbers for every gate gap."""
    from kpool_cli.backend import kernels, reference
    from kpool_cli.backend.keys import GATE_MAX

    gaps = np.arange(2 * GATE_MAX + 1)
    # one entry per gap: member 0 has gate GATE_MAX, member 1 has GATE_MAX - gap
    n_embd = 1
    key = np.ones((2 * gaps.size, n_embd), dtype=np.float32)
    key[1::2] = 0.0  # the pooled value is member 0's weight: 1 / (1 + 2**-gap)
    gate = np.empty_like(key)
    gate[0::2, 0] = GATE_MAX
    gate[1::2, 0] = GATE_MAX - gaps
    members = np.arange(2 * gaps.size, dtype=np.int64).reshape(-1, 2)
    a = kernels.pool(key, gate, members)
    b = reference.pool(key, gate, members)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    p = (2.0 ** -gaps).astype(np.float32)  # exact
    assert np.array_equal(a[:, 0], np.float32(1.0) / (np.float32(1.0) + p))


def test_llama_kv_cache_clear_keeps_the_copy_that_then_overwrites_a_restore():
    """llama_kv_cache::clear leaves the queued cross-stream copy (sc_info) in place, and
    llama_kv_cache::update applies it at the next decode, copying the source stream's
    rows as they are then (zero, after the clear) over the destination's: the rows a
    state_read put in stream 1 between the two are overwritten. Rows: stream s is
    global rows 8 * s + cell; the restore places seq 1's 4 tokens in cells 0..3."""
    t = load_trace_text(textwrap.dedent("""\
        kpool_trace: 1
        cache: {kv_size: 8, kpool: 2, n_seq_max: 2, unified: false}
        ops:
          - decode: {seq: 0, pos: 0..4}
          - state_write: {seq: 0, slot: a}
          - seq_cp: {src: 0, dst: 1}
          - clear: {}
          - state_read: {seq: 1, slot: a}
          - decode: {seq: 1, pos: 4}
        """))
    backend = ValueBackend(t.cache, t.seed, "numpy")
    rp = Replayer(t, VERSIONS["rep-once"], backend)
    restored = None
    for rec in rp.run():
        if isinstance(rec, OpEvent) and rec.kind == "state_read":
            restored = backend.row_values("key", np.arange(8, 12))
    assert restored is not None and np.any(restored != 0)
    after = backend.row_values("key", np.arange(8, 12))
    assert not np.any(after)  # the pending copy of the cleared stream 0 landed on them
    assert np.any(backend.row_values("key", np.array([12])))  # the decode's own row
