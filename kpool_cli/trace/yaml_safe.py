"""Safe YAML for a trace file: bounded reading and composition, typed reading of the
nodes, and located problems. What a trace must hold (format v1) is `trace.load`'s.

Owns: `Problem`, `TraceError`, the bounds of a trace file (`MAX_BYTES`,
`MAX_NODE_VISITS`, `MAX_DEPTH`, `MAX_OPS`, `MAX_ITEMS`, `MAX_TOKENS`,
`MAX_INT_DIGITS`, `MAX_PROBLEMS`), `read_trace_file` and `encode_trace_text` (text and
hash, bounded), `compose` (text to light nodes, `Scalar`/`Seq`/`Map`, bounded as it
goes; `Shape` says where in the document the ops, the cache block, a decode and its
token lists are), and `NodeReader`, the base of the loader's walk: it reads nodes as
typed values and collects located problems.

Invariants:
- The YAML is *composed*, never constructed: libyaml's parser (PyYAML's own when it
  is built without libyaml) feeds this module's composer, which turns the events
  into light nodes (slotted, no Mark objects, tags from PyYAML's safe resolver). So
  no Python object is ever built from a tag: `NodeReader` accepts only the standard
  scalar, list and mapping tags (`!!python/...`, `!custom`, `!!set`, merge keys `<<`
  are problems).
- Bounds are checked *before* the work they bound ("refuse before spending"): at
  most `MAX_BYTES` of text, read no further. The composer counts while it composes
  and stops at the first bound crossed, naming the node there (line, column,
  field): `MAX_NODE_VISITS` nodes, an alias counting as the size of the node it
  names (so an alias bomb stops at the alias that crosses; an alias to a node still
  being composed is a recursive alias); `MAX_DEPTH` levels; `MAX_OPS` ops;
  `MAX_ITEMS` items in any other list or mapping but a token list; tokens (the
  items of a decode's `pos`, `tokens` and `ubatches[i]` lists): `max_tokens` in the
  trace (default `MAX_TOKENS`; the CLI's `--max-tokens`) and, once the cache block
  has been read, the shape's `decode_cap` in one decode. `NodeReader` counts the
  nodes it visits again, aliases expanded, against `MAX_NODE_VISITS`.
- Every problem carries the node's start (1-based line and column) and a dotted
  field path such as `ops[3].decode.tokens[1].pos`; a problem quotes at most 40
  characters of a scalar; at most `MAX_PROBLEMS` are collected (`TraceError.truncated`
  says whether more were left unreported).
- Ints are plain decimal, `-?[0-9]+` with no leading zero (`DECIMAL`): YAML 1.1's
  other int forms (`010` octal, `0x1F`, `0b101`, `1_000`, `+5`, `1:20` in base 60)
  and number-like strings (`0o17`, `1e3`) are problems saying what to write instead
  (`not_decimal`); an int of more than `MAX_INT_DIGITS` digits is refused by its
  size, never parsed.
- Mappings are strict: unknown keys (with the closest known key suggested),
  duplicate keys, non-string keys and missing required keys are problems; wrong
  types too (YAML `true` is not the int 1; an int is not a bool; `"5"` is not an
  int).
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
import yaml.composer
import yaml.nodes
import yaml.resolver

from ..inputs import InputRefused, InputTooLarge, read_input

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

from kpool_cli.wording import visible

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_ITEMS",
    "MAX_NODE_VISITS",
    "MAX_OPS",
    "MAX_PROBLEMS",
    "MAX_TOKENS",
    "Map",
    "Node",
    "NodeReader",
    "Problem",
    "Scalar",
    "Seq",
    "Shape",
    "Stop",
    "TraceError",
    "compose",
    "encode_trace_text",
    "read_trace_file",
]

# --- limits -------------------------------------------------------------------------

MAX_BYTES = 64 * 1024 * 1024  # a larger document is refused unread
# nodes, aliases expanded: ~130 B and 2 to 3 us each to parse, compose and walk. A
# recorded llama-server trace of 2,100 decodes of 64 `{pos: N, seq: [S]}` tokens has
# 817k (6 nodes a token), so this bound also caps explicit tokens near 160k.
MAX_NODE_VISITS = 1_000_000
MAX_OPS = 2**16  # ops in a trace (that same recorded trace has 2,100)
MAX_ITEMS = 2**16  # items of any other list or mapping, but a token list
MAX_PROBLEMS = 20  # problems collected before giving up
MAX_TOKENS = 2**22  # default token bound of a trace (a Token object: ~1 us, ~100 B)
MAX_DEPTH = 32  # YAML nesting levels (a valid trace needs 9)
MAX_INT_DIGITS = 20  # SEED_MAX has 20 digits: a longer int is out of range everywhere

DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)", re.ASCII)  # the only int syntax
NUMBER_LIKE = re.compile(r"[-+]?\.?[0-9]", re.ASCII)  # written as a number of some kind

# --- problems -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a trace. `line`/`column` are 1-based (0: no position,
    e.g. an unreadable file); `field` is a dotted path (`cache.kv_size`,
    `ops[3].decode.tokens[1].pos`) or `<file>`, `<yaml>`, `<document>`."""

    file: str
    line: int
    column: int
    field: str
    message: str

    def __str__(self) -> str:
        if self.line == 0:  # no position: the file as a whole
            where = "" if self.field == "<file>" else f" {self.field}:"
            return f"{self.file}:{where} {self.message}"
        return f"{self.file}:{self.line}:{self.column}: {self.field}: {self.message}"


