"""Tests of trace.load's bounds ("refuse before spending"): every
bound is checked while the YAML is composed, or from a range's ends before the range
is built, and the refusal names file, line, column, field and the bound crossed; and
ints are plain decimal, with what to write instead of YAML 1.1's other forms.

No test times anything: boundedness is shown by how many nodes the composer made
before stopping, by `Token` never being called for a refused range, and by loading
8 MB hostile files in a child process whose address space is capped."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kpool_cli.contracts.records import ABORTED
from kpool_cli.replay import replay
from kpool_cli.trace import yaml_safe
from kpool_cli.trace.load import (
    LISTED_PAST_THE_CACHE,
    MAX_NODE_VISITS,
    MAX_OPS,
    MAX_TOKENS,
    Problem,
    TraceError,
    load_trace,
    load_trace_text,
)
from kpool_cli.trace.load import decode as decode_mod
from kpool_cli.trace.model import Decode, Span, Token
from kpool_cli.trace.yaml_safe import limits
from kpool_cli.versions import REP_ONCE

ROOT = Path(__file__).resolve().parent.parent
HEAD = "kpool_trace: 1\ncache: {kv_size: 64, kpool: 4, n_seq_max: 2}\nops:\n"


def problems(text: str, **kw: int) -> list[Problem]:
    with pytest.raises(TraceError) as info:
        load_trace_text(text, "t.yaml", **kw)
    return info.value.problems


def only(text: str, **kw: int) -> Problem:
    ps = problems(text, **kw)
    assert len(ps) == 1, "\n".join(map(str, ps))
    return ps[0]


def at(p: Problem, line: int, column: int, field: str, *words: str) -> None:
    assert (p.file, p.line, p.column, p.field) == ("t.yaml", line, column, field), str(p)
    for w in words:
        assert w in p.message, str(p)


@pytest.fixture
def composers(monkeypatch: pytest.MonkeyPatch) -> list[yaml_safe.Composer]:
    """Every composer made by the loads of the test, to see how far each one got."""
    made: list[yaml_safe.Composer] = []
    init = yaml_safe.Composer.__init__

    def spy(
        self: yaml_safe.Composer, text: str, max_tokens: int, shape: yaml_safe.Shape,
        node_limit: int | None = None,
    ) -> None:
        init(self, text, max_tokens, shape, node_limit)
        made.append(self)

    monkeypatch.setattr(yaml_safe.Composer, "__init__", spy)
    return made


@pytest.fixture
def tokens_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many `Token`s the loader built (one count a token, made alone or by
    `Token.each`)."""
    calls: list[int] = []

    class Counting:
        def __call__(self, *args: object, **kw: object) -> Token:
            calls.append(1)
            return Token(*args, **kw)  # type: ignore[arg-type]

        def each(self, *args: object, **kw: object) -> tuple[Token, ...]:
            made = Token.each(*args, **kw)  # type: ignore[arg-type]
            calls.extend([1] * len(made))
            return made

    monkeypatch.setattr(decode_mod, "Token", Counting())
    return calls


# --- bounds checked while composing -------------------------------------------------


def test_a_long_ops_list_stops_at_the_op_bound(composers: list) -> None:
    text = HEAD.replace("ops:\n", "ops: [") + "clear, " * (MAX_OPS + 5000) + "clear]\n"
    p = only(text)
    at(p, 3, 7 + 7 * MAX_OPS, f"ops[{MAX_OPS}]", f"more than {MAX_OPS:,} ops")
    assert "alias" not in p.message
    (c,) = composers
    assert c.nodes <= MAX_OPS + 20  # the 5,000 items past the bound were never composed


def test_a_block_list_of_ops_stops_at_the_op_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_OPS", 100)
    p = only(HEAD + "  - clear: {}\n" * 150)
    at(p, 104, 5, "ops[100]", "more than 100 ops in the trace")


