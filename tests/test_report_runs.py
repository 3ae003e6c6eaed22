"""The report's run form (docs/FORMATS.md): pools and scatter entries that follow
each other are written as one run, finding pools as [seq, k0, k1], and KP001's value
evidence is capped; `--pools all` keeps the full listing; `kpool diff` and the
schema read both forms. The expected runs are worked out by hand from the traces."""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from test_diff_inputs import RACE, diff, mutated, refused, save

from kpool_cli.cli import cli
from kpool_cli.contracts.finding import Finding, PoolIds, RowIds
from kpool_cli.contracts.records import Pools
from kpool_cli.contracts.report_format import report_schema
from kpool_cli.engine.layout import PoolGrowth
from kpool_cli.report.json_report import (
    finding_json,
    pool_ids_json,
    pools_json,
    rows_json,
    scatter_json,
)
from kpool_cli.report.json_text import dumps
from kpool_cli.verdict.codes import CODES


def replay(*args: str) -> dict:
    r = CliRunner().invoke(cli, ["replay", *args, "--format", "json", "--backend", "none"])
    assert r.exit_code in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_pools_that_follow_each_other_are_one_run():
    """kpool 2. Pools 0..2 of seq 0 on rows 0..5 (pos 0..5) follow each other: one
    run {k: [0, 3], first_pos 0, cells: [0, 1, 2]} (first row 0, members 1 apart,
    pools 2 apart). Pool 3 is on rows 8, 9: 4 past pool 2, not 2, so alone; pool 0
    of seq 1 (rows 10, 11) is another sequence: alone (a run needs two pools)."""
    seq = np.array([0, 0, 0, 0, 1])
    k = np.array([0, 1, 2, 3, 0])
    first = np.array([0, 2, 4, 6, 0])
    cells = np.array([[0, 1], [2, 3], [4, 5], [8, 9], [10, 11]])
    p = Pools(seq, k, first, first + 1, cells, cells[:, 1], np.ones(5, dtype=bool))
    assert pools_json(p, 2) == [
        {"seq": 0, "k": [0, 3], "first_pos": 0, "cells": [0, 1, 2], "new": True},
        {"seq": 0, "k": 3, "first_pos": 6, "last_pos": 7, "cells": [8, 9], "rep": 9,
         "new": True},
        {"seq": 1, "k": 0, "first_pos": 0, "last_pos": 1, "cells": [10, 11], "rep": 11,
         "new": True},
    ]
    assert len(pools_json(p, 0)) == 5  # no run form: one object per pool


def test_pools_of_interleaved_slots_are_runs_with_steps():
    """Three slots decoding one token each per ubatch (kpool 2): slot s's tokens land
    on rows 3 t + s, so its pool k has members 6 k + s and 6 k + s + 3. Slot 1's
    pools 0..2: one run, cells [1, 3, 6] (first row 1, members 3 apart, pools 6)."""
    k = np.arange(3)
    cells = np.stack([6 * k + 1, 6 * k + 4], axis=1)
    p = Pools(np.ones(3, np.int64), k, 2 * k, 2 * k + 1, cells, cells[:, 1],
              np.zeros(3, dtype=bool))
    assert pools_json(p, 2) == [
        {"seq": 1, "k": [0, 3], "first_pos": 0, "cells": [1, 3, 6], "new": False}]


def test_evenly_spaced_rows_are_a_row_run():
    """Rows 1, 2, then 3, 7, .., 39 (10 rows 4 apart), then 50: the 10 are a run [3,
    43, 4]; the other three are listed. Fewer than 8 evenly spaced rows stay listed."""
    rows = (1, 2, *range(3, 40, 4), 50)
    assert rows_json(rows) == ([1, 2, 50], [[3, 43, 4]])
    assert rows_json((0, 2, 4, 6, 8, 10, 12)) == ([0, 2, 4, 6, 8, 10, 12], [])


def test_finding_pools_fold():
    """(0,0),(0,1),(0,2),(1,5),(1,7): [[0, 0, 3], [1, 5], [1, 7]]."""
    assert pool_ids_json(PoolIds(((0, 0), (0, 1), (0, 2), (1, 5), (1, 7)))) == [
        [0, 0, 3], [1, 5], [1, 7]]
    out = finding_json(Finding(CODES["KP002"], "m", rows=(3,), pools=((0, 0), (0, 1))))
    assert out["pools"] == [[0, 0, 2]]


def _folded_by_hand(pairs: list[tuple[int, int]]) -> list[list[int]]:
    """FORMATS.md "Runs", a pool at a time: a pool that continues the last stretch (same
    seq, k one more) joins it; a stretch of two or more is [seq, k0, k1]."""
    stretches: list[list[int]] = []
    for s, k in pairs:
        if stretches and stretches[-1][0] == s and stretches[-1][2] == k:
            stretches[-1][2] = k + 1
        else:
            stretches.append([s, k, k + 1])
    return [[s, k0, k1] if k1 - k0 >= 2 else [s, k0] for s, k0, k1 in stretches]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 6)), max_size=40))
def test_finding_pools_fold_as_a_pool_at_a_time_would(pairs):
    """Any (seq, k) list, repeats and steps back included: the fold is the stretches of
    one sequence's consecutive k, as a walk of the pairs finds them."""
    assert pool_ids_json(PoolIds(tuple(pairs))) == _folded_by_hand(pairs)


