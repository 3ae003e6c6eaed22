"""Read a trace file (TRACE_FORMAT.md, "Trace", format v1) into `trace.model.Trace`.

Owns: `load_trace`, `load_trace_text`, `TraceError`, `Problem`, and the static limits
of the format (`POS_LIMIT`, `KV_SIZE_MAX`, ...), which `trace.schema` reuses.

How and why:
- The YAML is *composed*, never constructed: libyaml's parser (PyYAML's own when it
  is built without libyaml) feeds this module's composer, which turns the events
  into light nodes (`_Scalar`, `_Seq`, `_Map`: slotted, no Mark objects, tags from
  PyYAML's safe resolver), and this module walks the nodes itself, field by field.
  So no Python object is ever built from a tag: only the standard scalar, list and
  mapping tags are accepted (`!!python/...`, `!custom`, `!!set`, merge keys `<<`
  are errors), and every problem carries the node's start (1-based line and
  column) and a dotted field path such as `ops[3].decode.tokens[1].pos`.
- Bounds, checked *before* the work they bound ("refuse before spending"): at most
  `MAX_BYTES` of text, read no further. The composer counts while it composes and
  stops at the first bound crossed, naming the node there (line, column, field):
  `MAX_NODE_VISITS` nodes, an alias counting as the size of the node it names (so
  an alias bomb stops at the alias that crosses; an alias to a node still being
  composed is a recursive alias); `MAX_DEPTH` levels; `MAX_OPS` ops; `MAX_ITEMS`
  items in any other list or mapping but a token list; tokens (the items of a
  decode's `pos`, `tokens` and `ubatches[i]` lists): `max_tokens` in the trace
  (default `MAX_TOKENS`; the CLI's `--max-tokens`) and, once the cache block has
  been read, `kv_size * n_stream` in one decode. The walk then checks each bound
  exactly (it also counts the nodes it visits, aliases expanded), and checks a
  `pos` range `A..B` arithmetically before building it, against the tokens left
  and against the cache: a decode with more tokens than its stream has cells
  (`kv_size`) could never be placed by llama_decode, so it is refused at load
  rather than replayed into a KP006 rejection.
- Ints are plain decimal, `-?[0-9]+` with no leading zero: YAML 1.1's other int
  forms (`010` octal, `0x1F`, `0b101`, `1_000`, `+5`, `1:20` in base 60) and
  number-like strings (`0o17`, `1e3`) are refused with what to write instead, also
  in a range `A..B`; an int of more than `MAX_INT_DIGITS` digits is refused by its
  size, never parsed. A problem quotes at most 40 characters of a scalar.
- Strict (TRACE_FORMAT.md: "Unknown keys are errors"): unknown keys (with the
  closest known key suggested), duplicate keys, wrong types (YAML `true` is not
  the int 1; an int is not a bool; `"5"` is not an int), out-of-range values.
- Every problem found is reported (up to `MAX_PROBLEMS`), not just the first.

Invariants of a returned `Trace`: those listed in `trace.model`'s docstring, plus
- at most `MAX_OPS` ops and `max_tokens` tokens; a decode has at most `kv_size`
  tokens per stream (stream 0 when unified, else each token's first seq id);
- every seq id is in `[0, n_seq_max)`, or -1 where the op allows it (seq_rm,
  state_drop);
- every position and `ext` coordinate is in `[0, POS_LIMIT)`, so
  `pos + n_ubatch` fits an int32 (llama_pos);
- `ext` appears only when `cache.by_order` is true; within a decode either every
  token has a `cell` (stream-local, `< kv_size`) or none has, and no two tokens
  of the decode name the same cell of the same stream;
- an explicit `ubatches` split has non-empty ubatches of at most `n_ubatch` tokens;
- every `state_read` names a slot written by an earlier `state_write`;
- every `expect` follows some op other than `note`/`expect`.
"""

from __future__ import annotations

import dataclasses
import difflib
import gc
import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
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

