"""verdict/expect.py: an `expect` checks the last op that ran before it (notes
skipped), as a consumer of the records."""

from __future__ import annotations

from conftest import run, trace
from test_mutants_engine import DRIFT_PAST_THE_END

from kpool_cli.contracts.records import ExpectResult
from kpool_cli.replay import replay
from kpool_cli.versions import VERSIONS


def expects(text: str, engine: str = "rep-once") -> list[tuple[int, bool, str]]:
    return [(r.op, r.ok, r.message) for r in replay(trace(text), VERSIONS[engine])
            if isinstance(r, ExpectResult)]

ABORT_THEN_EXPECT = DRIFT_PAST_THE_END + """\
  - note: "the replay stopped at op 5"
  - decode: {seq: 0, pos: 25}
  - expect: {status: aborted, findings: [KP005, KP007], n_new: 1}
  - expect: {engine: cache-safe, n_new: 1}
"""


def test_an_expect_after_an_abort_checks_the_aborted_decode():
    """The decode of op 5 aborts (a drifted layout misses its token:
    test_s7_drift_abort_when_the_token_is_past_every_layout_position); op 7 never
    runs, so the expect of op 8 reads op 5: aborted, KP005 and KP007, and the n_new
    of op 5's record (marking runs before the plan's GGML_ASSERT). The expect for
    cache-safe yields nothing under rep-once."""
    (aborted,) = [r for r in run(ABORT_THEN_EXPECT) if r.op == 5]
    assert aborted.aborted and aborted.n_new == 1
    assert expects(ABORT_THEN_EXPECT) == [(8, True, "op 5: as expected")]


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
