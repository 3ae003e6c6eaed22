"""Tests of trace.load (validation, positions of problems), trace.write (round trip)
and trace.schema (the published JSON Schemas)."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kpool_cli.contracts.report_format import report_schema
from kpool_cli.trace import yaml_safe
from kpool_cli.trace.load import (
    MAX_PROBLEMS,
    POS_LIMIT,
    Problem,
    TraceError,
    load_trace,
    load_trace_text,
)
from kpool_cli.trace.model import (
    CacheConfig,
    Clear,
    Decode,
    Expect,
    Loc,
    Note,
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
from kpool_cli.trace.schema import trace_schema
from kpool_cli.trace.write import dump_trace

TRACES_DIR = Path(__file__).resolve().parent.parent / "traces"

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _first_yaml_block(page: Path) -> str:
    """The first ```yaml block of a docs page, as a user would copy it."""
    text = page.read_text(encoding="utf-8")
    start = text.index("```yaml\n") + len("```yaml\n")
    return text[start:text.index("```", start)]


# The example of TRACE_FORMAT.md, read from the page.
SPEC_EXAMPLE = _first_yaml_block(DOCS / "TRACE_FORMAT.md")

# Every other form: by_order (ext), non-unified streams, ubatches, cells, list pos,
# seq -1, clear as null, expect with every field.
MROPE = """\
kpool_trace: 1
cache: {kv_size: 8, kpool: 2, n_seq_max: 2, unified: false, by_order: true, n_ubatch: 2}
ops:
  - decode: {seq: 1, pos: [3, 1, 2], ext: [4, 5]}
  - decode: {seq: 0, pos: 7, cell: 3}
  - decode:
      ubatches:
        - [{pos: 0, seq: 0, cell: 0, ext: [0, 1]}, {pos: 0, seq: 1, cell: 0}]
        - [{pos: 1, seq: [1, 0], cell: 5}]
  - seq_rm: {seq: -1}
  - seq_cp: {src: 1, dst: 1, p0: 0, p1: 3}
  - state_drop: {seq: -1}
  - clear:
  - expect:
      engine: cache-safe
      findings: [KP001, KP007]
      n_new: 0
      n_new_g: 64
      pools: [[0, 1], {seq: 1, k: 0}]
      status: rejected
      ubatch: 1
"""

BASE = "kpool_trace: 1\ncache: {kv_size: 64, kpool: 4, n_seq_max: 2}\nops:\n"


def problems(text: str, **bounds: int) -> list[Problem]:
    with pytest.raises(TraceError) as info:
        load_trace_text(text, "t.yaml", **bounds)
    return info.value.problems


def only(text: str) -> Problem:
    ps = problems(text)
    assert len(ps) == 1, "\n".join(map(str, ps))
    return ps[0]


def at(p: Problem, line: int, column: int, field: str, *words: str) -> None:
    assert (p.file, p.line, p.column, p.field) == ("t.yaml", line, column, field), str(p)
    for w in words:
        assert w in p.message, str(p)


# --- valid traces -------------------------------------------------------------------


def test_spec_example_loads_to_the_model() -> None:
    t = load_trace_text(SPEC_EXAMPLE, "spec.yaml")
    assert t.path == "spec.yaml"
    assert t.sha256 == hashlib.sha256(SPEC_EXAMPLE.encode()).hexdigest()
    assert t.name == "shared-prefix-race"
    assert t.description == "Two slots share a system prompt through seq_cp ...\n"
    assert t.engine == "rep-once" and t.seed == 0
    assert t.cache == CacheConfig(kv_size=64, kpool=4, n_seq_max=4)
    assert t.ops == (
        Decode(tuple(Token(p, (0,)) for p in range(12))),
        SeqCp(0, 1),
        Decode((Token(12, (0,)), Token(12, (1,)))),
        Decode((Token(13, (0, 1)),)),
        SeqRm(1, 0, -1),
        SeqAdd(0, 4, -1, shift=-2),
        SeqDiv(0, 0, -1, d=2),
        SeqKeep(0),
        StateWrite(0, "a"),
        StateRead(2, "a"),
        StateDrop(2),
        Clear(),
        Note("free text shown in the report at this point"),
        Expect(engine="rep-once", findings=(), status="applied"),
    )
    # Loc: the op item's mapping node, 1-based.
    assert [op.loc.line for op in t.ops] == [17, 18, 19, *range(23, 34)]
    assert all(op.loc.column == 5 and op.loc.file == "spec.yaml" for op in t.ops)
    assert t.ops[2].loc == Loc("spec.yaml", 19, 5)