def test_a_pos_list_past_what_kpool_builds_stops_at_the_first_token_past_it(
    composers: list,
) -> None:
    """A listed decode larger than the cache is llama_decode's refusal (KP006 at replay),
    built up to LISTED_PAST_THE_CACHE tokens; a longer list stops the composer there."""
    cap = LISTED_PAST_THE_CACHE
    text = HEAD + "  - decode: {seq: 0, pos: [" + "0, " * (cap + 1000) + "0]}\n"
    p = only(text)
    at(p, 4, 28 + 3 * cap, f"ops[0].decode.pos[{cap}]",
       f"a decode listing more than {cap:,} tokens", "write it as a range (pos: A..B)")
    (c,) = composers
    assert c.nodes < cap + 100


def test_a_listed_decode_larger_than_the_cache_loads_and_aborts_at_replay() -> None:
    """5,000 listed tokens in a unified cache of 64 cells: a valid trace, which
    llama_decode's assert on n_batch (at most the context, 64) aborts: KP005, and the
    replay ends (docs/ENGINE.md §3)."""
    text = (HEAD + "  - decode:\n      tokens:\n" + "        - {pos: 0, seq: [0]}\n" * 5000
            + "  - decode: {seq: 0, pos: 0..3}\n")
    t = load_trace_text(text)
    assert len(t.ops[0].tokens) == 5000
    (ev,) = list(replay(t, REP_ONCE))
    assert ev.status == ABORTED and [f.code for f in ev.findings] == ["KP005"]


def test_max_tokens_help_fits_every_command_that_takes_it() -> None:
    """`--max-tokens` is declared once (cli/options.py `load_bounds`) for replay, check,
    diff and validate: its help says what each does, refuse a trace while reading it,
    never "before replaying" (validate never replays)."""
    from click.testing import CliRunner

    from kpool_cli.cli.main import cli

    for command in ("replay", "check", "diff", "validate"):
        r = CliRunner().invoke(cli, [command, "--help"], terminal_width=200)
        assert r.exit_code == 0, r.output
        line = next(ln for ln in r.output.splitlines() if "--max-tokens" in ln)
        assert "Refuse, while reading it, a trace of more than N tokens" in line, line
        assert "replaying" not in line, line


def test_the_token_bound_stops_a_list_while_composing(composers: list) -> None:
    big = "kpool_trace: 1\ncache: {kv_size: 4096, kpool: 4}\nops:\n"
    text = big + "  - decode: {seq: 0, pos: [" + "0, " * 500 + "0]}\n"
    p = only(text, max_tokens=100)
    at(p, 4, 28 + 3 * 100, "ops[0].decode.pos[100]", "more than 100 tokens in the trace",
       "--max-tokens")
    assert composers[0].nodes < 130
    # across decodes and ubatches, aliases counted as what they stand for
    text = big + (
        "  - decode: {ubatches: &u [[{pos: 0, seq: 0}, {pos: 1, seq: 0}], [{pos: 2, seq: 0}]]}\n"
        "  - seq_rm: {seq: 0}\n"
        "  - decode: {ubatches: *u}\n"
    )
    assert len(load_trace_text(text, max_tokens=6).ops) == 3
    at(only(text, max_tokens=5), 6, 24, "ops[2].decode.ubatches", "more than 5 tokens")


def test_other_lists_and_mappings_are_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_ITEMS", 100)
    p = only(HEAD + "  - clear:\njunk: [" + "0, " * 200 + "0]\n")
    at(p, 5, 8 + 3 * 100, "junk[100]", "a list of more than 100 items")
    keys = "".join(f"k{i}: 0, " for i in range(150))
    p = only(HEAD + "  - seq_keep: {" + keys + "seq: 0}\n")
    assert (p.line, p.field) == (4, "ops[0].seq_keep")
    assert "a mapping of more than 100 keys" in p.message


