"""The loader's one step for a plain token (`plain_token_of`, trace/load/decode.py)
reads what the field-by-field walk reads: the same tokens, the same problems, the
same count of nodes visited, for the form a recorder writes and for every near miss
of it (each of which the walk must read the general way)."""

from __future__ import annotations

import pytest

from kpool_cli.trace.format import POS_LIMIT
from kpool_cli.trace.load import TraceError, load_trace_text
from kpool_cli.trace.load import decode as decode_walk
from kpool_cli.trace.load.decode import DecodeWalk
from kpool_cli.trace.load.ops import OpsWalk

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


def _loaded(text: str, max_tokens: int | None = None):
    """The trace of `text`, or its problems."""
    try:
        return load_trace_text(text, **({} if max_tokens is None else
                                        {"max_tokens": max_tokens}))
    except TraceError as e:
        return e.problems


def _outcome(text: str, monkeypatch: pytest.MonkeyPatch, fast: bool):
    """(the trace or its problems, the nodes visited once each decode was read, how
    many tokens the one step read)."""
    visits: list[int] = []
    taken = [0]
    decode, plain = DecodeWalk.op_decode, decode_walk.plain_token_of

    def counted(self, *args):
        got = decode(self, *args)
        visits.append(self.visits)
        return got

    def one_step(node, seq_hi):
        tok = plain(node, seq_hi) if fast else None
        taken[0] += tok is not None
        return tok

    with monkeypatch.context() as m:
        m.setattr(DecodeWalk, "op_decode", counted)
        m.setattr(decode_walk, "plain_token_of", one_step)
        got = _loaded(text)
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


def test_a_decode_of_plain_tokens_reads_as_the_walk_reads_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`plain_tokens` reads a decode's plain tokens at once: the same trace, problems
    and visits as token by token, at the token bound, with a problem in the decode
    itself, and with a plain token after one that is not."""
    texts = [_trace("{pos: 5, seq: 0}"),
             _trace("{pos: 5, seq: 0}").replace("      tokens:", "      tokes: 1\n      tokens:"),
             _trace("{pos: 5, seq: 9}")]
    for text in texts:
        fast, fast_visits, _ = _outcome(text, monkeypatch, True)
        assert fast_visits  # the probe saw the decode
        assert (fast, fast_visits) == _outcome(text, monkeypatch, False)[:2]
    # the walk's own token bound: the composer does not count a list anchored outside
    # a decode (the unknown key is a problem of its own)
    aliased = ("kpool_trace: 1\nname: t\ncache: {kv_size: 64, kpool: 4, n_seq_max: 4}\n"
               "x: &t [{pos: 5, seq: 0}, {pos: 7, seq: 1}]\nops:\n  - decode:\n"
               "      tokens: *t\n")
    for text, max_tokens in ((texts[0], 1), (texts[0], 2), (aliased, 1)):
        outcomes: list[object] = []
        for fast_ in (True, False):
            with monkeypatch.context() as m:
                if not fast_:
                    m.setattr(decode_walk, "plain_token_of", lambda node, seq_hi: None)
                outcomes.append(_loaded(text, max_tokens))
        assert outcomes[0] == outcomes[1]
        # two tokens: refused at a bound of one, where the walk refuses the second
        assert isinstance(outcomes[0], list) == (max_tokens == 1)
    assert any("more than 1 tokens" in p.message for p in outcomes[0])  # type: ignore[attr-defined]


# --- a plain decode step, read in one step (`OpsWalk.plain_decode`) ------------------

# ops items after a note (the cache has n_seq_max 4), and whether each is the plain form
DECODES = [
    ("decode: {seq: 0, pos: 5}", True),
    ("decode: {pos: 5, seq: 3}", True),
    ('"decode": {seq: 0, pos: 5}', True),
    ("decode: !!map {seq: 0, pos: 5}", True),
    ("!!map {decode: {seq: 0, pos: 5}}", True),
    (f"decode: {{seq: 0, pos: {POS_LIMIT - 1}}}", True),
    ("decode: {seq: 4, pos: 5}", False),
    ("decode: {seq: 0, pos: -1}", False),
    ("decode: {seq: 0, pos: 05}", False),
    ("decode: {seq: 0, pos: '5'}", False),
    ("decode: {seq: 0, pos: 0..4}", False),
    ("decode: {seq: 0, pos: [5]}", False),
    ("decode: {seq: [0], pos: 5}", False),
    ("decode: {seq: 0, pos: 5, cell: 3}", False),
    ("decode: {seq: 0, pos: 5, ext: [1, 2]}", False),
    ("decode: {seq: 0}", False),
    ("decode: {tokens: [{pos: 5, seq: 0}]}", False),
    ("{decode: {seq: 0, pos: 5}, note: x}", False),
    ("dekode: {seq: 0, pos: 5}", False),
    ("decode: [{pos: 5, seq: 0}]", False),
    ("!!omap [{decode: {seq: 0, pos: 5}}]", False),
    ("!custom {decode: {seq: 0, pos: 5}}", False),
]


def _ops_trace(*items: str) -> str:
    return ("kpool_trace: 1\nname: t\ncache: {kv_size: 64, kpool: 4, n_seq_max: 4}\n"
            "ops:\n  - note: first\n" + "".join(f"  - {it}\n" for it in items)
            + "  - expect: {findings: []}\n")


def _ops_outcome(text: str, monkeypatch: pytest.MonkeyPatch, fast: bool,
                 max_tokens: int | None = None, step: str = "plain_decode"):
    """(the trace or its problems, the nodes visited and tokens counted at the end of
    the walk, how many items the one step `step` (an `OpsWalk` method) read). With
    `plain_op`, the op lines are composed from the text (`_OP_LINES_MIN` 1)."""
    from kpool_cli.trace.load import walk

    seen: list[tuple[int, int]] = []
    taken = [0]
    plain, trace = getattr(OpsWalk, step), walk._Walker.trace

    def one_step(self, item):  # type: ignore[no-untyped-def]
        got = plain(self, item) if fast else None
        taken[0] += got is not None
        return got

    def counted(self, *args):  # type: ignore[no-untyped-def]
        try:
            return trace(self, *args)
        finally:
            seen.append((self.visits, self.n_tokens))

    with monkeypatch.context() as m:
        if step == "plain_op":
            m.setattr(composer, "_OP_LINES_MIN", 1)
        m.setattr(OpsWalk, step, one_step)
        m.setattr(walk._Walker, "trace", counted)
        got = _loaded(text, max_tokens)
    return got, seen, taken[0]


@pytest.mark.parametrize(("item", "plain"), DECODES, ids=[d for d, _ in DECODES])
def test_a_plain_decode_step_reads_as_the_walk_reads_it(item: str, plain: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same trace (or problems), nodes visited and tokens counted, whether the
    item is read in one step or field by field; the one step takes the plain form
    alone (a plain step follows each item, so two are read when the item is plain)."""
    text = _ops_trace(item, "decode: {seq: 1, pos: 0}")
    assert _read_alike(text, monkeypatch, "plain_decode") == 1 + plain