def test_every_other_form_loads_to_the_model() -> None:
    t = load_trace_text(MROPE, "m.yaml")
    assert t.cache == CacheConfig(
        kv_size=8, kpool=2, n_seq_max=2, unified=False, by_order=True, n_ubatch=2
    )
    assert t.name == "" and t.description == "" and t.engine is None and t.seed == 0
    assert t.ops == (
        Decode(tuple(Token(p, (1,), ext=(4, 5)) for p in (3, 1, 2))),
        Decode((Token(7, (0,), cell=3),)),
        Decode(
            (
                Token(0, (0,), ext=(0, 1), cell=0),
                Token(0, (1,), cell=0),  # same cell, other stream: fine
                Token(1, (1, 0), cell=5),
            ),
            ubatches=((0, 1), (2,)),
        ),
        SeqRm(-1),
        SeqCp(1, 1, 0, 3),
        StateDrop(-1),
        Clear(),
        Expect(
            engine="cache-safe", findings=("KP001", "KP007"), n_new=0, n_new_g=64,
            pools=((0, 1), (1, 0)), status="rejected", ubatch=1,
        ),
    )
    assert t.ops[2].is_embd and not t.ops[1].is_embd


def test_load_trace_reads_a_file_and_hashes_its_bytes(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_bytes(SPEC_EXAMPLE.encode())
    t = load_trace(f)
    assert t.path == str(f)
    assert t.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    assert t.ops[0].loc == Loc(str(f), 17, 5)


def test_pos_range_spaces_and_empty_ops() -> None:
    t = load_trace_text(BASE + "  - decode: {seq: 1, pos: ' 3 .. 5'}\n")
    assert t.ops == (Decode((Token(3, (1,)), Token(4, (1,)))),)
    t = load_trace_text("kpool_trace: 1\ncache: {kv_size: 1, kpool: 1}\nops: []\n")
    assert t.ops == () and t.cache == CacheConfig(1, 1)


def test_expect_after_a_note_after_an_op_is_fine() -> None:
    t = load_trace_text(BASE + "  - clear: {}\n  - note: x\n  - expect: {status: applied}\n")
    assert t.ops[2] == Expect(status="applied")


# --- problems: where and what -------------------------------------------------------


def test_yaml_syntax_error_names_the_mark() -> None:
    p = only("kpool_trace: 1\ncache: {kv_size: 64, kpool: 4\nops: []\n")
    at(p, 3, 4, "<yaml>", "invalid YAML", "expected ',' or '}'")


def test_unknown_top_key_suggests() -> None:
    p = only(BASE + "  - clear: {}\nnmae: x\n")
    at(p, 5, 1, "nmae", "unknown key 'nmae'", "did you mean 'name'?")


def test_unknown_cache_key_and_missing_required() -> None:
    ps = problems("kpool_trace: 1\ncache:\n  kv_size: 64\n  kpol: 4\nops: []\n")
    assert len(ps) == 2
    at(ps[0], 3, 3, "cache.kpool", "required key missing")
    at(ps[1], 4, 3, "cache.kpol", "did you mean 'kpool'?")


def test_unknown_op() -> None:
    p = only(BASE + "  - seq_remove: {seq: 0}\n")
    at(p, 4, 5, "ops[0]", "unknown op 'seq_remove'", "did you mean 'seq_rm'?")


def test_op_item_with_two_keys() -> None:
    p = only(BASE + "  - seq_rm: {seq: 0}\n    clear: {}\n")
    at(p, 5, 5, "ops[0]", "exactly one key", "seq_rm, clear")


def test_op_item_not_a_mapping() -> None:
    p = only(BASE + "  - clear\n")
    at(p, 4, 5, "ops[0]", "got a string ('clear')")


def test_bool_is_not_an_int() -> None:
    p = only(BASE + "  - seq_keep: {seq: true}\n")
    at(p, 4, 21, "ops[0].seq_keep.seq", "expected an int", "bool")


def test_int_is_not_a_bool_and_string_is_not_an_int() -> None:
    ps = problems('kpool_trace: 1\ncache: {kv_size: "64", kpool: 4, unified: 1}\nops: []\n')
    assert len(ps) == 2
    at(ps[0], 2, 18, "cache.kv_size", "expected an int", "a string ('64')")
    at(ps[1], 2, 43, "cache.unified", "expected a bool", "an int ('1')")


def test_seq_id_out_of_range() -> None:
    p = only(BASE + "  - seq_keep: {seq: 2}\n")
    at(p, 4, 21, "ops[0].seq_keep.seq", "seq id 2 is out of range", "n_seq_max is 2")
    p = only(BASE + "  - decode: {tokens: [{pos: 0, seq: [0, 5]}]}\n")
    at(p, 4, 41, "ops[0].decode.tokens[0].seq[1]", "seq id 5")
    p = only(BASE + "  - seq_cp: {src: -1, dst: 0}\n")
    at(p, 4, 19, "ops[0].seq_cp.src", "only for seq_rm and state_drop")


def test_p0_below_minus_one() -> None:
    p = only(BASE + "  - seq_rm: {seq: 0, p0: -2}\n")
    at(p, 4, 26, "ops[0].seq_rm.p0", "-1 for no bound")


def test_pos_range_reversed() -> None:
    p = only(BASE + "  - decode: {seq: 0, pos: 5..3}\n")
    at(p, 4, 27, "ops[0].decode.pos", "empty range '5..3'")


def test_pos_out_of_range_in_a_token() -> None:
    text = BASE + f"  - decode:\n      tokens:\n        - {{pos: {POS_LIMIT}, seq: 0}}\n"
    p = only(text)
    at(p, 6, 17, "ops[0].decode.tokens[0].pos", "out of range")


def test_n_rs_seq_defaults_to_0_and_is_bounded() -> None:
    """TRACE_FORMAT.md: cache.n_rs_seq, the recurrent child's rollback depth, default
    0 (llama.cpp without MTP); 0..1024 (N_RS_SEQ_MAX)."""
    assert load_trace_text("kpool_trace: 1\ncache: {kv_size: 8, kpool: 2}\nops: []\n"
                           ).cache.n_rs_seq == 0
    assert load_trace_text("kpool_trace: 1\ncache: {kv_size: 8, kpool: 2, n_rs_seq: 3}\n"
                           "ops: []\n").cache.n_rs_seq == 3
    p = only("kpool_trace: 1\ncache: {kv_size: 8, kpool: 2, n_rs_seq: -1}\nops: []\n")
    at(p, 2, 41, "cache.n_rs_seq", "out of range")
    p = only("kpool_trace: 1\ncache: {kv_size: 8, kpool: 2, n_rs_seq: 1025}\nops: []\n")
    at(p, 2, 41, "cache.n_rs_seq", "out of range")


def test_kpool_larger_than_kv_size() -> None:
    p = only("kpool_trace: 1\ncache: {kv_size: 64, kpool: 65}\nops: []\n")
    at(p, 2, 29, "cache.kpool", "larger than cache.kv_size (64)")


def test_a_large_cache_loads_and_the_memory_budget_decides() -> None:
    """The loader has no fixed kv_size * n_stream * n_embd cap any more: the value
    backend stores only written rows, and `--max-memory` (backend/budget.py) refuses
    what cannot fit, before the replay (tests/test_untrusted.py)."""
    t = load_trace_text("kpool_trace: 1\ncache: {kv_size: 1048576, kpool: 4, n_embd: 4096}\n"
                        "ops: []\n")
    assert t.cache.kv_size * t.cache.n_embd == 2**32


def test_ext_without_by_order() -> None:
    p = only(BASE + "  - decode: {tokens: [{pos: 0, seq: 0, ext: [1, 2]}]}\n")
    at(p, 4, 45, "ops[0].decode.tokens[0].ext", "cache.by_order: true", "cache.by_order is false")
    p = only(BASE + "  - decode: {seq: 0, pos: 0..2, ext: [1, 2]}\n")
    at(p, 4, 38, "ops[0].decode.ext", "by_order")


def test_mixed_cell_and_no_cell() -> None:
    text = BASE + (
        "  - decode:\n"
        "      tokens:\n"
        "        - {pos: 0, seq: 0, cell: 3}\n"
        "        - {pos: 1, seq: 0}\n"
    )
    p = only(text)
    at(p, 7, 11, "ops[0].decode.tokens[1]", "no cell", "ops[0].decode.tokens[0] has one")


def test_duplicate_cell_in_one_stream() -> None:
    text = BASE + (
        "  - decode:\n"
        "      ubatches:\n"
        "        - [{pos: 0, seq: 0, cell: 3}]\n"
        "        - [{pos: 0, seq: 1, cell: 3}]\n"
    )
    p = only(text)
    at(p, 7, 35, "ops[0].decode.ubatches[1][0].cell", "cell 3", "ubatches[0][0]")
    # non-unified: one stream per sequence, so the same cell index is fine
    ok = text.replace("n_seq_max: 2}", "n_seq_max: 2, unified: false}")
    assert len(load_trace_text(ok).ops[0].tokens) == 2


def test_cell_out_of_range_and_cell_with_a_range() -> None:
    p = only(BASE + "  - decode: {seq: 0, pos: 0, cell: 64}\n")
    at(p, 4, 36, "ops[0].decode.cell", "out of range", "kv_size, 64")
    p = only(BASE + "  - decode: {seq: 0, pos: 0..2, cell: 1}\n")
    at(p, 4, 39, "ops[0].decode.cell", "2 positions")


def test_ubatch_larger_than_n_ubatch_and_empty_ubatch() -> None:
    text = (
        "kpool_trace: 1\ncache: {kv_size: 64, kpool: 4, n_ubatch: 1}\nops:\n"
        "  - decode: {ubatches: [[{pos: 0, seq: 0}, {pos: 1, seq: 0}], []]}\n"
    )
    ps = problems(text)
    assert len(ps) == 2
    at(ps[0], 4, 25, "ops[0].decode.ubatches[0]", "more than cache.n_ubatch (1)")
    at(ps[1], 4, 63, "ops[0].decode.ubatches[1]", "must not be empty")


def test_decode_forms_do_not_mix() -> None:
    p = only(BASE + "  - decode: {seq: 0, pos: 0, tokens: [{pos: 0, seq: 0}]}\n")
    at(p, 4, 13, "ops[0].decode", "one form", "tokens, seq, pos")


def test_state_read_of_an_unwritten_slot() -> None:
    text = BASE + "  - state_read: {seq: 0, slot: b}\n  - state_write: {seq: 0, slot: b}\n"
    p = only(text)
    at(p, 4, 32, "ops[0].state_read.slot", "slot 'b' is not written by an earlier state_write")


def test_expect_first_or_after_notes_only() -> None:
    p = only(BASE + "  - expect: {n_new: 1}\n")
    at(p, 4, 5, "ops[0]", "expect has no op before it")
    p = only(BASE + "  - note: hello\n  - expect: {n_new: 1}\n")
    at(p, 5, 5, "ops[1]", "expect has no op before it")


def test_expect_fields() -> None:
    text = BASE + "  - clear:\n  - expect: {findings: [KP01], status: aplied, pools: [[0]]}\n"
    ps = problems(text)
    assert len(ps) == 3
    at(ps[0], 5, 25, "ops[1].expect.findings[0]", "not a finding code")
    at(ps[1], 5, 40, "ops[1].expect.status", "did you mean 'applied'?")
    at(ps[2], 5, 56, "ops[1].expect.pools[0]", "[seq, k]")


def test_clear_takes_nothing_and_note_is_a_string() -> None:
    ps = problems(BASE + "  - clear: {x: 1}\n  - note: 12\n")
    at(ps[0], 4, 13, "ops[0].clear.x", "unknown key 'x'")
    at(ps[1], 5, 11, "ops[1].note", "expected a string", "quote it")


def test_unsupported_version_stops_there() -> None:
    p = only("kpool_trace: 2\ncache: {}\nops: 3\nfoo: 1\n")
    at(p, 1, 14, "kpool_trace", "unsupported format version 2, this kpool reads 1")


def test_missing_version_and_version_as_bool() -> None:
    p = only("cache: {kv_size: 4, kpool: 4}\nops: []\n")
    at(p, 1, 1, "kpool_trace", "required key missing")
    p = only("kpool_trace: true\ncache: {kv_size: 4, kpool: 4}\nops: []\n")
    at(p, 1, 14, "kpool_trace", "expected an int")


def test_python_tag_is_rejected_not_constructed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = BASE + f"  - note: !!python/object/apply:os.system ['touch {marker}']\n"
    p = only(text)
    at(p, 4, 11, "ops[0].note", "tag !!python/object/apply:os.system is not allowed")
    assert not marker.exists()
    p = only(BASE + "  - seq_keep: {seq: !custom 0}\n")
    at(p, 4, 21, "ops[0].seq_keep.seq", "tag !custom is not allowed")


def test_merge_keys_and_duplicate_keys() -> None:
    ps = problems(BASE + "  - seq_rm: {<<: {seq: 0}, seq: 1, seq: 0}\n")
    assert len(ps) == 2
    at(ps[0], 4, 14, "ops[0].seq_rm", "merge keys")
    at(ps[1], 4, 36, "ops[0].seq_rm.seq", "duplicate key 'seq' (first at line 4, column 28)")


def test_aliases_that_stay_small_are_fine() -> None:
    text = BASE + "  - decode: &d {seq: 0, pos: 0..4}\n  - seq_rm: {seq: 0}\n  - decode: *d\n"
    t = load_trace_text(text)
    assert t.ops[0] == t.ops[2]


BILLION_LAUGHS = (
    "kpool_trace: 1\ncache: {kv_size: 64, kpool: 4}\nops: []\n"
    "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 10)
    )
    + "description: *a9\n"
)