def test_the_node_bound_names_the_node_and_blames_no_alias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "MAX_NODE_VISITS", 1000)
    text = HEAD + "  - decode: {tokens: [{pos: 0, seq: 0}]}\n" * 200
    p = only(text)
    assert p.field.startswith("ops[") and p.line > 4, str(p)
    assert "more than 1,000 YAML nodes in the trace" in p.message
    assert "alias" not in p.message


def test_an_alias_is_counted_as_what_it_stands_for_only_where_it_means_tokens() -> None:
    """ext: *p reuses a pos list as an ext pair: two ints, not two more tokens."""
    text = (
        "kpool_trace: 1\ncache: {kv_size: 8, kpool: 2, by_order: true}\nops:\n"
        "  - decode: {seq: 0, pos: &p [1, 2], ext: *p}\n"
    )
    t = load_trace_text(text, max_tokens=2)
    assert t.ops == (Decode((Token(1, (0,), ext=(1, 2)), Token(2, (0,), ext=(1, 2)))),)


def test_max_tokens_must_be_positive() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_tokens"):
            load_trace_text(HEAD, max_tokens=bad)  # type: ignore[arg-type]


# --- the node bound a caller chooses (--max-nodes) ------------------------------------

def recorded(n: int) -> str:
    """A recorder's trace: one decode of `n` token lines, 5 nodes each (the composer's
    count), past 256 of them read by the loader's scan of token lines."""
    return ("kpool_trace: 1\ncache: {kv_size: 4096, kpool: 4}\nops:\n- decode:\n"
            "    tokens:\n" + "".join(f"    - {{pos: {i}, seq: 0}}\n" for i in range(n)))


PLAIN = HEAD + "  - decode: {tokens: [{pos: 0, seq: 0}]}\n  - seq_rm: {seq: 0}\n" * 100


@pytest.mark.parametrize("text", [recorded(600), PLAIN], ids=["token-lines", "plain"])
def test_the_caller_chooses_the_node_bound(text: str, monkeypatch: pytest.MonkeyPatch,
                                           composers: list) -> None:
    """`max_nodes` replaces MAX_NODE_VISITS both ways, in the composer (its scan of
    token lines included) and in the walk: 600 token lines are 3,000 nodes and more,
    the plain text's 100 decodes and seq_rm 1,200 and more (8 and 4 a pair of ops)."""
    n_ops = len(load_trace_text(text).ops)
    composers.clear()
    p = only(text, max_nodes=1000)
    assert "more than 1,000 YAML nodes in the trace" in p.message, str(p)
    assert "--max-nodes" in p.message and p.line > 4, str(p)
    # the composer stopped there: it made the nodes up to the bound, no more
    assert max(c.nodes for c in composers) <= 1001
    monkeypatch.setattr(limits, "MAX_NODE_VISITS", 1000)  # the default, lowered
    assert "more than 1,000 YAML nodes" in only(text).message
    assert len(load_trace_text(text, max_nodes=50_000).ops) == n_ops


def test_max_nodes_must_be_positive() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_nodes"):
            load_trace_text(HEAD, max_nodes=bad)  # type: ignore[arg-type]


# --- a decode that can never be placed, and ranges checked before they are built ----


def test_a_range_longer_than_the_cache_loads_unbuilt_as_a_span(tokens_built: list) -> None:
    t = load_trace_text(HEAD + "  - decode: {seq: 0, pos: 0..4194304}\n")
    (op,) = t.ops
    assert op.tokens == () and op.span == Span((0,), 0, 4194304)
    assert op.n_tokens == 4194304 and tokens_built == []
    # exactly the cache's size is built
    assert len(load_trace_text(HEAD + "  - decode: {seq: 0, pos: 0..64}\n").ops[0].tokens) == 64


