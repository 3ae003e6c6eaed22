"""The walk of a decode (TRACE_FORMAT.md "Trace"; ENGINE.md §3): its one form
(the shorthand `{seq, pos}`, explicit `tokens`, or a fixed split into `ubatches`),
positions and ranges, the fields of a token, and the decode-wide rules.

Owns: `DecodeWalk`, `SHORTHAND` (the shorthand form), `POS_RANGE` (how `A..B` is
written), `range_hint` (what a `pos` that is a range written some other way, `0-4`,
`0:4`, `0...4`, `0..`, is told).

Invariants of a decode read:
- It takes one form, of at least one token; its tokens are counted before they are
  built (past `max_tokens`, the trace is refused).
- A `pos` range `A..B` (half-open, A < B, both ends plain decimal) is checked
  arithmetically before it is built, against the tokens left and against the cache:
  a range of more tokens than its stream has cells (`kv_size`) could never be
  placed by llama_decode, so it is kept unbuilt, as a `Span` (a valid decode,
  refused at replay, KP006, or past the whole cache aborted, KP005), whatever its
  length. A listed decode that large is built (up to the composer's cap, `shape`)
  and replayed alike.
- Every seq id is below `n_seq_max`; every position and `ext` coordinate is in
  `[0, POS_LIMIT)`, so `pos + n_ubatch` fits an int32 (llama_pos).
- `ext` appears only when `cache.by_order` is true; either every token has a `cell`
  (stream-local, `< kv_size`) or none has, and no two tokens name the same cell of
  the same stream (stream 0 when unified, else the token's first seq id); a
  shorthand's `cell` names one cell, so its `pos` gives one position.
- An explicit `ubatches` split has non-empty ubatches of at most `n_ubatch` tokens,
  whose tokens' sequence sets are equal or disjoint (split_equal's ubatches).
- The plain forms a recorder or generator writes most (a token `{pos: P, seq: S}`,
  `plain_token_of`; a decode step `- decode: {seq: S, pos: P}`, ops.py
  `OpsWalk.plain_decode`; an op line's decode of one position or a range,
  `line_decode`) are read in one step, with the same result, count and nodes
  visited as the walk field by field (tests/test_load_fast.py); anything else is
  read the general way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kpool_cli.trace.format import (
    CELL,
    DECODE_FORMS,
    DECODE_KEYS,
    EXT,
    POS,
    POS_LIMIT,
    TOKEN,
)
from kpool_cli.trace.model import Decode, Loc, Span, Token
from kpool_cli.trace.yaml_safe import (
    DECIMAL,
    INT,
    MAP,
    NUMBER_LIKE,
    STR,
    Map,
    Node,
    Scalar,
    Seq,
    TokenMap,
    decimal_int,
    describe,
    limits,
    not_decimal,
    plain_int,
    quote,
)

from .fields import FieldReader, static_bounds

POS_RANGE = re.compile(r"\s*([^\s.]+)\s*\.\.\s*([^\s.]+)\s*")  # ends: see DECIMAL
# a range written some other way: with a dash (`0-4`, `0 - 4`, `0–4`), a colon (`0:4`,
# which YAML 1.1 reads as an int in base 60), three dots or an ellipsis (`0...4`), `to`
_NEAR_RANGE = re.compile(r"\s*([0-9]+)\s*(?:-|\u2013|\u2014|:|\.{3,}|\u2026|to)\s*([0-9]+)\s*")
# a range with an end left out: `0..`, `..4`
_OPEN_RANGE = re.compile(r"\s*(?:[0-9]+\s*\.\.|\.\.\s*[0-9]+)\s*")
_EXPECTED_POS = "expected a position, a range 'A..B' or a list of positions"
SHORTHAND = DECODE_FORMS[0]  # {seq, pos} (+ ext, cell); the others have one key each
_POS_LO, _POS_HI = static_bounds(POS)

_EXT_NEEDS_BY_ORDER = (
    "ext (an M-RoPE token) needs cache.by_order: true, but cache.by_order is false"
)


def range_hint(text: str, *, base60: bool = False) -> str:
    """What the `pos` text `text`, which is no position, range or list, may mean as a
    range (TRACE_FORMAT.md: `A..B`, half-open): `; did you mean 0..4? (half-open: pos 4
    is not in it; 0..5 holds it too)` for `0-4`; how a range is written for `0..` or
    `4-0`; "" for anything else. `base60`: YAML 1.1 read `A:B` as an int, A * 60 + B,
    which the hint says too."""
    m = _NEAR_RANGE.fullmatch(text)
    said = ""
    if m is not None and all(DECIMAL.fullmatch(end) for end in m.groups()):
        a, b = (int(end) for end in m.groups())
        if base60 and len(text) <= 40:
            said = f"; YAML 1.1 reads it in base 60, as {a * 60 + b}"
        if a < b:
            return (f"; did you mean {a}..{b}? (half-open: pos {b} is not in it; "
                    f"{a}..{b + 1} holds it too){said}")
    if m is not None or _OPEN_RANGE.fullmatch(text):
        return ("; a range is written A..B, both ends given, A < B (half-open: B is not "
                f"in it){said}")
    return ""


def _set_words(seqs) -> str:
    return "{" + ", ".join(str(s) for s in seqs) + "}"


@dataclass
class _Tok:
    """A parsed explicit token and where its parts are, for the decode-wide checks."""

    token: Token | None
    field: str
    node: Node
    ext_node: Node | None
    cell_node: Node | None


def plain_token_of(node: Node, seq_hi: int) -> Token | None:
    """The token of `node` when it is the form a recorder writes, `{pos: P, seq: S}`
    with P and S plain decimal ints in range (S up to `seq_hi`), read in one step;
    None for any other node, which `DecodeWalk.token` reads field by field. Either way
    the token, the count and the nodes visited are the same (tests/test_load_fast.py):
    this is the common case (a server trace holds a mapping per token), not a rule."""
    if node.__class__ is TokenMap:  # a token line: its P and S, without its pairs
        pos, seq = decimal_int(node.pos), decimal_int(node.seq)
    else:
        if node.__class__ is not Map or node.tag != MAP or len(node.value) != 2:
            return None
        (k0, v0), (k1, v1) = node.value
        if not (k0.__class__ is Scalar and k0.tag == STR and k1.__class__ is Scalar
                and k1.tag == STR and v0.__class__ is Scalar and v1.__class__ is Scalar):
            return None
        if k0.value == "pos" and k1.value == "seq":
            pos, seq = plain_int(v0), plain_int(v1)
        elif k0.value == "seq" and k1.value == "pos":
            pos, seq = plain_int(v1), plain_int(v0)
        else:
            return None
    if (pos is None or seq is None or not _POS_LO <= pos <= _POS_HI
            or not 0 <= seq <= seq_hi):
        return None
    return Token(pos, (seq,))


class DecodeWalk(FieldReader):
    """A decode, and the fields of its tokens."""

    def op_decode(self, node: Node, f: str, loc: Loc) -> Decode | None:
        before = len(self.problems)
        m = self.map_(node, f, DECODE_KEYS)
        if m is None:
            return None
        forms = [k for form in DECODE_FORMS[1:] for k in form.names if k in m]
        short = [k for k in SHORTHAND.names if k in m]
        if len(forms) + (1 if short else 0) > 1:
            self.problem(
                node, f,
                "a decode takes one form: {seq, pos} (with optional ext, cell), {tokens: [...]}"
                f" or {{ubatches: [[...], ...]}}; got keys {', '.join(forms + short)}",
            )
            return None
        ubatches: tuple[tuple[int, ...], ...] | None = None
        if forms == ["tokens"]:
            items = self.list_(m["tokens"], f"{f}.tokens", "a list of tokens")
            if items is None:
                return None
            plain = self.plain_tokens(items)
            if plain is not None:  # as below, where `check_decode` finds nothing in them
                if len(self.problems) != before:
                    return None
                return Decode(tokens=plain, ubatches=None, loc=loc)
            toks = [self.token(it, f"{f}.tokens[{i}]") for i, it in enumerate(items)]
            if not toks:
                self.problem(m["tokens"], f"{f}.tokens", "a decode needs at least one token")
        elif forms == ["ubatches"]:
            parsed = self.ubatches(m["ubatches"], f"{f}.ubatches")
            if parsed is None:
                return None
            toks, ubatches = parsed
        else:
            return self.shorthand(node, m, f, loc, before)
        self.check_decode(toks)
        if len(self.problems) != before:
            return None
        return Decode(tokens=tuple(t.token for t in toks), ubatches=ubatches, loc=loc)  # type: ignore[misc]

    def line_decode(self, fields: tuple[tuple[str, str, str, str], ...], loc: Loc
                    ) -> Decode | None:
        """The decode of an op line's texts (ops.py `OpsWalk.plain_op`) when it is the
        shorthand `{seq: S, pos: P}` or `{seq: S, pos: A..B}` (the keys in either
        order), S and P (A and B) plain decimal in range, a range no longer than its
        stream (a longer one is kept unbuilt: `beyond_the_stream`), of tokens within
        the bound: its tokens, counted. None for any other, nothing counted."""
        if len(fields) != 2:
            return None
        (k0, t0, v0, vt0), (k1, t1, v1, vt1) = fields
        if t0 != STR or t1 != STR or {k0, k1} != {"seq", "pos"}:
            return None
        (seq_text, seq_tag), (pos_text, pos_tag) = ((v0, vt0), (v1, vt1)) if k0 == "seq" \
            else ((v1, vt1), (v0, vt0))
        seq = decimal_int(seq_text) if seq_tag == INT else None
        if seq is None or not 0 <= seq <= self.seq_hi():
            return None
        if pos_tag == INT:
            a = decimal_int(pos_text)
            if a is None or not _POS_LO <= a <= _POS_HI:
                return None
            b = a + 1
        elif pos_tag == STR:
            first, _, last = pos_text.partition("..")
            a, b = decimal_int(first), decimal_int(last)  # type: ignore[assignment]
            if (a is None or b is None or not 0 <= a < b <= POS_LIMIT
                    or self.beyond_the_stream(b - a, seq)):
                return None
        else:
            return None
        if self.n_tokens + (b - a) > self.max_tokens:
            return None
        self.n_tokens += b - a
        return Decode(tokens=Token.each(range(a, b), (seq,)), loc=loc)

    def ubatches(
        self, node: Node, f: str
    ) -> tuple[list[_Tok], tuple[tuple[int, ...], ...]] | None:
        groups = self.list_(node, f, "a list of ubatches (lists of tokens)")
        if groups is None:
            return None
        if not groups:
            self.problem(node, f, "a decode needs at least one token")
            return None
        toks: list[_Tok] = []
        split: list[tuple[int, ...]] = []
        for j, g in enumerate(groups):
            items = self.list_(g, f"{f}[{j}]", "a ubatch (a list of tokens)")
            if items is None:
                continue
            if not items:
                self.problem(g, f"{f}[{j}]", "a ubatch must not be empty")
                continue
            n_ubatch = self.lim.n_ubatch
            if n_ubatch is not None and len(items) > n_ubatch:
                self.problem(
                    g, f"{f}[{j}]",
                    f"a ubatch of {len(items)} tokens, more than cache.n_ubatch ({n_ubatch}"
                    + (", capped at cache.n_batch and the context's cells)"
                       if self.lim.n_ubatch_capped else ")"),
                )
            start = len(toks)
            toks.extend(self.token(it, f"{f}[{j}][{i}]") for i, it in enumerate(items))
            self.check_ubatch_sets(toks[start:])
            if self.lim.unified is False:
                self.check_stream_blocks(toks[start:], g, f"{f}[{j}]")
            split.append(tuple(range(start, len(toks))))
        return toks, tuple(split)

    def check_ubatch_sets(self, ub: list[_Tok]) -> None:
        """ENGINE.md §3: the hybrid memory splits with split_equal, whose ubatch
        collects sequence sets that overlap none already taken: two tokens of one
        ubatch carry the same set or disjoint ones. A recorded ubatch with sets {0}
        and {0, 1} is no split llama.cpp makes (its recurrent child's find_slot
        assumes one cell per set)."""
        seen: list[frozenset[int]] = []
        for t in ub:
            if t.token is None:
                continue
            ss = frozenset(t.token.seq)
            other = next((o for o in seen if o != ss and o & ss), None)
            if other is not None:
                self.problem(
                    t.node, f"{t.field}.seq",
                    f"sequence set {_set_words(t.token.seq)} overlaps set "
                    f"{_set_words(sorted(other))} of an earlier token of this ubatch: "
                    "split_equal puts only equal or disjoint sets in one ubatch",
                )
                return
            if ss not in seen:
                seen.append(ss)

    def check_stream_blocks(self, ub: list[_Tok], node: Node, f: str) -> None:
        """ENGINE.md §3, a non-unified cache: split_equal (sequential) makes a ubatch
        of one block of tokens per sequence, the blocks equal in size and in ascending
        seq id. llama_kv_cache::find_slot asserts that shape (`n_tokens % n_seqs_unq
        == 0`, each block's first token of one seq id, the block's) and places block
        s in the stream of the ubatch's s-th sequence, a token of another sequence
        included, which kpool does not model: a recorded ubatch of another shape is
        no split llama.cpp makes. (One with coupled sequences the replay refuses, as
        the split would.)"""
        toks = [t for t in ub if t.token is not None]
        if len(toks) < len(ub):
            return  # a token with a problem of its own, told already
        sets = [t.token.seq for t in toks]  # type: ignore[union-attr]
        if any(len(ss) > 1 for ss in sets):
            return  # coupled sequences, which the sequential split refuses (KP006)
        seqs = [ss[0] for ss in sets]
        order = sorted(set(seqs))
        shape = ("a ubatch of a non-unified cache holds one block of tokens per sequence, "
                 "the blocks equal in size and in ascending seq id (split_equal's shape, "
                 "which llama_kv_cache::find_slot asserts and places block by block, each "
                 "in its sequence's stream)")
        size, left = divmod(len(seqs), len(order))
        if left:
            self.problem(node, f, f"{len(seqs)} tokens of {len(order)} sequences: {shape}")
            return
        for i, (t, s) in enumerate(zip(toks, seqs, strict=True)):
            if s != order[i // size]:
                self.problem(t.node, f"{t.field}.seq",
                             f"seq {s} in the block of seq {order[i // size]}: {shape}")
                return

    def token(self, node: Node, f: str) -> _Tok:
        plain = self.plain_token(node)
        if plain is not None:
            self.count_tokens(1, node, f)
            self.visits += 5  # the mapping, its keys and its values, as read below
            return _Tok(plain, f, node, None, None)
        before = len(self.problems)
        self.count_tokens(1, node, f)
        m = self.map_(node, f, TOKEN.names, TOKEN.required)
        if m is None:
            return _Tok(None, f, node, None, None)
        pos = self.pos(m["pos"], f"{f}.pos") if "pos" in m else None
        seq = self.seq_set(m["seq"], f"{f}.seq") if "seq" in m else None
        ext = self.ext(m["ext"], f"{f}.ext") if "ext" in m else None
        cell = self.cell(m["cell"], f"{f}.cell") if "cell" in m else None
        token = None
        if len(self.problems) == before:
            assert pos is not None and seq is not None
            token = Token(pos=pos, seq=seq, ext=ext, cell=cell)
        return _Tok(token, f, node, m.get("ext"), m.get("cell"))

    def plain_tokens(self, items: list[Node]) -> tuple[Token, ...] | None:
        """The tokens of a decode's `tokens` list when every item is `plain_token`'s
        form and reading them one by one (`token`) would cross no bound; None
        otherwise, and then nothing was counted. Either way the walk ends with the same
        tokens, counts and nodes visited: the decode-wide checks find nothing in plain
        tokens (no ext, no cell)."""
        n = len(items)
        if (not n or self.n_tokens + n > self.max_tokens
                or self.visits + 5 * n > self.node_limit):
            return None
        out = []
        seq_hi = self.seq_hi()  # the visits were checked for all n above
        for node in items:
            token = plain_token_of(node, seq_hi)
            if token is None:
                return None
            out.append(token)
        self.n_tokens += n
        self.visits += 5 * n
        return tuple(out)

    def plain_token(self, node: Node) -> Token | None:
        """`plain_token_of(node)` within the bound on nodes visited."""
        if self.visits + 5 > self.node_limit:
            return None
        return plain_token_of(node, self.seq_hi())

    def check_decode(self, toks: list[_Tok]) -> None:
        """The decode-wide rules on explicit tokens: ext needs by_order; all or no
        cells; no cell named twice in one stream (ENGINE.md §2: stream = 0 when
        unified, else the token's first seq id). More tokens in a stream than it has
        cells is llama_decode's refusal or abort, not the loader's (KP006 or KP005 at
        replay)."""
        if self.lim.by_order is False:
            first = next((t for t in toks if t.ext_node is not None), None)
            if first is not None:
                assert first.ext_node is not None
                self.problem(first.ext_node, f"{first.field}.ext", _EXT_NEEDS_BY_ORDER)
        with_cell = [t for t in toks if t.cell_node is not None]
        if with_cell and len(with_cell) != len(toks):
            lacking = next(t for t in toks if t.cell_node is None)
            self.problem(
                lacking.node, lacking.field,
                f"this token has no cell but {with_cell[0].field} has one:"
                " give every token of a decode a cell, or none",
            )
        if not with_cell or self.lim.unified is None:
            return
        taken: dict[tuple[int, int], str] = {}
        for t in with_cell:
            if t.token is None or t.token.cell is None:
                continue
            strm = 0 if self.lim.unified else t.token.seq[0]
            key = (strm, t.token.cell)
            if key in taken:
                where = "" if self.lim.unified else f" of stream {strm}"
                assert t.cell_node is not None
                self.problem(
                    t.cell_node, f"{t.field}.cell",
                    f"cell {t.token.cell}{where} is already taken by {taken[key]}"
                    " in this decode",
                )
            else:
                taken[key] = t.field

    def shorthand(
        self, node: Node, m: dict[str, Node], f: str, loc: Loc, before: int
    ) -> Decode | None:
        """`{seq: S, pos: P}` (+ optional ext for every token, cell for a single one)."""
        for key in SHORTHAND.required:
            if key not in m:
                self.problem(node, f"{f}.{key}", "required key missing")
        seq = self.seq_set(m["seq"], f"{f}.seq") if "seq" in m else None
        ps = self.positions(m["pos"], f"{f}.pos") if "pos" in m else None
        ext = None
        if "ext" in m:
            ext = self.ext(m["ext"], f"{f}.ext")
            if self.lim.by_order is False:
                self.problem(m["ext"], f"{f}.ext", _EXT_NEEDS_BY_ORDER)
        cell = None
        if "cell" in m:
            cell = self.cell(m["cell"], f"{f}.cell")
            if ps is not None and len(ps) != 1:
                self.problem(
                    m["cell"], f"{f}.cell",
                    f"cell names one cell, but pos gives {len(ps)} positions"
                    " (use tokens: to place several)",
                )
        if ps is not None and not ps:
            self.problem(m["pos"], f"{f}.pos", "a decode needs at least one token")
        if len(self.problems) != before or seq is None or ps is None:
            return None
        # from the length alone: a range longer than its stream is never built
        if isinstance(ps, range) and self.beyond_the_stream(len(ps), seq[0]):
            return Decode(tokens=(), span=Span(seq, ps.start, ps.stop, ext), loc=loc)
        self.count_tokens(len(ps), m["pos"], f"{f}.pos")
        return Decode(tokens=Token.each(ps, seq, ext, cell), loc=loc)

    # -- the fields of a token, and counting them

    def seq_set(self, node: Node, field: str) -> tuple[int, ...] | None:
        """A token's sequence set: an int or a list of distinct ints, order kept."""
        if isinstance(node, Scalar):
            v = self.seq_id(node, field)
            return None if v is None else (v,)
        items = self.list_(node, field, "a seq id or a list of seq ids")
        if items is None:
            return None
        if not items:
            self.problem(node, field, "a token needs at least one seq id")
            return None
        out: list[int] = []
        ok = True
        for i, it in enumerate(items):
            v = self.seq_id(it, f"{field}[{i}]")
            if v is None:
                ok = False
            elif v in out:
                self.problem(it, f"{field}[{i}]", f"seq id {v} is listed twice")
                ok = False
            else:
                out.append(v)
        return tuple(out) if ok else None

    def pos(self, node: Node, field: str) -> int | None:
        return self.int_(node, field, POS.lo, POS.hi, POS.hint)

    def positions(self, node: Node, field: str) -> Sequence[int] | None:
        """`pos` of the shorthand decode: an int, "A..B" (half-open, A < B) or a list.
        A range is returned unbuilt (a `range`): its length is checked first."""
        if isinstance(node, Seq):
            items = self.list_(node, field)
            if items is None:
                return None
            ps = [self.pos(it, f"{field}[{i}]") for i, it in enumerate(items)]
            return None if None in ps else ps  # type: ignore[return-value]
        if isinstance(node, Scalar) and node.tag == STR and ".." in node.value:
            if not self.visit(node, field):
                return None
            return self.pos_range(node, field)
        if isinstance(node, Scalar) and (
                # `0-4`, `0:4`: a range written some other way, no int
                (node.tag in (STR, INT) and _NEAR_RANGE.fullmatch(node.value))
                or (node.tag == STR and not (node.plain and NUMBER_LIKE.match(node.value)))):
            if self.visit(node, field):
                # a YAML 1.1 int (`1:20`, base 60) is quoted as written, not as an int
                got = quote(node.value) if node.tag == INT else describe(node)
                self.problem(node, field, f"{_EXPECTED_POS}, got {got}"
                             f"{range_hint(node.value, base60=node.tag == INT)}")
            return None
        v = self.pos(node, field)  # an int, or a number written some other way: int_ says
        return None if v is None else [v]

    def pos_range(self, node: Scalar, field: str) -> range | None:
        """"A..B": both ends plain decimal (as every int), checked before any int()."""
        q = quote(node.value)
        m = POS_RANGE.fullmatch(node.value)
        if m is None or not all(NUMBER_LIKE.match(end) for end in m.groups()):
            self.problem(node, field,
                         f"{_EXPECTED_POS}, got {describe(node)}{range_hint(node.value)}")
            return None
        ends: list[int] = []
        for end in m.groups():
            if not DECIMAL.fullmatch(end):
                self.problem(node, field, f"in the range {q}, {not_decimal(end)}")
                return None
            digits = len(end) - end.startswith("-")
            if digits > limits.MAX_INT_DIGITS:
                self.problem(
                    node, field,
                    f"out of range: the range {q} has an end of {digits} digits"
                    " (positions are below 2**31 - 2**20)",
                )
                return None
            ends.append(int(end))
        a, b = ends
        if a >= b:
            self.problem(node, field, f"empty range {q}: A..B needs A < B")
            return None
        if a < 0 or b > POS_LIMIT:
            past = "starts below 0" if a < 0 else f"ends past {POS_LIMIT - 1}"
            self.problem(
                node, field, f"out of range: {q} {past} (positions are below 2**31 - 2**20)"
            )
            return None
        return range(a, b)

    def ext(self, node: Node, field: str) -> tuple[int, int] | None:
        items = self.list_(node, field, "a list [x, y]")
        if items is None:
            return None
        if len(items) != 2:
            self.problem(node, field, f"ext is [x, y], got {len(items)} values")
            return None
        x, y = (self.int_(it, f"{field}[{i}]", EXT.lo, EXT.hi) for i, it in enumerate(items))
        return None if x is None or y is None else (x, y)

    def cell(self, node: Node, field: str) -> int | None:
        kv = self.lim.kv_size
        hint = f" (cells are stream-local: below cache.kv_size, {kv})" if kv else ""
        return self.int_(node, field, CELL.lo, kv - 1 if kv else CELL.hi, hint)

    def count_tokens(self, n: int, node: Node, field: str) -> None:
        """Count `n` more tokens, before they are built: past `max_tokens`, stop."""
        if self.n_tokens + n > self.max_tokens:
            here = f" ({n:,} here, {self.n_tokens:,} before)" if n > 1 else ""
            self.fatal(
                node, field,
                f"more than {self.max_tokens:,} tokens in the trace{here}: refusing it"
                " (the bound on its tokens, --max-tokens)",
            )
        self.n_tokens += n

    def beyond_the_stream(self, n: int, seq0: int) -> bool:
        """ENGINE.md §3: every token of a decode takes one cell of its stream, all
        placed before anything applies, so more tokens than a stream's `kv_size`
        cells can never be placed, whatever the cache holds. Such a decode is valid
        (llama_decode refuses it, KP006, or past the whole cache aborts, KP005); a
        range this long stays unbuilt."""
        kv, unified = self.lim.kv_size, self.lim.unified
        return kv is not None and unified is not None and n > kv