def _read_alike(text: str, monkeypatch: pytest.MonkeyPatch, step: str) -> int:
    """`text` read with the one step `step` and without it: the same trace (or
    problems), nodes visited and tokens counted; returns how many items the step
    read (none without it)."""
    fast, fast_seen, taken = _ops_outcome(text, monkeypatch, True, step=step)
    slow, slow_seen, none = _ops_outcome(text, monkeypatch, False, step=step)
    assert fast == slow
    assert fast_seen == slow_seen and fast_seen
    assert none == 0
    return taken


def test_a_plain_decode_step_at_the_bounds_is_refused_where_the_walk_refuses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three plain steps under a bound of 1, 2, 3 tokens (refused at the second, the
    third, or read whole), and under every bound on nodes visited from before the
    first step to past the last: the same trace or the same problems either way."""
    text = _ops_trace("decode: {seq: 0, pos: 0}", "decode: {seq: 0, pos: 1}",
                      "decode: {seq: 0, pos: 2}")
    for max_tokens in (1, 2, 3):
        fast = _ops_outcome(text, monkeypatch, True, max_tokens)
        assert fast[:2] == _ops_outcome(text, monkeypatch, False, max_tokens)[:2]
        assert isinstance(fast[0], list) == (max_tokens < 3)
    visits = _ops_outcome(text, monkeypatch, False)[1][0][0]
    import kpool_cli.trace.yaml_safe.limits as limits
    for bound in range(visits - 24, visits + 2):
        monkeypatch.setattr(limits, "MAX_NODE_VISITS", bound)
        assert (_ops_outcome(text, monkeypatch, True)[0]
                == _ops_outcome(text, monkeypatch, False)[0]), bound


# --- the recorder's token lines, composed from the text (yaml_safe/composer.py) ------

import hypothesis.strategies as st  # noqa: E402
from hypothesis import given, settings  # noqa: E402

from kpool_cli.trace.load import SHAPE  # noqa: E402
from kpool_cli.trace.yaml_safe import composer  # noqa: E402
from kpool_cli.trace.yaml_safe.nodes import Node, Scalar, Seq  # noqa: E402

HEAD = "kpool_trace: 1\nname: t\ncache: {kv_size: 4096, kpool: 4, n_seq_max: 4}\nops:\n"


def _lines(n: int, indent: int = 8, first: int = 0) -> str:
    return "".join(f"{' ' * indent}- {{pos: {first + i}, seq: {i % 4}}}\n" for i in range(n))


def _decode(n: int, first: int = 0) -> str:
    return "  - decode:\n      tokens:\n" + _lines(n, first=first)


def _plain_way(m: pytest.MonkeyPatch) -> None:
    """Compose every text the plain way: no run of token lines or op lines is looked for."""
    m.setattr(composer, "_TOKEN_LINES_MIN", 1 << 62)
    m.setattr(composer, "_OP_LINES_MIN", 1 << 62)


def _tree(node: Node | None) -> object:
    """A node as plain values: kind, tag, where, and what it holds."""
    if node is None:
        return None
    if isinstance(node, Scalar):
        return ("s", node.tag, node.line, node.column, node.value, node.plain)
    if isinstance(node, Seq):
        return ("l", node.tag, node.line, node.column, [_tree(v) for v in node.value])
    return ("m", node.tag, node.line, node.column,
            [(_tree(k), _tree(v)) for k, v in node.value])


def _composed(text: str, monkeypatch: pytest.MonkeyPatch, lines: bool) -> tuple[object, bool]:
    """(the composed tree or the problems, whether it was composed once, from the
    token lines: `lines` False turns them off)."""
    made: list[composer.Composer] = []
    init = composer.Composer.__init__

    def keep(self: composer.Composer, *a: object) -> None:
        init(self, *a)  # type: ignore[arg-type]
        made.append(self)

    with monkeypatch.context() as m:
        if not lines:
            _plain_way(m)
        m.setattr(composer.Composer, "__init__", keep)
        try:
            got: object = _tree(composer.compose(text, "t.yaml", 1 << 40, SHAPE))
        except TraceError as e:
            got = e.problems
    return got, len(made) == 1 and made[0].lines is not None


def _same_either_way(text: str, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The text composes to the same tree (or problems) with and without the token
    lines; returns whether they were taken."""
    fast, taken = _composed(text, monkeypatch, True)
    plain, _ = _composed(text, monkeypatch, False)
    assert fast == plain
    with monkeypatch.context() as m:
        _plain_way(m)
        try:
            want: object = load_trace_text(text)
        except TraceError as e:
            want = e.problems
    try:
        got: object = load_trace_text(text)
    except TraceError as e:
        got = e.problems
    assert got == want
    return taken