def test_the_race_trace_is_written_in_runs_and_pools_all_in_full():
    """shared-prefix-race under cache-safe, its last ubatch: seq 0's pools 0..2 on rows
    0..11 (kpool 4) are a run, and so are seq 1's (it shares them); the scatter writes
    the same rows twice, as two runs of 3 entries from row 0, members 1 apart, entries
    4 apart. With --pools all every pool is an object again. Both documents validate
    against `kpool schema report`."""
    runs = replay(RACE, "--engine", "cache-safe")
    full = replay(RACE, "--engine", "cache-safe", "--pools", "all")
    schema = report_schema()
    for doc in (runs, full):
        jsonschema.validate(doc, schema)
    last = runs["ubatches"][-1]
    assert {"seq": 0, "k": [0, 3], "first_pos": 0, "cells": [0, 1, 4], "new": True} \
        in last["pools"]
    assert [e for e in last["scatter"] if "rep" not in e] == [
        {"n": 3, "cells": [0, 1, 4], "pad": False}] * 2
    assert all(isinstance(p["k"], int) for u in full["ubatches"] for p in u["pools"])
    assert all("rep" in e for u in full["ubatches"] for e in u["scatter"])


def test_diff_reads_both_forms_as_the_same_run(tmp_path):
    a = save(tmp_path, "a.json", replay(RACE, "--engine", "cache-safe"))
    b = save(tmp_path, "b.json", replay(RACE, "--engine", "cache-safe", "--pools", "all"))
    code, out, err = diff(a, b)
    assert code == 0 and "no differences" in out, err


@pytest.mark.parametrize(("field", "value", "says"), [
    ("cells", [0, 12], "expected [first row, member step, entry step]"),
    ("cells", [-1, 1, 4], "expected [first row, member step, entry step]"),
    ("n", 10**6, "a run of 1000000 entries in a ubatch of"),
    ("n", 1, "a run of 1 entries"),
])
def test_a_bad_scatter_run_is_located(tmp_path, field, value, says):
    doc = replay(RACE, "--engine", "cache-safe")
    i = next(i for i, u in enumerate(doc["ubatches"])
             for j, e in enumerate(u["scatter"]) if "rep" not in e)
    j = next(j for j, e in enumerate(doc["ubatches"][i]["scatter"]) if "rep" not in e)
    a = save(tmp_path, "a.json", doc)
    b = save(tmp_path, "b.json", mutated(doc, f"ubatches.{i}.scatter.{j}.{field}", value))
    err = refused(a, b)
    assert f"report.ubatches[{i}].scatter[{j}].{field}" in err and says in err