from kpool_cli.engine.versions import VERSIONS
from kpool_cli.trace.model import (
    FORMAT_VERSION,
    OP_STATUSES,
    OP_TYPES,
    CacheConfig,
    Clear,
    Decode,
    Expect,
    Loc,
    Note,
    Op,
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
from kpool_cli.wording import visible

__all__ = [
    "KV_SIZE_MAX",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_ITEMS",
    "MAX_NODE_VISITS",
    "MAX_OPS",
    "MAX_PROBLEMS",
    "MAX_TOKENS",
    "N_EMBD_MAX",
    "N_RS_SEQ_MAX",
    "N_SEQ_MAX_MAX",
    "N_UBATCH_MAX",
    "POS_LIMIT",
    "Problem",
    "TraceError",
    "load_trace",
    "load_trace_text",
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

KV_SIZE_MAX = 2**24
N_SEQ_MAX_MAX = 256  # TRACE_FORMAT.md: n_seq_max "at most 256"
N_UBATCH_MAX = 2**20
N_EMBD_MAX = 4096
N_RS_SEQ_MAX = 1024  # rollback snapshots per sequence (an MTP draft depth: a few)
POS_LIMIT = 2**31 - 2**20  # positions are < POS_LIMIT, so pos + n_ubatch fits an int32
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
SEED_MAX = 2**64 - 1
COUNT_MAX = 2**31 - 1  # expect.n_new / n_new_g / ubatch

FINDING_CODE = re.compile(r"KP[0-9]{3}", re.ASCII)
POS_RANGE = re.compile(r"\s*([^\s.]+)\s*\.\.\s*([^\s.]+)\s*")  # ends: see _DECIMAL
_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)", re.ASCII)  # the only int syntax
_NUMBER_LIKE = re.compile(r"[-+]?\.?[0-9]", re.ASCII)  # written as a number of some kind

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
        return f"{self.file}:{self.line}:{self.column}: {self.field}: {self.message}"


class TraceError(Exception):
    """A trace that cannot be loaded; `problems` lists why (at most `MAX_PROBLEMS`,
    `truncated` says whether more were left unreported)."""

    def __init__(self, problems: Sequence[Problem], truncated: bool = False) -> None:
        super().__init__(list(problems), truncated)
        self.problems: list[Problem] = list(problems)
        self.truncated = truncated

    def __str__(self) -> str:
        """One line per problem, each made visible (a path or a quoted value cannot
        break a line or carry an escape sequence): the Problems keep the raw text."""
        lines = [visible(str(p)) for p in self.problems]
        if self.truncated:
            lines.append(f"(stopped after {len(self.problems)} problems)")
        return "\n".join(lines)


# --- entry points -------------------------------------------------------------------


def load_trace(path: str | Path, *, max_tokens: int = MAX_TOKENS) -> Trace:
    """Read and validate the trace at `path`, of at most `max_tokens` tokens (>= 1).
    Raises `TraceError`, never anything else for a bad file (missing, a directory,
    not UTF-8, too large, invalid)."""
    _check_max_tokens(max_tokens)
    file = str(path)
    if not file:
        raise TraceError([Problem("''", 0, 0, "<file>", "the trace path is empty")])
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        problem = Problem(file, 0, 0, "<file>", f"cannot read the trace: {reason}")
        raise TraceError([problem]) from None
    if len(data) > MAX_BYTES:
        raise TraceError([_too_big(file)])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(
            [Problem(file, 0, 0, "<file>", f"not UTF-8 text: {e.reason} at byte {e.start}")]
        ) from None
    return _load(text, file, hashlib.sha256(data).hexdigest(), max_tokens)


def load_trace_text(
    text: str, path: str = "<string>", *, max_tokens: int = MAX_TOKENS
) -> Trace:
    """Validate a trace given as text; `path` only names it in problems and in
    `Trace.path`. `Trace.sha256` is the hash of the text encoded as UTF-8."""
    _check_max_tokens(max_tokens)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates
        raise TraceError(
            [Problem(path, 0, 0, "<file>", f"not encodable as UTF-8: {e.reason}")]
        ) from None
    if len(data) > MAX_BYTES:
        raise TraceError([_too_big(path)])
    return _load(text, path, hashlib.sha256(data).hexdigest(), max_tokens)


def _check_max_tokens(max_tokens: int) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")


def _too_big(file: str) -> Problem:
    return Problem(file, 0, 0, "<file>", f"the trace is larger than {MAX_BYTES >> 20} MiB")


# --- YAML composition ---------------------------------------------------------------
#
# The document is composed into light nodes (`_Scalar`, `_Seq`, `_Map`: slotted, no
# Mark objects; about 130 B a node where PyYAML's take 350) and every bound is checked
# as each node is made, so a hostile file is refused after at most the bound's worth
# of work, never after composing all of it.


class _Scalar:
    """A scalar node: its resolved tag, its text, where it starts (1-based) and whether
    it was written plain (not quoted, not a block scalar)."""

    __slots__ = ("column", "line", "plain", "tag", "value")

    def __init__(self, tag: str, value: str, line: int, column: int, plain: bool) -> None:
        self.tag = tag
        self.value = value
        self.line = line
        self.column = column
        self.plain = plain


class _Seq:
    """A list node: `value` is the list of its item nodes."""

    __slots__ = ("column", "line", "tag", "value")

    def __init__(self, tag: str, value: list[Node], line: int, column: int) -> None:
        self.tag = tag
        self.value = value
        self.line = line
        self.column = column


class _Map:
    """A mapping node: `value` is the list of its (key node, value node) pairs, in order."""

    __slots__ = ("column", "line", "tag", "value")

    def __init__(self, tag: str, value: list[tuple[Node, Node]], line: int, column: int) -> None:
        self.tag = tag
        self.value = value
        self.line = line
        self.column = column


Node = _Scalar | _Seq | _Map

if yaml.__with_libyaml__:
    # libyaml's scanner and parser (about 10x faster than PyYAML's pure-Python ones)
    _Events: Any = yaml.cyaml.CParser
else:  # pragma: no cover - PyYAML built without libyaml
    _Events = yaml.SafeLoader  # its parser part: get_event, peek_event, check_event

# PyYAML's safe resolver decides the tags, as yaml.safe_load would (it has no path
# resolvers, so a scalar's tag depends only on its text and style)
_RESOLVER = yaml.resolver.Resolver()
_SEQ_TAG = _RESOLVER.DEFAULT_SEQUENCE_TAG
_MAP_TAG = _RESOLVER.DEFAULT_MAPPING_TAG

# Where a node sits, as far as the counts care: the ops list, an op item, a decode,
# a list whose items are tokens (a decode's pos list, tokens list, or one of its
# ubatches), a decode's ubatches list, the cache block, or anywhere else.
_C_OTHER, _C_ROOT, _C_CACHE, _C_OPS, _C_OP, _C_DECODE, _C_TOKENS, _C_UBATCHES = range(8)
_VALUE_CONTEXT = {  # (mapping's context, key) -> the value's context
    (_C_ROOT, "ops"): _C_OPS,
    (_C_ROOT, "cache"): _C_CACHE,
    (_C_OP, "decode"): _C_DECODE,
    (_C_DECODE, "pos"): _C_TOKENS,
    (_C_DECODE, "tokens"): _C_TOKENS,
    (_C_DECODE, "ubatches"): _C_UBATCHES,
}
_MAP_CONTEXTS = frozenset(c for c, _ in _VALUE_CONTEXT)
_ITEM_CONTEXT = {_C_OPS: _C_OP, _C_UBATCHES: _C_TOKENS}  # list's context -> its items'


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


class _Composer:
    """Composes the single document of `text` into light nodes, bounding as it goes:
    - at most `MAX_NODE_VISITS` nodes, an alias counting as the size of the node it
      names (so the count is the size of the document with every alias expanded:
      what the walk may visit); an alias to a node still being composed is recursive;
    - at most `MAX_DEPTH` nested collections (the composition recurses per level);
    - at most `MAX_OPS` items in `ops`, `MAX_ITEMS` in any list or mapping other than
      `ops` and the token lists (no other collection of a valid trace comes close);
    - tokens, counted as the items of a decode's `pos`, `tokens` and `ubatches[i]`
      lists: at most `max_tokens` in the trace and, once the cache block has been
      read, at most `kv_size * n_stream` in one decode (llama_decode could never place
      more). `pos` ranges are left to the walk, which checks them before building them.
    The walk checks all of this again, exactly (a count here never exceeds the walk's
    on a valid trace: an alias's tokens are counted only where it stands in the same
    context as the node it names)."""

    def __init__(self, text: str, max_tokens: int) -> None:
        self.events = _Events(text)
        self.get = self.events.get_event
        self.max_tokens = max_tokens
        self.node_limit = MAX_NODE_VISITS
        self.anchors: dict[str, _Anchor] = {}
        self.nodes = 0  # composed so far, aliases expanded
        self.tokens = 0  # in token lists so far, aliases expanded
        self.decode_tokens = 0  # in the current decode
        self.decode_cap: int | None = None  # kv_size * n_stream, once the cache is read
        self.cache: dict[str, _Scalar] = {}
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
            root = self.node(self.get(), _C_ROOT)
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
            out = f"{out}[{part}]" if isinstance(part, int) else _join(out, _clip(part))
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
                raise self.refuse(ev, _unplaceable_list(cap))
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

    def scalar(self, ev: Any, context: int) -> _Scalar:
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
        node = _Scalar(tag, value, self.line, m.column + 1, not ev.style)
        if ev.anchor is not None:
            self.open_anchor(ev, node, context).size = 1
        return node

    def alias(self, ev: Any, context: int) -> Node:
        name = ev.anchor
        a = self.anchors.get(name)
        if a is None:
            raise yaml.composer.ComposerError(
                None, None, f"found undefined alias {_quote(name)}", ev.start_mark,
            )
        if a.size is None:
            raise self.refuse(
                ev, f"a recursive alias: *{_clip(name)} is used inside the node"
                f" it names (anchored at line {a.line}, column {a.column})",
            )
        self.nodes += a.size
        if self.nodes > self.node_limit:
            raise self.refuse(
                ev, f"more than {self.node_limit:,} YAML nodes once aliases are expanded:"
                f" refusing the trace (the alias *{_clip(name)} here stands for"
                f" {a.size:,} nodes: an alias bomb?)",
            )
        if a.tokens and a.context == context:
            self.count_token(ev, a.tokens, context in (_C_TOKENS, _C_UBATCHES))
        return a.node

    def open_anchor(self, ev: Any, node: Node, context: int) -> _Anchor:
        name = ev.anchor
        first = self.anchors.get(name)
        if first is not None:
            raise yaml.composer.ComposerError(
                f"found duplicate anchor {_quote(name)}; first occurrence",
                yaml.Mark("<trace>", 0, first.line - 1, first.column - 1, None, None),
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

    def sequence(self, ev: Any, context: int) -> _Seq:
        nodes0, tokens0 = self.nodes, self.tokens
        tag = self.collection_start(ev, _SEQ_TAG)
        items: list[Node] = []
        node = _Seq(tag, items, self.line, ev.start_mark.column + 1)
        anchor = None if ev.anchor is None else self.open_anchor(ev, node, context)
        item_context = _ITEM_CONTEXT.get(context, _C_OTHER)
        tokens = context == _C_TOKENS
        cap = MAX_OPS if context == _C_OPS else MAX_ITEMS
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
                    if context == _C_OPS else
                    f"a list of more than {MAX_ITEMS:,} items: refusing the trace"
                    " (no list of a trace but ops and a decode's tokens is that long)"
                ))
            items.append(scalar(e, item_context) if e.__class__ is ScalarEvent
                         else node_(e, item_context))
        path.pop()
        if anchor is not None:
            anchor.size, anchor.tokens = self.nodes - nodes0, self.tokens - tokens0
        return node

    def mapping(self, ev: Any, context: int) -> _Map:
        nodes0, tokens0 = self.nodes, self.tokens
        tag = self.collection_start(ev, _MAP_TAG)
        pairs: list[tuple[Node, Node]] = []
        node = _Map(tag, pairs, self.line, ev.start_mark.column + 1)
        anchor = None if ev.anchor is None else self.open_anchor(ev, node, context)
        if context == _C_DECODE:
            self.decode_tokens = 0
        keyed = context in _MAP_CONTEXTS
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
            k = scalar(e, _C_OTHER) if e.__class__ is ScalarEvent else node_(e, _C_OTHER)
            key = k.value if k.__class__ is _Scalar and k.tag == STR else "?"
            path[at] = key
            sub = _VALUE_CONTEXT.get((context, key), _C_OTHER) if keyed else _C_OTHER
            e = get()
            v = scalar(e, sub) if e.__class__ is ScalarEvent else node_(e, sub)
            pairs.append((k, v))
            if context == _C_CACHE and isinstance(v, _Scalar):
                self.cache[key] = v
        path.pop()
        if context == _C_CACHE:
            self.decode_cap = _decode_cap(self.cache)
        if anchor is not None:
            anchor.size, anchor.tokens = self.nodes - nodes0, self.tokens - tokens0
        return node