def _refused_alike(text: str, monkeypatch: pytest.MonkeyPatch, max_tokens: int) -> None:
    """The text is refused at `max_tokens` with the token lines and without them, with
    the same problems."""
    with monkeypatch.context() as m:
        _plain_way(m)
        with pytest.raises(TraceError) as plain:
            load_trace_text(text, max_tokens=max_tokens)
    with pytest.raises(TraceError) as fast:
        load_trace_text(text, max_tokens=max_tokens)
    assert fast.value.problems == plain.value.problems


N = composer._TOKEN_LINES_MIN


def _read_all(text: str, most: int) -> composer._TokenLines | None:
    """`_token_lines(text, most)`, read to the end as libyaml would read it (a text
    shorter than `_PARSED_BEHIND`: nothing takes its runs)."""
    lines = composer._token_lines(text, most)
    if lines is not None:
        while lines.read(1 << 14):
            pass
    return lines


def test_a_recorders_trace_is_composed_from_its_token_lines(
        monkeypatch: pytest.MonkeyPatch) -> None:
    text = HEAD + _decode(N) + _decode(N, first=N)
    assert _same_either_way(text, monkeypatch)
    t = load_trace_text(text)
    assert [(tk.pos, tk.seq) for tk in t.ops[1].tokens][:2] == [(N, (0,)), (N + 1, (1,))]