def test_billion_laughs_fails_fast() -> None:
    t0 = time.perf_counter()
    p = only(BILLION_LAUGHS)
    assert time.perf_counter() - t0 < 2.0
    # a5 is the first level past 1,000,000 nodes (a_i holds 1 + 10 * |a_{i-1}|): the
    # composer stops at its 8th alias of a4 (line 9, column 45), where the count,
    # aliases expanded, crosses the bound.
    at(p, 9, 45, "a5[7]", "more than 1,000,000 YAML nodes", "*a4 here stands for 111,111")


def _trace_shaped_bomb() -> str:
    """The expansion sits where the walk does go: ops -> decode -> ubatches -> tokens
    (a cache large enough for the 10,000 tokens of each decode)."""
    return "kpool_trace: 1\ncache: {kv_size: 16384, kpool: 4}\nops:\n" + (
        "  - decode:\n"
        "      ubatches: &u [&b [&t {pos: 0, seq: 0}" + ", *t" * 99 + "]" + ", *b" * 99 + "]\n"
        + "  - decode: {ubatches: *u}\n" * 200
    )


def test_trace_shaped_bomb_fails_fast() -> None:
    t0 = time.perf_counter()
    p = only(_trace_shaped_bomb())
    assert time.perf_counter() - t0 < 2.0
    # ops holds 200 aliases of a 50,101-node ubatches list: the 19th alias (ops[19],
    # line 24, column 24) is where the expansion passes the bound.
    at(p, 24, 24, "ops[19].decode.ubatches", "more than 1,000,000 YAML nodes",
       "*u here stands for 50,101 nodes")