def _decode_cap(cache: dict[str, _Scalar]) -> int | None:
    """`kv_size * n_stream` from the cache block's scalars, if they are valid."""
    kv = _plain_int(cache.get("kv_size"))
    n_seq = _plain_int(cache["n_seq_max"]) if "n_seq_max" in cache else 1
    unified: bool | None = True
    if "unified" in cache:
        u = cache["unified"]
        unified = _BOOLS.get(u.value.lower()) if u.tag == BOOL else None
    if kv is None or n_seq is None or unified is None:
        return None
    if not (1 <= kv <= KV_SIZE_MAX and 1 <= n_seq <= N_SEQ_MAX_MAX):
        return None
    return kv * (1 if unified else n_seq)


def _plain_int(node: _Scalar | None) -> int | None:
    if node is None or node.tag != INT or len(node.value) > MAX_INT_DIGITS:
        return None
    return int(node.value) if _DECIMAL.fullmatch(node.value) else None


def _unplaceable_list(cap: int) -> str:
    return (
        f"a decode of more than {cap:,} tokens, but the cache has kv_size * n_stream ="
        f" {cap:,} cells: llama_decode could never place it (each token takes a cell, and"
        " a decode is placed whole before anything applies)"
    )


def _compose(text: str, max_tokens: int) -> Node | None:
    c = _Composer(text, max_tokens)
    try:
        return c.document()
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
        return Problem(file, line, col, "<yaml>", f"invalid YAML: {_clip(msg, 300)}")
    if isinstance(e, yaml.reader.ReaderError) and isinstance(e.character, int):
        line, col = _line_col(text, e.position)
        return Problem(
            file, line, col, "<yaml>",
            f"invalid YAML: character U+{e.character:04X} is not allowed ({e.reason})",
        )
    return Problem(file, 0, 0, "<yaml>", f"invalid YAML: {_clip(str(e), 300)}")