def test_too_few_token_lines_are_composed_the_plain_way(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert composer._token_lines(HEAD + _decode(N - 1), 1 << 30) is None
    assert composer._token_lines(HEAD + _decode(N), 1 << 30) is not None
    assert not _same_either_way(HEAD + _decode(N - 1), monkeypatch)


# a trace of token lines, each twisted so that some line that looks like a token is
# none (or the file is refused): the plain way's result, or its problems, either way
TWISTS = {
    # inside a literal block scalar: the note's text, not tokens
    "block scalar": HEAD.replace("ops:\n", "note: |\n" + _lines(N, 2) + "ops:\n") + _decode(4),
    # inside a double-quoted string that spans lines
    "quoted": HEAD.replace("ops:\n", 'note: "a\n' + _lines(N, 2) + '  b"\nops:\n') + _decode(4),
    # a more indented line continues the line's last scalar
    "continued": HEAD + _decode(N) + "          more\n",
    # token lines as ops: each a mapping op (a problem), not a token
    "as ops": HEAD + _lines(N, 2),
    # as the items of a decode's pos list (a token list that takes ints)
    "in a pos list": HEAD + "  - decode:\n      seq: 0\n      pos:\n" + _lines(N),
    # values the walk refuses
    "out of range": HEAD + _decode(N).replace("{pos: 3, seq: 3}", "{pos: 3, seq: 9}")
    .replace("{pos: 5,", f"{{pos: {POS_LIMIT},"),
    # YAML that libyaml refuses, past the token lines
    "invalid yaml": HEAD + _decode(N) + "  - decode: {seq: 0, pos: [1, 2}\n",
    # a second document
    "two documents": HEAD + _decode(N) + "---\nx: 1\n",
    # an anchored token list, and its alias
    "alias": HEAD + "  - decode:\n      tokens: &t\n" + _lines(N) + "  - seq_rm: {seq: 0}\n"
    + "  - decode:\n      tokens: *t\n",
    # the token lines of ubatches (each ubatch's first token shares its line with `- `)
    "ubatches": HEAD + "  - decode:\n      ubatches:\n        -\n" + _lines(N, 10)
    + "        -\n" + _lines(N, 10, first=N),
    # a line break libyaml counts and the regex does not
    "crlf": (HEAD + _decode(N)).replace("\n", "\r\n"),
    "line separator": HEAD + "name2: 'a\u2028b'\n" + _decode(N),
    # a comment after a token line's mapping
    "comment": HEAD + _decode(N).replace("seq: 1}\n", "seq: 1}  # c\n"),
    # a tab on the line after a run: invalid YAML after a mapping (libyaml skips
    # spaces only there), which the placeholder must not swallow
    "tab after": HEAD + _decode(N) + "         \t\n",
    "tab between": HEAD + _decode(N).replace("seq: 1}\n", "seq: 1}\n         \t\n"),
    # a run broken by a blank line, a comment line, a line indented more or less
    "blank line": HEAD + _decode(N).replace("seq: 1}\n", "seq: 1}\n\n"),
    "comment line": HEAD + _decode(N).replace("seq: 1}\n", "seq: 1}\n        # c\n"),
    "indented more": HEAD + _decode(N).replace("seq: 1}\n        -", "seq: 1}\n          -"),
    "indented less": HEAD + _decode(N).replace("seq: 1}\n        -", "seq: 1}\n      -"),
    # the runs of two decodes, back to back at one indentation
    "two decodes": HEAD + _decode(N) + _decode(N, first=N),
}


@pytest.mark.parametrize("name", list(TWISTS))
def test_a_token_line_that_is_no_token_item_is_read_the_plain_way(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _same_either_way(TWISTS[name], monkeypatch)


def test_a_bound_crossed_among_token_lines_is_refused_as_the_plain_way_refuses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    text = HEAD + _decode(2 * N)
    for max_tokens in (N, N + 1, 2 * N - 1):
        _refused_alike(text, monkeypatch, max_tokens)
    import kpool_cli.trace.yaml_safe.limits as limits
    for bound in (N, 5 * N + 3, 5 * N + 20):
        monkeypatch.setattr(limits, "MAX_NODE_VISITS", bound)
        _same_either_way(text, monkeypatch)


def test_past_the_bounds_no_token_line_is_read_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """More token lines than the bounds allow (each is 5 nodes and a token): none is
    read (a hostile file of millions of them holds nothing of them), and the plain
    way refuses the file where it refuses it without the scan."""
    text = HEAD + _decode(3 * N)
    assert _read_all(text, 3 * N) is not None
    assert composer._token_lines(text, 3 * N - 1) is None
    # counted by the text each holds: a line that only looks like one counts too
    assert composer._token_lines(text.replace("seq: 1}", "seq: [1]}"), 3 * N - 1) is None
    import kpool_cli.trace.yaml_safe.limits as limits
    for bound in (5 * N, 5 * 3 * N + 40):
        monkeypatch.setattr(limits, "MAX_NODE_VISITS", bound)
        _same_either_way(text, monkeypatch)
    for max_tokens in (2 * N, 3 * N):
        with monkeypatch.context() as m:
            _plain_way(m)
            try:
                want: object = load_trace_text(text, max_tokens=max_tokens)
            except TraceError as e:
                want = e.problems
        try:
            got: object = load_trace_text(text, max_tokens=max_tokens)
        except TraceError as e:
            got = e.problems
        assert got == want


def test_a_token_run_is_no_deeper_than_the_depth_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lowered below where token maps sit, the depth bound refuses the trace either way."""
    import kpool_cli.trace.yaml_safe.limits as limits
    monkeypatch.setattr(limits, "MAX_DEPTH", 5)
    _same_either_way(HEAD + _decode(N), monkeypatch)


def test_a_run_longer_than_its_bound_is_read_as_runs_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's match holds at most `_RUN_MOST` lines (the regex engine keeps a state
    per line it repeats over); the lines past it start a run of their own, in the
    same token list."""
    most = composer._RUN_MOST
    text = HEAD + _decode(most + 76)
    lines = _read_all(text, 1 << 30)
    assert lines is not None
    assert [len(run) for _, run, _ in lines.runs.values()] == [most, 76]
    assert _same_either_way(text, monkeypatch)


_LINE = st.sampled_from([
    "        - {pos: 1, seq: 0}", "        - {pos: 1, seq: 7}", "        - {pos: 01, seq: 0}",
    "          - {pos: 1, seq: 0}", "      - {pos: 1, seq: 0}", "        - {seq: 0, pos: 1}",
    "        -  {pos: 1, seq: 0}", "        - {pos: 1, seq: 0} ", "  note: |", "  x: 'a",
    "    b'", "        # c", "", "  - decode:", "      tokens:", "        - {pos: 2, seq: [0, 1]}",
    "  - seq_rm: {seq: 0}", "\t- {pos: 1, seq: 0}",
])


@settings(max_examples=150, deadline=None)
@given(st.lists(_LINE, max_size=40), st.integers(0, 3))
def test_any_mixture_of_lines_composes_as_the_plain_way_composes_it(
        mix: list[str], where: int) -> None:
    """Token lines among near misses and the constructs that swallow lines: the same
    tree or problems either way (the bound on token lines lowered to 1, so that the
    text is always tried from its token lines first)."""
    body = HEAD + _decode(3)
    lines = body.split("\n")
    lines[len(lines) * where // 4:len(lines) * where // 4] = mix
    text = "\n".join(lines)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(composer, "_TOKEN_LINES_MIN", 1)
        _same_either_way(text, m)


def _tried(text: str, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether the text's token lines were found and composed from (whatever came of
    it): the case `Composer.token_run`'s own bounds are for."""
    tried: list[bool] = []
    fast = composer._compose_token_lines

    def spy(*a: object) -> tuple[bool, Node | None]:
        tried.append(True)
        return fast(*a)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(composer, "_compose_token_lines", spy)
        _composed(text, m, True)
    return bool(tried)


def test_a_run_that_crosses_the_node_bound_is_refused_as_the_plain_way_refuses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan lets through a run of at most MAX_NODE_VISITS // 5 lines; the nodes
    before it can still take the count past the bound inside the run, which
    `token_run` checks itself: for every bound from there, refused at the node the
    plain way names, or composed alike."""
    import kpool_cli.trace.yaml_safe.limits as limits
    text = HEAD + _decode(N)
    engaged = 0
    for bound in range(5 * N, 5 * N + 40):
        monkeypatch.setattr(limits, "MAX_NODE_VISITS", bound)
        if _tried(text, monkeypatch):
            engaged += 1
        _same_either_way(text, monkeypatch)
    assert engaged > 10  # the scan let the run through, and the bound fell inside it


def test_a_run_that_crosses_the_token_bounds_is_refused_as_the_plain_way_refuses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens counted before the run (a flow list's) and the one decode's cap (from
    the cache block: kv_size) are crossed inside the run, where the scan could not
    tell: `token_run` counts the run's tokens, and the plain way's problem is given."""
    before = "  - decode:\n      tokens: [{pos: 0, seq: 0}, {pos: 1, seq: 0}]\n"
    text = HEAD + before + _decode(N, first=2)
    assert _tried(text, monkeypatch)
    for max_tokens in (N, N + 1):  # the run holds N; 2 before it
        _refused_alike(text, monkeypatch, max_tokens)
    from kpool_cli.trace.load import shape
    monkeypatch.setattr(shape, "LISTED_PAST_THE_CACHE", 16)  # the cap: kv_size * n_stream
    small = HEAD.replace("kv_size: 4096", "kv_size: 32") + _decode(N)
    assert _tried(small, monkeypatch)
    _same_either_way(small, monkeypatch)
    with pytest.raises(TraceError) as cap:
        load_trace_text(small)
    assert "a decode listing more than" in cap.value.problems[0].message


def test_a_token_line_of_a_5000_digit_pos_reads_as_the_plain_way_reads_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A P past Python's int-from-string digit limit (4,300) on a token line: the
    same problem either way, not a ValueError."""
    text = HEAD + _decode(N).replace("{pos: 5,", "{pos: " + "7" * 5000 + ",")
    assert _tried(text, monkeypatch)
    _same_either_way(text, monkeypatch)
    with pytest.raises(TraceError) as e:
        load_trace_text(text)
    assert "pos" in e.value.problems[0].field


def _furthest_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Where each `_TokenLines.read` left the text read (its `_done`), from now on."""
    furthest: list[int] = []
    read = composer._TokenLines.read

    def spy(self: composer._TokenLines, size: int = -1) -> str:
        try:
            return read(self, size)
        finally:
            furthest.append(self._done)

    monkeypatch.setattr(composer._TokenLines, "read", spy)
    return furthest


@pytest.mark.parametrize("chunk", [1, 37, 4096])
@pytest.mark.parametrize("name", ["recorder", "two decodes", "ubatches", "block scalar",
                                  "continued", "tab after"])
def test_any_chunk_of_the_text_reads_as_the_whole_of_it(
        chunk: int, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """libyaml reads the text a chunk of whole lines at a time: a run cut by a chunk's
    end is two runs, and each is taken (or found out) as the whole one was."""
    text = HEAD + _decode(N) + _decode(N, first=N) if name == "recorder" else TWISTS[name]
    monkeypatch.setattr(composer, "_CHUNK", chunk)
    taken = _same_either_way(text, monkeypatch)
    assert taken == (name in ("recorder", "two decodes", "ubatches"))


def test_a_run_that_was_no_token_item_is_found_out_before_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Token lines inside a block scalar near the top of a large trace: the composition
    from the token lines stops once libyaml has parsed `_PARSED_BEHIND` past them,
    not at the end of the file, and the plain way gives the trace."""
    text = (HEAD + "  - note: |\n" + _lines(N, 6)
            + "".join(_decode(N, first=i * N) for i in range(120)))
    assert len(text) > 3 * composer._PARSED_BEHIND
    with monkeypatch.context() as m:
        furthest = _furthest_read(m)
        fast, taken = _composed(text, m, True)
    assert not taken
    assert max(furthest) < composer._PARSED_BEHIND + 3 * composer._CHUNK < len(text)
    assert fast == _composed(text, monkeypatch, False)[0]
    assert load_trace_text(text).ops[-1].tokens[-1].pos == 120 * N - 1


def test_a_yaml_error_near_the_top_is_found_before_the_rest_is_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A file the plain way refuses near its top costs no scan of the rest."""
    text = HEAD + "  - decode: {seq: 0, pos: [1, 2}\n" + _decode(N) * 200
    furthest = _furthest_read(monkeypatch)
    _same_either_way(text, monkeypatch)
    assert furthest and max(furthest) <= 2 * composer._CHUNK < len(text)


# --- op lines: composed from the text, read in one step (`Composer.op_run`,
# `OpsWalk.plain_op`) -----------------------------------------------------------------

# op lines among others (n_seq_max 4, kv_size 64), and whether the walk reads each in
# one step; every one is an op line to the composer (`op_mapping`)
OP_LINES = [
    ("decode: {seq: 0, pos: 5}", True),
    ("decode: {pos: 5, seq: 3}", True),
    ("decode: {seq: -0, pos: -0}", True),
    ("decode: {seq: 0, pos: 0..4}", True),
    ("decode: {pos: 60..64, seq: 2}", True),
    ("decode: {seq: 0, pos: 0..64}", True),  # as many tokens as the stream has cells
    ("decode: {seq: 0, pos: 0..65}", False),  # more: kept unbuilt, a Span
    (f"decode: {{seq: 0, pos: {POS_LIMIT - 1}}}", True),
    (f"decode: {{seq: 0, pos: {POS_LIMIT - 2}..{POS_LIMIT}}}", True),
    (f"decode: {{seq: 0, pos: {POS_LIMIT}}}", False),
    (f"decode: {{seq: 0, pos: {POS_LIMIT - 2}..{POS_LIMIT + 1}}}", False),
    ("decode: {seq: 0, pos: 1234567890123456}", False),
    ("decode: {seq: 0, pos: 4..4}", False),
    ("decode: {seq: 0, pos: 5..4}", False),
    ("decode: {seq: 0, pos: -1..4}", False),
    ("decode: {seq: 4, pos: 5}", False),
    ("decode: {seq: -1, pos: 5}", False),
    ("decode: {seq: 0..1, pos: 5}", False),
    ("decode: {seq: 0, pos: 5, cell: 3}", False),
    ("decode: {seq: 0}", False),
    ("decode: {seq: 0, seq: 1}", False),
    ("decode: {pos: 5, pos: 6}", False),
    ("decode: {sq: 0, pos: 5}", False),
    ("seq_rm: {seq: 0, p0: 5}", True),
    ("seq_rm: {seq: -1}", True),
    ("seq_rm: {p1: -1, seq: 0, p0: 5}", True),
    ("seq_rm: {seq: 0, p0: 2147483647}", True),
    ("seq_rm: {seq: 0, p0: 2147483648}", False),
    ("seq_rm: {seq: 0, p0: -2}", False),
    ("seq_rm: {seq: 4}", False),
    ("seq_rm: {p0: 5}", False),
    ("seq_rm: {seq: 0, p0: 5, p0: 6}", False),
    ("seq_rm: {seq: 0, p2: 5}", False),
    ("seq_rm: {seq: 0, p0: 1..2}", False),
    ("seq_rm: {y: 0}", False),  # a bool key
    ("seq_rm: {seq: 0, null: 1}", False),  # a null key
    ("seq_cp: {src: 0, dst: 1}", True),
    ("seq_cp: {src: 0, dst: -1}", False),
    ("seq_keep: {seq: 3}", True),
    ("seq_add: {seq: 0, p0: 0, p1: 8, shift: -4}", True),
    ("seq_add: {seq: 0, shift: -2147483648}", True),
    ("seq_add: {seq: 0, shift: -2147483649}", False),
    ("seq_div: {seq: 0, d: 2}", True),
    ("seq_div: {seq: 0, d: 0}", False),
    ("state_drop: {seq: -1}", True),
    ("state_write: {seq: 0, slot: 1}", False),  # a slot is a string
    ("clear: {seq: 1}", False),
    ("note: {seq: 1}", False),
    ("expect: {n_new: 1, ubatch: -1}", True),
    ("expect: {n_new: -1}", False),
    ("expect: {n_new: 1, findings: 1}", False),
    ("seq_rmm: {seq: 0}", False),
    ("y: {seq: 0}", False),  # a bool name
    ("null: {seq: 0}", False),
]


def _op_lines_trace(*items: str, indent: int = 2) -> str:
    """A trace whose ops are op lines alone: a plain decode, the items, a plain seq_rm."""
    pad = " " * indent
    return ("kpool_trace: 1\nname: t\ncache: {kv_size: 64, kpool: 4, n_seq_max: 4}\nops:\n"
            + "".join(f"{pad}- {it}\n" for it in ("decode: {seq: 1, pos: 0}", *items,
                                                  "seq_rm: {seq: 1, p0: 0}")))


def _op_lines_outcome(text: str, monkeypatch: pytest.MonkeyPatch, fast: bool,
                      max_tokens: int | None = None):
    """`_ops_outcome` of the op lines' one step."""
    return _ops_outcome(text, monkeypatch, fast, max_tokens, "plain_op")


@pytest.mark.parametrize(("item", "plain"), OP_LINES, ids=[d for d, _ in OP_LINES])
def test_an_op_line_reads_as_the_walk_reads_it(item: str, plain: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Composed from the text, an op line is the nodes libyaml's events make; read in
    one step, it is the op (or the problems), nodes visited and tokens counted the
    walk field by field gives; the one step takes the plain forms alone (the lines
    around the item are plain: three are read when the item is)."""
    text = _op_lines_trace(item)
    with monkeypatch.context() as m:
        m.setattr(composer, "_OP_LINES_MIN", 1)
        assert _same_either_way(text, m)  # composed from the op lines
    assert _read_alike(text, monkeypatch, "plain_op") == 2 + plain


def test_op_lines_at_the_bounds_are_refused_where_the_walk_refuses_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A range decode and plain steps under every bound on tokens around them, and
    under every bound on nodes visited from before the first line to past the last:
    the same trace or the same problems, one step or field by field."""
    text = _op_lines_trace("decode: {seq: 0, pos: 0..5}", "seq_rm: {seq: 0, p0: 3}",
                           "decode: {seq: 0, pos: 3}")
    outcomes = set()
    for max_tokens in range(4, 10):
        fast = _op_lines_outcome(text, monkeypatch, True, max_tokens)
        assert fast[:2] == _op_lines_outcome(text, monkeypatch, False, max_tokens)[:2]
        outcomes.add(isinstance(fast[0], list))
    assert outcomes == {True, False}  # refused below 7 tokens, read from 7
    visits = _op_lines_outcome(text, monkeypatch, False)[1][0][0]
    import kpool_cli.trace.yaml_safe.limits as limits
    for bound in range(visits - 30, visits + 2):
        monkeypatch.setattr(limits, "MAX_NODE_VISITS", bound)
        assert (_op_lines_outcome(text, monkeypatch, True)[0]
                == _op_lines_outcome(text, monkeypatch, False)[0]), bound


M = composer._OP_LINES_MIN
_STEPS = "".join(f"  - decode: {{seq: 0, pos: {4 * i}..{4 * i + 4}}}\n"
                 f"  - seq_rm: {{seq: 0, p0: {4 * i + 2}}}\n" for i in range(M))

# a trace of op lines, each twisted so that some line that looks like an op line is
# none (or the file is refused): the plain way's result, or its problems, either way
OP_TWISTS = {
    "block scalar": HEAD.replace("ops:\n", "note: |\n" + _STEPS.replace("  - ", "    - ")
                                 + "ops:\n") + "  - decode: {seq: 0, pos: 0}\n",
    "quoted": HEAD.replace("ops:\n", 'note: "a\n' + _STEPS + '  b"\nops:\n')
    + "  - decode: {seq: 0, pos: 0}\n",
    "continued": HEAD + _STEPS + "      more\n",
    "as tokens": HEAD + "  - decode:\n      tokens:\n" + _STEPS.replace("  - ", "        - "),
    "as a pos list": HEAD + "  - decode:\n      seq: 0\n      pos:\n" + _STEPS,
    "under another key": "x:\n" + _STEPS + HEAD,
    "comment": HEAD + _STEPS.replace("p0: 6}\n", "p0: 6}  # c\n"),
    "comment line": HEAD + _STEPS.replace("p0: 6}\n", "p0: 6}\n  # c\n"),
    "tab after": HEAD + _STEPS + "   \t\n",
    "indented more": HEAD + _STEPS.replace("p0: 6}\n  -", "p0: 6}\n   -"),
    "crlf": (HEAD + _STEPS).replace("\n", "\r\n"),
    "among token lines": HEAD + _STEPS + _decode(N) + _STEPS,
    "out of range": HEAD + _STEPS.replace("p0: 6}", "p0: -6}").replace("seq: 0, pos: 8.",
                                                                       "seq: 9, pos: 8."),
    "two documents": HEAD + _STEPS + "---\nx: 1\n",
    "unknown op": HEAD + _STEPS.replace("seq_rm: {seq: 0, p0: 6}", "seq_rn: {seq: 0, p0: 6}"),
    "at column 0": HEAD + _STEPS.replace("  - ", "- "),
}


@pytest.mark.parametrize("name", list(OP_TWISTS))
def test_an_op_line_that_is_no_op_item_is_read_the_plain_way(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _same_either_way(OP_TWISTS[name], monkeypatch)


def test_a_generated_trace_is_composed_from_its_op_lines(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """W3's shape (range decodes and seq_rm, `benchmarks/bench_workloads.py`): every
    op line taken, in runs of at most `_RUN_MOST`, the same trace as the plain way."""
    text = HEAD + _STEPS * 3
    assert _same_either_way(text, monkeypatch)
    lines = _read_all(text, 1 << 30)
    assert lines is not None
    runs = list(lines.runs.values())
    assert all(is_op for _, _, is_op in runs)
    assert [len(run) for _, run, _ in runs] == [composer._RUN_MOST, 6 * M - composer._RUN_MOST]
    t = load_trace_text(text)
    assert [(op.tokens[0].pos, len(op.tokens)) for op in t.ops[:3:2]] == [(0, 4), (4, 4)]
    assert t.ops[1].p0 == 2  # type: ignore[union-attr]


def test_op_lines_past_the_bounds_are_refused_as_the_plain_way_refuses_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that crosses the bound on ops, on nodes or on depth falls back: refused
    at the node the plain way names, or composed alike; more op lines than the
    bounds allow are not scanned at all."""
    import kpool_cli.trace.yaml_safe.limits as limits
    text = HEAD + _STEPS
    for bound in (M, 2 * M - 1, 2 * M, 2 * M + 1):
        with monkeypatch.context() as m:
            m.setattr(limits, "MAX_OPS", bound)
            _same_either_way(text, m)
    nodes = 10 + 7 * 2 * M  # the head's, then each line's
    for bound in range(nodes - 12, nodes + 4):
        with monkeypatch.context() as m:
            m.setattr(limits, "MAX_NODE_VISITS", bound)
            _same_either_way(text, m)
    with monkeypatch.context() as m:
        m.setattr(limits, "MAX_DEPTH", 3)
        _same_either_way(text, m)
    with monkeypatch.context() as m:
        m.setattr(limits, "MAX_OPS", 2 * M - 1)
        assert composer._token_lines(text, 1 << 30) is None
        m.setattr(limits, "MAX_OPS", 2 * M + 1)  # `: {` in the cache's line too
        assert composer._token_lines(text, 1 << 30) is not None


_OP_LINE_MIX = st.sampled_from([
    "  - decode: {seq: 0, pos: 1}", "  - decode: {seq: 0, pos: 1..3}", "  - seq_rm: {seq: 0}",
    "  - seq_rm: {seq: 9, p0: 1}", "   - seq_rm: {seq: 0}", "- seq_rm: {seq: 0}",
    "  - seq_rm: {seq: 0} ", "  - seq_rm:  {seq: 0}", "  - seq_rm: {seq: 0,p0: 1}",
    "  - y: {n: 1}", "  - note: |", "  - note: 'a", "    b'", "  # c", "",
    "  - decode:", "      tokens:", "        - {pos: 2, seq: 0}", "      - seq_rm: {seq: 0}",
    "\t- seq_rm: {seq: 0}", "  - seq_cp: {src: 0, dst: 1}", "  - clear:",
])


@settings(max_examples=150, deadline=None)
@given(st.lists(_OP_LINE_MIX, max_size=40), st.integers(0, 3))
def test_any_mixture_of_op_lines_composes_as_the_plain_way_composes_it(
        mix: list[str], where: int) -> None:
    """Op lines among near misses, token lines and the constructs that swallow lines:
    the same tree or problems either way (both kinds' bounds lowered to 1, so that
    the text is always tried from its runs first)."""
    lines = (HEAD + _STEPS[:200]).split("\n")
    lines[len(lines) * where // 4:len(lines) * where // 4] = mix
    text = "\n".join(lines)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(composer, "_TOKEN_LINES_MIN", 1)
        m.setattr(composer, "_OP_LINES_MIN", 1)
        _same_either_way(text, m)


def test_a_run_past_the_room_left_in_ops_is_refused_as_the_plain_way_refuses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ops that are no op lines before a run: the text holds few enough op lines for
    the bound on ops, but the run crosses it, at the op the plain way names."""
    import kpool_cli.trace.yaml_safe.limits as limits
    text = HEAD + "  - clear:\n" * 10 + _STEPS
    for bound in (2 * M + 1, 2 * M + 9, 2 * M + 10):
        with monkeypatch.context() as m:
            m.setattr(limits, "MAX_OPS", bound)
            assert composer._token_lines(text, 1 << 30) is not None
            assert _tried(text, m)
            _same_either_way(text, m)


def test_an_op_line_past_the_walks_bound_on_visits_is_refused_where_the_walk_refuses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk's own bound on nodes visited (the composer's is the same, and refuses
    first on a file: here the nodes are composed under a higher one), falling before,
    inside and after each op line: the same trace or problems, one step or field by
    field."""
    import kpool_cli.trace.yaml_safe.limits as limits
    from kpool_cli.trace.load import walk
    from kpool_cli.trace.yaml_safe import Stop

    text = _op_lines_trace("decode: {seq: 0, pos: 0..5}", "seq_rm: {seq: 0, p0: 3}")
    monkeypatch.setattr(composer, "_OP_LINES_MIN", 1)
    root = composer.compose(text, "t.yaml", 1 << 40, SHAPE)

    def walked(bound: int, fast: bool) -> object:
        with monkeypatch.context() as m:
            m.setattr(limits, "MAX_NODE_VISITS", bound)
            if not fast:
                m.setattr(OpsWalk, "plain_op", lambda self, item: None)
            w = walk._Walker("t.yaml")
            try:
                got: object = w.trace(root, "0" * 64)
            except Stop:  # the walk stopped at the bound, as the loader sees it
                got = "stopped"
            return got, sorted((p.line, p.column, p.message) for p in w.problems)

    full = walk._Walker("t.yaml")
    assert full.trace(root, "0" * 64) is not None
    refused = 0
    for bound in range(full.visits - 30, full.visits + 2):
        fast = walked(bound, True)
        assert fast == walked(bound, False), bound
        refused += bool(fast[1])
    assert refused == 30  # refused below the visits the walk makes, read at them
