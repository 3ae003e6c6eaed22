"""`kpool diff` of saved reports: the format from its one declaration, and a report
bounded by its own config, in time and in memory.

- Every report kpool writes (every shipped trace, both engines, marked pools and
  `--pools all`, model-only and with values) is read back as its live run, and
  diffs.
- What the reader accepts validates against `report_schema()` (jsonschema, here
  only), over every field of real reports replaced by hostile values, deleted, or
  added to; and a hypothesis test of random JSON put anywhere.
- A report read part by part (as a large one is) gives the same summary, or the same
  error at the same path, as one parsed at once.
- Each bound the config sets is refused at its JSON path with its reason; so are
  counts that disagree with what they count, and ubatches out of order.
- Hostile files (millions of tokens in a ubatch, runs standing for millions of pools,
  100,000-item arrays of junk, deep nesting) are refused, or read, in bounded time
  and memory: peak Python allocation within a small multiple of the file's size.
- The bound on a ubatch's tokens is exact: split_equal never makes a larger one, with
  or without the n_rs_seq tail.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import time
import tracemalloc
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from placed import unplaced

from kpool_cli.cache.aborts import KeepTailAssert
from kpool_cli.cache.batch import split_equal
from kpool_cli.cli import cli
from kpool_cli.contracts.report_format import report_schema
from kpool_cli.diff import reports
from kpool_cli.diff.reports import ReportError, from_report, read_reports
from kpool_cli.diff.runs import Unit, run_unit
from kpool_cli.report.json_text import dumps
from kpool_cli.trace.model import Token

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "traces").glob("*.yaml")) + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "traces" / "found").glob("*.yaml"))
RACE = "traces/shared-prefix-race.yaml"
NON_UNIFIED = "traces/non-unified.yaml"
MROPE = "traces/mrope-images.yaml"
MTP = "traces/mtp-prefill-split.yaml"
SERVER = "traces/server-session.yaml"
VALIDATOR = jsonschema.Draft202012Validator(report_schema())
# a padding entry with no row left: rep-once aborts the last ubatch (KP005), whose
# scatter plan is then empty although n_new_g is 2
ABORTS = """kpool_trace: 1
name: pad-abort
cache: {kv_size: 4, kpool: 1, n_seq_max: 1}
ops:
  - decode: {seq: 0, pos: 0}
  - decode: {seq: 0, pos: 1}
  - decode: {seq: 0, pos: 2}
  - decode: {seq: 0, pos: 3}
"""


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def replay_json(trace: str, engine: str, *more: str) -> dict:
    r = CliRunner().invoke(cli, ["replay", trace, "--engine", engine, "--format", "json",
                                 "--backend", "none", *more])
    assert r.exit_code in (0, 1), r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def race() -> dict:
    return replay_json(RACE, "cache-safe")


def save(tmp_path: Path, name: str, doc: object) -> str:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return str(p)


def refusal(doc: object) -> str:
    """The reader's message for a parsed report (the path and why), or "" if it reads."""
    try:
        from_report(doc, "b.json")
    except ReportError as e:
        assert str(e).startswith("b.json: ")
        return str(e)[len("b.json: "):]
    return ""


def edited(doc: dict, path: str, value: object = None, *, delete: bool = False) -> dict:
    """A copy of `doc` with the field at `path` (`ubatches.1.n_new`) set or deleted."""
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node: object = out
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]  # type: ignore[index]
    key: int | str = int(last) if isinstance(node, list) else last
    if delete:
        del node[key]  # type: ignore[union-attr]
    else:
        node[key] = value  # type: ignore[index]
    return out


# --- every report kpool writes -------------------------------------------------------------


@pytest.mark.parametrize("engine", ["rep-once", "cache-safe"])
def test_every_report_kpool_writes_reads_as_its_live_run_and_diffs(tmp_path, engine):
    other = "cache-safe" if engine == "rep-once" else "rep-once"
    (tmp_path / "aborts.yaml").write_text(ABORTS)
    for trace in [*TRACES, str(tmp_path / "aborts.yaml")]:
        live = run_unit(Unit(trace, engine, "none"))
        for pools in ("marked", "all"):
            a, b = tmp_path / f"a.{pools}.json", tmp_path / f"b.{pools}.json"
            for path, e in ((a, engine), (b, other)):
                r = CliRunner().invoke(cli, ["replay", trace, "--engine", e, "--pools", pools,
                                             "--backend", "none", "--format", "json", "-o",
                                             str(path)])
                assert r.exit_code in (0, 1), r.stderr
            got = read_reports(str(a))
            assert got == [live], (trace, pools)
            r = CliRunner().invoke(cli, ["diff", str(a), str(b)])
            assert r.exit_code in (0, 1), (trace, pools, r.stderr)
        for doc in (replay_json(trace, engine, "--backend", "numpy"),):
            assert VALIDATOR.is_valid(doc)
            from_report(doc, "v.json")  # values: KP003, KP001's evidence of values


def test_a_file_of_several_reports_reads_each(tmp_path):
    r = CliRunner().invoke(cli, ["replay", *TRACES[:6], "--engine", "rep-once", "--backend",
                                 "none", "--format", "json"])
    doc = json.loads(r.stdout)
    assert isinstance(doc, list) and len(doc) == 6
    assert len(read_reports(save(tmp_path, "all.json", doc))) == 6
    one = save(tmp_path, "one.json", doc[:1])
    with pytest.raises(ReportError, match=r"one.json:1:1: reports: an array of 1 report: an array "
                                          r"holds 2 or more"):
        read_reports(one)


# --- the format, from report_schema() --------------------------------------------------------