class TraceError(Exception):
    """A trace that cannot be loaded; `problems` lists why (at most `MAX_PROBLEMS`,
    `truncated` says whether more were left unreported)."""

    def __init__(self, problems: Sequence[Problem], truncated: bool = False) -> None:
        super().__init__(list(problems), truncated)
        self.problems: list[Problem] = list(problems)
        self.truncated = truncated

    @property
    def unread(self) -> bool:
        """The file could not be read at all (missing, a FIFO, too large): no problem
        has a position in it."""
        return all(p.field == "<file>" and p.line == 0 for p in self.problems)

    def __str__(self) -> str:
        """One line per problem, each made visible (a path or a quoted value cannot
        break a line or carry an escape sequence): the Problems keep the raw text."""
        lines = [visible(str(p)) for p in self.problems]
        if self.truncated:
            lines.append(f"(stopped after {len(self.problems)} problems)")
        return "\n".join(lines)


# --- reading, bounded ---------------------------------------------------------------


def check_max_tokens(max_tokens: int) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")


def read_trace_file(path: str | Path) -> tuple[str, str, str]:
    """(file, text, sha256 of the bytes) of the trace at `path`, at most `MAX_BYTES`
    read. Raises `TraceError`, never anything else, for a file that cannot be read
    (missing, a directory, not UTF-8, too large)."""
    file = str(path)
    if not file:
        raise TraceError([Problem("''", 0, 0, "<file>", "the trace path is empty")])
    try:
        data = read_input(path, MAX_BYTES)
    except InputTooLarge:
        raise TraceError([_too_big(file)]) from None
    except InputRefused as e:
        problem = Problem(file, 0, 0, "<file>", f"cannot read the trace: it {e}")
        raise TraceError([problem]) from None
    except OSError as e:
        reason = e.strerror or type(e).__name__
        problem = Problem(file, 0, 0, "<file>", f"cannot read the trace: {reason}")
        raise TraceError([problem]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(
            [Problem(file, 0, 0, "<file>", f"not UTF-8 text: {e.reason} at byte {e.start}")]
        ) from None
    return file, text, hashlib.sha256(data).hexdigest()


def encode_trace_text(text: str, path: str) -> str:
    """The sha256 of `text` encoded as UTF-8; `TraceError` if it cannot be encoded
    (lone surrogates) or is larger than `MAX_BYTES`."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates
        raise TraceError(
            [Problem(path, 0, 0, "<file>", f"not encodable as UTF-8: {e.reason}")]
        ) from None
    if len(data) > MAX_BYTES:
        raise TraceError([_too_big(path)])
    return hashlib.sha256(data).hexdigest()


def _too_big(file: str) -> Problem:
    return Problem(file, 0, 0, "<file>", f"the trace is larger than {MAX_BYTES >> 20} MiB")

# --- tags -------------------------------------------------------------------------

_Y = "tag:yaml.org,2002:"
STR, INT, BOOL, FLOAT, NULL, TIMESTAMP = (
    _Y + "str", _Y + "int", _Y + "bool", _Y + "float", _Y + "null", _Y + "timestamp"
)
SEQ, MAP, MERGE = _Y + "seq", _Y + "map", _Y + "merge"
_TYPE_NAMES = {
    STR: "a string", INT: "an int", BOOL: "a bool", FLOAT: "a float", NULL: "null",
    TIMESTAMP: "a timestamp",
}
# SafeConstructor.bool_values: YAML 1.1's bools, by lowercased text
BOOLS = {"yes": True, "no": False, "true": True, "false": False, "on": True, "off": False}
_NUMBER_LIKE_TAGS = frozenset({STR, FLOAT, TIMESTAMP})


# --- YAML composition ---------------------------------------------------------------
#
# The document is composed into light nodes (`Scalar`, `Seq`, `Map`: slotted, no
# Mark objects; about 130 B a node where PyYAML's take 350) and every bound is checked
# as each node is made, so a hostile file is refused after at most the bound's worth
# of work, never after composing all of it.


class Scalar:
    """A scalar node: its resolved tag, its text, where it starts (1-based) and whether
    it was written plain (not quoted, not a block scalar)."""

    __slots__ = ("column", "line", "plain", "tag", "value")

    def __init__(self, tag: str, value: str, line: int, column: int, plain: bool) -> None:
        self.tag = tag
        self.value = value
        self.line = line
        self.column = column
        self.plain = plain


class Seq:
    """A list node: `value` is the list of its item nodes."""

    __slots__ = ("column", "line", "tag", "value")

    def __init__(self, tag: str, value: list[Node], line: int, column: int) -> None:
        self.tag = tag
        self.value = value
        self.line = line
        self.column = column


class Map:
    """A mapping node: `value` is the list of its (key node, value node) pairs, in order."""

    __slots__ = ("column", "line", "tag", "value")

    def __init__(self, tag: str, value: list[tuple[Node, Node]], line: int, column: int) -> None:
        self.tag = tag
        self.value = value
        self.line = line
        self.column = column


Node = Scalar | Seq | Map

_ALLOWED_TAGS: dict[type, frozenset[str]] = {
    Scalar: frozenset({STR, INT, BOOL, FLOAT, NULL, TIMESTAMP}),
    Seq: frozenset({SEQ}),
    Map: frozenset({MAP}),
}

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


class Composer:
    """Composes the single document of `text` into light nodes, bounding as it goes:
    - at most `MAX_NODE_VISITS` nodes, an alias counting as the size of the node it
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

    def __init__(self, text: str, max_tokens: int, shape: Shape) -> None:
        self.events = _Events(text)
        self.shape = shape
        self.routes = shape.routes
        self.map_contexts = frozenset(c for c, _ in shape.routes)
        self.get = self.events.get_event
        self.max_tokens = max_tokens
        self.node_limit = MAX_NODE_VISITS
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
            " (the bound on a trace's size)",
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
        if self.depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels", ev.start_mark,
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
                if hit is None:
                    if value.isdigit() and value.isascii() and (value[0] != "0" or value == "0"):
                        tag = INT  # what the resolver says of plain decimal, sooner
                    else:
                        tag = _RESOLVER.resolve(yaml.nodes.ScalarNode, value, implicit)
                    if len(value) <= 16 and len(self.memo) < 4096:
                        self.memo[value] = (value, tag)
                else:
                    value, tag = hit  # the same string object: less memory
            else:
                tag = _RESOLVER.resolve(yaml.nodes.ScalarNode, value, implicit)
        m = ev.start_mark
        if m.line != self.line0:  # the nodes of a line share one int object
            self.line0, self.line = m.line, m.line + 1
        node = Scalar(tag, value, self.line, m.column + 1, not ev.style)
        if ev.anchor is not None:
            self.open_anchor(ev, node, context).size = 1
        return node

    def alias(self, ev: Any, context: int) -> Node:
        name = ev.anchor
        a = self.anchors.get(name)
        if a is None:
            raise yaml.composer.ComposerError(
                None, None, f"found undefined alias {quote(name)}", ev.start_mark,
            )
        if a.size is None:
            raise self.refuse(
                ev, f"a recursive alias: *{clip(name)} is used inside the node"
                f" it names (anchored at line {a.line}, column {a.column})",
            )
        self.nodes += a.size
        if self.nodes > self.node_limit:
            raise self.refuse(
                ev, f"more than {self.node_limit:,} YAML nodes once aliases are expanded:"
                f" refusing the trace (the alias *{clip(name)} here stands for"
                f" {a.size:,} nodes: an alias bomb?)",
            )
        if a.tokens and a.context == context:
            self.count_token(ev, a.tokens, context in (C_TOKENS, C_UBATCHES))
        return a.node

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
        cap = MAX_OPS if context == C_OPS else MAX_ITEMS
        path = self.path
        path.append(0)
        at = len(path) - 1
        get, scalar, node_ = self.get, self.scalar, self.node
        while True:
            e = get()
            if e.__class__ is SequenceEndEvent:
                break
            n = len(items)
            path[at] = n
            if tokens:
                self.count_token(e)
            elif n >= cap:
                raise self.refuse(e, (
                    f"more than {MAX_OPS:,} ops in the trace: refusing it (the bound on its ops)"
                    if context == C_OPS else
                    f"a list of more than {MAX_ITEMS:,} items: refusing the trace"
                    " (no list of a trace but ops and a decode's tokens is that long)"
                ))
            items.append(scalar(e, item_context) if e.__class__ is ScalarEvent
                         else node_(e, item_context))
        path.pop()
        if anchor is not None:
            anchor.size, anchor.tokens = self.nodes - nodes0, self.tokens - tokens0
        return node

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
            if len(pairs) >= MAX_ITEMS:
                raise self.refuse(e, f"a mapping of more than {MAX_ITEMS:,} keys: refusing"
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


def plain_int(node: Scalar | None) -> int | None:
    if node is None or node.tag != INT or len(node.value) > MAX_INT_DIGITS:
        return None
    return int(node.value) if DECIMAL.fullmatch(node.value) else None


def compose(text: str, file: str, max_tokens: int, shape: Shape) -> Node | None:
    """The root node of the single document of `text` (None for an empty stream),
    bounded as `Composer` says. Raises `TraceError`, with one located problem, for
    invalid YAML, a bound crossed or a second document."""
    c = Composer(text, max_tokens, shape)
    try:
        return c.document()
    except yaml.YAMLError as e:
        raise TraceError([_yaml_problem(file, text, e)]) from None
    except _Refused as e:
        raise TraceError([Problem(file, e.line, e.column, e.field, e.message)]) from None
    except _MultipleDocuments as e:
        raise TraceError([Problem(
            file, e.mark.line + 1, e.mark.column + 1, "<document>",
            "a second YAML document: a trace file holds exactly one",
        )]) from None
    except RecursionError:
        raise TraceError([Problem(file, 0, 0, "<yaml>", "YAML nested too deeply")]) from None
    finally:
        c.events.dispose()


_YAML_BREAKS = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


def _line_col(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of `text[index]`, counting line breaks as YAML does."""
    line, start = 1, 0
    for m in _YAML_BREAKS.finditer(text, 0, index):
        line, start = line + 1, m.end()
    return line, index - start + 1


def _yaml_problem(file: str, text: str, e: yaml.YAMLError) -> Problem:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        msg = e.problem or "invalid YAML"
        if e.context:
            where = f" at line {e.context_mark.line + 1}" if e.context_mark else ""
            msg = f"{msg} ({e.context}{where})"
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        return Problem(file, line, col, "<yaml>", f"invalid YAML: {clip(msg, 300)}")
    if isinstance(e, yaml.reader.ReaderError) and isinstance(e.character, int):
        line, col = _line_col(text, e.position)
        return Problem(
            file, line, col, "<yaml>",
            f"invalid YAML: character U+{e.character:04X} is not allowed ({e.reason})",
        )
    return Problem(file, 0, 0, "<yaml>", f"invalid YAML: {clip(str(e), 300)}")


# --- reading the nodes ---------------------------------------------------------------

class Stop(Exception):
    """Too many problems: stop walking."""


def clip(text: str, n: int = 40) -> str:
    """`text`, cut to `n` characters: a problem never echoes a whole scalar."""
    return text if len(text) <= n else text[: n - 3] + "..."


def quote(text: str) -> str:
    return repr(clip(text))


def _short_tag(tag: str) -> str:
    return clip("!!" + tag[len(_Y):] if tag.startswith(_Y) else tag)


def describe(node: Node) -> str:
    if isinstance(node, Seq):
        return "a list"
    if isinstance(node, Map):
        return "a mapping"
    name = _TYPE_NAMES.get(node.tag, f"a {_short_tag(node.tag)} scalar")
    if node.tag == NULL:
        return name
    return f"{name} ({quote(node.value)})"


def _bounds(lo: int | None, hi: int | None) -> str:
    if lo is None and hi is None:
        return ""
    lo_s = "" if lo is None else f"{lo} <= "
    hi_s = "" if hi is None else f" <= {hi}"
    return f" (must be {lo_s}value{hi_s})"


_BASES = {"x": (16, "hexadecimal"), "o": (8, "octal"), "b": (2, "binary")}
_BASE_DIGITS = {16: "0123456789abcdef", 8: "01234567", 2: "01"}


def not_decimal(text: str) -> str:
    """Why `text`, written like a number, is not an int of a trace (ints are plain
    decimal), and what to write instead. The value YAML 1.1 (or the writer) meant is
    only worked out for a short text."""
    sign = "-" if text.startswith("-") else ""
    body = text[1:] if text[:1] in ("-", "+") else text
    low = body.lower()
    short = len(text) <= 40
    instead: str | None = None
    if low[:2] in ("0x", "0o", "0b"):
        base, why = _BASES[low[1]]
        digits = body[2:].replace("_", "")
        if short and digits and all(c in _BASE_DIGITS[base] for c in digits.lower()):
            instead = f"{sign}{int(digits, base)}"
    elif ":" in body:
        why = "YAML 1.1 reads a:b:c in base 60"
        parts = body.replace("_", "").split(":")
        if short and all(p.isascii() and p.isdigit() for p in parts):
            v = 0
            for p in parts:
                v = v * 60 + int(p)
            why += f", as {sign}{v}"
            instead = f"{sign}{v}"
    elif "." in body or "e" in low:
        why = "not a whole number"
        try:
            f = float(text.replace("_", "")) if short else None
        except ValueError:
            f = None
        if f is not None and f.is_integer():
            why, instead = "written as a float", str(int(f))
        elif f is None:
            why = "not an int"
    elif body[:1] == "0" and len(body) > 1 and body.replace("_", "").isdigit():
        digits = body.replace("_", "")
        why = "a leading zero"
        octal = None
        if all(c in "01234567_" for c in body):
            octal = f"{sign}{int(digits, 8)}" if short else None
            why += " (YAML 1.1 reads it as octal" + (f": {octal})" if octal else ")")
        if short:
            instead = f"{sign}{int(digits)}"
            if octal is not None:
                instead += f" (or {octal}, if octal was meant)"
    elif "_" in body:
        why = "digit separators '_'"
        digits = body.replace("_", "")
        if short and digits.isascii() and digits.isdigit():
            instead = f"{sign}{int(digits)}"
    elif text.startswith("+"):
        why = "a '+' sign"
        if short and DECIMAL.fullmatch(body):
            instead = body
    else:
        why = "not an int"
    tail = f"; write {instead}" if instead is not None else ""
    return (
        f"expected a plain decimal int (-?[0-9]+, no leading zero), got {quote(text)}:"
        f" {why}{tail}"
    )


def suggest(word: str, known: Iterable[str]) -> str:
    if len(word) > 100:
        return ""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


Parse = Callable[[Node, str], Any]


class NodeReader:
    """Reads composed nodes as typed values, collecting located problems (at most
    `MAX_PROBLEMS`: one more raises `Stop`) and counting the nodes it visits, aliases
    expanded (past `MAX_NODE_VISITS`, a fatal problem)."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []
        self.truncated = False
        self.visits = 0

    # -- reporting

    def problem(self, node: Node, field: str, message: str) -> None:
        if len(self.problems) >= MAX_PROBLEMS:
            self.truncated = True
            raise Stop
        self.problems.append(
            Problem(self.file, node.line, node.column, field or "<document>", message)
        )

    def fatal(self, node: Node, field: str, message: str) -> None:
        self.problem(node, field, message)
        raise Stop

    # -- generic nodes

    def visit(self, node: Node, field: str) -> bool:
        """Count the node; False (with a problem) if its tag is not a plain one."""
        self.visits += 1
        if self.visits > MAX_NODE_VISITS:
            self.fatal(
                node, field,
                f"more than {MAX_NODE_VISITS:,} YAML nodes visited (aliases expanded):"
                " refusing the trace (an alias bomb?)",
            )
        if node.tag in _ALLOWED_TAGS[type(node)]:
            return True
        if node.tag == MERGE:
            self.problem(node, field, "merge keys (<<) are not supported in a trace")
        else:
            self.problem(
                node, field,
                f"tag {_short_tag(node.tag)} is not allowed: a trace holds only plain YAML"
                " scalars, lists and mappings",
            )
        return False

    def typed(self, node: Node, field: str, tag: str, expected: str) -> Scalar | None:
        if not self.visit(node, field):
            return None
        if isinstance(node, Scalar) and node.tag == tag:
            return node
        hint = ""
        if tag == INT and node.tag == BOOL:
            hint = " (YAML true/false is a bool, not an int)"
        elif tag == STR and isinstance(node, Scalar):
            hint = " (quote it to make it a string)"
        self.problem(node, field, f"expected {expected}, got {describe(node)}{hint}")
        return None

    def int_(
        self, node: Node, field: str, lo: int | None = None, hi: int | None = None,
        hint: str = "",
    ) -> int | None:
        """An int in plain decimal (`DECIMAL`); any other way of writing a number
        (YAML 1.1's `010`, `0x1F`, `1:20`, ..., or a string such as `0o17`) is a
        problem saying what to write instead."""
        if not self.visit(node, field):
            return None
        if not isinstance(node, Scalar) or not (
            node.tag == INT
            or (node.plain and node.tag in _NUMBER_LIKE_TAGS and NUMBER_LIKE.match(node.value))
        ):
            why = " (YAML true/false is a bool, not an int)" if node.tag == BOOL else ""
            self.problem(node, field, f"expected an int, got {describe(node)}{why}")
            return None
        text = node.value
        if not DECIMAL.fullmatch(text):
            self.problem(node, field, not_decimal(text))
            return None
        digits = len(text) - text.startswith("-")
        if digits > MAX_INT_DIGITS:
            self.problem(
                node, field, f"out of range: an integer of {digits} digits{_bounds(lo, hi)}{hint}"
            )
            return None
        v = int(text)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            self.problem(node, field, f"out of range: {v}{_bounds(lo, hi)}{hint}")
            return None
        return v

    def bool_(self, node: Node, field: str) -> bool | None:
        scalar = self.typed(node, field, BOOL, "a bool (true or false)")
        if scalar is None:
            return None
        v = BOOLS.get(scalar.value.lower())
        if v is None:  # an explicit !!bool tag on some other text
            self.problem(node, field, f"not a valid bool: {quote(scalar.value)}")
        return v

    def str_(self, node: Node, field: str, *, nonempty: bool = False) -> str | None:
        scalar = self.typed(node, field, STR, "a string")
        if scalar is None:
            return None
        if nonempty and not scalar.value:
            self.problem(node, field, "must not be empty")
            return None
        return scalar.value

    def list_(self, node: Node, field: str, what: str = "a list") -> list[Node] | None:
        if not self.visit(node, field):
            return None
        if not isinstance(node, Seq):
            self.problem(node, field, f"expected {what}, got {describe(node)}")
            return None
        return list(node.value)

    def map_(
        self, node: Node, field: str, known: Sequence[str], required: Sequence[str] = (),
        *, null_ok: bool = False,
    ) -> dict[str, Node] | None:
        """The mapping's values by key. Unknown, duplicate and non-string keys and
        missing required keys are reported; the known keys found are still returned."""
        if not self.visit(node, field):
            return None
        if null_ok and isinstance(node, Scalar) and node.tag == NULL:
            return {}
        if not isinstance(node, Map):
            self.problem(node, field, f"expected a mapping, got {describe(node)}")
            return None
        out: dict[str, Node] = {}
        key_at: dict[str, Node] = {}
        for k, v in node.value:
            if not self.visit(k, field):
                continue
            if not (isinstance(k, Scalar) and k.tag == STR):
                self.problem(k, field, f"keys must be strings, got {describe(k)}")
                continue
            name = k.value
            if name not in known:
                self.problem(
                    k, join(field, clip(name)),
                    f"unknown key {quote(name)}{suggest(name, known)}",
                )
            elif name in out:
                first = key_at[name]
                self.problem(
                    k, join(field, name),
                    f"duplicate key {name!r} (first at line {first.line}, column {first.column})",
                )
            else:
                out[name] = v
                key_at[name] = k
        for name in required:
            if name not in out:
                self.problem(node, join(field, name), "required key missing")
        return out

    def fields(
        self, node: Node, field: str, spec: dict[str, tuple[bool, Parse]], *,
        null_ok: bool = False,
    ) -> dict[str, Any] | None:
        """Parse a mapping of scalar-ish fields: `spec` maps each key to (required,
        parser). None if anything about it was wrong (a problem was reported)."""
        before = len(self.problems)
        m = self.map_(node, field, tuple(spec), [k for k, (req, _) in spec.items() if req],
                      null_ok=null_ok)
        if m is None:
            return None
        out = {k: spec[k][1](v, join(field, k)) for k, v in m.items()}
        return out if len(self.problems) == before else None

    # -- the trace