def test_non_unified_a_range_is_a_span_past_its_own_stream(tokens_built: list) -> None:
    """Stream 1 has 4 cells: a range of 5 for seq 1 is a span, although the cache as a
    whole (kv_size * n_stream = 8 cells) would have room; listed, the 5 tokens of seq 1
    are built (and refused at replay)."""
    head = "kpool_trace: 1\ncache: {kv_size: 4, kpool: 2, n_seq_max: 2, unified: false}\nops:\n"
    (op,) = load_trace_text(head + "  - decode: {seq: 1, pos: 0..5}\n").ops
    assert op.span == Span((1,), 0, 5) and tokens_built == []
    assert load_trace_text(head + "  - decode: {seq: 1, pos: 0..4}\n").ops[0].span is None
    toks = "".join(f"{{pos: {i}, seq: 1}}, " for i in range(5))
    t = load_trace_text(head + f"  - decode: {{tokens: [{{pos: 0, seq: 0}}, {toks[:-2]}]}}\n")
    assert len(t.ops[0].tokens) == 6


def test_a_token_of_several_sequences_takes_one_cell() -> None:
    """kv_size 2: two coupled tokens fit (one cell each, shared by seqs 0 and 1); a
    third token is one more than the whole cache holds: llama_decode's assert on
    n_batch (at most the context, 2 cells) aborts the decode."""
    head = "kpool_trace: 1\ncache: {kv_size: 2, kpool: 1, n_seq_max: 2}\nops:\n"
    two = "{pos: 0, seq: [0, 1]}, {pos: 1, seq: [0, 1]}"
    t = load_trace_text(head + f"  - decode: {{tokens: [{two}]}}\n")
    assert [r.token_rows.tolist() for r in replay(t, REP_ONCE)] == [[0, 1]]
    three = f"  - decode: {{ubatches: [[{two}], [{{pos: 2, seq: [1, 0]}}]]}}\n"
    (ev,) = list(replay(load_trace_text(head + three), REP_ONCE))
    assert ev.status == ABORTED and [f.code for f in ev.findings] == ["KP005"]


def test_a_range_past_the_token_budget_is_refused_unbuilt(tokens_built: list) -> None:
    head = "kpool_trace: 1\ncache: {kv_size: 4096, kpool: 4}\nops:\n"
    text = head + "  - decode: {seq: 0, pos: 0..60}\n  - decode: {seq: 0, pos: 60..120}\n"
    p = only(text, max_tokens=100)
    at(p, 5, 27, "ops[1].decode.pos", "more than 100 tokens in the trace (60 here, 60 before)")
    assert len(tokens_built) == 60  # the first decode only
    assert len(load_trace_text(text, max_tokens=120).ops) == 2
    assert MAX_TOKENS == 2**22  # the default


# --- ints: plain decimal only -------------------------------------------------------

INT_FORMS = [
    # (as written, words the problem must hold)
    ("010", ["'010'", "a leading zero", "YAML 1.1 reads it as octal: 8", "write 10"]),
    ("09", ["'09'", "a leading zero", "write 9"]),
    ("1:20", ["'1:20'", "base 60, as 80", "write 80"]),
    ("0x1F", ["'0x1F'", "hexadecimal", "write 31"]),
    ("0o17", ["'0o17'", "octal", "write 15"]),
    ("0b101", ["'0b101'", "binary", "write 5"]),
    ("1_000", ["'1_000'", "digit separators", "write 1000"]),
    ("+5", ["'+5'", "'+' sign", "write 5"]),
    ("1e3", ["'1e3'", "written as a float", "write 1000"]),
    ("2.0", ["'2.0'", "written as a float", "write 2"]),
    ("2.5", ["'2.5'", "not a whole number"]),
]


@pytest.mark.parametrize(("written", "words"), INT_FORMS, ids=[w for w, _ in INT_FORMS])
def test_yaml_1_1_int_forms_are_refused_with_what_to_write(written: str, words: list) -> None:
    # The resolver tags these differently (010, 1:20, 0x1F, 0b101, 1_000, +5: int;
    # 0o17, 09, 1e3: str; 2.0: float): each is the same located problem.
    p = only(HEAD + f"  - seq_rm: {{seq: 0, p0: {written}}}\n")
    at(p, 4, 26, "ops[0].seq_rm.p0", "expected a plain decimal int", *words)


