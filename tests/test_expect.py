"""verdict/expect.py: an `expect` checks the last op that ran before it (notes
skipped), as a consumer of the records."""

from __future__ import annotations

import pytest
from conftest import run, trace
from test_engine_rules import PAD_ABORT

from kpool_cli.contracts.records import ExpectResult
from kpool_cli.replay import replay
from kpool_cli.trace.load import TraceError, load_trace_text
from kpool_cli.versions import VERSIONS


def expects(text: str, engine: str = "rep-once") -> list[tuple[int, bool, str]]:
    return [(r.op, r.ok, r.message) for r in replay(trace(text), VERSIONS[engine])
            if isinstance(r, ExpectResult)]

ABORT_THEN_EXPECT = PAD_ABORT + """\
  - note: "the replay stopped at op 4"
  - decode: {seq: 0, pos: 4}
  - expect: {status: aborted, findings: [KP005], n_new: 1}
  - expect: {engine: cache-safe, n_new: 4}
"""


def test_an_expect_after_an_abort_checks_the_aborted_decode():
    """Under rep-once the decode of op 4 aborts: its plan runs out of padding rows
    (test_engine_rules.py::test_s7_padding_running_out_of_rows_aborts), after marking
    seq 1's stale pool once. The decodes of ops 5 and 7 never run, so the expect of
    op 8 reads op 4: aborted, KP005, and the n_new of op 4's record (marking runs
    before the plan's GGML_ASSERT). The expect for cache-safe yields nothing under
    rep-once."""
    (aborted,) = [r for r in run(ABORT_THEN_EXPECT) if r.op == 4]
    assert aborted.aborted and aborted.n_new == 1
    assert expects(ABORT_THEN_EXPECT) == [(8, True, "op 4: as expected")]


def test_an_expect_after_a_note_checks_the_op_before_the_note():
    """Decode pos 0, 1 (pool 0 marked), a note, then the expect: it reads op 1."""
    assert expects("""
kpool_trace: 1
cache: {kv_size: 8, kpool: 2}
ops:
  - note: "before"
  - decode: {seq: 0, pos: 0..2}
  - note: "n"
  - expect: {n_new: 1, pools: [[0, 0]]}
  - expect: {n_new: 2}
""") == [(3, True, "op 1: as expected"), (4, False, "op 1: n_new is 1, expected 2")]


def test_an_unregistered_expect_engine_is_placed_at_its_value_with_a_suggestion():
    """The loader reads an expect's `engine` as it reads the trace's own (walk.py
    `engine`): the problem is at the value (line 6, column 22: after `  - expect:
    {engine: `), not at the op, and a near name is suggested."""
    text = ("kpool_trace: 1\nname: e\ncache: {kv_size: 16, kpool: 4}\nops:\n"
            "  - decode: {seq: 0, pos: 0..4}\n"
            "  - expect: {engine: rep_once, findings: []}\n")
    with pytest.raises(TraceError) as info:
        load_trace_text(text, "t.yaml")
    (p,) = info.value.problems
    assert (p.line, p.column, p.field) == (6, 22, "ops[1].expect.engine")
    assert p.message.startswith("unknown engine 'rep_once' (did you mean 'rep-once'?): known "
                                "engines are cache-safe, rep-once, ")
