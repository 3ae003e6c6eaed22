"""The value backend (ENGINE.md §8): keys, the numba backend against its numpy
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

from kpool_cli.backend.store import ValueBackend, kernel_module, make_backend
from kpool_cli.contracts.records import OpEvent, UbatchRecord
from kpool_cli.replay import Replayer
from kpool_cli.trace.load import load_trace, load_trace_text
from kpool_cli.trace.model import Trace
from kpool_cli.versions import REP_ONCE, VERSIONS, EngineVersion

ROOT = Path(__file__).resolve().parent.parent
TRACE_FILES = sorted((ROOT / "traces").glob("*.yaml"))


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


# -- replays: numba == numpy, bit for bit (the kernels: test_backend_kernels.py) ----


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


# -- keys: identity -----------------------------------------------------------------


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
        cache: {kv_size: 8, kpool: 2, n_rs_seq: 2}
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


@pytest.mark.parametrize("trace", ["coupled-rep-conflict.yaml", "shared-prefix-race.yaml"])
def test_the_facts_say_every_group_equal_exactly_when_it_is(monkeypatch, trace: str) -> None:
    """`ValueFacts.all_equal` (KP001 keys its valued finding by it): said of a ubatch
    exactly when every race group's entries write equal values; the coupled trace's
    cache-safe race has a group whose values differ, the shared prefix's none."""
    got = []
    run_ubatch = ValueBackend.run_ubatch

    def kept(self, ctx, written=None):  # type: ignore[no-untyped-def]
        facts = run_ubatch(self, ctx, written)
        got.append((facts.all_equal, bool(facts.equal.all())))
        return facts

    monkeypatch.setattr(ValueBackend, "run_ubatch", kept)
    replay_values(load_trace(ROOT / "traces" / trace), "cache-safe")
    assert got and all(said == true for said, true in got)
    assert any(not true for _, true in got) == (trace == "coupled-rep-conflict.yaml")


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
