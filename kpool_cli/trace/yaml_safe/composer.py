"""Composition of a trace's YAML: its text to light nodes, bounded as it goes.

Owns: `compose` (the root node of the single document of a text, or `TraceError`),
`Composer` (the events to nodes, counting), `Shape` and the contexts `C_*` (where
in the document the ops, the cache block, a decode and its token lists are, as far
as the bounds need), and the located problem of invalid YAML.

Invariants:
- The YAML is *composed*, never constructed: libyaml's parser (PyYAML's own when it
  is built without libyaml) feeds this module's composer, which turns the events
  into light nodes (`nodes`: slotted, no Mark objects, tags from PyYAML's safe
  resolver). So no Python object is ever built from a tag: `NodeReader` (`reader`)
  accepts only the standard scalar, list and mapping tags (`!!python/...`,
  `!custom`, `!!set`, merge keys `<<` are problems).
- The recorder's token lines (`- {pos: P, seq: S}`, one a line: most of a server
  trace) and a generator's op lines (`- seq_rm: {seq: S, p0: P}`: plain words and
  decimal values) are composed from the text, not from libyaml's six or more
  events each (`_TokenLines`, scanned a chunk at a time as libyaml reads): a run of
  them from one event, into nodes that read as the very nodes the events make
  (`TokenMap`, `OpMap`), and only when every such run turned out to be items of a
  token list (of the ops list) where its lines stood; else the text is composed
  again the plain way, whose result and problems are then the ones given.
- Every bound of `limits` but the bytes is checked as each node is made (the
  composer stops at the first bound crossed and names the node there: line, column,
  field), so a hostile file is refused after at most the bound's worth of work. A
  bound crossed, invalid YAML or a second document is a `TraceError` with one
  located problem.
- Lines are the file's as every kpool message counts them (`inputs.line_at`: a line
  ends at `\n` alone). libyaml also ends one at a lone CR, NEL, LS and PS: in a text
  that holds one, every node's and problem's place, and a place a message quotes,
  is mapped back (`_FileLines`; such a text has no token lines, whose scan counts
  `\n`). libyaml's reader places a character it refuses by its UTF-8 byte: that is
  mapped to the character first.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
import yaml.composer
import yaml.nodes
import yaml.resolver

if yaml.__with_libyaml__:
    import yaml.cyaml
from yaml.events import (
    AliasEvent,
    MappingEndEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)

from ...inputs import line_at
from . import limits
from .nodes import INT, STR, Map, Node, OpMap, Scalar, Seq, TokenMap, op_mapping, token_mapping
from .problems import Problem, TraceError, clip, join, quote

# --- YAML composition ---------------------------------------------------------------
#
# The document is composed into light nodes (`Scalar`, `Seq`, `Map`: slotted, no
# Mark objects; about 130 B a node where PyYAML's take 350) and every bound is checked
# as each node is made, so a hostile file is refused after at most the bound's worth
# of work, never after composing all of it.

if yaml.__with_libyaml__:
    # libyaml's scanner and parser (about 10x faster than PyYAML's pure-Python ones)
    _Events: Any = yaml.cyaml.CParser  # type: ignore[attr-defined]
else:  # pragma: no cover - PyYAML built without libyaml
    _Events = yaml.SafeLoader  # its parser part: get_event, peek_event, check_event

# PyYAML's safe resolver decides the tags, as yaml.safe_load would (it has no path
# resolvers, so a scalar's tag depends only on its text and style)
_RESOLVER = yaml.resolver.Resolver()
_SEQ_TAG = _RESOLVER.DEFAULT_SEQUENCE_TAG
_MAP_TAG = _RESOLVER.DEFAULT_MAPPING_TAG

# Where a node sits, as far as the counts care: the root mapping, the cache block, the
# ops list, an op item, a decode, a list whose items are tokens (a decode's pos list,
# tokens list, or one of its ubatches), a decode's ubatches list, or anywhere else.
C_OTHER, C_ROOT, C_CACHE, C_OPS, C_OP, C_DECODE, C_TOKENS, C_UBATCHES = range(8)
_ITEM_CONTEXT = {C_OPS: C_OP, C_UBATCHES: C_TOKENS}  # list's context -> its items'


@dataclass(frozen=True)
class Shape:
    """What the composer knows of a trace's shape, as far as its bounds need: `routes`
    maps (a mapping's context, a key) to the context of the key's value (the items
    of the ops list are ops, those of a ubatches list token lists); `decode_cap`
    gives, from the cache block's scalars, the most tokens one decode may hold (None:
    not known from them), and `unplaceable(cap)` the refusal of a decode past it."""

    routes: Mapping[tuple[int, str], int]
    decode_cap: Callable[[dict[str, Scalar]], int | None]
    unplaceable: Callable[[int], str]


class _Refused(Exception):
    """A bound crossed while composing: refuse the trace there."""

    def __init__(self, line: int, column: int, field: str, message: str) -> None:
        super().__init__(message)
        self.line, self.column, self.field, self.message = line, column, field, message


class _MultipleDocuments(Exception):
    def __init__(self, mark: yaml.Mark) -> None:
        super().__init__()
        self.mark = mark


@dataclass(slots=True)
class _Anchor:
    """An anchored node, its size with aliases expanded (None while it is still being
    composed: an alias to it then is recursive), the tokens counted inside it and the
    context it was composed in."""

    node: Node
    line: int
    column: int
    context: int
    size: int | None = None
    tokens: int = 0


# --- the recorder's token lines, and op lines ---------------------------------------
#
# A server trace is mostly token lines, `- {pos: P, seq: S}` (the form `dump_trace`
# writes, P and S plain decimal), and libyaml makes six events of each, which cost
# most of its load; a generated or converted trace is mostly op lines, `- decode:
# {seq: S, pos: P}`, `- seq_rm: {seq: S, p0: P}` (`op_mapping`: plain words and
# decimal values), seven events and more each. `_TokenLines` is what libyaml reads
# instead of the text (lines broken by "\n" alone, so that its line numbers are
# libyaml's): the text with each run of token lines (consecutive lines, one
# indentation: a decode's tokens) or of op lines (an ops list's items) made one line
# holding a scalar, the placeholder, where the first line's mapping stood, and blank
# lines: one event for the run. It is scanned a chunk at a time as libyaml reads, so
# a file refused near its top costs what the plain way costs, and only the runs of
# the last chunks are held. The composer makes, of each placeholder that is an item
# of a token list (of the ops list) at its line and column, the run's nodes
# (`Composer.token_run`, `Composer.op_run`): a `TokenMap` (an `OpMap`) a line, whose
# pairs are the nodes the mapping's events would have made. The placeholder ends its
# line, as the mapping did, so what precedes it parses alike, and a block sequence's
# next items after blank lines are what follows the run; a line that was no such
# item (inside a block scalar or a quoted string, a more indented line continuing
# the placeholder, a token line among the ops) is found out because its placeholder
# was not taken as one (once libyaml has read `_PARSED_BEHIND` past it, or at the
# end), and the text is then composed the plain way.


_TOKEN_MAPPING = re.compile(token_mapping("("))
_OP_LINE = re.compile("- " + op_mapping("("))  # an op line's item, from its `- `
# a run: a token line (an op line), then every next line that is one at the same
# indentation, up to `_RUN_MOST` lines (the regex engine keeps a state per
# repetition: a longer run is the next match's, a run of its own); group 1 is a token
# run, group 3 an op run
_RUN_MOST = 1024
_TOKEN_RUN = (rf"(^( *+)- {token_mapping('(?:')}$"
              rf"(?:\n\2- {token_mapping('(?:')}$){{0,{_RUN_MOST - 1}}})")
_OP_RUN = rf"(^( *+)- {op_mapping('(?:')}$(?:\n\4- {op_mapping('(?:')}$){{0,{_RUN_MOST - 1}}})"
_RUNS = re.compile(f"{_TOKEN_RUN}|{_OP_RUN}", re.M)
# fewer token lines than this, and fewer op lines than that: the plain way, whatever
# it saves
_TOKEN_LINES_MIN = _OP_LINES_MIN = 256
_TOKEN_LINE_HEAD = "- {pos: "  # in every token line: counted, a bound on how many
_OP_LINE_HEAD = ": {"  # in every op line
_OP_NODES = 3  # an op line's item, its name and its mapping, besides two a pair
_CHUNK = 1 << 16  # the text scanned per read, at least (whole lines)
# more than libyaml (or PyYAML's reader) holds read and not parsed: its buffers, 64 KiB
# (and a token's look-ahead, 1,024 characters)
_PARSED_BEHIND = 1 << 18
# an empty single-quoted scalar: after it, as after a flow mapping's `}`, libyaml
# skips spaces only (a plain scalar would swallow a tab line after it)
_PLACEHOLDER = "''"
# line breaks other than "\n" that libyaml counts: with any, line numbers would differ
_OTHER_BREAKS = ("\r", "\x85", "\u2028", "\u2029")
# a run read and not yet taken: the column (0-based) of its first mapping (of its
# first op's name), its lines' P and S (an op line's name and its mapping's inside),
# and whether it is a run of op lines
_Run = tuple[int, list[tuple[str, str]], bool]


class _TokenLines:
    """What libyaml reads (`read`, a file's) in place of `source`: the text with each
    run of token lines and of op lines made its placeholder and blank lines, `_CHUNK`
    characters of whole lines at a time; and per run read and not yet taken (`runs`,
    which the composer pops each it takes), by the line of its placeholder
    (0-based), the run (`_Run`).

    `read` raises `_NotTokenLines` (libyaml hands it on, and the text is composed the
    plain way) when a run read `_PARSED_BEHIND` characters or more before is still
    not taken: libyaml has parsed past it (its buffers hold less), so it was no
    token item (no op item)."""

    __slots__ = ("_chunks", "_done", "_line", "runs", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.runs: dict[int, _Run] = {}
        self._done = 0  # source[:_done] is read
        self._line = 0  # the line at _done (0-based)
        # (where, its line) of the chunks read, from the last at or before
        # _PARSED_BEHIND characters back
        self._chunks: collections.deque[tuple[int, int]] = collections.deque()

    def read(self, size: int = -1) -> str:
        """The next chunk (`size`, libyaml's wish, is not binding: a file's `read` may
        give more or less); "" at the end."""
        text, done = self.source, self._done
        if done >= len(text):
            return ""
        chunks = self._chunks
        while len(chunks) > 1 and chunks[1][0] <= done - _PARSED_BEHIND:
            chunks.popleft()
        runs = self.runs
        if (runs and chunks and chunks[0][0] <= done - _PARSED_BEHIND
                and next(iter(runs)) < chunks[0][1]):
            raise _NotTokenLines  # libyaml has parsed past a run that was not taken
        chunks.append((done, self._line))
        cut = text.find("\n", done + _CHUNK) + 1 or len(text)
        parts: list[str] = []
        at, line = done, self._line
        for m in _RUNS.finditer(text, done, cut):
            is_op = m.start(3) >= 0
            start, head = m.start(), m.end(4 if is_op else 2) + len("- ")
            line += text.count("\n", at, start)
            run = (_OP_LINE if is_op else _TOKEN_MAPPING).findall(
                text, head - (len("- ") if is_op else 0), m.end())
            runs[line] = (head - start, run, is_op)
            parts += (text[at:head], _PLACEHOLDER, "\n" * (len(run) - 1))
            line += len(run) - 1
            at = m.end()
        parts.append(text[at:cut])
        self._line = line + text.count("\n", at, cut)
        self._done = cut
        return "".join(parts)


class _NotTokenLines(Exception):
    """A token line (an op line) was not what it looked like: compose the text the
    plain way."""


def _token_lines(text: str, most: int, node_limit: int | None = None) -> _TokenLines | None:
    """What libyaml reads of `text` with its token lines and op lines made runs
    (`_TokenLines`), when it may have from `_TOKEN_LINES_MIN` to `most` token lines,
    or from `_OP_LINES_MIN` op lines (each counted by the text every such line holds,
    `_TOKEN_LINE_HEAD`, `_OP_LINE_HEAD`: at least as many), and at most `most` token
    lines and as many op lines as the bounds on ops and nodes allow, and no line
    break but "\n"; else None, the plain way. (More than `most`, a bound of the
    composer's, or than those, and the plain way refuses a trace of them: none is
    read here, so what this holds stays below the bound's worth.)"""
    n, n_ops = text.count(_TOKEN_LINE_HEAD), text.count(_OP_LINE_HEAD)
    most_ops = min(limits.MAX_OPS, limits.node_limit(node_limit) // (_OP_NODES + 2))
    if (n > most or n_ops > most_ops or (n < _TOKEN_LINES_MIN and n_ops < _OP_LINES_MIN)
            or any(b in text for b in _OTHER_BREAKS)):
        return None
    return _TokenLines(text)


class Composer:
    """Composes the single document of `text` into light nodes, bounding as it goes:
    - at most `node_limit` nodes (`MAX_NODE_VISITS` unless the caller chose another
      bound, `--max-nodes`), an alias counting as the size of the node it
      names (so the count is the size of the document with every alias expanded:
      what the walk may visit); an alias to a node still being composed is recursive;
    - at most `MAX_DEPTH` nested collections (the composition recurses per level);
    - at most `MAX_OPS` items in `ops`, `MAX_ITEMS` in any list or mapping other than
      `ops` and the token lists (no other collection of a valid trace comes close);
    - tokens, counted as the items of a decode's `pos`, `tokens` and `ubatches[i]`
      lists: at most `max_tokens` in the trace and, once the cache block has been
      read, at most the shape's `decode_cap` in one decode. `pos` ranges are left to
      the walk, which checks them before building them.
    The walk checks all of this again, exactly (a count here never exceeds the walk's
    on a valid trace: an alias's tokens are counted only where it stands in the same
    context as the node it names)."""

    def __init__(self, text: str | _TokenLines, max_tokens: int, shape: Shape,
                 node_limit: int | None = None) -> None:
        self.events = _Events(text)
        self.shape = shape
        self.routes = shape.routes
        self.map_contexts = frozenset(c for c, _ in shape.routes)
        self.get = self.events.get_event
        self.max_tokens = max_tokens
        self.node_limit = limits.node_limit(node_limit)
        self.anchors: dict[str, _Anchor] = {}
        self.nodes = 0  # composed so far, aliases expanded
        self.tokens = 0  # in token lists so far, aliases expanded
        self.decode_tokens = 0  # in the current decode
        self.decode_cap: int | None = None  # the shape's, once the cache is read
        self.cache: dict[str, Scalar] = {}
        self.path: list[str | int | None] = []  # keys and indices down to the current node
        self.depth = 0
        self.memo: dict[str, tuple[str, str]] = {}  # plain scalar text -> (text, tag)
        self.line0, self.line = -1, 0  # the last node's line (0-based, 1-based)
        self.lines: _TokenLines | None = None  # set when `text` is it
        # libyaml's 0-based place to the file's, for a place a message quotes
        # (`compose` sets `_FileLines.at` where they differ)
        self.at: Callable[[int, int], tuple[int, int]] = _as_is

    def document(self) -> Node | None:
        """The root node (None for an empty stream). Mirrors `Composer.get_single_node`,
        with a dedicated error for a second document."""
        self.get()  # StreamStart
        root = None
        if not self.events.check_event(StreamEndEvent):
            self.get()  # DocumentStart
            root = self.node(self.get(), C_ROOT)
            self.get()  # DocumentEnd
        if not self.events.check_event(StreamEndEvent):
            raise _MultipleDocuments(self.get().start_mark)
        return root

    # -- reporting

    def field(self) -> str:
        out = ""
        for part in self.path:
            if part is None:  # composing a key: the mapping's own field
                break
            out = f"{out}[{part}]" if isinstance(part, int) else join(out, clip(part))
        return out or "<document>"

    def refuse(self, ev: Any, message: str) -> _Refused:
        m = ev.start_mark
        return _Refused(m.line + 1, m.column + 1, self.field(), message)

    def too_many_nodes(self, ev: Any) -> _Refused:
        return self.refuse(
            ev, f"more than {self.node_limit:,} YAML nodes in the trace: refusing it"
            " (the bound on a trace's size, --max-nodes)",
        )

    def count_token(self, ev: Any, n: int = 1, in_decode: bool = True) -> None:
        """`n` more tokens: of the current decode when `in_decode`, else (an alias of
        whole decodes) only of the trace."""
        self.tokens += n
        if in_decode:
            self.decode_tokens += n
            cap = self.decode_cap
            if cap is not None and self.decode_tokens > cap:
                raise self.refuse(ev, self.shape.unplaceable(cap))
        if self.tokens > self.max_tokens:
            raise self.refuse(ev, f"more than {self.max_tokens:,} tokens in the trace: refusing"
                              " it (the bound on its tokens, --max-tokens)")

    # -- nodes

    def node(self, ev: Any, context: int) -> Node:
        cls = ev.__class__
        if cls is ScalarEvent:
            return self.scalar(ev, context)
        if cls is AliasEvent:
            return self.alias(ev, context)
        self.depth += 1
        if self.depth > limits.MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {limits.MAX_DEPTH} levels", ev.start_mark,
            )
        try:
            if cls is SequenceStartEvent:
                return self.sequence(ev, context)
            return self.mapping(ev, context)
        finally:
            self.depth -= 1

    def scalar(self, ev: Any, context: int) -> Scalar:
        self.nodes += 1
        if self.nodes > self.node_limit:
            raise self.too_many_nodes(ev)
        tag, value = ev.tag, ev.value
        if tag is None or tag == "!":
            implicit = ev.implicit
            if implicit[0]:
                hit = self.memo.get(value)
                value, tag = self.plain(value) if hit is None else hit
            else:
                tag = _RESOLVER.resolve(yaml.nodes.ScalarNode, value, implicit)
        m = ev.start_mark
        if m.line != self.line0:  # the nodes of a line share one int object
            self.line0, self.line = m.line, m.line + 1
        # plain: written bare and untagged (`!!str 5` and `! 5` say what `5` is not)
        node = Scalar(tag, value, self.line, m.column + 1, not ev.style and ev.tag is None)
        if ev.anchor is not None:
            self.open_anchor(ev, node, context).size = 1
        return node

    def plain(self, value: str) -> tuple[str, str]:
        """(the text, the tag) of a plain scalar `value`, as PyYAML's safe resolver
        tags it; a short text is kept (`memo`: its later scalars share the string)."""
        hit = self.memo.get(value)
        if hit is None:
            if value.isdigit() and value.isascii() and (value[0] != "0" or value == "0"):
                hit = (value, INT)  # what the resolver says of plain decimal, sooner
            else:
                hit = (value, _RESOLVER.resolve(yaml.nodes.ScalarNode, value, (True, False)))
            if len(value) <= 16 and len(self.memo) < 4096:
                self.memo[value] = hit
        return hit

    def alias(self, ev: Any, context: int) -> Node:
        name = ev.anchor
        a = self.anchors.get(name)
        if a is None:
            raise yaml.composer.ComposerError(
                None, None, f"found undefined alias {quote(name)}", ev.start_mark,
            )
        if a.size is None:
            line, column = self.at(a.line - 1, a.column - 1)
            raise self.refuse(
                ev, f"a recursive alias: *{clip(name)} is used inside the node"
                f" it names (anchored at line {line}, column {column})",
            )
        self.nodes += a.size
        if self.nodes > self.node_limit:
            raise self.refuse(
                ev, f"more than {self.node_limit:,} YAML nodes once aliases are expanded:"
                f" refusing the trace (the alias *{clip(name)} here stands for"
                f" {a.size:,} nodes: an alias bomb?; the bound on a trace's size,"
                " --max-nodes)",
            )
        if a.tokens and a.context == context:
            self.count_token(ev, a.tokens, context in (C_TOKENS, C_UBATCHES))
        node = a.node
        if isinstance(node, Scalar):  # placed where the alias stands, not its anchor: a
            m = ev.start_mark         # message about it (a duplicate key) names this line
            if m.line != self.line0:
                self.line0, self.line = m.line, m.line + 1
            return Scalar(node.tag, node.value, self.line, m.column + 1, node.plain)
        return node

    def open_anchor(self, ev: Any, node: Node, context: int) -> _Anchor:
        name = ev.anchor
        first = self.anchors.get(name)
        if first is not None:
            raise yaml.composer.ComposerError(
                f"found duplicate anchor {quote(name)}; first occurrence",
                yaml.Mark("<trace>", 0, first.line - 1, first.column - 1,
                          None, None),  # type: ignore[arg-type]  # no buffer: no snippet
                "second occurrence", ev.start_mark,
            )
        a = _Anchor(node, node.line, node.column, context)
        self.anchors[name] = a
        return a

    def collection_start(self, ev: Any, default_tag: str) -> str:
        """A list or mapping begins: count it against the node limit, follow its line,
        and give its tag (the default one when the YAML names none)."""
        self.nodes += 1
        if self.nodes > self.node_limit:
            raise self.too_many_nodes(ev)
        line = ev.start_mark.line
        if line != self.line0:
            self.line0, self.line = line, line + 1
        tag = ev.tag
        return default_tag if tag is None or tag == "!" else tag

    def sequence(self, ev: Any, context: int) -> Seq:
        nodes0, tokens0 = self.nodes, self.tokens
        tag = self.collection_start(ev, _SEQ_TAG)
        items: list[Node] = []
        node = Seq(tag, items, self.line, ev.start_mark.column + 1)
        anchor = None if ev.anchor is None else self.open_anchor(ev, node, context)
        item_context = _ITEM_CONTEXT.get(context, C_OTHER)
        tokens = context == C_TOKENS
        cap = limits.MAX_OPS if context == C_OPS else limits.MAX_ITEMS
        path = self.path
        path.append(0)
        at = len(path) - 1
        get, scalar, node_ = self.get, self.scalar, self.node
        lines = (self.lines.runs if (tokens or context == C_OPS) and self.lines is not None
                 else None)
        while True:
            e = get()
            if e.__class__ is SequenceEndEvent:
                break
            n = len(items)
            path[at] = n
            if tokens:
                self.count_token(e)
                if lines is not None and e.__class__ is ScalarEvent:
                    run = self.token_run(e, lines)
                    if run is not None:
                        items += run
                        continue
            elif n >= cap:
                raise self.refuse(e, (
                    f"more than {limits.MAX_OPS:,} ops in the trace: refusing it"
                    " (the bound on its ops)"
                    if context == C_OPS else
                    f"a list of more than {limits.MAX_ITEMS:,} items: refusing the trace"
                    " (no list of a trace but ops and a decode's tokens is that long)"
                ))
            elif lines is not None and e.__class__ is ScalarEvent:  # an op's, in `ops`
                ops = self.op_run(e, lines, cap - n)
                if ops is not None:
                    items += ops
                    continue
            items.append(scalar(e, item_context) if e.__class__ is ScalarEvent
                         else node_(e, item_context))
        path.pop()
        if anchor is not None:
            anchor.size, anchor.tokens = self.nodes - nodes0, self.tokens - tokens0
        return node

    def taken(self, ev: Any, runs: dict[int, _Run], ops: bool
              ) -> tuple[int, list[tuple[str, str]]] | None:
        """The run (its column, its lines) whose placeholder is the scalar `ev`, an item
        of a token list (of `ops` when `ops`), taken off the runs; None when no run's
        placeholder is on its line. `_NotTokenLines` when `ev` is not its run's
        placeholder, or the run is of the other kind (a token line among the ops)."""
        m = ev.start_mark
        got = runs.pop(m.line, None)
        if got is None:
            return None
        column, run, is_op = got
        if (is_op is not ops or m.column != column or ev.value != "" or ev.style != "'"
                or ev.tag is not None or ev.anchor is not None):
            raise _NotTokenLines
        return column, run

    def token_run(self, ev: Any, runs: dict[int, _Run]) -> list[TokenMap] | None:
        """The nodes of the run of token lines whose placeholder is the scalar `ev`,
        an item of a token list (counted as one token already), when it is one
        (`_TokenLines`): a `TokenMap` a line; None off the runs. `_NotTokenLines`
        when `ev` is not its run's placeholder, or the run would cross a bound (the
        plain way then refuses the trace, where it does)."""
        got = self.taken(ev, runs, False)
        if got is None:
            return None
        column, run = got
        # a TokenMap is a collection a level down
        if self.depth + 1 > limits.MAX_DEPTH or self.nodes + 5 * len(run) > self.node_limit:
            raise _NotTokenLines
        try:
            self.count_token(ev, len(run) - 1)
        except _Refused:
            raise _NotTokenLines from None
        self.nodes += 5 * len(run)
        line, column = ev.start_mark.line + 1, column + 1
        return [TokenMap(p, s, line + i, column) for i, (p, s) in enumerate(run)]

    def op_run(self, ev: Any, runs: dict[int, _Run], room: int) -> list[OpMap] | None:
        """The nodes of the run of op lines whose placeholder is the scalar `ev`, an
        item of `ops` with room for `room` more, when it is one (`_TokenLines`): an
        `OpMap` a line, each name, key and value tagged as `scalar` tags them; None
        off the runs. `_NotTokenLines` when `ev` is not its run's placeholder, or the
        run would cross a bound (the plain way then refuses the trace, where it
        does)."""
        got = self.taken(ev, runs, True)
        if got is None:
            return None
        column, run = got
        # an op's item is a collection a level down, its mapping two
        if self.depth + 2 > limits.MAX_DEPTH or len(run) > room:
            raise _NotTokenLines
        plain = self.plain
        line, column = ev.start_mark.line + 1, column + 1
        out: list[OpMap] = []
        nodes = 0
        for i, (name, inside) in enumerate(run):
            fields = tuple((*plain(k), *plain(v)) for k, v in (
                pair.split(": ") for pair in inside.split(", ")))
            nodes += _OP_NODES + 2 * len(fields)
            out.append(OpMap(*plain(name), fields, line + i, column))
        if self.nodes + nodes > self.node_limit:
            raise _NotTokenLines
        # (a decode's mapping sets `decode_tokens` to 0 as it starts: an op line holds
        # no token list, and the next decode's sets it again)
        self.nodes += nodes
        return out

    def mapping(self, ev: Any, context: int) -> Map:
        nodes0, tokens0 = self.nodes, self.tokens
        tag = self.collection_start(ev, _MAP_TAG)
        pairs: list[tuple[Node, Node]] = []
        node = Map(tag, pairs, self.line, ev.start_mark.column + 1)
        anchor = None if ev.anchor is None else self.open_anchor(ev, node, context)
        if context == C_DECODE:
            self.decode_tokens = 0
        keyed = context in self.map_contexts
        routes = self.routes
        path = self.path
        path.append(None)
        at = len(path) - 1
        get, scalar, node_ = self.get, self.scalar, self.node
        while True:
            e = get()
            if e.__class__ is MappingEndEvent:
                break
            path[at] = None
            if len(pairs) >= limits.MAX_ITEMS:
                raise self.refuse(e, f"a mapping of more than {limits.MAX_ITEMS:,} keys: refusing"
                                  " the trace (a mapping of a trace has a few keys)")
            k = scalar(e, C_OTHER) if e.__class__ is ScalarEvent else node_(e, C_OTHER)
            key = k.value if k.__class__ is Scalar and k.tag == STR else "?"
            path[at] = key
            sub = routes.get((context, key), C_OTHER) if keyed else C_OTHER
            e = get()
            v = scalar(e, sub) if e.__class__ is ScalarEvent else node_(e, sub)
            pairs.append((k, v))
            if context == C_CACHE and isinstance(v, Scalar):
                self.cache[key] = v
        path.pop()
        if context == C_CACHE:
            self.decode_cap = self.shape.decode_cap(self.cache)
        if anchor is not None:
            anchor.size, anchor.tokens = self.nodes - nodes0, self.tokens - tokens0
        return node


def compose(text: str, file: str, max_tokens: int, shape: Shape,
            max_nodes: int | None = None) -> Node | None:
    """The root node of the single document of `text` (None for an empty stream),
    bounded as `Composer` says (`max_nodes`: its node bound, None for
    `MAX_NODE_VISITS`). Raises `TraceError`, with one located problem, for invalid
    YAML, a bound crossed or a second document."""
    node_limit = limits.node_limit(max_nodes)
    # a token line is 5 nodes and a token: past either bound, the file is refused (a
    # text with a break other than \n has no token lines)
    lines = _token_lines(text, min(max_tokens, node_limit // 5), node_limit)
    if lines is not None:
        done, root = _compose_token_lines(lines, max_tokens, shape, node_limit)
        if done:
            return root
        del lines  # nothing of the scan outlives it
    c = Composer(text, max_tokens, shape, node_limit)
    odd = _FileLines.of(text)  # libyaml breaks lines the file does not: map them back
    at = c.at = odd.at if odd else _as_is
    try:
        root = c.document()
        if odd:
            odd.place(root)
        return root
    except yaml.YAMLError as e:
        raise TraceError([_yaml_problem(file, text, e, at)]) from None
    except _Refused as e:
        raise TraceError([Problem(file, *at(e.line - 1, e.column - 1), e.field,
                                  e.message)]) from None
    except _MultipleDocuments as e:
        raise TraceError([Problem(
            file, *at(e.mark.line, e.mark.column), "<document>",
            "a second YAML document: a trace file holds exactly one",
        )]) from None
    except RecursionError:
        raise TraceError([Problem(file, 0, 0, "<yaml>", "YAML nested too deeply")]) from None
    finally:
        c.events.dispose()


def _compose_token_lines(lines: _TokenLines, max_tokens: int, shape: Shape, node_limit: int
                         ) -> tuple[bool, Node | None]:
    """(True, the root node) when `lines` composes with every token line taken
    as the token item it looked like; else (False, None), nothing of it kept (the
    caller composes the text the plain way, and finds its problem there)."""
    c = Composer(lines, max_tokens, shape, node_limit)
    c.lines = lines
    try:
        root = c.document()
    except (yaml.YAMLError, _Refused, _MultipleDocuments, _NotTokenLines, RecursionError):
        return False, None
    finally:
        c.events.dispose()
    return (True, root) if not lines.runs else (False, None)


# what libyaml takes for a line break, and those of them a file's lines do not end at
_YAML_BREAKS = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
_YAML_ONLY_BREAKS = re.compile("\r(?!\n)|[\x85\u2028\u2029]")


def _as_is(line0: int, column0: int) -> tuple[int, int]:
    """libyaml's 0-based place, 1-based: the file's, in a text of `\n` breaks alone."""
    return line0 + 1, column0 + 1


class _FileLines:
    """libyaml's lines mapped to the file's (`inputs.line_at`'s: `\n` alone ends one),
    for a text where libyaml breaks more (a lone CR, NEL, LS, PS): per libyaml line,
    the file's line it is on and the column it starts at there."""

    __slots__ = ("_starts",)

    def __init__(self, text: str) -> None:
        starts = [(1, 0)]
        line, base = 1, 0  # the file's line, and where it starts
        for m in _YAML_BREAKS.finditer(text):
            if m.group().endswith("\n"):
                line, base = line + 1, m.end()
            starts.append((line, m.end() - base))
        self._starts = starts

    @classmethod
    def of(cls, text: str) -> _FileLines | None:
        """The map for `text`, or None when libyaml's lines are the file's."""
        return cls(text) if _YAML_ONLY_BREAKS.search(text) else None

    def at(self, line0: int, column0: int) -> tuple[int, int]:
        """The file's 1-based (line, column) of libyaml's 0-based place."""
        line, start = self._starts[min(line0, len(self._starts) - 1)]
        return line, start + column0 + 1

    def place(self, root: Node | None) -> None:
        """Every node under `root` (each once: an alias repeats a node) moved to the
        file's place of libyaml's."""
        seen: set[int] = set()
        todo = [] if root is None else [root]
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            node.line, node.column = self.at(node.line - 1, node.column - 1)
            if isinstance(node, Seq):
                todo += node.value
            elif isinstance(node, Map):
                for k, v in node.value:
                    todo += (k, v)


def _line_col(text: str, index: int) -> tuple[int, int]:
    """1-based line (`inputs.line_at`'s) and column of `text[index]`."""
    return line_at(text, index), index - text.rfind("\n", 0, index)


_BLOCK = 1 << 16  # `_char_at` counts the line breaks of this many characters at a time


def _char_at(text: str, line: int, col: int) -> str:
    """The character of the file at 1-based `line` and `col` (`\n` alone ends a
    line), or "" past its end. The line is found by counting breaks a block at a
    time: nothing of the text is copied, so a 64 MB file of short lines costs no
    string a line (a split would cost 60 bytes each, a gigabyte)."""
    before, start = line - 1, 0  # the breaks before the line, where the search is
    while before:
        n = text.count("\n", start, start + _BLOCK)
        if n < before:
            if start + _BLOCK >= len(text):
                return ""  # past the last line
            before, start = before - n, start + _BLOCK
            continue
        for _ in range(before):  # the line starts in this block
            start = text.index("\n", start) + 1
        break
    end = text.find("\n", start)
    at = start + col - 1
    return text[at] if col >= 1 and at < (len(text) if end < 0 else end) else ""


def _yaml_problem(file: str, text: str, e: yaml.YAMLError,
                  at: Callable[[int, int], tuple[int, int]] = _as_is) -> Problem:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        msg = e.problem or "invalid YAML"
        if e.context:
            where = f" at line {at(e.context_mark.line, 0)[0]}" if e.context_mark else ""
            msg = f"{msg} ({e.context}{where})"
        line, col = at(mark.line, mark.column) if mark else (0, 0)
        msg = f"invalid YAML: {clip(msg, 300)}"
        if line and _char_at(text, line, col) == "\t":  # a tab: libyaml's words don't say
            msg += " (a tab: YAML indents with spaces)"
        return Problem(file, line, col, "<yaml>", msg)
    if isinstance(e, yaml.reader.ReaderError) and isinstance(e.character, int):
        index = e.position
        if yaml.__with_libyaml__:  # libyaml's reader counts the UTF-8 bytes before it
            index = len(text.encode("utf-8", "surrogatepass")[:index].decode("utf-8",
                                                                             "ignore"))
        line, col = _line_col(text, index)
        return Problem(
            file, line, col, "<yaml>",
            f"invalid YAML: character U+{e.character:04X} is not allowed ({e.reason})",
        )
    return Problem(file, 0, 0, "<yaml>", f"invalid YAML: {clip(str(e), 300)}")