@pytest.mark.parametrize("callers", [False, True], ids=["default", "max_nodes"])
def test_the_walk_counts_alias_visits_too(monkeypatch: pytest.MonkeyPatch,
                                          callers: bool) -> None:
    """With the composer's bound lifted, the walk itself stops at the bound: the
    default (MAX_NODE_VISITS) or the caller's (`max_nodes`, --max-nodes)."""
    compose_init = yaml_safe.Composer.__init__

    def lifted(
        self: yaml_safe.Composer, text: str, max_tokens: int, shape: yaml_safe.Shape,
        node_limit: int | None = None,
    ) -> None:
        compose_init(self, text, max_tokens, shape, node_limit)
        self.node_limit = 10**9

    monkeypatch.setattr(yaml_safe.Composer, "__init__", lifted)
    if callers:
        ps = problems(_trace_shaped_bomb(), max_nodes=20_000)
    else:
        monkeypatch.setattr(yaml_safe.limits, "MAX_NODE_VISITS", 20_000)
        t0 = time.perf_counter()
        ps = problems(_trace_shaped_bomb())
        assert time.perf_counter() - t0 < 2.0
    assert "more than 20,000 YAML nodes visited" in ps[-1].message
    assert "--max-nodes" in ps[-1].message
    assert ps[-1].field.startswith("ops[")