def test_kp001_value_evidence_lists_64_rows_and_counts_the_rest(tmp_path):
    """cache-safe, kpool 4: seq 0 holds pos 0..299 (75 pools, rows 3, 7, .., 299), seq 1
    shares them (whole seq_cp), so the next decode of seq 0 re-pools all 150 pools:
    each of the 75 rep rows is written twice with equal values. KP001 names all 75
    rows (one row run); its evidence per row lists the first 64 (rows 3..255) and
    counts 11."""
    t = tmp_path / "t.yaml"
    t.write_text("kpool_trace: 1\ncache: {kv_size: 512, kpool: 4, n_seq_max: 2}\nops:\n"
                 "  - decode: {seq: 0, pos: 0..300}\n  - seq_cp: {src: 0, dst: 1}\n"
                 "  - decode: {seq: 0, pos: 300}\n")
    doc = json.loads(CliRunner().invoke(cli, [
        "replay", str(t), "--engine", "cache-safe", "--backend", "numpy", "--format",
        "json"]).stdout)
    (kp1,) = [f for f in doc["ubatches"][-1]["findings"] if f["code"] == "KP001"]
    assert kp1["rows"] == [] and kp1["row_runs"] == [[3, 303, 4]]  # rows 3, 7, .., 299
    ev = kp1["evidence"]
    assert list(ev["entries_per_row"]) == [str(r) for r in range(3, 256, 4)]
    assert set(ev["entries_per_row"].values()) == {2}
    assert ev["entries_per_row_not_listed"] == 11
    assert list(ev["values"]) == [str(r) for r in range(3, 256, 4)]
    assert ev["values_not_listed"] == 11
    assert all(v["equal"] and v["writers"] == [[0, (int(r) - 3) // 4], [1, (int(r) - 3) // 4]]
               for r, v in ev["values"].items())


def test_finding_pools_compare_as_the_pairs_they_stand_for():
    """A finding given pools as pairs holds them as PoolIds: equal to the same pairs as a
    tuple or as PoolIds, unequal to others, iterating the pairs in order."""
    f = Finding(CODES["KP001"], "m", pools=[(1, 2), (0, 5)])
    assert f.pools == ((1, 2), (0, 5)) and f.pools == PoolIds([(1, 2), (0, 5)])
    assert f.pools != ((0, 5), (1, 2)) and f.pools != PoolIds([(1, 2)])
    assert list(f.pools) == [(1, 2), (0, 5)] and len(f.pools) == 2
    assert f == Finding(CODES["KP001"], "m", pools=PoolIds.of(np.array([1, 0]), np.array([2, 5])))
    assert not Finding(CODES["KP001"], "m").pools


def test_finding_rows_compare_as_the_ints_they_stand_for():
    """A finding given rows as an array, a list or a tuple holds them as RowIds, one
    read-only array: equal to the same ints as a tuple or as RowIds (so a finding
    built from an array equals one built from a tuple, and hashes alike with it as
    RowIds), unequal to others, iterating plain ints in order."""
    f = Finding(CODES["KP001"], "m", rows=np.array([7, 3, 11]))
    assert f.rows == (7, 3, 11) and f.rows == RowIds([7, 3, 11])
    assert (7, 3, 11) == f.rows  # noqa: SIM300 - the tuple on the left: the reflected test
    assert f.rows != (3, 7, 11) and f.rows != RowIds([7, 3]) and f.rows != (7, 3, 11, 0)
    assert list(f.rows) == [7, 3, 11] and all(type(r) is int for r in f.rows)
    assert f == Finding(CODES["KP001"], "m", rows=(7, 3, 11))
    assert hash(f) == hash(Finding(CODES["KP001"], "m", rows=[7, 3, 11]))
    assert not f.rows.array.flags.writeable and not Finding(CODES["KP001"], "m").rows
    assert repr(f.rows) == "RowIds((7, 3, 11))"


@pytest.mark.parametrize("value", [
    {"name": "\u202eevil", "k": [1, 2]},  # a bidi control: orjson's text is not ASCII
    {"name": "caf\u00e9 \U0001f600 \x1b[2J \u2028"},
    {"name": "\ud800"},  # a lone surrogate: orjson refuses it
    {"runs": [[0, 3, 1]], "n": -(1 << 62), "ok": True, "none": None},
    {"values": {3: [1, 2], 7: []}},  # KP001's evidence: rows as keys, read back as "3"
])
def test_a_report_value_is_compact_ascii_json_that_reads_back(value):
    """json_report.dumps: every character past ASCII escaped (no raw bidi control or
    terminal escape reaches a terminal that shows the report), compact, and equal to
    the value when read back, on both of its paths (orjson's, json's)."""
    text = dumps(value)
    assert text.isascii()
    assert ", " not in text and '": ' not in text
    assert json.loads(text) == json.loads(json.dumps(value))  # int keys become strings


# JSON values as kpool's documents hold them, and the ones orjson writes otherwise:
# floats of every magnitude (1e-9 to 1e-4 among them), ints past 64 bits, text past
# ASCII, DEL and lone surrogates (which `st.text` never draws), int keys
_ODD_TEXT = st.sampled_from(["\x7f", "a\x7fb", "\ud800", "x\udcff", "\x00\x1f\x7f"])
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e-05, 1.5e-07, -3e-09, 0.0001, 1e16, 1e-10, 0.00012])
    | st.text(max_size=8) | _ODD_TEXT,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=4) | _ODD_TEXT | st.integers(-5, 5), inner,
                      max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES)
def test_json_text_is_what_json_writes_byte_for_byte(value):
    """json_text.dumps, both layouts, is json.dumps's text (where orjson writes a
    float, a character or a big int otherwise, json's own)."""
    assert dumps(value) == json.dumps(value, separators=(",", ":"))
    assert dumps(value, indent=True) == json.dumps(value, indent=2)


def test_json_text_takes_orjson_where_it_is_json():
    """The floats json writes apart (`1e-05`, `1e-07`) are json's text; the rest is
    orjson's, whose float text json shares at 1e-4 and 1e16."""
    assert dumps({"r": [1e-05, 1.5e-07]}) == '{"r":[1e-05,1.5e-07]}'
    assert dumps({"r": [0.0001, 1e16, 2.5]}, indent=True) == (
        '{\n  "r": [\n    0.0001,\n    1e+16,\n    2.5\n  ]\n}')


def test_json_text_escapes_del_as_json_does():
    """DEL is ASCII, so orjson's text of it passed the ASCII test, raw, where json
    writes `\\u007f` (its ensure_ascii escapes every character outside space..`~`): `kpool check
    --output-format json` of a file `r<DEL>.yaml` wrote `"r<DEL>.yaml"`, where it
    had written `"r\\u007f.yaml"` before the JSON documents went through orjson."""
    assert dumps({"path": "r\x7f.yaml"}) == '{"path":"r\\u007f.yaml"}'
    assert dumps(["\x7f"], indent=True) == '[\n  "\\u007f"\n]'


def test_a_report_value_json_cannot_write_is_refused_as_json_refuses_it():
    """A dataclass or a datetime leaking into a record is a kpool bug: `dumps` refuses
    it (TypeError, as json does) rather than writing what orjson would make of it."""
    import dataclasses
    import datetime

    @dataclasses.dataclass
    class Leak:
        x: int = 1

    for value in ({"x": Leak()}, {"t": datetime.datetime(2026, 12, 3)}):
        with pytest.raises(TypeError):
            dumps(value)