HOSTILE = (None, True, False, -1, 0, 2**31, 2**63, -(2**63) - 1, 1.5, "", "x", "KP001",
           "\ud800", [], [0], [[]], {}, {"": 0}, {"0": 0})


def _paths(doc: object, at: tuple = ()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*at, i))
    yield at


def _small(doc: dict) -> dict:
    out = copy.deepcopy(doc)
    out["ubatches"] = out["ubatches"][:2]
    out["events"] = out["events"][:2]
    out["expectations"] = out["expectations"][:1]
    return out


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    """A real report of every shipped trace (its first ubatches and events), under
    either engine, some listing every pool, some with values: findings and their
    evidence, non-unified, M-RoPE (ext), n_rs_seq, expectations. The shapes first."""
    first = [RACE, NON_UNIFIED, MROPE, MTP]
    out = []
    for i, trace in enumerate(first + [t for t in TRACES if t not in first]):
        more = (["--pools", "all"] if i % 3 == 1 else []) + (
            ["--backend", "numpy"] if i % 4 == 2 else [])
        out.append(_small(replay_json(trace, ("cache-safe", "rep-once")[i % 2], *more)))
    return out


def _mutations(doc: dict, rng: random.Random, k: int, most: int):
    """`doc` with `most` of its fields (chosen at random) each replaced by `k` of the
    hostile values or deleted, and (objects) given an undeclared key: (where, what,
    the mutated copy)."""
    text = json.dumps(doc)
    paths = [p for p in _paths(doc) if p]
    for path in rng.sample(paths, min(most, len(paths))):
        for value in rng.sample([*HOSTILE, "delete"], k):
            bad = json.loads(text)
            node = _at(bad, path[:-1])
            if value == "delete":
                del node[path[-1]]  # type: ignore[index,union-attr]
            else:
                node[path[-1]] = value  # type: ignore[index]
            yield path, value, bad
        if isinstance(_at(doc, path), dict):
            for value in (None, [[{"x": 1.5}]], "\ud800"):
                bad = json.loads(text)
                _at(bad, path)["added_later"] = value  # type: ignore[index]
                yield path, ("added_later", value), bad


def test_what_the_reader_reads_validates_against_the_schema(samples):
    """Fields of a report of every shipped trace replaced by hostile values, deleted,
    and given an undeclared neighbour: whatever the reader accepts, the schema accepts
    (so what the schema refuses, the reader refuses). The reader refuses more (the
    config's bounds, 64-bit integers, surrogates, counts that disagree), never less."""
    read = refused = schema_refused = 0
    rng = random.Random(1)
    for doc in samples:
        assert VALIDATOR.is_valid(doc) and refusal(doc) == ""
        for n, (path, value, bad) in enumerate(_mutations(doc, rng, 6, 30)):
            if not refusal(bad):
                assert VALIDATOR.is_valid(bad), (path, value, next(VALIDATOR.iter_errors(bad)))
                read += 1
            else:
                refused += 1
                if n % 7 == 0:  # the schema refuses most of these too (not all: bounds)
                    schema_refused += not VALIDATOR.is_valid(bad)
    assert read > 500 and refused > 5 * read and schema_refused > refused / 14


def _at(doc: object, path: tuple) -> object:
    for p in path:
        doc = doc[p]  # type: ignore[index]
    return doc


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.text(max_size=5)
    | st.sampled_from([0, 1, 2, 3, 63, 64, 512, "KP001", "KP005", "applied", "none"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["seq", "k", "n", "rep", "cells", "pad", "new", "0", "x"]), inner,
        max_size=3), max_leaves=6)


@settings(max_examples=300)
@given(data=st.data())
def test_random_json_anywhere_is_read_only_when_the_schema_allows_it(samples, data):
    doc = copy.deepcopy(samples[data.draw(st.integers(0, len(samples) - 1))])
    paths = [p for p in _paths(doc) if p]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        try:
            node = _at(doc, path[:-1])
        except (KeyError, IndexError, TypeError):
            continue
        if isinstance(node, dict | list):
            try:
                node[path[-1]] = data.draw(_JSON)  # type: ignore[index]
            except (IndexError, TypeError):  # an earlier draw made the node a list
                continue
    if not refusal(doc):
        assert VALIDATOR.is_valid(doc)


def test_the_compiled_checks_cover_the_schema():
    """The reader's checks come from report_schema(): every keyword it uses is one the
    compiler knows, and every place the reader adds to is a place of the schema."""
    fields = reports._fields()
    assert set(fields) == set(report_schema()["$defs"]["report"]["properties"])


# --- read part by part, or at once: the same ------------------------------------------------


def test_reading_part_by_part_gives_what_reading_at_once_does(tmp_path, samples, monkeypatch):
    """With SMALL_BYTES tiny, every array and object of the file is read part by part
    (as a large report's are): each mutation gives the same summary, or the same error
    at the same path, as the parsed document."""
    monkeypatch.setattr(reports, "SMALL_BYTES", 120)
    rng = random.Random(7)
    n = 0
    for doc in samples[:6]:
        paths = [p for p in _paths(doc) if p]
        for path in rng.sample(paths, min(60, len(paths))):
            for value in rng.sample([*HOSTILE, "delete"], 5):
                bad = copy.deepcopy(doc)
                node = _at(bad, path[:-1])
                if value == "delete":
                    del node[path[-1]]  # type: ignore[index,union-attr]
                else:
                    node[path[-1]] = value  # type: ignore[index]
                try:
                    whole: object = [from_report(json.loads(json.dumps(bad)), "b.json")]
                except ReportError as e:
                    whole = str(e)
                try:
                    parts: object = read_reports(save(tmp_path, "b.json", bad))
                except ReportError as e:
                    parts = unplaced(str(e)).replace(str(tmp_path) + "/", "")
                assert parts == whole, (path, value)
                n += 1
    assert n > 1000


