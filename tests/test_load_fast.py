"""The loader's one step for a plain token (`DecodeWalk.plain_token`, trace/load/decode.py)
reads what the field-by-field walk reads: the same tokens, the same problems, the
same count of nodes visited, for the form a recorder writes and for every near miss
of it (each of which the walk must read the general way)."""

from __future__ import annotations

import pytest

from kpool_cli.trace.format import POS_LIMIT
from kpool_cli.trace.load import TraceError, load_trace_text
from kpool_cli.trace.load.decode import DecodeWalk

# tokens of a decode (with `{pos: 7, seq: 1}` after each, so a decode holds two);
# the cache has n_seq_max 4: seq ids 0..3
TOKENS = [
    ("{pos: 0, seq: 0}", True),
    ("{seq: 3, pos: 12}", True),
    (f"{{pos: {POS_LIMIT - 1}, seq: 2}}", True),
    ("{pos: !!int 5, seq: 0}", True),
    ('{"pos": 5, seq: 0}', True),
    ("{pos: -0, seq: 0}", True),
    (f"{{pos: {POS_LIMIT}, seq: 0}}", False),
    ("{pos: 5, seq: 4}", False),
    ("{pos: -1, seq: 0}", False),
    ("{pos: 5, seq: -1}", False),
    ("{pos: 05, seq: 0}", False),
    ("{pos: +5, seq: 0}", False),
    ("{pos: 1_0, seq: 0}", False),
    ("{pos: 0x10, seq: 0}", False),
    ("{pos: 1.0, seq: 0}", False),
    ('{pos: "5", seq: 0}', False),
    ("{pos: 99999999999999999999999, seq: 0}", False),
    ("{pos: \uff15, seq: 0}", False),
    ("{pos: 5, seq: [0]}", False),
    ("{pos: 5, seq: [0, 1]}", False),
    ("{pos: 5, pos: 6}", False),
    ("{seq: 0, seq: 1}", False),
    ("{pos: 5}", False),
    ("{pos: 5, seq: 0, cell: 3}", False),
    ("{pos: 5, sq: 0}", False),
    ("{pos: 5, 1: 0}", False),
    ("{pos: 5, seq: true}", False),
    ("{pos: 5, seq: null}", False),
    ("!!map {pos: 5, seq: 0}", True),
    ("!!omap [{pos: 5}, {seq: 0}]", False),
    ("[5, 0]", False),
    ("5", False),
]


def _trace(token: str) -> str:
    return ("kpool_trace: 1\nname: t\ncache: {kv_size: 64, kpool: 4, n_seq_max: 4}\n"
            f"ops:\n  - decode:\n      tokens:\n        - {token}\n        - {{pos: 7, seq: 1}}\n")


def _outcome(text: str, monkeypatch: pytest.MonkeyPatch, fast: bool):
    """(the trace or its problems, the nodes visited when each decode was read, how
    many tokens the one step read)."""
    visits: list[int] = []
    taken = [0]
    check, plain = DecodeWalk.check_decode, DecodeWalk.plain_token

    def counted(self, toks):
        visits.append(self.visits)
        return check(self, toks)

    def one_step(self, node):
        tok = plain(self, node) if fast else None
        taken[0] += tok is not None
        return tok

    with monkeypatch.context() as m:
        m.setattr(DecodeWalk, "check_decode", counted)
        m.setattr(DecodeWalk, "plain_token", one_step)
        try:
            got = load_trace_text(text)
        except TraceError as e:
            got = e.problems  # type: ignore[assignment]
    return got, visits, taken[0]


@pytest.mark.parametrize(("token", "plain"), TOKENS, ids=[t for t, _ in TOKENS])
def test_a_plain_token_reads_as_the_walk_reads_it(token: str, plain: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    text = _trace(token)
    fast, fast_visits, taken = _outcome(text, monkeypatch, True)
    slow, slow_visits, none = _outcome(text, monkeypatch, False)
    assert fast == slow
    assert fast_visits == slow_visits
    assert none == 0
    # the second token is always plain; the first, as the list says
    assert taken == 1 + plain


def test_a_plain_token_past_the_visit_bound_is_refused_where_the_walk_refuses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound on nodes visited falls inside a plain token: the walk reads it and
    refuses it at the same node either way."""
    text = _trace("{pos: 5, seq: 0}")
    _, visits, _ = _outcome(text, monkeypatch, False)
    import kpool_cli.trace.yaml_safe.limits as limits
    for bound in range(visits[0] - 6, visits[0] + 2):
        monkeypatch.setattr(limits, "MAX_NODE_VISITS", bound)
        assert _outcome(text, monkeypatch, True)[0] == _outcome(text, monkeypatch, False)[0]