def _spans_both(kind: str, *args) -> list[list[int]]:
    """contracts/runs.py's spans and the compiled core's for the same columns: equal."""
    from kpool_cli.compiled import runs as compiled_runs
    from kpool_cli.contracts import runs

    want = getattr(runs, kind)(*args).tolist()
    assert getattr(compiled_runs, kind)(*args).tolist() == want, (kind, args)
    return want


def test_scatter_spans_by_hand_on_both_cores():
    """kpool 2, entries i pooling rows [c, c + 1] into c + 1. First members 0, 2, 4, 6
    (step 2 throughout): one run [0, 4). Entry 2 padding: entries 0, 1 run, 3 alone.
    First members 0, 2, 6, 12 (steps 2, 4, 6): entries 0, 1 run; the pair 1, 2 is
    linked but steps 4 after 2, so starts none; the pair 2, 3 steps 6 after the
    linked pair's 4, so starts none either: [[0, 2]] alone. An entry whose rep row is
    not its last member, or whose members do not step evenly (kpool 3), breaks."""
    def entries(firsts, kpool=2, d=1):
        rows = np.array([[c + j * d for j in range(kpool)] for c in firsts], dtype=np.int64)
        return rows, rows[:, -1].copy(), np.zeros(len(firsts), dtype=bool)

    rows, rep, pad = entries([0, 2, 4, 6])
    assert _spans_both("scatter_spans", rows, rep, pad) == [[0, 4]]
    pad[2] = True
    assert _spans_both("scatter_spans", rows, rep, pad) == [[0, 2]]
    assert _spans_both("scatter_spans", *entries([0, 2, 6, 12])) == [[0, 2]]
    rows, rep, pad = entries([0, 2, 4, 6])
    rep[1] = 2  # entry 1 writes its first member
    assert _spans_both("scatter_spans", rows, rep, pad) == [[2, 4]]
    rows, rep, pad = entries([0, 10, 20, 30, 40], kpool=3, d=2)
    rows[2, 2] += 1  # entry 2's members 20, 22, 25: not evenly
    rep = rows[:, -1].copy()
    assert _spans_both("scatter_spans", rows, rep, pad) == [[0, 2], [3, 5]]
    assert _spans_both("scatter_spans", rows[:1], rep[:1], pad[:1]) == []
    rows, rep, pad = entries([0, 2])
    pad[1] = True  # a decode step's pool and its padding: one real entry, no run
    assert _spans_both("scatter_spans", rows, rep, pad) == []


def test_pool_spans_by_hand_on_both_cores():
    """The pools of `test_pools_that_follow_each_other_are_one_run`: [[0, 3]]. With
    pool 1 not new, pools 0, 1 and 1, 2 are not linked; pools 2, 3 are (pool 3 is 4
    rows past pool 2 where pool 2 was 2 past pool 1, but that pair is not linked
    now, so no step came before): [[2, 4]]. Pool k0 + i must also sit kpool positions
    past the one before: pool 1 moved to pos 3 breaks both its links, which leaves
    [[2, 4]] again."""
    seq = np.array([0, 0, 0, 0, 1])
    k = np.array([0, 1, 2, 3, 0])
    first = np.array([0, 2, 4, 6, 0])
    cells = np.array([[0, 1], [2, 3], [4, 5], [8, 9], [10, 11]])
    new = np.ones(5, dtype=bool)
    p = Pools(seq, k, first, first + 1, cells, cells[:, 1], new)
    assert _spans_both("pool_spans", p) == [[0, 3]]
    new[1] = False
    assert _spans_both("pool_spans", Pools(seq, k, first, first + 1, cells, cells[:, 1],
                                           new)) == [[2, 4]]
    moved = first.copy()
    moved[1] = 3
    assert _spans_both("pool_spans", Pools(seq, k, moved, moved + 1, cells, cells[:, 1],
                                           np.ones(5, dtype=bool))) == [[2, 4]]


def _random_listing(rng: np.random.Generator, kpool: int
                    ) -> tuple[Pools, np.ndarray, np.ndarray, np.ndarray]:
    """A random listing built of arithmetic stretches with a few defects each (a
    padding entry, a rep off its last member, a member off its step, a new sequence,
    a skipped k, a flipped `new`, a position off): its pools, and the scatter entries
    of the same rows (member rows, rep rows, padding)."""
    n = int(rng.integers(0, 40))
    first = np.cumsum(rng.choice([1, 2, 4, 8], n)).astype(np.int64)
    first[rng.random(n) < 0.1] += 3
    d = rng.choice([1, 1, 1, 2, 64], n) if rng.random() < 0.3 else np.full(n, 1)
    cells = (first[:, None] * kpool + np.arange(kpool)[None, :] * d[:, None]).astype(np.int64)
    cells[rng.random((n, kpool)) < 0.02] += 1
    rep = cells[:, -1].copy()
    rep[rng.random(n) < 0.05] += 1
    pad = rng.random(n) < 0.05
    seq = np.cumsum(rng.random(n) < 0.1).astype(np.int64)
    k = np.arange(n, dtype=np.int64) + np.cumsum(rng.random(n) < 0.05)
    pos = (np.arange(n, dtype=np.int64) * kpool
           + np.cumsum(rng.random(n) < 0.05) * kpool + (rng.random(n) < 0.03))
    last = pos + kpool - 1 + (rng.random(n) < 0.03)
    new = rng.random(n) < 0.95
    return Pools(seq, k, pos, last, cells, rep, new), cells, rep, pad