def test_a_report_in_another_key_order_reads_the_same(tmp_path, race, monkeypatch):
    """Keys in any order (sorted: `config` after `events`, `tool` after `ubatches`):
    the ubatches and events wait for the config and the writer."""
    monkeypatch.setattr(reports, "SMALL_BYTES", 120)
    want = from_report(race, "r.json")
    for order in (sorted(race), sorted(race, reverse=True)):
        doc = {k: race[k] for k in order}
        assert read_reports(save(tmp_path, "r.json", doc)) == [want]
    late = {k: race[k] for k in sorted(race, reverse=True)}
    late["tool"] = {"name": "kpool", "version": 3}
    assert "r.json: report.tool.version: expected a string, got 3" in message(
        save(tmp_path, "r.json", late))
    late["kpool_report"] = 2
    assert "report.kpool_report: report format 2" in message(save(tmp_path, "r.json", late))


# --- the bounds of the config --------------------------------------------------------------------


def _one_ubatch(doc: dict, i: int) -> dict:
    """`doc` with only its ubatch `i`, as the first of the report."""
    out = copy.deepcopy(doc)
    out["ubatches"] = [dict(out["ubatches"][i], index=0, batch_ubatch=0)]
    return out


BOUND_EDITS = [
    # config: the trace's bounds
    (("config.kv_size", 2**24 + 1), "report.config.kv_size: 16777217 is out of range (at most "
                                     "16777216, the trace's bound)"),
    (("config.n_seq_max", 257), "report.config.n_seq_max: 257 is out of range (at most 256"),
    (("config.kpool", 65), "report.config.kpool: 65 is more than kv_size 64"),
    # tokens
    (("config.n_ubatch", 11), "report.ubatches[0].tokens: more than the 11 tokens a ubatch "
                              "holds (config.n_ubatch 11)"),
    (("ubatches.0.tokens.0.seq", [2]), "report.ubatches[0].tokens[0].seq[0]: seq 2 is out of "
                                       "range (config.n_seq_max is 2)"),
    (("ubatches.0.tokens.0.seq", [0, 1, 0]), "report.ubatches[0].tokens[0].seq: more than 2 "
                                             "sequences (config.n_seq_max)"),
    (("ubatches.0.tokens.0.seq", [0, 0]), "report.ubatches[0].tokens[0].seq: a sequence "
                                          "listed twice"),
    (("ubatches.0.tokens.0.seq", []), "report.ubatches[0].tokens[0].seq: a token has at least "
                                      "one sequence"),
    (("ubatches.0.tokens.0.cell", 64), "report.ubatches[0].tokens[0].cell: row 64 is out of "
                                       "range (the cache has 64 rows"),
    (("ubatches.0.tokens.0.pos", 2**31), "report.ubatches[0].tokens[0].pos: 2147483648 is out "
                                         "of range (positions are 0 to 2**31 - 2**20 - 1)"),
    (("ubatches.0.tokens.0.ext", [0, 0]), "report.ubatches[0].tokens[0].ext: M-RoPE only"),
    (("ubatches.0.tokens", []), "report.ubatches[0].tokens: a ubatch holds at least one token"),
    # pools
    (("ubatches.0.n_pool_real", 33), "report.ubatches[0].n_pool_real: 33 pools: more than the "
                                     "32 the cache holds"),
    (("ubatches.0.n_new", 4), "report.ubatches[0].n_new: 4 pools marked new, of n_pool_real 3"),
    (("ubatches.0.pools.0.k", [0, 2]), "report.ubatches[0].pools: lists 2 pools marked new, "
                                       "but n_new is 3"),
    (("ubatches.0.pools.0.k", [0, 17]), "report.ubatches[0].pools[0].k[1]: pool 17 is out of "
                                        "range (a sequence holds at most 16 pools"),
    (("ubatches.0.pools.0.k", [0, 4]), "report.ubatches[0].pools: lists 4 pools, more than "
                                       "n_pool_real 3"),
    (("ubatches.0.pools.0.cells", [60, 1, 4]), "report.ubatches[0].pools[0].cells: row 68 of "
                                               "the run is out of range"),
    (("ubatches.0.pools.0.seq", 2), "report.ubatches[0].pools[0].seq: seq 2 is out of range"),
    # the scatter plan
    (("ubatches.0.n_new_g", 12), "report.ubatches[0].n_new_g: 12 scatter entries: more than "
                                 "the 4 of this ubatch's graph"),
    (("ubatches.0.n_new_g", 3), "report.ubatches[0].scatter: holds 4 entries, but n_new_g is 3"),
    (("ubatches.0.scatter.0.n", 33), "report.ubatches[0].scatter[0].n: a run of 33 entries in "
                                     "a ubatch of at most 32 (n_new_g: at most the pools the "
                                     "cache holds)"),
    (("ubatches.0.scatter.0.n", 1), "report.ubatches[0].scatter[0].n: a run of 1 entries: a run "
                                    "holds 2 or more"),
    (("ubatches.0.scatter.0.cells", [0, 1]), "report.ubatches[0].scatter[0].cells: expected "
                                             "[first row, member step, entry step], got an "
                                             "array"),
    (("ubatches.0.pools.0.cells", [-1, 1, 4]), "report.ubatches[0].pools[0].cells: expected "
                                               "[first row, member step, entry step], got "
                                               "[-1, 1, 4]: a first row is not negative"),
    (("ubatches.0.scatter.0.cells", [0, 1, 40]), "report.ubatches[0].scatter[0].cells: row 80 "
                                                 "of the run is out of range"),
    (("ubatches.0.scatter.1.cells", [0, 0, 0]), "report.ubatches[0].scatter[1].cells: 3 rows: "
                                                "an entry pools config.kpool (4)"),
    (("ubatches.0.scatter.1.rep", 64), "report.ubatches[0].scatter[1].rep: row 64 is out of "
                                       "range"),
    # stale maps
    (("ubatches.1.stale_batch", {"0": 0, "2": 0}), "report.ubatches[1].stale_batch[\"2\"]: seq 2 "
                                                   "is out of range (config.n_seq_max is 2)"),
    (("ubatches.1.stale_batch", {"0": 0, "1": 0, "00": 1}), "report.ubatches[1].stale_batch: "
                                                            "more than 2 sequences"),
    (("events.0.stale", {"7": 0}), "report.events[0].stale[\"7\"]: seq 7 is out of range"),
    # findings
    (("ubatches.1.findings.0.rows", [3, 64]), "report.ubatches[1].findings[0].rows[1]: row 64 "
                                              "is out of range"),
    (("ubatches.1.findings.0.rows", list(range(65))), "report.ubatches[1].findings[0].rows: "
                                                      "more than 64 rows"),
    (("ubatches.1.findings.0.row_runs", [[3, 200, 4]]), "report.ubatches[1].findings[0]"
                                                        ".row_runs[0]: row 199 is out of range"),
    (("ubatches.1.findings.0.row_runs", [[0, 64, 1]]), "report.ubatches[1].findings[0]"
                                                       ".row_runs: names 67 rows, more than the "
                                                       "cache's 64"),
    (("ubatches.1.findings.0.seqs", [0, 5]), "report.ubatches[1].findings[0].seqs[1]: seq 5 is "
                                             "out of range"),
    (("ubatches.1.findings.0.pools", [[0, 0, 17]]), "report.ubatches[1].findings[0].pools[0][2]:"
                                                    " pool 17 is out of range"),
    # ubatches in order, and ops
    (("ubatches.1.index", 5), "report.ubatches[1].index: ubatch 1 of the report has index 5"),
    (("ubatches.2.op", 1), "report.ubatches[2].op: op 1 comes after op 3"),
    (("ubatches.1.batch_ubatch", 1), "report.ubatches[1].batch_ubatch: expected 0 (the op's "
                                     "ubatches count 0, 1, ...), got 1"),
    (("ubatches.1.op", 0), "report.ubatches[1].batch_ubatch: expected 1"),
    (("ubatches.2.op", 2**16), "report.ubatches[2].op: 65536 is out of range (a trace has at "
                               "most 65536 ops)"),
    (("events.0.op", 2**16), "report.events[0].op: 65536 is out of range"),
    # not a whole run
    (("summary.status", "interrupted"), "report.summary.status: the replay was interrupted"),
]