def _load(text: str, file: str, sha256: str, max_tokens: int) -> Trace:
    # The node graph and the trace are acyclic (a recursive alias is refused): the
    # cyclic collector would only rescan the young nodes over and over (about 60% of
    # the time of a 130k-token trace), so it is paused while loading.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        return _load_nodes(text, file, sha256, max_tokens)
    finally:
        if gc_was_on:
            gc.enable()


def _load_nodes(text: str, file: str, sha256: str, max_tokens: int) -> Trace:
    try:
        root = _compose(text, max_tokens)
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
    if root is None:
        raise TraceError([Problem(
            file, 1, 1, "<document>",
            "empty document: a trace is a mapping with kpool_trace, cache and ops",
        )])
    w = _Walker(file, max_tokens)
    try:
        trace = w.trace(root, sha256)
    except _Stop:
        trace = None
    if w.problems or trace is None:
        problems = sorted(w.problems, key=lambda p: (p.line, p.column))
        raise TraceError(problems, w.truncated)
    return trace


# --- the walk -----------------------------------------------------------------------

_Y = "tag:yaml.org,2002:"
STR, INT, BOOL, FLOAT, NULL, TIMESTAMP = (
    _Y + "str", _Y + "int", _Y + "bool", _Y + "float", _Y + "null", _Y + "timestamp"
)
SEQ, MAP, MERGE = _Y + "seq", _Y + "map", _Y + "merge"
_ALLOWED_TAGS: dict[type, frozenset[str]] = {
    _Scalar: frozenset({STR, INT, BOOL, FLOAT, NULL, TIMESTAMP}),
    _Seq: frozenset({SEQ}),
    _Map: frozenset({MAP}),
}
_TYPE_NAMES = {
    STR: "a string", INT: "an int", BOOL: "a bool", FLOAT: "a float", NULL: "null",
    TIMESTAMP: "a timestamp",
}
# SafeConstructor.bool_values: YAML 1.1's bools, by lowercased text
_BOOLS = {"yes": True, "no": False, "true": True, "false": False, "on": True, "off": False}
_NUMBER_LIKE_TAGS = frozenset({STR, FLOAT, TIMESTAMP})

TOP_KEYS = ("kpool_trace", "name", "description", "cache", "engine", "seed", "ops")
CACHE_KEYS = ("kv_size", "kpool", "n_seq_max", "unified", "by_order", "n_ubatch", "n_embd",
              "n_rs_seq")
TOKEN_KEYS = ("pos", "seq", "ext", "cell")
DECODE_KEYS = ("seq", "pos", "ext", "cell", "tokens", "ubatches")
EXPECT_KEYS = ("engine", "findings", "n_new", "n_new_g", "pools", "status", "ubatch")


_CACHE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(CacheConfig)}


class _Stop(Exception):
    """Too many problems: stop walking."""


def _clip(text: str, n: int = 40) -> str:
    """`text`, cut to `n` characters: a problem never echoes a whole scalar."""
    return text if len(text) <= n else text[: n - 3] + "..."


def _quote(text: str) -> str:
    return repr(_clip(text))


def _short_tag(tag: str) -> str:
    return _clip("!!" + tag[len(_Y):] if tag.startswith(_Y) else tag)


def _what(node: Node) -> str:
    if isinstance(node, _Seq):
        return "a list"
    if isinstance(node, _Map):
        return "a mapping"
    name = _TYPE_NAMES.get(node.tag, f"a {_short_tag(node.tag)} scalar")
    if node.tag == NULL:
        return name
    return f"{name} ({_quote(node.value)})"


def _bounds(lo: int | None, hi: int | None) -> str:
    if lo is None and hi is None:
        return ""
    lo_s = "" if lo is None else f"{lo} <= "
    hi_s = "" if hi is None else f" <= {hi}"
    return f" (must be {lo_s}value{hi_s})"


_BASES = {"x": (16, "hexadecimal"), "o": (8, "octal"), "b": (2, "binary")}
_BASE_DIGITS = {16: "0123456789abcdef", 8: "01234567", 2: "01"}


def _not_decimal(text: str) -> str:
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
        if short and _DECIMAL.fullmatch(body):
            instead = body
    else:
        why = "not an int"
    tail = f"; write {instead}" if instead is not None else ""
    return (
        f"expected a plain decimal int (-?[0-9]+, no leading zero), got {_quote(text)}:"
        f" {why}{tail}"
    )


def _suggest(word: str, known: Iterable[str]) -> str:
    if len(word) > 100:
        return ""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


@dataclass
class _Limits:
    """What the ops are checked against: the cache's values, None where the cache
    does not give a usable one (then only the static bound is checked)."""

    n_seq_max: int | None = None
    kv_size: int | None = None
    unified: bool | None = None
    by_order: bool | None = None
    n_ubatch: int | None = None