@pytest.mark.parametrize("kpool", [1, 2, 3, 4])
def test_spans_agree_on_random_listings(kpool: int):
    """On random listings (`_random_listing`), the compiled core's spans are
    contracts/runs.py's, and both runs and singles are exercised."""
    rng = np.random.default_rng(kpool)
    n_runs = 0
    for _ in range(300):
        p, cells, rep, pad = _random_listing(rng, kpool)
        n_runs += len(_spans_both("scatter_spans", cells, rep, pad))
        n_runs += len(_spans_both("pool_spans", p))
    assert n_runs > 100


@pytest.mark.parametrize("kpool", [1, 2, 3, 4])
def test_the_listing_kernel_writes_what_orjson_writes_of_the_lists(kpool: int):
    """json_report.pools_text and scatter_text (the listing kernels, from columns) give
    the bytes orjson gives of pools_json and scatter_json (one object each), for
    random listings (`_random_listing`) in the run form, with their spans (by
    contracts/runs.py's rule) handed in or found, and in full (kpool 0); with
    negative and 19-digit values in some, within 2**62 of zero (the kernels compute
    a run's ends and steps in int64, where Python's ints would not wrap: the trace
    format keeps rows, positions and pool indices far below). Runs and singles both
    written."""
    import orjson

    from kpool_cli.contracts import runs
    from kpool_cli.report import json_kernels
    from kpool_cli.report.json_report import pools_text, scatter_text

    def text(fragment: orjson.Fragment) -> bytes:
        return orjson.dumps([fragment])[1:-1]

    rng = np.random.default_rng(70 + kpool)
    n_runs = n_singles = 0
    for i in range(300):
        p, cells, rep, pad = _random_listing(rng, kpool)
        if i % 5 == 0 and len(p):  # far values, where no run forms across them
            for col in (p.first_pos, p.last_pos, cells, rep, p.k):
                col[rng.random(col.shape) < 0.2] = rng.choice(
                    [-1, -10, -(1 << 62), (1 << 62) - 1, 10**18, -(10**18) - 7])
        found = SimpleNamespace(scatter_rows=cells, scatter_rep=rep, scatter_pad=pad,
                                scatter_spans=None)
        given = SimpleNamespace(scatter_rows=cells, scatter_rep=rep, scatter_pad=pad,
                                scatter_spans=runs.scatter_spans(cells, rep, pad))
        spans = runs.pool_spans(p)
        for form in (kpool, 0):
            want = orjson.dumps(pools_json(p, form))
            assert text(pools_text(json_kernels, p, form, None)) == want
            assert text(pools_text(json_kernels, p, form, spans)) == want
            want = orjson.dumps(scatter_json(found, form))
            assert text(scatter_text(json_kernels, found, form)) == want
            assert text(scatter_text(json_kernels, given, form)) == want
        listed = pools_json(p, kpool) + scatter_json(found, kpool)
        n_runs += sum("rep" not in o for o in listed)
        n_singles += sum("rep" in o for o in listed)
    assert n_runs > 100 and n_singles > 100


def test_the_listing_kernel_writes_tokens_as_orjson_does():
    """json_report.tokens_text (the listing kernel) gives the bytes orjson gives of
    tokens_json: random ubatches of 0-40 tokens, each of one to four sequences (one
    each in some ubatches), with M-RoPE's ext or without, negative and 19-digit
    positions in some."""
    import orjson

    from kpool_cli.report import json_kernels
    from kpool_cli.report.json_report import tokens_json, tokens_text

    rng = np.random.default_rng(90)
    n_ext = n_many = 0
    for i in range(400):
        n = int(rng.integers(0, 41))
        pos = rng.integers(-5, 1 << 20, n)
        if i % 7 == 0 and n:
            pos[rng.random(n) < 0.3] = rng.choice([-(10**18), 10**18 + 3, (1 << 62)])
        most = 1 if i % 3 == 0 else 4
        seqs = tuple(tuple(int(x) for x in rng.choice(64, int(rng.integers(1, most + 1)),
                                                         replace=False)) for _ in range(n))
        ext = rng.integers(-3, 1000, (n, 2)) if i % 2 else None
        record = SimpleNamespace(token_pos=pos, token_seqs=seqs,
                                 token_rows=rng.integers(0, 1 << 30, n), token_ext=ext)
        assert orjson.dumps([tokens_text(json_kernels, record)])[1:-1] == orjson.dumps(
            tokens_json(record))
        n_ext += ext is not None and n > 0
        n_many += any(len(ss) > 1 for ss in seqs)
    assert n_ext > 100 and n_many > 100