@pytest.mark.parametrize("edit, message", BOUND_EDITS)
def test_each_bound_of_the_config_is_refused_where_it_is(race, edit, message):
    path, value = edit
    assert message in refusal(edited(race, path, value))


def test_a_ubatch_may_hold_n_ubatch_plus_one_tokens_of_as_many_sequences(race):
    two = _one_ubatch(race, 1)  # tokens of seq 0 and seq 1
    assert refusal(edited(two, "config.n_ubatch", 1)) == ""  # n_seq_max 2 > n_ubatch 1
    three = edited(edited(two, "config.n_ubatch", 1), "ubatches.0.tokens",
                   [*two["ubatches"][0]["tokens"], {"pos": 13, "seq": [0], "cell": 14}])
    assert "tokens: more than the 2 tokens a ubatch holds (config.n_ubatch 1, + 1: " \
           "split_equal's first round)" in refusal(three)


def test_a_token_of_a_non_unified_cache_is_in_its_sequences_stream():
    doc = replay_json(NON_UNIFIED, "rep-once")
    assert refusal(doc) == ""
    u = next(i for i, u in enumerate(doc["ubatches"]) if u["tokens"][0]["seq"] == [0])
    assert f"report.ubatches[{u}].tokens[0].cell: row 16 is not in stream 0, its sequence's " \
           "(rows 0..16)" in refusal(edited(doc, f"ubatches.{u}.tokens.0.cell", 16))


def test_an_ops_tokens_fit_the_cache(race):
    """A decode's tokens all take a cell: the ubatches of one op hold at most the cache's
    rows."""
    doc = edited(race, "config.kv_size", 16)
    doc["config"]["n_ubatch"] = 12
    doc = edited(doc, "ubatches", [dict(race["ubatches"][0], index=i, op=0, batch_ubatch=i,
                                        tokens=[dict(t, cell=t["cell"] % 16) for t in
                                                race["ubatches"][0]["tokens"]])
                                   for i in range(2)])
    assert "report.ubatches[1].tokens: the ubatches of op 0 hold 24 tokens, more than the " \
           "cache's 16 rows" in refusal(doc)


# --- memory and time ----------------------------------------------------------------------------


def message(path: str) -> str:
    """The ReportError reading `path` raises, checked for its place and without it."""
    with pytest.raises(ReportError) as e:
        read_reports(path)
    return unplaced(str(e.value))


def _peak(fn) -> tuple[object, int, float]:
    tracemalloc.start()
    t = time.perf_counter()
    try:
        out: object = fn()
    except ReportError as e:
        out = e
    took = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, peak, took