def test_recursive_alias_and_deep_nesting() -> None:
    p = only(BASE + "  - note: &n [*n]\n")
    at(p, 4, 15, "ops[0].note[0]", "recursive alias", "*n", "anchored at line 4, column 11")
    t0 = time.perf_counter()
    p = only("[" * 100_000)
    assert time.perf_counter() - t0 < 2.0
    # kpool's composer stops at 33 levels; libyaml's parser (when PyYAML has it) refuses
    # past its own 1000 first, because it scans ahead of the composer
    assert (p.file, p.line, p.field) == ("t.yaml", 1, "<yaml>"), str(p)
    assert p.column in (33, 1001), str(p)
    assert "nest" in p.message, str(p)


def test_a_huge_range_is_refused_unbuilt() -> None:
    t0 = time.perf_counter()
    p = only("kpool_trace: 1\ncache: {kv_size: 16777216, kpool: 4}\nops:\n"
             "  - decode: {seq: 0, pos: 0..5000000}\n")
    assert time.perf_counter() - t0 < 1.0
    at(p, 4, 27, "ops[0].decode.pos", "more than 4,194,304 tokens", "5,000,000 here")


def test_multiple_documents() -> None:
    p = only(BASE + "---\n" + BASE)
    at(p, 4, 1, "<document>", "second YAML document")


def test_empty_document_and_non_mapping_root() -> None:
    at(only(""), 1, 1, "<document>", "empty document")
    at(only("- 1\n"), 1, 1, "<document>", "expected a mapping")


def test_too_big() -> None:
    p = only("#" * (64 * 1024 * 1024 + 1))
    assert (p.line, p.column, p.field) == (0, 0, "<file>") and "64 MiB" in p.message


def test_non_utf8_file(tmp_path: Path) -> None:
    f = tmp_path / "latin1.yaml"
    f.write_bytes(b"kpool_trace: 1\nname: caf\xe9\n")
    with pytest.raises(TraceError) as info:
        load_trace(f)
    (p,) = info.value.problems
    assert (p.file, p.line, p.column, p.field) == (str(f), 0, 0, "<file>")
    assert "not UTF-8" in p.message


def test_missing_file_and_directory(tmp_path: Path) -> None:
    for path in (tmp_path / "nope.yaml", tmp_path):
        with pytest.raises(TraceError) as info:
            load_trace(path)
        (p,) = info.value.problems
        assert (p.file, p.line, p.column, p.field) == (str(path), 0, 0, "<file>")
        assert "cannot read the trace" in p.message


def test_special_characters() -> None:
    p = only(BASE + '  - note: "a\x01"\n')
    at(p, 4, 13, "<yaml>", "U+0001")


def test_problems_are_collected_sorted_and_capped() -> None:
    text = BASE + "".join(f"  - seq_keep: {{seq: {9 + i}}}\n" for i in range(30))
    with pytest.raises(TraceError) as info:
        load_trace_text(text, "t.yaml")
    err = info.value
    assert len(err.problems) == MAX_PROBLEMS and err.truncated
    assert [p.line for p in err.problems] == list(range(4, 4 + MAX_PROBLEMS))
    lines = str(err).splitlines()
    assert lines[0] == (
        "t.yaml:4:21: ops[0].seq_keep.seq: seq id 9 is out of range:"
        " cache.n_seq_max is 2, so seq ids are 0 to 1"
    )
    assert lines[-1] == f"(stopped after {MAX_PROBLEMS} problems)"


def test_several_problems_in_one_trace() -> None:
    text = BASE + (
        "  - decode: {seq: 0, pos: 5..3}\n"
        "  - decod: {seq: 0}\n"
        "  - seq_rm: {seq: true, p0: -3}\n"
    )
    ps = problems(text)
    assert [(p.line, p.column, p.field) for p in ps] == [
        (4, 27, "ops[0].decode.pos"),
        (5, 5, "ops[1]"),
        (6, 19, "ops[2].seq_rm.seq"),
        (6, 29, "ops[2].seq_rm.p0"),
    ]