@dataclass
class _Tok:
    """A parsed explicit token and where its parts are, for the decode-wide checks."""

    token: Token | None
    field: str
    node: Node
    ext_node: Node | None
    cell_node: Node | None


Parse = Callable[[Node, str], Any]


class _Walker:
    def __init__(self, file: str, max_tokens: int = MAX_TOKENS) -> None:
        self.file = file
        self.problems: list[Problem] = []
        self.truncated = False
        self.visits = 0
        self.n_tokens = 0
        self.max_tokens = max_tokens
        self.lim = _Limits()
        self.slots: set[str] = set()

    # -- reporting

    def problem(self, node: Node, field: str, message: str) -> None:
        if len(self.problems) >= MAX_PROBLEMS:
            self.truncated = True
            raise _Stop
        self.problems.append(
            Problem(self.file, node.line, node.column, field or "<document>", message)
        )

    def fatal(self, node: Node, field: str, message: str) -> None:
        self.problem(node, field, message)
        raise _Stop

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

    def typed(self, node: Node, field: str, tag: str, expected: str) -> _Scalar | None:
        if not self.visit(node, field):
            return None
        if isinstance(node, _Scalar) and node.tag == tag:
            return node
        hint = ""
        if tag == INT and node.tag == BOOL:
            hint = " (YAML true/false is a bool, not an int)"
        elif tag == STR and isinstance(node, _Scalar):
            hint = " (quote it to make it a string)"
        self.problem(node, field, f"expected {expected}, got {_what(node)}{hint}")
        return None

    def int_(
        self, node: Node, field: str, lo: int | None = None, hi: int | None = None,
        hint: str = "",
    ) -> int | None:
        """An int in plain decimal (`_DECIMAL`); any other way of writing a number
        (YAML 1.1's `010`, `0x1F`, `1:20`, ..., or a string such as `0o17`) is a
        problem saying what to write instead."""
        if not self.visit(node, field):
            return None
        if not isinstance(node, _Scalar) or not (
            node.tag == INT
            or (node.plain and node.tag in _NUMBER_LIKE_TAGS and _NUMBER_LIKE.match(node.value))
        ):
            why = " (YAML true/false is a bool, not an int)" if node.tag == BOOL else ""
            self.problem(node, field, f"expected an int, got {_what(node)}{why}")
            return None
        text = node.value
        if not _DECIMAL.fullmatch(text):
            self.problem(node, field, _not_decimal(text))
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
        v = _BOOLS.get(scalar.value.lower())
        if v is None:  # an explicit !!bool tag on some other text
            self.problem(node, field, f"not a valid bool: {_quote(scalar.value)}")
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
        if not isinstance(node, _Seq):
            self.problem(node, field, f"expected {what}, got {_what(node)}")
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
        if null_ok and isinstance(node, _Scalar) and node.tag == NULL:
            return {}
        if not isinstance(node, _Map):
            self.problem(node, field, f"expected a mapping, got {_what(node)}")
            return None
        out: dict[str, Node] = {}
        key_at: dict[str, Node] = {}
        for k, v in node.value:
            if not self.visit(k, field):
                continue
            if not (isinstance(k, _Scalar) and k.tag == STR):
                self.problem(k, field, f"keys must be strings, got {_what(k)}")
                continue
            name = k.value
            if name not in known:
                self.problem(
                    k, _join(field, _clip(name)),
                    f"unknown key {_quote(name)}{_suggest(name, known)}",
                )
            elif name in out:
                first = key_at[name]
                self.problem(
                    k, _join(field, name),
                    f"duplicate key {name!r} (first at line {first.line}, column {first.column})",
                )
            else:
                out[name] = v
                key_at[name] = k
        for name in required:
            if name not in out:
                self.problem(node, _join(field, name), "required key missing")
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
        out = {k: spec[k][1](v, _join(field, k)) for k, v in m.items()}
        return out if len(self.problems) == before else None

    # -- the trace

    def trace(self, root: Node, sha256: str) -> Trace | None:
        if isinstance(root, _Map):  # the version first: a v2 trace gets one problem
            for k, v in root.value:
                if isinstance(k, _Scalar) and k.tag == STR and k.value == "kpool_trace":
                    self.version(v)
                    break
        top = self.map_(root, "", TOP_KEYS, ("kpool_trace", "cache", "ops"))
        if top is None:
            return None
        before = len(self.problems)
        cache = self.cache(top["cache"]) if "cache" in top else None
        name = self.str_(top["name"], "name") if "name" in top else ""
        description = self.str_(top["description"], "description") if "description" in top else ""
        engine = self.engine(top["engine"]) if "engine" in top else None
        seed = self.int_(top["seed"], "seed", 0, SEED_MAX) if "seed" in top else 0
        ops = self.ops(top["ops"]) if "ops" in top else None
        if len(self.problems) != before or cache is None or ops is None:
            return None
        assert name is not None and description is not None and seed is not None
        return Trace(
            cache=cache, ops=ops, name=name, description=description, engine=engine,
            seed=seed, path=self.file, sha256=sha256,
        )

    def engine(self, node: Node) -> str | None:
        """The trace's default engine: a registered version only. A trace is data and
        runs no code, so a plug-in (`module:Name`) is taken from `--engine` alone."""
        name = self.str_(node, "engine", nonempty=True)
        if name is None or name in VERSIONS:
            return name
        known = ", ".join(VERSIONS)
        how = ("a plug-in version (module:Name) is given with --engine only, never by a "
               "trace" if ":" in name else "a plug-in version is given with --engine")
        self.problem(node, "engine", f"{_quote(name)} is not a registered engine version "
                     f"(known: {known}); {how}")
        return None

    def version(self, node: Node) -> None:
        v = self.int_(node, "kpool_trace")
        if v is not None and v != FORMAT_VERSION:
            # Nothing else is checked: another version's fields would only add noise.
            self.fatal(
                node, "kpool_trace",
                f"unsupported format version {v}, this kpool reads {FORMAT_VERSION}",
            )

    def cache(self, node: Node) -> CacheConfig | None:
        """TRACE_FORMAT.md "Trace" (cache block) and ENGINE.md §2. Records the values
        that parse in `self.lim` even if the block as a whole is wrong, so that the
        ops are still checked against them."""
        f = "cache"
        before = len(self.problems)
        m = self.map_(node, f, CACHE_KEYS, ("kv_size", "kpool"))
        if m is None:
            return None
        kv = self.int_(m["kv_size"], "cache.kv_size", 1, KV_SIZE_MAX) if "kv_size" in m else None
        kpool = None
        if "kpool" in m:
            kpool = self.int_(m["kpool"], "cache.kpool", 1, KV_SIZE_MAX)
            if kpool is not None and kv is not None and kpool > kv:
                self.problem(
                    m["kpool"], "cache.kpool",
                    f"out of range: kpool {kpool} is larger than cache.kv_size ({kv})",
                )
                kpool = None
        vals: dict[str, Any] = {}
        for key, parse in (
            ("n_seq_max", lambda n, fl: self.int_(n, fl, 1, N_SEQ_MAX_MAX)),
            ("unified", self.bool_),
            ("by_order", self.bool_),
            ("n_ubatch", lambda n, fl: self.int_(n, fl, 1, N_UBATCH_MAX)),
            ("n_embd", lambda n, fl: self.int_(n, fl, 1, N_EMBD_MAX)),
            ("n_rs_seq", lambda n, fl: self.int_(n, fl, 0, N_RS_SEQ_MAX)),
        ):
            vals[key] = parse(m[key], f"cache.{key}") if key in m else _CACHE_DEFAULTS[key]
        self.lim = _Limits(
            n_seq_max=vals["n_seq_max"], kv_size=kv, unified=vals["unified"],
            by_order=vals["by_order"], n_ubatch=vals["n_ubatch"],
        )
        if len(self.problems) != before or kv is None or kpool is None:
            return None
        cfg = CacheConfig(kv_size=kv, kpool=kpool, **vals)
        return cfg

    def ops(self, node: Node) -> tuple[Op, ...] | None:
        items = self.list_(node, "ops")
        if items is None:
            return None
        if len(items) > MAX_OPS:  # an alias of a list, or the composer's bound lifted
            self.fatal(
                items[MAX_OPS], f"ops[{MAX_OPS}]",
                f"more than {MAX_OPS:,} ops in the trace: refusing it (the bound on its ops)",
            )
        before = len(self.problems)
        out: list[Op] = []
        after_op = False  # some op other than note/expect came before
        for i, item in enumerate(items):
            f = f"ops[{i}]"
            name, op = self.op(item, f)
            if name == "expect" and not after_op:
                self.problem(
                    item, f,
                    "expect has no op before it (it checks the previous op; notes do not count)",
                )
            elif name is not None and name not in ("note", "expect"):
                after_op = True
            if op is not None:
                out.append(op)
        return tuple(out) if len(self.problems) == before else None

    def op(self, item: Node, f: str) -> tuple[str | None, Op | None]:
        """One item of `ops`: a mapping with exactly one key, the op name. Returns the
        op name when it is a known one (even if the op is invalid) and the op."""
        if not self.visit(item, f):
            return None, None
        if not isinstance(item, _Map):
            self.problem(
                item, f,
                f"an op is a mapping with one key, the op name (`- seq_rm: {{seq: 0}}`),"
                f" got {_what(item)}",
            )
            return None, None
        if not item.value:
            self.problem(item, f, "empty op: expected one key, the op name")
            return None, None
        if len(item.value) > 1:
            names = ", ".join(
                _clip(k.value, 20) if isinstance(k, _Scalar) else _what(k)
                for k, _ in item.value[:4]
            ) + (", ..." if len(item.value) > 4 else "")
            self.problem(
                item.value[1][0], f,
                f"an op item has exactly one key, the op name; this one has {len(item.value)}"
                f" ({names}): a missing '-'?",
            )
            return None, None
        key, value = item.value[0]
        if not self.visit(key, f):
            return None, None
        if not (isinstance(key, _Scalar) and key.tag == STR):
            self.problem(key, f, f"expected an op name, got {_what(key)}")
            return None, None
        name = key.value
        if name not in OP_TYPES:
            self.problem(key, f, f"unknown op {_quote(name)}{_suggest(name, OP_TYPES)}")
            return None, None
        loc = Loc(self.file, item.line, item.column)
        build: Callable[[Node, str, Loc], Op | None] = getattr(self, f"op_{name}")
        return name, build(value, f"{f}.{name}", loc)

    # -- scalar parsers shared by the ops

    def seq_id(self, node: Node, field: str, *, allow_all: bool = False) -> int | None:
        """A seq id in `[0, n_seq_max)` (ENGINE.md §3), or -1 ("every sequence",
        ENGINE.md §2) when `allow_all`."""
        v = self.int_(node, field)
        if v is None:
            return None
        n = self.lim.n_seq_max
        hi = (n if n is not None else N_SEQ_MAX_MAX) - 1
        if (allow_all and v == -1) or 0 <= v <= hi:
            return v
        msg = f"seq id {v} is out of range: "
        msg += (f"cache.n_seq_max is {n}, so seq ids are 0..{hi}" if n is not None
                else f"seq ids are 0..{hi}")
        if allow_all:
            msg += ", or -1 for every sequence"
        elif v == -1:
            msg += " (-1, every sequence, is only for seq_rm and state_drop)"
        self.problem(node, field, msg)
        return None

    def seq_any(self, node: Node, field: str) -> int | None:
        return self.seq_id(node, field, allow_all=True)

    def seq_set(self, node: Node, field: str) -> tuple[int, ...] | None:
        """A token's sequence set: an int or a list of distinct ints, order kept."""
        if isinstance(node, _Scalar):
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
        return self.int_(node, field, 0, POS_LIMIT - 1, " (positions are below 2**31 - 2**20)")

    def positions(self, node: Node, field: str) -> Sequence[int] | None:
        """`pos` of the shorthand decode: an int, "A..B" (half-open, A < B) or a list.
        A range is returned unbuilt (a `range`): its length is checked first."""
        if isinstance(node, _Seq):
            items = self.list_(node, field)
            if items is None:
                return None
            ps = [self.pos(it, f"{field}[{i}]") for i, it in enumerate(items)]
            return None if None in ps else ps  # type: ignore[return-value]
        if isinstance(node, _Scalar) and node.tag == STR and ".." in node.value:
            if not self.visit(node, field):
                return None
            return self.pos_range(node, field)
        if (isinstance(node, _Scalar) and node.tag == STR
                and not (node.plain and _NUMBER_LIKE.match(node.value))):
            if self.visit(node, field):
                self.problem(
                    node, field,
                    f"expected a position, a range 'A..B' or a list of positions,"
                    f" got {_what(node)}",
                )
            return None
        v = self.pos(node, field)  # an int, or a number written some other way: int_ says
        return None if v is None else [v]

    def pos_range(self, node: _Scalar, field: str) -> range | None:
        """"A..B": both ends plain decimal (as every int), checked before any int()."""
        q = _quote(node.value)
        m = POS_RANGE.fullmatch(node.value)
        if m is None or not all(_NUMBER_LIKE.match(end) for end in m.groups()):
            self.problem(
                node, field,
                f"expected a position, a range 'A..B' or a list of positions, got {_what(node)}",
            )
            return None
        ends: list[int] = []
        for end in m.groups():
            if not _DECIMAL.fullmatch(end):
                self.problem(node, field, f"in the range {q}, {_not_decimal(end)}")
                return None
            digits = len(end) - end.startswith("-")
            if digits > MAX_INT_DIGITS:
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
        x, y = (self.int_(it, f"{field}[{i}]", 0, POS_LIMIT - 1) for i, it in enumerate(items))
        return None if x is None or y is None else (x, y)

    def cell(self, node: Node, field: str) -> int | None:
        kv = self.lim.kv_size
        hint = f" (cells are stream-local: below cache.kv_size, {kv})" if kv else ""
        return self.int_(node, field, 0, (kv or KV_SIZE_MAX) - 1, hint)

    def p_bound(self, node: Node, field: str) -> int | None:
        v = self.int_(node, field)
        if v is None:
            return None
        if not -1 <= v <= INT32_MAX:
            self.problem(node, field, f"out of range: {v} (a position >= 0, or -1 for no bound)")
            return None
        return v

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

    def fits_the_cache(self, n: int, seq0: int, node: Node, field: str) -> bool:
        """ENGINE.md §3: every token of a decode takes one cell of its stream (one cell
        for a token of several seq ids), all placed before anything applies. More
        tokens in a stream than its `kv_size` cells can never be placed, whatever the
        cache holds: a problem (at `node`) rather than a KP006 at every replay."""
        kv, unified = self.lim.kv_size, self.lim.unified
        if kv is None or unified is None or n <= kv:
            return True
        where = (
            f"the cache has kv_size = {kv:,} cells (unified: one stream)" if unified
            else f"stream {seq0} (sequence {seq0}'s own) has kv_size = {kv:,} cells"
        )
        self.problem(
            node, field,
            f"a decode of {n:,} tokens, but {where}: llama_decode could never place it"
            " (each token takes a cell, and a decode is placed whole before anything applies)",
        )
        return False

    # -- decode (TRACE_FORMAT.md "Trace"; ENGINE.md §3)

    def op_decode(self, node: Node, f: str, loc: Loc) -> Decode | None:
        before = len(self.problems)
        m = self.map_(node, f, DECODE_KEYS)
        if m is None:
            return None
        forms = [k for k in ("tokens", "ubatches") if k in m]
        short = [k for k in ("seq", "pos", "ext", "cell") if k in m]
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
                    f"a ubatch of {len(items)} tokens, more than cache.n_ubatch ({n_ubatch})",
                )
            start = len(toks)
            toks.extend(self.token(it, f"{f}[{j}][{i}]") for i, it in enumerate(items))
            split.append(tuple(range(start, len(toks))))
        return toks, tuple(split)

    def token(self, node: Node, f: str) -> _Tok:
        before = len(self.problems)
        self.count_tokens(1, node, f)
        m = self.map_(node, f, TOKEN_KEYS, ("pos", "seq"))
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

    def check_decode(self, toks: list[_Tok]) -> None:
        """The decode-wide rules on explicit tokens: ext needs by_order; all or no
        cells; no cell named twice in one stream (ENGINE.md §2: stream = 0 when
        unified, else the token's first seq id); no more tokens in a stream than it
        has cells (`fits_the_cache`, reported at the first token past them)."""
        kv, unified = self.lim.kv_size, self.lim.unified
        if kv is not None and unified is not None and len(toks) > kv:
            per: dict[int, list[_Tok]] = {}
            for t in toks:
                if t.token is not None:
                    per.setdefault(0 if unified else t.token.seq[0], []).append(t)
            for strm, ts in per.items():
                if len(ts) > kv:
                    self.fits_the_cache(len(ts), strm, ts[kv].node, ts[kv].field)
                    break
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
        for key in ("seq", "pos"):
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
        # both checks from the length alone: a range is built only once it passes
        if not self.fits_the_cache(len(ps), seq[0], m["pos"], f"{f}.pos"):
            return None
        self.count_tokens(len(ps), m["pos"], f"{f}.pos")
        return Decode(tokens=tuple(Token(p, seq, ext, cell) for p in ps), loc=loc)

    # -- the other ops (ENGINE.md §2 for what they do)

    def op_seq_rm(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {
            "seq": (True, self.seq_any), "p0": (False, self.p_bound), "p1": (False, self.p_bound),
        })
        return None if d is None else SeqRm(loc=loc, **d)

    def op_seq_cp(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {
            "src": (True, self.seq_id), "dst": (True, self.seq_id),
            "p0": (False, self.p_bound), "p1": (False, self.p_bound),
        })
        return None if d is None else SeqCp(loc=loc, **d)

    def op_seq_keep(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {"seq": (True, self.seq_id)})
        return None if d is None else SeqKeep(loc=loc, **d)

    def op_seq_add(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {
            "seq": (True, self.seq_id), "p0": (False, self.p_bound), "p1": (False, self.p_bound),
            "shift": (True, lambda n, fl: self.int_(n, fl, INT32_MIN, INT32_MAX)),
        })
        return None if d is None else SeqAdd(loc=loc, **d)

    def op_seq_div(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {
            "seq": (True, self.seq_id), "p0": (False, self.p_bound), "p1": (False, self.p_bound),
            "d": (True, lambda n, fl: self.int_(n, fl, 1, INT32_MAX)),
        })
        return None if d is None else SeqDiv(loc=loc, **d)

    def slot(self, node: Node, field: str) -> str | None:
        return self.str_(node, field, nonempty=True)

    def op_state_write(self, node: Node, f: str, loc: Loc) -> Op | None:
        before = len(self.problems)
        m = self.map_(node, f, ("seq", "slot"), ("seq", "slot"))
        if m is None:
            return None
        seq = self.seq_id(m["seq"], f"{f}.seq") if "seq" in m else None
        slot = self.slot(m["slot"], f"{f}.slot") if "slot" in m else None
        if slot is not None:  # written even if the op is otherwise wrong: no cascade
            self.slots.add(slot)
        if len(self.problems) != before or seq is None or slot is None:
            return None
        return StateWrite(seq=seq, slot=slot, loc=loc)

    def op_state_read(self, node: Node, f: str, loc: Loc) -> Op | None:
        before = len(self.problems)
        m = self.map_(node, f, ("seq", "slot"), ("seq", "slot"))
        if m is None:
            return None
        seq = self.seq_id(m["seq"], f"{f}.seq") if "seq" in m else None
        slot = self.slot(m["slot"], f"{f}.slot") if "slot" in m else None
        if slot is not None and slot not in self.slots:
            self.problem(
                m["slot"], f"{f}.slot",
                f"slot {_quote(slot)} is not written by an earlier state_write"
                f"{_suggest(slot, self.slots)}",
            )
        if len(self.problems) != before or seq is None or slot is None:
            return None
        return StateRead(seq=seq, slot=slot, loc=loc)

    def op_state_drop(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {"seq": (True, self.seq_any)})
        return None if d is None else StateDrop(loc=loc, **d)

    def op_clear(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {}, null_ok=True)
        return None if d is None else Clear(loc=loc)

    def op_note(self, node: Node, f: str, loc: Loc) -> Op | None:
        text = self.str_(node, f)
        return None if text is None else Note(text=text, loc=loc)

    def op_expect(self, node: Node, f: str, loc: Loc) -> Op | None:
        d = self.fields(node, f, {
            "engine": (False, lambda n, fl: self.str_(n, fl, nonempty=True)),
            "findings": (False, self.findings),
            "n_new": (False, lambda n, fl: self.int_(n, fl, 0, COUNT_MAX)),
            "n_new_g": (False, lambda n, fl: self.int_(n, fl, 0, COUNT_MAX)),
            "pools": (False, self.pools),
            "status": (False, self.status),
            "ubatch": (False, lambda n, fl: self.int_(
                n, fl, -1, COUNT_MAX, " (a ubatch index, or -1 for the last)")),
        })
        return None if d is None else Expect(loc=loc, **d)

    def findings(self, node: Node, field: str) -> tuple[str, ...] | None:
        items = self.list_(node, field, "a list of finding codes")
        if items is None:
            return None
        out: list[str] = []
        ok = True
        for i, it in enumerate(items):
            fi = f"{field}[{i}]"
            code = self.str_(it, fi)
            if code is None:
                ok = False
            elif not FINDING_CODE.fullmatch(code):
                self.problem(
                    it, fi, f"not a finding code: {_quote(code)} (codes are KP001, KP002, ...)"
                )
                ok = False
            elif code in out:
                self.problem(it, fi, f"finding {code} is listed twice")
                ok = False
            else:
                out.append(code)
        return tuple(out) if ok else None

    def pools(self, node: Node, field: str) -> tuple[tuple[int, int], ...] | None:
        items = self.list_(node, field, "a list of pools ([seq, k] or {seq, k})")
        if items is None:
            return None
        out: list[tuple[int, int]] = []
        ok = True
        for i, it in enumerate(items):
            fi = f"{field}[{i}]"
            pool = self.pool(it, fi)
            if pool is None:
                ok = False
            elif pool in out:
                self.problem(it, fi, f"pool {list(pool)} is listed twice")
                ok = False
            else:
                out.append(pool)
        return tuple(out) if ok else None

    def pool(self, node: Node, field: str) -> tuple[int, int] | None:
        def k_(n: Node, fl: str) -> int | None:
            return self.int_(n, fl, 0, KV_SIZE_MAX)

        if isinstance(node, _Map):
            d = self.fields(node, field, {"seq": (True, self.seq_id), "k": (True, k_)})
            return None if d is None else (d["seq"], d["k"])
        items = self.list_(node, field, "a pool: [seq, k] or {seq, k}")
        if items is None:
            return None
        if len(items) != 2:
            self.problem(node, field, f"a pool is [seq, k], got {len(items)} values")
            return None
        s = self.seq_id(items[0], f"{field}[0]")
        k = k_(items[1], f"{field}[1]")
        return None if s is None or k is None else (s, k)

    def status(self, node: Node, field: str) -> str | None:
        v = self.str_(node, field)
        if v is not None and v not in OP_STATUSES:
            self.problem(
                node, field,
                f"unknown status {_quote(v)}{_suggest(v, OP_STATUSES)}"
                f" (one of {', '.join(OP_STATUSES)})",
            )
            return None
        return v


_EXT_NEEDS_BY_ORDER = (
    "ext (an M-RoPE token) needs cache.by_order: true, but cache.by_order is false"
)