def test_a_ubatch_of_a_million_tokens_is_refused_before_they_are_read(tmp_path, race):
    doc = copy.deepcopy(race)
    doc["ubatches"][0]["tokens"] = [{"pos": i, "seq": [0], "cell": i % 64}
                                    for i in range(300_000)]
    path = save(tmp_path, "big.json", doc)
    size = Path(path).stat().st_size
    out, peak, _ = _peak(lambda: read_reports(path))
    assert isinstance(out, ReportError)
    assert "big.json: report.ubatches[0].tokens: more than the 512 tokens" in unplaced(str(out))
    assert peak < 2.2 * size + 2**21, (peak, size)  # the file's bytes and text, no tree


def _millions_of_rows(race: dict) -> dict:
    """The race's report with 50 ubatches whose runs stand for 2**21 pools and as many
    scatter entries each, in a few hundred bytes (kv_size 2**20, kpool 1, two
    sequences)."""
    doc = copy.deepcopy(race)
    doc["config"].update(kv_size=2**20, kpool=1)
    n = 2**20
    doc["ubatches"] = [dict(race["ubatches"][0], index=i, op=i, tokens=[
        {"pos": 0, "seq": [0], "cell": 0}], n_pool_real=2 * n, n_new=2 * n, n_new_g=2 * n,
        pools=[{"seq": s, "k": [0, n], "first_pos": 0, "cells": [0, 1, 1], "new": True}
               for s in (0, 1)], scatter=[{"n": 2 * n, "cells": [0, 0, 0], "pad": False}])
        for i in range(50)]
    return doc


def test_runs_standing_for_millions_of_rows_are_refused_before_they_are_built(tmp_path, race):
    """A few hundred bytes a ubatch stand for 2**21 pools and as many entries: the
    budget (MEMORY_PER_BYTE times the file + MEMORY_FLOOR) is passed before any is."""
    path = save(tmp_path, "runs.json", _millions_of_rows(race))
    out, peak, took = _peak(lambda: read_reports(path))
    assert isinstance(out, ReportError)
    assert "runs.json: report.ubatches[0]: the report would take more memory than kpool diff " \
           "gives it (6 times its size + 32 MiB)" in unplaced(str(out))
    assert peak < 2**22 and took < 2, (peak, took)