def test_the_listing_kernel_writes_every_int64_and_the_longest_objects():
    """Each integer as orjson writes it: the int64 extremes, zero, and the powers of
    ten and their neighbours of either sign (one scatter entry each, no run). And
    the longest objects there are, each field a 20-character integer (the int64
    minimum alone; runs of such values too, whose steps still fit), written by the
    kernels whole: each kernel checks the room of each object against the bound
    its caller worked out (`_object_most`), so a bound too short fails here (and
    the NUMBA_BOUNDSCHECK=1 child runs this too)."""
    import orjson

    from kpool_cli.contracts import runs
    from kpool_cli.report import json_kernels
    from kpool_cli.report.json_report import pools_text, scatter_text, tokens_json, tokens_text

    def text(fragment: orjson.Fragment) -> bytes:
        return orjson.dumps([fragment])[1:-1]

    tens = [10**e + d for e in range(19) for d in (-1, 0, 1)]
    values = np.array(sorted({0, -(1 << 63), (1 << 63) - 1, *tens, *(-t for t in tens)}),
                      dtype=np.int64)
    rows = np.column_stack((values, values[::-1]))
    record = SimpleNamespace(scatter_rows=rows, scatter_rep=values,
                             scatter_pad=np.arange(values.size) % 2 == 0, scatter_spans=None)
    assert text(scatter_text(json_kernels, record, 0)) == orjson.dumps(scatter_json(record, 0))
    low = -(1 << 63)
    for members in (1, 4):
        n = 24
        full = np.full(n, low, dtype=np.int64)
        p = Pools(full, full, full, full, np.tile(full[:, None], members), full,
                  np.zeros(n, dtype=bool))
        entries = SimpleNamespace(scatter_rows=p.cells, scatter_rep=full,
                                  scatter_pad=np.zeros(n, dtype=bool), scatter_spans=None)
        assert text(pools_text(json_kernels, p, 0, None)) == orjson.dumps(pools_json(p, 0))
        assert text(scatter_text(json_kernels, entries, 0)) == orjson.dumps(
            scatter_json(entries, 0))
        # runs of 20-character values: pool i of seq `low` at k low + i, first_pos
        # low + 4 members i, its member j on row low + 1000 i + j
        i = np.arange(n, dtype=np.int64)
        cells = (low + 1000 * i)[:, None] + np.arange(members, dtype=np.int64)[None, :]
        ran = Pools(full, low + i, low + members * i, low + members * i + members - 1, cells,
                    cells[:, -1].copy(), np.ones(n, dtype=bool))
        entries = SimpleNamespace(scatter_rows=cells, scatter_rep=cells[:, -1].copy(),
                                  scatter_pad=np.zeros(n, dtype=bool), scatter_spans=None)
        assert runs.pool_spans(ran).tolist() == [[0, n]]
        assert text(pools_text(json_kernels, ran, members, None)) == orjson.dumps(
            pools_json(ran, members))
        assert text(scatter_text(json_kernels, entries, members)) == orjson.dumps(
            scatter_json(entries, members))
    tokens = SimpleNamespace(token_pos=np.full(5, low), token_seqs=((low,) * 4,) * 5,
                             token_rows=np.full(5, low), token_ext=np.full((5, 2), low))
    assert text(tokens_text(json_kernels, tokens)) == orjson.dumps(tokens_json(tokens))


@pytest.mark.parametrize("spans", [[[20, 39]], [[0, 2], [0, 19]], [[0, 1]], [[3, 5], [1, 3]]])
def test_the_listing_kernel_refuses_spans_that_are_not_runs_of_the_listing(spans):
    """Spans past the listing, overlapping, of one item or out of order are a kpool
    defect: the kernel refuses them (ValueError), having written nothing past its
    buffer, rather than take a buffer sized by them on trust."""
    from kpool_cli.report import json_kernels
    from kpool_cli.report.json_report import pools_text, scatter_text

    n = 20
    cells = np.arange(4 * n, dtype=np.int64).reshape(n, 4)
    ks = np.arange(n, dtype=np.int64)
    p = Pools(np.zeros(n, dtype=np.int64), ks, 4 * ks, 4 * ks + 3, cells, cells[:, -1].copy(),
              np.ones(n, dtype=bool))
    bad = np.array(spans, dtype=np.int64)
    with pytest.raises(ValueError, match="not runs of it"):
        pools_text(json_kernels, p, 4, bad)
    entries = SimpleNamespace(scatter_rows=cells, scatter_rep=p.rep,
                              scatter_pad=np.zeros(n, dtype=bool), scatter_spans=bad)
    with pytest.raises(ValueError, match="not runs of it"):
        scatter_text(json_kernels, entries, 4)


def _take(p: Pools, pad: np.ndarray, at: np.ndarray) -> tuple[Pools, np.ndarray]:
    """The entries `at` of a listing and of its padding."""
    return Pools(p.seq[at], p.k[at], p.first_pos[at], p.last_pos[at],
                 np.ascontiguousarray(p.cells[at]), p.rep[at], p.new[at]), pad[at]


def _continued(p: Pools, last: int, n: int) -> tuple[Pools, np.ndarray]:
    """n entries that continue entry `last` of `p` as the two before it step (the
    next pools of its sequence, as a closing pool makes them), no padding."""
    t = np.arange(1, n + 1)

    def step(col: np.ndarray) -> np.ndarray:
        return col[last] + t * (col[last] - col[last - 1])

    cells = p.cells[last] + t[:, None] * (p.cells[last] - p.cells[last - 1])
    return Pools(np.full(n, p.seq[last]), step(p.k), step(p.first_pos), step(p.last_pos),
                 cells, cells[:, -1].copy(), np.full(n, p.new[last])), np.zeros(n, bool)