def test_spec_example_replays_with_every_expect_holding(tmp_path: Path) -> None:
    """A newcomer who saves the page's example and runs `kpool replay --check` sees it
    pass: its expect (on the clear before it, rep-once) holds, no op is refused."""
    f = tmp_path / "example.yaml"
    f.write_text(SPEC_EXAMPLE, encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "kpool_cli", "replay", str(f), "--check",
                        "--backend", "none", "--format", "text"],
                       capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "expect (op 13): ok" in r.stdout and "rejected" not in r.stdout


# --- dump_trace round trip ----------------------------------------------------------


def test_dump_uses_the_shorthand_when_it_round_trips() -> None:
    t = load_trace_text(SPEC_EXAMPLE)
    text = dump_trace(t)
    assert "- decode: {seq: 0, pos: 0..12}" in text
    assert yaml.safe_load(text)["ops"][3] == {"decode": {"seq": [0, 1], "pos": 13}}
    back = load_trace_text(text)
    assert dataclasses.replace(back, path=t.path, sha256=t.sha256) == t
    m = load_trace_text(MROPE)
    doc = yaml.safe_load(dump_trace(m))
    assert "tokens" in doc["ops"][0]["decode"]  # ext: explicit tokens
    assert "ubatches" in doc["ops"][2]["decode"]