def test_a_report_reads_within_its_budget(tmp_path, race):
    """A report that keeps every bound (3,000 ubatches, 2 a decode): its summary takes
    at most MEMORY_PER_BYTE times its size, and reading it, little more."""
    ubs = []
    for i in range(3_000):
        u = dict(race["ubatches"][i % 3], index=i, op=i // 2, batch_ubatch=i % 2)
        if i % 2:
            u["stale_batch"] = {}
        ubs.append(u)
    path = save(tmp_path, "many.json", dict(race, ubatches=ubs))
    size = Path(path).stat().st_size
    out, peak, _ = _peak(lambda: read_reports(path))
    assert isinstance(out, list) and len(out[0].ubatches) == 3_000
    assert peak < reports.MEMORY_PER_BYTE * size + 2**21, (peak, size)


def test_junk_in_an_undeclared_field_is_checked_and_not_kept(tmp_path, race):
    text = json.dumps(race)[:-1] + ', "added_later": [' + ",".join(["[]"] * 1_000_000) + "]}"
    path = save(tmp_path, "junk.json", text)
    out, peak, took = _peak(lambda: read_reports(path))
    assert isinstance(out, list)
    assert peak < 2.2 * len(text) + 2**21 and took < 5, (peak, took)
    bad = save(tmp_path, "junk.json", text.replace("[],[]]}", "[],[NaN]]}"))
    assert "junk.json: report.added_later[999999][0]: NaN is not JSON" in message(bad)
    deep = save(tmp_path, "deep.json", json.dumps(race)[:-1] + ', "x": ' + "[" * 600
                + "]" * 600 + "}")
    assert "deep.json:1:" in message(deep)


def test_the_place_of_a_late_item_is_found_a_run_at_a_time(race, monkeypatch):
    """The walk to a problem's place (`_Text.value_at`) passes an array's items a run
    at a time, as the reader took them: to the NaN after 1,000,000 items of junk it
    skips items one by one only in the run that holds it (at most RUN_ITEMS), not a
    million times (31 million took 58 s so)."""
    text = (json.dumps(race)[:-1] + ', "added_later": [' + ",".join(["[]"] * 1_000_000)
            + ", [NaN]]}")
    one_by_one: list[int] = []
    real = reports._value_end
    monkeypatch.setattr(reports, "_value_end", lambda: one_by_one.append(1) or real())
    at = reports._Text(text, "junk.json").value_at(".added_later[1000000][0]")
    assert text.startswith("NaN]]}", at)
    assert len(one_by_one) <= reports.RUN_ITEMS + len(race)


def test_runs_are_tried_again_past_an_item_too_long_for_one(monkeypatch):
    """An item longer than a run's window (RUN_ITEMS * TINY_ITEM bytes) in the way
    does not leave the rest of the array to be walked one by one: runs are tried
    again past the bytes the failed one was looked for in (a 12 MiB mix of such items
    and 2 million short ones took 4.2 s when they were not, 0.4 s now)."""
    items = ["[0]"] * 100_000
    items[10] = '"' + "x" * (reports.RUN_ITEMS * reports.TINY_ITEM) + '"'
    text = '{"a": [' + ", ".join(items) + ', "END"]}'
    one_by_one: list[int] = []
    real = reports._value_end
    monkeypatch.setattr(reports, "_value_end", lambda: one_by_one.append(1) or real())
    at = reports._Text(text, "mix.json").value_at(".a[100000]")
    assert text.startswith('"END"', at)
    assert len(one_by_one) <= 2 * reports.RUN_ITEMS, len(one_by_one)


def test_the_walk_a_run_at_a_time_counts_items_of_every_kind():
    """Strings holding commas and brackets, nested arrays and objects, numbers and
    null, in runs of RUN_ITEMS: the place of each item asked is where the text puts
    it (the items' lengths summed here), before, at and past the runs' edges."""
    kinds = ['"a,]"', "[1, [2, {}]]", '{"k": ",", "[": "{"}', "3", "null", "-1.5e3"]
    items = [kinds[i % len(kinds)] for i in range(3 * reports.RUN_ITEMS + 7)]
    text = '{"x": [' + ", ".join(items) + "]}"
    for want in (0, 1, reports.RUN_ITEMS, reports.RUN_ITEMS + 1, 2 * reports.RUN_ITEMS + 3,
                 len(items) - 1):
        offset = len('{"x": [') + sum(len(x) + 2 for x in items[:want])
        assert reports._Text(text, "f").value_at(f".x[{want}]") == offset, want


def test_a_duplicate_key_deep_in_a_large_object_is_located(tmp_path, race, monkeypatch):
    monkeypatch.setattr(reports, "SMALL_BYTES", 120)
    text = json.dumps(race).replace('"n_new": ', '"n_new": 0, "n_new": ', 1)
    assert "b.json: report.ubatches[0]: duplicate key \"n_new\"" in message(
        save(tmp_path, "b.json", text))
    text = json.dumps(race)[:-1] + ', "x": {"a": [1, {"b": 1, "b": 2}]}}'
    assert "b.json: report.x.a[1]: duplicate key \"b\"" in message(save(tmp_path, "b.json", text))


# --- a report as kpool writes it: a ubatch a line, lines read at once -----------------------------


def as_written(doc: dict) -> str:
    """`doc` laid out as `kpool replay --format json` writes one report: a field a line,
    and a ubatch, an event, an expectation a line (`json_report.write_report`)."""
    out = "{\n"
    for key, value in doc.items():
        if key in ("ubatches", "events", "expectations"):
            out += (f"  {dumps(key)}: [" + ",".join("\n    " + dumps(x) for x in value)
                    + ("\n  " if value else "") + "],\n")
        else:
            out += f"  {dumps(key)}: {dumps(value)},\n"
    return out.removesuffix(",\n") + "\n}\n"


def _outcome(path: str, tmp_path: Path) -> object:
    """What reading `path` gives: the summaries, or the message (its place checked)."""
    try:
        return read_reports(path)
    except ReportError as e:
        unplaced(str(e))
        return str(e).replace(str(tmp_path) + "/", "")


@pytest.fixture
def lines_taken(monkeypatch) -> list[int]:
    """[ubatches the fast path took, runs of lines it left to the precise path], as
    reading goes; the precise path reads every array part by part (SMALL_BYTES tiny)."""
    monkeypatch.setattr(reports, "SMALL_BYTES", 120)
    taken = [0, 0]
    real = reports._ubatch_columns

    def counted(items, n, ctx):
        try:
            out = real(items, n, ctx)
        except Exception:
            taken[1] += 1
            raise
        taken[0] += len(out)
        return out

    monkeypatch.setattr(reports, "_ubatch_columns", counted)
    return taken


def _both_ways(path: str, tmp_path: Path) -> tuple[object, object]:
    """(reading `path` with the fast path, without it: LINES_BYTES 0)."""
    fast, lines = _outcome(path, tmp_path), reports.LINES_BYTES
    reports.LINES_BYTES = 0
    try:
        return fast, _outcome(path, tmp_path)
    finally:
        reports.LINES_BYTES = lines


def test_the_layout_here_is_kpools():
    r = CliRunner().invoke(cli, ["replay", SERVER, "--engine", "cache-safe", "--backend",
                                 "none", "--format", "json"])
    assert r.exit_code in (0, 1) and as_written(json.loads(r.stdout)) == r.stdout


def test_every_ubatch_kpool_writes_is_read_a_run_of_lines_at_once(tmp_path, lines_taken,
                                                                 monkeypatch):
    """Every shipped trace's report, under either engine, marked pools and every pool,
    model-only and with values (findings, evidence, M-RoPE, non-unified): the fast path
    takes every ubatch, none is left to the precise path (`_ubatch_post`, which words
    problems, is not called), and the summaries are the live run's."""
    precise: list[int] = []
    real = reports._ubatch_post
    monkeypatch.setattr(reports, "_ubatch_post",
                        lambda ctx, u: precise.append(1) or real(ctx, u))
    ubatches = 0
    for i, trace in enumerate(TRACES):
        for engine in ("rep-once", "cache-safe"):
            more = ["--pools", "all"] if i % 3 == 1 else []
            backend = "numpy" if i % 4 == 2 else "none"
            path = tmp_path / "r.json"
            r = CliRunner().invoke(cli, ["replay", trace, "--engine", engine, "--backend",
                                         backend, "--format", "json", "-o", str(path), *more])
            assert r.exit_code in (0, 1), r.stderr
            got = read_reports(str(path))
            assert got == [run_unit(Unit(trace, engine, backend))], (trace, engine)
            ubatches += len(got[0].ubatches)
    assert lines_taken == [ubatches, 0] and not precise and ubatches > 200


_LINE_EDITS = [  # (what kpool never writes in a line, as it reads; the precise path words it)
    ('"n_new":', '"n_new":0,"n_new":'),  # a key twice
    (':0,', ':-0,'), (':1,', ':1.0,'), (':1,', ':1e0,'), (':0,', ':00,'),
    (':1,', ':18446744073709551617,'), (':1,', ':true,'), (':1,', ':NaN,'),
    (',', ', '), (',', ',\t'), (',', ',\n    '),  # whitespace (JSON, not kpool's)
    ('"cost"', '"co\\u0073t"'), ('"seq"', '"se\\u0071"'),  # a key escaped
    ('"message":"', '"message":"a,\n    b'),  # a newline in a string, where a line ends
    ('"message":"', '"message":"a\n  ]'),  # ... where the array's last line would
    ('"cells"', '"cells,\n    x"'),
    ('"stale_batch":{}', '"stale_batch":{"0":1}'), ('"stale_batch":{}', '"stale_batch":{"00":1}'),
    ('"findings":[]', '"findings":[{"code":"KP005","name":"x","severity":"error","message":'
                      '"\\u00e9","rows":[0],"seqs":[0]}]'),
    ('"findings":[]', '"findings":[{"code":"KP001","name":"x","severity":"error","message":'
                      '"m","rows":[],"seqs":[],"evidence":' + "[" * 30 + "]" * 30 + "}]"),
    ('"findings":[]', '"findings":[{"code":"KP001","name":"x","severity":"error","message":'
                      '"\\ud800","rows":[],"seqs":[]}]'),
    ('{"index"', '{"added_later":1,"index"'),
]


def test_lines_kpool_never_writes_are_read_as_the_precise_path_reads_them(
        tmp_path, samples, lines_taken):
    """Real reports written as kpool writes them, a field of a ubatch's line set to a
    hostile value or to one of the config's bounds, or deleted: the fast path gives the
    same summary, or the same error at the same place, as the precise path alone;
    where it takes the edited line, what it takes is what the precise path reads."""
    rng = random.Random(5)
    n = taken = 0
    for doc in samples:
        cfg = doc["config"]
        rows = cfg["kv_size"] * (1 if cfg["unified"] else cfg["n_seq_max"])
        bounds = [rows - 1, rows, cfg["n_seq_max"] - 1, cfg["n_seq_max"], cfg["kpool"] + 1,
                  cfg["kv_size"] // cfg["kpool"], 2**31 - 2**20, 2**16, 2**63 - 1]
        lines = as_written(doc).split("\n")
        at = [i for i, line in enumerate(lines) if line.startswith('    {"index"')]
        for _ in range(40):
            edited = list(lines)
            i = rng.choice(at)
            text = edited[i].strip().removesuffix(",")
            ubatch = json.loads(text)
            path = rng.choice([p for p in _paths(ubatch) if p])
            node = _at(ubatch, path[:-1])
            value = rng.choice([*HOSTILE, *bounds, "delete"])
            if value == "delete":
                del node[path[-1]]  # type: ignore[index,union-attr]
            else:
                node[path[-1]] = value  # type: ignore[index]
            edited[i] = "    " + dumps(ubatch) + ("," if edited[i].endswith(",") else "")
            path = save(tmp_path, "e.json", "\n".join(edited))
            before = lines_taken[0]
            fast, precise = _both_ways(path, tmp_path)
            assert fast == precise, (lines[i], edited[i])
            taken += lines_taken[0] > before and isinstance(fast, list)
            n += 1
    assert n > 600 and taken > 100, (n, taken)


@pytest.mark.parametrize("old, new", _LINE_EDITS)
def test_text_kpool_never_writes_in_a_line_is_read_by_the_precise_path(tmp_path, race,
                                                                      lines_taken, old, new):
    """A line's text as kpool never writes it (a key twice, numbers and keys written
    otherwise, whitespace, a newline in a string where the fast path cuts lines, a
    finding nested deep): read as the precise path alone reads it, at each ubatch."""
    lines = as_written(race).split("\n")
    for i, line in enumerate(lines):
        if line.startswith('    {"index"') and old in line:
            edited = [*lines[:i], line.replace(old, new, 1), *lines[i + 1:]]
            fast, precise = _both_ways(save(tmp_path, "e.json", "\n".join(edited)), tmp_path)
            assert fast == precise, (old, new, i)
            if new.startswith('"message":"a'):  # a newline in a string
                assert "not JSON: Invalid control character" in str(fast)


@pytest.mark.parametrize("edit, message", BOUND_EDITS)
def test_each_bound_is_refused_where_it_is_in_kpools_lines(tmp_path, race, lines_taken, edit,
                                                           message):
    path, value = edit
    fast, precise = _both_ways(save(tmp_path, "b.json", as_written(edited(race, path, value))),
                               tmp_path)
    assert fast == precise and message in str(fast)


def test_runs_in_kpools_lines_are_refused_before_they_are_built(tmp_path, race, lines_taken):
    """The budget is charged for a run of lines before any is built: runs standing for
    2**21 pools and entries a ubatch are refused as the precise path refuses them."""
    path = save(tmp_path, "runs.json", as_written(_millions_of_rows(race)))
    out, peak, took = _peak(lambda: read_reports(path))
    assert isinstance(out, ReportError)
    assert "runs.json: report.ubatches[0]: the report would take more memory than kpool diff " \
           "gives it (6 times its size + 32 MiB)" in unplaced(str(out))
    assert lines_taken[1] >= 1 and peak < 2**22 and took < 2, (lines_taken, peak, took)


def test_a_large_report_in_kpools_lines_reads_within_its_budget(tmp_path, race, lines_taken):
    """3,000 ubatches as kpool writes them: taken by the fast path, its summaries the
    precise path's, and reading takes at most MEMORY_PER_BYTE times the file's size."""
    ubs = [dict(race["ubatches"][i % 3], index=i, op=i // 2, batch_ubatch=i % 2)
           for i in range(3_000)]
    path = save(tmp_path, "many.json", as_written(dict(race, ubatches=ubs)))
    size = Path(path).stat().st_size
    out, peak, _ = _peak(lambda: read_reports(path))
    assert isinstance(out, list) and lines_taken == [3_000, 0]
    assert peak < reports.MEMORY_PER_BYTE * size + 2**21, (peak, size)
    assert _both_ways(path, tmp_path) == (out, out)


def test_two_problems_past_lines_taken_are_worded_as_without_them(tmp_path, race,
                                                                   monkeypatch):
    """A wrong value in a ubatch and, in the next, text the parser refuses (NaN, a key
    twice, no colon), past lines the fast path took: the precise path reads runs of
    small ubatches at once (`_Text.items`), so it words the parser's problem where the
    two are in one of its runs and the wrong value where a run ends between them.
    Where those runs start must not depend on the lines taken before: the message is
    the precise path's alone, wherever the pair falls (both kinds are met here)."""
    monkeypatch.setattr(reports, "SMALL_BYTES", 2_000)  # runs of a few ubatches ...
    monkeypatch.setattr(reports, "LINES_BYTES", 3_000)  # ... and of a few lines
    ubs = [dict(race["ubatches"][i % 3], index=i, op=i // 2, batch_ubatch=i % 2)
           for i in range(40)]
    lines = as_written(dict(race, ubatches=ubs)).split("\n")
    at = [i for i, line in enumerate(lines) if line.startswith('    {"index"')]
    worded: set[str] = set()
    for k, (x, y) in enumerate(itertools.pairwise(at)):
        for refused in ('"op":NaN,"zz":', '"op":0,"op":', '"op" 0,"zz":'):
            edited = list(lines)
            edited[x] = edited[x].replace('"n_new":', '"n_new":-1,"zz":', 1)
            edited[y] = edited[y].replace('"op":', refused, 1)
            fast, precise = _both_ways(save(tmp_path, "two.json", "\n".join(edited)), tmp_path)
            assert fast == precise, (k, refused)
            worded.add("wrong value" if f"ubatches[{k}].n_new: -1 is out" in str(fast)
                       else "refused text")
    assert worded == {"wrong value", "refused text"}


def test_lines_are_taken_past_a_line_the_precise_path_reads(tmp_path, race, lines_taken):
    """A line the fast path leaves (a later version's counter) that the precise path
    reads without a problem: the array is not read again, and the lines past it are
    taken, with the precise path's summaries."""
    ubs = [dict(race["ubatches"][i % 3], index=i, op=i // 2, batch_ubatch=i % 2)
           for i in range(3_000)]
    ubs[5] = dict(ubs[5], cost={"later": 1, **ubs[5]["cost"]})
    path = save(tmp_path, "later.json", as_written(dict(race, ubatches=ubs)))
    fast, precise = _both_ways(path, tmp_path)
    assert isinstance(fast, list) and fast == precise
    assert dict(fast[0].ubatches[5].cost)["later"] == 1
    # the run of lines holding it left to the precise path, every later one taken
    assert lines_taken[1] == 1 and 2_500 < lines_taken[0] < 3_000, lines_taken


def test_a_report_on_one_line_is_not_copied_to_find_its_layout(tmp_path, race):
    """A report on one line (not kpool's layout), its ubatches past 2 MB of an undeclared
    field, its text 4 bytes a character (one emoji): reading it holds the text and
    little else, no copy of the text before the ubatches (an indent looked for)."""
    ubs = [dict(race["ubatches"][i % 3], index=i, op=i // 2, batch_ubatch=i % 2)
           for i in range(300)]
    doc = {"kpool_report": 1, "later": ["\U0001f600", *[0] * 1_000_000],
           **{k: v for k, v in race.items() if k != "kpool_report"}, "ubatches": ubs}
    path = save(tmp_path, "one-line.json", json.dumps(doc, separators=(",", ":"),
                                                      ensure_ascii=False))
    size = Path(path).stat().st_size
    out, peak, _ = _peak(lambda: read_reports(path))
    assert isinstance(out, list) and len(out[0].ubatches) == 300
    # the file read and decoded: 6 times its size (its text is 4 bytes a character);
    # a copy of the text before the ubatches (most of it) adds almost 4 times more
    assert peak < 6.5 * size, (peak / size)


# --- the bound on a ubatch's tokens is split_equal's ----------------------------------------


def test_split_equal_never_makes_a_ubatch_larger_than_the_readers_bound():
    """Random batches (coupled and not, sequential and not, with the n_rs_seq tail): no
    ubatch holds more than n_ubatch tokens, or n_ubatch + 1 when there are more
    sequences than n_ubatch; and that many is reached."""
    rng = random.Random(3)
    reached = set()
    for _ in range(6000):
        n_ubatch, n_seq = rng.randint(1, 6), rng.randint(1, 9)
        tail = rng.choice([0, 0, 2, 3, 4])
        sequential = rng.random() < 0.3
        toks = tuple(Token(i, (rng.randrange(n_seq),) if sequential or rng.random() < 0.7
                           else tuple(sorted(rng.sample(range(n_seq), min(n_seq, 2)))))
                     for i in range(rng.randint(1, 30)))
        try:
            split = split_equal(toks, n_ubatch, sequential, tail)
        except KeepTailAssert:
            continue
        if isinstance(split, str):
            continue
        ctx = reports._Ctx(None)
        ctx.configure({"kv_size": 64, "kpool": 1, "n_seq_max": n_seq, "unified": True,
                       "by_order": False, "n_ubatch": n_ubatch})
        most = max(len(u.tokens) for u in split)
        assert most <= ctx.max_tokens, (n_ubatch, n_seq, tail, sequential)
        if most > n_ubatch:
            reached.add(tail > 0)
    assert reached == {False, True}