def _grow(rng: np.random.Generator, kpool: int, old: Pools, old_pad: np.ndarray
          ) -> tuple[Pools, np.ndarray, PoolGrowth]:
    """`old` (with its padding) cut into segments (as a layout's pools are, by
    sequence), each keeping a prefix of its entries and gaining new ones: random
    ones, or ones that continue its last kept entries' runs (a pool closed); most
    segments gain none. The listing now, its padding, and the growth."""
    n_old = len(old)
    n_seg = int(rng.integers(1, 6))
    before = np.sort(np.concatenate(([0, n_old], rng.integers(0, n_old + 1, n_seg - 1))))
    kept = np.empty(n_seg, dtype=np.int64)
    pieces, start = [], [0]
    for j in range(n_seg):
        lo, n_j = int(before[j]), int(before[j + 1] - before[j])
        grow = rng.random() < 0.4
        kept[j] = n_j if not grow else int(rng.integers(0, n_j + 1))
        pieces.append(_take(old, old_pad, np.arange(lo, lo + kept[j])))
        add = 0 if not grow else int(rng.integers(0, 4))
        if add and kept[j] >= 2 and rng.random() < 0.5:
            pieces.append(_continued(old, lo + int(kept[j]) - 1, add))
        elif add:
            fresh, cells, rep, pad = _random_listing(rng, kpool)
            fresh = Pools(fresh.seq, fresh.k, fresh.first_pos, fresh.last_pos, cells, rep,
                          fresh.new)
            add = min(add, len(fresh))
            pieces.append(_take(fresh, pad, np.arange(add)))
        start.append(start[-1] + int(kept[j]) + add)
    now = Pools(*(np.concatenate([getattr(q, f) for q, _ in pieces])
                  for f in ("seq", "k", "first_pos", "last_pos")),
                np.ascontiguousarray(np.concatenate([q.cells for q, _ in pieces])),
                np.concatenate([q.rep for q, _ in pieces]),
                np.concatenate([q.new for q, _ in pieces]))
    growth = PoolGrowth(np.ascontiguousarray(old.cells), before.astype(np.int64), kept,
                        np.array(start, dtype=np.int64))
    return now, np.concatenate([d for _, d in pieces]), growth


@pytest.mark.parametrize("kpool", [1, 2, 4])
def test_spans_found_from_the_last_listing_are_the_whole_listing_s(kpool: int):
    """compiled/runs.py `EverySpans`: a listing grown from the last one (`_grow`) has
    the spans contracts/runs.py finds over the whole of it, for the pool listing and
    the scatter entries alike, when they are found from the last listing's spans
    through the growth; runs that continue across a segment's kept and new entries
    are among them. Spans found for another listing are not grown by a growth that
    names another array (grown, they would be that listing's spans, spliced): they
    are found whole."""
    from kpool_cli.compiled.runs import EverySpans
    from kpool_cli.contracts import runs

    rng = np.random.default_rng(40 + kpool)
    n_runs = n_across = 0
    for _ in range(400):
        old, _, _, old_pad = _random_listing(rng, kpool)
        now, now_pad, growth = _grow(rng, kpool, old, old_pad)
        want = [runs.pool_spans(now).tolist(),
                runs.scatter_spans(now.cells, now.rep, now_pad).tolist()]
        every = EverySpans()
        every(old, growth.old_members, old_pad, None)  # the last listing's, found whole
        got = every(now, np.ascontiguousarray(now.cells), now_pad, growth)
        assert [g.tolist() for g in got] == want
        n_runs += sum(map(len, want))
        seams = (growth.start[:-1] + growth.kept)[growth.kept > 0].tolist()
        n_across += sum(a < x < b for w in want for a, b in w for x in seams)
        # spans found for another listing: the growth names not its array
        other, (old2, _, _, pad2) = EverySpans(), _random_listing(rng, kpool)
        other(old2, np.ascontiguousarray(old2.cells), pad2, None)
        got = other(now, np.ascontiguousarray(now.cells), now_pad, growth)
        assert [g.tolist() for g in got] == want
    assert n_runs > 200 and n_across > 50


@pytest.mark.parametrize("kpool", [1, 2, 3, 4])
def test_the_run_form_reads_back_as_the_full_listing(kpool: int):
    """docs/FORMATS.md "Runs", applied by hand to each run the writer gives: pool
    k0 + i of a pool run starts at first_pos + i kpool, its member j on row
    c0 + i e + j d, its rep its last member; entry i of a scatter run pools rows
    c0 + i e + j d into its last member. Expanded so, the run form of random listings
    (`_random_listing`) is the full listing, one object per pool or entry, in order."""
    rng = np.random.default_rng(10 + kpool)
    n_runs = 0
    for _ in range(300):
        p, cells, rep, pad = _random_listing(rng, kpool)
        pools = []
        for o in pools_json(p, kpool):
            if not isinstance(o["k"], list):
                pools.append(o)
                continue
            n_runs += 1
            (k0, k1), (c0, d, e) = o["k"], o["cells"]
            assert kpool > 1 or d == 1  # one member: its d is written as 1
            for i in range(k1 - k0):
                members = [c0 + i * e + j * d for j in range(kpool)]
                pos = o["first_pos"] + i * kpool
                pools.append({"seq": o["seq"], "k": k0 + i, "first_pos": pos,
                              "last_pos": pos + kpool - 1, "cells": members,
                              "rep": members[-1], "new": o["new"]})
        assert pools == pools_json(p, 0)
        record = SimpleNamespace(scatter_rows=cells, scatter_rep=rep, scatter_pad=pad,
                                 scatter_spans=None)
        entries = []
        for o in scatter_json(record, kpool):
            if "n" not in o:
                entries.append(o)
                continue
            n_runs += 1
            c0, d, e = o["cells"]
            assert kpool > 1 or d == 1
            for i in range(o["n"]):
                members = [c0 + i * e + j * d for j in range(kpool)]
                entries.append({"rep": members[-1], "cells": members, "pad": False})
        assert entries == scatter_json(record, 0)
    assert n_runs > 100