_text = st.text(max_size=12)


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    kv_size = draw(st.integers(1, 32))
    cache = CacheConfig(
        kv_size=kv_size,
        kpool=draw(st.integers(1, kv_size)),
        n_seq_max=draw(st.integers(1, 4)),
        unified=draw(st.booleans()),
        by_order=draw(st.booleans()),
        n_ubatch=draw(st.integers(1, 6)),
        n_embd=draw(st.integers(1, 64)),
        n_rs_seq=draw(st.integers(0, 4)),
    )
    seq = st.integers(0, cache.n_seq_max - 1)
    seq_all = st.integers(-1, cache.n_seq_max - 1)
    bound = st.one_of(st.just(-1), st.integers(0, 40), st.integers(0, 2**31 - 1))
    pos = st.one_of(st.integers(0, 40), st.integers(0, POS_LIMIT - 1))
    seq_set = st.lists(seq, min_size=1, max_size=cache.n_seq_max, unique=True).map(tuple)
    ext = st.none() | st.tuples(pos, pos) if cache.by_order else st.none()
    slots: list[str] = []

    def decode() -> Decode:
        form = draw(st.sampled_from(["short", "tokens", "ubatches"]))
        if form == "short":
            s, start = draw(seq_set), draw(st.integers(0, 40))
            n = draw(st.integers(1, min(5, kv_size)))  # a decode fits its stream
            return Decode(tuple(Token(p, s) for p in range(start, start + n)))
        n = draw(st.integers(1, min(6, kv_size)))
        cells: list[int | None] = [None] * n
        if draw(st.booleans()):
            cells = draw(st.lists(st.integers(0, kv_size - 1), min_size=n, max_size=n,
                                  unique=True))
        tokens = tuple(
            Token(draw(pos), draw(seq_set), draw(ext), cells[i]) for i in range(n)
        )
        if form == "tokens":
            return Decode(tokens)
        split, i = [], 0
        while i < n:
            k = draw(st.integers(1, min(cache.n_ubatch, n - i)))
            split.append(tuple(range(i, i + k)))
            i += k
        # split_equal's ubatches hold equal or disjoint sequence sets (ENGINE.md §3);
        # on a non-unified cache, one block per sequence, equal, in ascending seq id:
        # here one set, or two sequences of half the ubatch each
        fixed = list(tokens)
        for ub in split:
            if not cache.unified:
                two = (len(ub) % 2 == 0 and cache.n_seq_max > 1 and draw(st.booleans()))
                pair = sorted(draw(st.lists(seq, min_size=2, max_size=2, unique=True))
                              ) if two else None
                for at, j in enumerate(ub):
                    t = fixed[j]
                    ss = fixed[ub[0]].seq if pair is None else (pair[2 * at // len(ub)],)
                    fixed[j] = Token(t.pos, ss, t.ext, t.cell)
                continue
            sets: list[tuple[int, ...]] = []
            for j in ub:
                t = fixed[j]
                clash = next((o for o in sets if set(o) & set(t.seq)), None)
                if clash is None:
                    sets.append(t.seq)
                else:
                    fixed[j] = Token(t.pos, clash, t.ext, t.cell)
        return Decode(tuple(fixed), tuple(split))

    def op(kind: str):
        match kind:
            case "decode":
                return decode()
            case "seq_rm":
                return SeqRm(draw(seq_all), draw(bound), draw(bound))
            case "seq_cp":
                return SeqCp(draw(seq), draw(seq), draw(bound), draw(bound))
            case "seq_keep":
                return SeqKeep(draw(seq))
            case "seq_add":
                return SeqAdd(draw(seq), draw(bound), draw(bound),
                              draw(st.integers(-(2**31), 2**31 - 1)))
            case "seq_div":
                return SeqDiv(draw(seq), draw(bound), draw(bound), draw(st.integers(1, 99)))
            case "state_write":
                slot = draw(st.text(min_size=1, max_size=6))
                slots.append(slot)
                return StateWrite(draw(seq), slot)
            case "state_read":
                if not slots:
                    return Clear()
                return StateRead(draw(seq), draw(st.sampled_from(slots)))
            case "state_drop":
                return StateDrop(draw(seq_all))
            case "clear":
                return Clear()
            case "note":
                return Note(draw(_text))
            case _:
                return Expect(
                    engine=draw(st.none() | st.sampled_from(["cache-safe", "rep-once"])),
                    findings=draw(st.none() | st.lists(
                        st.from_regex(r"\AKP[0-9]{3}\Z"), unique=True, max_size=3
                    ).map(tuple)),
                    n_new=draw(st.none() | st.integers(0, 100)),
                    n_new_g=draw(st.none() | st.integers(0, 100)),
                    pools=draw(st.none() | st.lists(st.tuples(seq, st.integers(0, 9)),
                                                    unique=True, max_size=3).map(tuple)),
                    status=draw(st.none() | st.sampled_from(["applied", "rejected", "aborted"])),
                    ubatch=draw(st.integers(-1, 3)),
                )

    kinds = draw(st.lists(st.sampled_from([
        "decode", "decode", "seq_rm", "seq_cp", "seq_keep", "seq_add", "seq_div",
        "state_write", "state_read", "state_drop", "clear", "note", "expect",
    ]), max_size=10))
    ops, after_op = [], False
    for kind in kinds:
        o = op(kind)
        if o.kind == "expect" and not after_op:
            continue
        after_op = after_op or o.kind not in ("note", "expect")
        ops.append(o)
    return Trace(
        cache=cache,
        ops=tuple(ops),
        name=draw(_text),
        description=draw(_text),
        engine=draw(st.none() | st.sampled_from(["cache-safe", "rep-once"])),
        seed=draw(st.integers(0, 2**64 - 1)),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_dump_round_trips(t: Trace) -> None:
    text = dump_trace(t)
    back = load_trace_text(text)
    assert dataclasses.replace(back, path=t.path, sha256=t.sha256) == t
    # and the canonical text validates against the published schema
    jsonschema.Draft202012Validator(trace_schema()).validate(yaml.safe_load(text))


def test_dump_keeps_a_nel_character() -> None:
    """PyYAML reads a raw U+0085 in a single-quoted scalar back as a line fold."""
    t = Trace(CacheConfig(4, 2), (Clear(), Note("a\x85b")), name="caf\u00e9\x85")
    back = load_trace_text(dump_trace(t))
    assert back.ops == t.ops and back.name == t.name
    assert "café" in dump_trace(dataclasses.replace(t, name="café", ops=()))


# --- schemas ------------------------------------------------------------------------


def test_schemas_are_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(trace_schema())
    jsonschema.Draft202012Validator.check_schema(report_schema())
    assert trace_schema()["additionalProperties"] is False
    assert report_schema()["$defs"]["report"]["additionalProperties"] is True


@pytest.mark.parametrize(
    "path", sorted(TRACES_DIR.rglob("*.yaml")) + sorted(TRACES_DIR.rglob("*.yml")),
    ids=lambda p: str(p.relative_to(TRACES_DIR)),
)
def test_trace_schema_accepts_the_shipped_traces(path: Path) -> None:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(trace_schema()).validate(doc)
    load_trace(path)


def test_trace_schema_accepts_the_examples_and_rejects_unknown_keys() -> None:
    v = jsonschema.Draft202012Validator(trace_schema())
    for text in (SPEC_EXAMPLE, MROPE):
        v.validate(yaml.safe_load(text))
    doc = yaml.safe_load(SPEC_EXAMPLE)
    doc["cache"]["kv_sise"] = 3
    with pytest.raises(jsonschema.ValidationError, match="kv_sise"):
        v.validate(doc)
    doc = yaml.safe_load(SPEC_EXAMPLE)
    doc["ops"][0]["decode"]["tokenz"] = []
    assert not v.is_valid(doc)
    doc = yaml.safe_load(SPEC_EXAMPLE)
    doc["ops"][0]["decode"]["pos"] = "5..x"
    assert not v.is_valid(doc)


def test_report_schema_accepts_a_full_report() -> None:
    finding = {"code": "KP001", "name": "scatter-race", "severity": "error",
               "message": "...", "rows": [3], "seqs": [0, 1],
               "tokens": [{"pos": 3, "seq": 0}], "pools": [[0, 0], [1, 0]]}
    report = {
        "kpool_report": 1,
        "tool": {"name": "kpool", "version": "0.1.0"},
        "trace": {"path": "t.yaml", "name": "", "sha256": "0" * 64},
        "engine": "rep-once",
        "backend": None,
        "config": CacheConfig(64, 4).as_dict(),
        "events": [{"op": 1, "kind": "seq_cp", "status": "applied", "stale": {"1": 0},
                    "findings": [finding], "message": "x"}],
        "ubatches": [{
            "index": 0, "op": 0, "batch_ubatch": 0,
            "tokens": [{"pos": 0, "seq": [0], "cell": 0, "ext": [1, 2]}],
            "stale_batch": {"0": 0},
            "n_pool_real": 3, "n_new": 3, "n_new_g": 3,
            "pools": [{"seq": 0, "k": 0, "first_pos": 0, "last_pos": 3,
                       "cells": [0, 1, 2, 3], "rep": 3, "new": True}],
            "scatter": [{"rep": 3, "cells": [0, 1, 2, 3], "pad": False}],
            "cost": {"cells_scanned": 12, "pools_marked": 3, "rows_gathered": 3,
                     "scatter_entries": 3, "gen_zeroed": 64, "reps_sorted": 0},
            "findings": [finding],
            "extra_field": "additions are allowed",
        }],
        "expectations": [{"op": 2, "ok": False, "message": "n_new 3, expected 1"}],
        "summary": {"ubatches": 1, "findings": {"KP001": 1}, "pools_marked": 3,
                    "status": "fail"},
    }
    v = jsonschema.Draft202012Validator(report_schema())
    v.validate(report)
    bad = {**report, "summary": {**report["summary"], "status": "ok"}}
    assert not v.is_valid(bad)


@pytest.mark.parametrize("ubatch, field", [
    # ENGINE.md §3: split_equal takes a set only if it overlaps none taken, so a
    # ubatch's sets are equal or disjoint: {0} then {0, 1} is no ubatch it makes
    ("[{pos: 0, seq: [0]}, {pos: 1, seq: [0, 1]}]", "ubatches[0][1].seq"),
    ("[{pos: 5, seq: [0]}, {pos: 6, seq: [1]}, {pos: 7, seq: [1, 0]}]",
     "ubatches[0][2].seq"),
])
def test_a_recorded_ubatch_holds_equal_or_disjoint_sets(ubatch: str, field: str) -> None:
    text = ("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4, n_seq_max: 2}\nops:\n"
            f"  - decode: {{ubatches: [{ubatch}]}}\n")
    with pytest.raises(TraceError) as e:
        load_trace_text(text, "r.yaml")
    (p,) = e.value.problems
    assert (p.line, p.field) == (4, f"ops[0].decode.{field}")
    assert "overlaps set" in p.message and "split_equal" in p.message
    # the same sets in two ubatches, or equal sets in one, load
    ok = ("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4, n_seq_max: 2}\nops:\n"
          "  - decode: {ubatches: [[{pos: 0, seq: [0, 1]}, {pos: 1, seq: [1, 0]}],"
          " [{pos: 2, seq: [0]}]]}\n")
    assert load_trace_text(ok, "ok.yaml").ops[0].ubatches == ((0, 1), (2,))


@pytest.mark.parametrize("ubatch, field, says", [
    # llama_kv_cache::find_slot, n_stream > 1: GGML_ASSERT(n_tokens % n_seqs_unq == 0)
    ("[{pos: 0, seq: 0}, {pos: 1, seq: 0}, {pos: 0, seq: 1}]", "ubatches[0]",
     "3 tokens of 2 sequences"),
    # block 0's first token must be seq_id_unq[0], the smallest: seq 0
    ("[{pos: 0, seq: 1}, {pos: 0, seq: 0}]", "ubatches[0][0].seq",
     "seq 1 in the block of seq 0"),
    # the asserts pass (blocks of 2 start with seq 0, then seq 1), but token 1 (seq 1)
    # would go to seq 0's stream: no split llama.cpp makes, and kpool does not model it
    ("[{pos: 0, seq: 0}, {pos: 0, seq: 1}, {pos: 1, seq: 1}, {pos: 1, seq: 0}]",
     "ubatches[0][1].seq", "seq 1 in the block of seq 0"),
])
def test_a_recorded_ubatch_of_a_non_unified_cache_is_one_block_per_sequence(
        ubatch: str, field: str, says: str) -> None:
    """ENGINE.md §3: a non-unified cache's split_equal (sequential) makes one block per
    sequence, equal in size, in ascending seq id; llama_kv_cache::find_slot asserts it
    and places each block in its sequence's stream."""
    head = ("kpool_trace: 1\ncache: {kv_size: 16, kpool: 4, n_seq_max: 2, unified: false}"
            "\nops:\n")
    with pytest.raises(TraceError) as e:
        load_trace_text(head + f"  - decode: {{ubatches: [{ubatch}]}}\n", "r.yaml")
    (p,) = e.value.problems
    assert (p.line, p.field) == (4, f"ops[0].decode.{field}")
    assert p.message.startswith(says) and "find_slot" in p.message
    # blocks in ascending seq id load; so do coupled tokens, which the replay refuses
    ok = head + ("  - decode: {ubatches: [[{pos: 0, seq: 0}, {pos: 1, seq: 0},"
                 " {pos: 0, seq: 1}, {pos: 1, seq: 1}], [{pos: 2, seq: [1, 0]}]]}\n")
    assert load_trace_text(ok, "ok.yaml").ops[0].ubatches == ((0, 1, 2, 3), (4,))