INT_FIELDS = [
    # (trace with X where the int goes, its field)
    ("kpool_trace: X\ncache: {kv_size: 4, kpool: 1}\nops: []\n", "kpool_trace"),
    ("kpool_trace: 1\ncache: {kv_size: X, kpool: 1}\nops: []\n", "cache.kv_size"),
    ("kpool_trace: 1\ncache: {kv_size: 4, kpool: 1, n_ubatch: X}\nops: []\n",
     "cache.n_ubatch"),
    ("kpool_trace: 1\nseed: X\ncache: {kv_size: 4, kpool: 1}\nops: []\n", "seed"),
    (HEAD + "  - decode: {seq: X, pos: 0}\n", "ops[0].decode.seq"),
    (HEAD + "  - decode: {seq: 0, pos: X}\n", "ops[0].decode.pos"),
    (HEAD + "  - decode: {seq: 0, pos: [1, X]}\n", "ops[0].decode.pos[1]"),
    (HEAD + "  - decode: {tokens: [{pos: 0, seq: [0, X]}]}\n",
     "ops[0].decode.tokens[0].seq[1]"),
    (HEAD + "  - decode: {tokens: [{pos: 0, seq: 0, cell: X}]}\n",
     "ops[0].decode.tokens[0].cell"),
    (HEAD.replace("n_seq_max: 2", "by_order: true")
     + "  - decode: {seq: 0, pos: 0, ext: [1, X]}\n", "ops[0].decode.ext[1]"),
    (HEAD + "  - seq_add: {seq: 0, shift: X}\n", "ops[0].seq_add.shift"),
    (HEAD + "  - seq_div: {seq: 0, d: X}\n", "ops[0].seq_div.d"),
    (HEAD + "  - seq_cp: {src: 0, dst: 1, p1: X}\n", "ops[0].seq_cp.p1"),
    (HEAD + "  - clear:\n  - expect: {n_new: X}\n", "ops[1].expect.n_new"),
    (HEAD + "  - clear:\n  - expect: {pools: [[0, X]]}\n", "ops[1].expect.pools[0][1]"),
]


@pytest.mark.parametrize(("text", "field"), INT_FIELDS, ids=[f for _, f in INT_FIELDS])
def test_every_int_field_takes_plain_decimal_only(text: str, field: str) -> None:
    before = text[: text.index("X")]
    line, column = before.count("\n") + 1, len(before) - before.rfind("\n")
    for written, what in (("010", "octal: 8"), ("0x10", "hexadecimal"), ("1:20", "base 60"),
                          ("0o17", "octal")):
        p = only(text.replace("X", written))
        at(p, line, column, field, f"got '{written}'", what)
    assert "got a string ('5')" in only(text.replace("X", '"5"')).message  # quoted: a string


def test_a_range_takes_the_same_digits() -> None:
    for written, words in (
        ("010..20", ["in the range '010..20'", "a leading zero", "write 10"]),
        ("1..0x20", ["in the range '1..0x20'", "hexadecimal", "write 32"]),
        ("1_0..20", ["in the range '1_0..20'", "digit separators", "write 10"]),
        ("+1..5", ["'+' sign", "write 1"]),
    ):
        at(only(HEAD + f"  - decode: {{seq: 0, pos: {written}}}\n"), 4, 27,
           "ops[0].decode.pos", *words)
    p = only(HEAD + "  - decode: {seq: 0, pos: -1..5}\n")
    at(p, 4, 27, "ops[0].decode.pos", "starts below 0")
    t = load_trace_text(HEAD + "  - decode: {seq: 0, pos: 0..2}\n  - decode: {seq: 1, pos: 9}\n")
    assert [tk.pos for op in t.ops for tk in op.tokens] == [0, 1, 9]