@pytest.mark.parametrize("way", ["python", "kernel"])
def test_a_ubatchs_text_is_dumps_of_its_json_with_each_finding_and_listing_encoded_once(
        monkeypatch, way):
    """json_report.ubatch_text: the very text `dumps(ubatch_json(rec))` gives, for
    every ubatch of two traces under cache-safe (the race trace: KP001 re-found each
    ubatch, the same Finding handed on; the server session: its listings of every
    pool handed on while the plan stands), with each distinct finding, and each
    distinct listing of more than a few items, encoded once: by orjson from its
    list (`way` python: a replay that loaded no numba) or by the listing kernel
    from its columns (kernel; here for every listing of more than a few items,
    as for longer ones in a replay); a finding whose text is not ASCII sends the ubatch
    dumps's other way, whole (escaped)."""
    import dataclasses

    from kpool_cli.backend.store import make_backend
    from kpool_cli.contracts.records import UbatchRecord
    from kpool_cli.replay import replay as replay_trace
    from kpool_cli.report import json_kernels, json_report
    from kpool_cli.trace.load import load_trace
    from kpool_cli.versions import CACHE_SAFE

    def records(path: str) -> list[UbatchRecord]:
        t = load_trace(path)
        return [r for r in replay_trace(t, CACHE_SAFE, make_backend("numba", t), spans=True)
                if isinstance(r, UbatchRecord)]

    race, server = records(RACE), records("traces/server-session.yaml")
    distinct = {id(f) for r in race for f in r.findings}
    assert len(distinct) < sum(len(r.findings) for r in race)  # some handed on
    encoded: list[object] = []
    real = json_report._fragment
    real_texts = json_report.pools_text, json_report.scatter_text

    def counted(value: object) -> object:
        encoded.append(value)
        return real(value)

    def counted_pools(*args: object) -> object:
        encoded.append(args)
        return real_texts[0](*args)

    def counted_entries(*args: object) -> object:
        encoded.append(args)
        return real_texts[1](*args)

    long_met: list[object] = []  # every long listing met, held

    class Texts(json_report.EncodedTexts):
        def listing(self, items: list[dict]) -> object:
            if len(items) > json_report._FEW_LISTED:
                long_met.append(items)
            return super().listing(items)

    def kernel_listings(r: UbatchRecord) -> list[object]:
        """The listings the kernel writes, each known by an array of its own."""
        return [x for x, n in ((r.pools.seq, len(r.pools)), (r.scatter_rep, r.scatter_rep.size))
                if n > json_report._FEW_LISTED]

    for recs in (race, server):
        want = [dumps(json_report.ubatch_json(r)) for r in recs]
        encoded.clear()
        long_met.clear()
        monkeypatch.setattr(json_report, "_fragment", counted)
        monkeypatch.setattr(json_report, "pools_text", counted_pools)
        monkeypatch.setattr(json_report, "scatter_text", counted_entries)
        if way == "python":
            monkeypatch.setattr(json_report, "_listing_kernels", lambda: None)
        else:  # every listing of more than a few items, to the kernel
            assert json_report._listing_kernels() is json_kernels
            monkeypatch.setattr(json_report, "_KERNEL_LISTED", json_report._FEW_LISTED)
        texts = Texts()
        assert [json_report.ubatch_text(r, True, texts) for r in recs] == want
        monkeypatch.undo()
        assert sum(isinstance(v, dict) for v in encoded) == len(
            {id(f) for r in recs for f in r.findings})
        by_kernel = sum(isinstance(v, tuple) for v in encoded)
        if way == "kernel":
            long_met += [x for r in recs for x in kernel_listings(r)]
            assert by_kernel > 0
        else:
            assert by_kernel == 0
        n_distinct = len({id(x) for x in long_met})
        assert sum(isinstance(v, list | tuple) for v in encoded) == n_distinct
    assert 0 < n_distinct < len(long_met)  # the server's: some handed on
    odd = dataclasses.replace(race[-1], findings=tuple(
        dataclasses.replace(f, message=f.message + " \u202e") for f in race[-1].findings))
    text = json_report.ubatch_text(odd, True, json_report.EncodedTexts())
    assert text == dumps(real_json := json_report.ubatch_json(odd)) and "\\u202e" in text
    assert json.loads(text) == json.loads(json.dumps(real_json))