RANGE_NEAR_MISSES = [
    # (pos as written, words the problem must hold): a range written some other way is
    # told how a range is written (half-open), never that pos must be an int
    ("0-4", ["got a string ('0-4')", "did you mean 0..4?", "pos 4 is not in it",
             "0..5 holds it too"]),
    ("0 - 4", ["did you mean 0..4?"]),
    ("0\u20134", ["did you mean 0..4?"]),
    ('"0:4"', ["did you mean 0..4?"]),
    ("1:20", ["got '1:20'", "did you mean 1..20?", "base 60, as 80"]),
    ("0...4", ["did you mean 0..4?"]),
    ("0..", ["a range is written A..B, both ends given"]),
    ("..4", ["a range is written A..B, both ends given"]),
    ("4-0", ["a range is written A..B, both ends given, A < B"]),
]


@pytest.mark.parametrize(("written", "words"), RANGE_NEAR_MISSES,
                         ids=[w for w, _ in RANGE_NEAR_MISSES])
def test_a_range_written_some_other_way_is_told_how_a_range_is_written(
        written: str, words: list) -> None:
    p = only(HEAD + f"  - decode: {{seq: 0, pos: {written}}}\n")
    at(p, 4, 27, "ops[0].decode.pos",
       "expected a position, a range 'A..B' or a list of positions", *words)
    assert "plain decimal int" not in p.message, str(p)


def test_a_huge_int_is_refused_by_its_size_never_echoed() -> None:
    digits = "9" * 5000
    for text, field in (
        (HEAD + f"  - seq_keep: {{seq: {digits}}}\n", "ops[0].seq_keep.seq"),
        (HEAD.replace("kv_size: 64", f"kv_size: {digits}") + "  - clear:\n", "cache.kv_size"),
        (HEAD + f"  - clear:\nseed: -{digits}\n", "seed"),
        (HEAD + f"  - decode: {{seq: 0, pos: 1..{digits}}}\n", "ops[0].decode.pos"),
    ):
        p = only(text)
        assert p.field == field, str(p)
        assert "of 5000 digits" in p.message, str(p)
        assert "9" * 50 not in str(p) and len(str(p)) < 300, str(p)
    p = only(HEAD + f"  - seq_keep: {{seq: 0x{'F' * 5000}}}\n")
    assert "hexadecimal" in p.message and len(str(p)) < 300, str(p)


def test_problems_quote_at_most_40_characters_of_a_scalar() -> None:
    long = "z" * 5000
    texts = [
        HEAD + f"  - seq_keep: {{seq: {long}}}\n",  # _what
        HEAD + f"  - seq_keep:\n      ? {long}\n      : 0\n",  # unknown key (and field)
        HEAD + f"  - ? {long}\n    : {{}}\n",  # unknown op
        HEAD + f"  - state_read: {{seq: 0, slot: {long}}}\n",
        HEAD + f"  - clear:\n  - expect: {{findings: [{long}], status: {long}}}\n",
        HEAD + f"  - note: !{long} x\n",  # a tag
        HEAD + f"  - note: *{long}\n",  # an undefined alias
        HEAD + f"  - note: &{long} [*{long}]\n",  # a recursive one
        HEAD + f"  - clear:\nengine: {long}\n",
        HEAD + f"  - decode: {{seq: 0, pos: '{long}..{long}'}}\n",
    ]
    for text in texts:
        for p in problems(text):
            assert "z" * 41 not in str(p) and len(str(p)) < 400, str(p)


# --- real sizes load; hostile 8 MB files stay small ---------------------------------


def _recorded(n_decodes: int) -> str:
    """Like a recorded llama-server trace: decodes of 64 explicit tokens, 4 slots."""
    out = ["kpool_trace: 1\ncache: {kv_size: 32768, kpool: 64, n_seq_max: 4}\nops:\n"]
    pos = [0] * 4
    for i in range(n_decodes):
        s = i % 4
        out.append("  - decode:\n      tokens:\n")
        out.extend(f"        - {{pos: {p}, seq: [{s}]}}\n" for p in range(pos[s], pos[s] + 64))
        pos[s] += 64
    return "".join(out)


def test_a_real_size_trace_fits_the_bounds(composers: list) -> None:
    """2,100 decodes of 64 tokens (134,400 tokens) must load: a tenth of it, composed,
    scaled up, is within every bound."""
    t = load_trace_text(_recorded(210))
    assert sum(len(op.tokens) for op in t.ops) == 210 * 64
    (c,) = composers
    assert c.nodes * 10 < MAX_NODE_VISITS * 0.9
    assert c.tokens * 10 < MAX_TOKENS and MAX_OPS > 2100


_CHILD = """
import json, resource, sys
from kpool_cli.trace.load import TraceError, load_trace
with open("/proc/self/status") as f:
    vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize:")) * 1024
cap = vm + int(sys.argv[1]) * 2**20
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
out = []
for path in sys.argv[2:]:
    try:
        load_trace(path)
        out.append("loaded")
    except TraceError as e:
        out.append(str(e.problems[0]))
    except MemoryError:
        out.append("MemoryError")
print(json.dumps(out))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists() or sys.platform != "linux",
                    reason="needs Linux's /proc and RLIMIT_AS")
def test_8_mb_hostile_files_are_refused_in_bounded_memory(tmp_path: Path) -> None:
    """Each of these took 0.8 to 1.7 GB (and 9 to 33 s) before the bounds moved into the
    composer; now each is refused (the range: loaded unbuilt) within 128 MB of address
    space past the imports."""
    n = 4 * 1024 * 1024  # items: 8 MB of "0,"
    head = "kpool_trace: 1\ncache: {kv_size: 64, kpool: 4}\n"
    files = {
        "flow_ops.yaml": head + "ops: [" + "0," * n + "0]\n",
        "flow_pos.yaml": head + "ops:\n  - decode: {seq: 0, pos: [" + "0," * n + "0]}\n",
        "block_ops.yaml": head + "ops:\n" + "- clear: {}\n" * (n // 6),
        "block_tokens.yaml": head + "ops:\n  - decode:\n      tokens:\n"
        + "        - {pos: 0, seq: [0]}\n" * (n // 15),
        "range.yaml": head + "ops:\n  - decode: {seq: 0, pos: 0..4194304}\n",
        "bigint.yaml": head + "ops:\n  - seq_keep: {seq: " + "9" * 5000 + "}\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHILD), "128", *files],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    got = dict(zip(files, json.loads(r.stdout), strict=True))
    want = {
        "flow_ops.yaml": f"flow_ops.yaml:3:{7 + 2 * MAX_OPS}: ops[{MAX_OPS}]: more than",
        "flow_pos.yaml": f"flow_pos.yaml:4:{28 + 2 * LISTED_PAST_THE_CACHE}:"
                         f" ops[0].decode.pos[{LISTED_PAST_THE_CACHE}]: a decode listing more",
        "block_ops.yaml": f"block_ops.yaml:{4 + MAX_OPS}:3: ops[{MAX_OPS}]: more than",
        "block_tokens.yaml": f"block_tokens.yaml:{6 + LISTED_PAST_THE_CACHE}:11:"
                             f" ops[0].decode.tokens[{LISTED_PAST_THE_CACHE}]: a decode",
        "range.yaml": "loaded",  # a span: never built, refused at replay (KP006)
        "bigint.yaml": "bigint.yaml:4:21: ops[0].seq_keep.seq: out of range: an integer of 5000",
    }
    for name, start in want.items():
        assert got[name].startswith(start), (name, got[name])


@pytest.mark.skipif(not Path("/proc/self/status").exists() or sys.platform != "linux",
                    reason="needs Linux's /proc and RLIMIT_AS")
def test_the_node_bound_holds_memory_when_nothing_else_stops_a_list(tmp_path: Path) -> None:
    """The cache after the ops: no decode bound while the list is composed, so the node
    bound stops it (1,000,000 light nodes: about 130 MB; PyYAML's nodes took 1.7 GB)."""
    text = ("kpool_trace: 1\nops:\n  - decode: {seq: 0, pos: [" + "0," * (4 * 1024 * 1024)
            + "0]}\ncache: {kv_size: 64, kpool: 4}\n")
    (tmp_path / "late.yaml").write_text(text)
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHILD), "256", "late.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    (msg,) = json.loads(r.stdout)
    assert msg.startswith("late.yaml:3:"), msg
    assert "ops[0].decode.pos[9999" in msg and "more than 1,000,000 YAML nodes" in msg, msg


def test_load_trace_takes_max_tokens(tmp_path: Path) -> None:
    f = tmp_path / "t.yaml"
    f.write_text(HEAD + "  - decode: {seq: 0, pos: 0..10}\n")
    assert len(load_trace(f, max_tokens=10).ops[0].tokens) == 10
    with pytest.raises(TraceError) as info:
        load_trace(f, max_tokens=9)
    (p,) = info.value.problems
    assert (p.file, p.line, p.column, p.field) == (str(f), 4, 27, "ops[0].decode.pos")
    assert "more than 9 tokens" in p.message


@pytest.mark.parametrize("command", [
    ["validate"], ["replay", "--format", "json", "-q", "--backend", "none"],
    ["replay", "--format", "junit", "--backend", "none"],
    ["check", "--no-config", "--backend", "none", "-j", "1"],
    ["diff", "--backend", "none", "-j", "1"],
])
def test_every_command_that_loads_a_trace_takes_max_nodes(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kpool validate, replay (and its CI formats, which load again in `check`'s jobs),
    check and diff each load with the node bound given, at every load: with the
    default lowered to 1,000, 600 token lines (3,000 nodes and more) are refused, exit
    2 naming the bound, and pass with --max-nodes 50,000 (a load that dropped the
    option would refuse them: in-process, `-j 1`)."""
    from click.testing import CliRunner

    from kpool_cli.cli import cli

    t = tmp_path / "t.yaml"
    t.write_text(recorded(600))
    monkeypatch.setattr(limits, "MAX_NODE_VISITS", 1000)
    run = CliRunner().invoke
    r = run(cli, [*command, str(t)], catch_exceptions=False)
    assert r.exit_code == 2, r.output
    said = r.stdout + r.stderr  # validate and check list problems on stdout
    assert "more than 1,000 YAML nodes in the trace" in said and "--max-nodes" in said
    r = run(cli, [*command, "--max-nodes", "50000", str(t)], catch_exceptions=False)
    assert r.exit_code == 0, r.output


def test_a_check_job_and_a_diff_unit_carry_the_node_bound(tmp_path: Path) -> None:
    """What a worker process loads (a `CheckJob`, a diff `Unit`) is loaded with the
    bound of the command that planned it."""
    from kpool_cli.check import CheckJob, check_one
    from kpool_cli.diff.runs import Unit, run_unit

    t = tmp_path / "t.yaml"
    t.write_text(recorded(600))
    assert check_one(CheckJob(str(t), "rep-once", "none", max_nodes=50_000)).status == "pass"
    got = check_one(CheckJob(str(t), "rep-once", "none", max_nodes=1000))
    assert got.status == "invalid"
    assert "more than 1,000 YAML nodes" in got.problems[0].message
    assert len(run_unit(Unit(str(t), "rep-once", "none", max_nodes=50_000)).ubatches) == 2
    with pytest.raises(TraceError, match="more than 1,000 YAML nodes"):
        run_unit(Unit(str(t), "rep-once", "none", max_nodes=1000))
